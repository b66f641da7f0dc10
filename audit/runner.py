"""Run one cell -> record; run a grid with progress, resume and failure isolation.

Cells are ordered so those sharing inputs are adjacent (grid.expand): inputs and
the float64 reference are built once per input set and reused by its variants.
"""
from __future__ import annotations

import json
import math
import os
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from . import records
from .grid import Case, Preset
from .inputs import Inputs, cell_needs, make_inputs
from .memory import held_bytes, peak_during, pin_malloc_threshold
from .numerics import (BACKWARD_FLOP_FACTOR, attention_flops, changed_max, classify_masked_rows,
                       error_vs_reference, nonfinite_counts, relative_error, within_budget)
from .reference import Golden, golden_attention, golden_slices, row_visibility, take_slices
from .timing import (DeviceTimingFailed, Samples, cache_flusher, cuda_graph_replay, measure, measure_device,
                     sync_for, time_call)
from .variants import (BackwardUnsupported, Unsupported, Variant, compiled_graph_count, fused_attention_count,
                       resolve)

RUN_FILE = "run.json"


class CellSkipped(Exception):
    """A cell skipped by a documented rule (too slow for the device, say)."""


class CellTooBig(Exception):
    """A cell predicted to need more memory than is free: recorded as `oom` without running."""


class ContractError(Exception):
    """A variant returned something other than attention's output (README: Your own variant)."""


class WorkerRestart(Exception):
    """The measuring process should be replaced before the next cell (a cell leaked memory)."""


LEAK_REPORT_BYTES = 64 * 2**20      # held across the timed calls: recorded as leaked_bytes, and the
                                    # next cell gets a fresh process (the leak stays with the old one)


def check_output(out: Any, q: Any, v: Any) -> None:
    """The variant contract: a tensor of shape (B, H, Tq, d_v), q's dtype, on q's device."""
    import torch
    expected = (*q.shape[:-1], v.shape[-1])
    want = f"a tensor of shape {tuple(expected)}, dtype {_dtype_name(q.dtype)}, on {q.device}"
    if not isinstance(out, torch.Tensor):
        raise ContractError(f"the variant returned {type(out).__name__}"
                            f"{'' if out is None else ' ' + repr(out)[:60]}; expected {want}")
    problems = []
    if tuple(out.shape) != tuple(expected):
        problems.append(f"shape {tuple(out.shape)}")
    if out.dtype != q.dtype:
        problems.append(f"dtype {_dtype_name(out.dtype)}")
    if out.device != q.device:
        problems.append(f"device {out.device}")
    if problems:
        raise ContractError(f"the variant returned a tensor of {', '.join(problems)}; expected {want}")


def _dtype_name(dtype: Any) -> str:
    from .inputs import TORCH_DTYPES
    name = str(dtype).replace("torch.", "")
    return next((short for short, long in TORCH_DTYPES.items() if long == name), name)


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def _is_oom(exc: BaseException) -> bool:
    """An allocation failure on any device: CUDA's OutOfMemoryError, the CPU allocator's
    "can't allocate memory", Python's MemoryError."""
    import torch
    if isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MESSAGES)


def _reason(exc: BaseException) -> str:
    """`Type: first line of message (at file:line in function)`, short enough for a table.
    A broken variant contract is the variant's fault, not a place in the audit: no location."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, ContractError):
        return first[:400]
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {first}"[:400] + where


def _fill_timing(rec: dict[str, Any], prefix: str, samples: Samples) -> None:
    rec[f"{prefix}_ms"] = samples.median_s * 1e3
    rec[f"{prefix}_iqr_ms"] = samples.iqr_s * 1e3
    rec[f"{prefix}_n"] = samples.n
    rec[f"{prefix}_samples_s"] = samples.per_call_s


def _leak_checks(inputs: Inputs, tq: int, tk: int) -> list[tuple[Any, Any]]:
    """(keys to perturb (B|1, 1, 1, Tk), rows that must not change (B|1, 1, Tq)) pairs.

    A: keys hidden from at least half of the rows that see anything; the rows
    that see none of them must not change. B: every key, for fully masked rows.
    None of the pairs exists when the scenario masks nothing.
    """
    import torch
    from .reference import visibility
    vis = visibility(tq, tk, 0, tq, causal=inputs.causal, visible=inputs.visible,
                     device=inputs.q.device)
    if vis is None:
        return []
    while vis.dim() < 4:
        vis = vis[None]
    vis = vis.expand(vis.shape[0], 1, tq, tk)                                  # (B|1, 1, Tq, Tk)
    seeing = vis.any(-1)                                                       # (B|1, 1, Tq)
    hidden = (~vis & seeing[..., None]).sum(-2)                                # (B|1, 1, Tk)
    n_seeing = seeing.sum(-1, keepdim=True).clamp(min=1)                       # (B|1, 1, 1)
    keys = (2 * hidden >= n_seeing)[..., None, :]                              # (B|1, 1, 1, Tk)
    rows = seeing & ~(vis & keys).any(-1)                                      # (B|1, 1, Tq)
    checks = []
    if bool(keys.any()) and bool(rows.any()):
        checks.append((keys, rows))
    if bool((~seeing).any()):
        checks.append((torch.ones_like(keys), ~seeing))
    return checks


def leak_probes(inputs: Inputs) -> list[tuple[Any, Any, Any]]:
    """(k', v', rows) per leak check: k and v with large random changes on the keys the
    rows must not see. Built once per input set and shared by its variants."""
    import torch
    tq, tk = inputs.q.shape[-2], inputs.k.shape[-2]
    gen = torch.Generator().manual_seed(1234)
    probes = []
    for keys, rows in _leak_checks(inputs, tq, tk):
        noise_k = (3.0 + torch.randn(inputs.k.shape, generator=gen)).to(inputs.k.device, inputs.k.dtype)
        noise_v = (3.0 + torch.randn(inputs.v.shape, generator=gen)).to(inputs.v.device, inputs.v.dtype)
        sel = keys.transpose(-1, -2)                                            # (B|1, 1, Tk, 1)
        probes.append((torch.where(sel, inputs.k + noise_k, inputs.k),
                       torch.where(sel, inputs.v + noise_v, inputs.v), rows))
    return probes


def _leak_max_change(forward_with: Callable[[Any, Any], Any], probes: list[tuple[Any, Any, Any]],
                     out: Any) -> float | None:
    """Largest output change on rows that must not see the perturbed keys and values."""
    if not probes:
        return None
    return max(changed_max(out, forward_with(k2.detach(), v2.detach()).detach(), rows)
               for k2, v2, rows in probes)


def _variant_weight_metrics(variant: Variant, inputs: Inputs, ref: "Reference", q: Any, k: Any
                            ) -> dict[str, Any]:
    """Saturation, underflow and leaked mass from the variant's own attention weights, on the
    golden's (batch, head) slices (all of them unless golden_subset says otherwise)."""
    import torch
    from .numerics import SaturationAccumulator
    from .reference import golden_prob_chunks

    q, k = ref.take(q), ref.take_kv(k)                                           # (B|1, H|k, Tq, d)
    mask, visible = ref.take(inputs.mask), ref.take(inputs.visible)
    with torch.no_grad():
        probs = variant.probs(q, k, mask=mask, causal=inputs.causal,
                              score_mod=inputs.score_mod)                         # (B, H, Tq, Tk)
    sat = SaturationAccumulator()
    zero_where_golden_positive = golden_positive = 0
    leaked = None
    for r0, r1, gold, vis in golden_prob_chunks(q, k, causal=inputs.causal, visible=visible,
                                                score_mod=inputs.score_mod):
        p = probs[:, :, r0:r1].double()                                          # (B, H, rows, Tk)
        visx = None if vis is None else vis.expand_as(p)
        sat.add(p, visx)
        positive = gold > 0
        golden_positive += int(positive.sum())
        zero_where_golden_positive += int(((p == 0) & positive).sum())
        if visx is not None:
            seeing = visx.any(-1, keepdim=True)
            mass = torch.where(~visx & seeing, p, torch.zeros_like(p)).sum(-1)   # (B, H, rows)
            leaked = mass.amax() if leaked is None else torch.maximum(leaked, mass.amax())
    m = sat.result()
    m["underflow_frac"] = zero_where_golden_positive / golden_positive if golden_positive else None
    m["leak_mass"] = None if leaked is None else float(leaked)
    m["saturation_source"] = "variant"
    return m


def measure_cell(case: Case, variant: Variant, inputs: Inputs, ref: Reference,
                 preset: Preset, *, ceilings: dict | None = None, meter: Any = None,
                 builds: "BuildCache | None" = None) -> dict[str, Any]:
    """Measure one cell; return the measurement columns. Raises Unsupported/CellSkipped.

    ceilings: the run's measured limits for this device (roofline columns);
    meter: a telemetry.EnergyMeter for CUDA cells (energy and power columns);
    builds: the run's BuildCache (compiled code reused across cells of the same shapes).
    """
    import torch

    sync = sync_for(case.device)
    fn, build = (builds or BuildCache()).get(variant, inputs)
    graphs_before = compiled_graph_count() if variant.compiled else 0
    fused_before = fused_attention_count() if variant.compiled else 0
    q, k, v = (t.detach().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    kwargs = inputs.call_kwargs()
    tq, tk = q.shape[-2], k.shape[-2]

    def forward():
        return fn(q, k, v, **kwargs)                                   # (B, H, Tq, d)

    def forward_backward():
        return torch.autograd.grad(forward(), (q, k, v), inputs.grad_out)

    n_timed = preset.min_samples + 1  # timed samples plus the memory/numerics call

    # Warm-up: two calls each. The first includes compilation for compiled variants, and its
    # output is checked against the variant contract before anything is measured.
    backward_reason = None
    first_out: list = []

    def first_forward():
        first_out.append(forward())

    try:
        first_fwd = time_call(first_forward, sync=sync)
    except BackwardUnsupported as exc:  # forward-only here: inputs must not require grad
        backward_reason = str(exc)
        q, k, v = q.detach(), k.detach(), v.detach()
        first_fwd = time_call(first_forward, sync=sync)
    check_output(first_out[-1], q, v)
    first_out.clear()
    warm_fwd = time_call(forward, sync=sync)
    if warm_fwd * (1 + BACKWARD_FLOP_FACTOR) * n_timed > preset.max_cell_s:
        raise CellSkipped(
            f"too slow for this device: one forward took {warm_fwd:.3g} s, so this cell would "
            f"take about {warm_fwd * (1 + BACKWARD_FLOP_FACTOR) * n_timed:.0f} s "
            f"(limit {preset.max_cell_s:g} s per cell, --max-cell-s)")
    first_fb = time_call(forward_backward, sync=sync) if backward_reason is None else 0.0
    warm_fb = time_call(forward_backward, sync=sync) if backward_reason is None else 0.0
    if (warm_fwd + warm_fb) * n_timed > preset.max_cell_s:
        raise CellSkipped(
            f"too slow for this device: one forward+backward took {warm_fb:.3g} s, so this cell "
            f"would take about {(warm_fwd + warm_fb) * n_timed:.0f} s "
            f"(limit {preset.max_cell_s:g} s per cell, --max-cell-s)")
    compiled_here = variant.compiled and compiled_graph_count() > graphs_before
    if variant.compiled and build.fused is None:
        build.fused = fused_attention_count() > fused_before
    held_after_warmup = held_bytes(case.device)

    m: dict[str, Any] = {"q_len": tq, "reason": backward_reason and f"forward only: {backward_reason}",
                         "golden_subset": None if ref.slices is None else [list(p) for p in ref.slices]}
    if variant.backend is not None:
        m["sdpa_backend"] = variant.backend(q, k, v, mask=inputs.mask, causal=inputs.causal)
    golden = ref.golden
    out, m["peak_bytes"] = peak_during(forward, case.device)
    out = out.detach()
    m["out_nan"], m["out_inf"] = nonfinite_counts([out])
    seeing = ref.row_visible.expand(out.shape[:-1])                                # (B, H, Tq)
    m["out_nonfinite_visible"] = int((~torch.isfinite(out) & seeing[..., None]).sum())
    m.update(error_vs_reference(ref.take(out), golden.out, golden.row_visible))
    base = ref.baseline_rmse
    m["err_ratio"] = (m["rmse"] / base if base and math.isfinite(base) and base > 0 else None)
    m["within_budget"] = within_budget(m["rmse"], base, case.dtype)
    m["masked_rows"] = classify_masked_rows(out, ~ref.row_visible, inputs.v)
    # Same grad mode and requires_grad as the timed calls, so compiled variants do not recompile.
    m["leak_max_change"] = _leak_max_change(
        lambda k2, v2: fn(q, k2.requires_grad_(q.requires_grad), v2.requires_grad_(q.requires_grad),
                          **kwargs),
        ref.leak_probes, out)
    if ref.golden_bottom_right is not None:
        m["causal_alignment"] = _alignment(ref.take(out), golden, ref.golden_bottom_right)
    del out

    if backward_reason is None:
        grads, m["peak_fwd_bwd_bytes"] = peak_during(forward_backward, case.device)
        m["grad_nan"], m["grad_inf"] = nonfinite_counts(grads)
        for name, got, want, take in zip(("dq_err", "dk_err", "dv_err"), grads, (golden.dq, golden.dk, golden.dv),
                                         (ref.take, ref.take_kv, ref.take_kv)):
            m[name] = relative_error(take(got), want)
        del grads

    fwd, fb, timer = _time_cell(case, preset, forward, forward_backward if backward_reason is None else None,
                                warm_fwd, warm_fb)
    held_after_timing = held_bytes(case.device)
    if held_after_warmup is not None and held_after_timing is not None \
            and held_after_timing - held_after_warmup > LEAK_REPORT_BYTES:
        m["leaked_bytes"] = held_after_timing - held_after_warmup
    _fill_timing(m, "fwd", fwd)
    if fb is not None:
        _fill_timing(m, "fwd_bwd", fb)
    m.update(timer)
    m["fwd_host_ms"] = None if fwd.host_median_s is None else fwd.host_median_s * 1e3
    m["fwd_bwd_host_ms"] = None if fb is None or fb.host_median_s is None else fb.host_median_s * 1e3
    timed_on_device = [s for s in (fwd, fb) if s is not None and s.host_median_s is not None]
    if timed_on_device:
        m["host_bound"] = any(s.host_median_s > s.median_s for s in timed_on_device)

    flops = attention_flops(case.batch, case.heads, tq, tk, case.d_k, case.causal)   # per query head
    m["flops"] = flops
    m["gflops_per_s"] = flops / fwd.median_s / 1e9
    if fb is not None:
        m["fwd_bwd_gflops_per_s"] = flops * (1 + BACKWARD_FLOP_FACTOR) / fb.median_s / 1e9
    if variant.compiled:
        m["compile_reused"] = not compiled_here
        if compiled_here:
            m["compile_s"] = (max(0.0, first_fwd - fwd.median_s)
                              + (max(0.0, first_fb - fb.median_s) if fb else 0.0))
        m["fused_sdpa"] = build.fused

    for key in ("max_logit", "max_qk"):
        m[key] = golden.saturation[key]
    m["golden_onehot_frac"] = golden.saturation["onehot_frac"]
    m.update(_roofline(case, tq, inputs, fwd, fb, ceilings))
    m.update(_telemetry(case, forward, fwd, sync, meter, preset))
    if variant.probs is not None:
        m.update(_variant_weight_metrics(variant, inputs, ref, q.detach(), k.detach()))
    else:
        m.update({key: golden.saturation[key] for key in ("max_prob", "entropy", "min_entropy", "onehot_frac")})
        m["saturation_source"] = "golden"
    return m


_CUDA_CLOCK: Any = None


def cuda_clock() -> Any:
    """The process's timing.CudaClock (its spin rate is calibrated once)."""
    global _CUDA_CLOCK
    if _CUDA_CLOCK is None:
        from .timing import CudaClock
        _CUDA_CLOCK = CudaClock()
    return _CUDA_CLOCK


def _time_cell(case: Case, preset: Preset, forward: Callable[[], Any],
               forward_backward: Callable[[], Any] | None, warm_fwd: float, warm_fb: float
               ) -> tuple[Samples, Samples | None, dict[str, Any]]:
    """Timed samples of forward and forward+backward, and the columns saying how.

    CPU: the host clock around blocks of calls. CUDA: the device's own time (CUDA events
    around blocks queued behind a spin kernel, timing.measure_device), so a cell's time is
    the kernels' however slow the Python around them; where that cannot work (a call that
    synchronizes inside) the host clock with torch.cuda.synchronize, and `timer` says why.
    """
    timed_fwd, timed_fb, method = _timing_method(case, preset, forward, forward_backward)
    flush = cache_flusher(case.device) if preset.l2_flush and case.device == "cuda" else None
    sync = sync_for(case.device)
    fallback = None

    def one(fn: Callable[[], Any], estimate: float) -> Samples:
        nonlocal fallback
        if case.device == "cuda" and fallback is None:
            try:
                clock = cuda_clock()
                return measure_device(fn, estimate_s=estimate, clock=clock,
                                      min_samples=preset.min_samples, min_time_s=preset.min_time_s,
                                      before_sample=flush, host_clock=clock.host_clock)
            except DeviceTimingFailed as exc:
                fallback = str(exc)
        return measure(fn, estimate_s=estimate, min_samples=preset.min_samples,
                       min_time_s=preset.min_time_s, sync=sync, before_sample=flush)

    fwd = one(timed_fwd, warm_fwd)
    fb = one(timed_fb, warm_fb) if timed_fb is not None else None
    blocks = f"{fwd.calls_per_sample}/{fb.calls_per_sample if fb else '-'}"
    if case.device != "cuda":
        clock = "perf_counter"
    elif fallback is None:
        clock = "CUDA events around calls queued behind a spin kernel (device time)"
    else:
        clock = f"perf_counter with torch.cuda.synchronize (device timing failed: {fallback})"
    timer = (f"{case.device}: {clock}, {method}, blocks of {blocks} calls"
             + (", L2 flushed before each sample" if flush is not None else ""))
    return fwd, fb, {"timer": timer, "l2_flush": flush is not None,
                     "cuda_graph": method == "cuda-graph replay"}


def _timing_method(case: Case, preset: Preset, forward: Callable[[], Any],
                   forward_backward: Callable[[], Any] | None) -> tuple[Callable, Callable | None, str]:
    """The callables to time: the calls themselves, or their CUDA-graph replays."""
    if not (preset.cuda_graph and case.device == "cuda"):
        return forward, forward_backward, "eager calls"
    try:
        return (cuda_graph_replay(forward),
                cuda_graph_replay(forward_backward) if forward_backward is not None else None,
                "cuda-graph replay")
    except Exception as exc:  # noqa: BLE001 - a variant that cannot be captured is timed eagerly
        return forward, forward_backward, f"eager calls (CUDA-graph capture failed: {_reason(exc)})"


def _roofline(case: Case, tq: int, inputs: Inputs, fwd: Samples, fb: Samples | None,
              ceilings: dict | None) -> dict[str, Any]:
    from .roofline import ROOFLINE_COLUMNS, cell_roofline
    if not ceilings:
        return {col: None for col in ROOFLINE_COLUMNS}
    mask = inputs.mask
    case_like = dict(case.axes(), q_len=tq,
                     mask_bytes=0 if mask is None else mask.numel() * mask.element_size())
    return cell_roofline(case_like, fwd.median_s, fb.median_s if fb else None, ceilings)


ENERGY_UNIT_S = 2e-3       # device time of one energy-window unit (a graph replay of N calls)
MAX_ENERGY_UNIT_CALLS = 256


def _telemetry(case: Case, forward: Callable[[], Any], fwd: Samples, sync: Any, meter: Any,
               preset: Preset) -> dict:
    """NVML energy of back-to-back forward calls (telemetry.EnergyMeter.measure).

    Calls shorter than 2 ms run as replays of a CUDA graph holding N of them (about 2 ms of
    device work), so the GPU runs them back to back whatever the host costs per call; longer
    calls, and calls whose capture fails, run eagerly, and the record's energy_idle_frac says
    how long the GPU waited between them.
    """
    from .telemetry import null_telemetry
    if case.device != "cuda":
        return null_telemetry("NVML telemetry is for NVIDIA GPUs; this cell ran on the CPU")
    if meter is None or not getattr(meter, "available", False):
        return null_telemetry(getattr(meter, "reason", None) or "no energy meter for this run")
    if preset.energy_window_s <= 0:
        return null_telemetry("energy measurement turned off (--energy-window-s 0)")
    if case.scenario != "normal":
        return null_telemetry("energy is measured on speed cells (scenario normal) only")
    started = time.perf_counter()
    calls = max(1, min(MAX_ENERGY_UNIT_CALLS, math.ceil(ENERGY_UNIT_S / max(fwd.median_s, 1e-7))))

    def unit() -> None:
        for _ in range(calls):
            forward()
    how = "eager calls"
    if fwd.median_s < ENERGY_UNIT_S:     # short calls: one graph launch per unit keeps the GPU fed
        try:
            unit, how = cuda_graph_replay(forward, calls), "CUDA-graph replays"
        except Exception as exc:  # noqa: BLE001 - a variant that cannot be captured runs eagerly
            if sync:
                sync()
            how = f"eager calls (CUDA-graph capture failed: {_reason(exc)})"
    out = meter.measure(unit, calls_per_unit=calls, kernel_s=fwd.median_s, device=cuda_clock(),
                        min_window_s=preset.energy_window_s, sync=sync)
    if out.get("energy_method"):
        out["energy_method"] = f"{out['energy_method']} over {how}"
    out["energy_cost_s"] = time.perf_counter() - started
    return out


def _alignment(out: Any, top_left: Golden, bottom_right: Golden) -> str:
    """Which causal alignment the output follows: top-left, bottom-right or neither."""
    err_tl = error_vs_reference(out, top_left.out, top_left.row_visible)["rel_err"]
    err_br = error_vs_reference(out, bottom_right.out, bottom_right.row_visible)["rel_err"]
    close = 0.05
    if err_tl <= close and (err_tl < err_br or not math.isfinite(err_br)):
        return "top-left"
    if err_br <= close and (err_br < err_tl or not math.isfinite(err_tl)):
        return "bottom-right"
    return "neither"


@dataclass
class Reference:
    """Everything computed once per input set: float64 golden(s) and the same-dtype baseline.

    The goldens cover `slices` (golden_subset: None means every (batch, head) slice);
    take() cuts a variant's output or dq down to the same slices before comparing, take_kv()
    k, v, dk or dv (Hkv heads: each slice's group once). `row_visible` covers the whole
    output, for the NaN/inf and masked-row checks.
    """

    golden: Golden
    golden_bottom_right: Golden | None   # only when causal and Tq != Tk
    baseline_rmse: float | None          # `eager` in the input dtype against the golden
    leak_probes: list = field(default_factory=list)  # leak_probes(inputs)
    slices: list[tuple[int, int]] | None = None
    row_visible: Any = None              # (B|1, 1, Tq) bool: rows that see a key
    heads: int | None = None             # query heads (take_kv maps them to kv heads)

    def take(self, t: Any) -> Any:
        return take_slices(t, self.slices)

    def take_kv(self, t: Any) -> Any:
        return take_slices(t, self.slices, heads=self.heads)


class InputCache:
    """Inputs, float64 golden and baseline of the current input set, rebuilt when the set changes."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.inputs: Inputs | None = None
        self.ref: Reference | None = None
        self.golden_calls = 0

    def clear(self) -> None:
        """Drop the current input set (after an out-of-memory, so its memory can be freed)."""
        self.key = self.inputs = self.ref = None

    def get(self, case: Case) -> tuple[Inputs, Reference]:
        if case.input_key != self.key:
            self.inputs = self.ref = None  # free the previous set first
            self.key = None
            inputs = make_inputs(case)
            tq, tk = inputs.q.shape[-2], inputs.k.shape[-2]
            slices = golden_slices(case.batch, case.heads, tq, tk, case.d_k, case.causal, case.device,
                                   kv_heads=case.effective_kv_heads)
            q, grad_out = (take_slices(t, slices) for t in (inputs.q, inputs.grad_out))
            k, v = (take_slices(t, slices, heads=case.heads) for t in (inputs.k, inputs.v))
            visible = take_slices(inputs.visible, slices)
            mod = inputs.score_mod
            golden = golden_attention(q, k, v, grad_out=grad_out, causal=inputs.causal, visible=visible,
                                      score_mod=mod)
            self.golden_calls += 1
            bottom_right = None
            if inputs.causal and tq != tk:
                bottom_right = golden_attention(q, k, v, causal=True, visible=visible, alignment="bottom-right",
                                                score_mod=mod)
            rows = row_visibility(tq, tk, causal=inputs.causal, device=inputs.q.device, visible=inputs.visible)
            self.inputs = inputs
            self.ref = Reference(golden, bottom_right,
                                 _baseline_rmse(q, k, v, take_slices(inputs.mask, slices), inputs.causal, golden,
                                                mod),
                                 leak_probes(inputs), slices, rows, case.heads)
            self.key = case.input_key
        return self.inputs, self.ref


def _baseline_rmse(q: Any, k: Any, v: Any, mask: Any, causal: bool, golden: Golden,
                   score_mod: Any = None) -> float | None:
    """RMSE of hand-written attention in the input dtype: the error budget's yardstick
    (on the golden's slices)."""
    import torch
    from .variants import eager_attention
    try:
        with torch.no_grad():
            out = eager_attention(q, k, v, mask=mask, causal=causal, score_mod=score_mod)
    except Exception:  # noqa: BLE001 - no baseline: budgets become null, not fake
        return None
    return error_vs_reference(out, golden.out, golden.row_visible)["rmse"]


@dataclass
class Build:
    """A variant's callable for one kind of cell, and whether compiling it fused SDPA."""

    fn: Callable[..., Any]
    fused: bool | None = None


class BuildCache:
    """Callables reused across the cells of a run.

    Compiled variants (compiled, compiled_unfused, flex) are compiled once per shapes,
    dtype, causal flag and mask kind, and reused by every cell with the same: the
    stability cells of one size differ only in their input values. Other variants are
    cheap to build and get a fresh callable per cell.
    """

    def __init__(self) -> None:
        self._builds: dict[tuple, Build] = {}

    @staticmethod
    def key(variant: Variant, inputs: Inputs) -> tuple:
        mask = inputs.mask
        mask_kind = None if mask is None else (str(mask.dtype), tuple(mask.shape))
        return (variant.name, str(inputs.q.device), str(inputs.q.dtype), tuple(inputs.q.shape),
                tuple(inputs.k.shape), inputs.causal, mask_kind, str(inputs.score_mod))

    def get(self, variant: Variant, inputs: Inputs) -> tuple[Callable[..., Any], Build]:
        if not variant.compiled:
            build = Build(variant.build())
            return build.fn, build
        key = self.key(variant, inputs)
        if key not in self._builds:
            self._builds[key] = Build(variant.build())
        build = self._builds[key]
        return build.fn, build


def run_cell(case: Case, cache: InputCache, preset: Preset, env: dict[str, Any], *,
             ceilings: dict | None = None, meter: Any = None,
             builds: BuildCache | None = None) -> dict[str, Any]:
    """One record for one cell; every failure becomes a status with a reason."""
    rec = records.new_record(case.axes(), case.id)
    rec["started_at"] = _utc_now()
    rec["env"] = env
    start = time.perf_counter()
    oom = False
    try:
        variant = resolve(case.variant)
        refusal = variant.refusal(cell_needs(case))
        if refusal is not None:
            raise Unsupported(refusal)
        _check_memory(case)
        inputs, ref = cache.get(case)
        rec.update(measure_cell(case, variant, inputs, ref, preset,
                                ceilings=(ceilings or {}).get(case.device), meter=meter, builds=builds))
        rec["status"] = "ok"
    except (Unsupported, CellSkipped) as exc:
        rec["status"], rec["reason"] = "skipped", str(exc)
    except CellTooBig as exc:
        rec["status"], rec["reason"] = "oom", str(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - one cell's failure must not stop the run
        oom = _is_oom(exc)
        rec["status"], rec["reason"] = ("oom" if oom else "error"), _reason(exc)
    if oom:
        # Outside the except block: the traceback (and the tensors its frames hold) is gone.
        cache.clear()
        _release_device_memory(case.device)
    rec["elapsed_s"] = time.perf_counter() - start
    if rec["status"] != "ok":
        # A failed cell carries no measurements, not partial ones.
        for col in records.COLUMNS:
            if col not in case.axes() and col not in ("schema", "id", "status", "reason", "env",
                                                       "started_at", "elapsed_s"):
                rec[col] = None
    return rec


def _check_memory(case: Case) -> None:
    """Raise CellTooBig when the cell's predicted peak exceeds the memory free on its device
    (free memory is read only for the variants whose memory is predicted)."""
    from .inputs import q_len
    from .memory_model import free_bytes, predicted_peak_bytes, too_big
    if predicted_peak_bytes(case, q_len(case)) is None:
        return
    if case.device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()
    reason = too_big(case, q_len(case), free_bytes(case.device))
    if reason is not None:
        raise CellTooBig(reason)


INFLIGHT_FILE = "inflight"


def read_inflight(run_dir: Path) -> str | None:
    """Id of the cell the measuring process was in when it last stopped, if any."""
    found = inflight_since(run_dir)
    return found[0] if found else None


def inflight_since(run_dir: Path) -> tuple[str, float] | None:
    """(id, start time in seconds since the epoch) of the cell being measured, if any."""
    path = Path(run_dir) / INFLIGHT_FILE
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text:
        return None
    case_id, _, started = text.partition("\t")
    try:
        return case_id, float(started) if started else path.stat().st_mtime
    except (ValueError, OSError):
        return case_id, time.time()


def _mark_inflight(run_dir: Path, case_id: str | None) -> None:
    path = Path(run_dir) / INFLIGHT_FILE
    if case_id is None:
        path.unlink(missing_ok=True)
        return
    with open(path, "w") as fh:
        fh.write(f"{case_id}\t{time.time():.3f}")
        fh.flush()
        os.fsync(fh.fileno())


def record_crash(run_dir: Path, case: Case, reason: str, status: str = "error") -> None:
    """The record of a cell whose process died or was killed (no measurements): `error`, or
    `timeout` when the supervisor killed it for running past its time limit."""
    rec = records.new_record(case.axes(), case.id)
    rec.update(status=status, reason=reason, started_at=_utc_now())
    with records.RecordWriter(run_dir) as writer:
        writer.write(rec)
    _mark_inflight(run_dir, None)


def _release_device_memory(device: str) -> None:
    """After an out-of-memory, hand cached blocks back so the next cell starts clean."""
    import gc
    gc.collect()
    if device.startswith("cuda"):
        import torch
        torch.cuda.empty_cache()


def write_run_file(run_dir: Path, preset: Preset, axes: dict[str, tuple], argv: list[str],
                   env: dict[str, Any], n_cells: int, ceilings: dict | None = None) -> None:
    info = {"schema": records.SCHEMA_VERSION, "preset": preset.name,
            "axes": {k: list(v) for k, v in axes.items()}, "argv": argv,
            "started_at": _utc_now(), "env": env, "n_cells": n_cells, "ceilings": ceilings,
            "timing": {"min_samples": preset.min_samples, "min_time_s": preset.min_time_s,
                       "max_cell_s": preset.max_cell_s, "energy_window_s": preset.energy_window_s,
                       "budget_s": preset.budget_s}}
    (run_dir / RUN_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")


def run_grid(cases: Iterable[Case], run_dir: Path, preset: Preset, env: dict[str, Any], *,
             progress: bool = True, ceilings: dict | None = None,
             on_record: Callable[[dict[str, Any]], None] | None = None,
             plan: Any = None) -> dict[str, int]:
    """Measure every cell not already in DIR/records.jsonl; append each record at once.

    ceilings: {device: measure_ceilings(...)} for the roofline columns (None: nulls);
    plan: a budget.Plan (predictions, cells to skip, deadline), kept by a budget.Keeper.
    Returns counts per status of the cells measured in this call (plus "resumed").
    """
    from .budget import Keeper
    cases = list(cases)
    env = dict(env, cpu_allocator=pin_malloc_threshold())
    meter = _energy_meter(cases)
    done = records.completed_ids(run_dir)
    todo = [c for c in cases if c.id not in done]
    counts = {"resumed": len(cases) - len(todo)}
    cache = InputCache()
    builds = BuildCache()
    keeper = Keeper(plan, [c.id for c in todo])
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
                skip = keeper.reason(case.id)
                if skip is not None:
                    rec = records.new_record(case.axes(), case.id)
                    rec.update(status="skipped", reason=skip, started_at=_utc_now(), env=env, elapsed_s=0.0)
                else:
                    _mark_inflight(run_dir, case.id)
                    rec = run_cell(case, cache, preset, env, ceilings=ceilings, meter=meter, builds=builds)
                    keeper.done(case.id, rec["elapsed_s"])
                rec["predicted_s"] = keeper.predicted.get(case.id)
                writer.write(rec)
                _mark_inflight(run_dir, None)
                counts[rec["status"]] = counts.get(rec["status"], 0) + 1
                if on_record:
                    on_record(rec)
                if bar is not None:
                    bar.update(1)
                leaked = rec.get("leaked_bytes") or 0
                if leaked > LEAK_REPORT_BYTES:
                    raise WorkerRestart(f"{case.id} kept {leaked / 2**20:.0f} MiB across its calls: the rest "
                                        "of the run goes on in a fresh process")
    finally:
        if bar is not None:
            bar.close()
        if meter is not None:
            meter.close()
    return counts


def _energy_meter(cases: list[Case]) -> Any:
    """One NVML meter for the run's CUDA device (None without CUDA cells)."""
    if not any(c.device == "cuda" for c in cases):
        return None
    from .telemetry import EnergyMeter
    import torch
    return EnergyMeter(device_index=torch.cuda.current_device())


def ceilings_for(cases: Iterable[Case], run_dir: Path) -> dict[str, dict]:
    """The machine's measured limits per device, once per run folder (reused on resume)."""
    from .roofline import measure_ceilings
    path = Path(run_dir) / RUN_FILE
    known = {}
    if path.exists():
        known = json.loads(path.read_text()).get("ceilings") or {}
    out = {}
    for device in dict.fromkeys(c.device for c in cases):
        dtypes = tuple(dict.fromkeys(c.dtype for c in cases if c.device == device))
        have = known.get(device)
        if have and all(d in (have.get("matmul_flops_per_s") or {}) for d in dtypes):
            out[device] = have
        else:
            out[device] = measure_ceilings(device, dtypes)
    return out
