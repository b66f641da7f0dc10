"""The verdict at the top of the report: per real variant, how fast and how big it is against
`sdpa`, its worst finding, what it does on fully masked rows and whether repeated runs agree;
then what to use (recommend.py: per device × dtype × mask kind, which variant and why).

Numbers only from matched cells (every input axis equal), never pooled medians: a ratio of two
variants on the same cells means the same whatever else the grid holds. Reads the records frame
and the findings; never measures, never imports torch.
"""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.argument_rules import ARGUMENT_CHECK, argument_summary
from ..analysis.findings import SEVERITY_ORDER
from ..analysis.run_rules import REFEREE_CHECK
from ..core.defects import REPEATED_TENSORS
from ..core.referee import refereed
from ..workload.variants import VERDICT_BASELINE
from .data import (BASELINE_VARIANT, NEGATIVE_CONTROL_PREFIX, NORMAL_SCENARIO, memory_ratio_vs_baseline, numeric,
                   ok_rows, speedup_vs_baseline, variant_order)
from .argument_section import NOT_PROBED, argument_text
from .masked_rows import masked_rows_cell, masked_rows_summary
from .page import MISSING, Badge, Block, Heading, Inline, Link, Mono, Span, Table, format_value, para
from .finding_tables import anchored_findings, finding_words
from .recommend import recommendation_blocks

VERDICT_HEADING = "Verdict"
VARIANTS_HEADING = "Per variant"        # the table of every real variant against the baseline
SEVERITY_RANK = {severity: rank for rank, severity in enumerate(SEVERITY_ORDER)}


# --------------------------------------------------------------------------- verdict rows

def _real_variants(frame: pd.DataFrame) -> list[str]:
    if not len(frame):
        return []
    return [v for v in variant_order(frame["variant"]) if not v.startswith(NEGATIVE_CONTROL_PREFIX)]


def worst_findings(findings: list[dict] | None) -> dict[str, tuple[dict, str]]:
    """variant -> (its most severe finding, that finding's anchor): severity first, then the
    finding covering most cells. Findings about several variants ("*") belong to none."""
    worst: dict[str, tuple[dict, str]] = {}
    for finding, anchor in anchored_findings(findings):
        variant = str(finding.get("variant"))
        key = (SEVERITY_RANK.get(finding.get("severity"), 3), -len(finding.get("cells") or []))
        if variant != "*" and (variant not in worst or key < _rank(worst[variant][0])):
            worst[variant] = (finding, anchor)
    return worst


def _rank(finding: dict) -> tuple[int, int]:
    return SEVERITY_RANK.get(finding.get("severity"), 3), -len(finding.get("cells") or [])


# The verdict's short phrases ("1.34× slower", "not refereed") stay on one line; longer ones wrap, so
# the table fits the page's 1200 px at 1400 px (tests/test_html_browser.py) with its referee column.
VERDICT_UNBROKEN_CH = 14


def finding_part(finding: dict, anchor: str) -> Span:
    """The finding's severity badge and its check, linked to its row in the findings table, with its
    words (the mistake it matches, where diagnosed) as the link's title: one line per variant, so the
    table stays as short as its variants (tests/test_html_browser.py)."""
    check = str(finding.get("check") or "finding").replace("_", " ")
    words = finding_words(finding)
    return Span((Badge(str(finding.get("severity"))), " ",
                 Link(check, "#" + anchor, title=words if words != check else "")),
                keep_together=len(check) <= VERDICT_UNBROKEN_CH)


def _is_tensor_list(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def determinism_text(rows: pd.DataFrame) -> str:
    """Whether three runs on identical inputs agreed bit for bit, from the records' repeat columns
    (repeat_differs: the tensors that differed, [] when none; repeat_max_diff; deterministic_algorithms;
    deterministic_refused on skipped cells). "not checked" for records without them."""
    parts: list[str] = []
    refused = rows[rows["deterministic_refused"].map(lambda v: v is True or v is np.True_)] \
        if "deterministic_refused" in rows.columns else rows.iloc[0:0]
    if not refused.empty:
        parts.append(f"refuses deterministic mode ({len(refused)} cell{'s' if len(refused) != 1 else ''})")
    ok = ok_rows(rows)
    checked = ok[ok["repeat_differs"].map(_is_tensor_list)] if "repeat_differs" in ok.columns else ok.iloc[0:0]
    if not checked.empty:
        differing = checked[checked["repeat_differs"].map(len) > 0]
        deterministic = (int(checked["deterministic_algorithms"].map(lambda v: v is True or v is np.True_).sum())
                         if "deterministic_algorithms" in checked.columns else 0)
        mode = ([] if deterministic == 0 else ["deterministic mode"] if deterministic == len(checked)
                else [f"{deterministic} in deterministic mode"])
        if differing.empty:
            parts.append(f"bitwise ({', '.join([str(len(checked)), *mode])})")   # the cells checked
        else:
            tensors = {str(t) for value in differing["repeat_differs"] for t in value}
            named = [t for t in REPEATED_TENSORS if t in tensors] + sorted(tensors - set(REPEATED_TENSORS))
            largest = numeric(differing, "repeat_max_diff").max()
            notes = ([f"max {_short_number(largest)}"] if pd.notna(largest) else []) + mode
            parts.append(f"differs: {', '.join(named)} in {len(differing)} of {len(checked)} cells"
                         + (f" ({', '.join(notes)})" if notes else ""))
    return "; ".join(parts) if parts else "not checked"


def _short_number(value: float) -> str:
    """One significant digit, exponents unpadded: 2e-7, 0.3, inf."""
    if not math.isfinite(value):
        return "inf" if value > 0 else str(value)
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:.1g}").replace("e+", "e")


def _ratio_words(speedup: float | None, faster: str, slower: str) -> str:
    """2.08 -> '2.08× faster', 0.5 -> '2.00× slower' (with the given words), None -> —."""
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return MISSING
    if abs(math.log(speedup)) < math.log(1.005):
        return "same"
    return f"{format_value(speedup)}× {faster}" if speedup > 1 else f"{format_value(1 / speedup)}× {slower}"


def verdict_rows(frame: pd.DataFrame, baseline: str = VERDICT_BASELINE) -> pd.DataFrame:
    """The verdict's numbers, one row per real variant with an ok cell: speedup and fwd_bwd_speedup
    (baseline time / variant time, geometric mean over matched cells; above 1 is faster), memory
    and fwd_bwd_memory (variant peak / baseline peak; below 1 is smaller), the matched cells of
    each, masked_rows (text) and masked_rows_detail (the scenarios behind its counts, or ""), and
    determinism (text). The baseline itself reads 1 with its own cell count."""
    columns = ["variant", "speedup", "fwd_cells", "fwd_bwd_speedup", "fwd_bwd_cells", "memory", "memory_cells",
               "fwd_bwd_memory", "fwd_bwd_memory_cells", "masked_rows", "masked_rows_detail", "determinism",
               "refereed", "arguments"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    measured = _real_variants(ok_rows(frame))
    arguments = argument_summary(frame)

    def compare(compute: Any, metric: str) -> pd.DataFrame:
        if metric not in frame.columns:        # a frame without the column: nothing matched
            return pd.DataFrame(columns=["speedup", "ratio", "cells"])
        return compute(frame, metric, baseline).set_index("variant")

    comparisons = {
        "speedup": compare(speedup_vs_baseline, "fwd_ms"),
        "fwd_bwd_speedup": compare(speedup_vs_baseline, "fwd_bwd_ms"),
        "memory": compare(memory_ratio_vs_baseline, "peak_bytes"),
        "fwd_bwd_memory": compare(memory_ratio_vs_baseline, "peak_fwd_bwd_bytes"),
    }
    cells_column = {"speedup": "fwd_cells", "fwd_bwd_speedup": "fwd_bwd_cells", "memory": "memory_cells",
                    "fwd_bwd_memory": "fwd_bwd_memory_cells"}
    out = []
    for variant in measured:
        row: dict[str, Any] = {"variant": variant}
        for name, table in comparisons.items():
            value_column = "speedup" if "speedup" in name else "ratio"
            if variant == baseline:
                row[name], row[cells_column[name]] = 1.0, None
            elif variant in table.index:
                row[name] = float(table.loc[variant, value_column])
                row[cells_column[name]] = int(table.loc[variant, "cells"])
            else:
                row[name], row[cells_column[name]] = None, 0
        own = frame[frame["variant"] == variant]
        row["masked_rows"], row["masked_rows_detail"] = masked_rows_summary(ok_rows(own))
        row["determinism"] = determinism_text(own)
        row["refereed"] = any(refereed(r) for r in ok_rows(own).to_dict("records"))
        row["arguments"] = argument_text(arguments.get(variant, {}))
        out.append(row)
    table = pd.DataFrame(out, columns=columns)
    order = table["speedup"].map(lambda s: -s if s is not None and pd.notna(s) else math.inf)
    return table.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


def _unbroken(text: str) -> Inline:
    """A short phrase ("2.71× slower", "not checked") kept on one line in HTML, so a wide row wraps
    its long cells instead of splitting these; longer text may wrap."""
    return Span((text,), keep_together=True) if len(text) <= VERDICT_UNBROKEN_CH else text


def _cells_value(row: pd.Series) -> Inline | int:
    """Matched cells of the forward time; '8 · 0' when forward+backward matched another number."""
    fwd, both = (0 if c is None or pd.isna(c) else int(c) for c in (row["fwd_cells"], row["fwd_bwd_cells"]))
    return fwd if both == fwd else _unbroken(f"{fwd} · {both}")


GRADIENT_CHECK = "grad_error_budget"      # analysis.numerics_rules: gradients outside their budget


def referee_findings(findings: list[dict] | None) -> dict[str, list[tuple[dict, str]]]:
    """variant -> its referee findings and their anchors: its speed was not measured doing the work,
    so it is shown struck through and never recommended."""
    out: dict[str, list[tuple[dict, str]]] = {}
    for f, a in anchored_findings(findings):
        if f.get("check") == REFEREE_CHECK:
            out.setdefault(str(f.get("variant")), []).append((f, a))
    return out


def referee_text(variant: str, refereed: set[str], failed: dict[str, list[tuple[dict, str]]]) -> Inline:
    """The verdict's referee column: 'passed', the failed checks linked, or 'not refereed'."""
    if variant in failed:
        parts: list[Inline] = ["failed: "]
        for i, (finding, anchor) in enumerate(failed[variant]):
            parts += ([", "] if i else []) + [Link(str(finding.get("referee_check") or "referee"), "#" + anchor)]
        return Span(tuple(parts))
    return "passed" if variant in refereed else "not refereed"


def referee_all_passed(referees: list[Inline]) -> bool:
    """Every variant's referee column reads 'passed': the verdict says so in its paragraph instead of
    a column of the same word, whose width cut its last column at 1400 px (tests/test_html_browser.py)."""
    return bool(referees) and all(r == "passed" for r in referees)


def gradient_findings(findings: list[dict] | None) -> dict[str, tuple[dict, str]]:
    """variant -> (its gradient error finding, its anchor): such a variant is not for training."""
    return {str(f.get("variant")): (f, a) for f, a in anchored_findings(findings)
            if f.get("check") == GRADIENT_CHECK and f.get("severity") == "error"}


def verdict_display(rows: pd.DataFrame, findings: list[dict] | None, baseline: str) -> pd.DataFrame:
    """verdict_rows as the page shows them: ratios as words, the worst finding linked; a variant
    whose gradients are outside their budget reads "not for training" for forward+backward."""
    worst = worst_findings(findings)
    wrong_grads = gradient_findings(findings)
    gamed = referee_findings(findings)
    checked = set(rows.loc[rows["refereed"].astype(bool), "variant"]) if "refereed" in rows else set()

    def speed(row: pd.Series, column: str) -> Inline:
        """A speed ratio; struck through where the referee found the variant not doing the work."""
        text = ratio(row, column, False)
        return Span((text,), keep_together=True, struck=True) if row["variant"] in gamed else _unbroken(text)

    def fwd_bwd_cell(row: pd.Series) -> Inline:
        if row["variant"] in wrong_grads:
            finding, anchor = wrong_grads[row["variant"]]
            return Span(("not for training: ", Link("wrong gradients", "#" + anchor)))
        return speed(row, "fwd_bwd_speedup")

    ignoring = {str(f.get("variant")): a for f, a in anchored_findings(findings) if f.get("check") == ARGUMENT_CHECK}

    def argument_cell(row: pd.Series) -> Inline:
        """What the argument probes found: linked to the finding where an argument is not honoured."""
        text = str(row["arguments"])                   # may wrap: the column stays narrow
        return Link(text, "#" + ignoring[row["variant"]]) if row["variant"] in ignoring else text

    def finding_cell(variant: str) -> Inline:
        if findings is None:
            return "not computed"
        return finding_part(*worst[variant]) if variant in worst else "none"

    def ratio(row: pd.Series, column: str, memory: bool) -> str:
        if row["variant"] == baseline:
            return "baseline"
        value = row[column]
        if memory:
            value = None if value is None or pd.isna(value) or value <= 0 else 1 / value
        return _ratio_words(value, *(("less", "more") if memory else ("faster", "slower")))

    records = [r for _, r in rows.iterrows()]
    referees = [referee_text(v, checked, gamed) for v in rows["variant"]]
    return pd.DataFrame({           # the referee second: whether the rest can be trusted at all
        "variant": rows["variant"],
        **({"referee": referees} if not referee_all_passed(referees) and checked else {}),
        f"fwd vs {baseline}": [speed(r, "speedup") for r in records],
        f"fwd+bwd vs {baseline}": [fwd_bwd_cell(r) for r in records],
        "peak fwd": [_unbroken(ratio(r, "memory", True)) for r in records],
        "peak fwd+bwd": [_unbroken(ratio(r, "fwd_bwd_memory", True)) for r in records],
        "cells": ["—" if r["variant"] == baseline else _cells_value(r) for r in records],
        "worst finding": [finding_cell(v) for v in rows["variant"]],
        **({"args": [argument_cell(r) for r in records]}                       # records before probes: none
           if "arguments" in rows and (rows["arguments"] != NOT_PROBED).any() else {}),
        "fully masked rows": [_unbroken(t) if not d else Span((masked_rows_cell(t, d),),
                                                              keep_together=len(t) <= VERDICT_UNBROKEN_CH)
                              for t, d in zip(rows["masked_rows"], rows["masked_rows_detail"])],
        "3 runs": [_unbroken(t) for t in rows["determinism"]],
    })


# --------------------------------------------------------------------------- section

def verdict_section(frame: pd.DataFrame, findings: list[dict] | None,
                    run_noise: float | None = None) -> list[Block]:
    """The page's first section: what to use per device × dtype × mask (ties by the measured noise,
    `run_noise`: the canary's canary_rel, noise_rules.canary_summary), then the table per variant, then
    why each choice. The answer first: above the fold of a 1400 × 1000 window whatever the variant count
    (14 rows of the table before it pushed it below, tests/test_html_browser.py)."""
    blocks: list[Block] = [Heading(2, VERDICT_HEADING)]
    ok = ok_rows(frame)
    real = _real_variants(ok)
    if not real:
        return blocks + [para("No ok cell of a real variant: nothing to compare.")]
    baseline = VERDICT_BASELINE if VERDICT_BASELINE in real else (
        BASELINE_VARIANT if BASELINE_VARIANT in real else real[0])
    rows = verdict_rows(frame, baseline)
    instead = "" if baseline == VERDICT_BASELINE else f" (no {VERDICT_BASELINE} cell is ok)"
    display = verdict_display(rows, findings, baseline)
    refereed = rows.get("refereed", pd.Series(dtype=bool)).astype(bool)
    all_passed = "referee" not in display.columns and bool(refereed.any())
    referee = "Referee: did every call do the work it was timed for; " + (
        "every variant passed." if all_passed else "a variant failing it is struck through, never recommended.")
    answer, reasons = recommendation_blocks(frame, findings, run_noise)
    blocks += answer + [
        Heading(3, VARIANTS_HEADING),
        para(f"Against {baseline}{instead}: geometric means over matched cells (scenario ", Mono(NORMAL_SCENARIO),
             "). 3 runs: out, dq, dk, dv bitwise identical on the same inputs (in brackets, the cells "
             "checked). Forward+backward is judged by "
             "the gradient budget too: a variant whose gradients are outside it is not for training. " + referee),
        Table(display),
    ]
    unrun = [v for v in _real_variants(frame) if v not in real]
    unrun_note = ([para(f"No ok cell, so not in the verdict: {', '.join(unrun)} (see Grid for why).")]
                  if unrun else [])
    return blocks + unrun_note + reasons
