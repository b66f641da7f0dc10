"""Tests of audit.measure.machine.memory: CPU peak via /proc/self VmHWM after clear_refs."""
from __future__ import annotations

import pytest
import torch

from audit.measure.machine import memory

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
    from audit.measure.machine.memory import pin_malloc_threshold

    text = pin_malloc_threshold()
    if "not pinned" in text:
        pytest.skip(f"no glibc mallopt here: {text}")
    assert text == "glibc malloc, mmap threshold pinned at 32 MiB, trim threshold at 64 MiB"


def test_peak_still_sees_heap_served_allocations_after_pinning():
    """With allocations under 32 MiB served from the heap, the trim before a peak measurement
    still makes a 16 MiB temporary show up in VmHWM."""
    import torch

    from audit.measure.machine.memory import cpu_peak_supported, peak_during, pin_malloc_threshold

    if not cpu_peak_supported():
        pytest.skip("/proc/self/clear_refs is not writable here")
    pin_malloc_threshold()
    for _ in range(3):  # warm the heap with a freed 16 MiB block first
        torch.ones(4 * 2**20).sum()
    _, peak = peak_during(lambda: torch.ones(4 * 2**20).add_(1).sum(), "cpu")   # 16 MiB fp32
    assert peak >= 15 * 2**20


def _live_tensor_bytes(device: str) -> int:
    """Bytes of every tensor storage alive: a held_bytes() that sees the audit's own tensors as
    clearly as a variant's (CUDA's allocator does; the CPU's resident set blurs them)."""
    import gc
    import warnings
    gc.collect()
    storages = {}
    with warnings.catch_warnings():         # isinstance on torch.distributed's deprecated reduce_op warns
        warnings.simplefilter("ignore", FutureWarning)
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for tensor in tensors:
        try:
            if tensor.device.type != "meta":
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        except RuntimeError:     # a compile's FakeTensor, left in the process: no memory of its own
            continue
    return sum(storages.values())


@pytest.mark.parametrize("variant, leaks", [("broken.strides_ignored", False), ("faults:leaks", True)])
def test_leaked_bytes_counts_what_the_timed_calls_keep_not_the_checks_tensors(monkeypatch, variant, leaks):
    """Found on an H200: broken.strides_ignored "kept 400 MiB" and restarted the worker (losing the
    compiled code of the cells after it), but what it kept was the checks' float64 tensors, built
    between the warm-up and the timed calls. Counted on live tensors, the control keeps nothing
    across its timed calls, and a plug-in keeping 2 MiB a call is still caught."""
    import sys
    from pathlib import Path

    from audit.core.grid import Case
    from audit.execute import runner
    from audit.measure.cell import measurement
    from audit.workload import presets

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent / "plugins"))
    monkeypatch.setattr(measurement, "held_bytes", _live_tensor_bytes)
    monkeypatch.setattr(measurement, "LEAK_REPORT_BYTES", 4 * MIB)
    preset = presets.Preset(name="t", description="", grids=(), min_samples=3, min_time_s=0.0, max_cell_s=60.0,
                            energy_window_s=0.0)
    case = Case(variant, "cpu", "fp32", 64, 256, 2, 8, False, "strided_qkv", None)
    rec = runner.run_cell(case, runner.InputCache(), preset, {})
    assert rec["status"] == "ok", rec["reason"]
    if leaks:
        assert rec["leaked_bytes"] >= 4 * MIB
    else:
        assert rec.get("leaked_bytes") is None, rec.get("leaked_bytes")
    sys.modules.pop("faults", None)
