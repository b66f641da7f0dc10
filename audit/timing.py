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

Clock = Callable[[], float]


@dataclass
class Samples:
    """Per-call times in seconds, one entry per timed block."""

    per_call_s: list[float] = field(default_factory=list)
    calls_per_sample: int = 1

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
    return lambda: buffer.fill_(1)


def cuda_graph_replay(fn: Callable[[], object]) -> Callable[[], None]:
    """Capture one call of `fn` (already warmed up) in a CUDA graph; return its replay.

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
        fn()
    return graph.replay


def sync_for(device: str) -> Callable[[], None] | None:
    """The device synchronization to call before reading a host clock (None on CPU)."""
    if device.startswith("cuda"):
        import torch
        return torch.cuda.synchronize
    return None


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
            min_time_s: float = 0.2, max_samples: int = 200, min_block_s: float = 1e-3,
            clock: Clock = time.perf_counter,
            sync: Callable[[], None] | None = None,
            before_sample: Callable[[], None] | None = None) -> Samples:
    """Time `fn` (already warmed up) until at least `min_samples` samples and `min_time_s`.

    Calls faster than `min_block_s` are timed in blocks of several calls so clock
    overhead stays negligible; each sample is the block time / calls. `estimate_s`
    is the time of one warm call, used to size blocks. `before_sample` (a cache
    flush, say) runs untimed before every sample, and then every sample is one call.
    """
    if min_samples < 1:
        raise ValueError("min_samples must be >= 1")
    per_block = max(1, math.ceil(min_block_s / estimate_s)) if estimate_s > 0 else 1
    if before_sample is not None:
        per_block = 1
    samples = Samples(calls_per_sample=per_block)
    spent = 0.0
    while samples.n < max_samples and (samples.n < min_samples or spent < min_time_s):
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
        spent += elapsed
        samples.per_call_s.append(elapsed / per_block)
    return samples
