"""The run's progress bar: it advances by each cell's predicted seconds, not by cell count,
and its time left is the plan's.

A compiled cell can take 100x an SDPA cell, so a bar by count (and a rate-based ETA) swings
wildly; here the bar's length is the plan's predicted cell seconds, each finished cell moves
it by its own prediction, and the time left is what the budget's Keeper predicts for the
cells still to run (scaled by how the measured cells compared with their predictions) plus
the report. When the cells so far took longer than predicted, the bar says by how much.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Sequence

from ..core.units import format_clock

BEHIND_SHOWN_S = 2.0        # a difference from the plan smaller than this is not shown


class Progress:
    """tqdm over predicted seconds. keeper: the run's keeper.Keeper; plan: its budget.Plan (None:
    no predictions, each cell then weighs one second)."""

    def __init__(self, todo: Sequence[str], done_before: int, keeper: Any, plan: Any,
                 clock: Callable[[], float] = time.time, file: Any = None) -> None:
        from tqdm.auto import tqdm
        self.keeper, self.plan, self.clock = keeper, plan, clock
        self.started = (plan.started_unix if plan is not None and plan.started_unix else None) or clock()
        self.report_s = float(plan.report_s) if plan is not None else 0.0
        self.weight = {i: self._predicted(i) for i in todo if i not in keeper.skip}
        self.cells_total = len(todo) + done_before
        self.cuts_seen = 0                  # of keeper.cut: the run-time cuts already off the bar
        self.cells_done = done_before
        self.bar = tqdm(total=max(sum(self.weight.values()), 1e-9), unit="s", dynamic_ncols=True,
                        mininterval=0.5, file=file or sys.stderr,
                        bar_format="{percentage:3.0f}%|{bar}| {desc}")

    def _predicted(self, cell_id: str) -> float:
        if self.plan is None:
            return 1.0
        return float(self.keeper.predicted.get(cell_id, 0.0))

    def text(self, cell_id: str | None) -> str:
        """'12/2028 cells, 0:41 elapsed, about 8:55 left (3 s behind the plan) · <cell id>'."""
        elapsed = self.clock() - self.started
        parts = [f"{self.cells_done}/{self.cells_total} cells", f"{format_clock(elapsed)} elapsed"]
        if self.plan is not None:
            left = self.keeper.time_left_s() + self.report_s
            behind = self.keeper.behind_s()
            note = ""
            if abs(behind) >= BEHIND_SHOWN_S:
                note = f" ({format_clock(abs(behind))} {'behind' if behind > 0 else 'ahead of'} the plan)"
            parts.append(f"about {format_clock(left)} left{note}")
        return ", ".join(parts) + (f" · {cell_id}" if cell_id else "")

    def start_cell(self, cell_id: str) -> None:
        if self.plan is not None and cell_id not in self.weight and cell_id in self.keeper.admitted:
            self.weight[cell_id] = self._predicted(cell_id)          # cut for time, measured after all
            self.bar.total += self.weight[cell_id]
        self.bar.set_description_str(self.text(cell_id), refresh=True)

    def end_cell(self, cell_id: str) -> None:
        """A cell recorded (measured, or skipped now): the bar moves by its prediction; cells the
        Keeper cut at run time leave the bar's total."""
        self.cells_done += 1
        advance = 0.0 if cell_id in self.keeper.skip else self.weight.pop(cell_id, 0.0)
        for victim in self.keeper.cut[self.cuts_seen:]:
            self.bar.total = max(self.bar.total - self.weight.pop(victim, 0.0), self.bar.n + advance, 1e-9)
        self.cuts_seen = len(self.keeper.cut)
        self.bar.update(min(advance, max(0.0, self.bar.total - self.bar.n)))   # never past the end
        self.bar.set_description_str(self.text(None), refresh=False)

    def close(self) -> None:
        self.bar.close()
