"""What a reproduction script runs: one verifier per finding check, and the script's main.

Every function here is copied, with what it calls, into standalone scripts by
audit.repro.embed (see audit.repro.scripts), so the script measures with the audit's own code:
the same inputs (inputs.draw_inputs), the same float64 golden, baseline and leak
probes (cellcache.build_reference), the same metrics (numerics). Rules for this module:
audit names are imported at module level only, torch inside functions, no lambdas.

A verifier is `verify(case, inputs, load_variant, recorded) -> (defect, lines, measured)`:
`defect` is whether the finding still holds, `lines` say so with numbers, `measured`
holds the numbers under the record's column names, `recorded` what the audit measured.
"""
from __future__ import annotations

import json
import math
import re
import sys
import time
import traceback
import types
from typing import Any, Callable

from ..analysis.numerics_rules import INPUT_SATURATION, SATURATION_EXCESS, UNDERFLOW_FRAC
from ..core.defects import LEAK_OVER_NOISE
from ..core.diagnosis_names import NONE, agrees, members
from ..core.dtypes import dtype_spec
from ..core.errors import BackwardUnsupported
from ..core.grid import Case
from ..measure.cell.cellcache import build_reference
from ..measure.diagnosis.diagnosis import diagnose_cell, diagnose_grads_as_forward, diagnose_grads_cell
from ..measure.checks.gradients import grad_rmse
from ..measure.checks.output import alignment_of
from ..measure.checks.record import variant_weight_metrics
from ..measure.cell.measurement import LEAK_REPORT_BYTES, input_grads
from ..measure.machine.memory import held_bytes, pin_malloc_threshold
from ..measure.cell.repeats import Repeats
from ..measure.golden.numerics import (GRAD_BUDGET_FACTOR, GRADIENTS, budget_bound, changed_max,
                                       classify_masked_rows, error_vs_reference, within_budget)
from ..workload.compiling import fused_attention_count
from ..workload.inputs import draw_inputs, seed_for
from ..workload.varlen import in_form

CHILD_FLAG = "--child"
CHILD_READY = "repro-child: inputs built, calling the variant"
CHILD_OK = "repro-child: the variant ran forward and backward and returned a valid output"
CHILD_AUDIT_FAILED = "repro-child: attn-audit's own measuring code (the float64 reference) failed"
EXIT_DEFECT, EXIT_GONE, EXIT_CANNOT_CHECK = 1, 0, 2


# --------------------------------------------------------------------------- calling the variant

def call_variant(attention: Callable[..., Any], inputs: Any, grad: bool = True) -> tuple[Any, ...]:
    """(q, k, v, out) with q, k, v leaves that require grad, as the audit calls a variant
    (a variant with no backward here gets inputs that do not require grad)."""
    q, k, v = (t.detach().requires_grad_(grad) for t in (inputs.q, inputs.k, inputs.v))
    try:
        out = output_of(attention(q, k, v, **inputs.call_kwargs()))            # (B, H, Tq, d)
    except BackwardUnsupported:
        if not grad:
            raise
        return call_variant(attention, inputs, grad=False)
    return q, k, v, out


def output_of(result: Any) -> Any:
    """A call's out: the first of the (out, lse) a variant returning its log-sum-exp gives."""
    return result[0] if isinstance(result, (tuple, list)) else result


def _at(index: Any) -> str:
    b, h, r = (int(i) for i in list(index)[:3])
    return f"batch {b}, head {h}, query row {r}"


def _values(t: Any, n: int = 4) -> str:
    """The first n entries of a row, short: `[0.8101, -0.2, nan, …]`."""
    shown = ", ".join(f"{x:.4g}" for x in t.detach().double().flatten()[:n].tolist())
    return f"[{shown}{', …' if t.numel() > n else ''}]"


def _first(mask: Any) -> list[int]:
    """Index of the first True entry of a bool tensor."""
    return mask.nonzero()[0].tolist()


def _probe_rows(attention: Any, inputs: Any, ref: Any, q: Any, out: Any) -> list[tuple[float, bool, str]]:
    """The audit's leak check (cellcache.leak_probes: large random changes to the keys and values
    some rows must not see): per probe, (largest change, whether the rows are the fully masked
    ones, a line naming the row that changed most)."""
    import torch
    found = []
    for k2, v2, rows in ref.leak_probes:
        k2, v2 = (t.detach().requires_grad_(q.requires_grad) for t in (k2, v2))
        after = output_of(attention(q, k2, v2, **inputs.call_kwargs())).detach()  # (B, H, Tq, d)
        change = changed_max(out, after, rows)
        sel = rows.expand(out.shape[:-1])                                              # (B, H, Tq)
        both_nan = torch.isnan(out) & torch.isnan(after)
        diff = (after.double() - out.double()).abs()
        diff = torch.where(both_nan, torch.zeros_like(diff), torch.nan_to_num(diff, nan=math.inf))
        per_row = torch.where(sel, diff.amax(-1), torch.full_like(diff.amax(-1), -1.0))  # (B, H, Tq)
        where = _first(per_row == per_row.max())
        fully_masked = not bool((rows & ref.row_visible).any())
        what = ("fully masked rows (they see no key)" if fully_masked else
                "rows that see none of the perturbed keys")
        found.append((change, fully_masked,
                      f"{what}, {int(sel.sum())} in all: output changes by up to {change:.4g} when the "
                      f"keys/values hidden from them change (at {_at(where)}: {_values(out[tuple(where)])} "
                      f"-> {_values(after[tuple(where)])}; expected no change)"))
    return found


def _rerun_change(attention: Any, inputs: Any, q: Any, out: Any) -> float:
    """Largest output change when the same call runs again on the same inputs: a nondeterministic
    variant's noise floor, which a leak must clear (core.defects.LEAK_OVER_NOISE)."""
    import torch
    k, v = (t.detach().requires_grad_(q.requires_grad) for t in (inputs.k, inputs.v))
    again = output_of(attention(q, k, v, **inputs.call_kwargs())).detach()      # (B, H, Tq, d)
    return changed_max(out, again, torch.ones(out.shape[:-1], dtype=torch.bool, device=out.device))


def _weights(probs: Any, inputs: Any, ref: Any) -> dict[str, Any]:
    """Saturation, underflow and leaked mass of the variant's own attention weights (the audit's)."""
    return variant_weight_metrics(types.SimpleNamespace(probs=probs), inputs, ref, inputs.q, inputs.k)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _with_diagnosis(defect: bool, case: Any, inputs: Any, ref: Any, out: Any, recorded: dict,
                    lines: list[str], measured: dict, attention: Any = None) -> tuple:
    """A verifier's result with the cell's diagnosis checked again where the audit recorded one: the
    same known mistakes (measure.diagnosis.diagnosis) on the same inputs, which must name the same one (the
    variant called again on the leak probes' keys where the audit's diagnosis did)."""
    if recorded.get("diagnosis") is None:
        return defect, lines, measured
    call = None if attention is None else (
        lambda k2, v2: output_of(attention(inputs.q.detach(), k2, v2, **inputs.call_kwargs())).detach())
    found = diagnose_cell(out.detach(), inputs, ref, case.dtype, ref.baseline_rmse, call=call)
    return _rediagnosed(defect, lines, measured, recorded, found, "diagnosis", "the output")


def _rediagnosed(defect: bool, lines: list[str], measured: dict, recorded: dict, found: dict, column: str,
                 of: str) -> tuple:
    """The verifier's result once the diagnosis (columns `column`, `column`_err and _golden_err of
    `found`) is made again: it must name the mistake the audit recorded in `column`."""
    measured.update({k: found[k] for k in (column, f"{column}_err", f"{column}_golden_err")})
    name = found[column]
    if name == NONE:
        lines.append(f"diagnosis: no known mistake matches {of}")
    else:
        lines.append(f"diagnosis: {of} matches the known mistake {name} (RMSE {found[f'{column}_err']:.4g} "
                     f"against it, {found[f'{column}_golden_err']:.4g} against the correct golden)")
    same = agrees(recorded[column], name)        # "a or b" holds where a (or b) is named again
    if not same:
        lines.append(f"the audit diagnosed {recorded[column]}: the diagnosis no longer holds")
    return defect and same, lines, measured


# --------------------------------------------------------------------------- one verifier per check

def verify_nonfinite(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """NaN/inf in output rows that see a key, or in the gradients, where float64 is finite."""
    import torch
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    q, k, v, out = call_variant(attention, inputs)
    seeing = ref.row_visible.expand(out.shape[:-1])                               # (B, H, Tq)
    bad = ~torch.isfinite(out.detach()) & seeing[..., None]                       # (B, H, Tq, d)
    golden = [t for t in (ref.golden.out, ref.golden.dq, ref.golden.dk, ref.golden.dv) if t is not None]
    finite = all(bool(torch.isfinite(t).all()) for t in golden)
    lines = [f"float64 golden (output{' and gradients' if len(golden) > 1 else ''}): "
             f"{'all finite' if finite else 'NOT all finite'}"]
    measured = {"out_nonfinite_visible": int(bad.sum()), "grad_nan": None, "grad_inf": None}
    if measured["out_nonfinite_visible"]:
        where = _first(bad)
        lines.append(f"output: {measured['out_nonfinite_visible']} NaN/inf values in rows that see a key "
                     f"(of {int(seeing.sum()) * out.shape[-1]}); first at {_at(where)}: "
                     f"{_values(out[tuple(where[:3])])}")
    else:
        lines.append("output: finite in every row that sees a key")
    if q.requires_grad:
        grads = input_grads(out, (q, k, v), inputs.grad_out)
        parts = []
        measured["grad_nan"] = sum(int(torch.isnan(g).sum()) for g in grads)
        measured["grad_inf"] = sum(int(torch.isinf(g).sum()) for g in grads)
        for name, g in zip(("dq", "dk", "dv"), grads):
            parts.append(f"{name} {int(torch.isnan(g).sum())} NaN, {int(torch.isinf(g).sum())} inf of {g.numel()}")
        lines.append("gradients (backward of the output with the audit's seeded grad_out): " + "; ".join(parts))
    defect = measured["out_nonfinite_visible"] > 0 or bool(measured["grad_nan"]) or bool(measured["grad_inf"])
    return _with_diagnosis(defect, case, inputs, ref, out, recorded, lines, measured, attention)


def verify_error_budget(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """RMSE against float64 above the dtype's budget factor × that of hand-written attention in the same dtype,
    + atol (numerics.budget_bound)."""
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    _, _, _, out = call_variant(attention, inputs)
    err = error_vs_reference(ref.take(out.detach()), ref.golden.out, ref.golden.row_visible)
    base = ref.baseline_rmse
    ok = within_budget(err["rmse"], base, case.dtype)
    ratio = err["rmse"] / base if base and math.isfinite(base) and base > 0 else None
    budget = None if base is None else budget_bound(base, case.dtype)
    spec = dtype_spec(case.dtype)
    lines = [f"RMSE against the float64 golden: {err['rmse']:.4g} (max abs error {err['max_abs_err']:.4g}, "
             f"relative {err['rel_err']:.4g}), rows that see a key only",
             f"hand-written attention in {case.dtype} (the baseline): RMSE "
             f"{base if base is None else format(base, '.4g')}",
             f"budget {spec.budget_factor:g} x baseline + atol {spec.atol:g} = "
             f"{budget if budget is None else format(budget, '.4g')}: "
             + ("within it" if ok else "OUTSIDE it" if ok is False else "no finite baseline to judge by")
             + ("" if ratio is None else f" ({ratio:.4g}x the baseline's error)")]
    measured = {"rmse": err["rmse"], "max_abs_err": err["max_abs_err"], "err_ratio": ratio, "within_budget": ok}
    return _with_diagnosis(ok is False, case, inputs, ref, out, recorded, lines, measured, attention)


def verify_grad_error_budget(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """Each gradient's RMSE against float64 above GRAD_BUDGET_FACTOR × that of hand-written
    attention's gradient in the same dtype (same inputs and upstream gradient), + atol; and the
    backward mistake the gradients match, where the audit named one."""
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    q, k, v, out = call_variant(attention, inputs)
    if not q.requires_grad:
        return False, ["the variant runs forward only here: no gradients to judge"], {}
    grads = input_grads(out, (q, k, v), inputs.grad_out)
    rmse, base = grad_rmse(grads, ref), ref.baseline_grad_rmse or {}
    lines, measured = ["gradients: the backward of the output with the audit's seeded upstream gradient "
                       "(0 on rows that see no key)"], {}
    for g in GRADIENTS:
        b = base.get(g)
        ok = within_budget(rmse[g], b, case.dtype, GRAD_BUDGET_FACTOR[g])
        ratio = rmse[g] / b if b and math.isfinite(b) and b > 0 else None
        budget = None if b is None else budget_bound(b, case.dtype, GRAD_BUDGET_FACTOR[g])
        lines.append(f"{g}: RMSE {rmse[g]:.4g} against float64; hand-written attention in {case.dtype}: "
                     f"{'n/a' if b is None else format(b, '.4g')}; budget {GRAD_BUDGET_FACTOR[g]:g} x that + atol "
                     f"{dtype_spec(case.dtype).atol:g} = {'n/a' if budget is None else format(budget, '.4g')}: "
                     + ("within it" if ok else "OUTSIDE it" if ok is False else "no finite baseline to judge by")
                     + ("" if ratio is None else f" ({ratio:.4g}x the baseline's error)"))
        measured.update({f"{g}_err_ratio": ratio, f"{g}_within_budget": ok})
    defect = any(measured[f"{g}_within_budget"] is False for g in GRADIENTS)
    if recorded.get("grad_diagnosis") is None:
        return defect, lines, measured
    found, evidence = diagnose_grads_cell(grads, inputs, ref, case.dtype)
    if found["grad_diagnosis"] == NONE and members(recorded.get("diagnosis")):
        found = diagnose_grads_as_forward(evidence, inputs, ref, case.dtype, recorded["diagnosis"], out) or found
    return _rediagnosed(defect, lines, measured, recorded, found, "grad_diagnosis", "the gradients")


def verify_masked_leakage(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """Outputs of rows that must not see some keys change when those keys change (and the
    probability the variant's own weights put on masked keys, when it exposes them)."""
    attention, probs = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    q, _, _, out = call_variant(attention, inputs)
    probes = _probe_rows(attention, inputs, ref, q, out.detach())
    change = max((c for c, _, _ in probes), default=None)          # the audit's leak_max_change
    noise = _rerun_change(attention, inputs, q, out.detach())
    lines = [line for _, _, line in probes] + [f"the same call again, unperturbed, changes the output by up to "
                                               f"{noise:.4g} (a leak must be over {LEAK_OVER_NOISE:g}x that)"]
    measured = {"leak_max_change": change, "leak_mass": None}
    if probs is not None:
        measured["leak_mass"] = _weights(probs, inputs, ref)["leak_mass"]
        lines.append(f"the variant's own attention weights put up to {measured['leak_mass']:.4g} of a row's "
                     f"probability on masked keys (expected 0)")
    defect = (change or 0) > LEAK_OVER_NOISE * noise or (measured["leak_mass"] or 0) > 0
    return _with_diagnosis(defect, case, inputs, ref, out, recorded,
                           lines or ["this input set masks nothing: no leak to look for"], measured, attention)


def verify_fully_masked_rows(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """NaN on fully masked rows (SDPA returns 0 there)."""
    import torch
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    q, _, _, out = call_variant(attention, inputs)
    out = out.detach()
    masked = (~ref.row_visible).expand(out.shape[:-1])                            # (B, H, Tq)
    rows = sorted(set(masked.nonzero()[:, 2].tolist()))
    nan_rows = torch.isnan(out).any(-1) & masked                                  # (B, H, Tq)
    kind = classify_masked_rows(out, ~ref.row_visible, inputs.v)
    lines = [f"fully masked query rows (no visible key): {rows[:12]}{' …' if len(rows) > 12 else ''}",
             f"{int(nan_rows.sum())} of {int(masked.sum())} fully masked (batch, head, row) outputs contain NaN: "
             f"the variant returns {kind} there (SDPA returns zero)"]
    if bool(nan_rows.any()):
        where = _first(nan_rows)
        lines.append(f"e.g. {_at(where)}: {_values(out[tuple(where)])}; one such row poisons the loss and "
                     f"every gradient")
    lines += [line for change, fully, line in _probe_rows(attention, inputs, ref, q, out) if fully and change > 0]
    return bool(nan_rows.any()), lines, {"masked_rows": kind}


def verify_finfo_min_mask(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """With a float mask of finfo(dtype).min, fully masked rows attend uniformly to the masked keys."""
    import torch
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    q, _, _, out = call_variant(attention, inputs)
    out = out.detach()
    probes = _probe_rows(attention, inputs, ref, q, out)
    change = max((c for c, _, _ in probes), default=None)          # the audit's leak_max_change
    kind = classify_masked_rows(out, ~ref.row_visible, inputs.v)
    masked = (~ref.row_visible).expand(out.shape[:-1])
    lines = [f"mask: additive float, {torch.finfo(inputs.q.dtype).min:.4g} (finfo.min) on masked keys: finite, "
             f"so a row with every key masked is a softmax over equal scores",
             f"fully masked rows return: {kind} (uniform = the mean of v over all keys)"]
    if bool(masked.any()):
        where = _first(masked)
        mean_v = inputs.v.double().mean(-2)[where[0], where[1]]
        lines.append(f"e.g. {_at(where)}: {_values(out[tuple(where)])}; mean of v: {_values(mean_v)}")
    lines += [line for _, _, line in probes]
    noise = _rerun_change(attention, inputs, q, out)
    return (change or 0) > LEAK_OVER_NOISE * noise, lines, {"leak_max_change": change, "masked_rows": kind}


def verify_fp16_overflow(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """NaN/inf outputs where q·k exceeds fp16's range (65504)."""
    import torch
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    _, _, _, out = call_variant(attention, inputs)
    seeing = ref.row_visible.expand(out.shape[:-1])
    bad = ~torch.isfinite(out.detach()) & seeing[..., None]
    max_qk = float((inputs.q.double() @ inputs.k.double().transpose(-2, -1)).abs().max())
    lines = [f"max |q·k| = {max_qk:.4g} (float64 on the {case.dtype} inputs); the largest finite "
             f"{case.dtype} is {torch.finfo(inputs.q.dtype).max:.6g}",
             f"output: {int(bad.sum())} NaN/inf values in rows that see a key (of {int(seeing.sum()) * out.shape[-1]})"]
    if bool(bad.any()):
        where = _first(bad)
        lines.append(f"first at {_at(where)}: {_values(out[tuple(where[:3])])}")
    return bool(bad.any()), lines, {"out_nonfinite_visible": int(bad.sum())}


def verify_saturation(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """The variant's rows one-hot (max p > 0.99) far more often than the float64 golden's."""
    _, probs = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    m = _weights(probs, inputs, ref)
    golden = ref.golden.saturation["onehot_frac"]
    excess = None if m["onehot_frac"] is None or golden is None else m["onehot_frac"] - golden
    lines = [f"rows putting > 0.99 on one key: {_pct(m['onehot_frac'])} with the variant's weights, "
             f"{_pct(golden)} in float64 (more by {_pct(excess)}; a finding above {_pct(SATURATION_EXCESS)})",
             f"mean normalized row entropy: {m['entropy'] if m['entropy'] is None else format(m['entropy'], '.4g')}"]
    return (excess or 0) > SATURATION_EXCESS, lines, {"onehot_frac": m["onehot_frac"], "golden_onehot_frac": golden}


def verify_input_saturation(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """The inputs themselves saturate softmax: most float64 rows are one-hot."""
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    sat = ref.golden.saturation
    lines = [f"float64 softmax: {_pct(sat['onehot_frac'])} of rows put > 0.99 on one key "
             f"(a finding above {_pct(INPUT_SATURATION)}); max |logit| {sat['max_logit']:.4g}"]
    return (sat["onehot_frac"] or 0) > INPUT_SATURATION, lines, {"golden_onehot_frac": sat["onehot_frac"],
                                                                 "max_logit": sat["max_logit"]}


def verify_compiled_rewritten(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """torch.compile's pattern matcher rewrote hand-written attention into fused SDPA."""
    attention, _ = load_variant()
    before = fused_attention_count()
    _, _, _, out = call_variant(attention, inputs)
    fused = fused_attention_count() - before
    lines = [f"Inductor's fuse_attention counter moved by {fused} while compiling for this cell: the compiled "
             f"code {'is' if fused else 'is not'} fused SDPA (its numerics are SDPA's, e.g. fully masked rows give 0)"]
    return fused > 0, lines, {"fused_sdpa": fused > 0}


def verify_causal_alignment(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """Which causal alignment the variant applies when q_len != kv_len (compared with both goldens)."""
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    _, _, _, out = call_variant(attention, inputs)
    if not ref.by_alignment:
        return False, ["not a causal cell with q_len != kv_len: no alignment to tell"], {"causal_alignment": None}
    kind = alignment_of(ref.take(out.detach()), ref.by_alignment["top-left"], ref.by_alignment["bottom-right"])
    tq, tk = inputs.q.shape[-2], inputs.k.shape[-2]
    lines = [f"q_len {tq}, kv_len {tk}, causal: the output follows {kind} alignment (top-left: query i sees keys "
             f"j <= i; bottom-right, what KV-cache decoding needs: j <= i + {tk - tq}); the audit recorded "
             f"{recorded.get('causal_alignment')}"]
    return kind == recorded.get("causal_alignment"), lines, {"causal_alignment": kind}


def verify_underflow(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """Probabilities exactly 0 where the float64 golden's are positive."""
    _, probs = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    m = _weights(probs, inputs, ref)
    lines = [f"{_pct(m['underflow_frac'])} of the variant's probabilities are exactly 0 where float64 is "
             f"positive (a finding above {_pct(UNDERFLOW_FRAC)})"]
    return (m["underflow_frac"] or 0) > UNDERFLOW_FRAC, lines, {"underflow_frac": m["underflow_frac"]}


def verify_memory_leak(case: Any, inputs: Any, load_variant: Callable, recorded: dict,
                       max_calls: int = 2048, max_s: float = 60.0) -> tuple:
    """Memory the process holds grows with every call (the audit: more than LEAK_REPORT_BYTES
    across a cell's timed calls). Calls forward+backward until that much is held, or gives up."""
    attention, _ = load_variant()
    if case.device == "cpu":
        pin_malloc_threshold()
    q, k, v, out = call_variant(attention, inputs)

    def once() -> None:
        _, _, _, o = call_variant(attention, inputs, grad=q.requires_grad)
        if q.requires_grad:
            input_grads(o, (q, k, v), inputs.grad_out)
    once()
    once()
    start, calls, began = held_bytes(case.device), 0, time.perf_counter()
    if start is None:
        return False, ["this machine cannot read the memory the process holds"], {"leaked_bytes": None}
    kept = 0
    while calls < max_calls and time.perf_counter() - began < max_s:
        for _ in range(8):
            once()
        calls += 8
        kept = held_bytes(case.device) - start
        if kept > LEAK_REPORT_BYTES:
            break
    lines = [f"after {calls} more calls the process holds {kept / 2**20:.2f} MiB more "
             f"({kept / max(calls, 1) / 2**20:.3g} MiB per call; the audit reports above "
             f"{LEAK_REPORT_BYTES / 2**20:.0f} MiB; it recorded {(recorded.get('leaked_bytes') or 0) / 2**20:.0f} MiB)"]
    return kept > LEAK_REPORT_BYTES, lines, {"leaked_bytes": kept}


def verify_nondeterministic(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """out, dq, dk, dv of three runs on identical inputs, compared bitwise with the first run's
    (under torch.use_deterministic_algorithms(True) where the audit ran the cell so)."""
    import torch
    attention, _ = load_variant()
    torch.use_deterministic_algorithms(bool(recorded.get("deterministic_algorithms")))
    repeats = Repeats()
    for _ in range(3):
        q, k, v, out = call_variant(attention, inputs)
        repeats.add("out", out)
        if q.requires_grad:
            repeats.add_grads(input_grads(out, (q, k, v), inputs.grad_out))
    measured = repeats.columns()
    differs = measured["repeat_differs"] or []
    lines = [f"three runs on identical inputs: {', '.join(differs) or 'nothing'} differ from the first run "
             f"(bitwise); largest difference {measured['repeat_max_diff']:.4g}",
             "torch.use_deterministic_algorithms: " + str(torch.are_deterministic_algorithms_enabled())]
    return bool(differs), lines, {"repeat_differs": differs, "repeat_max_diff": measured["repeat_max_diff"]}


# --------------------------------------------------------------------------- the script's main

def run_repro(title: str, axes: dict, seed: int, tq: int, draw: Callable, load_variant: Callable,
              verify: Callable, recorded: dict, env: dict, child: Callable | None = None,
              score_mod: Any = None, forms: tuple = (), page_size: int | None = None,
              replay: list | None = None, replay_draws: dict | None = None) -> int:
    """Rebuild the cell's inputs, run the verifier, print the verdict; the exit status. forms: the
    layouts the variant declares (varlen, paged): it is called in them (workload.varlen.in_form).
    replay: [(axes, tq, scenario)] of the cells the audit ran the variant on before this one (a child
    given REPLAY_FLAG calls it on them first: replay_calls), their scenarios' (draw, score_mod)."""
    import torch
    case = Case(**axes)
    if seed_for(case) != seed:
        print(f"the seed of {axes} is {seed_for(case)}, not {seed}: this script is damaged", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    if case.device.startswith("cuda") and not torch.cuda.is_available():
        print("this cell ran on CUDA and this machine has no CUDA device", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    if env.get("float32_matmul_precision"):
        torch.set_float32_matmul_precision(env["float32_matmul_precision"])
    inputs = draw_inputs(case, draw, tq, score_mod)
    if forms:
        load_variant = _in_forms(load_variant, forms, inputs, page_size)
    if child is not None and sys.argv[1:2] == [CHILD_FLAG]:         # (failure_checks: a replay flag may follow)
        return child(case, inputs, load_variant, replay=replay or [], replay_draws=replay_draws or {})
    print(title)
    print(f"inputs: scenario {case.scenario}, seed {seed}: q {tuple(inputs.q.shape)}, k/v {tuple(inputs.k.shape)}, "
          f"{case.dtype} on {case.device}, causal={case.causal}, mask "
          f"{inputs.mask_form if inputs.mask is None else inputs.mask_form + ' ' + str(tuple(inputs.mask.shape))}")
    if env.get("torch") and env["torch"] != torch.__version__:
        print(f"note: the audit ran torch {env['torch']}; this is torch {torch.__version__}")
    try:
        defect, lines, measured = verify(case, inputs, load_variant, recorded)
    except Exception:  # noqa: BLE001 - the check itself failed: say so, exit 2, never "reproduced"
        traceback.print_exc()
        print("could not check (exit 2)")
        return EXIT_CANNOT_CHECK
    for line in lines:
        print("  " + line)
    shown = {k: recorded.get(k) for k in measured}
    print("audit recorded: " + json.dumps(shown, default=str))
    print("measured now: " + json.dumps(measured, default=str))
    print("REPRODUCED: the finding holds (exit 1)" if defect
          else "NOT REPRODUCED: the finding no longer holds (exit 0)")
    return EXIT_DEFECT if defect else EXIT_GONE


def _in_forms(load_variant: Callable, forms: tuple, inputs: Any, page_size: int | None) -> Callable:
    def load() -> tuple:
        attention, probs = load_variant()
        return in_form(attention, forms, inputs, page_size), probs
    return load


def time_limit_s(reason: str | None) -> float | None:
    """The per-cell time limit a `timeout` record's reason names (`time limit of 4 s`), if any."""
    found = re.search(r"time limit of ([0-9.]+) s", reason or "")
    return float(found.group(1)) if found else None


VERIFIERS: dict[str, Callable[..., tuple]] = {
    "nonfinite": verify_nonfinite, "error_budget": verify_error_budget, "grad_error_budget": verify_grad_error_budget,
    "masked_leakage": verify_masked_leakage, "fully_masked_rows": verify_fully_masked_rows,
    "finfo_min_mask": verify_finfo_min_mask, "fp16_overflow": verify_fp16_overflow,
    "saturation": verify_saturation, "input_saturation": verify_input_saturation,
    "compiled_rewritten": verify_compiled_rewritten, "causal_alignment": verify_causal_alignment,
    "underflow": verify_underflow, "memory_leak": verify_memory_leak,
    "nondeterministic": verify_nondeterministic,
}
