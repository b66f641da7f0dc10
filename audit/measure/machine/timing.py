"""Timers and statistics. The clock and the device sync are injectable so the
logic is unit-tested with a fake clock.

Samples are stored raw, in seconds per call; statistics are computed from them.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...core.noise import SamplingRule, ci_rel

Clock = Callable[[], float]
MIN_BLOCK_S = 1e-3        # calls faster than this are timed in blocks (a device sync or spin per block)
# ... and on the host clock alone (CPU cells): the shorter the block, the more samples a measurement's
# seconds buy, and the fewer calls one interruption of the machine spoils. The quick preset on a 2-core
# Xeon VM, idle: 1 ms blocks left 36 to 130 of ~155 cells wider than ±5% after their cap; 0.2 ms
# blocks left 3 of 272, sampling 1.4 s beyond the minimum where 1 ms blocks took 6 to 11 s
# (docs/measurement.md, Timing noise). perf_counter's ~0.1 µs is 0.05% of a 0.2 ms block.
MIN_HOST_BLOCK_S = 2e-4
# samples per measurement, at most: with 0.2 ms blocks, 200 stopped a tenth of a quick run's noisy
# cells before their --noise-cap-s (their medians still ±6-8%); raw samples are kept in the records
# (500 of both passes: ~20 kB a cell)
MAX_SAMPLES = 500
REBLOCKED_MIN_CALLS = 200  # a re-blocked measurement's minimum time: this many single calls' (as before)
MAX_BLOCK = 100_000       # calls per block, at most


@dataclass
class Samples:
    """Per-call times in seconds, one entry per timed block."""

    per_call_s: list[float] = field(default_factory=list)
    calls_per_sample: int = 1
    host_per_call_s: list[float] = field(default_factory=list)  # device timing: host issue time per call
    method: str = "host clock"
    extra_s: float = 0.0            # seconds sampled beyond the fixed minimum (noise.SamplingRule)

    @property
    def ci_rel(self) -> float | None:
        """The median's 95% interval half-width over the median (noise.ci_rel)."""
        return ci_rel(self.per_call_s)

    @property
    def host_median_s(self) -> float | None:
        return median(self.host_per_call_s) if self.host_per_call_s else None

    @property
    def n(self) -> int:
        return len(self.per_call_s)

    @property
    def median_s(self) -> float:
        return median(self.per_call_s)

    @property
    def iqr_s(self) -> float:
        return iqr(self.per_call_s)


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no samples")
    return statistics.median(values)


def iqr(values: Sequence[float]) -> float:
    """Interquartile range (inclusive quartiles, like numpy's default linear method)."""
    if not values:
        raise ValueError("IQR of no samples")
    if len(values) == 1:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def cache_flusher(device: str, nbytes: int | None = None) -> Callable[[], None]:
    """Overwrite a buffer larger than the GPU's L2 (256 MiB; H100/H200 have 50-60 MB), so a
    sample starts with a cold cache instead of the previous call's data."""
    import torch
    size = nbytes or (256 * 2**20 if device.startswith("cuda") else 64 * 2**20)
    buffer = torch.empty(size, dtype=torch.uint8, device=device)
    buffer.fill_(1)         # warm: the first fill_ loads its kernel, which must not happen inside a sample
    return lambda: buffer.fill_(1)


def cuda_graph_replay(fn: Callable[[], object], calls: int = 1) -> Callable[[], None]:
    """Capture `calls` back-to-back calls of `fn` (already warmed up) in one CUDA graph;
    return its replay.

    Replays skip Python and launch overhead, as FlashAttention's benchmarks do for
    small problems. Raises what capture raises (a CPU sync inside fn, say).
    """
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def sync_for(device: str) -> Callable[[], None] | None:
    """The device synchronization to call before reading a host clock (None on CPU)."""
    if device.startswith("cuda"):
        import torch
        return torch.cuda.synchronize
    return None


def min_block_for(synced: bool) -> float:
    """The shortest block of calls one sample times: MIN_BLOCK_S where every block pays a device
    sync (its ~10 µs would be 5% of a 0.2 ms block, inside the time), MIN_HOST_BLOCK_S on the host
    clock alone."""
    return MIN_BLOCK_S if synced else MIN_HOST_BLOCK_S


def time_call(fn: Callable[[], object], *, clock: Clock = time.perf_counter,
              sync: Callable[[], None] | None = None) -> float:
    """Seconds for one call, synchronizing the device before each clock read."""
    if sync:
        sync()
    start = clock()
    fn()
    if sync:
        sync()
    return clock() - start


def measure(fn: Callable[[], object], *, estimate_s: float, min_samples: int = 5,
            min_time_s: float = 0.2, max_samples: int = MAX_SAMPLES, min_block_s: float | None = None,
            clock: Clock = time.perf_counter,
            sync: Callable[[], None] | None = None,
            before_sample: Callable[[], None] | None = None,
            rule: SamplingRule | None = None) -> Samples:
    """Time `fn` (already warmed up) until at least `min_samples` samples and `min_time_s`, then
    while `rule` asks for more (the median's interval wider than its target, up to its cap).

    Calls faster than `min_block_s` are timed in blocks of several calls so clock (and sync)
    overhead stays negligible (default: min_block_for(sync)); each sample is the block time / calls. `estimate_s`
    is the time of one warm call, used to size blocks; a first block under half of
    `min_block_s` re-sizes them and is not kept (the minimum time then at most REBLOCKED_MIN_CALLS
    calls' time, as one call a sample took). `before_sample` (a cache
    flush, say) runs untimed before every sample, and then every sample is one call.
    """
    if min_samples < 1:
        raise ValueError("min_samples must be >= 1")
    min_block_s = min_block_for(sync is not None) if min_block_s is None else min_block_s
    per_block = max(1, math.ceil(min_block_s / estimate_s)) if estimate_s > 0 else 1
    if before_sample is not None:
        per_block = 1
    samples = Samples(calls_per_sample=per_block)
    spent, reblocked = 0.0, False
    while samples.n < max_samples:
        extra = samples.n >= min_samples and spent >= min_time_s
        if extra and (rule is None or not rule.more(samples.per_call_s, samples.extra_s)):
            break
        if before_sample is not None:
            before_sample()
        if sync:
            sync()
        start = clock()
        for _ in range(per_block):
            fn()
        if sync:
            sync()
        elapsed = clock() - start
        if not reblocked and before_sample is None and 0 < elapsed < min_block_s / 2:
            reblocked = True
            # the estimate was long (a warm call measured with memory tracking around it): re-block
            # from this first sample, and drop it (one 30 µs call a sample read ±4% at 200 samples)
            per_call = elapsed / per_block
            per_block = max(per_block, min(MAX_BLOCK, math.ceil(min_block_s / per_call)))
            samples.calls_per_sample = per_block
            # the minimum's time stays what REBLOCKED_MIN_CALLS single calls took before the re-blocking
            # (beyond it, the SamplingRule samples on where the median is not known well enough)
            min_time_s = min(min_time_s, min(max_samples, REBLOCKED_MIN_CALLS) * per_call)
            continue
        spent += elapsed
        samples.extra_s += elapsed if extra else 0.0
        samples.per_call_s.append(elapsed / per_block)
    return samples


def fenced_time(fn: Callable[[], object], calls: int, sync: Callable[[], None],
                clock: Clock = time.perf_counter) -> float:
    """Seconds per call of `calls` calls bracketed by device-wide synchronizes: what every stream's
    work took, the host's issue time included (so it is compared with the larger of the device
    time and the host's: the referee's check of work left on another stream, referee/timers.py)."""
    sync()
    start = clock()
    for _ in range(max(1, calls)):
        fn()
    sync()
    return (clock() - start) / max(1, calls)


# --------------------------------------------------------------------------- device time
#
# A host clock around `calls + synchronize` measures the host's time, which is the
# kernel's only when the host issues work faster than the device runs it. For small
# kernels it is not: on the H200, sdpa_cudnn (the backend forced around each call) read
# 0.087 ms where the dispatcher's call of the same cuDNN kernel read 0.037 ms. So on
# CUDA the device times itself: a spin kernel holds the GPU while the host queues a
# whole block of calls behind it (NVBench's "blocking kernel"), and CUDA events around
# the block measure the device's time for back-to-back calls. If the spin ended before
# the host finished queueing (the start event has already run), the block may have
# gaps: the spin is lengthened and the block timed again.

class CudaClock:
    """CUDA events and a spin kernel (torch.cuda._sleep) on the current stream."""

    host_clock = staticmethod(time.perf_counter)

    def __init__(self) -> None:
        import torch
        self._torch = torch
        self.cycles_per_s = self._calibrate()

    def _calibrate(self) -> float:
        torch = self._torch
        cycles = 1 << 20
        rate = 1e9
        for _ in range(2):  # the first spin also pays for loading the kernel
            start, end = self.event(), self.event()
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rate = cycles / max(start.elapsed_time(end) / 1e3, 1e-6)
        return rate

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def hold(self, seconds: float) -> None:
        self._torch.cuda._sleep(max(1, int(seconds * self.cycles_per_s)))

    def event(self):
        return self._torch.cuda.Event(enable_timing=True)


MAX_DEVICE_BLOCK = 32      # calls queued per block (the launch queue holds ~1000 kernels)
MAX_LATE_BLOCKS = 4        # consecutive blocks whose spin ended too early before giving up on device timing
HOLD_MARGIN = 2.0          # the spin lasts this many times the host's last queueing time ...
HOLD_EXTRA_S = 5e-4        # ... plus this: autograd-heavy calls vary more than 1.5x from block to block


class DeviceTimingFailed(RuntimeError):
    """The host could not queue a block before the device reached it (fn syncs, say)."""


def measure_device(fn: Callable[[], object], *, estimate_s: float, clock, min_samples: int = 5,
                   min_time_s: float = 0.2, max_samples: int = MAX_SAMPLES, min_block_s: float = MIN_BLOCK_S,
                   before_sample: Callable[[], None] | None = None,
                   host_clock: Clock = time.perf_counter, rule: SamplingRule | None = None) -> Samples:
    """Time `fn` (already warmed up) with the device's own clock, as measure() does with the host's.

    Each sample: synchronize, spin the device for longer than the host needs to queue the
    block, run `before_sample` (a cache flush), record a start event, queue the block's
    calls, record an end event. The sample is (end - start) / calls: back-to-back device
    time, whatever Python costs. The host's time to queue the block is kept per call in
    `host_per_call_s` (a call is host-bound when that exceeds its device time).
    `min_time_s` counts the wall time of the samples (spin included), so a host-bound
    cell costs about as long as with measure().

    A late block (the spin ended before the host had queued it) is thrown away and the spin
    doubled. Only MAX_LATE_BLOCKS late blocks in a row raise DeviceTimingFailed: a call that
    synchronizes is late every time, while a GC pause or a first-time kernel load is late
    once, and scattered hiccups over 200 samples must not switch a cell to host timing.
    `before_sample` runs once, untimed, before the first sample (its first call may load a
    kernel), and its host time counts in the spin. `rule`: as in measure(), on the samples' wall time.
    """
    if min_samples < 1:
        raise ValueError("min_samples must be >= 1")
    per_block = 1 if before_sample is not None or estimate_s <= 0 else \
        min(MAX_DEVICE_BLOCK, max(1, math.ceil(min_block_s / estimate_s)))
    samples = Samples(calls_per_sample=per_block, method="device events")
    hold_s = per_block * max(estimate_s, 1e-4) + 2e-3     # first guess; then learned from the host
    if before_sample is not None:
        before_sample()
        clock.synchronize()
    spent, late = 0.0, 0
    while samples.n < max_samples:
        extra = samples.n >= min_samples and spent >= min_time_s
        if extra and (rule is None or not rule.more(samples.per_call_s, samples.extra_s)):
            break
        clock.synchronize()
        clock.hold(hold_s)
        t_flush = host_clock()
        if before_sample is not None:
            before_sample()
        start, end = clock.event(), clock.event()
        sample_start = host_clock()
        flush_s = sample_start - t_flush
        start.record()
        t0 = host_clock()
        for _ in range(per_block):
            fn()
        host_s = host_clock() - t0
        end.record()
        queued_in_time = not start.query()     # still spinning: the whole block is queued behind it
        clock.synchronize()
        wall = host_clock() - sample_start
        if not queued_in_time:
            late += 1
            if late >= MAX_LATE_BLOCKS:
                raise DeviceTimingFailed(
                    f"the host could not queue {per_block} call(s) before the device reached them "
                    f"{late} times in a row (host {host_s * 1e3:.3g} ms per block; does the call synchronize?)")
            hold_s = 2 * max(hold_s, host_s + flush_s)
            continue
        late = 0
        elapsed = start.elapsed_time(end) / 1e3
        spent += wall
        samples.extra_s += wall if extra else 0.0
        samples.per_call_s.append(elapsed / per_block)
        samples.host_per_call_s.append(host_s / per_block)
        hold_s = max(HOLD_MARGIN * (host_s + flush_s) + HOLD_EXTRA_S, 1e-4)
    return samples
