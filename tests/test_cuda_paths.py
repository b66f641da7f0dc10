"""The CUDA-only glue of a cell's measurement (timing and energy of a cell) on the simulated GPU of
tests/fake_gpu.py: CI has no GPU, so this is where that code runs before an H200 does."""
from __future__ import annotations

import pytest

from audit.core.grid import Case
from audit.measure.machine import cell_energy, cell_timing
from audit.measure.machine.energy import TELEMETRY_COLUMNS, EnergyMeter
from audit.measure.machine.timing import Samples
from audit.workload import presets
from tests.fake_gpu import FakeGPU, GpuNVML

PRESET = presets.Preset(name="t", description="", grids=(), min_samples=5, min_time_s=0.01,
                        max_cell_s=60.0, energy_window_s=0.05)
CUDA_CASE = Case("sdpa_cudnn", "cuda", "bf16", 128, 1024, 2, 16, False, "normal")


@pytest.fixture
def gpu(monkeypatch):
    gpu = FakeGPU()
    monkeypatch.setattr(cell_timing, "cuda_clock", lambda: gpu)
    monkeypatch.setattr(cell_energy, "cuda_clock", lambda: gpu)
    monkeypatch.setattr(cell_timing, "sync_for", lambda device: gpu.synchronize)
    return gpu


def test_a_cuda_cell_is_timed_by_the_device_and_says_it_is_host_bound(gpu):
    forward = gpu.kernel(device_s=37e-6, host_s=87e-6)
    forward_backward = gpu.kernel(device_s=150e-6, host_s=250e-6)
    fwd, fb, timer = cell_timing.time_cell(CUDA_CASE, PRESET, forward, forward_backward, 124e-6, 400e-6)
    assert fwd.median_s == pytest.approx(37e-6) and fb.median_s == pytest.approx(150e-6)
    assert fwd.host_median_s == pytest.approx(87e-6)
    assert "CUDA events" in timer["timer"] and "spin kernel" in timer["timer"]
    assert timer["l2_flush"] is False and timer["cuda_graph"] is False


def test_a_call_that_synchronizes_falls_back_to_the_host_clock_and_says_why(gpu):
    kernel = gpu.kernel(device_s=50e-6, host_s=10e-6)

    def syncing():
        kernel()
        gpu.synchronize()
    fwd, fb, timer = cell_timing.time_cell(CUDA_CASE, PRESET, syncing, None, 60e-6, 0.0)
    assert fb is None
    assert "device timing failed" in timer["timer"] and "synchronize" in timer["timer"]
    assert fwd.host_median_s is None and fwd.method == "host clock"


def _meter(gpu):
    return EnergyMeter(GpuNVML(gpu), 0, cuda_uuid=lambda i: None, visible_env=None, clock=gpu.clock)


def test_short_calls_are_measured_over_graph_replays(gpu, monkeypatch):
    captured = []

    def fake_capture(fn, calls=1):
        captured.append(calls)
        return gpu.kernel(device_s=calls * 20e-6, host_s=10e-6)   # one launch for `calls` calls
    monkeypatch.setattr(cell_energy, "cuda_graph_replay", fake_capture)
    forward = gpu.kernel(device_s=20e-6, host_s=80e-6)
    fwd = Samples(per_call_s=[20e-6] * 5)
    out = cell_energy.telemetry(CUDA_CASE, forward, fwd, gpu.synchronize, _meter(gpu), PRESET)
    assert set(TELEMETRY_COLUMNS) <= set(out)
    assert captured == [100]                                        # 2 ms of device work per replay
    assert out["energy_method"] == "counter over CUDA-graph replays"
    assert out["energy_idle_frac"] == pytest.approx(0.0, abs=0.02)
    assert out["energy_per_call_j"] == pytest.approx(500.0 * 20e-6, rel=0.05)
    assert 0 < out["energy_cost_s"]


def _no_capture(fn, calls=1):
    """cuda_graph_replay of a call that cannot be captured."""
    raise RuntimeError("operation not permitted when stream is capturing")


def test_calls_that_cannot_be_captured_run_eagerly_and_show_the_gpu_idled(gpu, monkeypatch):
    monkeypatch.setattr(cell_energy, "cuda_graph_replay", _no_capture)
    forward = gpu.kernel(device_s=20e-6, host_s=80e-6)
    out = cell_energy.telemetry(CUDA_CASE, forward, Samples(per_call_s=[20e-6] * 5), gpu.synchronize,
                            _meter(gpu), PRESET)
    assert out["energy_method"].startswith("counter over eager calls (CUDA-graph capture failed")
    assert out["energy_idle_frac"] > 0.5
    assert "host-bound" in out["telemetry_reason"]


def test_energy_only_on_cuda_speed_cells(gpu):
    cpu = cell_energy.telemetry(Case("sdpa", "cpu", "fp32", 8, 16, 1, 2, False, "normal"), None, None, None,
                            None, PRESET)
    assert cpu["energy_per_call_j"] is None and "CPU" in cpu["telemetry_reason"]
    masked = cell_energy.telemetry(Case("sdpa", "cuda", "bf16", 8, 16, 1, 2, False, "padding"), None, None, None,
                               _meter(gpu), PRESET)
    assert "speed cells" in masked["telemetry_reason"]


L2_FLUSH = presets.Preset(name="t", description="", grids=(), min_samples=5, min_time_s=0.01,
                          max_cell_s=60.0, energy_window_s=0.05, l2_flush=True)


def test_with_l2_flush_the_idle_fraction_uses_a_hot_call_time(gpu, monkeypatch):
    """--l2-flush: the timed 60 us is a cold-cache time while the window runs hot (20 us). Eager
    calls the host issues in 80 us: the GPU idles 75% of the window, but the cold time made it
    1 - 3 × 25% = 25%. Timing the unit hot (device events behind a spin) gives 75%."""
    monkeypatch.setattr(cell_energy, "cuda_graph_replay", _no_capture)
    forward = gpu.kernel(device_s=20e-6, host_s=80e-6)
    out = cell_energy.telemetry(CUDA_CASE, forward, Samples(per_call_s=[60e-6] * 5), gpu.synchronize,
                                 _meter(gpu), L2_FLUSH)
    assert out["energy_idle_frac"] == pytest.approx(0.75, abs=0.03)
    assert "host-bound" in out["telemetry_reason"]


def test_with_l2_flush_fed_graph_replays_show_no_idle(gpu, monkeypatch):
    monkeypatch.setattr(cell_energy, "cuda_graph_replay",
                        lambda fn, calls=1: gpu.kernel(device_s=calls * 20e-6, host_s=10e-6))
    forward = gpu.kernel(device_s=20e-6, host_s=80e-6)
    out = cell_energy.telemetry(CUDA_CASE, forward, Samples(per_call_s=[60e-6] * 5), gpu.synchronize,
                                 _meter(gpu), L2_FLUSH)
    assert out["energy_idle_frac"] == pytest.approx(0.0, abs=0.02)
    assert out["energy_per_call_j"] == pytest.approx(500.0 * 20e-6, rel=0.05)
    assert out["telemetry_reason"] is None


def test_with_l2_flush_calls_that_cannot_be_timed_hot_get_no_idle_fraction(gpu, monkeypatch):
    """Calls that synchronize cannot be queued behind a spin: no hot time, so no idle fraction
    (the cold one would say nothing), and the reason says why."""
    monkeypatch.setattr(cell_energy, "cuda_graph_replay", _no_capture)
    kernel = gpu.kernel(device_s=20e-6, host_s=10e-6)

    def syncing():
        kernel()
        gpu.synchronize()
    out = cell_energy.telemetry(CUDA_CASE, syncing, Samples(per_call_s=[60e-6] * 5), gpu.synchronize,
                                 _meter(gpu), L2_FLUSH)
    assert out["energy_idle_frac"] is None
    assert "--l2-flush" in out["telemetry_reason"] and "cold" in out["telemetry_reason"]
    assert out["energy_per_call_j"] is not None


def test_slow_nvml_queries_cost_a_cell_at_most_its_limit(monkeypatch):
    """The gpu-check preset's window (0.05 s) with a counter publishing every 100 ms and NVML
    queries of 1-6.6 ms: the GPU stays fed and the whole measurement, timed on the fake
    clock, fits gpu-check's 0.3 s per cell (ENERGY_MAX_COST_S)."""
    from audit.commands.gpu_check import ENERGY_MAX_COST_S

    gpu = FakeGPU(counter_period_s=0.1)
    gpu.host(0.0123)
    monkeypatch.setattr(cell_energy, "cuda_clock", lambda: gpu)
    monkeypatch.setattr(cell_energy, "cuda_graph_replay",
                        lambda fn, calls=1: gpu.kernel(device_s=calls * 20e-6, host_s=10e-6))
    costs = {"energy": [2.4e-3] * 9 + [6.6e-3], "field_values": 1e-3, "clock": 1e-3,
             "temperature": 1e-3, "throttle": 1e-3}
    meter = EnergyMeter(GpuNVML(gpu, costs=costs), 0, cuda_uuid=lambda i: None, visible_env=None,
                        clock=gpu.clock)
    forward = gpu.kernel(device_s=20e-6, host_s=80e-6)
    start = gpu.now
    out = cell_energy.telemetry(CUDA_CASE, forward, Samples(per_call_s=[20e-6] * 5), gpu.synchronize,
                                 meter, PRESET)
    assert out["energy_idle_frac"] <= 0.05
    assert out["energy_per_call_j"] == pytest.approx(500.0 * 20e-6, rel=0.04)
    assert out["energy_cost_s"] == pytest.approx(gpu.now - start)      # the meter's (fake) clock
    assert out["energy_cost_s"] <= ENERGY_MAX_COST_S
    assert out["energy_read_s"] == pytest.approx(2.4e-3)


def test_a_cuda_runs_ceilings_carry_the_energy_counters_steady_check(monkeypatch, tmp_path):
    """runner.ceilings_for: right after a CUDA device's matmuls, the counter's check on a steady load
    goes into its ceilings (run.json, read by gpu-check); a CPU's have none, and a resumed run
    reuses what run.json holds without measuring again."""
    import json

    from audit.execute import runner
    from audit.measure.machine import energy, roofline
    measured: list[str] = []
    monkeypatch.setattr(roofline, "measure_ceilings",
                        lambda device, dtypes, budget_s: {"matmul_flops_per_s": {d: 1e12 for d in dtypes}})
    monkeypatch.setattr(energy, "run_counter_check", lambda device: measured.append(device) or {"agrees": True})
    cases = [CUDA_CASE, Case("sdpa", "cpu", "fp32", 64, 128, 1, 2, False, "normal")]
    out, fresh = runner.ceilings_for(cases, tmp_path, 2.5)
    assert fresh and measured == ["cuda"]
    assert out["cuda"]["energy_counter_check"] == {"agrees": True} and "energy_counter_check" not in out["cpu"]
    (tmp_path / "run.json").write_text(json.dumps({"ceilings": out}))
    again, fresh = runner.ceilings_for(cases, tmp_path, 2.5)
    assert not fresh and measured == ["cuda"] and again == out
