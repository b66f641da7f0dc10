"""A cell's energy window: NVML energy of its forward calls run back to back (energy.EnergyMeter
measures the window; this module decides what runs in it and how long a call of it takes on the device)."""
from __future__ import annotations

import math
import time
from typing import Any, Callable

from ...core.grid import Case
from ...workload.presets import Preset
from ..cell.failures import failure_reason
from .cell_timing import cuda_clock
from .timing import DeviceTimingFailed, Samples, cuda_graph_replay, measure_device


ENERGY_UNIT_S = 2e-3       # device time of one energy-window unit (a graph replay of N calls)
MAX_ENERGY_UNIT_CALLS = 256
ENERGY_HOT_SAMPLES = 3     # --l2-flush: units timed hot (device events behind a spin) for the idle fraction ...
ENERGY_HOT_LONG_S = 0.01   # ... or one, for units longer than this


def telemetry(case: Case, forward: Callable[[], Any], fwd: Samples, sync: Any, meter: Any,
              preset: Preset) -> dict:
    """NVML energy of back-to-back forward calls (energy.EnergyMeter.measure).

    Calls shorter than 2 ms run as replays of a CUDA graph holding N of them (about 2 ms of
    device work), so the GPU runs them back to back whatever the host costs per call; longer
    calls, and calls whose capture fails, run eagerly, and the record's energy_idle_frac says
    how long the GPU waited between them. With --l2-flush the timed median is a cold-cache
    time while the window runs hot, so the idle fraction takes a hot one instead: a few units
    timed as the samples were (CUDA events behind a spin kernel), without the flush.
    """
    from .energy import MAX_WALL_S as ENERGY_MAX_WALL_S, null_telemetry
    if case.device != "cuda":
        return null_telemetry("NVML telemetry is for NVIDIA GPUs; this cell ran on the CPU")
    if meter is None or not getattr(meter, "available", False):
        return null_telemetry(getattr(meter, "reason", None) or "no energy meter for this run")
    if preset.energy_window_s <= 0:
        return null_telemetry("energy measurement turned off (--energy-window-s 0)")
    if case.scenario != "normal":
        return null_telemetry("energy is measured on speed cells (scenario normal) only")
    clock = getattr(meter, "clock", time.perf_counter)
    started = clock()
    calls = max(1, min(MAX_ENERGY_UNIT_CALLS, math.ceil(ENERGY_UNIT_S / max(fwd.median_s, 1e-7))))

    def unit() -> None:
        for _ in range(calls):
            forward()
    how = "eager calls"
    if fwd.median_s < ENERGY_UNIT_S:     # short calls: one graph launch per unit keeps the GPU fed
        try:
            unit, how = cuda_graph_replay(forward, calls), "CUDA-graph replays"
        except Exception as exc:  # noqa: BLE001 - a variant that cannot be captured runs eagerly
            if sync:
                sync()
            how = f"eager calls (CUDA-graph capture failed: {failure_reason(exc)})"
    kernel_s: float | None = fwd.median_s
    cold_note = None
    if preset.l2_flush:                 # fwd.median_s is a cold-cache time: time the unit hot
        device = cuda_clock()
        try:
            hot = measure_device(unit, estimate_s=calls * fwd.median_s, clock=device, min_time_s=0.0,
                                 min_samples=ENERGY_HOT_SAMPLES if calls * fwd.median_s <= ENERGY_HOT_LONG_S
                                 else 1, host_clock=device.host_clock)
            kernel_s = hot.median_s / calls
        except DeviceTimingFailed as exc:
            kernel_s = None
            cold_note = ("energy_idle_frac unknown: the timed samples ran with the L2 cache flushed "
                         "(--l2-flush), a cold-cache time while the window runs hot, and the calls could "
                         f"not be timed hot ({exc})")
    out = meter.measure(unit, calls_per_unit=calls, kernel_s=kernel_s,
                        unit_device_s=calls * (kernel_s or fwd.median_s), device=cuda_clock(),
                        min_window_s=preset.energy_window_s, max_wall_s=ENERGY_MAX_WALL_S, sync=sync)
    if out.get("energy_method"):
        out["energy_method"] = f"{out['energy_method']} over {how}"
    if cold_note:
        out["energy_idle_frac"] = None
        out["telemetry_reason"] = "; ".join(filter(None, [out.get("telemetry_reason"), cold_note]))
    out["energy_cost_s"] = clock() - started
    return out
