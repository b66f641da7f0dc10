"""Tests of audit.measure.memory: CPU peak via /proc/self VmHWM after clear_refs."""
from __future__ import annotations

import pytest
import torch

from audit.measure import memory

MIB = 2 ** 20

needs_cpu_peak = pytest.mark.skipif(
    not memory.cpu_peak_supported(),
    reason="/proc/self/clear_refs is not writable here: CPU peak memory cannot be measured")


@needs_cpu_peak
def test_peak_sees_a_touched_64_mib_tensor():
    result, peak = memory.peak_during(lambda: torch.ones(16 * MIB, dtype=torch.float32), "cpu")  # 64 MiB
    assert result.numel() == 16 * MIB
    assert isinstance(peak, int)
    assert peak >= 60 * MIB


@needs_cpu_peak
def test_peak_sees_memory_freed_before_the_call_returns():
    def transient():
        t = torch.ones(16 * MIB, dtype=torch.float32)   # 64 MiB, touched, then freed
        total = float(t[::4096].sum())
        del t
        return total

    result, peak = memory.peak_during(transient, "cpu")
    assert result == 16 * MIB / 4096
    assert peak >= 60 * MIB


@needs_cpu_peak
def test_peak_of_a_function_that_allocates_nothing_is_small():
    sentinel = object()
    result, peak = memory.peak_during(lambda: sentinel, "cpu")
    assert result is sentinel
    assert 0 <= peak < 16 * MIB


def test_unsupported_cpu_peak_gives_none(monkeypatch, tmp_path):
    monkeypatch.setattr(memory, "_CLEAR_REFS", tmp_path / "missing" / "clear_refs")
    assert memory.cpu_peak_supported() is False
    calls = []
    result, peak = memory.peak_during(lambda: calls.append(1) or "done", "cpu")
    assert (result, peak) == ("done", None)
    assert calls == [1]


def test_pin_malloc_threshold_reports_what_it_did():
    """On glibc the thresholds are pinned and the record says so; elsewhere it says it did not."""
    from audit.measure.memory import pin_malloc_threshold

    text = pin_malloc_threshold()
    if "not pinned" in text:
        pytest.skip(f"no glibc mallopt here: {text}")
    assert text == "glibc malloc, mmap threshold pinned at 32 MiB, trim threshold at 64 MiB"


def test_peak_still_sees_heap_served_allocations_after_pinning():
    """With allocations under 32 MiB served from the heap, the trim before a peak measurement
    still makes a 16 MiB temporary show up in VmHWM."""
    import torch

    from audit.measure.memory import cpu_peak_supported, peak_during, pin_malloc_threshold

    if not cpu_peak_supported():
        pytest.skip("/proc/self/clear_refs is not writable here")
    pin_malloc_threshold()
    for _ in range(3):  # warm the heap with a freed 16 MiB block first
        torch.ones(4 * 2**20).sum()
    _, peak = peak_during(lambda: torch.ones(4 * 2**20).add_(1).sum(), "cpu")   # 16 MiB fp32
    assert peak >= 15 * 2**20
