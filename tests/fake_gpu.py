"""A simulated GPU for testing device timing and energy without one.

One host clock and one device stream. The host queues work (kernels, spins, events);
the device runs it back to back, starting each piece when both the previous piece is
done and the host has queued it. Power is `busy_w` while the device runs anything and
`idle_w` otherwise; the NVML energy counter integrates it but publishes only every
`counter_period_s`, as real counters do (20-100 ms). Nothing reads a real clock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class FakeGPU:
    busy_w: float = 500.0
    idle_w: float = 100.0
    counter_period_s: float = 0.05
    nvml_call_s: float = 20e-6          # host time one NVML query costs
    now: float = 0.0                    # host clock, seconds
    free_at: float = 0.0                # when the device finishes what is queued
    busy: list = field(default_factory=list)   # merged (start, end) device busy intervals

    # -- host side -------------------------------------------------------------------------
    def clock(self) -> float:
        return self.now

    host_clock = clock

    def host(self, seconds: float) -> None:
        self.now += seconds

    def launch(self, seconds: float) -> None:
        """Queue `seconds` of device work."""
        start = max(self.free_at, self.now)
        self.free_at = start + seconds
        if self.busy and math.isclose(self.busy[-1][1], start, abs_tol=1e-15):
            self.busy[-1] = (self.busy[-1][0], self.free_at)
        else:
            self.busy.append((start, self.free_at))

    def kernel(self, device_s: float, host_s: float):
        """fn() that costs the host `host_s` and then queues `device_s` of device work; counts calls."""
        calls = []

        def fn():
            calls.append(1)
            self.host(host_s)
            self.launch(device_s)
        fn.calls = calls
        return fn

    # -- the CudaClock interface (timing.measure_device, EnergyMeter.measure) ----------------
    def synchronize(self) -> None:
        self.now = max(self.now, self.free_at)

    def hold(self, seconds: float) -> None:
        self.host(2e-6)
        self.launch(seconds)

    def event(self) -> "FakeEvent":
        return FakeEvent(self)

    # -- power ------------------------------------------------------------------------------
    def busy_time(self, t: float) -> float:
        return sum(max(0.0, min(end, t) - start) for start, end in self.busy if start < t)

    def energy_j(self, t: float) -> float:
        busy = self.busy_time(t)
        return self.idle_w * t + (self.busy_w - self.idle_w) * busy

    def power_w(self, t: float) -> float:
        return self.busy_w if any(start <= t < end for start, end in self.busy) else self.idle_w


class FakeEvent:
    def __init__(self, gpu: FakeGPU) -> None:
        self.gpu, self.t = gpu, None

    def record(self) -> None:
        self.t = max(self.gpu.free_at, self.gpu.now)

    def query(self) -> bool:
        return self.gpu.now >= self.t

    def synchronize(self) -> None:
        self.gpu.now = max(self.gpu.now, self.t)

    def elapsed_time(self, other: "FakeEvent") -> float:
        return (other.t - self.t) * 1e3


class FieldValue:
    class _V:
        def __init__(self, mw):
            self.uiVal = mw

    def __init__(self, mw: int, ret: int = 0) -> None:
        self.nvmlReturn, self.value = ret, self._V(mw)


class GpuNVML:
    """The slice of pynvml EnergyMeter uses, reading the FakeGPU's power and energy."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_FI_DEV_POWER_INSTANT = 186

    class NVMLError_NotSupported(Exception):
        value = 3

    def __init__(self, gpu: FakeGPU, *, counter: bool = True, instant: bool = True,
                 throttle: int = 0) -> None:
        self.gpu, self.counter, self.instant, self.throttle = gpu, counter, instant, throttle
        self.reads = 0

    def _call(self) -> None:
        self.reads += 1
        self.gpu.host(self.gpu.nvml_call_s)

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetUUID(self, h):
        return "GPU-00000000-0000-0000-0000-000000000000"

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self._call()
        if not self.counter:
            raise self.NVMLError_NotSupported()
        published = math.floor(self.gpu.now / self.gpu.counter_period_s) * self.gpu.counter_period_s
        return int(self.gpu.energy_j(published) * 1000)

    def nvmlDeviceGetFieldValues(self, h, fields):
        self._call()
        assert fields == [self.NVML_FI_DEV_POWER_INSTANT]
        if not self.instant:
            return [FieldValue(0, ret=3)]
        return [FieldValue(int(self.gpu.power_w(self.gpu.now) * 1000))]

    def nvmlDeviceGetPowerUsage(self, h):
        self._call()
        return int(self.gpu.idle_w * 1000)      # a lagging 1 s average: still the idle power

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 60

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.throttle
