"""Negative controls: deliberately defective hand-written attention the audit must flag.
Each is a weights function (its defect in the hand-written form); variants._builtins registers
it as `broken.<name>` with the scenarios its defect shows in (docs/extending.md)."""
from __future__ import annotations

from .eager import eager_lse_attention, eager_probs, kv_for_queries, masked_scores
from .draws import causal_keep


def _keep_mask(q, k, mask, causal):
    """Bool (…, Tq, Tk) of allowed pairs from causal and a bool or float mask, or None."""
    import torch
    keep = causal_keep(q.shape[-2], k.shape[-2], q.device) if causal else None
    if mask is not None:
        m = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
        keep = m if keep is None else (keep & m)
    return keep


def broken_unscaled_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None):
    """Forgets 1/sqrt(d_k): scores have std sqrt(d_k) and softmax saturates."""
    import torch
    return torch.softmax(masked_scores(q, k, mask, causal, 1.0, upcast=False, score_mod=score_mod), dim=-1)


def broken_mask_after_softmax_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None):
    """The seed's wrong way: softmax over every key, then zero the masked ones and renormalize."""
    import torch
    probs = torch.softmax(masked_scores(q, k, None, False, scale, upcast=False, score_mod=score_mod), dim=-1)
    keep = _keep_mask(q, k, mask, causal)
    if keep is not None:
        probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def broken_clamped_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None):
    """The seed's `clamp(min=1e-6)` after softmax: weight returns to masked positions."""
    import torch
    return torch.clamp(eager_probs(q, k, mask=mask, causal=causal, scale=scale, score_mod=score_mod), min=1e-6)


def broken_no_max_subtraction_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None):
    """exp(scores) / sum without subtracting the row max: overflows on large logits."""
    e = masked_scores(q, k, mask, causal, scale, upcast=False, score_mod=score_mod).exp()
    return e / e.sum(dim=-1, keepdim=True)


def broken_softmax_wrong_dim_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None):
    """softmax over the query axis (dim=-2) instead of the key axis."""
    import torch
    return torch.softmax(masked_scores(q, k, mask, causal, scale, upcast=False, score_mod=score_mod), dim=-2)


def broken_zero_keys_as_padding_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None):
    """Takes every all-zero key for padding: keys whose vector is exactly 0 are masked out before softmax."""
    import torch
    padding = (kv_for_queries(q, k) == 0).all(-1)[..., None, :]   # (B, H, 1, Tk): the key is all zeros
    scores = masked_scores(q, k, mask, causal, scale, upcast=False, score_mod=score_mod)  # (B, H, Tq, Tk)
    return torch.softmax(scores.masked_fill(padding, float("-inf")), dim=-1)


def kv_tiled(q, t):
    """The GQA pairing bug: k or v tiled over the query heads (B, H, Tk, d), so query head h
    meets key/value head h % Hkv instead of h // (H / Hkv)."""
    group = q.shape[-3] // t.shape[-3]
    return t if group == 1 else t.repeat(1, group, 1, 1)


def broken_gqa_wrong_head_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None):
    """GQA with the wrong pairing: query head h attends with key/value head h % kv_heads."""
    return eager_probs(q, kv_tiled(q, k), mask=mask, causal=causal, scale=scale, score_mod=score_mod)


# Right forward, wrong backward: eager's forward with a backward that makes a known mistake,
# written as autograd sees it (no custom autograd.Function: a reproduction script copies these).
# Only the gradient budget can flag them. `t.detach() + c * (t - t.detach())` is t exactly in
# the forward and c times its gradient in the backward.
BACKWARD_CONTROLS: dict[str, str] = {
    "rowsum_d_missing": "a backward without FlashAttention's D = rowsum(dO ∘ O) term in dS",
    "dq_scale_missing": "a backward that leaves the softmax scale out of dq",
}


def broken_backward_rowsum_d_missing(q, k, v, *, mask=None, causal=False, scale=None):
    """eager's forward; its backward takes dS = P ∘ dP instead of P ∘ (dP - D): the weights enter
    as P.detach() · exp(S - S.detach()), which is P in the forward and has P as its derivative."""
    import torch
    s = masked_scores(q, k, mask, causal, scale, upcast=False)                  # (B, H, Tq, Tk)
    p = torch.softmax(s, dim=-1)
    finite = torch.where(torch.isfinite(s), s, torch.zeros_like(s))           # masked: no gradient
    p = p.detach() * torch.exp(finite - finite.detach())
    return p @ kv_for_queries(q, v)                                            # (B, H, Tq, d)


def broken_backward_dq_scale_missing(q, k, v, *, mask=None, causal=False, scale=None):
    """eager's forward; its backward leaves the softmax scale out of dq (dq is 1/scale times too large)."""
    factor = 1.0 / (q.shape[-1] ** -0.5 if scale is None else scale)
    q = q.detach() + factor * (q - q.detach())                                # q itself; dq × 1/scale
    return eager_probs(q, k, mask=mask, causal=causal, scale=scale) @ kv_for_queries(q, v)


# Right output, wrong or missing extra: the log-sum-exp a kernel returns beside out, and the
# attention sinks it takes (docs/numerics.md: the LSE and sinks checks). Each is eager's
# (out, lse) with one thing wrong; only the LSE, merge, LSE-gradient or sinks checks can flag them.
LSE_CONTROLS: dict[str, str] = {
    "sink_ignored": "takes the sinks argument and drops it (vllm-project/vllm#52148)",
    "lse_base2": "returns its log-sum-exp in base 2 (pytorch/pytorch#181645)",
    "lse_no_grad": "returns a log-sum-exp no gradient flows back through (pytorch/torchtitan#4796)",
}


def broken_sink_ignored_probs(q, k, *, mask=None, causal=False, scale=None, score_mod=None, sinks=None):
    """The weights broken_sink_ignored uses: eager's over the keys, the sinks dropped."""
    return eager_probs(q, k, mask=mask, causal=causal, scale=scale, score_mod=score_mod)


def broken_sink_ignored(q, k, v, *, mask=None, causal=False, scale=None, sinks=None):
    """eager's (out, lse) with the sinks taken and ignored: each row's weight stays on its keys."""
    return eager_lse_attention(q, k, v, mask=mask, causal=causal, scale=scale)


def broken_lse_base2(q, k, v, *, mask=None, causal=False, scale=None, sinks=None):
    """eager's (out, lse) with lse = log2(sum exp(s)): a kernel working in exp2 that forgets to
    convert its log-sum-exp back to base e (divides it by ln 2)."""
    import math
    out, lse = eager_lse_attention(q, k, v, mask=mask, causal=causal, scale=scale, sinks=sinks)
    return out, lse / math.log(2.0)


def broken_lse_no_grad(q, k, v, *, mask=None, causal=False, scale=None, sinks=None):
    """eager's (out, lse) with the lse detached: right values, no gradient through them."""
    out, lse = eager_lse_attention(q, k, v, mask=mask, causal=causal, scale=scale, sinks=sinks)
    return out, lse.detach()
