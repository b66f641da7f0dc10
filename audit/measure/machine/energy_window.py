"""One energy window of EnergyMeter.measure (measure/machine/energy.py, whose docstring says what it
measures): the GPU kept fed with queued units while the host reads NVML, in steps.

1. open: the first round of context readings (power, SM clock, temperature, throttle reasons),
   units queued, the energy counter read once;
2. find_edges: one NVML query a step (a context reading or a counter read), the queue topped up
   between steps, until the counter has changed twice at least a window apart (edges), or the
   wall-time limit;
3. close: the last counter read, the units' device times from their CUDA events;
4. columns: energy per call, power, idle fraction, clock, temperature, throttling and the notes.

Nothing here raises: a failing query leaves its column None and a note.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Any, Callable

from .nvml import decode_throttle_reasons, is_not_supported

# How the window keeps the GPU fed and times its edges (docs/measurement.md, "Telemetry on NVIDIA
# GPUs"); the queue's depth is EnergyMeter.queue_target_s.
UNKNOWN_UNIT_QUEUE = 3       # units kept queued while a unit's device time is still unknown
TOP_UP_HOST_S = 1e-3         # host time spent queueing units before NVML is read again (host-bound units)
EDGE_SHARE = 0.05            # an edge's timing uncertainty (about one counter read) over the window, at most
SLOW_COUNTER_S = 0.1         # no counter update after this long: sample as if it had none
UNIT_TIMES_KEPT = 8          # units whose device time is measured (CUDA events) to size the queue
COUNTER_VS_SAMPLED_TOL = 0.15  # counter power vs sampled instantaneous power, relative

Edge = tuple[float, float, float]          # (host time, mJ, uncertainty ± s)


class EnergyWindow:
    """The state of one EnergyMeter.measure call (its arguments: EnergyMeter.measure)."""

    def __init__(self, meter: Any, run_unit: Callable[[], object], *, calls_per_unit: int,
                 kernel_s: float | None, unit_device_s: float | None, device: Any, min_window_s: float,
                 max_wall_s: float, sync: Callable[[], None] | None, started: float) -> None:
        self.meter, self.clock = meter, meter.clock
        self.run_unit, self.calls_per_unit, self.kernel_s = run_unit, calls_per_unit, kernel_s
        self.device, self.min_window_s, self.max_wall_s, self.sync = device, min_window_s, max_wall_s, sync
        self.started = started
        self.notes: list[str] = []
        self.instant: list[float] = []
        self.instant_at: list[float] = []          # host time of each instant reading
        self.average: list[float] = []
        self.clocks: list[float] = []
        self.temps: list[float] = []
        self.masks_outside: list[int] = []
        self.masks_during: list[int] = []
        self.units: list[tuple[Any, Any]] = []     # (start, end) CUDA events of every unit queued
        self.pending: deque = deque()              # the units the device has not finished
        self.unit_times: list[float] = []          # device seconds of finished units
        self.counter_reads: list[float] = []       # seconds each of this cell's counter reads took
        self.counter_error: str | None = None
        self.n_units = 0
        self.estimate = unit_device_s or (kernel_s * calls_per_unit if kernel_s else None)
        self.window_needed = meter._window_needed(min_window_s, max_wall_s)
        self.edges: list[Edge] = []
        self.passed_over: Edge | None = None       # a closing edge too uncertain for its window
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None
        self.begin = self.end_host = started
        self.span_s: float | None = None
        self.gaps_s: float | None = None
        self.context_readers = (self.read_power, self.read_clock, self.read_temperature, self.read_throttle)

    # -- the queue ----------------------------------------------------------
    def read_counter(self) -> tuple[float, float] | None:
        """(mJ, host time right after the read), or None with counter_error saying why."""
        try:
            mj, after, took = self.meter._read_counter()
        except Exception as exc:
            self.counter_error = ("energy counter not supported" if is_not_supported(self.meter.nvml, exc)
                                  else f"energy counter failed: {type(exc).__name__}: {exc}")
            return None
        self.counter_reads.append(took)
        return mj, after

    def retire(self) -> None:
        while self.pending and self.pending[0][1].query():
            start, end = self.pending.popleft()
            if len(self.unit_times) < UNIT_TIMES_KEPT:
                self.unit_times.append(start.elapsed_time(end) / 1e3)

    def unit_s(self) -> float | None:
        """One unit's device time: the shortest measured, else the caller's estimate."""
        return min(self.unit_times) if self.unit_times else self.estimate

    def queued_s(self) -> float:
        return len(self.pending) * (self.unit_s() or 0.0)

    def queued_enough(self) -> bool:
        self.retire()
        one = self.unit_s()
        if not one or one <= 0:
            return len(self.pending) >= UNKNOWN_UNIT_QUEUE
        # the unit running now may be nearly done: count only the ones behind it
        return len(self.pending) >= 1 and (len(self.pending) - 1) * one >= self.meter.queue_target_s()

    def run_more(self) -> None:
        """Top the device's queue up (host-timed: run one unit and wait for it)."""
        if self.device is None:
            self.run_unit()
            self.n_units += 1
            if self.sync:
                self.sync()
            return
        t0 = self.clock()
        while not self.queued_enough():
            start = self.device.event()
            start.record()
            self.run_unit()
            end = self.device.event()
            end.record()
            self.units.append((start, end))
            self.pending.append((start, end))
            self.n_units += 1
            if self.clock() - t0 >= TOP_UP_HOST_S:     # host-bound units: read NVML too
                return

    # -- context readings ---------------------------------------------------
    def read_power(self) -> None:
        before = len(self.instant)
        self.meter._read_power(self.instant, self.average)
        if len(self.instant) > before:
            self.instant_at.append(self.clock())

    def readings_in_window(self) -> list[tuple[float, float]]:
        """(host time, W) of the instant readings between the window's edges (every reading where
        the counter gave no two edges). open() reads power once before the first edge, while the
        first units start on a GPU that idled: on an H200 that reading (100-150 W) pulled the
        sampled power of 0.1 s windows to a third of the counter's."""
        readings = list(zip(self.instant_at, self.instant))
        if len(self.edges) == 2:
            t0, t1 = self.edges[0][0], self.edges[1][0]
            return [(t, w) for t, w in readings if t0 <= t <= t1]
        return readings

    def read_throttle(self) -> None:
        m = self.meter._throttle_mask()
        if m is not None:
            self.masks_during.append(m)

    def read_clock(self) -> None:
        c = self.meter._sm_clock_mhz()
        if c is not None:
            self.clocks.append(c)

    def read_temperature(self) -> None:
        t = self.meter._temperature_c()
        if t is not None:
            self.temps.append(t)

    def _throttle_outside(self) -> None:
        m = self.meter._throttle_mask()
        if m is not None:
            self.masks_outside.append(m)

    def context_allowed(self, now: float) -> bool:
        """Context readings stay away from the edges: an edge is timed by the counter reads
        around it, and a reading between them widens the gap."""
        if self.first is None:
            return True
        if not self.edges:       # waiting for the opening edge; it is late: the counter is slow
            return now - self.begin >= SLOW_COUNTER_S
        return now - self.edges[0][0] < self.window_needed - 2 * self.meter._longest_query_s

    # -- the steps ----------------------------------------------------------
    def open(self) -> None:
        """Throttle reasons before, the first round of context readings with units queued, then
        the first counter read."""
        if self.sync:
            self.sync()
        self._throttle_outside()
        self.begin = self.clock()
        for read_context in self.context_readers:  # the first round, before the counter matters
            if self.device is not None:
                self.run_more()                     # (host-timed units would wait for each)
            read_context()
        self.run_more()
        self.first = self.read_counter()

    def find_edges(self) -> None:
        """One NVML query a step until two counter updates a window apart, or the time is up."""
        last_e = None if self.first is None else self.first[0]
        last_read_at = self.begin if self.first is None else self.first[1]
        last_change_at: float | None = None
        context: deque = deque()                    # context readings still due in this round
        next_round = self.begin + self.meter.sample_every_s
        counter_next = False
        while True:
            now = self.clock()
            if not context and now >= next_round:
                context.extend(self.context_readers)
                next_round = now + self.meter.sample_every_s
            if context and (not counter_next or self.first is None) and self.context_allowed(now):
                context.popleft()()
                counter_next = True
            elif self.first is not None:
                counter_next = False
                read = self.read_counter()
                if read is not None:
                    e, t = read
                    if e != last_e:     # it changed between the previous read and this one
                        at, half = (last_read_at + t) / 2, (t - last_read_at) / 2
                        period = None if last_change_at is None else at - last_change_at
                        last_change_at, last_e = at, e
                        self._on_update(at, e, half, t, period)
                    last_read_at = t
            elif self.pending:
                self.pending[0][1].synchronize()         # nothing to read: wait for the device
            if len(self.edges) == 2 or self._time_up():
                break
            self.run_more()
        if len(self.edges) == 1 and self.passed_over is not None:
            self.edges.append(self.passed_over)

    def _on_update(self, at: float, e: float, half: float, t: float, period: float | None) -> None:
        """A counter update seen at `at` (± half): the opening edge, the closing one, or one passed
        over because the two edges would be timed worse than EDGE_SHARE of the window (a slow
        read at one): then close on the next update instead, if it comes within the budget."""
        if not self.edges:
            self.edges.append((at, e, half))
        elif at - self.edges[0][0] >= self.window_needed:
            longest = self.meter._longest_query_s
            if (self.edges[0][2] + half > EDGE_SHARE * (at - self.edges[0][0]) and period
                    and t - self.started + period + self.queued_s() + 2 * longest <= self.max_wall_s):
                self.passed_over = (at, e, half)
            else:
                self.edges.append((at, e, half))

    def _time_up(self) -> bool:
        now = self.clock()
        elapsed = now - self.started
        if not self.edges and elapsed + self.queued_s() >= self.max_wall_s:   # (the queued work must run too)
            return True
        if self.edges and elapsed >= self.max_wall_s and now - self.edges[0][0] >= self.min_window_s:
            return True
        return elapsed >= 2 * self.max_wall_s + self.min_window_s

    def close(self) -> None:
        """The last counter read, the device time of the units, throttle reasons after."""
        self.end_host = self.clock()
        self.last = self.read_counter() if self.first is not None else None
        if self.units:
            self.units[-1][1].synchronize()
            self.span_s = self.units[0][0].elapsed_time(self.units[-1][1]) / 1e3
            self.gaps_s = sum(max(0.0, prev_end.elapsed_time(start))
                              for (_, prev_end), (start, _) in zip(self.units, self.units[1:])) / 1e3
        elif self.sync:
            self.sync()
        self._throttle_outside()

    # -- the columns --------------------------------------------------------
    def _power(self, sampled: float | None) -> tuple[float | None, str | None, float]:
        """(mean power, method, window seconds): the counter between the edges, else over the
        whole run, else the sampled power."""
        window = self.end_host - self.begin
        first, last = self.first, self.last
        if len(self.edges) == 2:
            (t0, e0, u0), (t1, e1, u1) = self.edges
            window = t1 - t0
            if u0 + u1 > EDGE_SHARE * window:
                self.notes.append(f"the energy window's edges are timed to ±{(u0 + u1) * 1e3:.1f} ms "
                                  f"({(u0 + u1) / window:.0%} of it): NVML reads were slow")
            return (e1 - e0) / 1000.0 / window, "counter", window
        if first is not None and last is not None and last[0] > first[0]:
            window = last[1] - first[1]
            self.notes.append(f"the energy counter changed {len(self.edges)} time(s) in {window:.2f} s: "
                              "window not aligned to its updates")
            return (last[0] - first[0]) / 1000.0 / window, "counter (unaligned)", window
        self.notes.append(self.counter_error or "energy counter did not advance")
        return (sampled, "power×time", window) if sampled is not None else (None, None, window)

    def _idle(self, calls: int) -> float | None:
        """How much of the window the GPU waited: the gaps between units, or the calls' own
        device time short of the span."""
        if not self.span_s:
            return None
        idle = self.gaps_s / self.span_s
        if self.kernel_s:
            idle = max(idle, 1.0 - calls * self.kernel_s / self.span_s)
        if idle > 0.05:
            self.notes.append(f"GPU idle {idle:.0%} of the window between calls (host-bound): "
                              "energy per call includes idle power")
        return idle

    def _throttle(self) -> list[str] | None:
        if not self.masks_during and not self.masks_outside:
            self.notes.append("throttle reasons unavailable")
            return None
        union = 0
        for m in self.masks_during:
            union |= m
        for m in self.masks_outside:
            union |= m & ~0x1
        return decode_throttle_reasons(union)

    def columns(self) -> dict[str, Any]:
        calls = self.n_units * self.calls_per_unit
        per_call_s = (self.span_s if self.span_s else self.end_host - self.begin) / calls
        inside = [w for _, w in self.readings_in_window()]
        source = "instant" if inside else "average" if self.average and not self.instant else None
        sampled = statistics.fmean(inside or self.average) if source else None
        mean_power, method, window = self._power(sampled)
        energy = mean_power * per_call_s if mean_power is not None else None
        idle = self._idle(calls)
        # The counter's mean power is not held against these few readings here: NVML's instant
        # field lags a GPU that just left idle (an H200 in 0.1 s windows: 8 of 38 cells within 15%,
        # the rest 1.2-5x). EnergyMeter.counter_check compares them once per run on a steady load.
        if self.instant and not inside:
            self.notes.append("no instantaneous power reading inside the energy window")
        elif source is None:
            self.notes.append("power reading failed")
        if not self.clocks:
            self.notes.append("SM clock reading failed")
        if not self.temps:
            self.notes.append("temperature reading failed")
        throttle = self._throttle()
        return {
            "energy_per_call_j": energy,
            "energy_method": method,
            "mean_power_w": mean_power,
            "sampled_power_w": sampled,
            "sampled_power_source": source,
            "energy_idle_frac": idle,
            "sm_clock_mhz": statistics.median(self.clocks) if self.clocks else None,
            "temperature_c": max(self.temps) if self.temps else None,
            "throttle_reasons": throttle,
            "energy_calls": calls,
            "energy_window_s": window,
            "energy_cost_s": self.clock() - self.started,
            "energy_read_s": statistics.median(self.counter_reads) if self.counter_reads else None,
            "telemetry_reason": "; ".join(self.notes) or None,
        }
