"""The log-sum-exp a variant returns beside out, read the way other code uses it.

Split-KV decoding, ring and context-parallel attention and chunked prefill compute attention on
parts of the keys and merge the parts' (out, lse) pairs; sinks can be applied after attention
through the lse. A kernel whose lse is wrong (another base, no scale, heads left unwritten) can
have a right `out` and still break every such consumer. This module holds:

- `shard_calls`: the calls on the keys cut in N shards (two: the halves, at split_point; more:
  context parallel, SHARD_COUNTS), each with the cell's causal masking and mask cut to its keys (so
  a query row may see no key of a shard), and `merge_ring`, their merge in ring order;
- `merge_partials`: the merge those consumers do, in float64 (workload/merge_functions.py, the
  audited merges' reference);
- `keys_only_lse`: a variant's lse as the keys-only convention (a kernel declaring that its lse
  counts the sink gets the sink taken out);
- `classify_lse_rows`: what an lse is on rows that see no key.

The checks (measure.checks.lse) and the same-dtype baseline (cellcache) both use them.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from ...core.errors import Unsupported
from ...workload.draws import causal_keep, causal_offset
from ...workload.merge_functions import merge_partials  # noqa: F401  (the merge, defined with the other merges)


def split_point(tk: int) -> int:
    """Where the keys are split: the first half gets ceil(Tk / 2) keys (a decode cell's single key
    cannot be split: shard_calls returns None)."""
    return (tk + 1) // 2


def causal_position_halves(call: Callable[..., Any], q: Any, k: Any, v: Any, h: int,
                           **extra: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The two key halves of causal self-attention (Tq == Tk) from calls that need no mask: the first
    h keys are seen causally by the first h queries (a square: either alignment) and wholly by the
    rest (causal off); the last keys causally by the last queries (a square) and by none of the first
    (out 0, lse -inf: an empty part). Three calls. -> ((out, lse) of each half), (B, H, Tq, d_v), (B, H, Tq)."""
    first, second = causal_position_shards(call, q, k, v, [(0, h), (h, k.shape[-2])], **extra)
    return first, second


# --------------------------------------------------------------------------- context parallel: N shards


def shard_bounds(tk: int, n: int) -> list[tuple[int, int]] | None:
    """[(start, stop)] of n contiguous key shards, the first ones a key longer where n does not
    divide Tk (two shards: split at split_point); None when there are fewer keys than shards."""
    if tk < n:
        return None
    size, extra = divmod(tk, n)
    bounds, start = [], 0
    for rank in range(n):
        stop = start + size + (rank < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def _full_mask(q: Any, k: Any, mask: Any, causal: bool, alignment: str) -> Any:
    """The cell's causal masking and mask as one mask over all the keys (None where nothing is masked):
    bool where the mask is bool or absent, additive (-inf where causal hides) where it is float."""
    import torch
    tq, tk = q.shape[-2], k.shape[-2]
    full = mask
    if causal:
        keep = causal_keep(tq, tk, q.device, causal_offset(tq, tk, alignment))[None, None]   # (1, 1, Tq, Tk)
        if full is None:
            full = keep
        elif full.dtype == torch.bool:
            full = full & keep
        else:
            full = full.masked_fill(~keep, float("-inf"))
    return full


def _cut_masks(full: Any, bounds: list[tuple[int, int]]) -> list[Any]:
    """The full mask cut to each key range; None for a range where nothing is masked (a bool mask that
    hides nothing of it goes without one: a decode cell's bottom-right causal sees every key, so a
    kernel that takes no mask can still be split there)."""
    import torch
    if full is None:
        return [None] * len(bounds)
    parts = [full[..., a:b] for a, b in bounds]
    return [None if part.dtype == torch.bool and bool(part.all()) else part for part in parts]


def shard_calls(call: Callable[..., Any], q: Any, k: Any, v: Any, mask: Any, causal: bool,
                alignment: str, n: int, **extra: Any) -> list[tuple[Any, Any]] | None:
    """(out, lse) of `call` on each of n key shards (shard_bounds), each with the cell's masking cut to
    its keys as a mask, causal False (a row may see no key of a shard); None with fewer keys than
    shards. A kernel that takes causal but no mask (Unsupported on a shard's mask) gets the shards of
    a self-attention cell (Tq == Tk, no other mask) by position: causal_position_shards."""
    bounds = shard_bounds(k.shape[-2], n)
    if bounds is None:
        return None
    parts = []
    for (a, b), m in zip(bounds, _cut_masks(_full_mask(q, k, mask, causal, alignment), bounds)):
        try:
            result = call(q, k[..., a:b, :], v[..., a:b, :], mask=m, causal=False, **extra)
        except Unsupported:
            if not (causal and mask is None and q.shape[-2] == k.shape[-2]):
                raise
            return causal_position_shards(call, q, k, v, bounds, **extra)
        parts.append((result[0], result[1]))
    return parts


def causal_position_shards(call: Callable[..., Any], q: Any, k: Any, v: Any, bounds: list[tuple[int, int]],
                           **extra: Any) -> list[tuple[Any, Any]]:
    """The key shards of causal self-attention (Tq == Tk) from calls that need no mask: shard [a, b)
    is seen causally by queries a..b-1 (a square: either alignment), wholly by the later queries
    (causal off), and by none of the earlier ones (out 0, lse -inf: an empty part). Two calls a shard
    at most. -> [(out (B, H, Tq, d_v), lse (B, H, Tq))] in the bounds' order."""
    import torch
    tq = q.shape[-2]
    parts = []
    for a, b in bounds:
        ks, vs = k[..., a:b, :], v[..., a:b, :]
        square = call(q[..., a:b, :], ks, vs, causal=True, **extra)                      # queries a..b-1
        outs, lses = [], []
        if a:                                                                            # queries < a: no key
            outs.append(torch.zeros_like(square[0][..., :1, :]).expand(*square[0].shape[:-2], a, -1))
            lses.append(torch.full_like(square[1][..., :1], -math.inf).expand(*square[1].shape[:-1], a))
        outs.append(square[0])
        lses.append(square[1])
        if b < tq:                                                                       # queries >= b: every key
            later = call(q[..., b:, :], ks, vs, causal=False, **extra)
            outs.append(later[0])
            lses.append(later[1])
        parts.append((torch.cat(outs, -2), torch.cat(lses, -1)))
    return parts


def merge_ring(parts: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """The parts' (out, lse) merged in ring order, each rank's into the running result (merge_partials,
    float64): ((B, H, Tq, d), (B, H, Tq))."""
    merged = parts[0]
    for part in parts[1:]:
        merged = merge_partials(merged, part)
    return merged


def keys_only_lse(lse: Any, sinks: Any, includes_sink: bool) -> Any:
    """A returned lse (B, H, Tq) in the keys-only convention, float64: a kernel whose lse counts
    the sink (lse = log(Z + exp(sink))) gets log(exp(lse) - exp(sink)) (rounding grows as the sink's
    share does); any other lse as it is."""
    import torch
    lse = lse.double()
    if sinks is None or not includes_sink:
        return lse
    s = sinks.double().view(1, -1, 1)                                            # (1, H, 1)
    return lse + torch.log1p(-torch.exp(s - lse))


LSE_ROW_CLASSES: tuple[str, ...] = ("-inf", "+inf", "zero", "nan", "finite", "mixed")
# An lse this low is -inf to a merge: exp(lse - any part's lse) underflows even in float64 (a
# finfo.min mask's row: finfo.min + ln T), so it is classed -inf.
EMPTY_BELOW = -1e4
MERGEABLE_EMPTY_ROWS: tuple[str, ...] = ("-inf", "+inf")   # what a merge reads as "no key here" (weight 0)


def classify_lse_rows(lse: Any, empty: Any) -> str | None:
    """What the lse (B, H, Tq) is on rows that see no key (empty: (B|1, H|1, Tq) bool): one of
    LSE_ROW_CLASSES (mixed when they differ; -inf includes values at or below EMPTY_BELOW), None
    when no row is empty."""
    import torch
    rows = lse.detach()[empty.expand(lse.shape)]
    if rows.numel() == 0:
        return None
    kinds = set()
    for name, hit in (("-inf", rows <= EMPTY_BELOW), ("+inf", rows == math.inf), ("nan", torch.isnan(rows)),
                      ("zero", rows == 0)):
        if bool(hit.any()):
            kinds.add(name)
    if bool((torch.isfinite(rows) & (rows != 0) & (rows > EMPTY_BELOW)).any()):
        kinds.add("finite")
    return kinds.pop() if len(kinds) == 1 else "mixed"
