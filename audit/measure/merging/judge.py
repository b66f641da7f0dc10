"""A merge function judged on one partial state: what it returns (right, NaN, inf, wrong), its errors
against the float64 golden, and the known mistakes that explain a wrong result.

The rule: on rows that see a key, out within MERGE_ATOL_ROUNDINGS roundings of the out dtype per part of
the golden's magnitude (each part's out is rounded once, and the merge rounds once more) and the lse
within as many float32 roundings of its magnitude; on rows that see none, out 0 and lse -inf
(flashinfer #4051: merge((0, -inf), (0, -inf)) = (0, -inf)). A NaN anywhere is "nan"; an infinity in
out, or an infinite lse on a row that sees a key, or +inf on one that sees none, is "inf"; any other
miss is "wrong".

The diagnosis: each known mistake (workload/merge_mistakes.py) merges the same parts as the function
does (a chain for more than two); a mistake explains the result when it gives NaN and infinities
where the function did and agrees within the rule elsewhere, and it is named only where the right
merge would not have given the same. Two mistakes that explain it both are both named ("a or b"):
on such a state they cannot be told apart, and rounding must not pick one.
"""
from __future__ import annotations

import math
from typing import Any

from ...core.diagnosis_names import NONE, joined
from ...core.dtypes import dtype_spec
from ...workload.merge_functions import MergeFunction, chain, reference_pairs
from ...workload.merge_mistakes import MERGE_MISTAKES
from .gradients import merge_gradient
from .states import PartialState

# 2: the gradient columns (gradients.py); 3: parts_from, parts_defects, reference_outcome (a kernel's parts);
# 4: smallest, smallest_grad (smallest.py, by run_audit: a failing record's smallest failing row, for its script)
MERGE_RECORD_VERSION = 4
MERGE_ATOL_ROUNDINGS = 4.0
OUTCOMES = ("right", "nan", "inf", "wrong", "error")


def tolerances(state: PartialState) -> tuple[float, float]:
    """(out, lse) tolerances of a state: MERGE_ATOL_ROUNDINGS unit roundoffs per part and one more for
    the merge, of the out dtype times the golden out's magnitude, and of float32 times the lse's (a kernel's
    parts are judged against the golden of the inputs it saw: states.py)."""
    out, lse = state.golden
    n = len(state.parts) + 1
    finite = lse[lse.isfinite()]
    out_scale = max(1.0, float(out.abs().max())) if out.numel() else 1.0
    lse_scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    return (MERGE_ATOL_ROUNDINGS * n * dtype_spec(state.dtype).unit_roundoff * out_scale,
            MERGE_ATOL_ROUNDINGS * n * dtype_spec("fp32").unit_roundoff * lse_scale)


def measures(result: tuple[Any, Any], state: PartialState) -> dict[str, Any]:
    """Counts of rows with NaN or inf, the errors on rows that see a key, what rows that see none got."""
    import torch
    out, lse = (t.detach().double() for t in result)                            # (B, H, T, d), (B, H, T)
    g_out, g_lse = state.golden
    seen = g_lse.isfinite()                                                     # (B, H, T)
    empty = ~seen
    diff = (out - g_out).abs().amax(-1)                                         # (B, H, T): NaN stays NaN
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)
    lse_diff = torch.where(lse.isnan(), torch.full_like(lse, math.inf), (lse - g_lse).abs())
    return {
        "out_nan_rows": int(out.isnan().any(-1).sum()), "out_inf_rows": int(out.isinf().any(-1).sum()),
        "lse_nan_rows": int(lse.isnan().sum()),
        "lse_inf_rows": int((lse.isinf() & seen).sum() + (lse == math.inf)[empty].sum()),
        "empty_rows": int(empty.sum()),
        "max_abs_err": float(diff[seen].max()) if seen.any() else 0.0,
        "lse_max_err": float(lse_diff[seen].max()) if seen.any() else 0.0,
        "empty_out_max": float(diff[empty].max()) if empty.any() else 0.0,
        "empty_lse_right": bool((lse[empty] == -math.inf).all()) if empty.any() else True,
    }


def outcome_of(m: dict[str, Any], out_tol: float, lse_tol: float) -> str:
    """right | nan | inf | wrong, by the rule of the module docstring."""
    if m["out_nan_rows"] or m["lse_nan_rows"]:
        return "nan"
    if m["out_inf_rows"] or m["lse_inf_rows"]:
        return "inf"
    if (m["max_abs_err"] > out_tol or m["lse_max_err"] > lse_tol or m["empty_out_max"] > out_tol
            or not m["empty_lse_right"]):
        return "wrong"
    return "right"


def _same(a: tuple[Any, Any], b: tuple[Any, Any], out_tol: float, lse_tol: float) -> bool:
    """Whether two merges' results agree: NaN and infinities at the same places, the rest within the rule."""
    import torch
    for x, y, tol in ((a[0], b[0], out_tol), (a[1], b[1], lse_tol)):
        x, y = x.detach().double(), y.detach().double()
        if not torch.equal(x.isnan(), y.isnan()) or not torch.equal(x.isinf(), y.isinf()):
            return False
        inf = x.isinf()
        if not torch.equal(x[inf], y[inf]):
            return False
        finite = x.isfinite()
        if finite.any() and float((x[finite] - y[finite]).abs().max()) > tol:
            return False
    return True


def diagnose_merge(result: tuple[Any, Any], state: PartialState, out_tol: float, lse_tol: float) -> str:
    """The known mistakes whose merge of the state's parts gives `result` where the right merge does not
    ("a or b" where several do), or "none"."""
    memo = state.memo
    if ("values", None) not in memo:                  # the same for every function audited on this state
        memo[("values", None)] = chain(reference_pairs, state.parts)
    right = memo[("values", None)]
    found = []
    for mistake in MERGE_MISTAKES.values():
        if ("values", mistake.name) not in memo:
            memo[("values", mistake.name)] = chain(mistake.fn, state.parts)
        theirs = memo[("values", mistake.name)]
        if _same(theirs, result, out_tol, lse_tol) and not _same(theirs, right, out_tol, lse_tol):
            found.append(mistake)
    return joined(m.name for m in found)


def reference_outcome(state: PartialState) -> str:
    """What the reference merge gives on the state's parts (right, nan, inf, wrong): where it is not right
    the parts cannot be merged right (a kernel's that break the (0, -inf) convention of an empty part), and
    no merge function is blamed for missing the golden there."""
    memo = state.memo
    if ("outcome", None) not in memo:
        if ("values", None) not in memo:
            memo[("values", None)] = chain(reference_pairs, state.parts)
        memo[("outcome", None)] = outcome_of(measures(memo[("values", None)], state), *tolerances(state))
    return memo[("outcome", None)]


def audit_merge(merge: MergeFunction, state: PartialState) -> dict[str, Any]:
    """One record: the merge function on one state (plain, versioned; a call that raises is status
    "error" with its reason, never numbers)."""
    out_tol, lse_tol = tolerances(state)
    record: dict[str, Any] = {"merge_version": MERGE_RECORD_VERSION, "merge": merge.name, "form": merge.form,
                              "lse_base": merge.lse_base, "control": merge.control, "state": state.name,
                              "dtype": state.dtype, "parts": len(state.parts), "parts_from": state.parts_from,
                              "parts_defects": state.parts_defects, "reference_outcome": reference_outcome(state),
                              "out_tol": out_tol, "lse_tol": lse_tol}
    try:
        result = merge.merge([(o.clone(), l.clone()) for o, l in state.parts])
    except Exception as exc:                   # a user's function may raise anything: the record says what
        return {**record, "status": "error", "outcome": "error", "reason": f"{type(exc).__name__}: {exc}",
                "diagnosis": None, "grad_outcome": None}
    m = measures(result, state)
    outcome = outcome_of(m, out_tol, lse_tol)
    diagnosis = NONE if outcome == "right" else diagnose_merge(result, state, out_tol, lse_tol)
    try:
        grads = merge_gradient(merge, state)
    except Exception as exc:                   # its backward raised: said, and the values still judged
        grads = {"grad_outcome": "error", "grad_nan": None, "grad_max_err": None, "grad_tol": None,
                 "grad_diagnosis": None, "grad_reason": f"{type(exc).__name__}: {exc}"}
    return {**record, **m, "status": "ok", "reason": None, "outcome": outcome, "diagnosis": diagnosis, **grads}


def audit_merges(merges: dict[str, MergeFunction], states: list[PartialState]) -> list[dict[str, Any]]:
    """Every merge function on every state, in that order."""
    return [audit_merge(fn, st) for fn in merges.values() for st in states]
