"""Per-cell NVML telemetry on NVIDIA GPUs: energy, power, clocks, temperature, throttling.

Every NVML call goes through an injectable module object (`nvml`, default the real pynvml)
so the logic is unit-tested with a fake NVML on machines without a driver. Nothing here
raises: a missing driver, CUDA or query gives None columns and a reason.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from .energy_window import COUNTER_VS_SAMPLED_TOL, EDGE_SHARE, EnergyWindow
from .nvml import (NVML_CLOCK_SM, NVML_TEMPERATURE_GPU, as_text, is_not_supported,
                   nvml_device_info, nvml_index_for, torch_cuda_uuid, try_call)

# Columns EnergyMeter.measure() and null_telemetry() produce, in this order.
TELEMETRY_COLUMNS: tuple[str, ...] = (
    "energy_per_call_j", "energy_method", "mean_power_w", "sampled_power_w", "sampled_power_source",
    "energy_idle_frac", "sm_clock_mhz", "temperature_c", "throttle_reasons", "energy_calls",
    "energy_window_s", "energy_cost_s", "energy_read_s", "telemetry_reason",
)

# How EnergyMeter.measure keeps the GPU fed while it reads NVML (docs/measurement.md, "Telemetry
# on NVIDIA GPUs"). One NVML query takes milliseconds (nvmlDeviceGetTotalEnergyConsumption:
# 2.4 ms median, 6.6 ms max measured on real boards), and the host queues no work meanwhile.
MAX_WALL_S = 0.3             # the energy measurement's wall-time limit per cell (gpu-check holds it to this)
MIN_QUEUED_S = 0.01          # device work kept queued at all times, at least ...
QUEUE_MARGIN = 2.0           # ... and this many times the longest NVML query seen in the run
CALIBRATION_READS = 5        # counter reads timed on the first measure() (each other query once)
COUNTER_CHECK_S = 1.0        # counter_check's steady window: long enough for the instant field to settle
COUNTER_CHECK_WALL_S = 1.6   # what the check adds to a CUDA run's start (steady_load's set-up and the window)
INSTANT_MAX_FAILURES = 3     # consecutive failed instant-power reads that turn it off for the run
NVML_ERROR_NOT_SUPPORTED = 3   # pynvml.NVML_ERROR_NOT_SUPPORTED
# nvmlValue_t's member for each nvmlValueType_t (pynvml.NVML_VALUE_TYPE_*)
NVML_VALUE_MEMBERS: dict[int, str] = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal",
                                      5: "siVal", 6: "usVal"}


def field_value_number(value: Any) -> float | None:
    """The number in an nvmlFieldValue_t, read from the union member its valueType names
    (None for an unknown type): reading uiVal of a double gives garbage, not an error."""
    member = NVML_VALUE_MEMBERS.get(int(getattr(value, "valueType", 1)))
    if member is None:
        return None
    number = getattr(value.value, member, None)
    return None if number is None else float(number)


def null_telemetry(reason: str) -> dict[str, Any]:
    """Every telemetry column None, with the reason telemetry is missing."""
    cols: dict[str, Any] = {c: None for c in TELEMETRY_COLUMNS}
    cols["telemetry_reason"] = reason
    return cols


_VISIBLE_FROM_ENV = object()


class EnergyMeter:
    """Energy, power, clocks, temperature and throttling of one GPU while a cell runs.

    Construct once per run (NVML init and device mapping happen here); call
    measure() per cell. When NVML or CUDA is missing, `available` is False and
    measure() returns null_telemetry(reason); nothing raises.

    `nvml`: the NVML module (default: import pynvml); `cuda_uuid(index)` returns
    torch's UUID of that device (None when unknown) and raises without CUDA (the
    default asks torch); `visible_env` defaults to $CUDA_VISIBLE_DEVICES. `clock` is the
    host clock (seconds); power, clock, temperature and throttle reasons are read once every
    `sample_every_s` while a cell runs (the energy counter as often as the host can).
    """

    def __init__(self, nvml: Any = None, device_index: int = 0, *,
                 cuda_uuid: Callable[[int], str | None] | None = None,
                 visible_env: Any = _VISIBLE_FROM_ENV,
                 clock: Callable[[], float] | None = None,
                 sample_every_s: float = 0.025) -> None:
        import time

        self.device_index = device_index
        self.clock = clock or time.perf_counter
        self.sample_every_s = sample_every_s
        self._instant_off = False           # NVML_FI_DEV_POWER_INSTANT unsupported, or failing
        self._instant_failures = 0          # consecutive failed instant-power reads
        self._longest_query_s = 0.0         # longest NVML query seen in the run
        self._counter_reads_s: list[float] = []   # the run's recent energy-counter read times
        self._calibrated = False
        self.last_window: EnergyWindow | None = None   # measure()'s last window (counter_check reads its readings)
        self.nvml = nvml
        self.handle: Any = None
        self.nvml_index: int | None = None
        self.reason: str | None = None
        self._initialized = False
        if visible_env is _VISIBLE_FROM_ENV:
            visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                self.reason = f"nvidia-ml-py not importable: {exc}"
                return
            self.nvml = pynvml
        try:
            self.nvml.nvmlInit()
            self._initialized = True
        except Exception as exc:  # NVMLError_LibraryNotFound without a driver
            self.reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return
        try:
            torch_uuid = (cuda_uuid or torch_cuda_uuid)(device_index)
        except Exception as exc:
            self.reason = f"no CUDA device {device_index}: {type(exc).__name__}: {exc}"
            self.close()
            return
        try:
            n = int(self.nvml.nvmlDeviceGetCount())
            handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            uuids = [try_call(lambda h=h: as_text(self.nvml.nvmlDeviceGetUUID(h))) or "" for h in handles]
            idx = nvml_index_for(device_index, torch_uuid, uuids, visible_env)
            if not 0 <= idx < n:
                raise IndexError(f"NVML index {idx} out of range ({n} devices)")
            self.nvml_index, self.handle = idx, handles[idx]
        except Exception as exc:
            self.reason = f"NVML device lookup failed: {type(exc).__name__}: {exc}"
            self.close()

    @property
    def available(self) -> bool:
        return self.handle is not None and self.reason is None

    def info(self) -> dict[str, Any] | None:
        """nvml_device_info() of the mapped GPU plus its NVML index, or None."""
        if not self.available:
            return None
        return {"nvml_index": self.nvml_index, **nvml_device_info(self.nvml, self.handle)}

    def close(self) -> None:
        """Release NVML (reference-counted, so other users are unaffected)."""
        if self._initialized:
            self._initialized = False
            self.handle = None
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass

    def __enter__(self) -> "EnergyMeter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- readings -----------------------------------------------------------
    def _timed(self, query: Callable[[], Any]) -> Any:
        """query(), noting how long it held the host: the queued work must outlast the longest."""
        t0 = self.clock()
        try:
            return query()
        finally:
            self._longest_query_s = max(self._longest_query_s, self.clock() - t0)

    def _read_counter(self) -> tuple[float, float, float]:
        """(total energy in mJ, host time right after the read, seconds the read took).
        Raises what NVML raises."""
        t0 = self.clock()
        try:
            mj = float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        finally:
            t1 = self.clock()
            self._longest_query_s = max(self._longest_query_s, t1 - t0)
        self._counter_reads_s.append(t1 - t0)
        del self._counter_reads_s[:-64]
        return mj, t1, t1 - t0

    def _throttle_mask(self) -> int | None:
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue
            try:
                return int(self._timed(lambda: fn(self.handle)))
            except Exception:
                continue
        return None

    def _sm_clock_mhz(self) -> float | None:
        mhz = try_call(lambda: self._timed(lambda: self.nvml.nvmlDeviceGetClockInfo(
            self.handle, getattr(self.nvml, "NVML_CLOCK_SM", NVML_CLOCK_SM))))
        return None if mhz is None else float(mhz)

    def _temperature_c(self) -> float | None:
        c = try_call(lambda: self._timed(lambda: self.nvml.nvmlDeviceGetTemperature(
            self.handle, getattr(self.nvml, "NVML_TEMPERATURE_GPU", NVML_TEMPERATURE_GPU))))
        return None if c is None else float(c)

    def _read_power(self, instant: list[float], average: list[float]) -> None:
        """One power reading, instantaneous where NVML has it, else its 1 s average. A transient
        failure of the instantaneous read skips this reading: mixing in the lagging average
        would bias the mean."""
        w = self._instant_power_w()
        if w is not None:
            instant.append(w)
        elif self._instant_off:
            mw = try_call(lambda: self._timed(lambda: self.nvml.nvmlDeviceGetPowerUsage(self.handle)))
            if mw is not None:
                average.append(float(mw) / 1000.0)

    def _instant_power_w(self) -> float | None:
        """Instantaneous board power (NVML_FI_DEV_POWER_INSTANT, mW), or None.

        nvmlDeviceGetPowerUsage is a 1-second average on Ampere and newer GPUs: over a
        0.1-0.3 s window it mostly reports the cell before. The instant field does not lag.
        Only NVML_ERROR_NOT_SUPPORTED, or INSTANT_MAX_FAILURES failures in a row, turn it off
        for the run; a single failure (a timeout, say) costs one reading.
        """
        if self._instant_off:
            return None
        field = getattr(self.nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        get = getattr(self.nvml, "nvmlDeviceGetFieldValues", None)
        if field is None or get is None:
            self._instant_off = True
            return None
        try:
            value = self._timed(lambda: get(self.handle, [field]))[0]
            ret = int(getattr(value, "nvmlReturn", 0))
            mw = field_value_number(value) if ret == 0 else None
        except Exception as exc:
            return self._instant_failed(is_not_supported(self.nvml, exc))
        if ret != 0:
            return self._instant_failed(ret == NVML_ERROR_NOT_SUPPORTED)
        if mw is None or not 0.0 <= mw < float("inf"):
            return self._instant_failed(False)
        self._instant_failures = 0
        return mw / 1000.0

    def _instant_failed(self, unsupported: bool) -> None:
        self._instant_failures += 1
        if unsupported or self._instant_failures >= INSTANT_MAX_FAILURES:
            self._instant_off = True
        return None

    def _calibrate(self) -> None:
        """Time every NVML query once per run (on the first measure()), so the first cell's
        queue depth and window are sized from them too; later cells add their own reads."""
        if self._calibrated:
            return
        self._calibrated = True
        for _ in range(CALIBRATION_READS):
            try:
                self._read_counter()
            except Exception:
                break
        self._read_power([], [])
        self._sm_clock_mhz()
        self._temperature_c()
        self._throttle_mask()

    def _window_needed(self, min_window_s: float, max_wall_s: float) -> float:
        """Least time between the window's edges: `min_window_s`, or longer where one counter
        read (the timing uncertainty of an edge) would be more than EDGE_SHARE of it; at most
        half of `max_wall_s`, leaving the other half to find the first edge."""
        import statistics

        if not self._counter_reads_s:
            return min_window_s
        needed = statistics.median(self._counter_reads_s) / EDGE_SHARE
        return max(min_window_s, min(needed, max_wall_s / 2))

    def queue_target_s(self) -> float:
        """Device work kept queued: it must outlast the longest NVML query seen, with margin."""
        return max(MIN_QUEUED_S, QUEUE_MARGIN * self._longest_query_s)

    def measure(self, run_unit: Callable[[], object], *, calls_per_unit: int = 1,
                kernel_s: float | None = None, unit_device_s: float | None = None, device: Any = None,
                min_window_s: float = 0.1, max_wall_s: float = 0.3,
                sync: Callable[[], None] | None = None) -> dict[str, Any]:
        """Energy per call of back-to-back calls; every telemetry column.

        `run_unit()` queues `calls_per_unit` calls without synchronizing (a CUDA-graph replay
        of them, or a loop); `kernel_s` is one call's device time as the window runs it (None
        when unknown); `unit_device_s` one unit's device time (default kernel_s ×
        calls_per_unit; corrected by CUDA events once units finish); `device` gives CUDA
        events (timing.CudaClock). Units are queued so that at least queue_target_s() of
        device work is always waiting (10 ms, or twice the longest NVML query seen: the host
        queues nothing while it is inside NVML), and between two checks of the queue the
        host makes one NVML query:

        1. the total-energy counter is read until it changes (it is updated every 20-100 ms,
           not continuously): the window opens on that edge, E0 at t0, the midpoint of the
           host times right after the read that saw it and the read before;
        2. after at least _window_needed() (`min_window_s`, longer where one counter read is
           over 5% of it) the counter is read until it changes again: E1 at t1 closes it;
           where the two edges are timed worse than 5% of the window and the next update
           fits the budget, it closes on that one instead;
        3. every `sample_every_s`, power, SM clock, temperature and throttle reasons are read,
           one query between two counter reads, and none while an edge is awaited.

        mean_power_w = (E1 - E0) / (t1 - t0): the GPU's power while running the calls,
        with no partial update period at either end. CUDA events around each unit give the
        device time per call; energy_per_call_j = mean power × that time, and
        energy_idle_frac says how much of it the GPU waited: the larger of the gaps between
        units (events) and 1 - calls × kernel_s / device time (energy then includes idle
        power, and the reason says so). sampled_power_w is the mean of the power readings,
        an independent check of the counter (sampled_power_source says which reading). When
        no edge comes within `max_wall_s` the energy is the counter's difference over the
        whole run (method "counter (unaligned)"), or sampled power × time where the counter
        fails ("power×time"). The first call also times NVML's queries (_calibrate).
        """
        if not self.available:
            return null_telemetry(self.reason or "NVML unavailable")
        started = self.clock()
        self._calibrate()
        window = EnergyWindow(self, run_unit, calls_per_unit=calls_per_unit, kernel_s=kernel_s,
                              unit_device_s=unit_device_s, device=device, min_window_s=min_window_s,
                              max_wall_s=max_wall_s, sync=sync, started=started)
        window.open()
        window.find_edges()
        window.close()
        self.last_window = window
        return window.columns()

    def counter_check(self, run_unit: Callable[[], object], *, calls_per_unit: int, kernel_s: float | None,
                      device: Any = None, seconds: float = COUNTER_CHECK_S) -> dict[str, Any]:
        """The energy counter's independent check, once per run: its mean power over `seconds` of a
        steady load (run_unit as in measure(); a GPU already busy, right after the ceilings' matmuls)
        against the median instantaneous power read in the window's second half.

        Per cell the two cannot be compared: NVML's instant field lags a GPU that just left idle,
        and a 0.1 s window holds a few readings (an H200: 8 of 38 cells within 15%, the rest
        1.2-5x, while the long busy cells agreed). On a steady second they must agree; a stuck,
        mis-scaled or other-scope counter does not. Returns counter_w, sampled_w, samples, ratio
        (counter ÷ sampled), agrees (within COUNTER_VS_SAMPLED_TOL; None when not judged), window_s,
        method, and reason where something is missing."""
        import statistics
        out: dict[str, Any] = {"counter_w": None, "sampled_w": None, "samples": 0, "ratio": None, "agrees": None,
                               "window_s": None, "method": None, "seconds": seconds, "reason": None}
        if not self.available:
            return dict(out, reason=self.reason or "NVML unavailable")
        cols = self.measure(run_unit, calls_per_unit=calls_per_unit, kernel_s=kernel_s, device=device,
                            min_window_s=seconds, max_wall_s=seconds + 0.3)   # 0.3 s to find the closing edge
        window = self.last_window
        readings = window.readings_in_window()
        late = [w for t, w in readings if t >= (readings[0][0] + readings[-1][0]) / 2] if readings else []
        out.update(counter_w=cols["mean_power_w"], window_s=cols["energy_window_s"], method=cols["energy_method"],
                   samples=len(late), sampled_w=statistics.median(late) if late else None)
        if cols["energy_method"] != "counter":
            return dict(out, reason=cols["telemetry_reason"] or "the energy counter gave no aligned window")
        if not late or not out["sampled_w"]:
            return dict(out, reason="no instantaneous power readings (NVML_FI_DEV_POWER_INSTANT)")
        out["ratio"] = out["counter_w"] / out["sampled_w"]
        out["agrees"] = abs(out["ratio"] - 1.0) <= COUNTER_VS_SAMPLED_TOL
        if not out["agrees"]:
            out["reason"] = (f"the energy counter's mean power ({out['counter_w']:.0f} W) is {out['ratio']:.2f}x "
                             f"the instantaneous power on a steady load ({out['sampled_w']:.0f} W): the counter may "
                             "be stuck, mis-scaled or count another scope")
        return out


def steady_load(device: str = "cuda", n: int = 4096, calls: int = 16) -> tuple[Callable[[], None], int, float, Any]:
    """(run_unit, calls per unit, one call's device seconds, timing.CudaClock) of a bf16 n×n matmul:
    the steady load EnergyMeter.counter_check reads the counter on (0.17 ms a call on an H200)."""
    import torch

    from .timing import CudaClock
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)                     # (n, n)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)                     # (n, n)
    c = torch.empty_like(a)

    def unit() -> None:
        for _ in range(calls):
            torch.mm(a, b, out=c)

    clock = CudaClock()
    unit()
    start, end = clock.event(), clock.event()
    start.record()
    unit()
    end.record()
    end.synchronize()
    return unit, calls, start.elapsed_time(end) / 1e3 / calls, clock


def run_counter_check(device: str, seconds: float = COUNTER_CHECK_S) -> dict[str, Any]:
    """EnergyMeter.counter_check on `device`'s steady_load (run.json's ceilings[device]["energy_counter_check"]).
    Never raises: a failure is the reason."""
    import torch
    try:
        index = torch.device(device).index
        with EnergyMeter(device_index=torch.cuda.current_device() if index is None else index) as meter:
            if not meter.available:
                return {"reason": meter.reason or "NVML unavailable", "seconds": seconds}
            unit, calls, kernel_s, clock = steady_load(device)
            return meter.counter_check(unit, calls_per_unit=calls, kernel_s=kernel_s, device=clock, seconds=seconds)
    except Exception as exc:  # noqa: BLE001 - the check is reported, never the run's end
        return {"reason": f"{type(exc).__name__}: {exc}"[:300], "seconds": seconds}
