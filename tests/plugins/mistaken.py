"""Attention implementations that each make one known mistake (audit.workload.mistakes), written
as such code is, independently of the library: the diagnosis must name each one's mistake.

Every function has the variants' signature fn(q, k, v, *, mask=None, causal=False, scale=None,
score_mod=None); `correct` makes none (0 on rows that see no key, SDPA's convention).
"""
from __future__ import annotations

import torch


def grouped(q, t):
    """k or v (B, Hkv, Tk, d) -> (B, H, Tk, d): query head h reads kv head h // (H / Hkv)."""
    return t.repeat_interleave(q.shape[1] // t.shape[1], dim=1)


def attention(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None, pair=grouped,
              diagonal=0, upper=False, use_causal=True, use_mask=True, invert=False, fill=float("-inf"),
              dim=-1, swap_qk=False, empty_rows_zero=False, sinks=None):
    """Hand-written attention in fp32 with switches for the mistakes; all off: correct (NaN on
    rows that see no key unless empty_rows_zero or a sink takes their weight). sinks: (H,) logits,
    one more softmax column per head, dropped after it."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    kk, vv = pair(q, k), pair(q, v)                                          # (B, H, Tk, d)
    scores = ((kk @ q.transpose(-2, -1)) if swap_qk else (q @ kk.transpose(-2, -1))) * scale
    if score_mod is not None:
        scores = score_mod(scores)                                           # (B, H, Tq, Tk)
    keep = None
    if causal and use_causal:
        ones = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
        keep = ones.triu(diagonal) if upper else ones.tril(diagonal)         # (Tq, Tk)
    if mask is not None and use_mask:
        if mask.dtype == torch.bool:
            m = ~mask if invert else mask
            keep = m if keep is None else keep & m
        else:
            scores = scores + mask
    if keep is not None:
        scores = scores.masked_fill(~keep, fill)
    if sinks is not None:
        column = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=dim)
    if empty_rows_zero:
        probs = torch.nan_to_num(probs, nan=0.0)
    return probs @ vv                                                        # (B, H, Tq, d)


def _keep(q, k, mask, causal):
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
    if causal:
        keep = keep.tril()
    if mask is not None:
        keep = keep & (mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min)
    return keep                                                              # (…, Tq, Tk)


def correct(q, k, v, **kw):
    return attention(q, k, v, empty_rows_zero=True, **kw)


def gqa_interleaved(q, k, v, **kw):
    return attention(q, k, v, pair=lambda q, t: t.repeat(1, q.shape[1] // t.shape[1], 1, 1), **kw)


def gqa_permuted(q, k, v, **kw):
    """Groups rotated by one: query head h reads kv head (h // group + 1) % kv_heads."""
    def rotated(q, t):
        group = q.shape[1] // t.shape[1]
        index = torch.tensor([(h // group + 1) % t.shape[1] for h in range(q.shape[1])], device=t.device)
        return t.index_select(1, index)
    return attention(q, k, v, pair=rotated, **kw)


def causal_alignment_swapped(q, k, v, **kw):
    return attention(q, k, v, diagonal=k.shape[-2] - q.shape[-2], **kw)     # bottom-right


def causal_diagonal_excluded(q, k, v, **kw):
    return attention(q, k, v, diagonal=-1, **kw)


def causal_next_key(q, k, v, **kw):
    return attention(q, k, v, diagonal=1, **kw)


def causal_upper(q, k, v, **kw):
    return attention(q, k, v, upper=True, **kw)


def causal_ignored(q, k, v, **kw):
    return attention(q, k, v, use_causal=False, **kw)


def mask_ignored(q, k, v, **kw):
    return attention(q, k, v, use_mask=False, **kw)


def mask_inverted(q, k, v, **kw):
    return attention(q, k, v, invert=True, **kw)


def mask_after_softmax(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    probs = torch.softmax((q @ grouped(q, k).transpose(-2, -1)) * scale, dim=-1)   # over every key ...
    return (probs * _keep(q, k, mask, causal)) @ grouped(q, v)               # ... then zero the masked


def mask_after_softmax_renormalised(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    probs = torch.softmax((q @ grouped(q, k).transpose(-2, -1)) * scale, dim=-1)
    probs = probs * _keep(q, k, mask, causal)
    return (probs / probs.sum(-1, keepdim=True)) @ grouped(q, v)


def fully_masked_nan(q, k, v, **kw):
    return attention(q, k, v, **kw)                                          # softmax of all -inf: NaN


def fully_masked_uniform(q, k, v, **kw):
    return attention(q, k, v, fill=torch.finfo(q.dtype).min, **kw)


def zero_keys_as_padding(q, k, v, *, mask=None, **kw):
    """Keys whose vector is all zeros taken for padding: masked out with the mask's padded keys."""
    real = (grouped(q, k) != 0).any(-1)[:, :, None, :]                      # (B, H, 1, Tk)
    if mask is not None:
        real = real & (mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min)
    return attention(q, k, v, mask=real, **kw)


def scale_squared(q, k, v, **kw):
    kw.pop("scale", None)
    return attention(q, k, v, scale=1.0 / q.shape[-1], **kw)


def scale_missing(q, k, v, **kw):
    kw.pop("scale", None)
    return attention(q, k, v, scale=1.0, **kw)


def scale_inverted(q, k, v, **kw):
    kw.pop("scale", None)
    return attention(q, k, v, scale=q.shape[-1] ** 0.5, **kw)


def softmax_wrong_dim(q, k, v, **kw):
    return attention(q, k, v, dim=-2, **kw)


def qk_swapped(q, k, v, **kw):
    return attention(q, k, v, swap_qk=True, **kw)


def last_key_dropped(q, k, v, *, mask=None, **kw):
    mask = None if mask is None else mask[..., :-1]
    return attention(q, k[..., :-1, :], v[..., :-1, :], mask=mask, **kw)


def probs_clamped(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ grouped(q, k).transpose(-2, -1)) * scale
    probs = torch.softmax(scores.masked_fill(~_keep(q, k, mask, causal), float("-inf")), dim=-1)
    return probs.clamp(min=1e-6) @ grouped(q, v)


def no_max_subtraction(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ grouped(q, k).transpose(-2, -1)) * scale
    e = scores.masked_fill(~_keep(q, k, mask, causal), float("-inf")).exp()
    return (e / e.sum(-1, keepdim=True)) @ grouped(q, v)


def score_mod_ignored(q, k, v, *, score_mod=None, **kw):
    return attention(q, k, v, **kw)


def sink_ignored(q, k, v, *, sinks=None, **kw):
    return attention(q, k, v, empty_rows_zero=True, **kw)


def sink_after_normalisation(q, k, v, *, sinks=None, **kw):
    out = attention(q, k, v, empty_rows_zero=True, **kw)                    # normalised over the keys first
    return out / (1.0 + torch.exp(sinks.float())).view(1, -1, 1, 1)


def sink_shared(q, k, v, *, sinks=None, **kw):
    return attention(q, k, v, empty_rows_zero=True, sinks=sinks[:1].expand_as(sinks), **kw)


def sink_wrong_head(q, k, v, *, sinks=None, **kw):
    return attention(q, k, v, empty_rows_zero=True, sinks=sinks.roll(-1), **kw)


def document_boundary_ignored(q, k, v, *, mask=None, **kw):
    """Packed documents given as one sequence per row: only the keys no document owns are masked."""
    owned = mask.any(dim=-2, keepdim=True)                                   # (B, 1, 1, Tk): some row sees it
    return attention(q, k, v, mask=owned, empty_rows_zero=True, **kw)


def cu_seqlens_off_by_one(q, k, v, *, mask=None, **kw):
    """The documents' boundaries, read off the document mask, each interior one a token late."""
    B, T = mask.shape[0], mask.shape[-1]
    owned = mask[:, 0].any(-1)                                               # (B, T): rows a document owns
    first = mask[:, 0].float().argmax(-1)                                    # (B, T): its document's first token
    starts = sorted({b * T + int(first[b, i]) for b in range(B) for i in range(T) if owned[b, i]})
    end = max(b * T + i for b in range(B) for i in range(T) if owned[b, i]) + 1
    bounds = [0] + [s + 1 for s in starts[1:]] + [end]
    owner = torch.full((B * T,), -1)
    for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
        owner[a:b] = n
    owner = owner.reshape(B, T)
    keep = (owner[:, :, None] == owner[:, None, :]) & (owner[:, :, None] >= 0)   # (B, T, T)
    return attention(q, k, v, mask=keep[:, None], empty_rows_zero=True, **kw)


def v_read_at_k_stride(q, k, v, **kw):
    """Where V's head size differs from K's, row j of V read from element j·d_k of its flat values."""
    B, H, T, dv = v.shape
    d = q.shape[-1]
    flat = torch.cat([v.reshape(B, H, T * dv), v.new_zeros(B, H, T * d + dv)], dim=-1)
    rows = torch.stack([flat[..., j * d:j * d + dv] for j in range(T)], dim=2)   # (B, H, T, dv): 0 past the end
    return attention(q, k, rows, empty_rows_zero=True, **kw)


def _document_ranges(q, k, v, *, mask=None, key_start=0, key_end=0, query_shift=0, key_shift=0, **kw):
    """Packed documents read off the document mask, their ranges mistaken: query p of document d (by
    the queries' boundaries, each interior one moved by query_shift) sees the keys of its batch row
    from start + key_start to end + key_end (the keys' boundaries moved by key_shift)."""
    B, T = mask.shape[0], mask.shape[-1]
    owned = mask[:, 0].any(-1)                                               # (B, T): rows a document owns
    first = mask[:, 0].float().argmax(-1)                                    # (B, T): its document's first token
    starts = sorted({b * T + int(first[b, i]) for b in range(B) for i in range(T) if owned[b, i]})
    end = max(b * T + i for b in range(B) for i in range(T) if owned[b, i]) + 1
    bounds = [0] + starts[1:] + [end]
    q_bounds = torch.tensor(bounds[:1] + [s + query_shift for s in bounds[1:-1]] + bounds[-1:])
    k_bounds = bounds[:1] + [s + key_shift for s in bounds[1:-1]] + bounds[-1:]
    keep = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            p = b * T + i
            if p >= end:
                continue
            doc = int(torch.searchsorted(q_bounds, torch.tensor(p), right=True)) - 1
            lo, hi = k_bounds[doc] + key_start, k_bounds[doc + 1] + key_end
            for j in range(T):
                keep[b, i, j] = lo <= b * T + j < hi
    return attention(q, k, v, mask=keep[:, None], empty_rows_zero=True, **kw)


def cu_seqlens_one_early(q, k, v, **kw):
    return _document_ranges(q, k, v, query_shift=-1, key_shift=-1, **kw)


def document_keys_end_inclusive(q, k, v, **kw):
    return _document_ranges(q, k, v, key_end=1, **kw)


def document_keys_end_short(q, k, v, **kw):
    return _document_ranges(q, k, v, key_end=-1, **kw)


def document_keys_start_early(q, k, v, **kw):
    return _document_ranges(q, k, v, key_start=-1, **kw)


def document_keys_start_exclusive(q, k, v, **kw):
    return _document_ranges(q, k, v, key_start=1, **kw)


def document_queries_late(q, k, v, **kw):
    return _document_ranges(q, k, v, query_shift=1, **kw)


def document_queries_early(q, k, v, **kw):
    return _document_ranges(q, k, v, query_shift=-1, **kw)


def strides_ignored(q, k, v, **kw):
    """Each of q, k, v read from its storage as a contiguous (B, H, T, d) block from where it starts."""
    def raw(t):
        return t if t.is_contiguous() else t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), t.shape)
    return attention(raw(q), raw(k), raw(v), **kw)


def _window_bounds(q, k, v, *, mask=None, causal=False, left=0, right=0, **kw):
    """A sliding window (read off the cell's window mask: row 0 sees its width w of keys) with its left
    end `left` keys wider and its right end `right`: keys j with -(w - 1 + left) <= j - i <= w - 1 + right."""
    width = int(mask[0, 0, 0].sum())
    d = torch.arange(k.shape[-2])[None, :] - torch.arange(q.shape[-2])[:, None]       # (Tq, Tk): j - i
    keep = (d >= -(width - 1 + left)) & (d <= width - 1 + right)
    return attention(q, k, v, mask=keep, causal=causal, **kw)


def window_left_inclusive(q, k, v, **kw):
    return _window_bounds(q, k, v, left=1, **kw)


def window_left_short(q, k, v, **kw):
    return _window_bounds(q, k, v, left=-1, **kw)


def window_right_inclusive(q, k, v, **kw):
    return _window_bounds(q, k, v, right=1, **kw)


def window_right_short(q, k, v, **kw):
    return _window_bounds(q, k, v, right=-1, **kw)


def window_both_inclusive(q, k, v, **kw):
    return _window_bounds(q, k, v, left=1, right=1, **kw)
