"""Plug-ins wrong only from some size on, for tests/test_shrink.py: shrinking must stop at that size.

Each is `fn(q, k, v, *, mask=None, causal=False, scale=None)`, SDPA but for its defect.
"""
from __future__ import annotations

import torch.nn.functional as F


def _sdpa(q, k, v, mask=None, causal=False, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


def nan_from_64_keys(q, k, v, *, mask=None, causal=False, scale=None):
    """NaN in its second head from 64 keys on: smallest failing cell T 64 and 2 heads, whatever else."""
    out = _sdpa(q, k, v, mask, causal, scale)                       # (B, H, Tq, d)
    if k.shape[-2] >= 64 and q.shape[1] >= 2:
        out = out.clone()
        out[:, 1] = float("nan")
    return out


def right(q, k, v, *, mask=None, causal=False, scale=None):
    """SDPA: no finding to shrink."""
    return _sdpa(q, k, v, mask, causal, scale)


nan_from_64_keys.audit_supports = right.audit_supports = ("gqa",)     # GQA cells, so heads shrink by group
