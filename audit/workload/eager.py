"""Hand-written attention: the textbook code every other variant is compared with.

    fn(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None) -> out

q: (B, H, Tq, d); k, v: (B, Hkv, Tk, d); out: (B, H, Tq, d_v), in q's dtype (docs/variants.md).
`eager` is the same-dtype baseline of the error budgets; its weights (eager_probs) are what
the negative controls (workload/controls.py) get wrong.
"""
from __future__ import annotations

from .inputs import causal_keep


def kv_for_queries(q, t):
    """k or v (B, Hkv, Tk, d) with each head repeated for its H / Hkv query heads: (B, H, Tk, d).
    Query head h meets key/value head h // (H / Hkv), the hand-written form of GQA."""
    group = q.shape[-3] // t.shape[-3]
    return t if group == 1 else t.repeat_interleave(group, dim=-3)


def masked_scores(q, k, mask, causal, scale, upcast: bool, score_mod=None):
    """Q Kᵀ · scale, score_mod applied, then causal and mask as -inf / additive: (B, H, Tq, Tk)."""
    import torch
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k = kv_for_queries(q, k)                                       # (B, H, Tk, d)
    if upcast:
        q, k = q.float(), k.float()
    scores = (q @ k.transpose(-2, -1)) * scale                     # (B, H, Tq, Tk)
    if score_mod is not None:
        scores = score_mod(scores)
    if causal:
        keep = causal_keep(q.shape[-2], k.shape[-2], q.device)    # (Tq, Tk)
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(scores.dtype)
    return scores


def eager_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None):
    """softmax(Q Kᵀ · scale, masked) in the input dtype: (B, H, Tq, Tk)."""
    import torch
    return torch.softmax(masked_scores(q, k, mask, causal, scale, upcast=False, score_mod=score_mod), dim=-1)


def eager_fp32_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None):
    """Scores and softmax in fp32, cast back to the input dtype: (B, H, Tq, Tk)."""
    import torch
    return torch.softmax(masked_scores(q, k, mask, causal, scale, upcast=True, score_mod=score_mod),
                         dim=-1).to(q.dtype)


def _from_probs(probs_fn, pair_kv=kv_for_queries):
    """Attention from a probability function: probs(q, k) @ v, v's heads paired with the
    query heads as `pair_kv` pairs them."""
    def attention(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None):
        probs = probs_fn(q, k, mask=mask, causal=causal, scale=scale, score_mod=score_mod)
        return probs @ pair_kv(q, v)                               # (B, H, Tq, d)
    attention.__doc__ = probs_fn.__doc__
    return attention


eager_attention = _from_probs(eager_probs)
eager_attention.__doc__ = "softmax(Q Kᵀ · scale, masked) V, every step in the input dtype (the textbook code)."
eager_fp32_attention = _from_probs(eager_fp32_probs)
