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
    side_free_at: float = 0.0           # ... and what is queued on another stream (events do not see it)
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

    def side_kernel(self, device_s: float, side_s: float, host_s: float):
        """fn() that queues `device_s` on the current stream and `side_s` more on another stream (a
        kernel returning before its work is done); counts calls."""
        main = self.kernel(device_s, host_s)

        def fn():
            main()
            self.side_free_at = max(self.side_free_at, self.now) + side_s
        fn.calls = main.calls
        return fn

    # -- the CudaClock interface (timing.measure_device, EnergyMeter.measure) ----------------
    def synchronize(self) -> None:
        """Device-wide: every stream's work."""
        self.now = max(self.now, self.free_at, self.side_free_at)

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
    """One nvmlFieldValue_t: the value lives in the union member its valueType names."""

    MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

    class _V:
        pass

    def __init__(self, value: float, ret: int = 0, value_type: int = 1) -> None:
        self.nvmlReturn, self.valueType, self.value = ret, value_type, self._V()
        for member in self.MEMBERS.values():      # the other members hold garbage bits
            setattr(self.value, member, 0xDEAD)
        setattr(self.value, self.MEMBERS[value_type], value)


class FakeNVMLError(Exception):
    """pynvml.NVMLError: `value` is the nvmlReturn code."""

    def __init__(self, value: int = 999) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class GpuNVML:
    """The slice of pynvml EnergyMeter uses, reading the FakeGPU's power and energy.

    Every query costs the host time (the FakeGPU clock advances): `costs` maps a query name
    ("energy", "field_values", "power_usage", "clock", "temperature", "throttle") to seconds,
    or to a sequence of seconds used in turn (cycled), e.g. the energy counter's 2.4 ms median
    with an occasional 6.6 ms. Unnamed queries cost `gpu.nvml_call_s` (energy, field values,
    power usage) or nothing (clock, temperature, throttle), as before. Faults:
    `counter_scale` multiplies the published energy (a mis-scaled counter), `counter_stuck`
    publishes the first value forever, `instant_failures` are the indices (0-based) of the
    field-value reads that fail transiently (`instant_failure`: "raise" an NVMLError, or
    "return" nvmlReturn 15 in the field), `instant_type` is the valueType the power comes in
    (1 unsigned int; 0 double), `instant_lag_s` how far behind the device the instant field reads
    (an H200's lags a GPU that just left idle).
    """

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_FI_DEV_POWER_INSTANT = 186
    NVMLError = FakeNVMLError

    class NVMLError_NotSupported(FakeNVMLError):
        def __init__(self) -> None:
            super().__init__(3)

    def __init__(self, gpu: FakeGPU, *, counter: bool = True, instant: bool = True,
                 throttle: int = 0, costs: dict | None = None, counter_scale: float = 1.0,
                 counter_stuck: bool = False, instant_failures: tuple = (),
                 instant_failure: str = "raise", instant_type: int = 1, instant_lag_s: float = 0.0) -> None:
        self.gpu, self.counter, self.instant, self.throttle = gpu, counter, instant, throttle
        self.costs = dict(costs or {})
        self.counter_scale, self.counter_stuck = counter_scale, counter_stuck
        self.instant_failures, self.instant_failure = set(instant_failures), instant_failure
        self.instant_type = instant_type
        self.instant_lag_s = instant_lag_s
        self.reads = 0
        self.calls: dict[str, int] = {}
        self._stuck_mj: int | None = None

    def _call(self, name: str = "energy") -> int:
        """Charge the host one `name` query; return how many came before it."""
        n = self.calls.get(name, 0)
        self.calls[name] = n + 1
        default = self.gpu.nvml_call_s if name in ("energy", "field_values", "power_usage") else None
        cost = self.costs.get(name, default)
        if cost is None:
            return n
        self.reads += 1
        if not isinstance(cost, (int, float)):
            cost = cost[n % len(cost)]
        self.gpu.host(cost)
        return n

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
        self._call("energy")
        if not self.counter:
            raise self.NVMLError_NotSupported()
        published = math.floor(self.gpu.now / self.gpu.counter_period_s) * self.gpu.counter_period_s
        mj = int(self.gpu.energy_j(published) * 1000 * self.counter_scale)
        if self.counter_stuck:
            self._stuck_mj = mj if self._stuck_mj is None else self._stuck_mj
            return self._stuck_mj
        return mj

    def nvmlDeviceGetFieldValues(self, h, fields):
        n = self._call("field_values")
        assert fields == [self.NVML_FI_DEV_POWER_INSTANT]
        if not self.instant:
            return [FieldValue(0, ret=3)]
        if n in self.instant_failures:
            if self.instant_failure == "raise":
                raise FakeNVMLError(15)                    # NVML_ERROR_TIMEOUT
            return [FieldValue(0, ret=15)]
        mw = self.gpu.power_w(max(0.0, self.gpu.now - self.instant_lag_s)) * 1000
        return [FieldValue(mw if self.instant_type == 0 else int(mw), value_type=self.instant_type)]

    def nvmlDeviceGetPowerUsage(self, h):
        self._call("power_usage")
        return int(self.gpu.idle_w * 1000)      # a lagging 1 s average: still the idle power

    def nvmlDeviceGetClockInfo(self, h, kind):
        self._call("clock")
        return 1980

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._call("temperature")
        return 60

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._call("throttle")
        return self.throttle
