"""Run one cell -> record; run a grid with progress, resume and failure isolation.

Cells are ordered so those sharing inputs are adjacent (grid.expand): inputs and
the float64 reference are built once per input set and reused by its variants.
"""
from __future__ import annotations

import json
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from . import records
from .grid import Case, Preset
from .inputs import Inputs, make_inputs
from .memory import peak_during
from .numerics import BACKWARD_FLOP_FACTOR, attention_flops, error_vs_reference, nonfinite_counts
from .reference import Golden, golden_attention
from .timing import Samples, measure, time_call
from .variants import Unsupported, Variant, fused_attention_count, resolve

RUN_FILE = "run.json"


class CellSkipped(Exception):
    """A cell skipped by a documented rule (too slow for the device, say)."""


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _is_oom(exc: BaseException) -> bool:
    import torch
    if isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _reason(exc: BaseException) -> str:
    """`Type: first line of message (at file:line in function)`, short enough for a table."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {first}"[:400] + where


def _sync_for(device: str) -> Callable[[], None] | None:
    if device.startswith("cuda"):
        import torch
        return torch.cuda.synchronize
    return None


def _fill_timing(rec: dict[str, Any], prefix: str, samples: Samples) -> None:
    rec[f"{prefix}_ms"] = samples.median_s * 1e3
    rec[f"{prefix}_iqr_ms"] = samples.iqr_s * 1e3
    rec[f"{prefix}_n"] = samples.n
    rec[f"{prefix}_samples_s"] = samples.per_call_s


def measure_cell(case: Case, variant: Variant, inputs: Inputs, golden: Golden,
                 preset: Preset) -> dict[str, Any]:
    """Measure one cell; return the measurement columns. Raises Unsupported/CellSkipped."""
    import torch

    sync = _sync_for(case.device)
    fused_before = fused_attention_count() if variant.compiled else 0
    fn = variant.build()
    q, k, v = (t.detach().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    kwargs = dict(mask=inputs.mask, causal=inputs.causal)

    def forward():
        return fn(q, k, v, **kwargs)                                   # (B, H, T, d)

    def forward_backward():
        return torch.autograd.grad(forward(), (q, k, v), inputs.grad_out)

    n_timed = preset.min_samples + 1  # timed samples plus the memory/numerics call

    # Warm-up: two calls each. The first includes compilation for compiled variants.
    first_fwd = time_call(forward, sync=sync)
    warm_fwd = time_call(forward, sync=sync)
    if warm_fwd * (1 + BACKWARD_FLOP_FACTOR) * n_timed > preset.max_cell_s:
        raise CellSkipped(
            f"too slow for this device: one forward took {warm_fwd:.3g} s, so this cell would "
            f"take about {warm_fwd * (1 + BACKWARD_FLOP_FACTOR) * n_timed:.0f} s "
            f"(limit {preset.max_cell_s:g} s per cell, --max-cell-s)")
    first_fb = time_call(forward_backward, sync=sync)
    warm_fb = time_call(forward_backward, sync=sync)
    if (warm_fwd + warm_fb) * n_timed > preset.max_cell_s:
        raise CellSkipped(
            f"too slow for this device: one forward+backward took {warm_fb:.3g} s, so this cell "
            f"would take about {(warm_fwd + warm_fb) * n_timed:.0f} s "
            f"(limit {preset.max_cell_s:g} s per cell, --max-cell-s)")

    m: dict[str, Any] = {}
    out, m["peak_bytes"] = peak_during(forward, case.device)
    m["out_nan"], m["out_inf"] = nonfinite_counts([out])
    m.update(error_vs_reference(out.detach(), golden.out))
    del out
    grads, m["peak_fwd_bwd_bytes"] = peak_during(forward_backward, case.device)
    m["grad_nan"], m["grad_inf"] = nonfinite_counts(grads)
    del grads

    fwd = measure(forward, estimate_s=warm_fwd, min_samples=preset.min_samples,
                  min_time_s=preset.min_time_s, sync=sync)
    fb = measure(forward_backward, estimate_s=warm_fb, min_samples=preset.min_samples,
                 min_time_s=preset.min_time_s, sync=sync)
    _fill_timing(m, "fwd", fwd)
    _fill_timing(m, "fwd_bwd", fb)
    m["timer"] = ("cuda: perf_counter with torch.cuda.synchronize" if sync
                  else f"cpu: perf_counter, blocks of {fwd.calls_per_sample}/{fb.calls_per_sample} calls")

    flops = attention_flops(case.batch, case.heads, case.seq_len, case.seq_len, case.d_k, case.causal)
    m["flops"] = flops
    m["gflops_per_s"] = flops / fwd.median_s / 1e9
    m["fwd_bwd_gflops_per_s"] = flops * (1 + BACKWARD_FLOP_FACTOR) / fb.median_s / 1e9
    if variant.compiled:
        m["compile_s"] = max(0.0, first_fwd - fwd.median_s) + max(0.0, first_fb - fb.median_s)
        m["fused_sdpa"] = fused_attention_count() > fused_before
    m.update(golden.saturation)
    return m


class InputCache:
    """Inputs and float64 golden of the current input set, rebuilt when the set changes."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.inputs: Inputs | None = None
        self.golden: Golden | None = None
        self.golden_calls = 0

    def get(self, case: Case) -> tuple[Inputs, Golden]:
        if case.input_key != self.key:
            self.inputs = self.golden = None  # free the previous set first
            self.inputs = make_inputs(case)
            self.golden = golden_attention(self.inputs.q, self.inputs.k, self.inputs.v,
                                           mask=self.inputs.mask, causal=self.inputs.causal)
            self.golden_calls += 1
            self.key = case.input_key
        return self.inputs, self.golden


def run_cell(case: Case, cache: InputCache, preset: Preset, env: dict[str, Any]) -> dict[str, Any]:
    """One record for one cell; every failure becomes a status with a reason."""
    rec = records.new_record(case.axes(), case.id)
    rec["started_at"] = _utc_now()
    rec["env"] = env
    start = time.perf_counter()
    try:
        variant = resolve(case.variant)
        inputs, golden = cache.get(case)
        rec.update(measure_cell(case, variant, inputs, golden, preset))
        rec["status"] = "ok"
    except (Unsupported, CellSkipped) as exc:
        rec["status"], rec["reason"] = "skipped", str(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - one cell's failure must not stop the run
        if _is_oom(exc):
            rec["status"], rec["reason"] = "oom", _reason(exc)
        else:
            rec["status"], rec["reason"] = "error", _reason(exc)
    finally:
        rec["elapsed_s"] = time.perf_counter() - start
    if rec["status"] != "ok":
        # A failed cell carries no measurements, not partial ones.
        for col in records.COLUMNS:
            if col not in case.axes() and col not in ("schema", "id", "status", "reason", "env",
                                                       "started_at", "elapsed_s"):
                rec[col] = None
    return rec


def write_run_file(run_dir: Path, preset: Preset, axes: dict[str, tuple], argv: list[str],
                   env: dict[str, Any], n_cells: int) -> None:
    info = {"schema": records.SCHEMA_VERSION, "preset": preset.name,
            "axes": {k: list(v) for k, v in axes.items()}, "argv": argv,
            "started_at": _utc_now(), "env": env, "n_cells": n_cells,
            "timing": {"min_samples": preset.min_samples, "min_time_s": preset.min_time_s,
                       "max_cell_s": preset.max_cell_s}}
    (run_dir / RUN_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")


def run_grid(cases: Iterable[Case], run_dir: Path, preset: Preset, env: dict[str, Any], *,
             progress: bool = True,
             on_record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, int]:
    """Measure every cell not already in DIR/records.jsonl; append each record at once.

    Returns counts per status of the cells measured in this call (plus "resumed").
    """
    cases = list(cases)
    done = records.completed_ids(run_dir)
    todo = [c for c in cases if c.id not in done]
    counts = {"resumed": len(cases) - len(todo)}
    cache = InputCache()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(cases), initial=len(cases) - len(todo), unit="cell", dynamic_ncols=True,
                   smoothing=0.05, mininterval=0.5, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")
    try:
        with records.RecordWriter(run_dir) as writer:
            for case in todo:
                if bar is not None:
                    bar.set_postfix_str(case.id, refresh=True)
                rec = run_cell(case, cache, preset, env)
                writer.write(rec)
                counts[rec["status"]] = counts.get(rec["status"], 0) + 1
                if on_record:
                    on_record(rec)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return counts
