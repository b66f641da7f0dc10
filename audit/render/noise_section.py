"""The report's timing-noise blocks (in Environment): the canary's readings and the run's noise
figure, the period a slowed machine measured, the unstable cells, and what helps. From canary.jsonl
and the records alone (analysis/noise_rules.py judges)."""
from __future__ import annotations

import pandas as pd

from ..analysis.noise_rules import advice, canary_summary, slow_period_cells, unstable_mask
from .page import Block, Heading, Mono, Table, format_value, para

LISTED_CELLS = 8          # cell ids named in the slow period's sentence (the rest counted)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def canary_table(summary: dict) -> pd.DataFrame:
    readings = [r for r in summary.get("readings") or [] if r.get("median_s")]
    if not readings:
        return pd.DataFrame(columns=["reading", "after start (s)", "median (µs)", "± (95%)", "vs fastest"])
    start = float(readings[0]["at_unix"])
    fastest = min(float(r["median_s"]) for r in readings)
    return pd.DataFrame({
        "reading": [str(r.get("label")) for r in readings],
        "after start (s)": [format_value(float(r["at_unix"]) - start) for r in readings],
        "median (µs)": [format_value(float(r["median_s"]) * 1e6) for r in readings],
        "± (95%)": [_pct(r.get("ci_rel")) for r in readings],
        "vs fastest": [f"+{(float(r['median_s']) / fastest - 1) * 100:.1f}%" for r in readings],
    })


def noise_blocks(canaries: list[dict], frame: pd.DataFrame, env: dict | None) -> list[Block]:
    """Timing noise: works on no canary (an older run) and on an empty frame."""
    summary = canary_summary(canaries, frame)
    blocks: list[Block] = [Heading(3, "Timing noise"), para(
        "The run's noise figure is ", Mono(_pct(summary["noise_rel"])), ": the largest of the canary's drift "
        f"({_pct(summary['drift_rel'])}: its slowest reading over its fastest), its spread "
        f"({_pct(summary['spread_rel'])}: how well one reading's median is known) and the cells' intervals "
        f"({_pct(summary['cells_rel'])}: the mean ± of a cell's median, fwd_ci_rel, each counted at most ±100%).")]
    if not summary["readings"]:
        blocks.append(para("No canary readings (", Mono("canary.jsonl"), "): this run did not time its "
                           "reference cell, so how much the machine's speed moved is not known."))
    else:
        blocks += [para("The canary is one small fp32 matmul timed the same way at the run's start, as the "
                        "measuring passes each quarter of the planned work, and at its end."),
                   Table(canary_table(summary), caption="canary readings (canary.jsonl; run.json: noise)")]
        for label in summary["slow"]:
            slow = slow_period_cells(summary, frame, label)
            blocks.append(para(f"The machine was {_pct(summary['slow_by_rel'].get(label))} slower at the {label} "
                               f"reading: {len(slow)} ok cell(s) started in the period around it"
                               + (": " + ", ".join(slow["id"].head(LISTED_CELLS))
                                  + (f" and {len(slow) - LISTED_CELLS} more" if len(slow) > LISTED_CELLS else "")
                                  if len(slow) else "") + ". Their times may read slow by as much."))
    if summary["rerun_rel"] is not None:
        blocks.append(para(
            "A rerun on this machine should land within ", Mono(f"±{_pct(summary['rerun_rel'])}"),
            " of a time here (the median cell; each cell's own: its interval, fwd_ci_rel or fwd_bwd_ci_rel, and "
            f"the canary's {_pct(summary['canary_rel'])} combined as sqrt(a² + b²)). Differences within it, "
            "between runs or between variants, are the machine's, not the kernels'."))
    unstable = frame[unstable_mask(frame)] if not frame.empty else frame
    if len(unstable):
        blocks.append(para(f"{len(unstable)} cell(s) are unstable (their median known to worse than ± the "
                           "run's --noise-target): the speed tables show their width beside the time, e.g. ",
                           Mono("12.3 ±9%"), "."))
    tips = advice(summary, frame, env)
    if tips:
        blocks.append(para("What helps, measured (docs/measurement.md, Timing noise): " + "; ".join(tips) + "."))
    return blocks
