"""Plug-ins for the determinism check: attention summed over key blocks in an order.

`racy` takes another order on every call, as a GPU kernel's atomic adds land in whatever
order the blocks finish: float addition is not associative, so the output and, through
the backward of the shuffled sums, every gradient change in the last bits from call to call. Under
torch.use_deterministic_algorithms(True) it keeps the fixed order, as a kernel with a
deterministic mode does. `ordered` always sums in the fixed order: deterministic.
`stubborn` is racy and refuses to run under deterministic algorithms.
"""
from __future__ import annotations

import itertools
import random

import torch

BLOCK = 4


def _blockwise(q, k, v, mask, causal, scale, order):
    """softmax(q kᵀ · scale) v with the softmax's sum and P·V summed over key blocks in `order`."""
    tq, tk = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale                                   # (B, H, Tq, Tk)
    if causal:
        keep = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    e = (scores - scores.amax(-1, keepdim=True)).exp()                           # (B, H, Tq, Tk)
    starts = list(range(0, tk, BLOCK))
    num = den = None
    for i in order(len(starts)):
        block = slice(starts[i], starts[i] + BLOCK)
        part = e[..., block] @ v[..., block, :]                                  # (B, H, Tq, d)
        part_den = e[..., block].sum(-1, keepdim=True)                           # (B, H, Tq, 1)
        num = part if num is None else num + part
        den = part_den if den is None else den + part_den
    return num / den


_CALLS = itertools.count()


def _changing_order(n):
    """Another shuffle of the blocks on every call (as atomic adds land in whatever order the
    blocks finish), or the blocks in order under deterministic algorithms."""
    order = list(range(n))
    if not torch.are_deterministic_algorithms_enabled():
        random.Random(next(_CALLS)).shuffle(order)
    return order


def racy(q, k, v, *, mask=None, causal=False, scale=None):
    """Key blocks summed in another order per call (fixed under deterministic algorithms)."""
    return _blockwise(q, k, v, mask, causal, scale, _changing_order)


def ordered(q, k, v, *, mask=None, causal=False, scale=None):
    """Key blocks summed in their order: bitwise identical from call to call."""
    return _blockwise(q, k, v, mask, causal, scale, lambda n: range(n))


def stubborn(q, k, v, *, mask=None, causal=False, scale=None):
    """Racy, and under deterministic algorithms it refuses as torch's own kernels do (a C++
    extension calls at::globalContext().alertNotDeterministic, which raises this message;
    no CPU kernel of torch raises it, so the stand-in raises it itself)."""
    if torch.are_deterministic_algorithms_enabled():
        raise RuntimeError("stubborn_attention does not have a deterministic implementation, but you set "
                           "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just "
                           "for this operation, or you can use the 'warn_only=True' option, if that's "
                           "acceptable for your application.")
    return racy(q, k, v, mask=mask, causal=causal, scale=scale)
