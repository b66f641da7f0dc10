"""The worker's side of the budget: skip what the plan skips, and keep to the deadline while running
(plan/budget.py makes the plan)."""
from __future__ import annotations

import heapq
import time
from typing import Callable, Sequence

from ..core.units import format_duration
from .budget import CORRECTION_MIN_CELLS, CORRECTION_RANGE, FREE_CELL_S, LATE_MARGIN, REAL, Plan


class Keeper:
    """The worker's side: skip what the plan skips, and keep to the deadline while running.

    After each cell, the median ratio of measured to predicted time (once 5 cells are
    measured, clamped to 0.5-4x: the median, so one slow first cell does not condemn the
    rest) scales the predictions of the remaining cells; when they would run past the
    deadline, remaining cells are skipped: the highest tier first (Plan.tier: the controls'
    extra cells, then the real variants' other cells, coverage last), the most expensive
    first within a tier. remaining_s() is what the progress bar shows as time left.

    A cell predicted under FREE_CELL_S is never cut: cutting it saves nothing, and such cells are
    mostly ones the runner refuses in milliseconds (a backend the device lacks): cut, their
    record said "over the budget at run time" instead of why they cannot run, and the report
    listed sdpa_efficient and sdpa_cudnn on the CPU as left without a cell for time.
    """

    def __init__(self, plan: Plan | None, order: Sequence[str], clock: Callable[[], float] = time.time):
        self.plan, self.clock = plan, clock
        self.skip: dict[str, str] = dict(plan.skip) if plan else {}
        self.predicted = dict(plan.predicted) if plan else {}
        tier = plan.tier if plan else {}
        kept = [i for i in order if i not in self.skip]
        self._heap = [(-tier.get(i, REAL), -self.predicted.get(i, 0.0), i) for i in kept if self._cuttable(i)]
        heapq.heapify(self._heap)
        self._remaining = set(kept)
        self._remaining_s = sum(self.predicted.get(i, 0.0) for i in self._remaining)
        self.ratios: list[float] = []
        self.done_predicted_s = 0.0        # predicted seconds of the cells measured so far ...
        self.done_elapsed_s = 0.0          # ... and what they took
        self.cut: list[str] = []           # the cells skipped at run time, in the order they were
        self.done_cells = 0                # cells measured so far

    def _cuttable(self, cell_id: str) -> bool:
        return self.predicted.get(cell_id, 0.0) >= FREE_CELL_S

    def factor(self) -> float:
        if len(self.ratios) < CORRECTION_MIN_CELLS:
            return 1.0
        import statistics
        lo, hi = CORRECTION_RANGE
        return min(hi, max(lo, statistics.median(self.ratios)))

    def remaining_s(self) -> float:
        """Predicted seconds of the cells still to measure, scaled by factor()."""
        return max(0.0, self._remaining_s) * self.factor()

    def behind_s(self) -> float:
        """How much longer the cells measured so far took than predicted (negative: ahead)."""
        return self.done_elapsed_s - self.done_predicted_s

    def reason(self, cell_id: str) -> str | None:
        """Why to skip this cell now (the plan, or the deadline), or None to measure it."""
        if cell_id in self.skip:
            return self.skip[cell_id]
        if self.plan is None or self.plan.deadline_unix is None:
            return None
        left = self.plan.deadline_unix - self.clock()
        factor = self.factor()
        while self._heap and self._remaining_s * factor > left:
            _tier, cost, victim = heapq.heappop(self._heap)
            if victim not in self._remaining:
                continue
            self._remaining.discard(victim)
            self._remaining_s -= -cost
            self.skip[victim] = self._late(-cost, factor, left)
            self.cut.append(victim)
        own = self.predicted.get(cell_id, 0.0) * factor
        if (cell_id not in self.skip and cell_id in self._remaining and self._cuttable(cell_id)
                and own * LATE_MARGIN > max(left, 0.0)):
            # the rest fits as predicted, but this cell takes most of the time left, and a single
            # cell misses its prediction by more than the median does (a compile): it could end
            # past the deadline
            self._remaining.discard(cell_id)
            self._remaining_s -= self.predicted.get(cell_id, 0.0)
            self.skip[cell_id] = self._late(self.predicted.get(cell_id, 0.0), factor, left)
            self.cut.append(cell_id)
        return self.skip.get(cell_id)

    def _late(self, predicted: float, factor: float, left: float) -> str:
        return (f"over the budget at run time: predicted {predicted:.1f} s (× {factor:.2f}, the median "
                f"of what cells took against their predictions) with {max(left, 0):.0f} s left "
                f"of the {format_duration(self.plan.budget_s or 0)} budget (--budget)")

    def progress(self) -> float:
        """The share of this process's cells measured: by predicted seconds, measured over measured
        plus remaining (a cell cut at run time leaves the whole), or by count where none was predicted."""
        total = self.done_predicted_s + max(0.0, self._remaining_s)
        if total > 0:
            return self.done_predicted_s / total
        return self.done_cells / max(1, self.done_cells + len(self._remaining))

    def done(self, cell_id: str, elapsed_s: float) -> None:
        self.done_cells += 1
        if cell_id in self._remaining:
            self._remaining.discard(cell_id)
            self._remaining_s -= self.predicted.get(cell_id, 0.0)
        predicted = self.predicted.get(cell_id)
        if predicted and cell_id not in self.skip:
            self.ratios.append(elapsed_s / predicted)
            self.done_predicted_s += predicted
            self.done_elapsed_s += elapsed_s
