"""The report's Arguments section: per variant, each argument it was handed in the probed cells
(measure/checks/arguments.py) and whether changing it moved its output as the float64 golden's. Never
measures."""
from __future__ import annotations

import pandas as pd

from ..analysis.argument_rules import argument_summary
from ..workload.arguments import ARGUMENT_TITLES, ARGUMENTS, NOT_HONOURED
from .data import NEGATIVE_CONTROL_PREFIX, variant_order
from .page import MISSING, Block, Heading, Mono, Table, para

HEADING = "Arguments"


NOT_PROBED = "—"


def argument_text(statuses: dict[str, str]) -> str:
    """A variant's arguments in a few characters, for the verdict's narrow `args` column: those it
    ignores (✗ scale), misapplies (≠ cu_seqlens) or accepts where it must refuse (! kv_heads), else how
    many it honours (4 ✓), else '—'."""
    marks = {"ignored": "✗", "misapplied": "≠", "accepted": "!"}
    bad = [f"{marks.get(s, '✗')} {n}" for n, s in statuses.items() if s in NOT_HONOURED]
    if bad:
        return ", ".join(bad)
    honoured = [n for n, s in statuses.items() if s == "honoured"]
    return f"{len(honoured)} ✓" if honoured else NOT_PROBED


def argument_table(frame: pd.DataFrame) -> pd.DataFrame:
    """variant × argument: its status over the probed cells (analysis.argument_rules), real variants
    first; '—' where the argument was not probed."""
    summary = argument_summary(frame)
    if not summary:
        return pd.DataFrame()
    names = [n for n in [*ARGUMENTS, "lse"] if any(n in s for s in summary.values())]
    variants = variant_order(pd.Series(list(summary)))
    variants = ([v for v in variants if not v.startswith(NEGATIVE_CONTROL_PREFIX)]
                + [v for v in variants if v.startswith(NEGATIVE_CONTROL_PREFIX)])
    rows = [{"variant": v, **{n: summary[v].get(n, MISSING) for n in names}} for v in variants]
    return pd.DataFrame(rows, columns=["variant", *names])


def arguments_section(frame: pd.DataFrame) -> list[Block]:
    table = argument_table(frame)
    if table.empty:
        return []
    probes = "; ".join(f"{name}: {title}, {change}" for name, (title, change) in ARGUMENT_TITLES.items())
    return [
        Heading(2, HEADING),
        para("Each argument a cell hands a variant is changed once and the variant called again: its output "
             "must move as the float64 golden's does (within twice the cell's error budget). ",
             Mono("ignored"), ": it did not move; ", Mono("misapplied"), ": it moved otherwise; ",
             Mono("unjudged"), ": it moved, but the cell's own output is outside its budget; ",
             Mono("refused"), ": the variant declines the changed value; ", Mono("accepted"),
             ": it computed an output where it must refuse (kv_heads). Probes: ", probes,
             ". A variant's status is its worst cell's (docs/numerics.md, Arguments)."),
        Table(table, caption="Each argument's status over the variant's probed cells"),
    ]
