"""Hand-written attention: the textbook code every other variant is compared with.

    fn(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None) -> out

q: (B, H, Tq, d); k, v: (B, Hkv, Tk, d); out: (B, H, Tq, d_v), in q's dtype (docs/variants.md).
`eager` is the same-dtype baseline of the error budgets; its weights (eager_probs) are what
the negative controls (workload/controls.py) get wrong.
"""
from __future__ import annotations

from .draws import causal_keep


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


def softmax_with_sinks(scores, sinks=None):
    """softmax over the keys, with one more column per head when `sinks` is given: gpt-oss's
    attention sink, a learned logit per query head with no value. It takes its share of every
    row's weight (all of it on a row that sees no key) and is dropped after the softmax.
    scores: (B, H, Tq, Tk); sinks: (H,) or None -> (B, H, Tq, Tk)."""
    import torch
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    column = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)   # (B, H, Tq, 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def eager_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None, sinks=None):
    """softmax(Q Kᵀ · scale, masked) in the input dtype: (B, H, Tq, Tk)."""
    return softmax_with_sinks(masked_scores(q, k, mask, causal, scale, upcast=False, score_mod=score_mod), sinks)


def eager_fp32_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None, sinks=None):
    """Scores and softmax in fp32, cast back to the input dtype: (B, H, Tq, Tk)."""
    return softmax_with_sinks(masked_scores(q, k, mask, causal, scale, upcast=True, score_mod=score_mod),
                              sinks).to(q.dtype)


def _from_probs(probs_fn, pair_kv=kv_for_queries):
    """Attention from a probability function: probs(q, k) @ v, v's heads paired with the
    query heads as `pair_kv` pairs them."""
    def attention(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None, sinks=None):
        extra = {} if sinks is None else {"sinks": sinks}          # only a sinks cell passes them
        probs = probs_fn(q, k, mask=mask, causal=causal, scale=scale, score_mod=score_mod, **extra)
        return probs @ pair_kv(q, v)                               # (B, H, Tq, d)
    attention.__doc__ = probs_fn.__doc__
    return attention


def _with_lse(upcast: bool):
    """The hand-written attention that also returns its log-sum-exp: (out (B, H, Tq, d_v), lse
    (B, H, Tq)), lse = logsumexp of the masked, scaled scores over the keys (natural log; the sink
    left out, the convention a merge and the renormalisation out · sigmoid(lse - sink) need; -inf
    on a row that sees no key), in the dtype the scores are computed in."""
    def attention(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None, sinks=None):
        import torch
        scores = masked_scores(q, k, mask, causal, scale, upcast=upcast, score_mod=score_mod)  # (B, H, Tq, Tk)
        probs = softmax_with_sinks(scores, sinks).to(q.dtype)
        return probs @ kv_for_queries(q, v), torch.logsumexp(scores, dim=-1)               # (B, H, Tq, d), (B, H, Tq)
    return attention


eager_lse_attention = _with_lse(upcast=False)
eager_lse_attention.__doc__ = ("softmax(Q Kᵀ · scale, masked) V in the input dtype, and the scores' logsumexp "
                               "(the `eager` variant: out, lse).")
eager_fp32_lse_attention = _with_lse(upcast=True)
eager_fp32_lse_attention.__doc__ = "eager_lse_attention with scores, softmax and logsumexp in fp32."

eager_attention = _from_probs(eager_probs)
eager_attention.__doc__ = "softmax(Q Kᵀ · scale, masked) V, every step in the input dtype (the textbook code)."
eager_fp32_attention = _from_probs(eager_fp32_probs)
