"""Per-cell NVML telemetry on NVIDIA GPUs: energy, power, clocks, temperature, throttling.

Every NVML call goes through an injectable module object (`nvml`, default the real pynvml)
so the logic is unit-tested with a fake NVML on machines without a driver. Nothing here
raises: a missing driver, CUDA or query gives None columns and a reason.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from .nvml import (NVML_CLOCK_SM, NVML_TEMPERATURE_GPU, as_text, decode_throttle_reasons, is_not_supported,
                   nvml_device_info, nvml_index_for, torch_cuda_uuid, try_call)

# Columns EnergyMeter.measure() and null_telemetry() produce, in this order.
TELEMETRY_COLUMNS: tuple[str, ...] = (
    "energy_per_call_j", "energy_method", "mean_power_w", "sampled_power_w", "energy_idle_frac",
    "sm_clock_mhz", "temperature_c", "throttle_reasons", "energy_calls", "energy_window_s",
    "energy_cost_s", "telemetry_reason",
)

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
    default asks torch); `visible_env` defaults to $CUDA_VISIBLE_DEVICES.
    """

    def __init__(self, nvml: Any = None, device_index: int = 0, *,
                 cuda_uuid: Callable[[int], str | None] | None = None,
                 visible_env: Any = _VISIBLE_FROM_ENV,
                 clock: Callable[[], float] | None = None,
                 sample_every_s: float = 0.01) -> None:
        import time

        self.device_index = device_index
        self.clock = clock or time.perf_counter
        self.sample_every_s = sample_every_s
        self._instant_unsupported = False
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
    def _throttle_mask(self) -> int | None:
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue
            try:
                return int(fn(self.handle))
            except Exception:
                continue
        return None

    def _sample(self, power: list[float], clocks: list[float], temps: list[float]) -> int | None:
        """One reading of power (instantaneous where NVML has it, else its 1 s average), SM clock
        and temperature (each optional); returns the throttle mask."""
        p = self._instant_power_w()
        if p is None:
            mw = try_call(lambda: self.nvml.nvmlDeviceGetPowerUsage(self.handle))       # mW
            p = None if mw is None else float(mw) / 1000.0
        if p is not None:
            power.append(p)
        c = try_call(lambda: self.nvml.nvmlDeviceGetClockInfo(
            self.handle, getattr(self.nvml, "NVML_CLOCK_SM", NVML_CLOCK_SM)))       # MHz
        if c is not None:
            clocks.append(float(c))
        t = try_call(lambda: self.nvml.nvmlDeviceGetTemperature(
            self.handle, getattr(self.nvml, "NVML_TEMPERATURE_GPU", NVML_TEMPERATURE_GPU)))
        if t is not None:
            temps.append(float(t))
        return self._throttle_mask()

    def _energy_mj(self) -> float:
        return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def _instant_power_w(self) -> float | None:
        """Instantaneous board power (NVML_FI_DEV_POWER_INSTANT), or None where unsupported.

        nvmlDeviceGetPowerUsage is a 1-second average on Ampere and newer GPUs: over a
        0.1-0.3 s window it mostly reports the cell before. The instant field does not lag.
        """
        if self._instant_unsupported:
            return None
        field = getattr(self.nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        get = getattr(self.nvml, "nvmlDeviceGetFieldValues", None)
        if field is None or get is None:
            self._instant_unsupported = True
            return None
        try:
            value = get(self.handle, [field])[0]
            if getattr(value, "nvmlReturn", 0) != 0:
                raise RuntimeError(f"nvmlReturn {value.nvmlReturn}")
            return float(value.value.uiVal) / 1000.0
        except Exception:
            self._instant_unsupported = True
            return None

    def measure(self, run_unit: Callable[[], object], *, calls_per_unit: int = 1,
                kernel_s: float | None = None, device: Any = None, min_window_s: float = 0.1,
                max_wall_s: float = 0.3, sync: Callable[[], None] | None = None) -> dict[str, Any]:
        """Energy per call of back-to-back calls; every telemetry column.

        `run_unit()` queues `calls_per_unit` calls without synchronizing (a CUDA-graph replay
        of them, or a loop); `kernel_s` is one call's measured device time; `device` gives
        CUDA events (timing.CudaClock). Units keep running, at most two in flight, while:

        1. the total-energy counter is polled until it changes (it is updated every
           20-100 ms, not continuously): the window opens on that edge, E0 at t0;
        2. after at least `min_window_s` the counter is polled until it changes again:
           the window closes on that edge, E1 at t1.

        mean_power_w = (E1 - E0) / (t1 - t0): the GPU's power while running the calls,
        with no partial update period at either end. CUDA events around all units give
        the device time per call; energy_per_call_j = mean power × that time, and
        energy_idle_frac = 1 - calls × kernel_s / device time says how much of it the GPU
        waited for the host (energy then includes idle power, and the reason says so).
        sampled_power_w is the mean of the instantaneous power readings in the window, an
        independent check of the counter. When no edge comes within `max_wall_s` the
        energy is the counter's difference over the whole run (method "counter
        (unaligned)"), or sampled power × time where the counter fails ("power×time").
        """
        if not self.available:
            return null_telemetry(self.reason or "NVML unavailable")
        import statistics
        from collections import deque

        notes: list[str] = []
        power: list[float] = []
        clocks: list[float] = []
        temps: list[float] = []
        masks_outside: list[int] = []
        masks_during: list[int] = []
        inflight: deque = deque()
        units = 0

        def read_counter() -> float | None:
            nonlocal counter_error
            try:
                return self._energy_mj()
            except Exception as exc:
                counter_error = ("energy counter not supported" if is_not_supported(self.nvml, exc)
                                 else f"energy counter failed: {type(exc).__name__}: {exc}")
                return None

        def sample() -> None:
            m = self._sample(power, clocks, temps)
            if m is not None:
                masks_during.append(m)

        def poll() -> None:
            """Read the counter (and, every sample_every_s, power and clocks); note an edge."""
            nonlocal last, last_sample
            now = self.clock()
            if now - last_sample >= self.sample_every_s:
                sample()
                last_sample = now
            e = read_counter() if e_begin is not None else None
            if e is not None and last is not None and e != last:
                if not edges or now - edges[0][0] >= min_window_s:
                    edges.append((now, e))
                last = e

        def unit() -> None:
            """Queue one unit; keep at most two queued, polling the counter while waiting."""
            nonlocal units
            run_unit()
            units += 1
            if device is not None:
                ev = device.event()
                ev.record()
                inflight.append(ev)
                while len(inflight) > 2:
                    if e_begin is None:                 # nothing to poll: just wait
                        inflight.popleft().synchronize()
                    elif inflight[0].query():
                        inflight.popleft()
                    else:
                        poll()
                        if len(edges) == 2:
                            return
            elif sync:
                sync()

        if sync:
            sync()
        m = self._throttle_mask()
        if m is not None:
            masks_outside.append(m)
        counter_error: str | None = None
        first = None
        if device is not None:
            first = device.event()
            first.record()
        begin = self.clock()
        e_begin = read_counter()
        edges: list[tuple[float, float]] = []      # (host time, counter mJ) at counter updates
        last, last_sample = e_begin, -1.0
        while True:
            unit()
            if len(edges) < 2:
                poll()
            now = self.clock()
            if len(edges) == 2:
                break
            if now - begin >= max_wall_s and (not edges or now - edges[0][0] >= min_window_s):
                break
            if now - begin >= 2 * max_wall_s + min_window_s:
                break
        end_host = self.clock()
        e_end = read_counter() if e_begin is not None else None
        span_s = None
        if device is not None:
            final = device.event()
            final.record()
            final.synchronize()
            span_s = first.elapsed_time(final) / 1e3
        elif sync:
            sync()
        m = self._throttle_mask()
        if m is not None:
            masks_outside.append(m)

        calls = units * calls_per_unit
        per_call_s = (span_s if span_s else end_host - begin) / calls
        sampled = statistics.fmean(power) if power else None
        method: str | None = None
        mean_power: float | None = None
        window = end_host - begin
        if len(edges) == 2:
            (t0, e0), (t1, e1) = edges
            window = t1 - t0
            mean_power, method = (e1 - e0) / 1000.0 / window, "counter"
        elif e_begin is not None and e_end is not None and e_end > e_begin:
            mean_power, method = (e_end - e_begin) / 1000.0 / window, "counter (unaligned)"
            notes.append(f"the energy counter changed {len(edges)} time(s) in {window:.2f} s: "
                         "window not aligned to its updates")
        else:
            notes.append(counter_error or "energy counter did not advance")
            if sampled is not None:
                mean_power, method = sampled, "power×time"
        energy = mean_power * per_call_s if mean_power is not None else None
        idle = None
        if kernel_s and span_s:
            idle = max(0.0, 1.0 - calls * kernel_s / span_s)
            if idle > 0.05:
                notes.append(f"GPU idle {idle:.0%} of the window between calls (host-bound): "
                             "energy per call includes idle power")
        if not power:
            notes.append("power reading failed")
        if not clocks:
            notes.append("SM clock reading failed")
        if not temps:
            notes.append("temperature reading failed")
        if not masks_during and not masks_outside:
            notes.append("throttle reasons unavailable")
            throttle: list[str] | None = None
        else:
            union = 0
            for m in masks_during:
                union |= m
            for m in masks_outside:
                union |= m & ~0x1
            throttle = decode_throttle_reasons(union)
        return {
            "energy_per_call_j": energy,
            "energy_method": method,
            "mean_power_w": mean_power,
            "sampled_power_w": sampled,
            "energy_idle_frac": idle,
            "sm_clock_mhz": statistics.median(clocks) if clocks else None,
            "temperature_c": max(temps) if temps else None,
            "throttle_reasons": throttle,
            "energy_calls": calls,
            "energy_window_s": window,
            "energy_cost_s": self.clock() - begin,
            "telemetry_reason": "; ".join(notes) or None,
        }
