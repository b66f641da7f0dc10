"""Tests of audit.measure.machine.timing with a fake clock: no test here reads a real clock."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from audit.measure.machine.timing import Samples, iqr, measure, median, time_call


class FakeClock:
    """A clock that only moves when the fake workload says so; logs every read."""

    def __init__(self, log=None):
        self.now = 0.0
        self.reads = 0
        self.log = log if log is not None else []

    def __call__(self) -> float:
        self.reads += 1
        self.log.append("clock")
        return self.now


def workload(clock: FakeClock, durations):
    """fn() advancing the clock by durations[i] on its i-th call (last one repeats)."""
    calls = []

    def fn():
        i = len(calls)
        calls.append(i)
        clock.log.append("fn")
        clock.now += durations[min(i, len(durations) - 1)]

    fn.calls = calls
    return fn


def scripted_clock(times):
    it = iter(times)
    return lambda: next(it)


# --------------------------------------------------------------------------- measure: how many samples

def test_min_samples_governs_when_min_time_is_already_met():
    clock = FakeClock()
    fn = workload(clock, [0.125])
    s = measure(fn, estimate_s=0.125, min_samples=5, min_time_s=0.25, min_block_s=1e-3, clock=clock)
    assert s.n == 5
    assert s.calls_per_sample == 1
    assert s.per_call_s == [0.125] * 5
    assert len(fn.calls) == 5
    assert clock.reads == 2 * 5


def test_min_time_governs_when_samples_are_fast():
    clock = FakeClock()
    fn = workload(clock, [0.125])
    s = measure(fn, estimate_s=0.125, min_samples=2, min_time_s=1.0, min_block_s=1e-3, clock=clock)
    assert s.n == 8  # 8 * 0.125 s == 1.0 s

    clock = FakeClock()
    fn = workload(clock, [0.125])
    s = measure(fn, estimate_s=0.125, min_samples=2, min_time_s=1.01, min_block_s=1e-3, clock=clock)
    assert s.n == 9


def test_max_samples_caps_a_long_min_time():
    clock = FakeClock()
    fn = workload(clock, [0.125])
    s = measure(fn, estimate_s=0.125, min_samples=3, min_time_s=1e6, max_samples=7, min_block_s=1e-3,
                clock=clock)
    assert s.n == 7
    assert len(fn.calls) == 7


def test_min_samples_must_be_positive():
    clock = FakeClock()
    with pytest.raises(ValueError):
        measure(workload(clock, [1.0]), estimate_s=1.0, min_samples=0, clock=clock)


# --------------------------------------------------------------------------- measure: blocks of calls

def test_fast_calls_are_timed_in_blocks_and_divided():
    clock = FakeClock()
    unit = 2.0 ** -12
    # first block's four calls take 1, 2, 3 and 6 units: per-call time is their mean, 3 units
    fn = workload(clock, [unit, 2 * unit, 3 * unit, 6 * unit, unit])
    s = measure(fn, estimate_s=unit, min_samples=3, min_time_s=0.0, min_block_s=4 * unit, clock=clock)
    assert s.calls_per_sample == 4
    assert s.n == 3
    assert s.per_call_s[0] == 3 * unit
    assert s.per_call_s[1:] == [unit, unit]
    assert len(fn.calls) == 3 * 4
    assert clock.reads == 2 * 3  # the clock is read around blocks, not around calls


def test_min_time_counts_block_time_not_per_call_time():
    clock = FakeClock()
    unit = 2.0 ** -12
    fn = workload(clock, [unit])
    # each block of 4 calls takes 4 units; 8 blocks reach 32 units
    s = measure(fn, estimate_s=unit, min_samples=1, min_time_s=32 * unit, min_block_s=4 * unit, clock=clock)
    assert s.calls_per_sample == 4
    assert s.n == 8
    assert s.per_call_s == [unit] * 8


@pytest.mark.parametrize("estimate_s", [0.0, 2e-3, 1.0])
def test_slow_or_unknown_calls_are_timed_one_by_one(estimate_s):
    clock = FakeClock()
    fn = workload(clock, [0.5])
    s = measure(fn, estimate_s=estimate_s, min_samples=3, min_time_s=0.0, min_block_s=1e-3, clock=clock)
    assert s.calls_per_sample == 1
    assert len(fn.calls) == 3


def test_sync_is_called_around_each_block():
    log: list[str] = []
    clock = FakeClock(log)
    fn = workload(clock, [0.25])
    s = measure(fn, estimate_s=0.25, min_samples=3, min_time_s=0.0, min_block_s=0.5, clock=clock,
                sync=lambda: log.append("sync"))
    assert s.calls_per_sample == 2
    block = ["sync", "clock", "fn", "fn", "sync", "clock"]
    assert log == block * 3


def test_scripted_clock_gives_the_differences():
    clock = scripted_clock([0.0, 1.0, 10.0, 12.0, 20.0, 23.0])
    calls = []
    s = measure(lambda: calls.append(1), estimate_s=1.0, min_samples=3, min_time_s=0.0,
                min_block_s=1e-3, clock=clock)
    assert s.per_call_s == [1.0, 2.0, 3.0]
    assert s.median_s == 2.0
    assert len(calls) == 3


# --------------------------------------------------------------------------- statistics

def test_median_and_iqr_hand_computed():
    assert median([1, 2, 3, 4, 100]) == 3
    assert iqr([1, 2, 3, 4, 100]) == 2.0        # quartiles 2 and 4
    assert median([4, 1, 3, 2]) == 2.5
    assert iqr([1, 2, 3, 4]) == pytest.approx(1.5)  # quartiles 1.75 and 3.25
    assert iqr([7.0]) == 0.0
    assert iqr([5.0, 5.0, 5.0]) == 0.0


def test_iqr_matches_numpy_linear_percentiles():
    rng = random.Random(1234)
    for n in (2, 3, 7, 10, 31):
        values = [rng.uniform(0, 10) for _ in range(n)]
        expected = np.percentile(values, 75) - np.percentile(values, 25)
        assert iqr(values) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_statistics_of_nothing_raise():
    with pytest.raises(ValueError):
        median([])
    with pytest.raises(ValueError):
        iqr([])


def test_samples_properties():
    s = Samples(per_call_s=[1.0, 2.0, 3.0, 4.0, 100.0], calls_per_sample=4)
    assert s.n == 5
    assert s.median_s == 3.0
    assert s.iqr_s == 2.0
    assert Samples().n == 0


# --------------------------------------------------------------------------- time_call

def test_time_call_with_scripted_clock():
    calls = []
    assert time_call(lambda: calls.append(1), clock=scripted_clock([5.0, 7.5])) == 2.5
    assert calls == [1]


def test_time_call_syncs_before_each_clock_read():
    log: list[str] = []
    clock = FakeClock(log)
    fn = workload(clock, [0.75])
    assert time_call(fn, clock=clock, sync=lambda: log.append("sync")) == 0.75
    assert log == ["sync", "clock", "fn", "sync", "clock"]


def test_before_sample_runs_untimed_before_every_single_call_sample():
    """A cache flush runs before each sample, outside the timed region, and forces 1 call per sample."""
    from audit.measure.machine.timing import measure

    now = [0.0]
    events = []

    def fn():
        events.append("call")
        now[0] += 0.001

    def flush():
        events.append("flush")
        now[0] += 5.0          # a slow flush: must not show in the samples

    samples = measure(fn, estimate_s=1e-6, min_samples=3, min_time_s=0.0, min_block_s=1.0,
                      clock=lambda: now[0], before_sample=flush)
    assert samples.calls_per_sample == 1              # without the flush: 1e6 calls per block
    assert events == ["flush", "call"] * 3
    assert samples.per_call_s == pytest.approx([0.001] * 3)


# --------------------------------------------------------------------------- measure_device (fake GPU)

from tests.fake_gpu import FakeGPU  # noqa: E402

from audit.measure.machine.timing import DeviceTimingFailed, measure_device  # noqa: E402


def _host_synced(gpu, fn, estimate_s):
    return measure(fn, estimate_s=estimate_s, min_samples=5, min_time_s=0.01, clock=gpu.clock,
                   sync=gpu.synchronize)


def test_device_time_is_the_kernels_not_the_hosts():
    """The H200 case: a forced backend costs the host 87 us per call, the dispatcher 30 us;
    both run the same 37 us kernel. Host timing reads the host; device timing the kernel."""
    times = {}
    for name, host_s in (("sdpa", 30e-6), ("sdpa_cudnn", 87e-6)):
        gpu = FakeGPU()
        fn = gpu.kernel(device_s=37e-6, host_s=host_s)
        s = measure_device(fn, estimate_s=37e-6, clock=gpu, min_samples=5, min_time_s=0.01,
                           host_clock=gpu.clock)
        times[name] = (s.median_s, s.host_median_s, _host_synced(FakeGPU(), FakeGPU().kernel(37e-6, host_s), 37e-6))
        assert s.median_s == pytest.approx(37e-6, rel=1e-6)
        assert s.host_median_s == pytest.approx(host_s, rel=1e-6)
        assert s.method == "device events"
    assert times["sdpa_cudnn"][0] == pytest.approx(times["sdpa"][0], rel=0.10)


def test_host_clock_timing_of_the_same_calls_reads_the_host():
    gpu = FakeGPU()
    fn = gpu.kernel(device_s=37e-6, host_s=87e-6)
    s = measure(fn, estimate_s=37e-6, min_samples=5, min_time_s=0.01, clock=gpu.clock, sync=gpu.synchronize)
    assert s.median_s > 2 * 37e-6


def test_device_blocks_are_capped_and_min_time_counts_wall_time():
    gpu = FakeGPU()
    fn = gpu.kernel(device_s=10e-6, host_s=5e-6)
    start = gpu.now
    s = measure_device(fn, estimate_s=10e-6, clock=gpu, min_samples=3, min_time_s=0.005,
                       host_clock=gpu.clock)
    assert s.calls_per_sample == 32                      # 1 ms / 10 us = 100, capped at 32
    assert s.per_call_s == pytest.approx([10e-6] * s.n)
    assert len(fn.calls) == s.n * 32
    # each sample's wall time is the spin (host queueing time and a margin) plus the block
    assert 0.005 <= gpu.now - start <= 0.005 + 2 * (gpu.now - start) / s.n


def test_a_call_that_synchronizes_cannot_be_device_timed():
    gpu = FakeGPU()
    kernel = gpu.kernel(device_s=50e-6, host_s=10e-6)

    def syncing():
        kernel()
        gpu.synchronize()                                # like .item() inside the variant
    with pytest.raises(DeviceTimingFailed, match="synchronize"):
        measure_device(syncing, estimate_s=50e-6, clock=gpu, min_samples=3, min_time_s=0.0,
                       host_clock=gpu.clock)


def test_a_slow_host_lengthens_the_spin_instead_of_timing_gaps():
    """The first guess of the spin is too short for a host that needs 2 ms per call: that block
    is thrown away, the spin doubled, and every kept sample is gap-free device time."""
    gpu = FakeGPU()
    fn = gpu.kernel(device_s=0.5e-3, host_s=2e-3)
    s = measure_device(fn, estimate_s=0.5e-3, clock=gpu, min_samples=4, min_time_s=0.0,
                       host_clock=gpu.clock)
    assert s.per_call_s == pytest.approx([0.5e-3] * 4)
    assert len(fn.calls) > 4 * s.calls_per_sample        # late blocks ran and were discarded


def test_before_sample_runs_before_every_single_call_sample():
    gpu = FakeGPU()
    fn = gpu.kernel(device_s=10e-6, host_s=5e-6)
    flushes = []
    s = measure_device(fn, estimate_s=10e-6, clock=gpu, min_samples=3, min_time_s=0.0,
                       before_sample=lambda: (flushes.append(1), gpu.launch(1e-4)), host_clock=gpu.clock)
    assert s.calls_per_sample == 1 and s.n == 3 and len(flushes) == 4    # a warm-up, then one per sample
    assert s.per_call_s == pytest.approx([10e-6] * 3)    # the flush is outside the events


def _varying_kernel(gpu, device_s, host_s_of_call):
    """fn() whose host cost is host_s_of_call(i) for its i-th call (from 0); counts calls."""
    calls = []

    def fn():
        gpu.host(host_s_of_call(len(calls)))
        calls.append(1)
        gpu.launch(device_s)
    fn.calls = calls
    return fn


def test_scattered_host_hiccups_do_not_abandon_device_timing():
    """A 5 ms pause (a GC pass, say) in every 150th call: a late block now and then over 60
    samples. Only late blocks in a row mean the call cannot be device-timed; these are thrown
    away and every kept sample is the kernel's time."""
    gpu = FakeGPU()
    fn = _varying_kernel(gpu, 37e-6, lambda i: 20e-6 + (5e-3 if i % 150 == 149 else 0.0))
    s = measure_device(fn, estimate_s=37e-6, clock=gpu, min_samples=60, min_time_s=0.0,
                       host_clock=gpu.clock)
    assert s.n == 60 and s.per_call_s == pytest.approx([37e-6] * 60)
    discarded = len(fn.calls) // s.calls_per_sample - s.n
    assert discarded >= 4                                  # enough to have given up before


def test_host_time_varying_between_blocks_fits_the_spin():
    """Autograd-heavy calls: the host takes 60 us per call in one block and 100 us in the next.
    The spin is sized with margin enough that no block is late and none is wasted."""
    gpu = FakeGPU()
    per_block = 28                                          # ceil(1 ms / 37 us)
    fn = _varying_kernel(gpu, 37e-6, lambda i: 100e-6 if (i // per_block) % 2 else 60e-6)
    s = measure_device(fn, estimate_s=37e-6, clock=gpu, min_samples=20, min_time_s=0.0,
                       host_clock=gpu.clock)
    assert s.calls_per_sample == per_block
    assert len(fn.calls) == s.n * per_block                 # no late block thrown away
    assert s.per_call_s == pytest.approx([37e-6] * s.n)


def test_a_first_flush_that_loads_its_kernel_costs_no_sample():
    """The L2 flusher's first fill_ loads its kernel (20 ms of host time): it runs before the
    first sample, so no block is late and none is thrown away (the call takes the host longer
    to issue, 200 us, than the flush keeps the device busy, 100 us)."""
    gpu = FakeGPU()
    fn = gpu.kernel(device_s=50e-6, host_s=200e-6)
    flushes = []

    def flush():
        gpu.host(20e-3 if not flushes else 5e-6)
        flushes.append(1)
        gpu.launch(1e-4)
    s = measure_device(fn, estimate_s=50e-6, clock=gpu, min_samples=3, min_time_s=0.0, before_sample=flush,
                       host_clock=gpu.clock)
    assert s.n == 3 and len(fn.calls) == 3
    assert s.per_call_s == pytest.approx([50e-6] * 3)


def test_a_long_estimate_is_corrected_by_the_first_block():
    """A 30 µs call whose warm-up read 1 ms (memory tracking around it): one call a sample would time
    the clock and the interrupts as much as the call. The first block re-sizes the blocks to the host
    clock's minimum (0.2 ms) and is dropped; every kept sample is a block of 7 calls."""
    from audit.measure.machine.timing import MIN_HOST_BLOCK_S
    clock = FakeClock()
    fn = workload(clock, [30e-6])
    s = measure(fn, estimate_s=1e-3, min_samples=5, min_time_s=0.0, clock=clock)
    assert s.calls_per_sample == math.ceil(MIN_HOST_BLOCK_S / 30e-6) == 7 and s.n == 5
    assert len(fn.calls) == 1 + 5 * s.calls_per_sample
    assert s.per_call_s == pytest.approx([30e-6] * 5)


def test_host_clock_blocks_are_0_2_ms_and_a_block_that_pays_a_sync_stays_1_ms():
    """On the host clock alone a 20 µs call is timed 10 to a sample (more samples for the time, fewer
    calls spoiled by one interruption); where every block pays a device sync, 50, so the sync's ~10 µs
    stays a small part of what a sample reads."""
    from audit.measure.machine.timing import MIN_BLOCK_S, MIN_HOST_BLOCK_S, min_block_for
    assert (min_block_for(False), min_block_for(True)) == (MIN_HOST_BLOCK_S, MIN_BLOCK_S) == (2e-4, 1e-3)
    for sync, calls in ((None, 10), (lambda: None, 50)):
        clock = FakeClock()
        s = measure(workload(clock, [20e-6]), estimate_s=20e-6, min_samples=4, min_time_s=0.0, clock=clock, sync=sync)
        assert s.calls_per_sample == calls and s.per_call_s == pytest.approx([20e-6] * 4)
