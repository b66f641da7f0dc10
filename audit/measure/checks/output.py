"""The checks of the output (measure/checks/registry.py: CHECK_ORDER): non-finite values, the error
budget against the float64 golden, rows that see no key, the leak and cross-document probes, the
paged cache's unread slots, the argument probes, batch and chunk invariance, the causal alignment."""
from __future__ import annotations

import math
from typing import Any

from ...workload.arguments import probed_arguments
from ...workload.inputs import invariance_applies
from ..cell.failures import failure_reason
from ..golden.numerics import changed_max, classify_masked_rows, error_vs_reference, nonfinite_counts, within_budget
from ..golden.reference import Golden
from .contract import call_with, forward_with
from .lse import lse_convention
from .registry import CellState, baseline_ratio, check, reason_with


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
    m["err_ratio"] = baseline_ratio(m["rmse"], base)
    m["within_budget"] = within_budget(m["rmse"], base, cell.case.dtype)
    return m


@check("masked_rows", needs=("out", "golden"))
def masked_rows(cell: CellState) -> dict[str, Any]:
    """What the variant returns on rows that see no key: nan, zero, uniform, other or mixed."""
    return {"masked_rows": classify_masked_rows(cell.out, ~cell.ref.row_visible, cell.inputs.v)}


@check("leak", needs=("out", "golden", "variant"), phase="leak")
def leak(cell: CellState) -> dict[str, Any]:
    """Largest output change on rows that must not see the keys and values the probes change."""
    probes = cell.ref.leak_probes
    if not probes:
        return {"leak_max_change": None}
    call = forward_with(cell)
    return {"leak_max_change": max(changed_max(cell.out, call(k2, v2), rows) for k2, v2, rows in probes)}


@check("cross_document", needs=("out", "golden", "variant"), phase="leak",
       when=lambda cell: cell.ref.document_probe is not None)
def cross_document(cell: CellState) -> dict[str, Any]:
    """Packed cells: the largest change of a document's output when the other documents' keys and
    values change (every other document kept, the rest and the padding perturbed)."""
    k2, v2, rows = cell.ref.document_probe
    return {"cross_doc_max_change": changed_max(cell.out, forward_with(cell)(k2, v2), rows)}


@check("paged_reads", needs=("out", "golden", "variant"), phase="leak", when=lambda cell: cell.paged_call is not None)
def paged_reads(cell: CellState) -> dict[str, Any]:
    """Paged cells: the variant on two pools that differ only in the slots it must not read (finite
    values there, not NaN): its output must not change. Where it does, which paged mistake
    (workload/paged_mistakes.py) its output on the first pool matches, in float64."""
    from .paged import paged_reads_columns
    return paged_reads_columns(cell)


@check("arguments", needs=("out", "golden", "variant"), phase="leak",
       when=lambda cell: bool(probed_arguments(cell.case, cell.variant.compiled)))
def arguments(cell: CellState) -> dict[str, Any]:
    """Each argument the cell hands the variant, changed: its output must move as the float64
    golden moves (measure/checks/arguments.py)."""
    from .arguments import argument_columns
    lse_baseline = cell.ref.baseline_extra.get(lse_convention(cell)[2]) if cell.lse is not None else None
    columns = argument_columns(cell, call_with(cell), failure_reason, lse_baseline)
    if "reason" in columns:
        columns["reason"] = reason_with(cell, columns["reason"])
    return columns


@check("batch_invariance", needs=("out", "golden", "variant"), phase="invariance",
       when=lambda cell: invariance_applies(cell.case)[0])
def batch_invariance(cell: CellState) -> dict[str, Any]:
    """Batch row 0 computed alone against the same row in the full batch (measure/checks/invariance.py)."""
    from .invariance import columns
    return columns("batch", cell, failure_reason)


@check("chunk_invariance", needs=("out", "golden", "variant"), phase="invariance",
       when=lambda cell: invariance_applies(cell.case)[1])
def chunk_invariance(cell: CellState) -> dict[str, Any]:
    """The queries in two chunks (chunked prefill) against the single-shot output (measure/checks/invariance.py)."""
    from .invariance import columns
    return columns("chunk", cell, failure_reason)


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
