"""Known backward mistakes: the gradients a kernel with a right forward and a wrong backward
gives, each a float64 function of one cell's inputs (the diagnosis library's backward half).

When a variant's gradients are outside their budget (measure/checks/gradients.py: grad_budget),
audit.measure.diagnosis.diagnosis evaluates every mistake here on the cell's own inputs (an Attempt of
workload.mistakes, with the cell's upstream gradient) and names the one whose gradients the
variant's match within their budgets. A mistake returns {"dq": (b, h, Tq, d), "dk": (b, Hkv, Tk,
d), "dv": (b, Hkv, Tk, d)}, all three (the right ones where it does not touch them), or None
where it cannot differ on this cell (a GQA mistake on multi-head attention). dk and dv sum over
the attempt's query heads of each key/value head: the diagnosis compares them only for the
key/value heads whose whole group of query heads the attempt holds.

The backward follows FlashAttention's: P = softmax(S), O = P V, dV = Pᵀ dO, dP = dO Vᵀ,
D = rowsum(dO ∘ O), dS = P ∘ (dP - D) (times the score modification's derivative), dQ = scale ·
dS K, dK = scale · dSᵀ Q, dK and dV summed over each key/value head's group of query heads
(backward_of). A plug-in registers its own with @backward_mistake, as with @mistake.

Imports no torch at module level (the report's texts come from here); the functions do.
"""
from __future__ import annotations

from typing import Any, Callable

from .mistake_base import _SAME, Attempt, Mistake, register

GRADIENT_NAMES = ("dq", "dk", "dv")


# name -> Mistake (workload.mistakes' record: title, what, where, fn, specificity; its rows and
# precision are the forward's and unused here), each fn returning the mistaken gradients or None
BACKWARD_MISTAKES: dict[str, Mistake] = {}


def backward_mistake(name: str, *, title: str, what: str, where: str,
                     specificity: int = 1) -> Callable[[Callable], Callable]:
    """Register a backward mistake (its function returns the mistaken float64 gradients or None)."""
    def add(fn: Callable) -> Callable:
        register(BACKWARD_MISTAKES, Mistake(name, title, what, where, fn, specificity=specificity))
        return fn
    return add


def backward_of(a: Attempt, *, dq_scale: float = 1.0, dk_scale: float = 1.0, rowsum_d: bool = True,
                keep: Any = _SAME, group: str = "sum") -> dict[str, Any]:
    """The float64 gradients of attention as the cell defines it (forward right), except what is
    overridden in the backward: dq_scale, dk_scale multiply dq, dk (1/scale: the softmax scale
    left out; scale: applied twice); rowsum_d=False leaves D out of dS; keep: the keys the
    backward's recomputed P sees (the forward's always); group "first": dk and dv of a key/value
    head taken from the first of its query heads instead of summed over them."""
    import torch
    q, kk, vv = a.q, a.pair(a.k), a.pair(a.v)                               # (b, h, T, d)
    scores = (q @ kk.transpose(-2, -1)) * a.scale                            # (b, h, Tq, Tk)
    mod_grad = None
    if a.score_mod is not None:
        raw = scores.detach().requires_grad_(True)
        with torch.enable_grad():
            modded = a.score_mod(raw)
            mod_grad = torch.autograd.grad(modded.sum(), raw)[0]            # elementwise derivative
        scores = modded.detach()
    if a.bias is not None:
        scores = scores + a.bias

    def probs(seen: Any) -> Any:
        return torch.nan_to_num(a.softmax(scores, seen, sinks=a.head_sinks()), nan=0.0)   # a row with no key: 0

    p = probs(a.keep())
    out = p @ vv                                                             # (b, h, Tq, d): the right O
    pb = p if keep is _SAME else probs(keep)                                 # the backward's P
    d_out = a.grad_out
    d_p = d_out @ vv.transpose(-2, -1)                                       # (b, h, Tq, Tk)
    d_s = pb * (d_p - (d_out * out).sum(-1, keepdim=True)) if rowsum_d else pb * d_p
    if mod_grad is not None:
        d_s = d_s * mod_grad
    dq = dq_scale * a.scale * (d_s @ kk)                                     # (b, h, Tq, d)
    dk_h = dk_scale * a.scale * (d_s.transpose(-2, -1) @ q)                  # (b, h, Tk, d)
    dv_h = pb.transpose(-2, -1) @ d_out                                      # (b, h, Tk, d)
    return {"dq": dq, "dk": _per_kv_head(a, dk_h, group), "dv": _per_kv_head(a, dv_h, group)}


def _per_kv_head(a: Attempt, per_query: Any, group: str) -> Any:
    """(b, h, Tk, d) per query head -> (b, Hkv, Tk, d): summed over each kv head's query heads
    the attempt holds, or ("first") the first of them."""
    import torch
    out = torch.zeros(per_query.shape[0], a.kv_heads, *per_query.shape[2:], dtype=per_query.dtype,
                      device=per_query.device)
    taken: set[int] = set()
    for i, g in enumerate(a.pairing()):
        if group == "sum":
            out[:, g] += per_query[:, i]
        elif g not in taken:
            out[:, g] = per_query[:, i]
            taken.add(g)
    return out


def full_groups(a: Attempt) -> list[int]:
    """The key/value heads whose every query head the attempt holds: dk and dv are comparable there."""
    held = set(a.heads)
    return [g for g in range(a.kv_heads) if all(h in held for h in range(g * a.group, (g + 1) * a.group))]


# --------------------------------------------------------------------------- a gradient dropped or scaled

def _zeroed(a: Attempt, name: str) -> dict[str, Any]:
    grads = backward_of(a)
    grads[name] = grads[name] * 0.0
    return grads


def _scaled(a: Attempt, name: str) -> dict[str, Any] | None:
    """The right gradients with `name` times the factor that fits the variant's best."""
    if a.observed_grads is None:
        return None
    right = backward_of(a)
    norm = float((right[name] * right[name]).sum())
    factor = float((a.observed_grads[name] * right[name]).sum()) / norm if norm > 0 else 1.0
    if abs(factor - 1.0) < 1e-3:
        return None
    right[name] = right[name] * factor
    return right


def _dropped(name: str) -> dict[str, str]:
    return dict(title=f"{name} returned as zeros",
                what=f"The backward returns {name} as zeros (or never writes it); the other gradients are right.",
                where=f"a backward that skips {name}: an unimplemented path, a buffer never written, a ragged "
                      "or GQA path that falls through.")


def _factor(name: str) -> dict[str, Any]:
    return dict(title=f"{name} scaled by a constant",
                what=f"The backward returns {name} times a constant factor (fitted to the variant's {name}); "
                     "the other gradients are right.",
                where=f"a factor applied to {name} once too often or not at all: the softmax scale, a group "
                      "size, a loss scale, 2 or 1/2.", specificity=0)


@backward_mistake("dq_zeroed", **_dropped("dq"))
def dq_zeroed(a: Attempt) -> Any:
    return _zeroed(a, "dq")


@backward_mistake("dk_zeroed", **_dropped("dk"))
def dk_zeroed(a: Attempt) -> Any:
    return _zeroed(a, "dk")


@backward_mistake("dv_zeroed", **_dropped("dv"))
def dv_zeroed(a: Attempt) -> Any:
    return _zeroed(a, "dv")


@backward_mistake("dq_scaled", **_factor("dq"))
def dq_scaled(a: Attempt) -> Any:
    return _scaled(a, "dq")


@backward_mistake("dk_scaled", **_factor("dk"))
def dk_scaled(a: Attempt) -> Any:
    return _scaled(a, "dk")


@backward_mistake("dv_scaled", **_factor("dv"))
def dv_scaled(a: Attempt) -> Any:
    return _scaled(a, "dv")


@backward_mistake("dq_scale_missing", title="softmax scale missing in dq",
                  what="dQ = dS K without the softmax scale: dq is 1/scale = sqrt(d_k) times too large.",
                  where="the chain rule through S = scale · Q Kᵀ: the scale applied in the forward only.",
                  specificity=2)
def dq_scale_missing(a: Attempt) -> Any:
    return backward_of(a, dq_scale=1.0 / a.scale)


@backward_mistake("dq_scale_twice", title="softmax scale applied twice in dq",
                  what="dQ = scale² dS K: dq is scale = 1/sqrt(d_k) times too small.",
                  where="the scale folded into dS and applied again when dq is formed.", specificity=2)
def dq_scale_twice(a: Attempt) -> Any:
    return backward_of(a, dq_scale=a.scale)


@backward_mistake("dk_scale_missing", title="softmax scale missing in dk",
                  what="dK = dSᵀ Q without the softmax scale: dk is 1/scale = sqrt(d_k) times too large.",
                  where="the chain rule through S = scale · Q Kᵀ: the scale applied to dq only.", specificity=2)
def dk_scale_missing(a: Attempt) -> Any:
    return backward_of(a, dk_scale=1.0 / a.scale)


@backward_mistake("dk_scale_twice", title="softmax scale applied twice in dk",
                  what="dK = scale² dSᵀ Q: dk is scale = 1/sqrt(d_k) times too small.",
                  where="q pre-scaled for the forward, then the scale applied again in dk.", specificity=2)
def dk_scale_twice(a: Attempt) -> Any:
    return backward_of(a, dk_scale=a.scale)


# --------------------------------------------------------------------------- the softmax's backward

@backward_mistake("rowsum_d_missing", title="D = rowsum(dO ∘ O) missing from dS",
                  what="dS = P ∘ dP instead of P ∘ (dP - D), D = rowsum(dO ∘ O): the softmax's Jacobian "
                       "without its rank-one part, so dq and dk are wrong; dv is right.",
                  where="a FlashAttention-style backward that skips its preprocessing kernel (D), or reads "
                        "a D buffer never written.")
def rowsum_d_missing(a: Attempt) -> Any:
    return backward_of(a, rowsum_d=False)


# --------------------------------------------------------------------------- GQA and masks

@backward_mistake("gqa_grad_one_head", title="GQA dk and dv from one query head",
                  what="Each key/value head's dk and dv are those of the first query head of its group "
                       "instead of the sum over the group's query heads.",
                  where="a GQA backward that writes dk and dv per query head into the shared head's buffer "
                        "(the last or first write wins) instead of accumulating them.")
def gqa_grad_one_head(a: Attempt) -> Any:
    return backward_of(a, group="first") if a.n_heads > a.kv_heads else None


@backward_mistake("backward_mask_ignored", title="mask missing in the backward",
                  what="The forward applies the attention mask; the backward recomputes P without it, so "
                       "masked keys get gradients and every gradient is wrong.",
                  where="a backward kernel not handed the mask (or its block mask), or a recompute path "
                        "that drops it.")
def backward_mask_ignored(a: Attempt) -> Any:
    if a.visible is None or bool(a.visible.all()):
        return None
    return backward_of(a, keep=a.keep(visible=None))


@backward_mistake("backward_causal_ignored", title="causal mask missing in the backward",
                  what="The forward is causal; the backward recomputes P without the causal mask, so "
                       "future keys get gradients and every gradient is wrong.",
                  where="is_causal not passed to the backward kernel, or a recompute that drops it.")
def backward_causal_ignored(a: Attempt) -> Any:
    return backward_of(a, keep=a.keep(causal=False)) if a.causal else None
