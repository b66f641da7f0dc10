"""The budget's tiers: what a plan buys first (tier 0: a cell of every variant per device × dtype × mask
kind, each negative control's self-check, the invariance cells, in priority levels), then the real
variants' other cells, then the controls'; what a cell costs as the budget weighs it, and the order a
run measures its cells in. plan/budget.py chooses what fits; plan/keeper.py keeps to it.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..core.dtypes import widest_dtype

COVERAGE, REAL, CONTROL_EXTRA = 0, 1, 2     # the tiers: what the budget buys first, then, last
TIER_NAMES = {COVERAGE: "coverage and self-check", REAL: "real variants' other cells",
              CONTROL_EXTRA: "negative controls' other cells"}
# Within tier 0, what a budget too small for all of it buys first: a cell of each ESSENTIAL variant in
# every device × dtype (the verdict's yardstick, sdpa, and the hand-written reference: the smallest
# useful plan), then each negative control's self-check (what proves the audit catches what it claims
# to: some 0.2 s a control), then a cell of every other real variant per device × dtype, then the rest
# (a cell per mask kind, the invariance cells). Cheapest first within each. The self-checks come before
# the other variants: a cold quick run on a 2-core AVX2-only EPYC bought Inductor's first compile (13-20 s)
# and had no time left for any of its 34 controls (they ran only when cells ran faster than predicted).
ESSENTIAL_VARIANTS: tuple[str, ...] = ("sdpa", "eager")
PRIORITY_NAMES = ("sdpa and eager, a cell per dtype", "the controls' self-checks",
                  "every real variant, a cell per dtype", "a cell per mask kind, the invariance cells")
ESSENTIAL, SELF_CHECKS, PER_DTYPE, REST = range(len(PRIORITY_NAMES))   # the levels, by PRIORITY_NAMES


def cell_cost(row: Any) -> float:
    """A cell's predicted seconds as the budget weighs it: its own, plus its share of what it
    pays for together with other cells (start-up, its input set's golden, compiled code:
    costmodel's amortized_s), so a cell whose compile nobody else uses carries that compile."""
    if "amortized_s" in row and row["amortized_s"] == row["amortized_s"]:
        return float(row["amortized_s"])
    return own_cost(row)


def own_cost(row: Any) -> float:
    """A cell's predicted seconds without anything it pays for together with other cells
    (start-up, its input set's golden, compiled code): its own warm-up, timed calls and
    checks. The per-cell limit (--max-cell-s) weighs this, as the runner's rule weighs the
    timed calls the warm-up forecasts (measure.cell.measurement): a compile is paid once whichever
    cell pays it, so it never makes one cell too slow to measure. Weighed with it,
    FlexAttention's first cell (6.5 s, nearly all compile, on 2 cores of an AMD EPYC with
    AVX-512) was skipped under the quick preset's 5 s and the preset measured no FlexAttention."""
    return float(row["total_s"]) - float(row.get("shared_s", 0.0) or 0.0)


def coverage_kind(row: Any) -> str | None:
    """A prediction row's coverage kind (workload.inputs.coverage_kind): what tier 0 buys one
    cell of."""
    from ..workload.inputs import coverage_kind as kind_of
    return kind_of(str(row["variant"]), str(row["device"]), str(row["dtype"]), str(row["scenario"]),
                   bool(row["causal"]))


def _reveals(variant: str) -> tuple[str, ...] | None:
    """The scenarios a negative control's defect shows in (() any), None for a real variant."""
    from ..workload.variant_contract import BROKEN_PREFIX
    from ..workload.variants import builtin_variants
    if not variant.startswith(BROKEN_PREFIX):
        return None
    builtin = builtin_variants().get(variant)
    return tuple(getattr(builtin, "reveals", ()) or ())


def _self_check_candidates(rows: list[dict], control: str, reveals: tuple[str, ...]) -> dict[str, list[str]]:
    """A negative control's self-check candidates, per causal flag: its cells of the first scenario
    it declares (Variant.reveals) that the grid has (any scenario where it declares none, or where
    the grid has none of them), the widest registered dtype's where there are any (fp32, core/dtypes.py:
    its diagnosis, against float64, is sharpest there): the plan buys the cheapest of each, so it is
    flagged and diagnosed twice."""
    cells = [r for r in rows if r["variant"] == control]
    scenarios = [s for s in reveals if any(r["scenario"] == s for r in cells)]
    if scenarios:
        cells = [r for r in cells if r["scenario"] == scenarios[0]]
    widest = widest_dtype()
    if any(r["dtype"] == widest for r in cells):
        cells = [r for r in cells if r["dtype"] == widest]
    out: dict[str, list[str]] = {}
    for r in cells:
        out.setdefault(f"control:{control}:{bool(r['causal'])}", []).append(r["id"])
    return out


def tiers(pred: Any) -> tuple[dict[str, int], list[str]]:
    """({id: tier} of the cells predicted to run, [ids of tier 0 in the order they are bought]).
    (prioritized_tiers: the same, with each tier-0 cell's priority level.)"""
    tier, chosen, _level = prioritized_tiers(pred)
    return tier, chosen


def prioritized_tiers(pred: Any) -> tuple[dict[str, int], list[str], dict[str, int]]:
    """({id: tier}, [tier-0 ids in the order bought], {tier-0 id: priority level, PRIORITY_NAMES}).

    Tier 0 is chosen greedily, the cheapest wants first: per coverage kind, a cell of it (of
    scenario normal for no mask and causal, where the grid has one: the cells the verdict times
    them on) together with the verdict's yardstick (VERDICT_BASELINE) on the same inputs, so the
    verdict can compare it; per negative control, its self-check cells (_self_check_candidates); per
    real variant and device, a cell where batch and chunk invariance are checked (_invariance_candidates).
    Each time the candidate whose own seconds plus the shared costs not yet bought (costmodel
    `shares`: its input set's golden, its compile, a backend's first use) are least, priority level
    by level (PRIORITY_NAMES): first a cell of each ESSENTIAL variant per device × dtype (normal
    inputs where there are any), then the controls' self-checks, then a cell of every other real
    variant per device × dtype, then the rest; a want a cell bought already meets costs nothing more.
    A budget too small for tier 0 keeps its first cells (choose), so it covers the essential
    variants before the others, the controls' self-checks before a compile, and every variant before
    the other mask kinds (a cold quick run on a 2-core EPYC had none of its 34 controls' self-checks)."""
    from ..core.grid import INPUT_AXES
    from ..workload.variants import VERDICT_BASELINE
    ok = pred[pred["status"] == "ok"]
    rows = list(ok.to_dict("records"))
    own = {r["id"]: float(r["total_s"]) - float(r.get("shared_s") or 0.0) for r in rows}
    shares = {r["id"]: tuple(r.get("shares") or ()) for r in rows}
    baseline = {tuple(r.get(a) for a in INPUT_AXES): r["id"] for r in rows if r["variant"] == VERDICT_BASELINE}
    partner = {r["id"]: baseline.get(tuple(r.get(a) for a in INPUT_AXES)) for r in rows}
    bought: set = set()
    tier: dict[str, int] = {}

    def bundle(cell_id: str) -> list[str]:
        """The cell and, not yet bought, its yardstick on the same inputs."""
        mate = partner.get(cell_id)
        return [cell_id] + ([mate] if mate and mate != cell_id and tier.get(mate) != COVERAGE else [])

    def added(cell_id: str) -> float:
        ids = bundle(cell_id)
        groups = {group: cost for i in ids for group, cost in shares[i] if group not in bought}
        return sum(own[i] for i in ids) + sum(groups.values())

    wanted: dict[str, list[str]] = {}          # coverage kind or "control:<name>:<causal>" -> candidate ids
    controls: dict[str, tuple[str, ...]] = {}
    for r in rows:
        kind = coverage_kind(r)
        reveals = _reveals(str(r["variant"]))
        tier[r["id"]] = REAL if reveals is None else CONTROL_EXTRA
        if kind is not None:
            wanted.setdefault(kind, []).append(r["id"])
        elif reveals is not None:
            controls[str(r["variant"])] = reveals
    scenario = {r["id"]: r["scenario"] for r in rows}
    for kind, ids in wanted.items():            # no mask and causal: on normal inputs where there are any
        normal = [i for i in ids if scenario[i] == "normal"]
        if normal and not kind.endswith(" key padding"):
            wanted[kind] = normal
    self_checks: dict[str, list[str]] = {}
    for control, reveals in controls.items():
        self_checks.update(_self_check_candidates(rows, control, reveals))
    wanted.update(_invariance_candidates(rows))
    levels = {ESSENTIAL: _per_dtype_candidates(rows, lambda v: v in ESSENTIAL_VARIANTS),
              SELF_CHECKS: self_checks,
              PER_DTYPE: _per_dtype_candidates(rows, lambda v: v not in ESSENTIAL_VARIANTS and _reveals(v) is None),
              REST: wanted}
    chosen: list[str] = []
    level_of: dict[str, int] = {}
    for level, wants in sorted(levels.items()):
        while wants:
            wants = {k: ids for k, ids in wants.items() if not any(tier.get(i) == COVERAGE for i in ids)}
            if not wants:
                break
            kind = min(wants, key=lambda k: min(added(i) for i in wants[k]))
            best = min(wants.pop(kind), key=added)
            for cell_id in bundle(best):
                chosen.append(cell_id)
                level_of[cell_id] = level
                bought.update(group for group, _ in shares[cell_id])
                tier[cell_id] = COVERAGE
    return tier, chosen, level_of


def _per_dtype_candidates(rows: list[dict], which: Callable[[str], bool]) -> dict[str, list[str]]:
    """Per variant `which` takes, device and dtype: its cells there, those of scenario normal where it
    has any (the verdict's speed cells)."""
    out: dict[str, list[str]] = {}
    for r in rows:
        if which(str(r["variant"])):
            out.setdefault(f"{r['variant']} {r['device']} {r['dtype']}", []).append(r)
    return {key: [r["id"] for r in cells if r["scenario"] == "normal"] or [r["id"] for r in cells]
            for key, cells in out.items()}


def _invariance_candidates(rows: list[dict]) -> dict[str, list[str]]:
    """Per real variant and device, its cells where the invariance checks apply
    (workload.inputs.invariance_applies), those with both checks if it has any: tier 0 buys one, so
    every variant's batch and chunk invariance is recorded however tight the budget."""
    from ..core.grid import Case
    from ..workload.inputs import invariance_applies
    out: dict[str, list[str]] = {}
    both: dict[str, list[str]] = {}
    for r in rows:
        if _reveals(str(r["variant"])) is not None:
            continue
        batch, chunk = invariance_applies(Case.from_mapping(r))
        key = f"{r['variant']} {r['device']} invariance"
        if batch:
            out.setdefault(key, []).append(r["id"])
        if batch and chunk:
            both.setdefault(key, []).append(r["id"])
    return {key: both.get(key) or ids for key, ids in out.items()}


def run_order(ids: Sequence[str], tier: dict[str, int], level: dict[str, int] | None = None) -> list[str]:
    """The order a run measures its cells in: tier 0 (a cell of every variant per dtype and mask
    kind, each control's self-check) first, by priority level (`level`: PRIORITY_NAMES, tier 0's cells
    without one last), then the rest, each in grid order. A run that falls behind, or is stopped, has
    covered every variant by then, and what it missed is of the lowest priority: in grid order a cold quick
    run on a 2-core EPYC compiled first, its compiles took twice their predictions, and the keeper then cut
    24 of its 34 controls' self-checks, which came later in the grid."""
    level = level or {}
    return sorted(ids, key=lambda i: (tier.get(i) != COVERAGE, level.get(i, REST + 1) if tier.get(i) == COVERAGE else 0))
