"""Plug-ins for the GQA and score-modification tests: what a plug-in declares decides what it gets.

Put this folder on sys.path (monkeypatch.syspath_prepend or PYTHONPATH) to load them.
"""
from __future__ import annotations


def declared(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None):
    """Attention taking GQA (k, v with fewer heads) and a score modification, as declared."""
    import torch
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)     # (B, H, Tk, d)
    scores = (q @ k.transpose(-2, -1)) * scale                             # (B, H, Tq, Tk)
    if score_mod is not None:
        scores = score_mod(scores)
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.softmax(scores, dim=-1) @ v                               # (B, H, Tq, d)


declared.audit_supports = ("gqa", "score_mod")


def undeclared(q, k, v, *, mask=None, causal=False, scale=None, **ignored):
    """Multi-head attention that declares nothing: it would broadcast an MQA cell's single
    key/value head (right by accident) and swallow a score_mod in **ignored (wrong)."""
    return declared(q, k, v, mask=mask, causal=causal, scale=scale)


def declared_as_string(q, k, v, **kwargs):
    """audit_supports must be a tuple of names, not one string."""
    return declared(q, k, v, **kwargs)


declared_as_string.audit_supports = "gqa"


def unknown_feature(q, k, v, **kwargs):
    """Declares a feature the audit does not know."""
    return declared(q, k, v, **kwargs)


unknown_feature.audit_supports = ("gqa", "rope")
