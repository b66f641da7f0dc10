"""The checks of the gradients (measure/checks/registry.py: CHECK_ORDER): non-finite values, each
gradient's error and budget against the float64 golden's, the backward mistake they match, the sinks'
gradient."""
from __future__ import annotations

from typing import Any

from ...core.defects import grad_outside_budget
from ..cell.cellcache import Reference
from ..cell.failures import failure_reason
from ..golden.numerics import (GRAD_BUDGET_FACTOR, GRADIENTS, error_vs_reference, nonfinite_counts, relative_error,
                               small_sample_factor, within_budget)
from .registry import CellState, baseline_ratio, check, reason_with


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
        out[f"{g}_err_ratio"] = baseline_ratio(rmse, b)
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
    """The known backward mistake the gradients match (measure.diagnosis.diagnosis), for cells whose
    gradients are outside their budget; a failing diagnosis keeps the cell, with a reason."""
    from ..diagnosis.diagnosis import diagnose_grads_cell
    try:
        columns, evidence = diagnose_grads_cell(cell.grads[:3], cell.inputs, cell.ref, cell.case.dtype)
    except Exception as exc:  # noqa: BLE001
        return {"reason": reason_with(cell, f"gradient diagnosis failed: {failure_reason(exc)}")}
    if columns["grad_diagnosis"] == "none":
        cell.grad_evidence = evidence       # the forward's mistake is tried once it is known (grad_forward_diagnosis)
    return columns


@check("sink_grad", needs=("grads", "golden"), when=lambda cell: len(cell.grads) > 3)
def sink_grad(cell: CellState) -> dict[str, Any]:
    """The sinks' gradient (H,) against the golden's: relative error, ratio to the same-dtype
    baseline's RMSE and its verdict (factor GRAD_BUDGET_FACTOR["dq"] widened for H values by
    numerics.small_sample_factor: an RMSE of 2 values strays far by chance). Null where the golden covers
    a subset of (batch, head) slices (a sink's gradient sums over every batch) or is not finite."""
    golden, dsinks = cell.golden, cell.grads[3]
    out: dict[str, Any] = {"dsinks_err": None, "dsinks_err_ratio": None, "dsinks_within_budget": None}
    if golden.dsinks is None or cell.ref.slices is not None or cell.columns.get("grad_nan") \
            or cell.columns.get("grad_inf"):
        return out
    rmse = error_vs_reference(dsinks, golden.dsinks)["rmse"]
    base = cell.ref.baseline_extra.get("dsinks")
    out["dsinks_err"] = relative_error(dsinks, golden.dsinks)
    out["dsinks_err_ratio"] = baseline_ratio(rmse, base)
    factor = GRAD_BUDGET_FACTOR["dq"] * small_sample_factor(dsinks.numel())   # one value per head: few
    out["dsinks_within_budget"] = within_budget(rmse, base, cell.case.dtype, factor)
    return out
