"""Paged kernels with a page or slot index off by one (the family page_index of
audit/workload/paged_mistakes.py), written as such code is: the paged check must name each."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary


def _shifted(q, k_pages, v_pages, block_table, seqused, first, scale):
    """Each sequence's keys read from slot `first` of its table row's pages on, its used length of them."""
    pages = k_pages[block_table.long()], v_pages[block_table.long()]                 # (B, width, page, Hkv, d)
    B, width, size, hkv, d = pages[0].shape
    k, v = (p.reshape(B, width * size, hkv, p.shape[-1])[:, first:].transpose(1, 2) for p in pages)  # (B, Hkv, n, d)
    keep = torch.arange(k.shape[-2], device=q.device)[None, :] < seqused[:, None].long()            # (B, n)
    k, v = (t.masked_fill(~keep[:, None, :, None], 0.0) for t in (k, v))
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :], scale=scale, **gqa)


def page_index_next(q, k_pages, v_pages, *, block_table, seqused, mask=None, causal=False, scale=None):
    """Logical page p read from table entry p + 1."""
    return _shifted(q, k_pages, v_pages, block_table, seqused, k_pages.shape[1], scale)


def slot_index_next(q, k_pages, v_pages, *, block_table, seqused, mask=None, causal=False, scale=None):
    """Key t read from slot t + 1."""
    return _shifted(q, k_pages, v_pages, block_table, seqused, 1, scale)


page_index_next.audit_supports = slot_index_next.audit_supports = ("paged",)
page_index_next.audit_causal_alignment = slot_index_next.audit_causal_alignment = "bottom-right"


_FIRST_TABLE = WeakIdKeyDictionary()          # queries -> the table of their first call


def stale_block_table(q, k_pages, v_pages, *, block_table, seqused, mask=None, causal=False, scale=None):
    """Keeps the block table of its first call on these queries and reads every later call's pages by it
    (a table captured once, as in a CUDA graph, and not updated): right until the cache's pages move."""
    if q not in _FIRST_TABLE:
        _FIRST_TABLE[q] = block_table.clone()
    table = _FIRST_TABLE[q]
    return _shifted(q, k_pages, v_pages, table, seqused, 0, scale)


stale_block_table.audit_supports = ("paged",)
stale_block_table.audit_causal_alignment = "bottom-right"
