"""The numerics checks of one cell: each a small function of what the cell has measured so far,
returning its record columns. This module registers them and says in which order they run; they
live by family: output.py, gradients.py, lse.py (a returned log-sum-exp), record.py (after timing),
and contract.py says what a call must return.

A check declares what it needs (NEEDS) and measurement.measure_cell runs it as soon as that
exists, in the order of CHECK_ORDER:

- "out": the numerics forward's output (CellState.out), and the variant contract met;
- "grads": the numerics forward+backward's (dq, dk, dv) (CellState.grads; not for a forward-only
  cell, whose gradient checks do not run);
- "golden": the float64 golden and the same-dtype baseline of the cell's input set (CellState.ref);
- "variant": the variant called again (leak probes) or asked for its weights (saturation);
- "record": every column measured before, timing included (the diagnosis reads the verdicts).

Checks needing "grads" run in the gradients phase, those needing "record" after timing, the
others in the numerics phase. Each one's seconds count in its `phase` of the record's phase_s
(core.timesplit.CELL_PHASES). Adding a check is adding a function with @check to its family's
module, its name to CHECK_ORDER where it must run, its columns to core.columns.COLUMNS and a rule
that reads them (analysis.findings).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.grid import Case
from ...core.timesplit import CELL_PHASES
from ...workload.inputs import Inputs
from ...workload.presets import Preset
from ...workload.variant_contract import Variant
from ..cell.cellcache import Reference
from ..golden.reference import Golden

NEEDS: tuple[str, ...] = ("out", "grads", "golden", "variant", "record")
STAGES: tuple[str, ...] = ("output", "gradients", "record")   # when a check runs (Check.stage)


@dataclass
class CellState:
    """What one cell has measured so far, for its checks to read."""

    case: Case
    variant: Variant
    inputs: Inputs
    ref: Reference
    preset: Preset
    fn: Callable[..., Any]                 # the variant's callable for this cell
    q: Any                                 # (B, H, Tq, d) leaves the calls use (requires_grad unless forward-only)
    k: Any                                 # (B, Hkv, Tk, d)
    v: Any
    kwargs: dict[str, Any]                 # mask, causal, score_mod, ... (inputs.call_kwargs())
    out: Any = None                        # (B, H, Tq, d) the numerics forward's output, detached
    lse: Any = None                        # (B, H, Tq) its log-sum-exp, for a variant returning one, detached
    lse_loss_grads: tuple | None = None    # (dq, dk) through the lse alone (the lse_grads check)
    merged: Any = None                     # (B, H, Tq, d) float64 its halves' merge (the lse_merge check)
    grads: tuple | None = None             # (dq, dk, dv[, dsinks]) of the numerics forward+backward
    columns: dict[str, Any] = field(default_factory=dict)   # the record's measured columns so far
    paged_call: Any = None                 # workload.varlen.PagedCall of a paged variant in a paged cell, or None
    grad_evidence: Any = None              # diagnosis.GradEvidence of gradients no backward mistake matched, or None
    probe_memo: dict | None = None         # the run's argument probes of compiled variants (cellcache.BuildCache)

    @property
    def golden(self) -> Golden:
        return self.ref.golden

    def settle_if_incomplete(self) -> None:
        """After a call a check reads at once: nothing here; a measured cell waits for work its
        variant left running once the referee found it does (measurement._Cell)."""


@dataclass(frozen=True)
class Check:
    name: str
    needs: frozenset[str]
    phase: str                              # core.timesplit.CELL_PHASES: where its seconds count
    fn: Callable[[CellState], dict[str, Any]]
    when: Callable[[CellState], bool] | None = None   # runs (and is timed) only where this holds

    @property
    def stage(self) -> str:
        """STAGES: after timing when it reads the record, else once its tensors exist."""
        if "record" in self.needs:
            return "record"
        return "gradients" if "grads" in self.needs else "output"


# The order the checks run in, within each stage (Check.stage): what a later check reads, an earlier one
# wrote (grad_budget reads nonfinite_grads' columns, grad_forward_diagnosis the diagnosis), and a cell's
# reason joins their notes in this order. Explicit, so where the checks are defined, and the order their
# modules are imported in, cannot change it; a check is registered under one of these names only.
CHECK_ORDER: tuple[str, ...] = (
    # the output
    "nonfinite_out", "error_budget", "masked_rows", "leak", "cross_document", "paged_reads", "arguments",
    "batch_invariance", "chunk_invariance", "causal_alignment",
    # the gradients
    "nonfinite_grads", "grad_errors", "grad_budget", "grad_diagnosis", "sink_grad",
    # the log-sum-exp
    "lse_error", "lse_merge", "lse_shards", "lse_grads", "lse_diagnosis", "lse_grad_diagnosis",
    # after timing
    "saturation", "diagnosis", "grad_forward_diagnosis",
)

CHECKS: dict[str, Check] = {}


def check(name: str, *, needs: tuple[str, ...], phase: str = "numerics",
          when: Callable[[CellState], bool] | None = None) -> Callable[[Callable], Callable]:
    """Register a numerics check: fn(CellState) -> {column: value}; `when`: the cells it applies to
    (default all)."""
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"check {name!r}: unknown needs {sorted(unknown)}; allowed: {', '.join(NEEDS)}")
    if phase not in CELL_PHASES:
        raise ValueError(f"check {name!r}: phase {phase!r} is not one of {', '.join(CELL_PHASES)}")
    if name not in CHECK_ORDER:
        raise ValueError(f"check {name!r} is not in CHECK_ORDER: add it where it must run")

    def register(fn: Callable) -> Callable:
        CHECKS[name] = Check(name, frozenset(needs), phase, fn, when)
        return fn
    return register


def ordered_checks() -> list[Check]:
    """Every check in CHECK_ORDER; one not registered (its module not imported) is an error, not a
    check silently skipped."""
    missing = [name for name in CHECK_ORDER if name not in CHECKS]
    if missing:
        raise RuntimeError(f"checks in CHECK_ORDER but not registered: {', '.join(missing)}")
    return [CHECKS[name] for name in CHECK_ORDER]


def run_checks(stage: str, cell: CellState, phases: Any) -> None:
    """Every check of `stage`, in CHECK_ORDER, each timed in its phase; columns into the cell."""
    for c in ordered_checks():
        if c.stage == stage and (c.when is None or c.when(cell)):
            with phases(c.phase):
                cell.columns.update(c.fn(cell))


# --------------------------------------------------------------------------- what the checks share

def baseline_ratio(err: float, base: float | None) -> float | None:
    """An error over the same-dtype baseline's (None where the baseline is not a positive number)."""
    return err / base if base and math.isfinite(base) and base > 0 else None


def reason_with(cell: CellState, note: str) -> str:
    """The cell's reason so far with `note` after it."""
    return "; ".join(filter(None, [cell.columns.get("reason"), note]))
