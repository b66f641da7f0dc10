"""Plug-ins that decline cells they do not take (tests/test_variants.py): a kernel taking only
bool masks, one without a causal mode, and for contrast one that fails with ValueError."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import audit


def bool_masks_only(q, k, v, *, mask=None, causal=False, scale=None):
    """SDPA that takes bool masks only: a float mask is declined with NotImplementedError."""
    if mask is not None and mask.dtype != torch.bool:
        raise NotImplementedError("additive float masks are not supported; pass a bool mask")
    if mask is not None and causal:
        mask = mask & torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        causal = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def no_causal(q, k, v, *, mask=None, causal=False, scale=None):
    """SDPA without a causal mode: causal cells are declined with audit.Unsupported."""
    if causal:
        raise audit.Unsupported("this kernel has no causal mode")
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def float_mask_value_error(q, k, v, *, mask=None, causal=False, scale=None):
    """Fails (ValueError, not a refusal) on a float mask: an `error`, as any other failure."""
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError("float mask")
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
