"""Tests of the NVML telemetry in audit.measure.machine.energy and audit.measure.machine.nvml: a fake NVML
module at the boundary, a fake clock (no test reads wall-clock time), and the real absence of a driver here."""
from __future__ import annotations

import json
import sys

import pytest

from tests.fake_gpu import FakeGPU, GpuNVML

from audit.measure.machine.energy import TELEMETRY_COLUMNS, EnergyMeter, field_value_number, null_telemetry
from audit.measure.machine.nvml import decode_throttle_reasons, nvml_device_info, nvml_index_for, nvml_info

UUIDS = ["GPU-aaaaaaaa-0000-0000-0000-000000000000",
         "GPU-bbbbbbbb-1111-1111-1111-111111111111",
         "GPU-cccccccc-2222-2222-2222-222222222222"]


class FakeNVMLError(Exception):
    value = 999


class FakeNotSupported(FakeNVMLError):
    value = 3


class FakeLibraryNotFound(FakeNVMLError):
    value = 12


class FakeNVML:
    """The slice of pynvml that audit.measure.machine.energy and nvml use, with scripted readings.

    energy_mj: successive counter readings, or an exception class to raise.
    Each reading is logged with the handle it was asked for.
    """

    NVMLError = FakeNVMLError
    NVMLError_NotSupported = FakeNotSupported
    NVMLError_LibraryNotFound = FakeLibraryNotFound
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, *, uuids=UUIDS, energy_mj=(1000, 5000), power_mw=(200_000, 300_000),
                 sm_clock=(1500, 1980, 1980), temps=(60, 71, 65), throttle=(0x1, 0x0, 0x1),
                 init_error=None):
        self.uuids = list(uuids)
        self.energy_mj = list(energy_mj) if isinstance(energy_mj, (list, tuple)) else energy_mj
        self.power_mw, self.sm_clock, self.temps = list(power_mw), list(sm_clock), list(temps)
        self.throttle = list(throttle)
        self.init_error = init_error
        self.log: list[tuple] = []
        self.inits = self.shutdowns = 0

    @staticmethod
    def _next(values, i):
        return values[min(i, len(values) - 1)]

    def _count(self, name):
        return sum(1 for entry in self.log if entry[0] == name)

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error()
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h[1]]

    def nvmlDeviceGetName(self, h):
        return b"Fake H200"

    def nvmlSystemGetDriverVersion(self):
        return "570.1"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        i = self._count("energy")
        self.log.append(("energy", h))
        if isinstance(self.energy_mj, type):
            raise self.energy_mj()
        return self._next(self.energy_mj, i)

    def nvmlDeviceGetPowerUsage(self, h):
        i = self._count("power")
        self.log.append(("power", h))
        return self.power_mw[i % len(self.power_mw)]

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        i = self._count("clock")
        self.log.append(("clock", h))
        return self._next(self.sm_clock, i)

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        i = self._count("temp")
        self.log.append(("temp", h))
        return self._next(self.temps, i)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        i = self._count("throttle")
        self.log.append(("throttle", h))
        return self._next(self.throttle, i)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def workload(clock: FakeClock, step: float = 0.125):
    """fn() that advances the fake clock by `step` per call and counts its calls."""
    calls = []

    def fn():
        calls.append(1)
        clock.now += step
    return fn, calls


def meter(fake, *, index=0, uuid=None, visible=None, clock=None):
    return EnergyMeter(fake, index, cuda_uuid=lambda i: uuid, visible_env=visible,
                       clock=clock or FakeClock())


# -- nvml_index_for ------------------------------------------------------------------------------

def test_index_from_visible_integers_without_uuid():
    assert nvml_index_for(0, None, UUIDS, "2,0") == 2
    assert nvml_index_for(1, None, UUIDS, "2,0") == 0


def test_index_uuid_match_wins_over_visible_devices():
    # torch's uuid has no "GPU-" prefix; it names NVML device 1 although the env says 2
    assert nvml_index_for(0, "bbbbbbbb-1111-1111-1111-111111111111", UUIDS, "2,0") == 1
    assert nvml_index_for(0, "BBBBBBBB-1111-1111-1111-111111111111", UUIDS, None) == 1


def test_index_unknown_uuid_falls_back_to_visible_devices():
    assert nvml_index_for(0, "dddddddd-3333-3333-3333-333333333333", UUIDS, "2,0") == 2


def test_index_from_uuid_form_visible_devices():
    assert nvml_index_for(0, None, UUIDS, "GPU-cccccccc,GPU-aaaaaaaa-0000") == 2
    assert nvml_index_for(1, None, UUIDS, "GPU-cccccccc,GPU-aaaaaaaa-0000") == 0
    assert nvml_index_for(0, None, UUIDS, " GPU-bbbbbbbb-1111-1111-1111-111111111111 ") == 1


def test_index_invalid_entry_ends_the_list_like_cuda():
    # CUDA ignores everything after an invalid entry: torch 1 does not exist in it
    assert nvml_index_for(0, None, UUIDS, "2,GPU-zzzz,0") == 2
    assert nvml_index_for(1, None, UUIDS, "2,GPU-zzzz,0") == 1     # falls back to the same index


def test_index_without_information_is_the_same_index():
    assert nvml_index_for(1, None, UUIDS, None) == 1
    assert nvml_index_for(1, None, UUIDS, "") == 1
    assert nvml_index_for(0, None, [], None) == 0


def test_uuid_object_like_torch_cuuuid():
    class CUuuid:        # torch's _CUuuid: prints as a plain 8-4-4-4-12 UUID
        bytes = bytes.fromhex("cccccccc222222222222222222222222")

        def __str__(self):
            return "cccccccc-2222-2222-2222-222222222222"

    assert nvml_index_for(0, CUuuid(), UUIDS, "0") == 2


# -- throttle reasons ----------------------------------------------------------------------------

def test_decode_throttle_reasons():
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x4) == ["sw_power_cap"]
    assert decode_throttle_reasons(0x4 | 0x40 | 0x1) == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert decode_throttle_reasons(0x800) == ["unknown_0x800"]


# -- EnergyMeter -----------------------------------------------------------------------------------

def test_every_reading_comes_from_the_mapped_gpu():
    fake = FakeNVML(energy_mj=(1000, 5000))
    clock = FakeClock()
    m = meter(fake, visible="2,0", clock=clock)
    assert m.available and m.nvml_index == 2
    fn, calls = workload(clock)
    out = m.measure(fn, min_window_s=0.1, max_wall_s=0.3, sync=lambda: None)
    assert set(out) == set(TELEMETRY_COLUMNS)
    assert {h for _, h in fake.log} == {("handle", 2)}
    json.dumps(out)


# -- EnergyMeter on a simulated GPU (tests/fake_gpu.py) ---------------------------------------

def gpu_meter(gpu, **nvml_options):
    return EnergyMeter(GpuNVML(gpu, **nvml_options), 0, cuda_uuid=lambda i: None, visible_env=None,
                       clock=gpu.clock)


def test_graph_replays_give_the_kernels_energy_within_a_few_percent():
    """Back-to-back calls (CUDA-graph replays: one cheap launch per 100 calls): the window is
    aligned to the counter's 50 ms updates, so power and energy per call come out right."""
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0, counter_period_s=0.05)
    kernel_s = 20e-6
    replay = gpu.kernel(device_s=100 * kernel_s, host_s=10e-6)
    gpu.host(0.0123)                            # start between two counter updates
    start = gpu.now
    out = gpu_meter(gpu).measure(replay, calls_per_unit=100, kernel_s=kernel_s, device=gpu,
                                 min_window_s=0.1, max_wall_s=0.3)
    assert out["energy_method"] == "counter"
    assert out["mean_power_w"] == pytest.approx(500.0, rel=0.03)
    assert out["energy_per_call_j"] == pytest.approx(500.0 * kernel_s, rel=0.03)
    assert out["energy_per_call_j"] / (out["mean_power_w"] * kernel_s) == pytest.approx(1.0, abs=0.15)
    assert out["energy_idle_frac"] == pytest.approx(0.0, abs=0.02)
    assert out["sampled_power_w"] == pytest.approx(500.0, rel=0.05)
    assert out["telemetry_reason"] is None
    assert out["energy_window_s"] >= 0.1
    assert gpu.now - start <= 0.3                  # energy costs at most 0.3 s per cell
    assert out["energy_calls"] == len(replay.calls) * 100


def test_long_calls_are_polled_while_the_gpu_runs_them():
    """50 ms calls: the counter's updates are caught while waiting for the device, not only
    between calls, so the window stays aligned and short."""
    gpu = FakeGPU(busy_w=600.0, idle_w=100.0, counter_period_s=0.05)
    call = gpu.kernel(device_s=0.05, host_s=50e-6)
    gpu.host(0.031)
    start = gpu.now
    out = gpu_meter(gpu).measure(call, calls_per_unit=1, kernel_s=0.05, device=gpu, min_window_s=0.1)
    assert out["energy_method"] == "counter"
    assert out["mean_power_w"] == pytest.approx(600.0, rel=0.02)
    assert out["energy_per_call_j"] == pytest.approx(600.0 * 0.05, rel=0.03)
    assert gpu.now - start < 0.4


def test_unaligned_window_would_be_off_by_an_update_period():
    """Why the window is aligned: the same run measured between arbitrary reads is off by up
    to one counter update (here 50 ms in a 100 ms window)."""
    gpu = FakeGPU(counter_period_s=0.05)
    nvml = GpuNVML(gpu)
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    gpu.host(0.0493)
    e0, t0 = nvml.nvmlDeviceGetTotalEnergyConsumption(None), gpu.now
    while gpu.now - t0 < 0.1:
        replay()
        gpu.synchronize()
    naive_w = (nvml.nvmlDeviceGetTotalEnergyConsumption(None) - e0) / 1000 / (gpu.now - t0)
    assert abs(naive_w - 500.0) / 500.0 > 0.15


def test_host_bound_calls_say_the_gpu_idled_and_count_idle_power():
    """Eager calls that take the host 80 us to issue and the device 20 us to run."""
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0)
    kernel_s = 20e-6
    calls = gpu.kernel(device_s=kernel_s, host_s=80e-6)

    def unit():
        for _ in range(25):
            calls()
    out = gpu_meter(gpu).measure(unit, calls_per_unit=25, kernel_s=kernel_s, device=gpu,
                                 min_window_s=0.1)
    assert out["energy_idle_frac"] == pytest.approx(0.75, abs=0.03)
    assert "idle 7" in out["telemetry_reason"] and "host-bound" in out["telemetry_reason"]
    assert out["mean_power_w"] == pytest.approx(0.25 * 500 + 0.75 * 100, rel=0.05)


@pytest.mark.parametrize("counter, says", [({"counter": False}, "not supported"),
                                            ({"counter_stuck": True}, "did not advance")])
def test_a_counter_unsupported_or_stuck_falls_back_to_sampled_power_times_time(counter, says):
    gpu = FakeGPU(busy_w=400.0, idle_w=100.0)
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = gpu_meter(gpu, **counter).measure(replay, calls_per_unit=100, kernel_s=20e-6,
                                            device=gpu, min_window_s=0.1)
    assert out["energy_method"] == "power×time"
    assert says in out["telemetry_reason"]
    assert out["energy_per_call_j"] == pytest.approx(400.0 * 20e-6, rel=0.05)


def test_a_counter_updating_too_rarely_is_used_unaligned_and_says_so():
    gpu = FakeGPU(counter_period_s=0.2)
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    gpu.host(0.15)
    out = gpu_meter(gpu).measure(replay, calls_per_unit=100, kernel_s=20e-6, device=gpu,
                                 min_window_s=0.1, max_wall_s=0.3)
    assert out["energy_method"] in ("counter", "counter (unaligned)")
    if out["energy_method"] == "counter (unaligned)":
        assert "not aligned" in out["telemetry_reason"]


def test_without_instant_power_the_average_is_sampled():
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0)
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = gpu_meter(gpu, instant=False).measure(replay, calls_per_unit=100, kernel_s=20e-6,
                                                device=gpu, min_window_s=0.1)
    assert out["sampled_power_w"] == pytest.approx(100.0)   # the lagging 1 s average
    assert out["mean_power_w"] == pytest.approx(500.0, rel=0.03)


def test_throttle_reasons_during_the_window_are_decoded():
    gpu = FakeGPU()
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = gpu_meter(gpu, throttle=0x4 | 0x40).measure(replay, calls_per_unit=100, kernel_s=20e-6,
                                                      device=gpu, min_window_s=0.1)
    assert out["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    gpu = FakeGPU()
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = gpu_meter(gpu, throttle=0x0).measure(replay, calls_per_unit=100, kernel_s=20e-6,
                                               device=gpu, min_window_s=0.1)
    assert out["throttle_reasons"] == []


# -- slow NVML queries (issue 20): the queue, the read cadence, the edges' timestamps ---------

# Host time of each NVML query on real boards: nvmlDeviceGetTotalEnergyConsumption measured
# 2.4 ms median and 6.6 ms max (here every tenth read); the other queries about 1 ms each.
SLOW_NVML = {"energy": [2.4e-3] * 9 + [6.6e-3], "field_values": 1e-3, "power_usage": 1e-3,
             "clock": 1e-3, "temperature": 1e-3, "throttle": 1e-3}
PHASES = [i * 0.0049 for i in range(21)]       # where in the counter's 100 ms period a cell starts


def slow_nvml_cell(phase, **nvml_options):
    """One cell of 2 ms graph replays (100 calls of 20 us) with slow NVML queries and a counter
    publishing every 100 ms, measured as the gpu and gpu-check presets do (window 0.05 s)."""
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0, counter_period_s=0.1)
    meter = gpu_meter(gpu, **{"costs": SLOW_NVML, **nvml_options})
    replay = gpu.kernel(device_s=100 * 20e-6, host_s=10e-6)
    gpu.host(phase)
    start = gpu.now
    out = meter.measure(replay, calls_per_unit=100, kernel_s=20e-6, device=gpu, min_window_s=0.05,
                        max_wall_s=0.3)
    return out, gpu, meter, gpu.now - start


def test_slow_nvml_reads_do_not_let_the_gpu_idle_in_the_window():
    """Three 2 ms units queued and a counter read (2.4-6.6 ms) after each: the GPU waited for
    the host more than half the time (idle 0.55, mean power 43% low). With at least 10 ms, and
    twice the longest query, queued: idle 0, power within 4% whatever the phase, at most 0.3 s."""
    runs = [slow_nvml_cell(phase) for phase in PHASES]
    for out, gpu, _, cost in runs:
        assert out["energy_method"] == "counter"
        assert out["energy_idle_frac"] <= 0.05
        assert len(gpu.busy) == 1                        # the device never waited, start to end
        assert out["mean_power_w"] == pytest.approx(500.0, rel=0.04)
        assert out["energy_per_call_j"] == pytest.approx(500.0 * 20e-6, rel=0.04)
        assert out["sampled_power_w"] == pytest.approx(500.0)
        assert cost <= 0.3 and out["energy_cost_s"] <= 0.3        # gpu-check's ENERGY_MAX_COST_S
    errors = sorted(abs(out["mean_power_w"] / 500.0 - 1.0) for out, *_ in runs)
    assert errors[len(errors) // 2] <= 0.01                        # median power error


def test_the_nvml_read_cost_is_recorded_and_sizes_the_queue():
    out, _, meter, _ = slow_nvml_cell(0.0123)
    assert out["energy_read_s"] == pytest.approx(2.4e-3)           # the median counter read
    assert meter.queue_target_s() == pytest.approx(2 * 6.6e-3)     # twice the longest query seen
    fast, *_ = slow_nvml_cell(0.0123, costs={})
    assert fast["energy_read_s"] == pytest.approx(20e-6)            # FakeGPU.nvml_call_s


def test_the_first_cell_is_sized_from_timed_nvml_queries():
    """Counter reads of 12 ms: before its calls run, the run's first cell times the queries and
    keeps 24 ms queued (the GPU never waits, not even at the start), and lengthens the window
    to 20 reads (0.24 s, so an edge is at most ~5% of it) within a 1 s budget."""
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0, counter_period_s=0.1)
    meter = gpu_meter(gpu, costs={"energy": 12e-3})
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    gpu.host(0.0123)
    out = meter.measure(replay, calls_per_unit=100, kernel_s=20e-6, device=gpu, min_window_s=0.05,
                        max_wall_s=1.0)
    assert len(gpu.busy) == 1 and out["energy_idle_frac"] <= 0.05
    assert meter.queue_target_s() == pytest.approx(0.024)
    assert out["energy_window_s"] >= 0.24
    assert out["mean_power_w"] == pytest.approx(500.0, rel=0.02)


def test_edges_are_timed_by_the_counter_reads_not_before_the_other_queries():
    """50 ms calls, a fast counter, slow context queries (2 ms each): an edge timestamped before
    the power, clock, temperature and throttle reads of its poll was 8 ms early (power 9% off
    at one phase). Timed by the counter reads around it, every phase is right."""
    costs = {"field_values": 2e-3, "clock": 2e-3, "temperature": 2e-3, "throttle": 2e-3}
    for i in range(40):
        gpu = FakeGPU(busy_w=500.0, idle_w=100.0, counter_period_s=0.05)
        call = gpu.kernel(device_s=0.05, host_s=50e-6)
        gpu.host(i * 0.00123)
        out = gpu_meter(gpu, costs=costs).measure(call, calls_per_unit=1, kernel_s=0.05, device=gpu,
                                                  min_window_s=0.05)
        assert out["mean_power_w"] == pytest.approx(500.0, rel=0.01), i


def test_context_readings_are_rarer_than_counter_reads():
    out, _, meter, _ = slow_nvml_cell(0.0123)
    calls = meter.nvml.calls
    assert calls["energy"] > 3 * calls["field_values"]
    assert calls["clock"] == calls["temperature"] == calls["field_values"]
    assert out["sm_clock_mhz"] == 1980 and out["temperature_c"] == 60


# -- instantaneous power: transient failures, value types, its source ---------------------------

@pytest.mark.parametrize("failure", ["raise", "return"])
def test_one_failed_instant_power_read_skips_only_that_reading(failure):
    """A timeout of nvmlDeviceGetFieldValues in the middle of the window used to turn instant
    power off for the run: the rest of the cell read the lagging 1 s average (the idle power)."""
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0)
    meter = gpu_meter(gpu, instant_failures=(2,), instant_failure=failure)
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = meter.measure(replay, calls_per_unit=100, kernel_s=20e-6, device=gpu, min_window_s=0.1)
    assert out["sampled_power_w"] == pytest.approx(500.0)
    assert meter.nvml.calls["field_values"] > 3                     # the failure was mid-cell
    assert out["sampled_power_source"] == "instant"
    later = meter.measure(replay, calls_per_unit=100, kernel_s=20e-6, device=gpu, min_window_s=0.1)
    assert later["sampled_power_source"] == "instant"               # still on for the next cell


def test_repeated_instant_power_failures_fall_back_to_the_average():
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0)
    meter = gpu_meter(gpu, instant_failures=tuple(range(100)))
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = meter.measure(replay, calls_per_unit=100, kernel_s=20e-6, device=gpu, min_window_s=0.1)
    assert meter.nvml.calls["field_values"] == 3                    # off after three in a row
    assert out["sampled_power_source"] == "average"
    assert out["sampled_power_w"] == pytest.approx(100.0)           # only average readings


def test_instant_power_not_supported_turns_it_off_at_once():
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0)
    meter = gpu_meter(gpu, instant=False)                           # nvmlReturn 3 in the field
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = meter.measure(replay, calls_per_unit=100, kernel_s=20e-6, device=gpu, min_window_s=0.1)
    assert meter.nvml.calls["field_values"] == 1
    assert out["sampled_power_source"] == "average"


def test_a_double_typed_instant_power_is_read_by_its_type():
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0)
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = gpu_meter(gpu, instant_type=0).measure(replay, calls_per_unit=100, kernel_s=20e-6,
                                                 device=gpu, min_window_s=0.1)
    assert out["sampled_power_w"] == pytest.approx(500.0)           # dVal, not uiVal's garbage
    assert out["sampled_power_source"] == "instant"


@pytest.mark.parametrize("value_type, member", [(0, "dVal"), (1, "uiVal"), (2, "ulVal"), (3, "ullVal"),
                                                (4, "sllVal"), (5, "siVal")])
def test_field_values_are_read_from_the_member_their_type_names(value_type, member):
    import pynvml

    assert getattr(pynvml, {0: "NVML_VALUE_TYPE_DOUBLE", 1: "NVML_VALUE_TYPE_UNSIGNED_INT",
                            2: "NVML_VALUE_TYPE_UNSIGNED_LONG", 3: "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG",
                            4: "NVML_VALUE_TYPE_SIGNED_LONG_LONG",
                            5: "NVML_VALUE_TYPE_SIGNED_INT"}[value_type]) == value_type
    value = pynvml.c_nvmlFieldValue_t()
    value.valueType = value_type
    setattr(value.value, member, 250)
    assert field_value_number(value) == 250.0
    value.valueType = 99
    assert field_value_number(value) is None


# -- the counter against the sampled instantaneous power -----------------------------------------

def test_sampled_power_is_read_inside_the_window_only():
    """open() reads power as the first units start on an idle GPU, before the window's first edge.
    With an instant field 20 ms behind the device, that reading is idle power: counted, it pulled
    the mean a fifth below the counter (on an H200, 0.1 s windows read a third of it)."""
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0, counter_period_s=0.05)
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    gpu.host(0.0123)                            # start between two counter updates
    m = gpu_meter(gpu, instant_lag_s=0.02)
    out = m.measure(replay, calls_per_unit=100, kernel_s=20e-6, device=gpu, min_window_s=0.1)
    assert out["energy_method"] == "counter" and out["mean_power_w"] == pytest.approx(500.0, rel=0.03)
    assert min(m.last_window.instant) == pytest.approx(100.0)           # the reading before the window ...
    assert out["sampled_power_w"] == pytest.approx(500.0, rel=0.01)      # ... is not in the sampled power


def test_a_lagging_instant_field_puts_no_blame_on_the_counter_per_cell():
    """An instant field 0.1 s behind a 0.1 s window reads the idle GPU before it: that says
    nothing about the counter, so the cell carries no note (the run's steady check judges it)."""
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0)
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = gpu_meter(gpu, instant_lag_s=0.1).measure(replay, calls_per_unit=100, kernel_s=20e-6,
                                                     device=gpu, min_window_s=0.1)
    assert out["mean_power_w"] == pytest.approx(500.0, rel=0.03)
    assert out["sampled_power_w"] < 0.85 * out["mean_power_w"]
    assert out["telemetry_reason"] is None


@pytest.mark.parametrize("fault, agrees, words", [
    ({}, True, None),
    ({"counter_scale": 10.0}, False, "mis-scaled"),                 # a unit off by 10
    ({"counter_scale": 0.5}, False, "another scope"),               # half the board: another scope
    ({"counter_stuck": True}, None, "did not advance"),
    ({"instant": False}, None, "no instantaneous power"),
])
def test_the_steady_counter_check_catches_a_wrong_counter_through_a_lagging_field(fault, agrees, words):
    """One second of a steady load: the instant field (0.1 s behind) has settled in the window's
    second half, so a right counter agrees with it and a mis-scaled one does not."""
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0, counter_period_s=0.05)
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = gpu_meter(gpu, instant_lag_s=0.1, **fault).counter_check(replay, calls_per_unit=100, kernel_s=20e-6,
                                                                   device=gpu, seconds=1.0)
    assert out["agrees"] is agrees, out
    if agrees is not None:
        assert out["sampled_w"] == pytest.approx(500.0, rel=0.01) and out["samples"] >= 5
        assert out["window_s"] >= 1.0
    if words is None:
        assert out["reason"] is None and out["ratio"] == pytest.approx(1.0, abs=0.03)
    else:
        assert words in out["reason"], out["reason"]


def test_the_counter_check_without_nvml_says_why():
    out = meter(FakeNVML(init_error=FakeLibraryNotFound)).counter_check(lambda: None, calls_per_unit=1, kernel_s=None)
    assert out["agrees"] is None and "FakeLibraryNotFound" in out["reason"]


def test_average_power_is_not_held_against_the_counter():
    """The 1 s average lags a cell behind: it is no check of the counter, so no note."""
    gpu = FakeGPU(busy_w=500.0, idle_w=100.0)
    replay = gpu.kernel(device_s=2e-3, host_s=10e-6)
    out = gpu_meter(gpu, instant=False).measure(replay, calls_per_unit=100, kernel_s=20e-6,
                                                device=gpu, min_window_s=0.1)
    assert out["sampled_power_source"] == "average" and out["telemetry_reason"] is None


def test_init_failure_gives_null_columns_and_never_calls_fn():
    fake = FakeNVML(init_error=FakeLibraryNotFound)
    m = meter(fake)
    assert not m.available
    out = m.measure(lambda: pytest.fail("fn must not run without NVML"))
    assert all(out[c] is None for c in TELEMETRY_COLUMNS if c != "telemetry_reason")
    assert "FakeLibraryNotFound" in out["telemetry_reason"]
    assert m.info() is None


def test_missing_cuda_gives_null_columns():
    def no_cuda(i):
        raise RuntimeError("CUDA unavailable to torch")

    fake = FakeNVML()
    m = EnergyMeter(fake, 0, cuda_uuid=no_cuda, visible_env=None)
    assert not m.available
    out = m.measure(lambda: None)
    assert out["energy_per_call_j"] is None and "CUDA" in out["telemetry_reason"]
    assert fake.shutdowns == fake.inits == 1     # NVML released again


def test_real_driver_absence_gives_null_columns_with_reason():
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present on this machine")
    m = EnergyMeter()
    assert not m.available
    out = m.measure(lambda: pytest.fail("fn must not run without NVML"))
    assert set(out) == set(TELEMETRY_COLUMNS)
    assert all(out[c] is None for c in TELEMETRY_COLUMNS if c != "telemetry_reason")
    assert "NVML" in out["telemetry_reason"]
    json.dumps(out)
    info, reason = nvml_info()
    assert info is None and "NVML" in reason


def test_null_telemetry():
    out = null_telemetry("cpu cell")
    assert tuple(out) == TELEMETRY_COLUMNS
    assert out["telemetry_reason"] == "cpu cell"
    assert out["energy_per_call_j"] is None


# -- per-run device facts --------------------------------------------------------------------------

def test_nvml_device_info():
    fake = FakeNVML()
    info = nvml_device_info(fake, ("handle", 1))
    assert info == {"name": "Fake H200", "uuid": UUIDS[1], "driver": "570.1", "cuda_driver": "12.4",
                    "compute_capability": "9.0", "power_limit_w": 700.0}


def test_nvml_device_info_unsupported_field_is_null_only_there():
    class NoCap(FakeNVML):
        def nvmlDeviceGetCudaComputeCapability(self, h):
            raise FakeNotSupported()

        def nvmlDeviceGetEnforcedPowerLimit(self, h):
            raise FakeNotSupported()

        def nvmlDeviceGetPowerManagementLimit(self, h):
            return 350_000

    info = nvml_device_info(NoCap(), ("handle", 0))
    assert info["compute_capability"] is None
    assert info["power_limit_w"] == 350.0      # falls back to the management limit
    assert info["name"] == "Fake H200"


def test_nvml_info_lists_capability_and_power_limit(monkeypatch):
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info, reason = nvml_info()
    assert reason is None
    assert info["driver"] == "570.1"
    assert [g["index"] for g in info["gpus"]] == [0, 1, 2]
    assert info["gpus"][2]["compute_capability"] == "9.0"
    assert info["gpus"][2]["power_limit_w"] == 700.0
    assert info["gpus"][2]["uuid"] == UUIDS[2]
    assert fake.shutdowns == 1
