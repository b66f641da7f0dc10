"""The numerics checks of one cell: each a small function of what the cell has measured so far,
returning its record columns.

A check declares what it needs (NEEDS) and measurement.measure_cell runs it as soon as that
exists, in the order checks are registered:

- "out": the numerics forward's output (CellState.out), and the variant contract met;
- "grads": the numerics forward+backward's (dq, dk, dv) (CellState.grads; not for a forward-only
  cell, whose gradient checks do not run);
- "golden": the float64 golden and the same-dtype baseline of the cell's input set (CellState.ref);
- "variant": the variant called again (leak probes) or asked for its weights (saturation);
- "record": every column measured before, timing included (the diagnosis reads the verdicts).

Checks needing "grads" run in the gradients phase, those needing "record" after timing, the
others in the numerics phase. Each one's seconds count in its `phase` of the record's phase_s
(core.timesplit.CELL_PHASES). Adding a check is adding a function here with @check, its columns
to core.records.COLUMNS and a rule that reads them (analysis.findings).
"""
from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..core.defects import grad_outside_budget, numerics_defect
from ..core.grid import Case
from ..core.timesplit import CELL_PHASES
from ..workload.inputs import TORCH_DTYPES, Inputs
from ..workload.presets import Preset
from ..workload.variants import Variant
from .cellcache import Reference
from .numerics import (GRAD_BUDGET_FACTOR, GRADIENTS, SaturationAccumulator, changed_max, classify_masked_rows,
                       error_vs_reference, nonfinite_counts, relative_error, within_budget)
from .reference import Golden, golden_prob_chunks

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
    grads: tuple | None = None             # (dq, dk, dv) of the numerics forward+backward
    columns: dict[str, Any] = field(default_factory=dict)   # the record's measured columns so far

    @property
    def golden(self) -> Golden:
        return self.ref.golden


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

    def register(fn: Callable) -> Callable:
        CHECKS[name] = Check(name, frozenset(needs), phase, fn, when)
        return fn
    return register


def run_checks(stage: str, cell: CellState, phases: Any) -> None:
    """Every registered check of `stage`, in order, each timed in its phase; columns into the cell."""
    for c in CHECKS.values():
        if c.stage == stage and (c.when is None or c.when(cell)):
            with phases(c.phase):
                cell.columns.update(c.fn(cell))


# --------------------------------------------------------------------------- the output

@check("nonfinite_out", needs=("out", "golden"))
def nonfinite_out(cell: CellState) -> dict[str, Any]:
    """NaN/inf in the output, and in the rows that see a key (where the golden is finite)."""
    import torch
    out = cell.out
    nan, inf = nonfinite_counts([out])
    seeing = cell.ref.row_visible.expand(out.shape[:-1])                           # (B, H, Tq)
    return {"out_nan": nan, "out_inf": inf,
            "out_nonfinite_visible": int((~torch.isfinite(out) & seeing[..., None]).sum())}


@check("error_budget", needs=("out", "golden"))
def error_budget(cell: CellState) -> dict[str, Any]:
    """Error against the float64 golden on the rows that see a key, and the budget's verdict."""
    m = error_vs_reference(cell.ref.take(cell.out), cell.golden.out, cell.golden.row_visible)
    base = cell.ref.baseline_rmse
    m["err_ratio"] = m["rmse"] / base if base and math.isfinite(base) and base > 0 else None
    m["within_budget"] = within_budget(m["rmse"], base, cell.case.dtype)
    return m


@check("masked_rows", needs=("out", "golden"))
def masked_rows(cell: CellState) -> dict[str, Any]:
    """What the variant returns on rows that see no key: nan, zero, uniform, other or mixed."""
    return {"masked_rows": classify_masked_rows(cell.out, ~cell.ref.row_visible, cell.inputs.v)}


@check("leak", needs=("out", "golden", "variant"), phase="leak")
def leak(cell: CellState) -> dict[str, Any]:
    """Largest output change on rows that must not see the keys and values the probes change.
    The calls keep the timed calls' grad mode and requires_grad, so compiled code is reused."""
    grad = cell.q.requires_grad
    probes = cell.ref.leak_probes
    if not probes:
        return {"leak_max_change": None}

    def forward_with(k2: Any, v2: Any) -> Any:
        return cell.fn(cell.q, k2.detach().requires_grad_(grad), v2.detach().requires_grad_(grad),
                       **cell.kwargs).detach()
    return {"leak_max_change": max(changed_max(cell.out, forward_with(k2, v2), rows)
                                   for k2, v2, rows in probes)}


@check("causal_alignment", needs=("out", "golden"))
def causal_alignment(cell: CellState) -> dict[str, Any]:
    """Which causal alignment the output follows when q_len != kv_len."""
    if not cell.ref.by_alignment:
        return {}
    return {"causal_alignment": alignment_of(cell.ref.take(cell.out), cell.ref.by_alignment["top-left"],
                                             cell.ref.by_alignment["bottom-right"]),
            "golden_alignment": cell.ref.alignment}


def alignment_of(out: Any, top_left: Golden, bottom_right: Golden) -> str:
    """Which causal alignment the output follows: top-left, bottom-right or neither."""
    err_tl = error_vs_reference(out, top_left.out, top_left.row_visible)["rel_err"]
    err_br = error_vs_reference(out, bottom_right.out, bottom_right.row_visible)["rel_err"]
    close = 0.05
    if err_tl <= close and (err_tl < err_br or not math.isfinite(err_br)):
        return "top-left"
    if err_br <= close and (err_br < err_tl or not math.isfinite(err_tl)):
        return "bottom-right"
    return "neither"


# --------------------------------------------------------------------------- the gradients

@check("nonfinite_grads", needs=("grads",))
def nonfinite_grads(cell: CellState) -> dict[str, Any]:
    nan, inf = nonfinite_counts(cell.grads)
    return {"grad_nan": nan, "grad_inf": inf}


@check("grad_errors", needs=("grads", "golden"))
def grad_errors(cell: CellState) -> dict[str, Any]:
    """Relative Frobenius error of dq, dk and dv against the float64 golden's gradients."""
    ref, golden = cell.ref, cell.golden
    return {f"{g}_err": relative_error(take(got), want)
            for g, got, want, take in zip(GRADIENTS, cell.grads,
                                             (golden.dq, golden.dk, golden.dv), (ref.take, ref.take_kv, ref.take_kv))}


@check("grad_budget", needs=("grads", "golden"))
def grad_budget(cell: CellState) -> dict[str, Any]:
    """Each gradient's RMSE against the golden's over the same-dtype baseline's, and its verdict
    (numerics.GRAD_BUDGET_FACTOR). Not judged (null) where the gradients are not finite (the
    nonfinite check's finding) or the baseline's are not."""
    out: dict[str, Any] = {f"{g}_{col}": None for g in GRADIENTS for col in ("err_ratio", "within_budget")}
    base = cell.ref.baseline_grad_rmse
    if base is None or cell.columns.get("grad_nan") or cell.columns.get("grad_inf"):
        return out
    for g, rmse in grad_rmse(cell.grads, cell.ref).items():
        b = base[g]
        out[f"{g}_err_ratio"] = rmse / b if b and math.isfinite(b) and b > 0 else None
        out[f"{g}_within_budget"] = within_budget(rmse, b, cell.case.dtype, GRAD_BUDGET_FACTOR[g])
    return out


def grad_rmse(grads: tuple, ref: Reference) -> dict[str, float]:
    """{dq, dk, dv: RMSE against the golden's gradient} on the golden's slices (every row and key:
    a row that sees no key has no upstream gradient, so 0 in both)."""
    golden = ref.golden
    return {g: error_vs_reference(take(got), want)["rmse"]
            for g, got, want, take in zip(GRADIENTS, grads, (golden.dq, golden.dk, golden.dv),
                                          (ref.take, ref.take_kv, ref.take_kv))}


@check("grad_diagnosis", needs=("grads", "golden"), phase="diagnosis",
       when=lambda cell: grad_outside_budget(cell.columns))
def grad_diagnosis(cell: CellState) -> dict[str, Any]:
    """The known backward mistake the gradients match (measure.diagnosis), for cells whose
    gradients are outside their budget; a failing diagnosis keeps the cell, with a reason."""
    from .diagnosis import diagnose_grads_cell
    try:
        return diagnose_grads_cell(cell.grads, cell.inputs, cell.ref, cell.case.dtype)
    except Exception as exc:  # noqa: BLE001
        m = cell.columns
        return {"reason": "; ".join(filter(None, [m.get("reason"), f"gradient diagnosis failed: {failure_reason(exc)}"]))}


# --------------------------------------------------------------------------- after timing

@check("saturation", needs=("golden", "variant", "record"), phase="saturation",
       when=lambda cell: cell.variant.probs is not None)
def saturation(cell: CellState) -> dict[str, Any]:
    """Saturation, underflow and leaked mass from the variant's own attention weights (a variant
    without Variant.probs gets the golden's saturation: measurement's derived columns)."""
    return variant_weight_metrics(cell.variant, cell.inputs, cell.ref, cell.q.detach(), cell.k.detach())


def variant_weight_metrics(variant: Variant, inputs: Inputs, ref: Reference, q: Any, k: Any) -> dict[str, Any]:
    """Saturation, underflow and leaked mass from the variant's own attention weights, on the
    golden's (batch, head) slices (all of them unless golden_subset says otherwise)."""
    import torch

    q, k = ref.take(q), ref.take_kv(k)                                           # (B|1, H|k, Tq, d)
    mask, visible = ref.take(inputs.mask), ref.take(inputs.visible)
    with torch.no_grad():
        probs = variant.probs(q, k, mask=mask, causal=inputs.causal,
                              score_mod=inputs.score_mod)                         # (B, H, Tq, Tk)
    sat = SaturationAccumulator()
    zero_where_golden_positive = golden_positive = 0
    leaked = None
    for r0, r1, gold, vis in golden_prob_chunks(q, k, causal=inputs.causal, visible=visible,
                                                score_mod=inputs.score_mod):
        p = probs[:, :, r0:r1].double()                                          # (B, H, rows, Tk)
        visx = None if vis is None else vis.expand_as(p)
        sat.add(p, visx)
        positive = gold > 0
        golden_positive += int(positive.sum())
        zero_where_golden_positive += int(((p == 0) & positive).sum())
        if visx is not None:
            seeing = visx.any(-1, keepdim=True)
            mass = torch.where(~visx & seeing, p, torch.zeros_like(p)).sum(-1)   # (B, H, rows)
            leaked = mass.amax() if leaked is None else torch.maximum(leaked, mass.amax())
    m = sat.result()
    m["underflow_frac"] = zero_where_golden_positive / golden_positive if golden_positive else None
    m["leak_mass"] = None if leaked is None else float(leaked)
    m["saturation_source"] = "variant"
    return m


@check("diagnosis", needs=("out", "golden", "record"), phase="diagnosis",
       when=lambda cell: numerics_defect(cell.columns))
def diagnosis(cell: CellState) -> dict[str, Any]:
    """The known mistake a defective output matches (measure.diagnosis), for the cells an error
    finding about numerics covers; if the audit's own diagnosis fails, the cell keeps its
    measurements and its reason says so (a diagnosis is an explanation, not a measurement)."""
    from .diagnosis import diagnose_cell
    try:
        return diagnose_cell(cell.out, cell.inputs, cell.ref, cell.case.dtype, cell.ref.baseline_rmse)
    except Exception as exc:  # noqa: BLE001
        m = cell.columns
        return {"reason": "; ".join(filter(None, [m.get("reason"), f"diagnosis failed: {failure_reason(exc)}"]))}


# --------------------------------------------------------------------------- the contract, and failures

class ContractError(Exception):
    """A variant returned something other than attention's output (docs/variants.md)."""


def check_output(out: Any, q: Any, v: Any) -> None:
    """The variant contract: a tensor of shape (B, H, Tq, d_v), q's dtype, on q's device."""
    import torch
    expected = (*q.shape[:-1], v.shape[-1])
    want = f"a tensor of shape {tuple(expected)}, dtype {_dtype_name(q.dtype)}, on {q.device}"
    if not isinstance(out, torch.Tensor):
        raise ContractError(f"the variant returned {type(out).__name__}"
                            f"{'' if out is None else ' ' + repr(out)[:60]}; expected {want}")
    problems = []
    if tuple(out.shape) != tuple(expected):
        problems.append(f"shape {tuple(out.shape)}")
    if out.dtype != q.dtype:
        problems.append(f"dtype {_dtype_name(out.dtype)}")
    if out.device != q.device:
        problems.append(f"device {out.device}")
    if problems:
        raise ContractError(f"the variant returned a tensor of {', '.join(problems)}; expected {want}")


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    return next((short for short, long in TORCH_DTYPES.items() if long == name), name)


def failure_reason(exc: BaseException) -> str:
    """`Type: first line of message (at file:line in function)`, short enough for a table.
    A broken variant contract is the variant's fault, not a place in the audit: no location."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, ContractError):
        return first[:400]
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {first}"[:400] + where
