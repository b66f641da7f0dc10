"""Measure one cell: warm-up, the variant contract, numerics against the float64 golden,
leaks, timed samples, roofline and energy -> the record's measurement columns.

The cell's inputs and reference come from cellcache (built once per input set); runner
turns the columns, or the failure, into the cell's record.
"""
from __future__ import annotations

import math
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from ..core.defects import numerics_defect
from ..core.errors import BackwardUnsupported
from ..core.grid import Case
from ..core.timesplit import PhaseClock
from ..workload.inputs import TORCH_DTYPES, Inputs
from ..workload.presets import Preset
from ..workload.variants import Variant, compiled_graph_count, fused_attention_count, graph_break_count
from . import compile_cache
from .cellcache import BuildCache, Reference
from .diagnosis import diagnose_cell
from .memory import held_bytes, peak_during
from .numerics import (BACKWARD_FLOP_FACTOR, SaturationAccumulator, attention_flops, changed_max,
                       classify_masked_rows, error_vs_reference, nonfinite_counts, relative_error,
                       within_budget)
from .reference import Golden, golden_prob_chunks
from .repeats import Repeats, deterministic_algorithms_enabled
from .timing import (DeviceTimingFailed, Samples, cache_flusher, cuda_graph_replay, measure, measure_device,
                     sync_for, time_call)


class CellSkipped(Exception):
    """A cell skipped by a documented rule (too slow for the device, say)."""


class ContractError(Exception):
    """A variant returned something other than attention's output (docs/variants.md)."""


LEAK_REPORT_BYTES = 64 * 2**20      # held across the timed calls: recorded as leaked_bytes, and the
                                    # next cell gets a fresh process (the leak stays with the old one)


def input_grads(out: Any, leaves: tuple, grad_out: Any) -> tuple:
    """(dq, dk, dv): the backward of `out` with grad_out, read from the leaves' .grad.

    `out.backward()`, not `torch.autograd.grad(out, leaves)`: the latter refuses reentrant
    torch.utils.checkpoint ("incompatible with .grad() or passing an `inputs` parameter"),
    which memory-efficient attention code uses; custom autograd.Functions and non-leaf
    intermediates work either way. The .grad fields are cleared before and after, so nothing
    accumulates across calls and the inputs hold no gradient between them; a leaf the
    variant never used gets a zero gradient.
    """
    import torch
    for t in leaves:
        t.grad = None
    out.backward(grad_out)
    grads = tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves)
    for t in leaves:
        t.grad = None
    return grads


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
    name = str(dtype).replace("torch.", "")
    return next((short for short, long in TORCH_DTYPES.items() if long == name), name)


def failure_reason(exc: BaseException) -> str:
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
                 builds: "BuildCache | None" = None, phases: PhaseClock | None = None) -> dict[str, Any]:
    """Measure one cell; return the measurement columns. Raises Unsupported/CellSkipped.

    ceilings: the run's measured limits for this device (roofline columns);
    meter: a energy.EnergyMeter for CUDA cells (energy and power columns);
    builds: the run's BuildCache (compiled code reused across cells of the same shapes);
    phases: where the cell's seconds per phase go (core.timesplit: the record's phase_s).
    """
    import torch

    phases = phases if phases is not None else PhaseClock()
    sync = sync_for(case.device)
    with phases("setup"):
        fn, build = (builds or BuildCache()).get(variant, inputs)
    graphs_before = compiled_graph_count() if variant.compiled else 0
    breaks_before = graph_break_count()
    fused_before = fused_attention_count() if variant.compiled else 0
    cache_before = compile_cache.snapshot() if variant.compiled else None
    q, k, v = (t.detach().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    kwargs = inputs.call_kwargs()
    tq, tk = q.shape[-2], k.shape[-2]

    def forward():
        return fn(q, k, v, **kwargs)                                   # (B, H, Tq, d)

    def forward_backward():
        return input_grads(forward(), (q, k, v), inputs.grad_out)

    n_timed = preset.min_samples + 1  # timed samples plus the memory/numerics call

    # Warm-up: one call of each; the numerics calls (below) are the second, and their times size
    # the timed blocks (the first compiles, allocates, builds plans). The first forward's output
    # is checked against the variant contract before anything is measured.
    backward_reason = None
    first_out: list = []

    def first_forward():
        first_out.append(forward())

    with phases("warmup"):
        try:
            first_fwd = time_call(first_forward, sync=sync)
        except BackwardUnsupported as exc:  # forward-only here: inputs must not require grad
            backward_reason = str(exc)
            q, k, v = q.detach(), k.detach(), v.detach()
            first_fwd = time_call(first_forward, sync=sync)
    check_output(first_out[-1], q, v)
    # Every call runs on identical inputs: three runs of each output, compared bitwise
    # (repeats.py) at no extra calls: out from the warm-up forward, the numerics forward and the
    # warm-up forward+backward's own forward (a forward-only cell: a second warm-up forward); the
    # gradients from the warm-up call, the numerics call and the last timed call.
    repeats = Repeats()
    with phases("determinism"):
        repeats.add("out", first_out.pop())
    m: dict[str, Any] = {"q_len": tq, "reason": backward_reason and f"forward only: {backward_reason}",
                         "golden_subset": None if ref.slices is None else [list(p) for p in ref.slices]}
    golden = ref.golden
    with phases("numerics"):
        if variant.backend is not None:
            m["sdpa_backend"] = variant.backend(q, k, v, mask=inputs.mask, causal=inputs.causal)
        (out, warm_fwd), m["peak_bytes"] = peak_during(lambda: _timed_result(forward, sync), case.device)
        out = out.detach()                  # held for the diagnosis, once the record is complete
    with phases("determinism"):
        repeats.add("out", out)
    limit_s = math.inf if preset.max_cell_s is None else preset.max_cell_s
    if warm_fwd * (1 + BACKWARD_FLOP_FACTOR) * n_timed > limit_s:
        raise CellSkipped(
            f"too slow for this device: one forward took {warm_fwd:.3g} s, so this cell would "
            f"take about {warm_fwd * (1 + BACKWARD_FLOP_FACTOR) * n_timed:.0f} s "
            f"(limit {preset.max_cell_s:g} s per cell, --max-cell-s)")
    first_fb = warm_fb = 0.0

    def first_forward_backward():
        result = forward()
        first_out.append(result.detach())
        first_out.append(input_grads(result, (q, k, v), inputs.grad_out))

    if backward_reason is None:
        with phases("warmup"):
            first_fb = time_call(first_forward_backward, sync=sync)
        with phases("determinism"):
            repeats.add_grads(first_out.pop())
            repeats.add("out", first_out.pop())
    else:
        with phases("warmup"):
            time_call(first_forward, sync=sync)
        with phases("determinism"):
            repeats.add("out", first_out.pop())
    held_after_warmup = held_bytes(case.device)

    with phases("numerics"):
        m["out_nan"], m["out_inf"] = nonfinite_counts([out])
        seeing = ref.row_visible.expand(out.shape[:-1])                            # (B, H, Tq)
        m["out_nonfinite_visible"] = int((~torch.isfinite(out) & seeing[..., None]).sum())
        m.update(error_vs_reference(ref.take(out), golden.out, golden.row_visible))
        base = ref.baseline_rmse
        m["err_ratio"] = (m["rmse"] / base if base and math.isfinite(base) and base > 0 else None)
        m["within_budget"] = within_budget(m["rmse"], base, case.dtype)
        m["masked_rows"] = classify_masked_rows(out, ~ref.row_visible, inputs.v)
    with phases("leak"):
        # Same grad mode and requires_grad as the timed calls, so compiled variants do not recompile.
        m["leak_max_change"] = _leak_max_change(
            lambda k2, v2: fn(q, k2.requires_grad_(q.requires_grad), v2.requires_grad_(q.requires_grad),
                              **kwargs),
            ref.leak_probes, out)
    with phases("numerics"):
        if ref.by_alignment:
            m["causal_alignment"] = _alignment(ref.take(out), ref.by_alignment["top-left"],
                                               ref.by_alignment["bottom-right"])
            m["golden_alignment"] = ref.alignment

    # The numerics call of forward+backward is also the second of its warm-up: its time sizes the
    # timed blocks (the first call compiles, allocates, builds plans). The third run the
    # determinism check compares is the last timed call's (held by reference: no copy, no call).
    last_grads: list = []
    if backward_reason is None:
        with phases("numerics"):
            (grads, warm_fb), m["peak_fwd_bwd_bytes"] = peak_during(
                lambda: _timed_result(forward_backward, sync), case.device)
        with phases("determinism"):
            repeats.add_grads(grads)
        with phases("numerics"):
            m["grad_nan"], m["grad_inf"] = nonfinite_counts(grads)
            for name, got, want, take in zip(("dq_err", "dk_err", "dv_err"), grads,
                                             (golden.dq, golden.dk, golden.dv), (ref.take, ref.take_kv, ref.take_kv)):
                m[name] = relative_error(take(got), want)
        del grads
    if (warm_fwd + warm_fb) * n_timed > limit_s:
        raise CellSkipped(
            f"too slow for this device: one forward+backward took {warm_fb:.3g} s, so this cell "
            f"would take about {(warm_fwd + warm_fb) * n_timed:.0f} s "
            f"(limit {preset.max_cell_s:g} s per cell, --max-cell-s)")
    compiled_here = variant.compiled and compiled_graph_count() > graphs_before
    cache_use = compile_cache.outcome(cache_before) if compiled_here and cache_before else None
    if variant.compiled and build.fused is None:
        build.fused = fused_attention_count() > fused_before

    def timed_forward_backward() -> None:
        last_grads[:] = [forward_backward()]

    with phases("timed"):
        fwd, fb, timer = _time_cell(case, preset, forward,
                                    timed_forward_backward if backward_reason is None else None, warm_fwd, warm_fb)
    with phases("determinism"):
        if last_grads:
            repeats.add_grads(last_grads.pop())
        m.update(repeats.columns(), deterministic_algorithms=deterministic_algorithms_enabled())
        repeats.release()
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
            m["compile_cache"] = cache_use
            phases.move(m["compile_s"], "warmup", "compile")
        m["fused_sdpa"] = build.fused
    # Graph breaks: the code between the pieces ran eagerly. Counted over the whole cell (warm-up,
    # leak probes, timing: a recompile there counts too) and kept on the build, so a cell that
    # reuses compiled code reports the breaks of the compile it reuses.
    breaks = max(0, graph_break_count() - breaks_before)
    if variant.compiled:
        build.graph_breaks = (build.graph_breaks or 0) + breaks
        m["graph_breaks"] = build.graph_breaks
    elif breaks:                  # a plug-in that compiles inside
        m["graph_breaks"] = breaks

    for key in ("max_logit", "max_qk"):
        m[key] = golden.saturation[key]
    m["golden_onehot_frac"] = golden.saturation["onehot_frac"]
    m.update(_roofline(case, tq, inputs, fwd, fb, ceilings))
    with phases("energy"):
        m.update(_telemetry(case, forward, fwd, sync, meter, preset))
    if variant.probs is not None:
        with phases("saturation"):
            m.update(_variant_weight_metrics(variant, inputs, ref, q.detach(), k.detach()))
    else:
        m.update({key: golden.saturation[key] for key in ("max_prob", "entropy", "min_entropy", "onehot_frac")})
        m["saturation_source"] = "golden"
    if numerics_defect(m):      # the cells of an error finding about numerics: why is it wrong?
        with phases("diagnosis"):
            m.update(_diagnosis(out, inputs, ref, case.dtype, m))
    return m


def _timed_result(fn: Callable[[], Any], sync: Any) -> tuple[Any, float]:
    """(fn(), its seconds): one call timed as time_call times it, its result kept."""
    result: list = []
    seconds = time_call(lambda: result.append(fn()), sync=sync)
    return result[0], seconds


def _diagnosis(out: Any, inputs: Inputs, ref: Reference, dtype: str, m: dict[str, Any]) -> dict[str, Any]:
    """diagnose_cell's columns; if the audit's own diagnosis fails, the cell keeps its measurements
    and its reason says so (a diagnosis is an explanation, not a measurement)."""
    try:
        return diagnose_cell(out, inputs, ref, dtype, ref.baseline_rmse)
    except Exception as exc:  # noqa: BLE001
        return {"reason": "; ".join(filter(None, [m.get("reason"), f"diagnosis failed: {failure_reason(exc)}"]))}


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
        return forward, forward_backward, f"eager calls (CUDA-graph capture failed: {failure_reason(exc)})"


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
ENERGY_HOT_SAMPLES = 3     # --l2-flush: units timed hot (device events behind a spin) for the idle fraction ...
ENERGY_HOT_LONG_S = 0.01   # ... or one, for units longer than this


def _telemetry(case: Case, forward: Callable[[], Any], fwd: Samples, sync: Any, meter: Any,
               preset: Preset) -> dict:
    """NVML energy of back-to-back forward calls (energy.EnergyMeter.measure).

    Calls shorter than 2 ms run as replays of a CUDA graph holding N of them (about 2 ms of
    device work), so the GPU runs them back to back whatever the host costs per call; longer
    calls, and calls whose capture fails, run eagerly, and the record's energy_idle_frac says
    how long the GPU waited between them. With --l2-flush the timed median is a cold-cache
    time while the window runs hot, so the idle fraction takes a hot one instead: a few units
    timed as the samples were (CUDA events behind a spin kernel), without the flush.
    """
    from .energy import MAX_WALL_S as ENERGY_MAX_WALL_S, null_telemetry
    if case.device != "cuda":
        return null_telemetry("NVML telemetry is for NVIDIA GPUs; this cell ran on the CPU")
    if meter is None or not getattr(meter, "available", False):
        return null_telemetry(getattr(meter, "reason", None) or "no energy meter for this run")
    if preset.energy_window_s <= 0:
        return null_telemetry("energy measurement turned off (--energy-window-s 0)")
    if case.scenario != "normal":
        return null_telemetry("energy is measured on speed cells (scenario normal) only")
    clock = getattr(meter, "clock", time.perf_counter)
    started = clock()
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
            how = f"eager calls (CUDA-graph capture failed: {failure_reason(exc)})"
    kernel_s: float | None = fwd.median_s
    cold_note = None
    if preset.l2_flush:                 # fwd.median_s is a cold-cache time: time the unit hot
        device = cuda_clock()
        try:
            hot = measure_device(unit, estimate_s=calls * fwd.median_s, clock=device, min_time_s=0.0,
                                 min_samples=ENERGY_HOT_SAMPLES if calls * fwd.median_s <= ENERGY_HOT_LONG_S
                                 else 1, host_clock=device.host_clock)
            kernel_s = hot.median_s / calls
        except DeviceTimingFailed as exc:
            kernel_s = None
            cold_note = ("energy_idle_frac unknown: the timed samples ran with the L2 cache flushed "
                         "(--l2-flush), a cold-cache time while the window runs hot, and the calls could "
                         f"not be timed hot ({exc})")
    out = meter.measure(unit, calls_per_unit=calls, kernel_s=kernel_s,
                        unit_device_s=calls * (kernel_s or fwd.median_s), device=cuda_clock(),
                        min_window_s=preset.energy_window_s, max_wall_s=ENERGY_MAX_WALL_S, sync=sync)
    if out.get("energy_method"):
        out["energy_method"] = f"{out['energy_method']} over {how}"
    if cold_note:
        out["energy_idle_frac"] = None
        out["telemetry_reason"] = "; ".join(filter(None, [out.get("telemetry_reason"), cold_note]))
    out["energy_cost_s"] = clock() - started
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
