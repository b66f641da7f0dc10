"""Negative controls of the layouts: packed documents, paged caches, sliding windows and latent heads.

Each is a kernel with one mistake of the bug reports (docs/numerics.md, Negative controls), in the
layout it declares, and eager's math otherwise; variants._builtins registers them as `broken.<name>`.
The mistakes they make are in mistakes.py (documents, windows, K and V strides) and paged_mistakes.py
(pages), where the diagnosis finds them.
"""
from __future__ import annotations

from ..core.errors import Unsupported
from .eager import eager_attention, kv_for_queries
from .draws import causal_keep, read_as_contiguous
from .packing import documents_mask, v_at_k_stride
from .varlen import document_owner, gather_dense

LAYOUT_CONTROLS: dict[str, str] = {
    "document_boundary_ignored": "takes cu_seqlens but attends every key of its batch row that a document "
                                 "owns: the documents see each other (a fallback that drops cu_seqlens)",
    "cu_seqlens_off_by_one": "each document boundary of cu_seqlens one token late: a document's first token "
                             "is read as the previous document's last",
    "paged_extra_page": "reads one page past each sequence's used pages, every slot of them (the tail of its "
                        "last page and the extra page in its table row: pegainfer#291)",
    "paged_wrong_sequence": "reads sequence b's keys from the block-table row of sequence b + 1 (a batch index "
                            "off by one: stale or shifted table rows)",
    "v_read_at_k_stride": "steps through V's rows with K's row length d_k where d_v != d_k: row j read from "
                          "element j·d_k (ik_llama.cpp#2031: garbage past the first KV block)",
    "window_left_inclusive": "takes the sliding window's width w and lets each query see the key just left of its "
                             "window (i - j <= w: the bound inclusive where it is exclusive, a width converted "
                             "between conventions off by one)",
    "strides_ignored": "reads q, k and v as contiguous memory from where each starts, whatever its strides (a "
                       "kernel indexing raw pointers by shape): right on contiguous inputs, other heads' values on "
                       "views of a fused QKV buffer",
    "batch_dependent_splits": "splits the keys into 2 to 4 parts by the batch's size (B·Tq) and merges the "
                              "partial results by their log-sum-exp: right to rounding, but a row's bits depend on "
                              "the rest of the batch and on chunking (flash-attention#1897: split-KV heuristics)",
}


def broken_document_boundary_ignored(q, k, v, *, mask=None, causal=False, scale=None, cu_seqlens=None,
                                     max_seqlen=None):
    """A varlen kernel that keeps only cu_seqlens[-1]: the keys past it are padding, the rest one sequence."""
    if mask is not None or cu_seqlens is None:       # no documents: nothing to ignore
        return eager_attention(q, k, v, mask=mask, causal=causal, scale=scale)
    cu = cu_seqlens
    owned = document_owner(cu, q.shape[0], k.shape[-2]) >= 0                         # (B, Tk)
    return eager_attention(q, k, v, mask=owned[:, None, None, :], causal=causal, scale=scale)


def broken_cu_seqlens_off_by_one(q, k, v, *, mask=None, causal=False, scale=None, cu_seqlens=None,
                                 max_seqlen=None):
    """A varlen kernel reading each interior boundary of cu_seqlens one token late."""
    if mask is not None or cu_seqlens is None:       # no documents: no boundary to misread
        return eager_attention(q, k, v, mask=mask, causal=causal, scale=scale)
    cu = cu_seqlens.clone()
    cu[1:-1] += 1
    keep = documents_mask(document_owner(cu, q.shape[0], q.shape[-2]))                # (B, 1, T, T)
    return eager_attention(q, k, v, mask=keep, causal=causal, scale=scale)


def broken_window_left_inclusive(q, k, v, *, mask=None, causal=False, scale=None, window=None):
    """A window kernel whose left bound is one key too far: query i sees keys j with i - w <= j <= i + w - 1."""
    import torch
    if window is None:                                   # no window: no bound to misplace
        return eager_attention(q, k, v, mask=mask, causal=causal, scale=scale)
    d = torch.arange(k.shape[-2], device=q.device)[None, :] - torch.arange(q.shape[-2], device=q.device)[:, None]
    keep = ((d >= -window) & (d <= window - 1))[None, None]                          # (1, 1, Tq, Tk)
    return eager_attention(q, k, v, mask=keep, causal=causal, scale=scale)


def broken_strides_ignored(q, k, v, *, mask=None, causal=False, scale=None):
    """eager on q, k, v read as contiguous memory from where each starts (read_as_contiguous)."""
    q, k, v = (read_as_contiguous(t) for t in (q, k, v))
    return eager_attention(q, k, v, mask=mask, causal=causal, scale=scale)


def _paged_dense(q, k_pages, v_pages, block_table, seqused, length_of, rows_of):
    """eager on keys gathered from the pool: sequence b reads table row rows_of(b), its first
    length_of(b) slots."""
    import torch
    width = block_table.shape[1] * k_pages.shape[1]
    table = block_table[[rows_of(b) for b in range(block_table.shape[0])]]
    k, v = (gather_dense(p, table, width) for p in (k_pages, v_pages))                # (B, Hkv, width, d)
    lengths = torch.tensor([length_of(b) for b in range(block_table.shape[0])], device=q.device)
    keep = (torch.arange(width, device=q.device)[None, :] < lengths[:, None])[:, None, None, :]
    return k, v, keep


def broken_paged_extra_page(q, k_pages, v_pages, *, block_table, seqused, mask=None, causal=False, scale=None):
    """Reads every slot of its used pages and of the next page in its table row."""
    page = k_pages.shape[1]
    used = [int(n) for n in seqused.tolist()]
    k, v, keep = _paged_dense(q, k_pages, v_pages, block_table, seqused,
                              lambda b: min(block_table.shape[1], -(-used[b] // page) + 1) * page, lambda b: b)
    return eager_attention(q, k, v, mask=keep, scale=scale)


def broken_paged_wrong_sequence(q, k_pages, v_pages, *, block_table, seqused, mask=None, causal=False, scale=None):
    """Sequence b reads the pages of table row b + 1 (mod B), its own used length (the slots past it
    zeroed before any arithmetic: its one mistake is the row). One sequence has no other row to read."""
    used = [int(n) for n in seqused.tolist()]
    B = block_table.shape[0]
    if B == 1:
        raise Unsupported("broken.paged_wrong_sequence needs a second sequence: with one, row b + 1 is its own")
    k, v, keep = _paged_dense(q, k_pages, v_pages, block_table, seqused, lambda b: used[b], lambda b: (b + 1) % B)
    k, v = (t.masked_fill(~keep[:, :, 0, :, None], 0.0) for t in (k, v))               # (B, Hkv, width, d)
    return eager_attention(q, k, v, mask=keep, scale=scale)


# Each control's call form (variant_contract.CALL_FORMS), the scenarios whose every cell shows its mistake
# (Variant.reveals) and what a cell must have for it to show at all (Variant.requires)
LAYOUT_CONTROL_CELLS: dict[str, tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]] = {
    "document_boundary_ignored": (("varlen",), ("packed",), {}),
    "cu_seqlens_off_by_one": (("varlen",), ("packed",), {}),
    "paged_extra_page": (("paged",), ("paged",), {}),
    "paged_wrong_sequence": (("paged",), ("paged",), {}),
    "v_read_at_k_stride": ((), (), {"latent": "with d_v == d_k K's row stride is V's: nothing to detect"}),
    "window_left_inclusive": (("window",), ("sliding_window",), {}),
    "strides_ignored": ((), ("strided_qkv",), {}),
    "batch_dependent_splits": ((), ("normal",), {}),
}


def split_count(batch: int, q_len: int) -> int:
    """broken.batch_dependent_splits' number of key splits: 2 to 4, from B·Tq (as a split-KV heuristic
    picks it from the work's size)."""
    return 2 + (batch * q_len // 16) % 3


def broken_batch_dependent_splits(q, k, v, *, mask=None, causal=False, scale=None):
    """Attention over split_count(B, Tq) parts of the keys, each part's softmax and log-sum-exp in the
    input dtype, merged by the log-sum-exps (a row that sees no key: 0)."""
    import torch
    tq, tk = q.shape[-2], k.shape[-2]
    keep = causal_keep(tq, tk, q.device) if causal else torch.ones(tq, tk, dtype=torch.bool, device=q.device)
    keep = keep[None, None]                                                          # (1, 1, Tq, Tk)
    if mask is not None:
        keep = keep & (mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ kv_for_queries(q, k).transpose(-2, -1)) * scale                    # (B, H, Tq, Tk)
    vv = kv_for_queries(q, v)                                                        # (B, H, Tk, dv)
    n = min(tk, split_count(q.shape[0], tq))
    edges = [tk * i // n for i in range(n + 1)]
    outs, lses = [], []
    for a, b in zip(edges, edges[1:]):
        s, part = scores[..., a:b], keep[..., a:b].expand(scores[..., a:b].shape)
        top = s.masked_fill(~part, float("-inf")).amax(-1, keepdim=True)             # (B, H, Tq, 1)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        p = torch.exp(s - top) * part                                                # masked keys: 0
        total = p.sum(-1, keepdim=True)                                              # (B, H, Tq, 1)
        seen = total > 0
        outs.append((p @ vv[..., a:b, :]) / torch.where(seen, total, torch.ones_like(total)))
        lses.append(torch.where(seen, top + torch.log(torch.where(seen, total, torch.ones_like(total))),
                                torch.full_like(total, -1e30))[..., 0])              # (B, H, Tq)
    lse = torch.stack(lses)                                                          # (n, B, H, Tq)
    weight = torch.softmax(lse.float(), dim=0).to(q.dtype) * (lse > -1e29).any(0)   # (n, B, H, Tq)
    return (torch.stack(outs) * weight[..., None]).sum(0)                            # (B, H, Tq, dv)


def broken_v_read_at_k_stride(q, k, v, *, mask=None, causal=False, scale=None):
    """eager with V read at K's row stride (d_k) where d_v != d_k."""
    return eager_attention(q, k, v_at_k_stride(v, q.shape[-1]), mask=mask, causal=causal, scale=scale)
