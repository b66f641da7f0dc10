"""The checks after timing, reading the whole record (measure/checks/registry.py: CHECK_ORDER): the
variant's own attention weights (saturation), the known mistake a defective output matches
(diagnosis), and its gradients by the forward's mistake."""
from __future__ import annotations

from typing import Any

from ...core.defects import numerics_defect
from ...workload.inputs import Inputs
from ...workload.variant_contract import Variant
from ..cell.cellcache import Reference, sinks_for_slices
from ..cell.failures import failure_reason
from ..golden.numerics import SaturationAccumulator
from ..golden.reference import golden_prob_chunks
from .contract import forward_with
from .registry import CellState, check, reason_with


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
    sinks = sinks_for_slices(inputs.sinks, ref.slices)
    with torch.no_grad():
        probs = variant.probs(q, k, mask=mask, causal=inputs.causal, score_mod=inputs.score_mod,
                              **({} if sinks is None else {"sinks": sinks}))      # (B, H, Tq, Tk)
    sat = SaturationAccumulator()
    zero_where_golden_positive = golden_positive = 0
    leaked = None
    for r0, r1, gold, vis in golden_prob_chunks(q, k, causal=inputs.causal, visible=visible,
                                                score_mod=inputs.score_mod, sinks=sinks):
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


@check("diagnosis", needs=("out", "golden", "variant", "record"), phase="diagnosis",
       when=lambda cell: numerics_defect(cell.columns))
def diagnosis(cell: CellState) -> dict[str, Any]:
    """The known mistake a defective output matches (measure.diagnosis.diagnosis), for the cells an error
    finding about numerics covers; if the audit's own diagnosis fails, the cell keeps its
    measurements and its reason says so (a diagnosis is an explanation, not a measurement)."""
    from ..diagnosis.diagnosis import diagnose_cell
    try:
        return diagnose_cell(cell.out, cell.inputs, cell.ref, cell.case.dtype, cell.ref.baseline_rmse,
                             call=forward_with(cell))
    except Exception as exc:  # noqa: BLE001
        return {"reason": reason_with(cell, f"diagnosis failed: {failure_reason(exc)}")}


@check("grad_forward_diagnosis", needs=("out", "golden", "record"), phase="diagnosis",
       when=lambda cell: cell.grad_evidence is not None and cell.columns.get("diagnosis") not in (None, "none"))
def grad_forward_diagnosis(cell: CellState) -> dict[str, Any]:
    """Gradients no backward mistake explains, of a cell whose output is diagnosed: where they match
    the gradients of the forward's mistake itself (a kernel differentiating what it wrongly
    computed), the gradient diagnosis names that mistake too (measure.diagnosis.diagnosis.diagnose_grads_as_forward)."""
    from ..diagnosis.diagnosis import diagnose_grads_as_forward
    evidence, cell.grad_evidence = cell.grad_evidence, None
    try:
        found = diagnose_grads_as_forward(evidence, cell.inputs, cell.ref, cell.case.dtype,
                                          cell.columns["diagnosis"], cell.out)
    except Exception as exc:  # noqa: BLE001
        return {"reason": reason_with(cell, "gradient diagnosis by the forward's mistake failed: "
                                            f"{failure_reason(exc)}")}
    return found or {}
