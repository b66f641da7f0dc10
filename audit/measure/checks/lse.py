"""The checks of a returned log-sum-exp (measure/checks/registry.py: CHECK_ORDER): its error and
budget against the float64 golden's, its halves merged as split-KV attention merges them, its shards
merged as context parallel merges N ranks', the gradient through it, and the known mistakes of the
lse they match."""
from __future__ import annotations

from typing import Any

from ...core.defects import lse_outside_budget
from ...core.errors import Unsupported
from ..cell.cellcache import baseline_shards, lse_rmse, merged_output, shards_output
from ..cell.failures import failure_reason
from ...workload.merge_functions import SHARD_COUNTS, SHARD_MAX_KEYS
from ..golden.lse import classify_lse_rows, keys_only_lse
from ..golden.numerics import GRAD_BUDGET_FACTOR, error_vs_reference, within_budget
from .contract import split_out_lse
from .registry import CellState, baseline_ratio, check, reason_with


def _returns_lse(cell: CellState) -> bool:
    return cell.lse is not None


def lse_convention(cell: CellState) -> tuple[Any, Any, str]:
    """What the variant's lse is compared with: (the golden's lse, its gradient through the lse, the
    baseline_extra prefix) in the variant's convention: the keys only, or in a sinks cell with
    the sink counted when it declares lse_includes_sink (the golden converted, never its lse:
    taking a dominant sink out of a kernel's lse would cost its rounding many times over)."""
    golden = cell.golden
    if cell.variant.lse_includes_sink and golden.lse_sink is not None:
        return golden.lse_sink, golden.lse_sink_grads, "lse_sink"
    return golden.lse, golden.lse_grads, "lse"


@check("lse_error", needs=("out", "golden"), when=_returns_lse)
def lse_error(cell: CellState) -> dict[str, Any]:
    """The returned lse against the float64 golden's on the rows that see a key (RMSE, absolute),
    its ratio to the same-dtype baseline's and the budget's verdict; and what it is on rows that
    see no key (measure.golden.lse.classify_lse_rows)."""
    want, _, key = lse_convention(cell)
    rmse = lse_rmse(cell.ref.take(cell.lse), cell.golden, want)
    base = cell.ref.baseline_extra.get(key)
    return {"lse_err": rmse, "lse_err_ratio": baseline_ratio(rmse, base),
            "lse_within_budget": within_budget(rmse, base, cell.case.dtype),
            "lse_masked_rows": classify_lse_rows(_keys_only(cell), ~cell.ref.row_visible)}


def _keys_only(cell: CellState) -> Any:
    """The variant's lse in the keys-only convention, for what it is on rows that see no key: there a
    kernel counting the sink writes the sink itself (exactly: the keys' part is -inf)."""
    return keys_only_lse(cell.lse, cell.inputs.sinks, cell.variant.lse_includes_sink)


WINDOW_NOT_SPLIT = ("the window is handed as an argument, and a part of the keys puts it elsewhere (it is drawn "
                    "from each query's position in the call)")


def _splittable(cell: CellState) -> bool:
    return _returns_lse(cell) and "cu_seqlens" not in cell.kwargs     # documents cannot be split


def _lse_call(cell: CellState) -> Any:
    """The variant as (q, k, v, mask=, causal=) -> (out, lse), its other arguments (scale, softcap)
    kept: what a split of the keys calls on each part (the sinks are applied once, after)."""
    extra = {name: value for name, value in cell.kwargs.items() if name not in ("mask", "causal", "sinks")}

    def call(q, k, v, *, mask=None, causal=False):
        return split_out_lse(cell.fn(q, k, v, mask=mask, causal=causal, **extra), q)
    return call


@check("lse_merge", needs=("out", "golden", "variant"), when=_splittable)
def lse_merge(cell: CellState) -> dict[str, Any]:
    """The variant on the keys split in two, the halves' (out, lse) merged as split-KV and ring
    attention merge them (sinks applied once, after), against the float64 golden: RMSE, ratio to
    the same-dtype baseline's merge and the verdict. Null, with a reason, where the variant cannot
    take a half's mask, or the keys cannot be split."""
    import torch
    out = {"merge_err": None, "merge_err_ratio": None, "merge_within_budget": None}
    if cell.kwargs.get("window") is not None:
        return {**out, "reason": reason_with(cell, f"merge check not run: {WINDOW_NOT_SPLIT}")}
    try:
        with torch.no_grad():
            merged = merged_output(_lse_call(cell), cell.q.detach(), cell.k.detach(), cell.v.detach(),
                                   cell.kwargs.get("mask"), cell.inputs.causal, cell.ref.alignment,
                                   cell.kwargs.get("sinks"))
    except Unsupported as exc:
        return {**out, "reason": reason_with(cell, f"merge check not run: {exc}")}
    if merged is None:
        return out
    cell.merged = merged
    rmse = error_vs_reference(cell.ref.take(merged), cell.golden.out, cell.golden.row_visible)["rmse"]
    base = cell.ref.baseline_extra.get("merge")
    return {"merge_err": rmse, "merge_err_ratio": baseline_ratio(rmse, base),
            "merge_within_budget": within_budget(rmse, base, cell.case.dtype)}


@check("lse_shards", needs=("out", "golden", "variant"),
       when=lambda cell: _splittable(cell) and cell.k.shape[-2] <= SHARD_MAX_KEYS)
def lse_shards(cell: CellState) -> dict[str, Any]:
    """Context parallel: the variant on the keys cut in N contiguous shards (SHARD_COUNTS), each rank's
    (out, lse) merged in ring order (sinks applied once, after), against the float64 golden. Per N
    (keys "4", "8"): the RMSE (shards_errs) and its ratio to the same-dtype baseline's over the same
    shards (shards_err_ratios); the worst ratio (shards_err_ratio) and one verdict for all N. A kernel
    wrong only on a key range shorter than its tile passes the two-way merge and fails here. Cells of up
    to SHARD_MAX_KEYS keys."""
    import torch
    out = {"shards_errs": None, "shards_err_ratios": None, "shards_err_ratio": None, "shards_within_budget": None}
    if cell.kwargs.get("window") is not None:
        return {**out, "reason": reason_with(cell, f"context-parallel check not run: {WINDOW_NOT_SPLIT}")}
    call = _lse_call(cell)
    errs, ratios, verdicts = {}, {}, []
    for n in SHARD_COUNTS:
        try:
            with torch.no_grad():
                merged = shards_output(call, cell.q.detach(), cell.k.detach(), cell.v.detach(),
                                       cell.kwargs.get("mask"), cell.inputs.causal, cell.ref.alignment,
                                       cell.kwargs.get("sinks"), n)
        except Unsupported as exc:
            return {**out, "reason": reason_with(cell, f"context-parallel check not run: {exc}")}
        if merged is None:                                  # fewer keys than shards
            continue
        rmse = error_vs_reference(cell.ref.take(merged), cell.golden.out, cell.golden.row_visible)["rmse"]
        base = baseline_shards(cell.ref, cell.inputs, n)
        errs[str(n)], ratios[str(n)] = rmse, baseline_ratio(rmse, base)
        verdicts.append(within_budget(rmse, base, cell.case.dtype))
    if not errs:
        return out
    known = [r for r in ratios.values() if r is not None]
    return {"shards_errs": errs, "shards_err_ratios": ratios, "shards_err_ratio": max(known) if known else None,
            "shards_within_budget": None if None in verdicts else all(verdicts)}


@check("lse_grads", needs=("grads", "golden", "variant"),
       when=lambda cell: cell.lse is not None and cell.golden.lse_grads is not None)
def lse_grads(cell: CellState) -> dict[str, Any]:
    """The gradient through the returned lse alone: dq and dk of <lse, grad_lse> (grad_lse drawn
    per cell; the lse does not depend on v) against the golden's, each RMSE over the same-dtype
    baseline's, and one verdict for both. A kernel with no gradient through its lse gets zeros
    (pytorch/torchtitan#4796); lse_differentiable says whether the lse carries a gradient at all."""
    import torch
    with torch.enable_grad():
        out, lse = split_out_lse(cell.fn(cell.q, cell.k, cell.v, **cell.kwargs), cell.q)
        grads = (None, None)
        if lse.requires_grad:
            grads = torch.autograd.grad(lse.double(), (cell.q, cell.k), cell.inputs.grad_lse.double(),
                                        allow_unused=True)
    grads = tuple(torch.zeros_like(t) if g is None else g for g, t in zip(grads, (cell.q, cell.k)))
    cell.lse_loss_grads = grads             # for the lse diagnosis, after timing
    ref = cell.ref
    _, want, key = lse_convention(cell)
    cols: dict[str, Any] = {"lse_differentiable": bool(lse.requires_grad)}
    if cell.columns.get("grad_nan") or cell.columns.get("grad_inf"):
        return cols                         # not judged where the gradients are not finite (the nonfinite check's)
    verdicts = []
    for g, got, take in zip(LSE_GRADIENTS, grads, (ref.take, ref.take_kv)):
        rmse = error_vs_reference(take(got), want[g])["rmse"]
        base = ref.baseline_extra.get(f"{key}_{g}")
        cols[f"lse_{g}_err_ratio"] = baseline_ratio(rmse, base)
        verdicts.append(within_budget(rmse, base, cell.case.dtype, GRAD_BUDGET_FACTOR[g]))
    cols["lse_grads_within_budget"] = None if None in verdicts else all(verdicts)
    return cols


LSE_GRADIENTS: tuple[str, ...] = ("dq", "dk")   # what the lse depends on (not v)


@check("lse_diagnosis", needs=("out", "golden", "record"), phase="diagnosis",
       when=lambda cell: bool(set(lse_outside_budget(cell.columns)) & {"lse_within_budget", "merge_within_budget"}))
def lse_diagnosis(cell: CellState) -> dict[str, Any]:
    """The known mistake of the lse the variant's lse or merge matches (measure.diagnosis.lse_diagnosis), for
    cells whose lse or merge is outside its budget."""
    from ..diagnosis.lse_diagnosis import diagnose_lse_cell
    try:
        return diagnose_lse_cell(cell)
    except Exception as exc:  # noqa: BLE001
        return {"reason": reason_with(cell, f"lse diagnosis failed: {failure_reason(exc)}")}


@check("lse_grad_diagnosis", needs=("golden", "record"), phase="diagnosis",
       when=lambda cell: "lse_grads_within_budget" in lse_outside_budget(cell.columns)
       and cell.lse_loss_grads is not None)
def lse_grad_diagnosis(cell: CellState) -> dict[str, Any]:
    """The known mistake of the gradient through the lse its dq and dk match, for cells where that
    gradient is outside its budget."""
    from ..diagnosis.lse_diagnosis import diagnose_lse_grads_cell
    try:
        return diagnose_lse_grads_cell(cell)
    except Exception as exc:  # noqa: BLE001
        return {"reason": reason_with(cell, f"lse gradient diagnosis failed: {failure_reason(exc)}")}
