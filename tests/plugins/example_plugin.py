"""A tiny attention plug-in used by the unit tests (`example_plugin:my_attention`).

Put this folder on sys.path (monkeypatch.syspath_prepend or PYTHONPATH) to load it.
"""
from __future__ import annotations

NOT_CALLABLE = 42


def my_attention(q, k, v, *, mask=None, causal=False, scale=None):
    """Plain softmax attention written as a user plug-in.

    This second paragraph is not part of the description.
    """
    import torch
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale                          # (B, H, Tq, Tk)
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.softmax(scores, dim=-1) @ v                            # (B, H, Tq, d)


def undocumented_attention(q, k, v, **kwargs):
    return my_attention(q, k, v, **kwargs)


class Holder:
    @staticmethod
    def attention(q, k, v, **kwargs):
        """Nested attribute form: example_plugin:Holder.attention."""
        return my_attention(q, k, v, **kwargs)
