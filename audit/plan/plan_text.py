"""The plan in words, for the console and --dry-run: what it measures and skips, the variant ×
dtype × mask kinds left without a cell, the smallest useful plan and the --budget each needs, and
the predicted wall time per phase and per variant (summary)."""
from __future__ import annotations

from typing import Any

from ..core.units import format_budget, format_duration
from .budget import Plan
from .tiers import PRIORITY_NAMES

UNCOVERED_SHOWN = 8      # the plan line names this many uncovered kinds, then counts the rest


NOISE_SAID_S = 1.0     # the plan's line names the noise's cost from this many seconds


def describe(plan: Plan, n_cells: int) -> str:
    """One line for the console: what the plan measures and what it skips, and which variant ×
    dtype × mask kinds the budget left without a cell."""
    # the cells the budget or the per-cell limit cut: plan.skip also holds cells that would not be
    # measured anyway (a control left alone in its input set, say), which no budget decides
    cut = [i for i, why in plan.skip.items() if why.startswith("over the budget") or "over the per-cell limit" in why]
    skipped = len(cut)
    skipped_s = sum(plan.predicted.get(i, 0.0) for i in cut)
    budget = "no budget" if plan.budget_s is None else f"budget {format_duration(plan.budget_s)}"
    outside = outside_words(plan)
    line = (f"plan: {n_cells - skipped} cells predicted {format_duration(plan.predicted_total())} "
            f"(+ {format_duration(plan.reserve_s)} {outside}), {budget}")
    if skipped:
        line += (f"; {skipped} cells skipped (predicted {format_duration(skipped_s)}): "
                 "listed in the report under Time budget")
    if plan.noise_s >= NOISE_SAID_S:
        shares = ", ".join(f"{dev} {share:.0%}" for dev, share in sorted(plan.noise_share.items()))
        line += (f"; {format_duration(plan.noise_s)} of it samples beyond the minimum to know each median "
                 f"(--noise-target), at the share of --noise-cap-s a measurement uses here ({shares})")
    if plan.measured == 0 and plan.budget_s is not None and plan.smallest_s:
        return (f"plan: nothing fits the {format_duration(plan.budget_s)} budget (--budget): "
                f"{format_duration(plan.reserve_s)} of it goes to {outside_words(plan)}, and the smallest "
                f"useful plan ({PRIORITY_NAMES[0]}) needs {format_duration(plan.smallest_s)}: "
                f"--budget {budget_arg(plan.smallest_s)} measures that, --budget {budget_arg(plan.coverage_s)} "
                "a cell of every variant per dtype and mask kind; every cell is recorded as skipped with its reason")
    if plan.uncovered:
        shown = ", ".join(plan.uncovered[:UNCOVERED_SHOWN])
        more = len(plan.uncovered) - UNCOVERED_SHOWN
        line += (f"; too small a budget to give every variant one cell per dtype and mask kind: no cell for "
                 f"{shown}" + (f" and {more} more" if more > 0 else ""))
        if plan.coverage_s:
            line += f" (--budget {budget_arg(plan.coverage_s)} gives each one)"
    return line


def outside_words(plan: Plan) -> str:
    """What the plan's reserve holds besides the cells, in words: "start-up, ceilings, shrinking and report"."""
    parts = ["start-up", "ceilings", *(["model audit"] if plan.model_audit_s else []),
             *(["shrinking"] if getattr(plan, "shrink_s", 0.0) else [])]
    return ", ".join(parts) + " and report"


def smallest_plan_line(plan: Plan) -> str | None:
    """The smallest useful plan and full coverage, for --dry-run (None without them)."""
    if not plan.smallest_s or not plan.coverage_s:
        return None
    return (f"smallest useful plan ({PRIORITY_NAMES[0]}): {format_duration(plan.smallest_s)} "
            f"(--budget {budget_arg(plan.smallest_s)}); a cell of every variant per dtype and mask kind, and the "
            f"controls' self-checks: {format_duration(plan.coverage_s)} (--budget {budget_arg(plan.coverage_s)})")


def budget_arg(seconds: float | None) -> str:
    """A --budget value at least `seconds` (core.units.format_budget), "none" without a number."""
    return format_budget(seconds) or "none"


def model_audit_line(plan: Plan, models: tuple[str, ...]) -> str | None:
    """What the plan does with the preset's model audit, for --dry-run (None: no model asked for)."""
    if not models:
        return None
    from ..workload.model import model_audit_unavailable
    names = ", ".join(models)
    if plan.model_audit_skip:
        return f"model audit ({names}): left out: {plan.model_audit_skip}"
    if unavailable := model_audit_unavailable():
        return f"model audit ({names}): unavailable: {unavailable}"
    return f"model audit ({names}): after the cells, predicted {format_duration(plan.model_audit_s)}"


def summary(pred: Any, reserve_s: float | None = None) -> str:
    """Predicted seconds per phase and per variant, and the total, for --dry-run; reserve_s: the
    seconds outside the cells (the plan's reserve_s; default: plan.overhead's defaults)."""
    from .costmodel import PHASES
    from .overhead import overhead_s
    overhead = sum(overhead_s(pred)) if reserve_s is None else reserve_s
    total = float(pred["total_s"].sum()) + overhead
    lines = [f"predicted wall time: {format_duration(total)} for {len(pred)} cells "
             f"({int((pred['status'] == 'ok').sum())} measured, "
             f"{int((pred['status'] == 'skipped').sum())} skipped, "
             f"{int((pred['status'] == 'oom').sum()) if 'oom' in set(pred['status']) else 0} oom)",
             "  per phase: " + ", ".join(f"{p} {format_duration(float(pred[p].sum()))}" for p in PHASES)
             + f"; start-up, ceilings and report about {format_duration(overhead)}"]
    per_variant = pred.groupby("variant", sort=False)["total_s"].sum().sort_values(ascending=False)
    lines.append("  per variant: " + ", ".join(f"{v} {format_duration(float(s))}" for v, s in per_variant.items()))
    return "\n".join(lines)
