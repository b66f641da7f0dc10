"""Fit the cost model's per-cell constants phase by phase, from the records' `phase_s` (schema 9 on).

costfit's older fit explains a record's whole elapsed_s at once: what its calls do not account for
is one residual, spread over a constant per cell and the golden. On the cpu preset that fit put 39 s
in set-up where the cells spent 10 s, and half of the checks' 97 s nowhere, and the errors cancelled
on the run it was fitted on and not on another (a warm quick run predicted 18% over). Here each part
of a cell is fitted on its own seconds, with the features that drive it:

- setup (set-up and what no phase holds): a constant a cell;
- golden (cells that built their input set's reference): seconds per reference, per chunk, per score
  element (slices·Tq·Tk: the softmax, masks and saturation) and per float64 FLOP;
  (cells that read it back: a constant beyond golden_store.read_s);
- warmup: a constant and a factor on the warm-up calls' steady-state time (a first call allocates);
  each constant's feature is the run's host factor, each call factor's the calls' own seconds;
- checks (numerics, leak, invariance, determinism, saturation, referee): a constant, factors on the
  checks' forward and forward+backward calls (checks_calls), seconds per element of the cell's
  tensors (the comparisons, copies and bitwise checks), the exposed weights' float64 chunks and
  FLOPs, and a constant per leak probe (its keys compared, its rows judged);
- diagnosis: the mean a negative control's cell spends in it, and a real variant's cell per
  scenario (a real variant is diagnosed where its output is wrong: the fully masked scenarios, ...).

Every constant is in the reference host's seconds (each run's divided by its host factor), as the
model's HOST_BOUND ones; call factors multiply this machine's own call times. Pure Python + numpy.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..workload.variant_contract import BROKEN_PREFIX
from .fitbase import case_of, golden_read_s, mean_of_most, nnls, rows, run_host

CHECK_PHASES = ("numerics", "leak", "invariance", "determinism", "saturation", "referee")
MIN_CELLS = 20          # cells a device needs before its phases are fitted (else the older fit stands)


def _lstsq_nonneg(X: np.ndarray, y: np.ndarray, relative: bool = False) -> np.ndarray:
    """Non-negative least squares; relative: each cell weighed by 1/sqrt of its seconds (between
    absolute errors, where the big cells decide, and relative ones, where the many small ones do)."""
    return nnls(X, y, 1.0 / np.sqrt(np.maximum(y, 0.005)) if relative else np.ones(len(y)))


def fit_phases(runs: Sequence[Any], out: Any) -> None:
    """Set out's cell_s, golden_chunk_s, golden_flops_per_s, golden_read_s, warmup_call, checks_call,
    diagnosis_s and real_diagnosis_s per device from the runs' ok records with phase_s."""
    from .cell_shape import CellShape, exposes_weights, golden_cost_inputs
    from .cell_work import argument_compile_keys, checks_calls, device_type, leak_probe_count, tensor_elems
    per: dict[str, dict[str, list]] = {}
    for run in runs:
        frame = run.frame
        if "phase_s" not in frame.columns:
            continue
        host = run_host(run)
        seen: set[str] = set()
        first = True                                   # the run's first measured cell (it starts the device)
        previous = None
        for row in rows(frame):
            phases = row.get("phase_s")
            case = case_of(row)
            first_use = case.variant not in seen
            seen.add(case.variant)
            new_set = case.input_key != previous and row["status"] == "ok"   # schema 13: it built the golden
            previous = case.input_key if row["status"] == "ok" else previous
            if row["status"] != "ok" or not isinstance(phases, dict) or not phases:
                continue
            dev = device_type(case.device)
            shape = CellShape.of(case)
            d = per.setdefault(dev, {k: [] for k in ("setup", "golden", "read", "warmup", "checks", "diag_broken",
                                                     "diag_real")})
            t_f = _seconds(row.get("fwd_ms"))
            t_fb = _seconds(row.get("fwd_bwd_ms"))
            elapsed = float(row["elapsed_s"])
            other = elapsed - sum(float(v) for v in phases.values())
            if not first and not first_use and "compile" not in phases:
                d["setup"].append((phases.get("setup", 0.0) + max(0.0, other)) / host)
            first = False
            source = row.get("golden_source") if run.settings.golden_store else None
            n, flops, chunks = golden_cost_inputs(shape, run.settings)
            if source == "read":
                d["read"].append((phases.get("golden", 0.0) - golden_read_s(shape, n) * host) / host)
            elif source == "built" or (source is None and not run.settings.golden_store and new_set):
                if run.settings.referee and run.settings.referee_golden_forward:
                    from ..measure.golden.numerics import BACKWARD_FLOP_FACTOR
                    flops *= 1 + 1 / (1 + BACKWARD_FLOP_FACTOR)
                d["golden"].append(([1.0, chunks, n * shape.q_len * case.seq_len, flops],
                                    phases.get("golden", 0.0) / host))
            if "compile" not in phases:                     # a compile's first calls are in compile_s
                wf, wfb = run.settings.warmup_fwd_calls * t_f, run.settings.warmup_fwd_bwd_calls * t_fb
                d["warmup"].append(([host, wf + wfb], phases.get("warmup", 0.0), host))
            compiled_here = case.variant in _compiled_variants()
            # a compiled variant's invariance calls and argument probes compile: the compile model's
            probes_compile = compiled_here and run.settings.arguments and bool(argument_compile_keys(case))
            checks = sum(float(phases.get(p, 0.0)) for p in CHECK_PHASES
                         if not (p == "invariance" and compiled_here) and not (p == "leak" and probes_compile))
            n_f, n_fb = checks_calls(case, run.settings, shape)
            if compiled_here:
                n_f -= _invariance_calls(case, run.settings)
            _, wflops, wchunks = golden_cost_inputs(shape, run.settings)
            weights = exposes_weights(case.variant)
            d["checks"].append(([host, n_f * t_f, n_fb * t_fb, tensor_elems(shape) * host,
                                 wchunks * weights * host, wflops * weights * host,
                                 leak_probe_count(case) * host], checks, host))
            diagnosis = float(phases.get("diagnosis", 0.0)) / host
            if case.variant.startswith(BROKEN_PREFIX):
                d["diag_broken"].append(diagnosis)
            else:
                d["diag_real"].append(diagnosis)
                d.setdefault("diag_scenario", {}).setdefault(case.scenario, []).append(diagnosis)
    for dev, d in per.items():
        if len(d["checks"]) < MIN_CELLS:
            continue
        if d["setup"]:
            out.cell_s[dev] = mean_of_most(d["setup"])
        if len(d["golden"]) >= 3:
            coef = _lstsq_nonneg(np.array([x for x, _ in d["golden"]]), np.array([y for _, y in d["golden"]]))
            out.golden_set_s[dev], out.golden_chunk_s[dev], out.golden_score_s[dev] = (float(c) for c in coef[:3])
            out.golden_flops_per_s[dev] = float(1.0 / coef[3]) if coef[3] > 0 else 1e15
        if d["read"]:
            out.golden_read_s[dev] = max(0.0, mean_of_most(d["read"]))
        for name, key in (("warmup_call", "warmup"), ("checks_call", "checks")):
            items = d[key]
            if len(items) >= 3:
                X = np.array([x for x, _, _ in items])
                y = np.array([v for _, v, _ in items])
                coef = _lstsq_nonneg(X, y, relative=True)
                getattr(out, name)[dev] = [float(c) for c in coef]
        if d["diag_broken"]:
            out.diagnosis_s[dev] = mean_of_most(d["diag_broken"])
        if d["diag_real"]:
            out.real_diagnosis_s[dev] = float(np.mean(d["diag_real"]))
            for scenario, values in d.get("diag_scenario", {}).items():   # a real variant is diagnosed where it fails
                out.real_diagnosis_s[f"{dev}|{scenario}"] = float(np.mean(values))


def _seconds(ms: Any) -> float:
    return float(ms) / 1e3 if isinstance(ms, (int, float)) and ms == ms else 0.0


def _compiled_variants() -> tuple[str, ...]:
    from .costmodel import COMPILED_VARIANTS
    return COMPILED_VARIANTS


def _invariance_calls(case: Any, settings: Any) -> float:
    from ..workload.inputs import invariance_applies
    if not settings.invariance:
        return 0.0
    batch, chunk = invariance_applies(case)
    return (1.0 / case.batch if batch else 0.0) + (1.0 if chunk else 0.0)
