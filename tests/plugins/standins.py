"""Stand-ins of two real kernels' signatures and conventions, since neither package runs here
(tests/test_adapt.py): flash-attn's `flash_attn_func` and xFormers' `memory_efficient_attention`
with its bottom-right causal bias. Each computes attention in float32 with the real function's
layout (B, T, H, d), argument names, causal alignment (bottom-right) and GQA rule."""
from __future__ import annotations

import math

import torch


def _attention(q, k, v, scale, bias=None, keep=None, softcap=0.0):
    """(B, T, H, d) in and out; bias additive (B|1, H|1, Tq, Tk), keep bool (Tq, Tk)."""
    q, k, v = (t.transpose(1, 2).float() for t in (q, k, v))           # (B, H, T, d)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale                                # (B, H, Tq, Tk)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.float()
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    seeing = torch.isfinite(s).any(-1, keepdim=True)                     # (B, H, Tq, 1): rows with a key
    p = torch.softmax(s.masked_fill(~seeing, 0.0), dim=-1) * seeing     # empty rows give 0, as both kernels
    return (p @ v).transpose(1, 2)                                       # (B, Tq, H, d)


def _bottom_right(tq, tk, device):
    """(Tq, Tk) bool: query i sees keys j <= i + Tk - Tq (flash-attn >= 2.1, xFormers' FromBottomRight)."""
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(tk - tq)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_func's signature: q (B, Tq, H, d), k, v (B, Tk, Hkv, d), H a multiple of
    Hkv; causal aligned bottom-right; no mask argument."""
    if q.stride(-1) != 1:
        raise RuntimeError("Input tensor must have contiguous last dimension")
    if q.shape[2] % k.shape[2]:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    keep = _bottom_right(q.shape[1], k.shape[1], q.device) if causal else None
    out = _attention(q, k, v, scale, keep=keep, softcap=softcap).to(q.dtype)
    return (out, None, None) if return_attn_probs else out


class LowerTriangularMask:
    """xformers.ops.fmha.attn_bias.LowerTriangularMask: causal, top-left aligned."""

    def keep(self, tq, tk, device):
        return torch.ones(tq, tk, dtype=torch.bool, device=device).tril()


class LowerTriangularFromBottomRightMask(LowerTriangularMask):
    """xformers.ops.fmha.attn_bias.LowerTriangularFromBottomRightMask: causal, bottom-right."""

    def keep(self, tq, tk, device):
        return _bottom_right(tq, tk, device)


def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, *, op=None,
                               output_dtype=None):
    """xformers.ops.memory_efficient_attention's signature: (B, M, H, K) tensors with as many key
    heads as query heads (GQA takes the 5-D BMGHK layout), attn_bias None, an additive tensor
    broadcastable to (B, H, Mq, Mk), or a causal AttentionBias object."""
    if key.shape[2] != query.shape[2]:
        raise ValueError("Incompatible shapes for attention inputs: use the BMGHK layout for GQA")
    scale = scale if scale is not None else 1 / math.sqrt(query.shape[-1])
    bias = keep = None
    if isinstance(attn_bias, LowerTriangularMask):
        keep = attn_bias.keep(query.shape[1], key.shape[1], query.device)
    elif attn_bias is not None:
        bias = attn_bias
    return _attention(query, key, value, scale, bias=bias, keep=keep).to(output_dtype or query.dtype)
