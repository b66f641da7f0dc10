"""The worker's side of the budget: skip what the plan skips, and keep to the deadline while running
(plan/budget.py makes the plan)."""
from __future__ import annotations

import heapq
import time
from typing import Callable, Sequence

from ..core.units import format_duration
from .budget import CORRECTION_MIN_CELLS, CORRECTION_RANGE, FREE_CELL_S, LATE_MARGIN, Plan
from .tiers import COVERAGE, REAL, REST, TIER_NAMES


class Keeper:
    """The worker's side: skip what the plan skips, and keep to the deadline while running.

    After each cell, the median ratio of measured to predicted time (once 5 cells are
    measured, clamped to 0.5-4x: the median, so one slow first cell does not condemn the
    rest) scales the predictions of the remaining cells; when they would run past the
    deadline, remaining cells are skipped: the highest tier first (Plan.tier: the controls'
    extra cells, then the real variants' other cells, coverage last, its lowest priority level
    first: Plan.level), the most expensive first within a tier (and level). remaining_s() is what the progress bar shows as time left.

    A cell predicted under FREE_CELL_S is never cut: cutting it saves nothing, and such cells are
    mostly ones the runner refuses in milliseconds (a backend the device lacks): cut, their
    record said "over the budget at run time" instead of why they cannot run, and the report
    listed sdpa_efficient and sdpa_cudnn on the CPU as left without a cell for time.

    The smallest useful plan (Plan.smallest: a cell of sdpa and of eager in every dtype, tier 0's
    first priority level) is never cut at run time: without it a run has nothing to say. Time the
    cells leave (a cell faster than predicted, a cell cut) goes back to the cells skipped for time
    (reclaim_order, admit), in priority order, once the planned cells are done: a cpu-preset run on
    a CPU whose bf16 ran slower than planned cut 263 cells and then ended 97 s before its budget.
    """

    def __init__(self, plan: Plan | None, order: Sequence[str], clock: Callable[[], float] = time.time):
        self.plan, self.clock = plan, clock
        self.skip: dict[str, str] = dict(plan.skip) if plan else {}
        self.predicted = dict(plan.predicted) if plan else {}
        self.tier = plan.tier if plan else {}
        self.smallest = set(plan.smallest) if plan else set()
        kept = [i for i in order if i not in self.skip]
        self._order = kept
        self._position = {i: n for n, i in enumerate(kept)}
        # which kept cell's prediction carries each shared cost (Plan.groups): the first needing it, as the
        # plan predicted them in this order; a cell cut at run time hands its shares on (_hand_on)
        self._carrier: dict[int, str] = {}
        for cell_id in kept:
            for group in ((plan.work.get(cell_id) or (0.0, ()))[1] if plan else ()):
                self._carrier.setdefault(group, cell_id)
        level = plan.level if plan else {}          # within tier 0 the lowest priority level goes first
        self._heap = [(-self.tier.get(i, REAL), -level.get(i, REST + 1), -self.predicted.get(i, 0.0), i)
                      for i in kept if self._cuttable(i)]
        heapq.heapify(self._heap)
        self._remaining = set(kept)
        self._remaining_s = sum(self.predicted.get(i, 0.0) for i in self._remaining)
        self.ratios: list[float] = []
        self.done_predicted_s = 0.0        # predicted seconds of the cells measured so far ...
        self.done_elapsed_s = 0.0          # ... and what they took
        self.cut: list[str] = []           # the cells skipped at run time, in the order they were
        self.done_cells = 0                # cells measured so far
        self.bought: set[int] = set()      # the shared costs (Plan.groups) the measured cells paid
        self.admitted: list[str] = []      # cells skipped for time, measured after all (admit)
        # what the cells skipped for time would take, all of them (their predictions): the most the time
        # given back can buy (time_left_s)
        self._standby_s = sum(self.predicted.get(i, 0.0) for i in (plan.standby if plan else ()))

    def _cuttable(self, cell_id: str) -> bool:
        return self.predicted.get(cell_id, 0.0) >= FREE_CELL_S and cell_id not in self.smallest

    def factor(self) -> float:
        if len(self.ratios) < CORRECTION_MIN_CELLS:
            return 1.0
        import statistics
        lo, hi = CORRECTION_RANGE
        return min(hi, max(lo, statistics.median(self.ratios)))

    def remaining_s(self) -> float:
        """Predicted seconds of the cells still to measure, scaled by factor()."""
        return max(0.0, self._remaining_s) * self.factor()

    def time_left_s(self) -> float:
        """What the progress bar shows as the cells' time left: remaining_s(), and where the plan cut
        cells for time, the time up to the deadline the cells then measured after all may take (at
        most their predictions): a run ahead of its plan ends at its deadline, not before."""
        base = self.remaining_s()
        if self.plan is None or self.plan.deadline_unix is None or self._standby_s <= 0:
            return base
        spare = self.plan.deadline_unix - self.clock() - base
        return base + max(0.0, min(spare, self._standby_s * self.factor()))

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
            *_rank, victim = heapq.heappop(self._heap)
            if victim in self._remaining:
                self._cut(victim, factor, left)
        own = self.predicted.get(cell_id, 0.0) * factor
        if (cell_id not in self.skip and cell_id in self._remaining and self._cuttable(cell_id)
                and own * LATE_MARGIN > max(left, 0.0)):
            # the rest fits as predicted, but this cell takes most of the time left, and a single
            # cell misses its prediction by more than the median does (a compile): it could end
            # past the deadline
            self._cut(cell_id, factor, left)
        return self.skip.get(cell_id)

    def _cut(self, cell_id: str, factor: float, left: float) -> None:
        predicted = self.predicted.get(cell_id, 0.0)
        self._remaining.discard(cell_id)
        self._remaining_s -= predicted
        self.skip[cell_id] = self._late(predicted, factor, left)
        self.cut.append(cell_id)
        self._hand_on(cell_id)

    def _hand_on(self, cell_id: str) -> None:
        """The shared costs a cut cell's prediction carried (the compiler's start, a compile, an input set's
        golden: Plan.groups) and no measured cell paid go to the next remaining cell needing each: it pays
        them now, so its prediction and what is left say so. Without this, an emulated slow CPU's quick run
        cut the first compiled cell (13 s with the compiler's cold start), measured the next compiled cell
        (predicted 3.3 s, took 14 s) and read the whole run as 1.6x slower than planned."""
        work = self.plan.work if self.plan else {}
        for group in (work.get(cell_id) or (0.0, ()))[1]:
            if self._carrier.get(group) != cell_id or group in self.bought:
                continue
            heir = next((i for i in self._order[self._position[cell_id] + 1:]
                         if i in self._remaining and group in (work.get(i) or (0.0, ()))[1]), None)
            if heir is None:
                del self._carrier[group]
                continue
            seconds = float(self.plan.groups[group][1])
            self._carrier[group] = heir
            self.predicted[heir] = self.predicted.get(heir, 0.0) + seconds
            self.predicted[cell_id] = max(0.0, self.predicted.get(cell_id, 0.0) - seconds)
            self._remaining_s += seconds

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
        work = self.plan.work.get(cell_id) if self.plan else None
        if work:
            self.bought.update(work[1])
        if cell_id in self._remaining:
            self._remaining.discard(cell_id)
            self._remaining_s -= self.predicted.get(cell_id, 0.0)
        predicted = self.predicted.get(cell_id)
        if predicted and cell_id not in self.skip:
            self.ratios.append(elapsed_s / predicted)
            self.done_predicted_s += predicted
            self.done_elapsed_s += elapsed_s

    # ----------------------------------------------------------------------- time given back

    def added_s(self, cell_id: str) -> float:
        """A cell's predicted seconds measured now: its own, plus the shared costs (its input set's
        golden, its compile, its variant's first use: Plan.groups) no cell measured so far paid,
        scaled by factor(); its prediction where the plan has no work for it."""
        work = self.plan.work.get(cell_id) if self.plan else None
        if not work:
            return self.predicted.get(cell_id, 0.0) * self.factor()
        own, groups = work
        return (own + sum(self.plan.groups[g][1] for g in groups if g not in self.bought)) * self.factor()

    def reclaim_order(self, deferred: Sequence[str]) -> list[str]:
        """The cells of `deferred` skipped for time (the plan's budget cuts: Plan.standby; and this
        run's cuts), in the order time left over goes to them: by tier (coverage, then the real
        variants' other cells, then the controls' extra cells), tier 0 in the order the plan bought
        it, the others cheapest first as they would be measured now (added_s)."""
        if self.plan is None:
            return []
        rank = {i: n for n, i in enumerate(self.plan.standby)}
        eligible = [i for i in deferred if (i in rank or i in self.cut) and i in self.skip]

        def key(cell_id: str) -> tuple:
            tier = self.plan.standby_tier.get(cell_id, self.tier.get(cell_id, REAL))
            return (tier, rank.get(cell_id, 0) if tier == COVERAGE else self.added_s(cell_id))
        return sorted(eligible, key=key)

    def admit(self, cell_id: str) -> bool:
        """Whether a cell skipped for time is measured now: when LATE_MARGIN × added_s fits what is left
        before the deadline (the planned cells are done by then). It then leaves the skips (its
        record is a measurement) and counts as remaining until done()."""
        if cell_id not in self.skip or self.plan is None or self.plan.deadline_unix is None:
            return False
        left = self.plan.deadline_unix - self.clock() - self.remaining_s()
        cost = self.added_s(cell_id)
        if cost * LATE_MARGIN > left:
            return False
        del self.skip[cell_id]
        self._standby_s -= self.predicted.get(cell_id, 0.0)
        self.admitted.append(cell_id)
        self._remaining.add(cell_id)
        self.predicted[cell_id] = cost / self.factor()
        self._remaining_s += self.predicted[cell_id]
        return True

    def reclaimed_line(self) -> str | None:
        """What the time left over bought: "N cells skipped for time measured after all (tier: n, ...)"."""
        if not self.admitted:
            return None
        per: dict[str, int] = {}
        for i in self.admitted:
            name = TIER_NAMES[self.plan.standby_tier.get(i, self.tier.get(i, REAL))]
            per[name] = per.get(name, 0) + 1
        return (f"{len(self.admitted)} cells skipped for time measured after all, in the time the others "
                "left (" + ", ".join(f"{name}: {n}" for name, n in per.items()) + ")")
