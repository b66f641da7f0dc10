"""Batch and chunk invariance: does a row's output depend on how the work was cut?

Reinforcement-learning pipelines need the trainer and the server to agree bit for bit
(Dao-AILab/flash-attention#1897: split-KV counts that depend on the batch). Two checks, on the
cells where they apply (workload.inputs.invariance_applies):

- batch: batch row 0 computed alone (B = 1) against the same row in the full batch;
- chunk: the queries in two chunks against the single-shot output. Causal cells as chunked prefill
  runs them: a variant declaring bottom-right alignment (a KV-cache kernel) gets the first half of the
  queries against the first half of the keys (the prefix cached so far), then the second half against
  every key, with its own causal flag; a top-left one (SDPA's is_causal) cannot align the second
  chunk itself, so both chunks go against every key with the causal mask as a bool tensor (one shape
  for both: a compiled variant builds one more code, not two). Cells without causal masking: each
  half of the queries against every key.

Each records whether the outputs are bitwise equal and the largest difference; the chunked output
is also judged against the cell's error budget (what a user sees when the two paths are mixed).
A call that fails leaves the columns null with the failure in invariance_reason.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from ...workload.draws import causal_keep
from ...workload.varlen import PagedCall
from ..golden.numerics import error_vs_reference, within_budget

# Each check's columns when its call fails, and the words its failure is named with in invariance_reason
UNMEASURED = {"batch": ({"batch_invariant": None, "batch_max_diff": None}, "batch row alone"),
              "chunk": ({"chunk_invariant": None, "chunk_max_diff": None, "chunk_within_budget": None}, "chunked")}


def columns(check: str, cell: Any, reason_of: Callable[[BaseException], str]) -> dict[str, Any]:
    """The columns of `check` ("batch" or "chunk"); a call of the variant that fails (a kernel that
    takes no mask, or no row alone) leaves them null with the failure, reason_of(exc), in
    invariance_reason: the variant's limit, not the cell's failure."""
    try:
        return (batch_columns if check == "batch" else chunk_columns)(cell)
    except Exception as exc:  # noqa: BLE001 - recorded with its reason, as documented
        null, label = UNMEASURED[check]
        return {**null, "invariance_reason": f"{label}: {reason_of(exc)}"}


def _call(cell: Any, q: Any, k: Any, v: Any, **overrides: Any) -> Any:
    """The variant's detached output on these tensors (copies, in the timed calls' grad mode)."""
    grad = cell.q.requires_grad
    q, k, v = (t.detach().clone().requires_grad_(grad) for t in (q, k, v))
    kwargs = dict(cell.kwargs, **overrides)
    result = cell.fn(q, k, v, **kwargs)
    out = result[0] if isinstance(result, tuple) else result
    cell.settle_if_incomplete()
    return out.detach()


def _difference(a: Any, b: Any) -> tuple[bool, float]:
    """(bitwise equal, largest |a - b|: inf where one is NaN and the other not)."""
    import torch
    equal = bool(torch.equal(a, b)) or bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    both_nan = torch.isnan(a) & torch.isnan(b)
    diff = (a.double() - b.double()).abs().masked_fill(both_nan, 0.0)
    largest = float(diff.max()) if diff.numel() else 0.0
    return equal, (math.inf if math.isnan(largest) else largest)


def first_row_kwargs(cell: Any) -> dict[str, Any]:
    """The keyword arguments of batch row 0 alone: a per-batch mask's first row, a packed cell's
    cu_seqlens up to the end of the first row (no document crosses a row)."""
    import torch
    out = {}
    mask = cell.kwargs.get("mask")
    if mask is not None and mask.shape[0] > 1:
        out["mask"] = mask[:1]
    cu = cell.kwargs.get("cu_seqlens")
    if cu is not None:
        length = cell.q.shape[-2]
        first = cu[cu <= length]
        out["cu_seqlens"] = first if int(first[-1]) == length else torch.cat([first, first.new_tensor([length])])
        out["max_seqlen"] = int((out["cu_seqlens"][1:] - out["cu_seqlens"][:-1]).max())
    return out


def batch_columns(cell: Any) -> dict[str, Any]:
    """batch_invariant, batch_max_diff: row 0 alone against row 0 of the cell's numerics output."""
    import torch
    if cell.paged_call is not None:              # the first sequence's pages alone, in the same pool layout
        row = PagedCall(cell.paged_call.fn, cell.paged_call.layout.rows(1))
        with torch.no_grad():
            alone = row(cell.q[:1].detach(), cell.k[:1].detach(), cell.v[:1].detach(), **dict(cell.kwargs))
        alone = (alone[0] if isinstance(alone, tuple) else alone).detach()
    else:
        alone = _call(cell, cell.q[:1], cell.k[:1], cell.v[:1], **first_row_kwargs(cell))   # (1, H, Tq, dv)
    equal, largest = _difference(alone, cell.out[:1])
    return {"batch_invariant": equal, "batch_max_diff": largest}


def chunk_columns(cell: Any) -> dict[str, Any]:
    """chunk_invariant, chunk_max_diff, chunk_within_budget: two-chunk prefill against single-shot."""
    import torch
    tq = cell.q.shape[-2]
    half = tq // 2
    causal = bool(cell.kwargs.get("causal"))
    if not causal:
        first = _call(cell, cell.q[:, :, :half], cell.k, cell.v)
        second = _call(cell, cell.q[:, :, half:], cell.k, cell.v)
    elif cell.variant.causal_alignment == "bottom-right":          # its own flag, as a KV cache calls it
        first = _call(cell, cell.q[:, :, :half], cell.k[:, :, :half], cell.v[:, :, :half])
        second = _call(cell, cell.q[:, :, half:], cell.k, cell.v)
    else:                         # top-left: both chunks against every key, bottom-right causal as a bool mask
        keep = causal_keep(tq, tq, cell.q.device)[None, None]                           # (1, 1, Tq, Tk)
        first = _call(cell, cell.q[:, :, :half], cell.k, cell.v, mask=keep[..., :half, :], causal=False)
        second = _call(cell, cell.q[:, :, half:], cell.k, cell.v, mask=keep[..., half:, :], causal=False)
    chunked = torch.cat([first, second], dim=-2)                                         # (B, H, Tq, dv)
    equal, largest = _difference(chunked, cell.out)
    err = error_vs_reference(cell.ref.take(chunked), cell.golden.out, cell.golden.row_visible)
    return {"chunk_invariant": equal, "chunk_max_diff": largest,
            "chunk_within_budget": within_budget(err["rmse"], cell.ref.baseline_rmse, cell.case.dtype)}
