"""The gradient through a merge function, against float64 autograd of the right merge (ring attention's
backward runs through the merge): on each partial state, d/d(out_i, lse_i) of <out, g_out> + <lse, g_lse>,
with g_out and g_lse drawn per state and 0 on rows that see no key.

The right gradient is autograd through merge_partials in float64 on the same parts the function got
(rounded to the state's dtype, then widened): so the comparison sees the merge's own error, not the
parts'. An empty part's gradient is 0 (it weighs nothing); a merge whose result carries no gradient (one
that writes into a tensor it is handed, vLLM's form) is `not_differentiable`, not judged.

The rule: each part's gradients within GRAD_ROUNDINGS unit roundoffs of the state's dtype per part, and
one for the merge, of the right gradient's magnitude; a NaN or an infinity is "nan". The diagnosis, as
the values' (judge.py): the known mistakes whose gradient on the same parts the function's matches where
the right gradient does not.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from ...core.diagnosis_names import joined
from ...core.dtypes import dtype_spec
from ...workload.merge_functions import MergeFunction, chain, reference_pairs
from ...workload.merge_mistakes import MERGE_MISTAKES
from .states import PartialState

GRAD_ROUNDINGS = 8.0


def _upstream(state: PartialState, seed: int = 1) -> tuple[Any, Any]:
    """g_out (B, H, T, d) and g_lse (B, H, T), float64, 0 on rows that see no key."""
    import torch
    out, lse = state.golden
    gen = torch.Generator().manual_seed(seed)
    seen = lse.isfinite()
    g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64) * seen[..., None]
    g_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64) * seen
    return g_out, g_lse


def _grads(merge: Callable[[list], tuple[Any, Any]], parts: Sequence[tuple[Any, Any]], state: PartialState,
           widen: bool) -> list[Any] | None:
    """[d out_0, d lse_0, d out_1, ...] float64 of the loss through `merge`, or None where its result
    carries no gradient. widen: the parts as float64 leaves (the right gradient's), else in their dtypes."""
    import torch
    leaves = [(o.detach().double() if widen else o.detach().clone()).requires_grad_(True) for o, _ in parts]
    lses = [(l.detach().double() if widen else l.detach().clone()).requires_grad_(True) for _, l in parts]
    with torch.enable_grad():
        out, lse = merge(list(zip(leaves, lses)))
        if not (out.requires_grad or lse.requires_grad):
            return None
        g_out, g_lse = _upstream(state)
        seen = state.golden[1].isfinite()
        lse = torch.where(seen, lse.double(), torch.zeros_like(lse, dtype=torch.float64))   # empty rows: no term
        loss = (out.double() * g_out).sum() + (lse * g_lse).sum()
        grads = torch.autograd.grad(loss, leaves + lses, allow_unused=True)
    pairs = list(zip(grads[:len(leaves)], grads[len(leaves):]))
    return [torch.zeros_like(t, dtype=torch.float64) if g is None else g.double()
            for (g_o, g_l), (o, l) in zip(pairs, zip(leaves, lses)) for g, t in ((g_o, o), (g_l, l))]


def _memo(state: PartialState, name: str, make: Callable[[], Any]) -> Any:
    """A gradient every merge audited on `state` is compared with, made once (PartialState.memo)."""
    key = ("grads", name)
    if key not in state.memo:
        state.memo[key] = make()
    return state.memo[key]


def _chained(fn: Callable) -> Callable[[list], tuple[Any, Any]]:
    """A two-part merge as a merge of all parts (merge_functions.chain), as _grads calls it."""
    return lambda parts: chain(fn, parts)


RIGHT = _chained(reference_pairs)


def _agree(a: list[Any], b: list[Any], tol: float) -> bool:
    import torch
    for x, y in zip(a, b):
        if not torch.equal(x.isnan(), y.isnan()) or not torch.equal(x.isinf(), y.isinf()):
            return False
        finite = x.isfinite()
        if finite.any() and float((x[finite] - y[finite]).abs().max()) > tol:
            return False
    return True


def merge_gradient(merge: MergeFunction, state: PartialState) -> dict[str, Any]:
    """The gradient columns of one merge on one state: grad_outcome (right, nan, wrong, not_differentiable),
    grad_nan (values NaN or infinite), grad_max_err and grad_tol, grad_diagnosis."""
    right = _memo(state, "right", lambda: _grads(RIGHT, state.parts, state, widen=True))
    scale = max([1.0] + [float(g.abs().max()) for g in right if g.numel()])
    tol = GRAD_ROUNDINGS * (len(state.parts) + 1) * dtype_spec(state.dtype).unit_roundoff * scale
    got = _grads(merge.merge, state.parts, state, widen=False)
    if got is None:
        return {"grad_outcome": "not_differentiable", "grad_nan": None, "grad_max_err": None, "grad_tol": tol,
                "grad_diagnosis": None}
    bad = sum(int((~g.isfinite()).sum()) for g in got)
    err = max((float((g - r).abs().max()) for g, r in zip(got, right) if g.numel()), default=0.0)
    err = math.inf if bad or math.isnan(err) else err
    outcome = "nan" if bad else ("wrong" if err > tol else "right")
    named = "none"
    if outcome != "right":
        found = []
        for mistake in MERGE_MISTAKES.values():
            theirs = _memo(state, mistake.name, lambda: _grads(_chained(mistake.fn), state.parts, state, widen=True))
            if theirs is not None and _agree(theirs, got, tol) and not _agree(theirs, right, tol):
                found.append(mistake.name)
        named = joined(found)
    return {"grad_outcome": outcome, "grad_nan": bad, "grad_max_err": err, "grad_tol": tol, "grad_diagnosis": named}
