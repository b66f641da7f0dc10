"""Reproduction-script verifiers of the log-sum-exp findings (lse_error_budget, lse_grad_budget,
lse_masked_rows): the variant called again on the audit's inputs, its lse judged by the same
code the audit used (measure.checks.lse, measure.golden.lse, cellcache's baseline). Copied into standalone
scripts like audit.repro.checks: audit names imported at module level only, torch inside
functions, no lambdas.

A verifier is `verify(case, inputs, load_variant, recorded) -> (defect, lines, measured)`.
"""
from __future__ import annotations

from typing import Any, Callable

from ..measure.cell.cellcache import baseline_shards, build_reference, lse_rmse, merged_output, shards_output
from ..measure.golden.lse import MERGEABLE_EMPTY_ROWS, classify_lse_rows
from ..workload.merge_functions import SHARD_COUNTS
from ..core.dtypes import dtype_spec
from ..measure.golden.numerics import GRAD_BUDGET_FACTOR, budget_bound, error_vs_reference, within_budget


def _verdict(err: float, base: float | None, dtype: str, factor: float) -> tuple[bool | None, str]:
    """(within the budget?, its sentence) for an RMSE against the baseline's."""
    ok = within_budget(err, base, dtype, factor)
    budget = "n/a" if base is None else format(budget_bound(base, dtype, factor), ".4g")
    ratio = "" if not base else f" ({err / base:.4g}x the baseline's error)"
    judged = "within it" if ok else "OUTSIDE it" if ok is False else "no finite baseline to judge by"
    return ok, (f"RMSE {err:.4g}; hand-written attention in {dtype}: {'n/a' if base is None else format(base, '.4g')}; "
                f"budget {factor:g} x that + atol {dtype_spec(dtype).atol:g} = {budget}: {judged}{ratio}")


class _Halves:
    """The variant called on part of the keys, as the merge check calls it: (out, lse) with the
    cell's other keyword arguments (score_mod), the sinks left out (applied after the merge)."""

    def __init__(self, attention: Callable[..., Any], extra: dict) -> None:
        self.attention, self.extra = attention, extra

    def __call__(self, q: Any, k: Any, v: Any, *, mask: Any = None, causal: bool = False) -> tuple:
        result = self.attention(q, k, v, mask=mask, causal=causal, **self.extra)
        return result[0], result[1]


def _lse_call(attention: Callable[..., Any], inputs: Any, grad: bool) -> tuple[Any, Any, Any, Any]:
    """(q, k, out, lse) of one call on the cell's inputs (q and k requiring grad when `grad`), or
    lse None when the variant returns no lse here."""
    import torch
    q, k = (t.detach().requires_grad_(grad) for t in (inputs.q, inputs.k))
    with torch.enable_grad() if grad else torch.no_grad():
        result = attention(q, k, inputs.v.detach(), **inputs.call_kwargs())
    if not isinstance(result, (tuple, list)):
        return q, k, result, None
    return q, k, result[0], result[1]


def verify_lse_error_budget(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """The lse's RMSE against float64 and its halves' merge, each against the dtype's budget factor ×
    that of hand-written attention in the same dtype + atol (numerics.budget_bound)."""
    import torch
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    _, _, _, lse = _lse_call(attention, inputs, grad=False)
    if lse is None:
        return False, ["the variant returns no lse here"], {}
    with_sink = getattr(attention, "audit_lse_includes_sink", False) and ref.golden.lse_sink is not None
    err = lse_rmse(ref.take(lse).double(), ref.golden, ref.golden.lse_sink if with_sink else None)
    factor = dtype_spec(case.dtype).budget_factor
    lse_ok, lse_line = _verdict(err, ref.baseline_extra.get("lse_sink" if with_sink else "lse"), case.dtype, factor)
    lines = [f"lse against the float64 golden's, rows that see a key: {lse_line}"]
    measured = {"lse_err": err, "lse_within_budget": lse_ok, "merge_err": None, "merge_within_budget": None}
    extra = {n: v for n, v in inputs.call_kwargs().items() if n not in ("mask", "causal", "sinks")}
    with torch.no_grad():
        merged = merged_output(_Halves(attention, extra), inputs.q, inputs.k, inputs.v, inputs.mask, inputs.causal,
                               ref.alignment, inputs.sinks)
    if merged is not None:
        merge_err = error_vs_reference(ref.take(merged), ref.golden.out, ref.golden.row_visible)["rmse"]
        merge_ok, merge_line = _verdict(merge_err, ref.baseline_extra.get("merge"), case.dtype, factor)
        lines.append(f"(out, lse) on the keys split in two, merged (lse = logaddexp, out = sum of "
                     f"exp(lse_i - lse) out_i), against the golden: {merge_line}")
        measured.update(merge_err=merge_err, merge_within_budget=merge_ok)
    shards_ok = _verify_shards(attention, extra, inputs, ref, case.dtype, factor, lines, measured)
    if recorded.get("lse_diagnosis"):
        lines.append(f"the audit's diagnosis: {recorded['lse_diagnosis']} (not re-run by this script)")
    return lse_ok is False or measured["merge_within_budget"] is False or shards_ok is False, lines, measured


def _verify_shards(attention: Callable[..., Any], extra: dict, inputs: Any, ref: Any, dtype: str, factor: float,
                   lines: list[str], measured: dict) -> bool | None:
    """Context parallel as the lse_shards check runs it: the keys cut in N shards (SHARD_COUNTS), each
    part's (out, lse) merged in ring order; a line per N, measured["shards_errs"], and the verdict for all."""
    import torch
    errs, verdicts = {}, []
    for n in SHARD_COUNTS:
        with torch.no_grad():
            merged = shards_output(_Halves(attention, extra), inputs.q, inputs.k, inputs.v, inputs.mask,
                                   inputs.causal, ref.alignment, inputs.sinks, n)
        if merged is None:
            continue
        err = error_vs_reference(ref.take(merged), ref.golden.out, ref.golden.row_visible)["rmse"]
        ok, line = _verdict(err, baseline_shards(ref, inputs, n), dtype, factor)
        lines.append(f"(out, lse) on the keys cut in {n} shards, merged in ring order (context parallel), "
                     f"against the golden: {line}")
        errs[str(n)] = err
        verdicts.append(ok)
    within = None if not verdicts or None in verdicts else all(verdicts)
    measured.update(shards_errs=errs or None, shards_within_budget=within)
    return within


def verify_lse_grad_budget(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """dq and dk of <lse, grad_lse> (the gradient through the lse alone) against the golden's, each
    against GRAD_BUDGET_FACTOR × that of hand-written attention's in the same dtype + atol."""
    import torch
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    q, k, _, lse = _lse_call(attention, inputs, grad=True)
    if lse is None:
        return False, ["the variant returns no lse here"], {}
    if ref.golden.lse_grads is None:
        return False, ["no golden gradient through the lse for this cell"], {}
    grads = (None, None)
    if lse.requires_grad:
        grads = torch.autograd.grad(lse.double(), (q, k), inputs.grad_lse.double(), allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, (q, k))]
    lines = [f"the lse {'carries a gradient' if lse.requires_grad else 'carries NO gradient (requires_grad False)'}; "
             "dq and dk of <lse, grad_lse> with the audit's seeded grad_lse:"]
    measured: dict[str, Any] = {"lse_differentiable": bool(lse.requires_grad)}
    with_sink = getattr(attention, "audit_lse_includes_sink", False) and ref.golden.lse_sink_grads is not None
    want, key = (ref.golden.lse_sink_grads, "lse_sink") if with_sink else (ref.golden.lse_grads, "lse")
    verdicts = []
    for name, got, take in zip(("dq", "dk"), grads, (ref.take, ref.take_kv)):
        err = error_vs_reference(take(got), want[name])["rmse"]
        ok, line = _verdict(err, ref.baseline_extra.get(f"{key}_{name}"), case.dtype, GRAD_BUDGET_FACTOR[name])
        lines.append(f"{name}: {line}")
        verdicts.append(ok)
    measured["lse_grads_within_budget"] = None if None in verdicts else all(verdicts)
    return measured["lse_grads_within_budget"] is False, lines, measured


def verify_lse_masked_rows(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """What the lse is on rows that see no key: anything but -inf or +inf misleads a merge."""
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    _, _, _, lse = _lse_call(attention, inputs, grad=False)
    if lse is None:
        return False, ["the variant returns no lse here"], {}
    kind = classify_lse_rows(lse, ~ref.row_visible)
    lines = [f"lse on the rows that see no key: {kind} (a merge reads only {' and '.join(MERGEABLE_EMPTY_ROWS)} "
             "as an empty part)"]
    return kind is not None and kind not in MERGEABLE_EMPTY_ROWS, lines, {"lse_masked_rows": kind}


LSE_VERIFIERS: dict[str, Callable[..., tuple]] = {
    "lse_error_budget": verify_lse_error_budget, "lse_grad_budget": verify_lse_grad_budget,
    "lse_masked_rows": verify_lse_masked_rows,
}
