"""Cells too big for the device: predicted ones are `oom` without running, real ones are `oom`
and the next cell runs normally."""
from __future__ import annotations

import pytest

from audit.core.grid import Case
from audit.execute import runner
from audit.measure.cell import cellcache
from audit.plan.memory_model import FREE_FRACTION, predicted_peak_bytes, too_big
from audit.workload import presets

PRESET = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0,
                        max_cell_s=60.0, energy_window_s=0.0)


def _case(variant: str, **axes) -> Case:
    base = dict(variant=variant, device="cpu", dtype="fp32", d_k=16, seq_len=32, batch=1, heads=2,
                causal=False, scenario="normal")
    return Case(**{**base, **axes})


def test_hand_written_memory_grows_with_the_score_matrix():
    need, how = predicted_peak_bytes(_case("eager", seq_len=65536, heads=16, d_k=128), 65536)
    assert need == 16 * 65536 ** 2 * 16           # fp32: 4 x 4 bytes per score element
    assert "score element" in how
    need_bf16, _ = predicted_peak_bytes(_case("eager", seq_len=65536, heads=16, dtype="bf16"), 65536)
    assert need_bf16 == need // 2
    assert predicted_peak_bytes(_case("broken.clamped", seq_len=64), 64)[0] == 2 * 64 * 64 * 16


def test_fused_kernels_and_plugins_are_not_predicted():
    assert predicted_peak_bytes(_case("sdpa_flash", seq_len=65536), 65536) is None
    assert predicted_peak_bytes(_case("mykernels.attn:fn"), 32) is None


def test_too_big_only_past_the_free_memory():
    case = _case("eager", seq_len=65536, heads=16, d_k=128)        # 256 GiB of scores, 1 TiB peak
    assert too_big(case, 65536, 139 * 2**30).startswith("predicted peak 1024.0 GiB")
    assert "plus 2.0 GiB of the first run's out and gradients" in too_big(case, 65536, 139 * 2**30)
    # the held copies count: a cell whose peak alone would fit, with them does not
    need = predicted_peak_bytes(case, 65536)[0]
    assert too_big(case, 65536, int((need + 2**30) / FREE_FRACTION)) is not None
    assert too_big(case, 65536, int((need + 2**31) / FREE_FRACTION) + 1) is None
    assert too_big(case, 65536, 2048 * 2**30) is None
    assert too_big(case, 65536, None) is None                      # free memory unknown: run it
    assert too_big(_case("sdpa", seq_len=65536), 65536, 1) is None


def test_a_cell_predicted_not_to_fit_is_oom_without_building_inputs():
    case = _case("eager", seq_len=2**20, heads=16)                 # 16 TiB of fp32 scores
    cache = cellcache.InputCache()
    rec = runner.run_cell(case, cache, PRESET, {})
    assert rec["status"] == "oom"
    assert "predicted peak" in rec["reason"] and "not run" in rec["reason"]
    assert cache.golden_calls == 0 and cache.inputs is None        # nothing was computed
    assert rec["fwd_ms"] is None


def test_a_real_allocation_failure_is_oom_and_the_next_cell_runs(monkeypatch):
    """The plug-in asks for 64 TiB: the CPU allocator refuses (on CUDA: OutOfMemoryError)."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "plugins"))
    cache = cellcache.InputCache()
    builds = cellcache.BuildCache()
    first = runner.run_cell(_case("oom_plugin:allocate_too_much"), cache, PRESET, {}, builds=builds)
    assert first["status"] == "oom", first["reason"]
    assert "allocate" in first["reason"]
    assert cache.inputs is None                                    # dropped so memory can be freed
    second = runner.run_cell(_case("sdpa"), cache, PRESET, {}, builds=builds)
    assert second["status"] == "ok" and second["fwd_ms"] > 0


@pytest.mark.parametrize("message, oom", [
    ("CUDA out of memory. Tried to allocate 256.00 GiB", True),
    ("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried", True),
    ("Expected all tensors to be on the same device", False),
])
def test_allocation_failures_are_recognised_on_every_device(message, oom):
    assert runner._is_oom(RuntimeError(message)) is oom
