"""The referee's tensors: every tensor a call takes or returns, compared. A call's own copies of
the inputs (own_copy) checked against the pristine ones after each pass (inputs_untouched), a
result that is a subclass or shares memory with an input or the previous output (plain_result),
and values written into the same tensor objects, which must move the output as the float64
golden moves (values_follow)."""
from __future__ import annotations

import math
from typing import Any

from ..cell.repeats import bitwise_equal


def shares_memory(a: Any, b: Any) -> bool:
    """Whether two tensors live in the same storage (a view of the other, or both of one buffer)."""
    try:
        pa, pb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - a tensor without storage (a subclass, a meta tensor) shares nothing
        return False
    return pa != 0 and pa == pb


def call_tensors(q: Any, k: Any, v: Any, kwargs: dict[str, Any], *extra: tuple[str, Any]) -> list[tuple[str, Any]]:
    """(name, tensor) of every tensor a call takes: q, k, v, the tensors among its keyword
    arguments (the mask, the sinks, what a later feature passes), and `extra` (the upstream
    gradients the backward is handed)."""
    import torch
    named = [("q", q), ("k", k), ("v", v)]
    named += [(name, t) for name, t in kwargs.items() if isinstance(t, torch.Tensor)]
    named += [(name, t) for name, t in extra if isinstance(t, torch.Tensor)]
    return named


def own_copy(t: Any, requires_grad: bool | None = None) -> Any:
    """A copy of a tensor the call may keep, in memory of its own (the pristine one stays with the
    input set, for the inputs_untouched check); requires_grad as given, else as t. Its layout is t's:
    the same strides, and where t is a view with gaps (a head sliced from a fused QKV buffer) the
    memory from its first element to its last copied whole, gaps included (what a kernel reading
    past its strides would find there)."""
    copy = _same_layout_copy(t.detach())
    grad = t.requires_grad if requires_grad is None else requires_grad
    return copy.requires_grad_(grad) if grad and copy.is_floating_point() else copy


def _same_layout_copy(t: Any) -> Any:
    """t cloned into memory of its own with t's strides: a dense tensor (contiguous, or a permutation of
    it) by clone; a view with gaps by its span of memory (offset to last element) cloned and viewed again."""
    import torch
    if t.is_contiguous() or t.numel() == 0 or not all(s > 0 for s in t.stride()):
        return t.clone()
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    if span == t.numel():                      # dense (a transposed layout): clone keeps its strides
        return t.clone()
    memory = torch.as_strided(t, (span,), (1,), t.storage_offset()).clone()    # (span,) gaps included
    return torch.as_strided(memory, t.shape, t.stride(), 0)


def changed_inputs(current: list[tuple[str, Any]], pristine: dict[str, Any]) -> list[str]:
    """The names of the call's tensors that no longer hold their pristine bits."""
    import torch
    with torch.no_grad():
        return [name for name, t in current if name in pristine and pristine[name] is not None
                and not bitwise_equal(t.detach(), pristine[name])]


def restore(current: list[tuple[str, Any]], pristine: dict[str, Any], names: list[str]) -> None:
    """Write the pristine values back into the call's tensors, so one write is caught once and the
    later checks measure the inputs the cell is about."""
    import torch
    with torch.no_grad():
        for name, t in current:
            if name in names:
                t.detach().copy_(pristine[name])


def plain_problems(result: Any, inputs: list[tuple[str, Any]], previous: list[Any], what: str) -> list[str]:
    """What is wrong with a returned tensor as a plain result: a subclass (computes or hides what
    it holds when read), memory shared with an input, or with the previous call's output."""
    import torch
    if result is None:
        return []
    problems = []
    if type(result) is not torch.Tensor:
        problems.append(f"{what} is a {type(result).__module__}.{type(result).__qualname__}, a subclass of "
                        "torch.Tensor, not a plain tensor")
        return problems
    for name, t in inputs:
        if shares_memory(result, t):
            problems.append(f"{what} shares memory with the input {name}")
    for t in previous:
        if t is not None and shares_memory(result, t):
            problems.append(f"{what} shares memory with the previous call's output (returned again or "
                            "overwritten in place)")
    return problems


VALUES_SHIFT = 4.0       # added to v's last feature at every key but the first and last
VALUES_FOLLOW = 0.25     # the output's move may differ from the golden's by this share of it


def shifted_values(v: Any) -> Any:
    """v with VALUES_SHIFT added to its last feature at every key but the first and the last: a
    change of 1/d of v's elements (one a hash of a few leading or trailing elements misses) that
    moves the output's last feature by about VALUES_SHIFT on every row that sees those keys."""
    v2 = v.detach().clone()                                                        # (B, Hkv, Tk, d)
    if v2.shape[-2] > 2:
        v2[..., 1:-1, -1] += VALUES_SHIFT
    else:
        v2[..., -1] += VALUES_SHIFT
    return v2


def follows_move(moved: Any, before: Any, golden_move: Any, rows: Any) -> tuple[bool, float]:
    """(whether the output moved as the golden did, the RMS of the difference over that of the
    golden's move) on the rows that see a key; NaN or inf is a failure."""
    import torch
    diff = moved.double() - before.double() - golden_move                          # (…, Tq, d)
    scale = golden_move
    if rows is not None:
        keep = rows.expand(diff.shape[:-1])
        diff, scale = diff[keep], scale[keep]
    size = float(scale.norm())
    if size == 0:
        return True, 0.0
    share = float(diff.norm()) / size
    ok = math.isfinite(share) and share <= VALUES_FOLLOW and bool(torch.isfinite(diff).all())
    return ok, share
