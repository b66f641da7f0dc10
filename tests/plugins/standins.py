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
    Hkv; causal aligned bottom-right; window_size=(left, right) a sliding window; no mask argument."""
    if q.stride(-1) != 1:
        raise RuntimeError("Input tensor must have contiguous last dimension")
    if q.shape[2] % k.shape[2]:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    keep = _bottom_right(q.shape[1], k.shape[1], q.device) if causal else None
    keep = _and(keep, _window(q.shape[1], k.shape[1], window_size, q.device))
    out = _attention(q, k, v, scale, keep=keep, softcap=softcap).to(q.dtype)
    return (out, None, None) if return_attn_probs else out


def _window(tq, tk, window_size, device, left_extra=0):
    """(Tq, Tk) bool of flash-attn's window_size=(left, right), bottom-right aligned, each end inclusive
    (-1: unbounded), or None for (-1, -1): query i sees keys i + Tk - Tq - left <= j <= i + Tk - Tq + right.
    left_extra: keys read past the left end (a kernel's off-by-one)."""
    left, right = window_size
    if left < 0 and right < 0:
        return None
    d = torch.arange(tk, device=device)[None, :] - torch.arange(tq, device=device)[:, None] - (tk - tq)
    keep = torch.ones(tq, tk, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= d >= -(left + left_extra)
    if right >= 0:
        keep &= d <= right
    return keep


def _and(a, b):
    return b if a is None else a if b is None else a & b


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


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, softcap, block_table, inclusive_end=False):
    """The varlen stand-ins' loop over the sequences; inclusive_end: each reads one key past its own
    (the causal mask, from the true lengths, hides it)."""
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(starts_q) - 1):
        a, b, c, d = starts_q[i], starts_q[i + 1], starts_k[i], starts_k[i + 1]
        if b == a:
            continue
        if block_table is None:
            stop = min(d + 1, k.shape[0]) if inclusive_end else d
            ks, vs = k[c:stop], v[c:stop]                                    # (n_k, Hkv, d)
        else:
            pages = block_table[i].long()
            ks, vs = (t[pages].reshape(-1, t.shape[2], t.shape[3])[:d - c] for t in (k, v))
        keep = None
        if causal:
            keep = torch.zeros(b - a, ks.shape[0], dtype=torch.bool, device=q.device)
            keep[:, :d - c] = _bottom_right(b - a, d - c, q.device)
        out[a:b] = _attention(q[None, a:b], ks[None], vs[None], scale, keep=keep, softcap=softcap)[0].to(q.dtype)
    return out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash_attn.flash_attn_varlen_func's signature: q (total_q, H, d), k, v (total_k, Hkv, d) packed back
    to back, sequence i at cu_seqlens_q[i]:cu_seqlens_q[i + 1] (int32); causal bottom-right within each
    sequence; with block_table, k and v are caches (num_blocks, page_block_size, Hkv, d) and sequence i's
    keys are its table row's first cu_seqlens_k[i + 1] - cu_seqlens_k[i] slots. Rows past
    cu_seqlens_q[-1] are left 0."""
    if q.stride(-1) != 1:
        raise RuntimeError("Input tensor must have contiguous last dimension")
    if cu_seqlens_q.dtype != torch.int32 or cu_seqlens_k.dtype != torch.int32:
        raise RuntimeError("cu_seqlens_q must have dtype int32")
    out = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, softcap, block_table)
    return (out, None, None) if return_attn_probs else out


def flash_attn_varlen_func_one_sequence(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                        softcap=0.0, alibi_slopes=None, deterministic=False,
                                        return_attn_probs=False, block_table=None):
    """The same signature, a fallback that keeps only cu_seqlens[-1]: every packed sequence one (the documents
    attend each other). What the audit must catch."""
    total_q, total_k = int(cu_seqlens_q[-1]), int(cu_seqlens_k[-1])
    whole_q = torch.tensor([0, total_q], dtype=torch.int32, device=q.device)
    whole_k = torch.tensor([0, total_k], dtype=torch.int32, device=q.device)
    return flash_attn_varlen_func(q, k, v, whole_q, whole_k, total_q, total_k, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table)


def flash_attn_varlen_func_inclusive_end(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                         dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                         softcap=0.0, alibi_slopes=None, deterministic=False,
                                         return_attn_probs=False, block_table=None):
    """The same signature, its key loop bound inclusive (`j <= end`): each sequence also reads the key
    right after its own, the next sequence's first (the causal mask, from the true lengths, hides it).
    What the audit must name."""
    out = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, softcap, None, inclusive_end=True)
    return (out, None, None) if return_attn_probs else out


def flash_attn_with_sinks(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), learnable_sink=None,
                          return_softmax_lse=False, _window_left_extra=0):
    """A sink kernel of gpt-oss's call form (flash-attn 3's learnable_sink, vLLM's s_aux): q (B, Tq, H, d),
    k, v (B, Tk, Hkv, d), causal aligned bottom-right, a sliding window as window_size=(left, right),
    per-head sink logits (H,) as one more softmax column, no mask argument; with return_softmax_lse,
    (out, lse (B, H, Tq)) with the sink counted in the lse (flash-attn's convention)."""
    if q.shape[2] % k.shape[2]:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    qq, kk, vv = (t.transpose(1, 2).float() for t in (q, k, v))               # (B, H, T, d)
    group = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(group, dim=1), vv.repeat_interleave(group, dim=1)
    s = (qq @ kk.transpose(-1, -2)) * scale                                  # (B, H, Tq, Tk)
    keep = _bottom_right(q.shape[1], k.shape[1], q.device) if causal else None
    keep = _and(keep, _window(q.shape[1], k.shape[1], window_size, q.device, _window_left_extra))
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    if learnable_sink is not None:
        column = learnable_sink.float().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        s = torch.cat([s, column], dim=-1)                                   # the sink: one more column
    lse = torch.logsumexp(s, dim=-1)                                         # (B, H, Tq), the sink counted
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    p = p[..., :-1] if learnable_sink is not None else p
    out = (torch.nan_to_num(p) @ vv).transpose(1, 2).to(q.dtype)             # (B, Tq, H, d)
    return (out, lse) if return_softmax_lse else out


def flash_attn_with_sinks_window_inclusive(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
                                           learnable_sink=None, return_softmax_lse=False):
    """The same signature, its window's left bound one key too far (`j >= i - left - 1`: the bound read as
    exclusive where flash-attn's is inclusive): each query also sees the key just left of its window.
    What the audit must name."""
    return flash_attn_with_sinks(q, k, v, softmax_scale, causal, window_size, learnable_sink, return_softmax_lse,
                                 _window_left_extra=1)
