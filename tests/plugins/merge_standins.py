"""Stand-ins of two libraries' merge functions, exact signatures and conventions, since neither package
runs here (tests/test_merge_functions.py): FlashInfer's `merge_state(v_a, s_a, v_b, s_b) -> (v, s)`
(v (tokens, heads, d), s (tokens, heads) float32 in base 2) and vLLM's `merge_attn_states(output,
prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)` (writes output; lse (heads, tokens),
natural log). Both read an empty part's -inf, and FlashAttention's +inf, as empty; `merge_state_nan_on_empty`
is FlashInfer's form with the mistake of vllm #27491 (two empty parts give NaN). Like the libraries' CUDA
kernels they carry no gradient (torch.no_grad). Imports torch only, so a reproduction script can import
them as it would import the library."""
from __future__ import annotations

import math

import torch


def _as_empty(*lses):
    return [torch.where(s == math.inf, -math.inf, s) for s in lses]


@torch.no_grad()
def merge_state(v_a, s_a, v_b, s_b):
    assert v_a.dim() == 3 and s_a.shape == v_a.shape[:2] and s_a.dtype == torch.float32
    s_a, s_b = _as_empty(s_a, s_b)
    m = torch.maximum(s_a, s_b)
    safe = torch.where(m == -math.inf, torch.zeros_like(m), m)
    w_a, w_b = torch.exp2(s_a - safe), torch.exp2(s_b - safe)
    total = w_a + w_b
    v = (w_a[..., None] * v_a.float() + w_b[..., None] * v_b.float()) / torch.where(total == 0, 1.0, total)[..., None]
    return v.to(v_a.dtype), torch.where(total == 0, torch.full_like(m, -math.inf), safe + torch.log2(total))


@torch.no_grad()
def merge_state_nan_on_empty(v_a, s_a, v_b, s_b):
    s_a, s_b = _as_empty(s_a, s_b)
    m = torch.maximum(s_a, s_b)                                     # no guard: exp2(-inf - -inf) is NaN
    w_a, w_b = torch.exp2(s_a - m), torch.exp2(s_b - m)
    v = (w_a[..., None] * v_a.float() + w_b[..., None] * v_b.float()) / (w_a + w_b)[..., None]
    return v.to(v_a.dtype), m + torch.log2(w_a + w_b)


@torch.no_grad()
def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None):
    p, s = (t.t() for t in _as_empty(prefix_lse, suffix_lse))        # (tokens, heads)
    m = torch.maximum(p, s)
    safe = torch.where(m == -math.inf, torch.zeros_like(m), m)
    w_p, w_s = torch.exp(p - safe), torch.exp(s - safe)
    total = w_p + w_s
    out = (w_p[..., None] * prefix_output.float() + w_s[..., None] * suffix_output.float()) / \
        torch.where(total == 0, 1.0, total)[..., None]
    output.copy_(out.to(output.dtype))
    if output_lse is not None:
        output_lse.copy_(torch.where(total == 0, torch.full_like(m, -math.inf), safe + torch.log(total)).t())
