"""Keep a run to its time budget: plan which cells fit, and keep to the plan while running.

Before measuring, the cost model predicts every cell (forecast.plan). Cells predicted
over the per-cell limit (--max-cell-s) are skipped; then the most expensive cells are
skipped until the predicted total fits the budget (the cheap ones give the grid its
breadth). Skipped cells are recorded as `skipped` with the prediction in the reason,
never dropped. While running, the worker compares what the cells took with what was
predicted and, if the rest would overrun the deadline, skips the most expensive of the
remaining cells too. The plan is `DIR/plan.json`.
"""
from __future__ import annotations

import heapq
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..core.grid import INPUT_AXES
from ..core.runfolder import PLAN_FILE
from ..core.units import format_duration

CORRECTION_MIN_CELLS = 5            # measured cells behind a runtime correction factor
SAFETY_FRACTION = 0.03              # of the budget, kept free for the last cell's overshoot
CORRECTION_RANGE = (0.5, 4.0)


@dataclass
class Plan:
    """What the run will measure: predicted seconds per cell and the cells it skips, with why."""

    budget_s: float | None
    deadline_unix: float | None            # when the cells must be done (report time kept aside)
    predicted: dict[str, float] = field(default_factory=dict)
    skip: dict[str, str] = field(default_factory=dict)
    reserve_s: float = 0.0                 # start-up, ceilings and report: outside the cells

    def write(self, run_dir: Path) -> None:
        (Path(run_dir) / PLAN_FILE).write_text(json.dumps(self.__dict__, indent=1) + "\n")

    @classmethod
    def read(cls, run_dir: Path) -> "Plan | None":
        path = Path(run_dir) / PLAN_FILE
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))

    def predicted_total(self) -> float:
        return sum(s for i, s in self.predicted.items() if i not in self.skip)


def cell_cost(row: Any) -> float:
    """A cell's predicted seconds as the budget weighs it: its own, plus its share of what it
    pays for together with other cells (start-up, its input set's golden, compiled code:
    costmodel's amortized_s), so a cell whose compile nobody else uses carries that compile."""
    if "amortized_s" in row and row["amortized_s"] == row["amortized_s"]:
        return float(row["amortized_s"])
    return float(row["total_s"]) - float(row.get("shared_s", 0.0) or 0.0)


def choose(pred: Any, *, budget_s: float | None, reserve_s: float, max_cell_s: float | None,
           repredict: Callable[[list[str]], Any] | None = None) -> dict[str, str]:
    """{id: reason} of the cells to skip so the predicted total fits `budget_s - reserve_s`.

    pred: costmodel prediction (rows in run order; total_s, and shared_s, the part a cell pays
    for others too: start-up, its input set's golden, compiled code). Cells over the per-cell
    limit go first. Then a bisection finds the largest cost (own seconds, cell_cost) such that
    keeping every cell that costs no more fits the budget when predicted again (`repredict`:
    a skipped cell's shared costs move to the next cell, or vanish with its input set): the
    most expensive cells are skipped. A cell left alone in its input set that would not be
    measured anyway (a backend that cannot run it) is skipped with them, since it would still
    pay for the set's inputs and golden.
    """
    skip: dict[str, str] = {}
    for _, row in pred[pred["status"] == "ok"].iterrows():
        if max_cell_s is not None and cell_cost(row) > max_cell_s:
            skip[row["id"]] = (f"predicted {cell_cost(row):.1f} s for this cell, over the per-cell limit "
                               f"{max_cell_s:g} s (--max-cell-s)")
    if budget_s is None:
        return skip
    room = budget_s - reserve_s
    costs = {row["id"]: cell_cost(row) for _, row in pred.iterrows() if row["status"] == "ok"}
    keys = {row["id"]: tuple(row[a] for a in INPUT_AXES) for _, row in pred.iterrows()}
    candidates = [i for i in pred["id"] if i not in skip]

    def kept_under(threshold: float) -> list[str]:
        measured = [i for i in candidates if i in costs and costs[i] <= threshold]
        sets = {keys[i] for i in measured}
        return [i for i in candidates if (i in costs and costs[i] <= threshold)
                or (i not in costs and keys[i] in sets)]

    def total(ids: list[str]) -> float:
        if not ids:
            return 0.0
        frame = repredict(ids) if repredict is not None else pred[pred["id"].isin(ids)]
        return float(frame["total_s"].sum())

    levels = sorted({costs[i] for i in candidates if i in costs})
    lo, hi = -1, len(levels) - 1          # levels[lo] fits (lo = -1: nothing), levels[hi] is tried
    if levels and total(kept_under(levels[hi])) <= room:
        return skip
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if total(kept_under(levels[mid])) <= room:
            lo = mid
        else:
            hi = mid
    keep = set(kept_under(levels[lo])) if lo >= 0 else set()
    measured_sets = {keys[i] for i in candidates if i in costs}
    for i in candidates:
        if i in keep or (i not in costs and keys[i] not in measured_sets):
            continue                  # a cell predicted not to run, alone in its set: its own reason
        skip[i] = (f"over the budget: the {format_duration(budget_s)} budget (--budget) leaves {max(room, 0):.0f} s "
                   f"for cells, given to the cheaper ones; this one was predicted {costs[i]:.1f} s"
                   if i in costs else "over the budget: every cell of its input set that would be measured was cut")
    return skip


class Keeper:
    """The worker's side: skip what the plan skips, and keep to the deadline while running.

    After each cell, the median ratio of measured to predicted time (once 5 cells are
    measured, clamped to 0.5-4x: the median, so one slow first cell does not condemn the
    rest) scales the predictions of the remaining cells; when they would run past the
    deadline, the most expensive remaining ones are skipped.
    """

    def __init__(self, plan: Plan | None, order: Sequence[str], clock: Callable[[], float] = time.time):
        self.plan, self.clock = plan, clock
        self.skip: dict[str, str] = dict(plan.skip) if plan else {}
        self.predicted = dict(plan.predicted) if plan else {}
        self._heap = [(-self.predicted.get(i, 0.0), i) for i in order if i not in self.skip]
        heapq.heapify(self._heap)
        self._remaining = {i for _, i in self._heap}
        self._remaining_s = sum(self.predicted.get(i, 0.0) for i in self._remaining)
        self.ratios: list[float] = []

    def factor(self) -> float:
        if len(self.ratios) < CORRECTION_MIN_CELLS:
            return 1.0
        import statistics
        lo, hi = CORRECTION_RANGE
        return min(hi, max(lo, statistics.median(self.ratios)))

    def reason(self, cell_id: str) -> str | None:
        """Why to skip this cell now (the plan, or the deadline), or None to measure it."""
        if cell_id in self.skip:
            return self.skip[cell_id]
        if self.plan is None or self.plan.deadline_unix is None:
            return None
        left = self.plan.deadline_unix - self.clock()
        factor = self.factor()
        while self._heap and self._remaining_s * factor > left:
            cost, victim = heapq.heappop(self._heap)
            if victim not in self._remaining:
                continue
            self._remaining.discard(victim)
            self._remaining_s -= -cost
            self.skip[victim] = (f"over the budget at run time: predicted {-cost:.1f} s (× {factor:.2f}, the median "
                                 f"of what cells took against their predictions) with {max(left, 0):.0f} s left "
                                 f"of the {format_duration(self.plan.budget_s or 0)} budget (--budget)")
        return self.skip.get(cell_id)

    def done(self, cell_id: str, elapsed_s: float) -> None:
        if cell_id in self._remaining:
            self._remaining.discard(cell_id)
            self._remaining_s -= self.predicted.get(cell_id, 0.0)
        predicted = self.predicted.get(cell_id)
        if predicted and cell_id not in self.skip:
            self.ratios.append(elapsed_s / predicted)


def plan_run(cases: Sequence[Any], preset: Any, run_dir: Path | None, *, budget_s: float | None,
             started_unix: float, measure: bool = True, ceilings_measured: bool | None = None
             ) -> tuple[Plan, Any, list[str]]:
    """The plan for `cases` (those not yet recorded): prediction, skips and deadline; also the
    prediction itself and the cost model's notes, for printing.

    A dry-run and the run it previews plan alike: the same ceilings (forecast.machine_ceilings)
    and the same reserve for start-up, ceilings and report. `ceilings_measured`: the run
    measured its ceilings at its start (default: run_dir's run.json has none yet, as before
    a run that will)."""
    from .costmodel import CostModel, Settings, overhead_s
    from .forecast import plan as predict

    forecast = predict(cases, preset, run_dir, measure=measure)
    measured = forecast.ceilings_measured if ceilings_measured is None else ceilings_measured
    before, after = overhead_s(forecast.pred, ceilings_measured=measured, ceilings_s=preset.ceilings_s)
    by_id = {c.id: c for c in cases}
    model = CostModel(forecast.params)

    def repredict(ids: list[str]) -> Any:
        return model.predict([by_id[i] for i in ids], Settings.of_preset(preset), forecast.ceilings,
                             forecast.free, forecast.warm_compiles)

    skip = choose(forecast.pred, budget_s=budget_s, reserve_s=before + after, max_cell_s=preset.max_cell_s,
                  repredict=repredict)
    _, after = overhead_s(forecast.pred[~forecast.pred["id"].isin(skip)])   # the report of what is kept
    predicted = {r["id"]: float(r["total_s"]) for _, r in forecast.pred.iterrows()}
    kept = [i for i in predicted if i not in skip]
    if skip and kept:                  # what the kept cells cost without the cut ones (shared costs move)
        predicted.update({r["id"]: float(r["total_s"]) for _, r in repredict(kept).iterrows()})
    plan = Plan(budget_s=budget_s,
                deadline_unix=None if budget_s is None else
                started_unix + budget_s - after - max(2.0, SAFETY_FRACTION * budget_s),
                reserve_s=before + after, predicted=predicted, skip=skip)
    return plan, forecast.pred, forecast.notes


def describe(plan: Plan, n_cells: int) -> str:
    """One line for the console: what the plan measures and what it skips."""
    skipped = len(plan.skip)
    skipped_s = sum(plan.predicted.get(i, 0.0) for i in plan.skip)
    budget = "no budget" if plan.budget_s is None else f"budget {format_duration(plan.budget_s)}"
    line = (f"plan: {n_cells - skipped} cells predicted {format_duration(plan.predicted_total())} "
            f"(+ {format_duration(plan.reserve_s)} start-up, ceilings and report), {budget}")
    if skipped:
        line += (f"; {skipped} cells skipped (predicted {format_duration(skipped_s)}): "
                 "listed in the report under Time budget")
    return line
