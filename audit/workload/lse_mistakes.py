"""Known mistakes of the log-sum-exp a kernel returns beside out, for the diagnosis.

- Sinks change the output: their mistakes are output mistakes like any other (in mistakes.py,
  diagnosed by measure.diagnosis.diagnosis on cells whose out is outside its budget).
- The lse a kernel returns can be wrong while out is right: LSE_MISTAKES each return the
  mistaken lse (b, h, Tq) in float64 on the cell's Attempt (keys only, the sink left out), or
  None where the mistake cannot differ on this cell; LSE_GRAD_MISTAKES return the mistaken
  {"dq", "dk", "dv"} of the loss <out, grad_out> + <lse, grad_lse>. measure.diagnosis.lse_diagnosis names
  the one a variant's lse (or its gradients) match.

Imports no torch at module level (the report's texts come from here); the functions do.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

from .mistake_base import Attempt, Mistake, register
from .mistakes import MISTAKES

LSE_MISTAKES: dict[str, Mistake] = {}
LSE_GRAD_MISTAKES: dict[str, Mistake] = {}


def lse_mistake(name: str, *, title: str, what: str, where: str, grads: bool = False,
                specificity: int = 1) -> Callable[[Callable], Callable]:
    """Register a mistake of the lse (its function returns the mistaken float64 lse, or None), or
    with grads=True of its gradient (the mistaken {"dq", "dk", "dv"}, or None)."""
    def add(fn: Callable) -> Callable:
        register(LSE_GRAD_MISTAKES if grads else LSE_MISTAKES,
                 Mistake(name, title, what, where, fn, specificity=specificity))
        return fn
    return add


def all_lse_mistakes() -> dict[str, Mistake]:
    """Every lse mistake, of the value and of the gradient, by name (the findings' explanations)."""
    return {**LSE_MISTAKES, **LSE_GRAD_MISTAKES}


# --------------------------------------------------------------------------- the lse's value

def scores_of(a: Attempt, *, scale: float | None = None) -> tuple[Any, Any]:
    """The masked scores (b, h, Tq, Tk), float64, hidden ones -inf, and keep ((…, Tq, Tk) or None)."""
    q, k = a.q, a.pair(a.k)                                                   # (b, h, Tq, d), (b, h, Tk, d)
    scores = (q @ k.transpose(-2, -1)) * (a.scale if scale is None else scale)
    if a.score_mod is not None:
        scores = a.score_mod(scores)
    if a.bias is not None:
        scores = scores + a.bias
    keep = a.keep()
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores, keep


def lse_of(a: Attempt) -> Any:
    """The right lse (b, h, Tq): logsumexp of the masked, scaled scores over the keys (-inf on a
    row that sees no key)."""
    import torch
    return torch.logsumexp(scores_of(a)[0], dim=-1)


@lse_mistake("lse_base2", title="log-sum-exp in base 2",
             what="The lse is log2 of the sum instead of its natural log (a kernel computing in exp2 that "
                  "does not convert back): lse / ln 2.",
             where="kernels working in exp2 with a log2(e)-scaled softmax (pytorch/pytorch#181645: flex's "
                   "FLASH backend)")
def lse_base2(a: Attempt) -> Any:
    return lse_of(a) / math.log(2.0)


@lse_mistake("lse_unscaled_max", title="log-sum-exp without the scale on its max",
             what="The lse adds the row's raw maximum q·k unscaled: max + log Σ exp(scale · (s - max)) "
                  "instead of scale · max + log Σ exp(scale · (s - max)).",
             where="online-softmax kernels that keep the running max of unscaled scores and forget to scale "
                   "it when they write the lse")
def lse_unscaled_max(a: Attempt) -> Any:
    import torch
    if a.score_mod is not None or a.bias is not None:
        return None                         # the scale is not a factor of the final scores
    raw, _ = scores_of(a, scale=1.0)                                           # (b, h, Tq, Tk)
    top = raw.amax(dim=-1)                                                     # (b, h, Tq)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return lse_of(a) + top * (1.0 - a.scale)


@lse_mistake("lse_first_head_of_group", title="lse written for the first head of each GQA group only",
             what="Every query head of a GQA group gets the lse of the group's first head "
                  "(the others are left unwritten, or copied).",
             where="GQA kernels that pack a group's heads into one tile and write one lse per tile "
                   "(NVIDIA/cudnn-frontend#1083, q_len = 1)")
def lse_first_head_of_group(a: Attempt) -> Any:
    import torch
    if a.group < 2:
        return None
    right = lse_of(a)                                                          # (b, h, Tq)
    where = {h: i for i, h in enumerate(a.heads)}
    firsts = [where.get((h // a.group) * a.group) for h in a.heads]
    if None in firsts:
        return None                         # a group's first head is not among the diagnosed heads
    index = torch.tensor(firsts, device=right.device)
    return right.index_select(1, index)


@lse_mistake("lse_empty_rows_zero", title="log-sum-exp 0 on rows that see no key",
             what="A row that sees no key gets lse 0 (and out 0) instead of -inf: a merge then weighs that "
                  "part's zero output in as if the row had keys there, shrinking the merged output.",
             where="kernels that initialise the lse to 0 and skip empty rows; it shows where a split leaves a "
                   "row no key (ring attention's causal blocks, split-KV's last split)")
def lse_empty_rows_zero(a: Attempt) -> Any:
    import torch
    right = lse_of(a)                                                          # (b, h, Tq)
    empty = torch.isneginf(right)
    return torch.where(empty, torch.zeros_like(right), right) if bool(empty.any()) else None


# --------------------------------------------------------------------------- the lse's gradient

def lse_grads_of(a: Attempt) -> dict[str, Any]:
    """The right float64 gradient through the lse alone: {"dq", "dk"} of <lse, a.grad_lse>
    (a.grad_lse (b, h, Tq); rows that see no key give none), dk per kv head (b, Hkv, Tk, d)."""
    import torch
    q, k = (t.detach().clone().requires_grad_(True) for t in (a.q, a.k))
    with torch.enable_grad():
        b = replace(a, q=q, k=k)
        lse = lse_of(b)                                                        # (b, h, Tq)
        seen = b.seen().expand(lse.shape)
        lse = torch.where(seen, lse, torch.zeros_like(lse))
        dq, dk = torch.autograd.grad(lse, (q, k), a.grad_lse.masked_fill(~seen, 0.0))
    return {"dq": dq, "dk": dk}


@lse_mistake("lse_no_grad", grads=True, title="no gradient through the log-sum-exp",
             what="The lse is returned without a gradient (detached, or marked non-differentiable): a loss "
                  "that uses it gets dq and dk without its part, while out, dv and the sinks' gradient are right.",
             where="kernels whose backward reads only dO (pytorch/torchtitan#4796; torch's SDPA ops, "
                   "aten._scaled_dot_product_flash_attention_for_cpu included, mark their lse non-differentiable)")
def lse_no_grad(a: Attempt) -> Any:
    import torch
    return {"dq": torch.zeros_like(a.q), "dk": torch.zeros_like(a.k)}


assert set(LSE_MISTAKES).isdisjoint(MISTAKES)
