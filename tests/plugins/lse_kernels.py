"""Attention plug-ins returning (out, lse), each making one known mistake of the log-sum-exp
(audit.workload.lse_mistakes) with a right `out`, written as such kernels are; `correct` makes
none. Every function takes sinks too (applied as a softmax column), so sinks cells run them.
"""
from __future__ import annotations

import math

import torch


def _scores(q, k, mask, causal, scale):
    """Masked, scaled scores (B, H, Tq, Tk) in fp32, hidden ones -inf; k repeated per query head."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    kk = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).float()          # (B, H, Tk, d)
    s = (q.float() @ kk.transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    return s


def attention(q, k, v, *, mask=None, causal=False, scale=None, sinks=None):
    """(out, lse): out in q's dtype (0 on rows that see no key), lse the keys' logsumexp in fp32."""
    s = _scores(q, k, mask, causal, scale)                                       # (B, H, Tq, Tk)
    if sinks is not None:
        column = sinks.float().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        p = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    vv = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).float()
    return (p @ vv).to(q.dtype), torch.logsumexp(s, dim=-1)                      # (B, H, Tq, d), (B, H, Tq)


def correct(q, k, v, **kw):
    return attention(q, k, v, **kw)


def lse_base2(q, k, v, **kw):
    out, lse = attention(q, k, v, **kw)
    return out, lse / math.log(2.0)


def lse_unscaled_max(q, k, v, *, mask=None, causal=False, scale=None, sinks=None):
    out, lse = attention(q, k, v, mask=mask, causal=causal, scale=scale, sinks=sinks)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    raw_max = (_scores(q, k, mask, causal, scale) / scale).amax(-1)               # the running max, unscaled
    return out, lse + torch.nan_to_num(raw_max, neginf=0.0) * (1.0 - scale)


def lse_first_head_of_group(q, k, v, **kw):
    out, lse = attention(q, k, v, **kw)
    group = q.shape[1] // k.shape[1]
    firsts = torch.arange(q.shape[1], device=q.device) // group * group
    return out, lse.index_select(1, firsts)                                      # (B, H, Tq)


def lse_empty_rows_zero(q, k, v, **kw):
    out, lse = attention(q, k, v, **kw)
    return out, torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def lse_no_grad(q, k, v, **kw):
    out, lse = attention(q, k, v, **kw)
    return out, lse.detach()


def lse_includes_sink(q, k, v, *, sinks=None, **kw):
    """Right, in flash-attn's convention: its lse counts the sink (declared below)."""
    out, lse = attention(q, k, v, sinks=sinks, **kw)
    return out, (lse if sinks is None else torch.logaddexp(lse, sinks.float().view(1, -1, 1)))


def not_a_pair(q, k, v, **kw):
    """Declares (out, lse) and returns out alone: a contract error, not a number."""
    return attention(q, k, v, **kw)[0]


for _fn in (correct, lse_base2, lse_unscaled_max, lse_first_head_of_group, lse_empty_rows_zero, lse_no_grad,
            lse_includes_sink, not_a_pair):
    _fn.audit_returns = "out_lse"
    _fn.audit_supports = ("gqa", "sinks")
lse_includes_sink.audit_lse_includes_sink = True


def _sinks_dropped(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), learnable_sink=None,
                   return_softmax_lse=False):
    """gpt-oss's call form taking learnable_sink and dropping it (vllm-project/vllm#52148's FA2 path)."""
    from standins import flash_attn_with_sinks
    return flash_attn_with_sinks(q, k, v, softmax_scale, causal, window_size, None, return_softmax_lse)


def _declared_dropping():
    import audit
    return audit.adapt(_sinks_dropped, layout="bthd", causal="bottom-right", causal_arg="causal",
                       scale_arg="softmax_scale", sink_arg="learnable_sink", gqa=True, returns="out_lse",
                       lse_includes_sink=True, return_softmax_lse=True)


sink_kernel_dropping_sinks = _declared_dropping()   # a mask-less sink kernel that drops its sinks


TILE = 32               # tile_padding's key tile: a cell of 64 keys fills two


def tile_padding(q, k, v, **kw):
    """Counts the padding of its last key tile as keys of score 0 and value 0 (a kernel that masks its
    tail tile's scores to 0 instead of -inf): right on 64 keys and on two halves of them, wrong on a
    context-parallel shard of 16 or 8 keys. lse' = logaddexp(lse, log(pad)), out' = out · exp(lse - lse');
    a row that sees no key keeps out 0."""
    out, lse = attention(q, k, v, **kw)
    pad = -k.shape[-2] % TILE
    if not pad:
        return out, lse
    padded = torch.logaddexp(lse, torch.full_like(lse, math.log(pad)))                      # (B, H, Tq)
    weight = torch.where(torch.isneginf(lse), torch.zeros_like(lse), torch.exp(lse - padded))
    return (out.float() * weight[..., None]).to(q.dtype), padded


tile_padding.audit_returns = "out_lse"
tile_padding.audit_supports = ("gqa", "sinks")
