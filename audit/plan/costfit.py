"""Fit the cost model's constants on recorded runs, and check its predictions against them.

`audit fit-costs fit DIR... [--out FILE]` refits the constants (the shipped priors,
cost_priors.json, are this fit of the reference runs); `audit fit-costs check DIR...`
compares predicted with recorded elapsed_s. Per-call factors come from the records' fwd_ms
and fwd_bwd_ms against their run's ceilings, the other constants from what the records'
elapsed_s leaves unexplained (costmodel says what each phase is).
Pure Python + numpy + pandas: nothing here imports torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..core.runfolder import RUN_FILE
from ..measure.golden.numerics import BACKWARD_FLOP_FACTOR
from .fitbase import case_of as _case_of, golden_read_s, labelled_rows, rows as _rows, mean_of_most as _mean_of_most, nnls as _nnls, run_host
from .cell_shape import (CellShape, call_features, cudnn_config, exposes_weights, golden_cost_inputs,
                         measured_attention)
from .cell_work import (REFEREE_CALLS, call_variant, device_type, kernel_key, leak_probe_count, masked_rows_checked,
                        returns_lse, shards_seconds, start_state)
from .costmodel import COMPILED_VARIANTS, CostModel
from .priors import REFEREE_DEFAULT_S, Params
from .settings import Settings




@dataclass
class RunData:
    """One run folder's records with what is needed to explain their elapsed_s."""

    name: str
    frame: Any                      # records.load(run_dir), in file (= run) order
    settings: Settings
    ceilings: dict[str, Any]
    compile_cache_dir: str | None = None   # Inductor's cache folder the run compiled into (run.json)
    compile_cache_id: str | None = None    # that folder's identity then (compile_cache.identity)
    torch: str | None = None               # the run's torch version (the cache's entries are per version)
    threads: int | None = None             # its torch threads (Inductor's CPU kernels are built for a count)
    time_split: dict | None = None         # where its wall time went (run.json, schema 9 on)
    ceilings_s: float | None = None        # the seconds its preset gave the ceilings
    model_records: list | None = None      # its model audit's records (model.jsonl; overhead.fit_overheads)
    compile_headers: str | None = None     # Inductor's precompiled headers at its start: built | absent (run.json)

    @classmethod
    def load(cls, run_dir: Path | str) -> "RunData":
        from ..core.records import load
        from ..core.runfolder import read_model_records
        run_dir = Path(run_dir)
        info = json.loads((run_dir / RUN_FILE).read_text()) if (run_dir / RUN_FILE).exists() else {}
        env = info.get("env") or {}
        return cls(run_dir.name, load(run_dir), Settings.of_run(info), info.get("ceilings") or {},
                   info.get("compile_cache_dir"), info.get("compile_cache_id"), env.get("torch"),
                   env.get("threads"), info.get("time_split"), (info.get("timing") or {}).get("ceilings_s"),
                   read_model_records(run_dir), info.get("compile_headers"))

    def compiled_keys(self, outcomes: Sequence[str] | None = None) -> set[tuple]:
        """kernel_key()s of the cells that compiled in this run (their kernels are in its cache
        folder since), or only those whose compile_cache is one of `outcomes`."""
        frame = self.frame
        if "compile_s" not in frame.columns:
            return set()
        compiled = frame["compile_s"].notna()
        if outcomes is not None:
            compiled &= frame["compile_cache"].isin(list(outcomes)) if "compile_cache" in frame.columns else False
        return {kernel_key(CellShape.of(_case_of(row))) for row in _rows(frame[compiled])}




def _samples_wall(row: Any, prefix: str) -> float:
    """Wall time of a record's timed samples: sum of samples × calls per sample."""
    import re
    timer = str(row.get("timer") or "")
    found = re.search(r"blocks of (\d+|-)/(\d+|-) calls", timer)
    per = 1
    if found and found.group(1 if prefix == "fwd" else 2).isdigit():
        per = int(found.group(1 if prefix == "fwd" else 2))
    samples = row.get(f"{prefix}_samples_s")
    if isinstance(samples, list) and samples:
        total = float(np.nansum([s for s in samples if isinstance(s, (int, float))])) * per
    else:                            # records stored without raw samples: n × median
        n, ms = row.get(f"{prefix}_n"), row.get(f"{prefix}_ms")
        if not (isinstance(n, (int, float)) and isinstance(ms, (int, float)) and n == n and ms == ms):
            return 0.0
        total = float(n) * float(ms) / 1e3 * per
        samples = [0.0] * int(n)
    if "spin kernel" in timer:       # device timing: each sample also waited for the spin
        host = row.get(f"{prefix}_host_ms")
        if isinstance(host, (int, float)) and host == host:
            total += len(samples) * (1.5 * per * host / 1e3 + 2e-4)
    return total


def fit(runs: Iterable[RunData], priors: Params | None = None) -> Params:
    """Constants fitted on the runs' records (on top of `priors` for what they do not show)."""
    runs = list(runs)
    from .overhead import fit_overheads
    from .phasefit import fit_phases
    fitted = Params(fitted_on=[r.name for r in runs])
    _fit_calls(runs, fitted)
    _fit_host(runs, fitted)
    _fit_constants(runs, fitted, priors)
    fit_phases(runs, fitted)                  # records with phase_s: each part of a cell on its own seconds
    _fit_noise(runs, fitted)
    fitted.overhead.update(fit_overheads(runs, priors))
    return (priors or Params()).merged(fitted)


def _fit_noise(runs: list[RunData], out: Params) -> None:
    """Per device, the mean share of its cap a measurement sampled beyond its minimum (fwd_extra_s and
    fwd_bwd_extra_s over the run's noise_cap_s), over the ok cells of runs that had a cap: what a
    noisy machine costs each cell (and so fewer cells in a budget)."""
    shares: dict[str, list[float]] = {}
    for run in runs:
        cap, frame = run.settings.noise_cap_s, run.frame
        if not cap or frame is None or "fwd_extra_s" not in frame.columns:
            continue
        ok = frame[frame["status"] == "ok"]
        for prefix in ("fwd", "fwd_bwd"):
            for dev, extra in zip(ok["device"], ok[f"{prefix}_extra_s"]):
                if isinstance(extra, (int, float)) and extra == extra:
                    shares.setdefault(device_type(dev), []).append(min(1.0, float(extra) / cap))
    for dev, values in shares.items():
        out.noise_share[dev] = float(np.mean(values))


CALL_WEIGHT_POWER = 0.25  # fit weights 1/t^p: 1 balances relative errors, 0 absolute ones (wall time)


def _fit_calls(runs: list[RunData], out: Params) -> None:
    """Per "device|variant|dtype|pass" (and "|*|" over every dtype), call_features' factors of the
    recorded per-call times. Where some runs of a device kind carry the attention probe
    (costmodel.measured_attention), that kind's factors are fitted on those runs alone: a fused kernel
    does not follow its dtype's matmul rate, which is all the others have. Without a probe the probe's
    feature is 0 (it would only repeat the matmul's), so factors fitted on such runs leave it 0."""
    probed = {device_type(d) for run in runs for d, c in (run.ceilings or {}).items() if measured_attention(c)}
    groups: dict[str, list[tuple[np.ndarray, float]]] = {}
    for run in runs:
        for row in _rows(run.frame):
            if row["status"] != "ok":
                continue
            case = _case_of(row)
            dev = device_type(case.device)
            ceil = run.ceilings.get(case.device) or run.ceilings.get(dev)
            if dev in probed and not measured_attention(ceil):
                continue
            shape = CellShape.of(case)
            x = call_features(shape, ceil)
            if not measured_attention(ceil):
                x[-1] = 0.0          # no probe: its feature would only repeat the dtype's matmul rate
            for pass_, col in (("fwd", "fwd_ms"), ("fwd_bwd", "fwd_bwd_ms")):
                t = row.get(col)
                if isinstance(t, (int, float)) and t == t and t > 0:
                    for dtype in (case.dtype, "*"):
                        groups.setdefault(f"{dev}|{call_variant(shape)}|{dtype}|{pass_}", []).append((x, t / 1e3))
    for key, items in groups.items():
        X = np.stack([x for x, _ in items])
        y = np.array([t for _, t in items])
        if len(items) < 2:
            continue
        out.call[key] = [float(c) for c in _nnls(X, y, y ** -CALL_WEIGHT_POWER)]




def _median_per_variant(runs: list[RunData], column: str, scale: float = 1.0) -> dict[str, float]:
    """{"device|variant": median of a record column over the runs' cells that have it}, each run's
    values in the reference host's seconds (divided by its host factor)."""
    values: dict[str, list[float]] = {}
    for run in runs:
        frame = run.frame
        if column not in frame.columns:
            continue
        host = run_host(run)
        for row in _rows(frame[frame[column].notna()]):
            values.setdefault(f"{device_type(row['device'])}|{row['variant']}", []).append(
                float(row[column]) * scale / host)
    return {k: float(np.median(v)) for k, v in values.items()}


def _first_compiled(frame: Any) -> Any:
    """The label of a run's first measured compiled cell (None without one): its compile also
    starts the compiler (imports, the C++ toolchain's checks, precompiled headers)."""
    compiled = frame[frame["variant"].isin(COMPILED_VARIANTS) & (frame["status"] == "ok")]
    return compiled.index[0] if len(compiled) else None


def _compile_medians(runs: list[RunData]) -> dict[str, float]:
    """Mean compile_s (_mean_of_most) per "device|variant" (call_variant: compiled[fused] apart) and, where
    records say, per "device|variant|hit" and "|miss" (compile_cache), leaving out each run's
    first compiled cell (compile_start_s)."""
    values: dict[str, list[float]] = {}
    for run in runs:
        frame = run.frame
        if "compile_s" not in frame.columns:
            continue
        first = _first_compiled(frame)
        host = run_host(run)
        for label, row in labelled_rows(frame[frame["compile_s"].notna()]):
            if label == first:
                continue
            base = f"{device_type(row['device'])}|{call_variant(CellShape.of(_case_of(row)))}"
            cache = row.get("compile_cache")
            for key in (base, f"{base}|{cache}") if isinstance(cache, str) else (base,):
                values.setdefault(key, []).append(float(row["compile_s"]) / host)
    return {k: _mean_of_most(v) for k, v in values.items()}




def _fit_host(runs: list[RunData], out: Params) -> None:
    out.host_call_s.update(_median_per_variant(runs, "fwd_host_ms", 1e-3))


def _explained(row: Any, shape: CellShape, settings: Settings, host: float = 1.0) -> float:
    """The part of a record's elapsed_s its own measurements account for (host: the run's host
    factor, for the referee's default seconds)."""
    t_f = row.get("fwd_ms")
    t_f = t_f / 1e3 if isinstance(t_f, (int, float)) and t_f == t_f else 0.0
    t_fb = row.get("fwd_bwd_ms")
    t_fb = t_fb / 1e3 if isinstance(t_fb, (int, float)) and t_fb == t_fb else 0.0
    compile_s = row.get("compile_s")
    compile_s = compile_s if isinstance(compile_s, (int, float)) and compile_s == compile_s else 0.0
    energy = row.get("energy_window_s")
    energy = energy * 1.03 if isinstance(energy, (int, float)) and energy == energy else 0.0
    lse = settings.lse_checks and returns_lse(shape.case.variant, shape.case.device)   # halves, lse gradient
    referee = REFEREE_CALLS if settings.referee else 0                                 # values_follow's forwards
    referee_s = REFEREE_DEFAULT_S[device_type(shape.case.device)] * host if settings.referee else 0.0
    return ((1 + settings.warmup_fwd_calls + lse + referee) * t_f + (1 + settings.warmup_fwd_bwd_calls + lse) * t_fb
            + referee_s
            + leak_probe_count(shape.case) * t_f
            + compile_s + energy + shards_seconds(shape.case, settings, t_f, host)
            + _samples_wall(row, "fwd") + _samples_wall(row, "fwd_bwd"))




def _compile_s_read(compile_s: dict[str, float], priors: Params | None) -> dict[str, float]:
    """The compile seconds a prediction will read (this fit's, else the priors': Params.merged). The first
    compiled cell's compile is taken out of its residual at them: else a run whose one miss is that cell fits
    the compiler's start without the compile the prediction then adds (the priors' miss, 1.84 reference-host s:
    4.5 s too much in `make test`'s serial phase)."""
    return {**(priors.compile_s if priors else {}), **compile_s}


def _fit_constants(runs: list[RunData], out: Params, priors: Params | None = None) -> None:
    """Per device: cell overhead, golden cost per chunk and per FLOP, weights cost per chunk,
    from the residual elapsed_s of ok cells; then first-use and run-start costs; skips."""
    by_dev: dict[str, list[tuple[np.ndarray, float, dict]]] = {}
    compile_s = _compile_medians(runs)
    known = _compile_s_read(compile_s, priors)
    for run in runs:
        previous = None
        seen: set[str] = set()
        configs: set[tuple] = set()
        first = _first_compiled(run.frame)
        host = run_host(run)
        says_source = "golden_source" in run.frame.columns and run.settings.golden_store
        for i, (label, row) in enumerate(labelled_rows(run.frame)):
            case = _case_of(row)
            dev = device_type(case.device)
            shape = CellShape.of(case)
            first_of_set = case.input_key != previous
            previous = case.input_key
            read = False
            if says_source:                   # schema 14: the record says whether it built or read its golden
                read = row.get("golden_source") == "read"
                first_of_set = row.get("golden_source") == "built"
            first_use = case.variant not in seen
            seen.add(case.variant)
            first_compiled = label == first
            cache = row.get("compile_cache") if first_compiled else None
            start = start_state(cache, run.compile_headers) if first_compiled and isinstance(cache, str) else None
            config = cudnn_config(shape) if row["status"] == "ok" else None
            new_config = config is not None and config not in configs
            if config is not None:
                configs.add(config)
            if row["status"] == "skipped" and "too slow" not in str(row.get("reason")):
                by_dev.setdefault(dev + "|skip", []).append((np.zeros(1), float(row["elapsed_s"] or 0) / host, {}))
                continue
            if row["status"] != "ok" or not isinstance(row.get("elapsed_s"), (int, float)):
                continue
            _n, gflops, gchunks = golden_cost_inputs(shape, run.settings)
            read_s = golden_read_s(shape, _n) if read else 0.0
            resid = float(row["elapsed_s"]) - _explained(row, shape, run.settings, host) - read_s * host
            if first_compiled and isinstance(row.get("compile_s"), float) and row["compile_s"] == row["compile_s"]:
                # what this compile took beyond a compile of its kind is the compiler's start-up
                typical = f"{dev}|{call_variant(shape)}"
                resid += row["compile_s"] - host * known.get(f"{typical}|{cache}",
                                                             known.get(typical, row["compile_s"] / host))
            resid /= host                                    # in the reference host's seconds
            weights = exposes_weights(case.variant)
            diagnosed = isinstance(row.get("diagnosis"), str)
            x = np.array([1.0, gchunks * first_of_set, gflops * first_of_set,
                          gchunks * weights, gflops / BACKWARD_FLOP_FACTOR * weights, float(new_config),
                          masked_rows_checked(shape) * run.settings.masked_rows_loop, float(diagnosed),
                          float(read)])
            by_dev.setdefault(dev, []).append((x, resid, {"first_use": first_use, "first": i == 0,
                                                           "first_compiled": first_compiled,
                                                           "start": start,
                                                           "variant": case.variant}))
    for dev, items in by_dev.items():
        if dev.endswith("|skip"):
            out.skip_s[dev.split("|")[0]] = float(np.median([r for _, r, _ in items]))
            continue
        regular = [(x, r) for x, r, info in items if not info["first_use"] and not info["first"]]
        if len(regular) < 3:
            continue
        X = np.stack([x for x, _ in regular])
        y = np.array([r for _, r in regular])
        # Golden FLOPs enter as 1/rate: fit on seconds, weight so no cell dominates.
        coef = _nnls(X, y, 1.0 / np.maximum(np.abs(y), 0.05))
        out.cell_s[dev] = float(coef[0])
        out.golden_chunk_s[dev] = float(coef[1])
        if coef[2] > 0:
            out.golden_flops_per_s[dev] = float(1.0 / coef[2])
        out.weights_chunk_s[dev] = float(coef[3])
        out.cudnn_config_s[dev] = float(coef[5])
        out.masked_row_s[dev] = float(coef[6])
        if any(x[7] for x, _ in regular):
            out.diagnosis_s[dev] = float(coef[7])
        if any(x[8] for x, _ in regular):
            out.golden_read_s[dev] = float(coef[8])
        first_use: dict[str, list[float]] = {}
        starts: list[float] = []
        compile_starts: dict[str, list[float]] = {}
        for x, r, info in items:
            extra = r - float(x @ coef)
            if info["first"]:
                starts.append(extra)
            elif info["first_compiled"]:          # importing Inductor, Triton or a C++ toolchain
                for key in (dev, f"{dev}|{info['start'] or 'unknown'}"):     # by cell_work.start_state
                    compile_starts.setdefault(key, []).append(extra)
            elif info["first_use"]:
                first_use.setdefault(info["variant"], []).append(extra)
        if starts:
            out.run_start_s[dev] = max(0.0, float(np.median(starts)))
        for key, extras in compile_starts.items():
            if not key.endswith("|unknown"):
                out.compile_start_s[key] = max(0.0, float(np.median(extras)))
        for variant, extras in first_use.items():
            out.init_s[f"{dev}|{variant}"] = max(0.0, float(np.median(extras)))
    out.compile_s.update(compile_s)


def compare(run: RunData, model: CostModel) -> Any:
    """Predicted against recorded elapsed_s for every cell of a run folder (its own settings,
    ceilings and order). Columns: id, status, recorded_s, predicted_s, ratio (predicted / recorded)."""
    frame_rows = _rows(run.frame)
    cases = [_case_of(row) for row in frame_rows]
    model = CostModel(model.params, host=run_host(run))     # the host the run was made on
    stored = {c.input_key for c, row in zip(cases, frame_rows) if row.get("golden_source") == "read"} \
        if "golden_source" in run.frame.columns else set()
    pred = model.predict(cases, run.settings, run.ceilings, warm_compiles=run.compiled_keys(["hit"]),
                         stored_goldens=stored, headers_built=run.compile_headers == "built")
    out = pred[["id", "variant"]].copy()
    out["status"] = list(run.frame["status"])
    out["recorded_s"] = list(run.frame["elapsed_s"].astype(float))
    out["predicted_s"] = list(pred["total_s"])
    out["ratio"] = out["predicted_s"] / out["recorded_s"]
    return out


def fit_folders(folders: Sequence[str | Path], free_bytes: dict[str, float] | None = None) -> Params:
    """fit() on run folders, with each device type's reference machine (its name, ceilings
    and free memory: what predicts a machine whose own are unknown) from the first folder
    that measured it."""
    runs = [RunData.load(d) for d in folders]
    params = fit(runs)
    free = free_bytes or {}
    for folder, run in zip(folders, runs):
        info = json.loads((Path(folder) / RUN_FILE).read_text())
        for device, ceil in (run.ceilings or {}).items():
            dev = device_type(device)
            if dev not in params.reference:
                env = info.get("env") or {}
                params.reference[dev] = {
                    "device_name": env.get("device_name") if dev == "cuda" else env.get("cpu_model"),
                    "ceilings": ceil, "free_bytes": int(free[dev]) if dev in free else None}
    return params


def check_folders(folders: Sequence[str | Path]) -> list[str]:
    """One line per run folder: recorded against predicted seconds, and the ok cells within 2x."""
    model = CostModel()
    lines = []
    for run in (RunData.load(d) for d in folders):
        table = compare(run, model)
        ok = table[table["status"] == "ok"]
        lines.append(f"{run.name}: recorded {table['recorded_s'].sum():.1f} s, predicted "
                     f"{table['predicted_s'].sum():.1f} s; ok cells within 2x: "
                     f"{int(((ok['ratio'] <= 2) & (ok['ratio'] >= 0.5)).sum())}/{len(ok)}")
    return lines
