"""Attention written the ways memory-efficient code is (tests/test_variants.py): recomputed in
backward with reentrant torch.utils.checkpoint, and a custom torch.autograd.Function with its
own backward. Both are correct attention; the audit must take their gradients."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _attention(q, k, v, mask, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def reentrant_checkpoint(q, k, v, *, mask=None, causal=False, scale=None):
    """SDPA under reentrant activation checkpointing (use_reentrant=True): recomputed in backward."""
    return checkpoint(_attention, q, k, v, mask, causal, scale, use_reentrant=True)


class _Attention(torch.autograd.Function):
    """softmax(q kᵀ·scale + mask) v with a hand-written backward (no causal: declined)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        s = (q @ k.transpose(-2, -1)) * scale                      # (B, H, Tq, Tk)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale
        return p @ v                                                # (B, H, Tq, d)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.saved_tensors
        dv = p.transpose(-2, -1) @ grad
        dp = grad @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        dq = (ds @ k) * ctx.scale
        dk = (ds.transpose(-2, -1) @ q) * ctx.scale
        return dq, dk, dv, None, None


def autograd_function(q, k, v, *, mask=None, causal=False, scale=None):
    """Attention as a custom autograd.Function with its own backward."""
    if causal:
        raise NotImplementedError("no causal mode")
    return _Attention.apply(q, k, v, mask, scale if scale is not None else q.shape[-1] ** -0.5)
