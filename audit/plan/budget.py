"""Keep a run to its time budget: plan which cells fit, and keep to the plan while running.

Before measuring, the cost model predicts every cell (forecast.plan). Cells predicted over
the per-cell limit (--max-cell-s) are skipped. Then the budget buys coverage first, in tiers:

0. every variant that can run gets one cell per device × dtype × mask kind (none, causal, key
   padding: workload.inputs.mask_kind), the cheapest to add (a compile or golden already
   bought for another such cell counts once), and every negative control the cell its
   self-check needs (the cheapest whose scenario shows its defect: Variant.reveals);
1. then the real variants' other cells, cheapest first;
2. then the negative controls' other cells, cheapest first.

If tier 0 itself does not fit, its most expensive cells go, and the plan names the variant ×
dtype × mask kinds left without a cell (Plan.uncovered). Skipped cells are recorded as
`skipped` with the prediction in the reason, never dropped. A preset's model audit (after the
cells) is bought after a cell of every real variant per dtype: where leaving it out keeps more of
those cells, it is left out, with a record saying why (Plan.model_audit_skip). While
running, the worker compares what the cells took with what was predicted and, if the rest would
overrun the deadline, skips the remaining cells of the highest tier, most expensive first
(keeper.Keeper). The plan is `DIR/plan.json`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..core.grid import INPUT_AXES
from ..core.runfolder import PLAN_FILE
from ..core.units import format_duration
from .tiers import (COVERAGE, CONTROL_EXTRA, ESSENTIAL, PER_DTYPE, REAL, REST, cell_cost, coverage_kind, own_cost,
                    prioritized_tiers, run_order)

CORRECTION_MIN_CELLS = 5            # measured cells behind a runtime correction factor
SAFETY_FRACTION = 0.03              # of the budget, kept free for the last cell's overshoot
CORRECTION_RANGE = (0.5, 4.0)
LATE_MARGIN = 1.5                   # a cell runs at run time only if 1.5x its scaled prediction fits what is left
FREE_CELL_S = 0.01                  # a cell predicted under this is never cut at run time (keeper.Keeper)
# The negative controls' cells beyond their self-check get at most this share of the cell time
# already bought (or of the time the budget leaves for cells, when less; their self-checks, in
# COVERAGE, come on top): with eight controls and no such limit they took 9.7% of a cold quick run.
CONTROL_EXTRA_SHARE = 0.05
@dataclass
class Plan:
    """What the run will measure: predicted seconds per cell and the cells it skips, with why."""

    budget_s: float | None
    deadline_unix: float | None            # when the cells must be done (report time kept aside)
    predicted: dict[str, float] = field(default_factory=dict)
    skip: dict[str, str] = field(default_factory=dict)
    reserve_s: float = 0.0                 # start-up, ceilings and report: outside the cells
    tier: dict[str, int] = field(default_factory=dict)   # id -> COVERAGE, REAL or CONTROL_EXTRA
    uncovered: list[str] = field(default_factory=list)   # "variant device dtype mask kind" with no cell
    started_unix: float | None = None      # when the run started (the progress bar's elapsed time)
    report_s: float = 0.0                  # predicted seconds after the last cell (the report)
    smallest_s: float | None = None        # the smallest useful plan (PRIORITY_NAMES[0]), reserve included
    coverage_s: float | None = None        # the whole of tier 0, reserve included
    measured: int | None = None            # cells predicted to be measured (ok, not skipped)
    model_audit_s: float = 0.0             # the model audit after the cells, predicted (in report_s); 0: none
    model_audit_skip: str | None = None    # why the budget leaves it out (None: it runs, or none is asked for)
    shrink_s: float = 0.0                  # shrinking third-party findings after the cells (in report_s); 0: none
    noise_s: float = 0.0                   # of the kept cells' time, sampling beyond the minimum (--noise-target)
    # per device kind: the cap's share one measurement uses
    noise_share: dict[str, float] = field(default_factory=dict)
    # the cells skipped for time, in the order time the others leave goes to them (keeper.Keeper.reclaim_order),
    # with their tiers; and what the keeper weighs a cell by: id -> [its own seconds, [indices into groups]],
    # groups: [name, seconds] of each cost cells share (an input set's golden, a compile, a first use)
    smallest: list[str] = field(default_factory=list)     # the smallest useful plan's cells: never cut at run time
    standby: list[str] = field(default_factory=list)
    standby_tier: dict[str, int] = field(default_factory=dict)
    level: dict[str, int] = field(default_factory=dict)   # tier 0's kept cells: their priority level (tiers.run_order)
    work: dict[str, list] = field(default_factory=dict)
    groups: list[list] = field(default_factory=list)

    def write(self, run_dir: Path) -> None:
        (Path(run_dir) / PLAN_FILE).write_text(json.dumps(self.__dict__, indent=1) + "\n")

    @classmethod
    def read(cls, run_dir: Path) -> "Plan | None":
        path = Path(run_dir) / PLAN_FILE
        if not path.exists():
            return None
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in json.loads(path.read_text()).items() if k in known})

    def predicted_total(self) -> float:
        return sum(s for i, s in self.predicted.items() if i not in self.skip)


@dataclass
class Selection:
    """choose()'s answer: the cells to skip with why, every other cell's tier, the coverage kinds
    left without a cell, and the cells' seconds of the smallest useful plan and of tier 0."""

    skip: dict[str, str]
    tier: dict[str, int]
    uncovered: list[str]
    smallest_s: float | None = None        # the cells' seconds of the smallest useful plan ...
    coverage_s: float | None = None        # ... and of tier 0
    smallest: tuple[str, ...] = ()         # their cells
    coverage: tuple[str, ...] = ()
    per_dtype: tuple[str, ...] = ()        # tier 0's levels ESSENTIAL and PER_DTYPE: a cell of every real variant per dtype
    standby: tuple[str, ...] = ()          # the cells cut for the budget, in the order time left over goes to them
    standby_tier: dict[str, int] = field(default_factory=dict)
    level: dict[str, int] = field(default_factory=dict)   # tier 0's cells: their priority level (PRIORITY_NAMES;
                                                          # skipped ones too: plan_run leaves them out)



def merge_state_sets(preset: Any) -> int:
    """How many sets of partial states the preset's merge audit judges its merge functions on: none without
    merge functions, else the golden's and one per kernel in Preset.merge_parts (plan/overhead.py)."""
    return (1 + len(getattr(preset, "merge_parts", ()))) if getattr(preset, "merges", ()) else 0

def choose(pred: Any, *, budget_s: float | None, reserve_s: float, max_cell_s: float | None,
           repredict: Callable[[list[str]], Any] | None = None, memo: dict | None = None) -> Selection:
    """The cells to skip so the predicted total fits `budget_s - reserve_s`, tier by tier.

    pred: costmodel prediction (rows in run order; total_s; shared_s, the part a cell pays for
    others too; shares, those shared costs by group). Cells over the per-cell limit go first.
    Tier 0 (tiers()) is kept whole when it fits, else its latest-bought cells go until it does.
    Then, per tier, a bisection finds the largest cost (cell_cost) such that keeping every cell
    of the tier that costs no more fits the budget when predicted again (`repredict`: a skipped
    cell's shared costs move to the next cell, or vanish with its input set). A cell left alone
    in its input set that would not be measured anyway (a backend that cannot run it) is skipped
    with them, since it would still pay for the set's inputs and golden. memo: kept between calls on the
    same prediction (a plan chooses up to four times): the tiers of the cells it keeps.
    """
    rows = pred.to_dict("records")          # plain dicts: a Series per row cost seconds on 2000 cells
    skip = _too_slow(rows, budget_s, max_cell_s)
    kept_pred = pred[~pred["id"].isin(list(skip))]
    tier, coverage, level_of = _tiers(pred, kept_pred, skip, memo)
    kept_rows = [r for r in rows if r["id"] not in skip]
    kinds = {row["id"]: coverage_kind(row) or f"{row['variant']} (self-check)" for row in kept_rows}
    room = (budget_s if budget_s is not None else math.inf) - reserve_s
    costs = {row["id"]: cell_cost(row) for row in kept_rows if row["status"] == "ok"}
    keys = {row["id"]: tuple(row.get(a) for a in INPUT_AXES) for row in rows}
    candidates = [i for i in pred["id"] if i not in skip]

    measurable = {keys[i] for i in candidates if i in costs}      # input sets with a cell predicted to run

    def with_sets(measured: set[str]) -> list[str]:
        """The measured cells and the cells predicted not to run of the input sets they keep (each
        recorded with its own reason, in milliseconds, the set's inputs and golden drawn already)."""
        sets = {keys[i] for i in measured}
        return [i for i in candidates if i in measured or (i not in costs and keys[i] in sets)]

    def seconds(measured: set[str]) -> float:
        ids = run_order(with_sets(measured), tier, level_of)
        if not ids:
            return 0.0
        frame = repredict(ids) if repredict is not None else pred[pred["id"].isin(ids)]
        return float(frame["total_s"].sum())

    def fits(measured: set[str]) -> bool:
        return seconds(measured) <= room

    essential = {i for i in coverage if level_of.get(i) == ESSENTIAL}
    per_dtype = tuple(i for i in coverage if level_of.get(i) in (ESSENTIAL, PER_DTYPE))
    smallest_s, coverage_s = seconds(essential), seconds(set(coverage))
    if budget_s is None:
        return Selection(skip, tier, [], smallest_s, coverage_s, tuple(essential), tuple(coverage), per_dtype,
                         level=level_of)

    def largest(n_max: int, keep: Callable[[int], set[str]]) -> int:
        """The largest n in 0..n_max with fits(keep(n)); keep(0) fits, and fits is monotone in n."""
        lo, hi = 0, n_max
        if fits(keep(hi)):
            return hi
        while hi - lo > 1:                      # keep(lo) fits, keep(hi) does not
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(keep(mid)) else (lo, mid)
        return lo

    n = largest(len(coverage), lambda k: set(coverage[:k])) if coverage_s > room else len(coverage)
    own = {r["id"]: own_cost(r) for r in kept_rows if r["status"] == "ok"}
    shares = {r["id"]: tuple(r.get("shares") or ()) for r in kept_rows if r["status"] == "ok"}
    kept = set(coverage[:n]) | _fill(coverage[n:], set(coverage[:n]), room, seconds, own, shares, level_of)
    why = {i: _over(budget_s, room, costs[i], COVERAGE) for i in coverage if i not in kept}
    later = [i for i in costs if tier.get(i) != COVERAGE]
    # the later tiers buy what tier 0 leaves, whole or not: a tier-0 cell left out did not fit in that room
    # (_fill tried each), and a plan that left it idle ended at 33 s of a quick run's 60 (a cold compile on
    # an AVX2-only EPYC), though the run, reclaiming it, took 54
    for level in (REAL, CONTROL_EXTRA):
        members = sorted((i for i in costs if tier.get(i) == level), key=lambda i: costs[i])
        if level == CONTROL_EXTRA:          # proving the audit works: a small share of the time, at most
            share, total = CONTROL_EXTRA_SHARE * min(room, sum(costs[i] for i in kept)), 0.0
            capped = []
            for i in members:
                total += costs[i]
                if total > share:
                    break
                capped.append(i)
            members = capped
        levels = sorted({costs[i] for i in members})
        base = set(kept)
        m = largest(len(levels), lambda k: base | {i for i in members if k and costs[i] <= levels[k - 1]})
        kept |= {i for i in members if m and costs[i] <= levels[m - 1]}
        if m < len(levels):                  # this tier did not fit whole: later tiers get nothing
            break
    why.update({i: _over(budget_s, room, costs[i], tier[i]) for i in later if i not in kept})
    kept_all = set(with_sets(kept))
    reasons = {row["id"]: row.get("reason") for row in rows}
    for i in candidates:
        if i in kept_all:
            continue
        skip[i] = why[i] if i in costs else not_tried(reasons.get(i), set_cut=keys[i] in measurable)
    covered = {kinds[i] for i in kept}
    uncovered = list(dict.fromkeys(kinds[i] for i in coverage if i not in kept
                                   and kinds[i] not in covered and not kinds[i].endswith("(self-check)")))
    standby = _standby(coverage, kept, costs, tier)
    return Selection(skip, {i: t for i, t in tier.items() if i not in skip}, uncovered, smallest_s, coverage_s,
                     tuple(essential), tuple(coverage), per_dtype, tuple(standby),
                     {i: tier.get(i, REAL) for i in standby}, level_of)


def _standby(coverage: Sequence[str], kept: set[str], costs: dict[str, float], tier: dict[str, int]) -> list[str]:
    """The cells cut for the budget in the order time left over goes to them: tier 0's in the order bought,
    then the others by tier, the cheapest first."""
    return [i for i in coverage if i not in kept] + sorted(
        (i for i in costs if i not in kept and tier.get(i) != COVERAGE), key=lambda i: (tier.get(i, REAL), costs[i]))


def not_tried(predicted_reason: str | None, *, set_cut: bool) -> str:
    """The reason of a cell predicted not to run (a backend the device lacks, torch refusing this machine)
    in an input set where no cell is measured: it is not tried, since trying it would draw the set's
    inputs and build its float64 golden first (4 s at T 2048 on 2 cores) to record what the plan knows.
    set_cut: the set's cells were cut for the budget (else none of them runs at all)."""
    why = ("its input set's cells were cut for the budget" if set_cut else "no cell of its input set is measured")
    return (f"not tried: predicted not to run here ({predicted_reason or 'unknown'}), and {why} (trying it would "
            "build the set's float64 golden for nothing)")


def _too_slow(rows: list[dict], budget_s: float | None, max_cell_s: float | None) -> dict[str, str]:
    """id -> reason of the cells skipped before any tier: predicted over the per-cell limit, or
    predicted too slow for the device (with a budget: the runner would draw its inputs, build its
    golden and warm it up only to skip it; on an AVX2-only CPU, 47 hand-written bf16 cells cost
    200 s of a 10-minute plan that way)."""
    from .costmodel import TOO_SLOW
    skip: dict[str, str] = {}
    for row in rows:
        if row["status"] == "ok" and max_cell_s is not None and own_cost(row) > max_cell_s:
            skip[row["id"]] = (f"predicted {own_cost(row):.1f} s for this cell, over the per-cell limit "
                               f"{max_cell_s:g} s (--max-cell-s)")
        elif row["status"] == "skipped" and row.get("reason") == TOO_SLOW and budget_s is not None:
            skip[row["id"]] = (f"predicted too slow for this device: its warm-up forecasts more than the per-cell "
                               f"limit {max_cell_s:g} s (--max-cell-s), so it is not started")
    return skip


def _tiers(pred: Any, kept_pred: Any, skip: dict[str, str], memo: dict | None) -> tuple[dict, list, dict]:
    """prioritized_tiers of the cells kept (kept_pred: pred less `skip`), worked out once per prediction
    and skip in `memo` (choose's: a plan chooses up to four times on one forecast); the tier map a copy."""
    memo = {} if memo is None else memo
    key = ("tiers", id(pred), frozenset(skip))
    if key not in memo:
        memo[key] = prioritized_tiers(kept_pred)
    tier, coverage, level_of = memo[key]
    return dict(tier), coverage, level_of


def _fill(rest: Sequence[str], kept: set[str], room: float, seconds: Callable[[set[str]], float],
          own: dict[str, float], shares: dict[str, tuple], level_of: dict[str, int]) -> set[str]:
    """The tier-0 cells after the longest prefix that fits (rest) that fit in what the prefix
    leaves: priority level by level, the cheapest first, each weighed as tier 0 buys it (its own
    seconds plus the shared costs, a compile, a golden, a first use, that no cell kept so far pays),
    so the most wants are met (a compile that does not fit, or that fits alone, must not keep
    the cheap cells out); checked once by predicting again (the latest dropped until it fits)."""
    left = room - seconds(kept)
    bought = {group for i in kept for group, _ in shares.get(i, ())}
    extra: list[str] = []

    def added(cell_id: str) -> float:
        return own.get(cell_id, 0.0) + sum(c for g, c in shares.get(cell_id, ()) if g not in bought)

    for level in sorted({level_of.get(i, REST) for i in rest}):
        candidates = [i for i in rest if level_of.get(i, REST) == level]
        while candidates:
            best = min(candidates, key=added)
            cost = added(best)
            if cost > left:
                break
            candidates.remove(best)
            extra.append(best)
            bought.update(g for g, _ in shares.get(best, ()))
            left -= cost
    while extra and seconds(kept | set(extra)) > room:     # shares moved: drop the latest until it fits
        extra.pop()
    return set(extra)


def _over(budget_s: float, room: float, cost: float, level: int) -> str:
    """A planned skip's reason: the budget, what it left for cells, and the cell's tier."""
    which = {COVERAGE: "the cells giving every variant one cell per dtype and mask kind, and every "
                       "negative control its self-check, did not all fit",
             REAL: "given to the cheaper ones, after every variant's first cell per dtype and mask kind",
             CONTROL_EXTRA: "given to every real variant's cells first, as a negative control's cells "
                            f"beyond its self-check (those get at most {CONTROL_EXTRA_SHARE:.0%} of the cells' "
                            "time)"}[level]
    return (f"over the budget: the {format_duration(budget_s)} budget (--budget) leaves {max(room, 0):.0f} s "
            f"for cells, {which}; this one was predicted {cost:.1f} s")


def plan_run(cases: Sequence[Any], preset: Any, run_dir: Path | None, *, budget_s: float | None,
             started_unix: float, measure: bool = True, ceilings_measured: bool | None = None,
             now_unix: float | None = None) -> tuple[Plan, Any, list[str]]:
    """The plan for `cases` (those not yet recorded): prediction, skips, tiers and deadline; also
    the prediction itself and the cost model's notes, for printing.

    A dry-run and the run it previews plan alike: the same ceilings (forecast.machine_ceilings)
    and the same reserve for start-up, ceilings and report. `ceilings_measured`: the run
    measured its ceilings at its start (default: run_dir's run.json has none yet, as before
    a run that will). `now_unix`: a run planning itself (not a dry-run): what it has spent since
    started_unix (start-up, ceilings) is measured, not predicted (overhead.overhead_s's spent_s)."""
    from .forecast import plan as predict
    from ..workload.model import model_audit_unavailable
    from ..workload.variants import has_upstream
    from .overhead import device_kind, model_audit_seconds, shrink_seconds

    forecast = predict(cases, preset, run_dir, measure=measure)
    models = tuple(getattr(preset, "models", ()))
    measured = forecast.ceilings_measured if ceilings_measured is None else ceilings_measured
    host = forecast.host                            # the run's outside-the-cells work scales with it
    kind = device_kind(c.device for c in cases)
    model_s = 0.0 if model_audit_unavailable() else model_audit_seconds(   # none without transformers
        models, list(dict.fromkeys(c.variant for c in cases)), kind, forecast.params, host=host,
        ceilings=next((c for d, c in forecast.ceilings.items() if str(d).split(":")[0] == kind), None))
    spent_s = None if now_unix is None else max(0.0, now_unix - started_unix)
    shrink_s = shrink_seconds(getattr(preset, "shrink_s", 0.0),
                              any(has_upstream(v) for v in dict.fromkeys(c.variant for c in cases)), host)
    memo: dict = {}                     # what choose() works out once for this forecast
    plan, held = _plan(cases, preset, forecast, budget_s=budget_s, started_unix=started_unix,
                       measured=measured, host=host, model_s=model_s, spent_s=spent_s, shrink_s=shrink_s, memo=memo)
    if budget_s is not None and model_s and not held.per_dtype_whole:
        # the model audit comes after a cell of every real variant per dtype (tier 0's levels ESSENTIAL and
        # PER_DTYPE), before the rest: it is left out (a record in model.jsonl says why) where its time buys
        # the cells more of those, or where not even the smallest useful plan fits with it; where they miss as
        # many without it (a compile that fits neither way: a cold quick run on a 2-core EPYC), leaving it
        # out would buy none of them, and it stays
        without, held_without = _plan(cases, preset, forecast, budget_s=budget_s, started_unix=started_unix,
                                      measured=measured, host=host, model_s=0.0, spent_s=spent_s, shrink_s=shrink_s,
                                      memo=memo)
        if held_without.per_dtype > held.per_dtype or not held.smallest_whole:
            plan = without
            plan.model_audit_skip = (f"over the budget: the {format_duration(budget_s)} budget (--budget) does not "
                                     f"hold the model audit (predicted {model_s:.1f} s) after a cell of every real "
                                     "variant per dtype")
    from .costmodel import CostModel
    from .settings import Settings
    kept = forecast.pred[~forecast.pred["id"].isin(plan.skip)] if len(forecast.pred) else forecast.pred
    plan.noise_s, plan.noise_share = CostModel(forecast.params, host=forecast.host).noise_s(
        kept, Settings.of_preset(preset))
    return plan, forecast.pred, forecast.notes


def _plan(cases: Sequence[Any], preset: Any, forecast: Any, *, budget_s: float | None, started_unix: float,
          measured: bool, host: float, model_s: float, spent_s: float | None = None,
          shrink_s: float = 0.0, memo: dict | None = None) -> tuple[Plan, "_Held"]:
    """plan_run's plan with a model audit of model_s seconds (this host's) and shrink_s of shrinking after the
    cells (0: none), and how many of the cells giving every real variant a cell per dtype it keeps (_Held)."""
    from .costmodel import CostModel
    from .settings import Settings
    from .overhead import overhead_s as overhead_of

    def overhead_s(*args: Any, **kwargs: Any) -> tuple[float, float]:     # the model and merge audits after the cells
        return overhead_of(*args, model_audit_s=model_s, canary=bool(preset.noise_target), spent_s=spent_s,
                           merge_audit=merge_state_sets(preset), shrink_s=shrink_s, **kwargs)
    before, after = overhead_s(forecast.pred, forecast.params, ceilings_measured=measured,
                               ceilings_s=preset.ceilings_s, host=host)
    by_id = {c.id: c for c in cases}
    model = forecast.model or CostModel(forecast.params, host=forecast.host)

    def repredict(ids: list[str]) -> Any:
        return model.predict([by_id[i] for i in ids], Settings.of_preset(preset), forecast.ceilings,
                             forecast.free, forecast.warm_compiles, forecast.stored_goldens,
                             headers_built=forecast.headers_built)

    # The report grows with the cells kept: plan against the report of every cell, then once more
    # against the report of the cells that first plan kept (a little more room, never less).
    memo = {} if memo is None else memo
    chosen = choose(forecast.pred, budget_s=budget_s, reserve_s=before + after, max_cell_s=preset.max_cell_s,
                    repredict=repredict, memo=memo)
    kept_n = len(forecast.pred) - len(chosen.skip)
    before_kept, _ = overhead_s(forecast.pred, forecast.params, ceilings_measured=measured,
                                ceilings_s=preset.ceilings_s, host=host, kept=kept_n)
    _, after_kept = overhead_s(forecast.pred[~forecast.pred["id"].isin(chosen.skip)], forecast.params, host=host)
    if budget_s is not None and before_kept + after_kept < before + after:
        before = before_kept
        chosen = choose(forecast.pred, budget_s=budget_s, reserve_s=before + after_kept,
                        max_cell_s=preset.max_cell_s, repredict=repredict, memo=memo)
    skip = chosen.skip

    def reserve(kept_ids: Any) -> tuple[float, float]:
        """(before, after) the cells of a run keeping `kept_ids` (a skip's record for the others)."""
        kept_rows = forecast.pred[forecast.pred["id"].isin(list(kept_ids))]
        first, _ = overhead_s(forecast.pred, forecast.params, ceilings_measured=measured,
                              ceilings_s=preset.ceilings_s, host=host, kept=len(kept_rows))
        return first, overhead_s(kept_rows, forecast.params, host=host)[1]

    kept_ids = set(forecast.pred["id"]) - set(skip)
    before, after = reserve(kept_ids) if budget_s is not None else (before, after)   # the report of what is kept
    predicted = dict(zip(forecast.pred["id"], forecast.pred["total_s"].astype(float)))
    kept = run_order([i for i in predicted if i not in skip], chosen.tier, chosen.level)
    if kept:                # in the order they run, without the cut ones (shared costs move)
        again = repredict(kept)
        predicted.update(zip(again["id"], again["total_s"].astype(float)))
    plan = Plan(budget_s=budget_s,
                deadline_unix=None if budget_s is None else
                started_unix + budget_s - after - max(2.0, SAFETY_FRACTION * budget_s),
                reserve_s=before + after, predicted=predicted, skip=skip, tier=chosen.tier,
                uncovered=chosen.uncovered, started_unix=started_unix, report_s=after,
                smallest_s=None if chosen.smallest_s is None else chosen.smallest_s + sum(reserve(chosen.smallest)),
                coverage_s=None if chosen.coverage_s is None else chosen.coverage_s + sum(reserve(chosen.coverage)),
                measured=int(((forecast.pred["status"] == "ok") & ~forecast.pred["id"].isin(skip)).sum()),
                model_audit_s=model_s, shrink_s=shrink_s, smallest=[i for i in chosen.smallest if i not in skip],
                standby=list(chosen.standby), standby_tier=dict(chosen.standby_tier),
                level={i: lv for i, lv in chosen.level.items() if i not in skip})
    plan.work, plan.groups = _work(forecast.pred, set(kept) | set(chosen.standby)) if chosen.standby else ({}, [])
    return plan, _Held(sum(i not in skip for i in chosen.per_dtype), len(chosen.per_dtype),
                       bool(chosen.smallest) and not any(i in skip for i in chosen.smallest))


@dataclass(frozen=True)
class _Held:
    """Of the cells giving every real variant a cell per dtype (Selection.per_dtype), how many a plan keeps;
    and whether it keeps the smallest useful plan (Selection.smallest) whole."""

    per_dtype: int
    of: int
    smallest_whole: bool

    @property
    def per_dtype_whole(self) -> bool:
        return self.per_dtype == self.of


def _work(pred: Any, ids: set[str]) -> tuple[dict[str, list], list[list]]:
    """(Plan.work, Plan.groups) of the cells `ids`: each cell's own seconds and the shared costs it takes
    part in (costmodel's `shares`), numbered, so the keeper knows what a cell skipped for time would cost
    once others have paid for its golden or its compile."""
    index: dict[str, int] = {}
    groups: list[list] = []
    work: dict[str, list] = {}
    for row in pred[pred["id"].isin(list(ids))].to_dict("records"):
        mine = []
        for group, seconds in row.get("shares") or ():
            name = repr(group)
            if name not in index:
                index[name] = len(groups)
                groups.append([name, float(seconds)])
            mine.append(index[name])
        work[row["id"]] = [own_cost(row), mine]
    return work, groups
