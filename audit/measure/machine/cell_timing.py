"""How a cell's passes are timed: the policy over machine/timing.py's clocks, for one cell and its preset.

CPU: the host clock around blocks of calls. CUDA: the device's own time (CUDA events around blocks
queued behind a spin kernel), the host clock with torch.cuda.synchronize where that cannot work;
CUDA-graph replays and the L2 flush where the preset asks; and on CUDA each pass again with a
device-wide fence, for the referee's check of work left on another stream. The referee pins these
functions and the clocks they imported (referee/timers.py: TIMER_OBJECTS).
"""
from __future__ import annotations

from typing import Any, Callable

from ...core.grid import Case
from ...core.noise import SamplingRule
from ...workload.presets import Preset
from ..cell.failures import failure_reason
from .timing import (DeviceTimingFailed, Samples, cache_flusher, cuda_graph_replay, fenced_time, measure,
                     measure_device, sync_for, time_call)


def timed_result(fn: Callable[[], Any], sync: Any) -> tuple[Any, float]:
    """(fn(), its seconds): one call timed as time_call times it, its result kept."""
    result: list = []
    seconds = time_call(lambda: result.append(fn()), sync=sync)
    return result[0], seconds


_CUDA_CLOCK: Any = None


def cuda_clock() -> Any:
    """The process's timing.CudaClock (its spin rate is calibrated once)."""
    global _CUDA_CLOCK
    if _CUDA_CLOCK is None:
        from .timing import CudaClock
        _CUDA_CLOCK = CudaClock()
    return _CUDA_CLOCK


def time_cell(case: Case, preset: Preset, forward: Callable[[], Any],
               forward_backward: Callable[[], Any] | None, warm_fwd: float, warm_fb: float
               ) -> tuple[Samples, Samples | None, dict[str, Any]]:
    """Timed samples of forward and forward+backward, and the columns saying how.

    CPU: the host clock around blocks of calls. CUDA: the device's own time (CUDA events
    around blocks queued behind a spin kernel, timing.measure_device), so a cell's time is
    the kernels' however slow the Python around them; where that cannot work (a call that
    synchronizes inside) the host clock with torch.cuda.synchronize, and `timer` says why.
    """
    timed_fwd, timed_fb, method = timing_method(case, preset, forward, forward_backward)
    flush = cache_flusher(case.device) if preset.l2_flush and case.device == "cuda" else None
    rule = SamplingRule(preset.noise_target or None, preset.noise_cap_s)   # sample on until the median is known
    sync = sync_for(case.device)
    fallback = None

    fenced: dict[str, float] = {}

    def one(fn: Callable[[], Any], estimate: float, key: str) -> Samples:
        nonlocal fallback
        if case.device == "cuda" and fallback is None:
            try:
                clock = cuda_clock()
                samples = measure_device(fn, estimate_s=estimate, clock=clock,
                                         min_samples=preset.min_samples, min_time_s=preset.min_time_s,
                                         before_sample=flush, host_clock=clock.host_clock, rule=rule)
                # the same block of calls with a device-wide fence: work on another stream shows
                fenced[key] = fenced_time(fn, samples.calls_per_sample, sync, clock=clock.host_clock)
                return samples
            except DeviceTimingFailed as exc:
                fallback = str(exc)
        return measure(fn, estimate_s=estimate, min_samples=preset.min_samples,
                       min_time_s=preset.min_time_s, sync=sync, before_sample=flush, rule=rule)

    fwd = one(timed_fwd, warm_fwd, "fwd")
    fb = one(timed_fb, warm_fb, "fwd_bwd") if timed_fb is not None else None
    blocks = f"{fwd.calls_per_sample}/{fb.calls_per_sample if fb else '-'}"
    if case.device != "cuda":
        clock = "perf_counter"
    elif fallback is None:
        clock = "CUDA events around calls queued behind a spin kernel (device time)"
    else:
        clock = f"perf_counter with torch.cuda.synchronize (device timing failed: {fallback})"
    timer = (f"{case.device}: {clock}, {method}, blocks of {blocks} calls"
             + (", L2 flushed before each sample" if flush is not None else ""))
    return fwd, fb, {"timer": timer, "l2_flush": flush is not None, "noise_target": preset.noise_target or None,
                     "cuda_graph": method == "cuda-graph replay", "fenced_s": fenced or None}


def timing_method(case: Case, preset: Preset, forward: Callable[[], Any],
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
