"""Plug-ins with SDPA's forward and a backward of their own (a custom autograd.Function), as a
kernel author writes them (tests/test_gradients.py): one right, one returning dq as zeros, one
halving dk. The forward of all three is exactly SDPA's, so only the gradients can tell them apart.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _sdpa(q, k, v, mask, causal, scale):
    gqa = {"enable_gqa": True} if k.shape[-3] != q.shape[-3] else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, **gqa)


class _Attention(torch.autograd.Function):
    """SDPA forward; backward: SDPA's own gradients (recomputed), then `mistake` applied to them."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale, mistake):
        ctx.save_for_backward(q, k, v)
        ctx.mask, ctx.causal, ctx.scale, ctx.mistake = mask, causal, scale, mistake
        return _sdpa(q, k, v, mask, causal, scale)                              # (B, H, Tq, d)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
            out = _sdpa(*leaves, ctx.mask, ctx.causal, ctx.scale)
            dq, dk, dv = torch.autograd.grad(out, leaves, grad_out)
        if ctx.mistake == "zero_dq":
            dq = torch.zeros_like(dq)
        elif ctx.mistake == "half_dk":
            dk = dk * 0.5
        return dq, dk, dv, None, None, None, None


def correct(q, k, v, *, mask=None, causal=False, scale=None):
    """SDPA forward, a custom backward with SDPA's gradients."""
    return _Attention.apply(q, k, v, mask, causal, scale, None)


def zero_dq(q, k, v, *, mask=None, causal=False, scale=None):
    """SDPA forward, a custom backward that returns dq as zeros."""
    return _Attention.apply(q, k, v, mask, causal, scale, "zero_dq")


def half_dk(q, k, v, *, mask=None, causal=False, scale=None):
    """SDPA forward, a custom backward that halves dk."""
    return _Attention.apply(q, k, v, mask, causal, scale, "half_dk")


for _fn in (correct, zero_dq, half_dk):
    _fn.audit_supports = ("gqa",)
