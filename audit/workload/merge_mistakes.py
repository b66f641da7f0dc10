"""Known mistakes of functions that merge partial attention, for the diagnosis and as negative controls.

Each mistake is a merge of the "pairs" form (workload/merge_functions.py): fn(out_a, lse_a, out_b,
lse_b) -> (out, lse), out (B, H, T, d), lse (B, H, T) natural log, returned in float64 (the exponentials
of `no_max_subtracted` in float32, where its overflow is). measure/merging names the mistakes whose
merge of the same parts gives what a function gave; the negative control `broken_merge.<name>` is the
mistake's own function. Each mistake is that one mistake: an empty part (lse -inf, or FlashAttention's
+inf) is read as empty by every one but the mistake about it.

Sources: vllm #27491 (two empty chunks of MLA chunked prefill give NaN; fixed by vllm PR #28181 and
#39148), flashinfer #4051 (merge((0, -inf), (0, -inf)) must be (0, -inf); PRs #4054 and #5262),
flash-attention PR #978 and #1936 (an empty row's lse is +inf), ring-flash-attention PR #34 (the
sigmoid update torch's context parallelism runs).
Imports no torch at module level; the functions do.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from .merge_functions import merge_partials
from .mistake_base import Mistake, register

MERGE_MISTAKES: dict[str, Mistake] = {}


def merge_mistake(name: str, *, title: str, what: str, where: str) -> Callable[[Callable], Callable]:
    """Register a mistaken merge (its function has the pairs form)."""
    def add(fn: Callable) -> Callable:
        register(MERGE_MISTAKES, Mistake(name, title, what, where, fn))
        return fn
    return add


def _empty_as_neg_inf(*lses: Any) -> list[Any]:
    """The lses in float64 with +inf (FlashAttention's empty row) read as -inf, as a right merge reads it."""
    import torch
    return [torch.where(t.double() == math.inf, torch.full_like(t.double(), -math.inf), t.double()) for t in lses]


def _weighted(out_a: Any, out_b: Any, w_a: Any, w_b: Any) -> Any:
    """(w_a · out_a + w_b · out_b) / (w_a + w_b): w (B, H, T) -> (B, H, T, d), NaN where both weigh 0."""
    return (w_a[..., None] * out_a.double() + w_b[..., None] * out_b.double()) / (w_a + w_b)[..., None]


@merge_mistake("nan_on_empty", title="NaN on two empty parts",
               what="subtracts the larger lse with no guard for a row empty in both parts: exp(-inf - -inf) is NaN",
               where="split-KV and chunked-prefill merges (vllm #27491: MLA chunked prefill; flashinfer #4051)")
def nan_on_empty(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    import torch
    a, b = _empty_as_neg_inf(lse_a, lse_b)
    m = torch.maximum(a, b)                                                  # (B, H, T): -inf on an empty row
    w_a, w_b = torch.exp(a - m), torch.exp(b - m)
    return _weighted(out_a, out_b, w_a, w_b), m + torch.log(w_a + w_b)


@merge_mistake("no_max_subtracted", title="exponentials without the max",
               what="weighs each part by exp(lse) itself, in float32: past lse 88 the exponential overflows to inf "
                    "and the row is NaN",
               where="hand-written split-KV merges")
def no_max_subtracted(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    import torch
    a, b = _empty_as_neg_inf(lse_a, lse_b)
    e_a, e_b = torch.exp(a.float()).double(), torch.exp(b.float()).double()   # float32 overflows past 88.7
    return _weighted(out_a, out_b, e_a, e_b), torch.log(e_a + e_b)


@merge_mistake("lse_base_mixed", title="the lse's base mixed up",
               what="reads and writes a natural-log lse as base 2 (exp2, log2), as FlashInfer's kernels keep theirs",
               where="a merge moved between libraries (FlashInfer's merge_state takes base 2)")
def lse_base_mixed(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    import torch
    a, b = _empty_as_neg_inf(lse_a, lse_b)
    m = torch.maximum(a, b)
    safe = torch.where(m == -math.inf, torch.zeros_like(m), m)
    w_a, w_b = torch.exp2(a - safe), torch.exp2(b - safe)
    total = w_a + w_b
    out = torch.where((total == 0)[..., None], torch.zeros_like(out_a.double()), _weighted(out_a, out_b, w_a, w_b))
    return out, safe + torch.log2(total)


@merge_mistake("lse_not_updated", title="the merged lse not updated",
               what="merges out right but returns the first part's lse: right for one merge, wrong in a chain",
               where="ring attention and multi-split merges that keep a running lse")
def lse_not_updated(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    out, _ = merge_partials((out_a, lse_a), (out_b, lse_b))
    return out, lse_a.double()


@merge_mistake("posinf_wins", title="a +inf part wins the merge",
               what="reads FlashAttention's +inf lse of an empty part as a real one: the larger lse takes all the "
                    "weight, so the merge returns the empty part (out 0, lse +inf)",
               where="merges fed by FlashAttention kernels (flash-attention PR #978, PR #1936)")
def posinf_wins(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    import torch
    a, b = lse_a.double(), lse_b.double()
    m = torch.maximum(a, b)
    w_a = torch.where(a == m, torch.ones_like(a), torch.exp(a - m))        # the largest weighs 1, +inf too
    w_b = torch.where(b == m, torch.ones_like(b), torch.exp(b - m))
    return _weighted(out_a, out_b, w_a, w_b), m + torch.log(w_a + w_b)


@merge_mistake("sigmoid_update", title="the sigmoid update on an empty part",
               what="updates out - sigmoid(lse_b - lse_a)·(out - out_b) and lse - logsigmoid(lse_a - lse_b), reading "
                    "no infinity as empty: an empty running part gives lse -inf + inf = NaN, two give NaN, and a +inf "
                    "part wins",
               where="ring attention's merge (ring-flash-attention PR #34), torch's context parallelism (_SDPAMerger)")
def sigmoid_update(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    import torch
    a, b = lse_a.double(), lse_b.double()
    o_a, o_b = out_a.double(), out_b.double()
    out = o_a - torch.sigmoid(b - a)[..., None] * (o_a - o_b)
    return out, a - torch.nn.functional.logsigmoid(a - b)


@merge_mistake("weights_detached", title="the merge weights detached",
               what="merges from detached lses: right values, but no gradient reaches the parts' lses through "
                    "the weights (a ring attention backward that drops the lse's gradient)",
               where="hand-written ring and context-parallel attention backward passes")
def weights_detached(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    out, lse = merge_partials((out_a, lse_a.detach()), (out_b, lse_b.detach()))
    return out, lse


GRAD_BAD = ("nan", "wrong")   # the outcomes of a gradient through a merge that are defects (measure/merging/gradients.py)
GOLDEN_PARTS = "golden"     # who made a partial state's parts: the float64 golden, else the attention variant's name


def parts_label(state: str, parts_from: str | None) -> str:
    """A partial state's name, and @variant where a kernel made its parts: 'ring_4@eager'."""
    return state + (f"@{parts_from}" if parts_from and parts_from != GOLDEN_PARTS else "")


# What an attention kernel's part may hold on a row that sees none of its keys, where a merge wants (out 0,
# lse -inf), or in its lse on every row (measure/merging/states.parts_defects): each a convention of real
# kernels that breaks merges, or the merges that do not expect it.
PART_DEFECTS = {
    "lse_finite_on_empty": "a finite lse (torch's CPU flash op: 0) on rows that see no key: weighed in as a real part",
    "lse_posinf_on_empty": "lse +inf on rows that see no key (FlashAttention's convention, flash-attention PR #978)",
    "lse_nan_on_empty": "lse NaN on rows that see no key",
    "out_nan_on_empty": "out NaN on rows that see no key (a merge that does not weigh an empty part by 0 gives NaN)",
    # and on every row:
    "lse_in_low_precision": "an lse with the out's bf16/fp16 rounding (computed in it, not in float32 as "
                            "FlashAttention keeps it): merged, the lse and the weights carry that error",
}
