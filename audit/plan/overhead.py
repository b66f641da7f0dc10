"""A run's time outside its cells: before the first (start-up, ceilings, plan, one record per
cell) and after the last (the seed's claims, the report), predicted from this machine's
earlier runs where it has them (run.json's time_split, core.timesplit), else from defaults.

The budget keeps this reserve out of the cells' share and the plan line prints it, so a
run's wall time (not only its cells) keeps to the budget. Pure Python: no torch.
"""
from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping

from ..measure.machine.canary import CANARY_WALL_S, readings_for
from ..measure.machine.energy import COUNTER_CHECK_WALL_S
from ..measure.machine.roofline import CEILINGS_BUDGET_S

# Where no earlier run of this machine says otherwise: the seconds of the reference host, a
# 2-core Intel Xeon (AMX), torch 2.13, measured on cold runs of the quick and cpu presets
# (2026-12-03): starting the run and its first measuring process (Python, torch, the cells)
# 1.9 s; the plan 1.5 ms a cell of the grid; the ceilings 1.1x the time they are given; 1.3 ms
# a cell between cells (a record written, the keeper, the progress bar); after the last cell
# (the seed's claims, findings, reproduction scripts, figures, the page) 4.1 s and 1.7 ms a
# measured cell (again with the gradient checks, eight controls and their reproduction scripts:
# quick 4.5 s for 285, cpu 6.3 s for 1302; before them 2.8 s for 241 and 5.8 s for 1294).
# On another host the constants of
# HOST_SCALED are these times its host factor (host_factor); the ceilings take the time given.
DEFAULTS: dict[str, float] = {
    "start_s": 1.9,              # the run's and its first measuring process's start, less the plan
    "plan_per_cell_s": 0.0009,   # the cost model and the budget, per cell of the grid (cpu: 2.5 s for 3271)
    "ceilings_factor": 1.1,      # the ceilings' seconds per second the preset gives them
    "between_cell_s": 0.0013,    # a measured cell's record written, the budget's keeper, the progress bar
    "skip_record_s": 0.00012,    # a cell the plan skips: its record written (cpu, --budget 30s: 0.4 s for 3244)
    "report_s": 4.1,             # the seed's claims, findings, reproduction scripts, figures, the page ...
    "report_per_cell_s": 0.0017,  # ... growing with the measured cells
    "merge_audit_s": 0.6,        # the merge functions on their partial states, values and gradients (0.35 s on a
                                 # 2-core Xeon, and torch's context-parallel module's import)
}
FITTED = ("start_s", "ceilings_factor", "between_cell_s", "report_s")
HOST_SCALED = ("start_s", "plan_per_cell_s", "between_cell_s", "skip_record_s", "report_s", "report_per_cell_s",
               "merge_audit_s")
# A run's start counts as cold (its measured seconds replace the predicted ones) past this factor of the
# prediction plus these seconds: a first import of torch after an install took 10-20 s more than warm ones.
COLD_START = (1.5, 2.0)
# measure.machine.roofline.host_probe_s on the reference host (30 probes: 5.05-5.44 ms, median 5.24), and
# the range a host factor is kept in (a probe disturbed for a moment must not plan a run 100x off)
REFERENCE_HOST_PROBE_S = 0.0052
HOST_FACTOR_RANGE = (0.25, 8.0)


def host_factor(ceilings: Mapping[str, Any] | None, earlier: Iterable[Mapping[str, Any] | None] = ()) -> float:
    """How many times slower than the reference host this one does the audit's own Python
    work: the median host_probe_s of a run's ceilings (one per device, all measured on this
    host), and of `earlier` (the ceilings of this machine's earlier runs, forecast.history), over
    REFERENCE_HOST_PROBE_S, within HOST_FACTOR_RANGE; 1 where no ceilings carry a probe (measured
    before it existed, or a device only predicted for). The probe is 0.3 s of one moment: on a shared
    2-core EPYC, probes minutes apart read 1.4x, 2.0x and 2.8x, and the plan kept the one it read for
    a day (the ceilings' cache); the median with the earlier runs' holds the machine's usual speed."""
    probes = [float(c["host_probe_s"]) for table in (ceilings, *earlier) for c in (table or {}).values()
              if isinstance(c, Mapping) and c.get("host_probe_s")]
    if not probes:
        return 1.0
    low, high = HOST_FACTOR_RANGE
    return min(high, max(low, statistics.median(probes) / REFERENCE_HOST_PROBE_S))


def device_kind(devices: Iterable[str]) -> str:
    """cuda when any of the run's cells is on a GPU (its overheads are that machine's), else cpu."""
    return "cuda" if any(str(d).startswith("cuda") for d in devices) else "cpu"


def constant(params: Any, device: str, name: str, host: float = 1.0) -> float:
    """One constant in seconds on a host `host` times slower than the reference (host_factor):
    this machine's fitted value where earlier runs gave one (kept in reference-host seconds),
    else DEFAULTS."""
    table = getattr(params, "overhead", None) or {}
    value = float(table.get(f"{device}|{name}", DEFAULTS[name]))
    return value * host if name in HOST_SCALED else value


def overhead_s(pred: Any, params: Any = None, *, ceilings_measured: bool = True,
               ceilings_s: float = CEILINGS_BUDGET_S, host: float = 1.0, kept: int | None = None,
               model_audit_s: float = 0.0, canary: bool = True, spent_s: float | None = None,
               merge_audit: float = 0, shrink_s: float = 0.0) -> tuple[float, float]:
    """(seconds before the first cell, seconds after the last) of a run of these cells (a
    costmodel prediction: its cells' devices and statuses); ceilings_s: the seconds the preset
    gives each device's ceilings; host: this host's host_factor; kept: how many of them the
    budget keeps (default all): the others cost a skip's record only; model_audit_s: the model audit's
    seconds after the cells on this host (model_audit_seconds); merge_audit: the sets of partial states the
    preset audits merge functions on after the cells (0: none; 1, the golden's; one more per kernel that
    makes its own, Preset.merge_parts), each about merge_audit_s; shrink_s: the shrinking after the cells
    (shrink_seconds).

    spent_s: a run planning itself has started already (its processes, torch's first import, the
    canary's start reading, the ceilings): where those seconds, measured, are well over the prediction
    (COLD_START: a first import of torch after an install reads its libraries from disk), they stand
    for it, so the cells are not planned into time already spent; else the prediction stands, and the
    run makes the plan its dry-run showed (a start a little slower, a busy moment, is the keeper's)."""
    n = len(pred)
    devices = {str(d).split(":")[0] for d in pred["device"]} if n else set()
    kind = device_kind(devices)
    c = lambda name: constant(params, kind, name, host)    # noqa: E731 - a short local reader
    kept = n if kept is None else min(n, kept)
    readings = readings_for(kept) if n and canary else 0   # the canary's (none with --noise-target 0)
    before = c("start_s") + CANARY_WALL_S * readings
    if ceilings_measured:
        before += c("ceilings_factor") * ceilings_s * len(devices) + COUNTER_CHECK_WALL_S * ("cuda" in devices)
    if spent_s is not None:                         # its start reading is taken: the others are ahead
        spent = spent_s + CANARY_WALL_S * max(0, readings - 1)
        if spent > before * COLD_START[0] + COLD_START[1]:
            before = spent
    before += c("plan_per_cell_s") * n + c("between_cell_s") * kept + c("skip_record_s") * (n - kept)
    measured = int((pred["status"] == "ok").sum()) if n else 0
    merges = c("merge_audit_s") * float(merge_audit) if merge_audit and n else 0.0
    return before, c("report_s") + c("report_per_cell_s") * measured + model_audit_s + merges + shrink_s


# the shrinking process's start (python -m audit shrink: Python, torch, the run's records) on the reference host
SHRINK_START_S = 2.5


def shrink_seconds(preset_s: float, third_party: bool, host: float = 1.0) -> float:
    """The seconds a run keeps after its cells for shrinking (Preset.shrink_s, --shrink: the shrinking
    stops starting findings when they are spent) and its process's start on this host; 0 without
    shrinking or without a variant whose code the audit did not write (nothing it could shrink)."""
    return preset_s + SHRINK_START_S * host if preset_s > 0 and third_party else 0.0


def model_audit_seconds(models: Iterable[str], run_variants: list[str], device: str = "cpu",
                        params: Any = None, *, host: float = 1.0, ceilings: Mapping[str, Any] | None = None) -> float:
    """The seconds on this host (host: its host_factor) of a run's model audit after its cells
    (measure/model_audit.py: write_run_audit) on `device` (cpu | cuda): importing transformers, then per
    model its build and float64 run and each (variant, dtype) run not refused up front. Each constant is
    this machine's, fitted on its earlier runs' model.jsonl (fit_overheads: "<device>|model_import_s",
    "<device>|model:<name>|build_s", "...|run_s"), else the model's prior (workload.model.ModelSpec.priors),
    in the reference host's seconds, times `host`. A run in a dtype whose matmul `ceilings` (this
    device's, measured) say is slower than the reference machine's (params.reference) also takes what
    the model's FLOPs (ModelSpec.forward_flops) lose there: bf16 on a CPU without AVX-512 bf16 or AMX
    runs its matmuls at 1-2 GFLOP/s, and a cpu-preset run's model audit took 34 s where 7 were planned."""
    from ..core.dtypes import model_dtypes
    from ..workload.model import MODEL_SPECS, TRANSFORMERS_IMPORT_S, model_variants, predicted_runs
    specs = [MODEL_SPECS[m] for m in models if m in MODEL_SPECS]
    if not specs:
        return 0.0
    table = getattr(params, "overhead", None) or {}
    slower = slower_per_flop(ceilings, reference_ceilings(params, device))
    variants = model_variants(run_variants)
    total = float(table.get(f"{device}|model_import_s", TRANSFORMERS_IMPORT_S)) * host
    for spec in specs:
        build_s, run_s = spec.prior(device)
        build_s = float(table.get(f"{device}|model:{spec.name}|build_s", build_s))
        run_s = float(table.get(f"{device}|model:{spec.name}|run_s", run_s))
        runs = predicted_runs(spec, variants)
        lost = sum(spec.forward_flops() * slower.get(d, 0.0) for d in model_dtypes())
        total += build_s * host + runs * (run_s * host * len(model_dtypes()) + lost)
    return total


def reference_ceilings(params: Any, device: str) -> Mapping[str, Any]:
    """The ceilings of the machine the priors' constants are in (params.reference), {} where none."""
    return ((getattr(params, "reference", None) or {}).get(device) or {}).get("ceilings") or {}


def slower_per_flop(ceilings: Mapping[str, Any] | None, reference: Mapping[str, Any] | None) -> dict[str, float]:
    """Per dtype, the seconds a matmul FLOP costs on the machine of `ceilings` beyond what it costs on the
    reference machine's (0 where faster, or where either rate is unknown)."""
    here = (ceilings or {}).get("matmul_flops_per_s") or {}
    there = (reference or {}).get("matmul_flops_per_s") or {}
    return {dtype: max(0.0, 1.0 / here[dtype] - 1.0 / there[dtype]) if here.get(dtype) and there.get(dtype) else 0.0
            for dtype in set(here) | set(there)}


def _fit_model_audit(run: Any, kind: str, host: float, parts: Mapping[str, Any],
                     reference: Mapping[str, Any] | None = None) -> dict[str, list[float]]:
    """A run's model audit constants in reference-host seconds (model_audit_seconds' names): per model the
    float64 run's build (its reference record's seconds) and the mean variant run, less what the model's
    FLOPs lost to a matmul slower than the reference machine's (`reference`: its ceilings; the run's own
    from run.ceilings), and the import as what the audit's time split holds beyond its records' seconds."""
    from ..workload.model import MODEL_SPECS
    ceilings = next((c for d, c in (getattr(run, "ceilings", None) or {}).items()
                     if isinstance(c, Mapping) and str(d).split(":")[0] == kind), None)
    slower = slower_per_flop(ceilings, reference)

    def own_seconds(r: Mapping[str, Any]) -> float:
        spec = MODEL_SPECS.get(str(r.get("model")))
        lost = spec.forward_flops() * slower.get(str(r.get("dtype")), 0.0) if spec is not None else 0.0
        return max(0.0, float(r["seconds"]) - lost) / host

    records = [r for r in (getattr(run, "model_records", None) or []) if isinstance(r, Mapping)]
    timed = [r for r in records if r.get("status", "ok") == "ok" and r.get("seconds") is not None]
    total = float(parts.get("model audit", 0.0) or 0.0)
    if not timed or total <= 0:
        return {}
    found: dict[str, list[float]] = {}
    for model in dict.fromkeys(str(r.get("model")) for r in timed):
        mine = [r for r in timed if r.get("model") == model]
        builds = [float(r["seconds"]) / host for r in mine if r.get("kind") == "reference"]
        runs = [own_seconds(r) for r in mine if r.get("kind") == "variant"]
        if builds:
            found[f"{kind}|model:{model}|build_s"] = [builds[0]]
        if runs:                # the mean: the audit's time is their sum, one slow variant included
            found[f"{kind}|model:{model}|run_s"] = [statistics.fmean(runs)]
    rest = total / host - sum(float(r["seconds"]) / host for r in timed)
    found[f"{kind}|model_import_s"] = [max(0.0, rest)]
    return found


def fit_overheads(runs: Iterable[Any], reference: Any = None) -> dict[str, float]:
    """The FITTED constants per device kind, medians over the runs whose run.json has a
    time_split (a RunData: time_split, frame, ceilings, ceilings_s): {"cpu|report_s": ..., ...},
    in the reference host's seconds (each run's divided by its host_factor: a run made while
    the machine was busy counts as the machine's speed then). reference: the priors (Params), whose
    reference machine's ceilings the model audit's runs are set against (_fit_model_audit)."""
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
        skipped = int(frame["reason"].astype(str).str.startswith("over the budget").sum()) \
            if "reason" in frame.columns else 0          # the plan's skips: a record each, no measuring
        host = host_factor(getattr(run, "ceilings", None))
        get = lambda name: float(parts.get(name, 0.0))    # noqa: E731
        scaled = lambda name: get(name) / host            # noqa: E731 - in the reference host's seconds
        found = {
            "start_s": (scaled("start-up") + scaled("worker start-up") + scaled("plan")
                        - DEFAULTS["plan_per_cell_s"] * n),
            "between_cell_s": scaled("between cells") / max(1, n - skipped),
            "report_s": scaled("report") + scaled("seed claims") - DEFAULTS["report_per_cell_s"] * ok,
        }
        ceilings_s = getattr(run, "ceilings_s", None)
        if get("ceilings") > 0 and ceilings_s:
            checked = sum(1 for c in (getattr(run, "ceilings", None) or {}).values()
                          if isinstance(c, dict) and c.get("energy_counter_check"))   # each about COUNTER_CHECK_WALL_S
            found["ceilings_factor"] = max(0.0, get("ceilings") - COUNTER_CHECK_WALL_S * checked) / ceilings_s
        for name, value in found.items():
            values.setdefault(f"{kind}|{name}", []).append(max(0.0, value))
        for key, fitted in _fit_model_audit(run, kind, host, parts, reference_ceilings(reference, kind)).items():
            values.setdefault(key, []).extend(fitted)
    return {key: statistics.median(v) for key, v in values.items()}
