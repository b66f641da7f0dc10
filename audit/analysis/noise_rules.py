"""Timing noise, judged: which cells' times cannot be trusted (unstable), the run's noise figure
from its canary, the period a slowed machine measured, what a tie is, and what helps.

A cell is unstable when its median's 95% interval (fwd_ci_rel, fwd_bwd_ci_rel: core/noise.py) is
still wider than the run's noise_target after sampling up to its cap. The canary (measure/machine/canary.py)
is the same small cell timed at the run's start, each quarter and end: its drift is how much the machine's
speed changed while the cells ran. Pure pandas: no torch, no measuring, no formatting beyond the
finding's sentence.
"""
from __future__ import annotations

import math
import statistics
from datetime import datetime
from typing import Any, Sequence

import pandas as pd

from .finding_rows import _finding, _num, _ok, _real_code
from .rule_registry import rule

SLOW_DRIFT = 0.05        # a canary reading this much slower than the fastest (or 2x its spread): a slow period
HIGH_NOISE = 0.10        # a run noise figure above this: the report gives advice
HIGH_UNSTABLE = 0.01     # ... or more than this share of the judged cells unstable (an idle cpu-preset run:
                         # 4 of 875, two of them broken.background_thread, whose own thread runs on)
Z = 1.959963984540054    # two-sided 95%


def cell_noise(frame: pd.DataFrame) -> pd.Series:
    """Per row, how well its times are known: the wider of fwd_ci_rel and fwd_bwd_ci_rel (NaN: none)."""
    return pd.concat([_num(frame, "fwd_ci_rel"), _num(frame, "fwd_bwd_ci_rel")], axis=1).max(axis=1)


def judged_mask(frame: pd.DataFrame) -> pd.Series:
    """Per row: an ok cell of a run with a noise_target whose interval is known (the cells judged)."""
    if frame.empty:
        return pd.Series([], dtype=bool)
    return (frame["status"] == "ok") & _num(frame, "noise_target").gt(0) & cell_noise(frame).notna()


def rerun_rel(cell_rel: pd.Series | float, canary_rel: float | None) -> pd.Series | float:
    """How far a rerun's median may land from this one (half-width over the median): the cell's own
    interval (its samples: noise within the measurement) and the run's canary_rel (the machine's speed
    moving between measurements, which no cell's samples see) combined, sqrt(a² + b²). Five pairs of
    quick runs back to back on a 2-core Xeon VM agreed within these on 94.8-100% of the timings (their
    cells' intervals alone: 68-83%; docs/measurement.md, Timing noise)."""
    run = float(canary_rel or 0.0)
    if isinstance(cell_rel, pd.Series):
        return (cell_rel.pow(2) + run ** 2).pow(0.5)
    return math.hypot(float(cell_rel), run)


def unstable_mask(frame: pd.DataFrame) -> pd.Series:
    """Per row: an ok cell whose times stayed wider than its run's noise_target (False where not judged)."""
    if frame.empty:
        return pd.Series([], dtype=bool)
    target = _num(frame, "noise_target")
    return (frame["status"] == "ok") & target.gt(0) & cell_noise(frame).gt(target)


@rule(250)
def check_timing_noise(frame: pd.DataFrame) -> list[dict]:
    """One run-level warning for the unstable cells of real variants: how many, how wide, and the
    worst. A negative control's own defect can be its noise (broken.background_thread leaves a thread
    running: 12 of the 13 unstable cells of six idle quick runs); the speed tables still mark it."""
    ok = _real_code(_ok(frame))
    judged = ok[judged_mask(ok)]
    rows = ok[unstable_mask(ok)]
    if rows.empty:
        return []
    widths = cell_noise(rows)
    worst = rows.loc[widths.idxmax()]
    target = float(_num(rows, "noise_target").max())
    return [_finding(
        "timing_unstable", "warning", "*",
        f"{len(rows)} of {len(judged)} timed cells are unstable: their medians are known only to "
        f"±{statistics.median(widths) * 100:.0f}% (median; worst ±{widths.max() * 100:.0f}%, {worst['id']}), "
        f"wider than the ±{target * 100:.0f}% the run sampled for (--noise-target) within its cap "
        "(--noise-cap-s). Their times, and any lead or regression within that width, are noise as much "
        "as speed; the speed tables mark them.", rows["id"])]


# --------------------------------------------------------------------------- the canary

def _readings(canaries: Sequence[dict]) -> list[dict]:
    return [r for r in canaries if isinstance(r.get("median_s"), (int, float)) and r["median_s"] > 0]


def canary_summary(canaries: Sequence[dict], frame: pd.DataFrame | None = None) -> dict[str, Any]:
    """The run's noise figure. From the canary readings: drift_rel (slowest reading over fastest, - 1:
    how much the machine's speed changed), spread_rel (the readings' median ci_rel: the noise within
    one), canary_rel (the larger: how far one time may be off for the machine alone), slow (labels of
    readings slower than the fastest by more than max(SLOW_DRIFT, 2 spread)); from the cells (`frame`):
    cells_rel, the mean of the judged cells' interval widths, each at most 1 (±100%): their median sits
    just under the target the sampling stops at whatever the machine, while the mean takes the cells
    that never got there; rerun_rel, the judged cells' median rerun interval (rerun_rel()). noise_rel,
    the run's figure, is the largest of canary_rel and cells_rel: a neighbour that a 1-thread canary
    shrugs off still leaves cells unknown."""
    ok = _readings(canaries)
    out: dict[str, Any] = {"readings": [dict(r) for r in canaries], "drift_rel": None, "spread_rel": None,
                           "canary_rel": None, "cells_rel": None, "rerun_rel": None, "noise_rel": None, "slow": [],
                           "slow_by_rel": {}}
    judged = pd.Series([], dtype=float)
    if frame is not None and not frame.empty:
        judged = cell_noise(frame[judged_mask(frame)])
        out["cells_rel"] = float(judged.clip(upper=1.0).mean()) if len(judged) else None
    if ok:
        medians = [float(r["median_s"]) for r in ok]
        fastest = min(medians)
        spreads = [float(r["ci_rel"]) for r in ok if isinstance(r.get("ci_rel"), (int, float))]
        out["spread_rel"] = statistics.median(spreads) if spreads else None
        out["drift_rel"] = max(medians) / fastest - 1 if len(ok) > 1 else None
        out["canary_rel"] = max(v for v in (out["drift_rel"], out["spread_rel"], 0.0) if v is not None)
        limit = max(SLOW_DRIFT, 2 * (out["spread_rel"] or 0.0))
        out["slow"] = [r.get("label") for r in ok if float(r["median_s"]) > fastest * (1 + limit)]
        out["slow_by_rel"] = {r.get("label"): float(r["median_s"]) / fastest - 1 for r in ok
                              if r.get("label") in out["slow"]}
    if len(judged):
        out["rerun_rel"] = float(rerun_rel(judged, out["canary_rel"]).median())
    figures = [v for v in (out["canary_rel"], out["cells_rel"]) if v is not None]
    out["noise_rel"] = max(figures) if figures else None
    return out


def _unix(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except (TypeError, ValueError):
        return None


def slow_period_cells(summary: dict[str, Any], frame: pd.DataFrame, label: str | None = None) -> pd.DataFrame:
    """The ok cells that started while the machine was slow: between the readings on either side of
    a slow canary reading (from the run's first cell, to its last); of reading `label` alone where
    given, else of every slow one. Empty without a slow reading."""
    ok = _readings(summary.get("readings") or [])
    if not summary.get("slow") or frame.empty or "started_at" not in frame.columns:
        return frame.iloc[0:0]
    times = [float(r["at_unix"]) for r in ok]
    started = frame["started_at"].map(_unix)
    inside = pd.Series(False, index=frame.index)
    for i, reading in enumerate(ok):
        if reading.get("label") not in summary["slow"] or (label is not None and reading.get("label") != label):
            continue
        lo = times[i - 1] if i > 0 else -math.inf
        hi = times[i + 1] if i + 1 < len(times) else math.inf
        inside |= started.between(lo, hi) & started.notna()
    return frame[inside & (frame["status"] == "ok")]


# --------------------------------------------------------------------------- ties and advice

def tie_lead(noise_a: Sequence[float], noise_b: Sequence[float], run_noise: float | None) -> float:
    """The lead (ratio of two variants' geometric-mean times over k shared cells) under which the two
    are tied: the 95% interval of the ratio from each cell's ci_rel (as log-scale SD ci/Z, averaged
    over the cells like the times) and, since the two variants' cells ran at different times, the
    run's noise figure (the canary's drift) on top. 1.0 where nothing was measured."""
    def var(noise: Sequence[float]) -> float:
        values = [float(x) for x in noise if isinstance(x, (int, float)) and x == x]
        return sum((math.log1p(x) / Z) ** 2 for x in values) / len(values) ** 2 if values else 0.0
    half = Z * math.sqrt(var(noise_a) + var(noise_b))
    return math.exp(half) * (1 + (run_noise or 0.0))


def advice(summary: dict[str, Any], frame: pd.DataFrame, env: dict[str, Any] | None) -> list[str]:
    """What helps, where the run was noisy (noise figure over HIGH_NOISE, or over HIGH_UNSTABLE of the
    judged cells unstable); only what was measured to help (docs/measurement.md, Timing noise: a
    2-core Xeon with a neighbour burning CPU 50 ms on, 50 ms off)."""
    real = _real_code(frame) if not frame.empty else frame       # a control's own noise is not the machine's
    judged, unstable = int(judged_mask(real).sum()), int(unstable_mask(real).sum())
    noise = summary.get("noise_rel") or 0.0
    noisy_cells = judged > 0 and unstable / judged > HIGH_UNSTABLE
    if noise <= HIGH_NOISE and not noisy_cells:
        return []
    tips = []
    threads = (summary.get("readings") or [{}])[0].get("threads")
    cores = (env or {}).get("cpu_count")
    if isinstance(threads, int) and isinstance(cores, int) and threads >= cores:
        tips.append(f"use fewer threads than cores (OMP_NUM_THREADS={max(1, cores - 1)}: this run used {threads} "
                    f"of {cores}), so a neighbour's burst takes a spare core, not one of yours")
    tips.append("run on an idle machine: a neighbour switching on and off left 3 to 4 of 10 cells unstable "
                "where the idle machine left none, and nothing the audit does at a cell undoes that")
    return tips
