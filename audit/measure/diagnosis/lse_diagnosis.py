"""Why a variant's log-sum-exp is wrong: the known mistake (workload.lse_mistakes) it matches.

For the cells whose lse, merge or lse gradients are outside their budget (core.defects.
lse_outside_budget), on the diagnosis slices of measure.diagnosis.diagnosis, in float64:

- the lse itself: each LSE mistake's lse against the variant's, on the rows that see a key;
- the merge: each LSE mistake applied to both halves of the keys (the halves' right outputs,
  the mistaken lse), merged as measure.golden.lse merges them, against the variant's merged output; so
  a mistake that only shows on rows a half leaves empty (an lse of 0 there) is named too;
- the gradients with the lse in the loss: each LSE gradient mistake's dq, dk, dv against the
  variant's.

A mistake matches when every comparison it can make is within its tolerance (the budget of
that comparison: 2 × the baseline's RMSE + atol, measure.diagnosis.diagnosis.tolerance), on one of them the
variant is outside the budget and the mistake further than a tolerance from the right answer
(measure.diagnosis.diagnosis's rule: its edges where the defect's are), and the variant is nearer to it
than to the right answer on each. Every match is named, with the mistakes the
cell cannot tell from one (their results within tolerance of each other on every comparison), as
the output's diagnosis names them (measure.diagnosis.diagnosis.named_matches): "a or b", never the one whose
error came out smaller in the last bits.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ...workload.backward_mistakes import full_groups
from ...workload.lse_mistakes import LSE_GRAD_MISTAKES, LSE_MISTAKES, lse_grads_of, lse_of
from ...workload.mistake_base import Attempt, sq_diff
from ...workload.lse_kernels import apply_sinks_by_lse
from ...core.diagnosis_names import NONE, joined
from .diagnosis import Candidate, attempt_for, diagnosis_slices, named_matches, tolerance
from ..golden.lse import keys_only_lse, merge_partials, split_point
from .mistake_memo import run as memo_run
from ..golden.numerics import GRAD_BUDGET_FACTOR


def _rmse(x: Any, y: Any, rows: Any = None) -> float:
    """RMSE over the selected rows' elements, NaN matching NaN (mistakes.sq_diff)."""
    diff = sq_diff(x.double(), y.double())
    if rows is not None:
        diff = diff[rows.expand(diff.shape[:rows.dim()])]
    return math.sqrt(float(diff.mean())) if diff.numel() else math.nan


def _halves(a: Attempt) -> list[Attempt]:
    """The attempt on each half of the keys (measure.golden.lse.split_point), causal and mask as one
    visibility cut to the half's keys, so a row may see no key of a half."""
    import torch
    tk = a.tk
    h = split_point(tk)
    keep = a.keep()
    if keep is None:
        keep = torch.ones(1, 1, a.tq, tk, dtype=torch.bool, device=a.q.device)
    keep = keep.expand(keep.shape[0], 1, a.tq, tk)                                 # (b|1, 1, Tq, Tk)
    out = []
    for part in (slice(0, h), slice(h, tk)):
        bias = None if a.bias is None else a.bias[..., part]
        out.append(replace(a, k=a.k[..., part, :], v=a.v[..., part, :], causal=False, visible=keep[..., part],
                           bias=bias))
    return out


def _merged(a: Attempt, lse_fn: Any) -> Any:
    """The merge of the halves' right outputs (0 on a row that sees no key of its half) with the lse
    `lse_fn(half)` gives (None: the right one) -> (b, h, Tq, d) float64, sinks applied after."""
    import torch
    parts = []
    for half in _halves(a):
        out = torch.nan_to_num(half.attend(sinks=None), nan=0.0)                    # (b, h, Tq, d)
        lse = lse_fn(half) if lse_fn is not None else None
        parts.append((out, lse_of(half) if lse is None else lse))
    out, lse = merge_partials(*parts)
    sinks = a.head_sinks()
    return out if sinks is None else apply_sinks_by_lse(out, lse, sinks.view(-1))


def _slices(cell: Any) -> tuple[list[int], list[int], Any, Any, Any]:
    """(batches, heads, their index tensors, pick) of the cell's diagnosis slices
    (measure.diagnosis.diagnosis.diagnosis_slices); pick: (B, H, ...) -> (b, h, ...) float64."""
    import torch
    B, H, Tq, d = cell.out.shape
    Hkv, Tk = cell.inputs.k.shape[1], cell.inputs.k.shape[-2]
    batches, heads = diagnosis_slices(B, H, Hkv, Tq, Tk, d, str(cell.out.device), cell.ref.slices)
    b_index = torch.tensor(batches, device=cell.out.device)
    h_index = torch.tensor(heads, device=cell.out.device)

    def pick(t: Any) -> Any:
        return t.detach().index_select(0, b_index).index_select(1, h_index).double()
    return batches, heads, b_index, h_index, pick


def diagnose_lse_cell(cell: Any) -> dict[str, Any]:
    """The lse diagnosis columns of one cell (a measure.checks.registry.CellState): `lse_diagnosis` (a
    mistake's name, "none" when none matched), `lse_diagnosis_err` (the variant against it) and
    `lse_diagnosis_golden_err` (against the right answer), on the comparison that decided."""
    import torch
    inputs, ref, dtype = cell.inputs, cell.ref, cell.case.dtype
    batches, heads, b_index, h_index, pick = _slices(cell)
    Tq, Tk = cell.out.shape[-2], inputs.k.shape[-2]

    cols = cell.columns
    base = ref.baseline_extra
    with torch.no_grad():
        a = attempt_for(inputs, batches, heads, alignment=ref.alignment, dtype=dtype)   # sinks included
        seen = a.seen().expand(len(batches), len(heads), Tq)                          # (b, h, Tq)
        comparisons: dict[str, tuple[Any, Any, Any, float]] = {}   # name -> (observed, right, rows, tol)
        if cols.get("lse_within_budget") is False:
            right = memo_run(getattr(ref, "memo", None), ("lse", dtype, tuple(batches), tuple(heads), "right"),
                             lse_of, a)
            observed = keys_only_lse(cell.lse, inputs.sinks, cell.variant.lse_includes_sink)   # (B, H, Tq)
            comparisons["lse"] = (observed.index_select(0, b_index).index_select(1, h_index), right, seen,
                                  tolerance(base.get("lse"), dtype, right[..., None], seen))
        if cols.get("merge_within_budget") is False and getattr(cell, "merged", None) is not None and Tk > 1:
            right = memo_run(getattr(ref, "memo", None), ("lse", dtype, tuple(batches), tuple(heads), "merged"),
                             lambda x: _merged(x, None), a)
            comparisons["merge"] = (pick(cell.merged), right, seen, tolerance(base.get("merge"), dtype, right, seen))
        memo, tag = getattr(ref, "memo", None), ("lse", dtype, tuple(batches), tuple(heads))
        found = _best(comparisons, LSE_MISTAKES,
                      lambda m: {"lse": (lambda: memo_run(memo, tag + ("lse", m.name), m.fn, a)),
                                 "merge": (lambda: memo_run(memo, tag + ("merge", m.name),
                                                            lambda x: _merged(x, m.fn), a))})
    name, err, golden_err = found if found is not None else (NONE, None, _golden_err(comparisons))
    return {"lse_diagnosis": name, "lse_diagnosis_err": err, "lse_diagnosis_golden_err": golden_err}


def diagnose_lse_grads_cell(cell: Any) -> dict[str, Any]:
    """The lse gradient diagnosis columns of one cell: `lse_grad_diagnosis` (an LSE gradient
    mistake's name, "none" when none matched), `lse_grad_diagnosis_err`, `lse_grad_diagnosis_golden_err`
    (the largest RMSE of dq, dk through the lse against the mistake's and the right ones)."""
    import torch
    inputs, ref = cell.inputs, cell.ref
    batches, heads, b_index, _, pick = _slices(cell)
    with torch.no_grad():
        a = attempt_for(inputs, batches, heads, alignment=ref.alignment, dtype=cell.case.dtype)
        found = _grad_match(cell, a, b_index, pick, ("lse_grad", cell.case.dtype, tuple(batches), tuple(heads)))
    if found is None:
        return {"lse_grad_diagnosis": NONE, "lse_grad_diagnosis_err": None, "lse_grad_diagnosis_golden_err": None}
    name, err, golden_err = found
    return {"lse_grad_diagnosis": name, "lse_grad_diagnosis_err": err, "lse_grad_diagnosis_golden_err": golden_err}


def _golden_err(comparisons: dict) -> float | None:
    errs = [_rmse(obs, right, rows) for obs, right, rows, _ in comparisons.values()]
    return max(errs) if errs else None


def _best(comparisons: dict, mistakes: dict, evaluate: Any) -> tuple[str, float, float] | None:
    """(name, err against it, err against the right answer) of the matching mistakes (one, or
    several the cell cannot tell apart, joined), or None."""
    candidates = []
    for order, m in enumerate(mistakes.values()):
        scores, mines = [], {}
        for kind, (observed, right, rows, tol) in comparisons.items():
            try:
                mine = evaluate(m)[kind]()
            except Exception:  # noqa: BLE001 - a broken (plug-in) mistake must not lose the cell
                mine = None
            if mine is None:
                continue
            mines[kind] = mine
            scores.append((_rmse(observed, mine, rows), _rmse(mine, right, rows), _rmse(observed, right, rows), tol))
        if not scores:
            continue
        distinct = any(dist > tol for _, dist, _, tol in scores)             # a mistake, not a rounding
        ok = (all(err <= tol for err, _, _, tol in scores)
              and any(dist > tol < golden for _, dist, golden, tol in scores)
              and all(err < golden for err, _, golden, _ in scores))
        if distinct:
            candidates.append(Candidate(m.name, order, m.specificity, max(s[0] for s in scores), ok,
                                        (mines, max(s[2] for s in scores))))

    def close(a: Candidate, b: Candidate) -> bool:      # within tolerance on every comparison both make
        kinds = set(a.evidence[0]) & set(b.evidence[0])
        return bool(kinds) and all(_rmse(a.evidence[0][k], b.evidence[0][k], comparisons[k][2]) <= comparisons[k][3]
                                   for k in kinds)
    named = named_matches(candidates, close)
    if not named:
        return None
    return joined(c.name for c in named), min(c.score for c in named), max(c.evidence[1] for c in named)


def _grad_match(cell: Any, a: Attempt, b_index: Any, pick: Any, tag: tuple = ()) -> tuple[str, float, float] | None:
    """The LSE gradient mistake the variant's gradient through its lse (dq, dk of <lse, grad_lse>)
    matches, or None. dq is compared everywhere, dk on the kv heads whose whole group the attempt
    holds. tag: this attempt's name in the input set's mistake memo."""
    memo = getattr(cell.ref, "memo", None)
    a = replace(a, grad_lse=pick(cell.inputs.grad_lse))
    kv = full_groups(a)
    dq, dk = cell.lse_loss_grads
    observed = {"dq": pick(dq), "dk": dk.detach().index_select(0, b_index).double()}   # (b, h|Hkv, T, d)
    right = memo_run(memo, tag + ("right",), lse_grads_of, a)
    names = ["dq"] + (["dk"] if kv else [])

    def sel(grads: dict, g: str) -> Any:
        return grads[g] if g == "dq" else grads[g][:, kv]

    tol = {g: tolerance(cell.ref.baseline_extra.get(f"lse_{g}"), cell.case.dtype, sel(right, g),
                        factor=GRAD_BUDGET_FACTOR[g]) for g in names}
    candidates = []
    for order, m in enumerate(LSE_GRAD_MISTAKES.values()):
        try:
            mine = memo_run(memo, tag + (m.name,), m.fn, a)
        except Exception:  # noqa: BLE001 - a broken (plug-in) mistake must not lose the cell
            continue
        if mine is None:
            continue
        per = {g: (_rmse(sel(observed, g), sel(mine, g)), _rmse(sel(mine, g), sel(right, g)),
                   _rmse(sel(observed, g), sel(right, g))) for g in names}
        distinct = any(dist > tol[g] for g, (_, dist, _) in per.items())     # a mistake, not a rounding
        ok = (all(err <= tol[g] for g, (err, _, _) in per.items())
              and any(dist > tol[g] < golden for g, (_, dist, golden) in per.items())
              and all(err < golden for err, _, golden in per.values()))
        if distinct:
            candidates.append(Candidate(m.name, order, m.specificity, max(p[0] for p in per.values()), ok,
                                        (mine, max(p[2] for p in per.values()))))
    named = named_matches(candidates, lambda x, y: all(_rmse(sel(x.evidence[0], g), sel(y.evidence[0], g)) <= tol[g]
                                                       for g in names))
    if not named:
        return None
    return joined(c.name for c in named), min(c.score for c in named), max(c.evidence[1] for c in named)
