"""Tests of audit.memory: CPU peak via /proc/self VmHWM after clear_refs."""
from __future__ import annotations

import pytest
import torch

from audit import memory

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
