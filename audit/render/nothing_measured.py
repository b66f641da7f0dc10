"""Why a run measured nothing, and what would measure something: the paragraph a report opens with
when no cell of a real variant is ok (records and plan.json alone, never measures)."""
from __future__ import annotations

import pandas as pd

from ..core.units import format_budget, format_duration
from .page import Block, Mono, para

SHOWN = 6           # variants named per cause, then a count


def _first_reasons(rows: pd.DataFrame) -> str:
    """'variant: its first reason' for the first SHOWN variants of rows, then how many more."""
    parts = []
    for variant, group in list(rows.groupby("variant", sort=True))[:SHOWN]:
        reason = str(group["reason"].dropna().iloc[0]) if group["reason"].notna().any() else "no reason recorded"
        parts.append(f"{variant} ({len(group)} cell(s)): {reason[:200]}")
    more = rows["variant"].nunique() - SHOWN
    return "; ".join(parts) + (f"; and {more} more variant(s)" if more > 0 else "")


def nothing_measured_section(frame: pd.DataFrame, plan: dict | None) -> list[Block]:
    """[] when a real variant has an ok cell; else why not (the budget, every cell declined or
    refused, every cell failed) and what would measure something (the smallest useful plan's
    --budget, the variants and cells that can run)."""
    if frame.empty:
        return [para("This run has no records: no cell was planned (an empty grid, or a run stopped before its "
                     "first cell). Run it again, or with other axes (", Mono("python -m audit run --help"), ").")]
    status = frame["status"].astype(str)
    real = ~frame["variant"].astype(str).str.startswith("broken.")
    if ((status == "ok") & real).any():
        return []
    reason = frame["reason"].astype(str)
    budget = (status == "skipped") & reason.str.startswith("over the budget")
    failed = status.isin(["error", "oom", "timeout"])
    refused = (status == "skipped") & ~budget
    lines: list[Block] = []
    parts = []
    if budget.any():
        text = (f"the budget left {int(budget.sum())} of {len(frame)} cells for later (skipped over the budget, "
                "each recorded with its predicted seconds)")
        smallest, coverage = (plan or {}).get("smallest_s"), (plan or {}).get("coverage_s")
        if format_budget(smallest):
            text += (f": the smallest useful plan (sdpa and eager, a cell per dtype) needs {format_duration(smallest)}"
                     f" with start-up and report, so --budget {format_budget(smallest)} measures it")
            if format_budget(coverage):
                text += (f", and --budget {format_budget(coverage)} gives every variant a cell per dtype and mask kind "
                         "and every negative control its self-check")
        parts.append(text)
    if refused.any():
        parts.append(f"{int(refused.sum())} cells were declined or cannot run here: {_first_reasons(frame[refused])}")
    if failed.any():
        parts.append(f"{int(failed.sum())} cells failed: {_first_reasons(frame[failed])} (Findings: each "
                     "failure's cause and a script that reproduces it)")
    lines.append(para("Nothing of a real variant was measured: " + "; ".join(parts) + "."))
    return lines
