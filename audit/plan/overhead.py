"""A run's time outside its cells: before the first (start-up, ceilings, plan, one record per
cell) and after the last (the seed's claims, the report), predicted from this machine's
earlier runs where it has them (run.json's time_split, core.timesplit), else from defaults.

The budget keeps this reserve out of the cells' share and the plan line prints it, so a
run's wall time (not only its cells) keeps to the budget. Pure Python: no torch.
"""
from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping

from ..measure.roofline import CEILINGS_BUDGET_S

# Where no earlier run of this machine says otherwise. Measured on 2 cores of an AMD EPYC (AVX2
# only, the slowest of the project's machines), torch 2.13: starting the run and its first
# measuring process (Python, torch, Inductor's cache folder) 3.8 s; the plan 0.9 s for the quick
# preset's 413 cells and 3.8 s for the cpu preset's 2148; the ceilings 1.05x the time they are
# given; between cells 0.2 ms a record of a cell the budget skipped, 1-2 ms one of a measured
# cell, and the measuring process's exit; after the last cell, 9 s for the quick preset's 136
# measured cells.
DEFAULTS: dict[str, float] = {
    "start_s": 3.8,              # the run's and its first measuring process's start, less the plan
    "plan_per_cell_s": 0.0018,   # the cost model and the budget, per cell of the grid
    "ceilings_factor": 1.3,      # the ceilings' seconds per second the preset gives them
    "between_cell_s": 0.002,     # a record written, the budget's keeper, the progress bar
    "report_s": 7.0,             # the seed's claims, findings, reproduction scripts, figures, the page ...
    "report_per_cell_s": 0.005,  # ... growing with the measured cells
}
FITTED = ("start_s", "ceilings_factor", "between_cell_s", "report_s")


def device_kind(devices: Iterable[str]) -> str:
    """cuda when any of the run's cells is on a GPU (its overheads are that machine's), else cpu."""
    return "cuda" if any(str(d).startswith("cuda") for d in devices) else "cpu"


def constant(params: Any, device: str, name: str) -> float:
    table = getattr(params, "overhead", None) or {}
    return float(table.get(f"{device}|{name}", DEFAULTS[name]))


def overhead_s(pred: Any, params: Any = None, *, ceilings_measured: bool = True,
               ceilings_s: float = CEILINGS_BUDGET_S) -> tuple[float, float]:
    """(seconds before the first cell, seconds after the last) of a run of these cells (a
    costmodel prediction: its cells' devices and statuses); ceilings_s: the seconds the preset
    gives each device's ceilings."""
    n = len(pred)
    devices = {str(d).split(":")[0] for d in pred["device"]} if n else set()
    kind = device_kind(devices)
    c = lambda name: constant(params, kind, name)          # noqa: E731 - a short local reader
    before = c("start_s") + c("plan_per_cell_s") * n + c("between_cell_s") * n
    if ceilings_measured:
        before += c("ceilings_factor") * ceilings_s * len(devices)
    measured = int((pred["status"] == "ok").sum()) if n else 0
    return before, c("report_s") + c("report_per_cell_s") * measured


def fit_overheads(runs: Iterable[Any]) -> dict[str, float]:
    """The FITTED constants per device kind, medians over the runs whose run.json has a
    time_split (a RunData: time_split, frame, ceilings_s): {"cpu|report_s": ..., ...}."""
    values: dict[str, list[float]] = {}
    for run in runs:
        split: Mapping[str, Any] = getattr(run, "time_split", None) or {}
        parts = split.get("parts_s") or {}
        frame = run.frame
        if not parts or frame is None or not len(frame):
            continue
        kind = device_kind(frame["device"])
        n = len(frame)
        ok = int((frame["status"] == "ok").sum())
        get = lambda name: float(parts.get(name, 0.0))    # noqa: E731
        found = {
            "start_s": get("start-up") + get("worker start-up") + get("plan") - DEFAULTS["plan_per_cell_s"] * n,
            "between_cell_s": get("between cells") / n,
            "report_s": get("report") + get("seed claims") - DEFAULTS["report_per_cell_s"] * ok,
        }
        ceilings_s = getattr(run, "ceilings_s", None)
        if get("ceilings") > 0 and ceilings_s:
            found["ceilings_factor"] = get("ceilings") / ceilings_s
        for name, value in found.items():
            values.setdefault(f"{kind}|{name}", []).append(max(0.0, value))
    return {key: statistics.median(v) for key, v in values.items()}
