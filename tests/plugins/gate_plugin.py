"""A plug-in variant with a known, injectable slowdown, for the regression-gate tests."""
import os

import torch.nn.functional as F


def attention(q, k, v, *, mask=None, causal=False, scale=None):
    """SDPA computed ATTN_AUDIT_SLOWDOWN times (default once): slowed by a known factor."""
    repeats = int(os.environ.get("ATTN_AUDIT_SLOWDOWN", "1"))
    for _ in range(repeats):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    return out
