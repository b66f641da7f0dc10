"""Reproduction-script verifiers of the layout and invariance findings: cross-document attention in
packed cells, reads of a paged cache's unused slots, batch and chunk invariance. Each calls the
variant again the way the audit's check does, with the audit's own mechanisms (measure.checks.paged,
measure.checks.invariance, measure.cell.cellcache.document_probe). Copied into standalone scripts like
audit.repro.checks: audit names imported at module level only, torch inside functions, no lambdas.

A verifier is `verify(case, inputs, load_variant, recorded) -> (defect, lines, measured)`.
"""
from __future__ import annotations

import functools
import types
from typing import Any, Callable

from ..core.defects import LEAK_OVER_NOISE
from ..measure.checks.arguments import argument_columns
from ..measure.cell.cellcache import build_reference, document_probe
from ..measure.cell.failures import failure_reason
from ..measure.checks.invariance import columns
from ..measure.golden.numerics import changed_max
from ..measure.checks.paged import paged_reads_columns
from ..workload.arguments import ARGUMENTS, NOT_HONOURED
from .checks import _rerun_change, call_variant, output_of


def _noop() -> None:
    """A standalone call leaves no work running that a check must wait for."""


def _cell_like(case: Any, inputs: Any, attention: Callable, ref: Any, q: Any, k: Any, v: Any, out: Any,
               alignment: str) -> Any:
    """What the audit's checks read of a cell (measure.checks.registry.CellState), from a standalone call."""
    return types.SimpleNamespace(case=case, inputs=inputs, ref=ref, golden=ref.golden, fn=attention, q=q, k=k, v=v,
                                 kwargs=inputs.call_kwargs(), out=out.detach(),
                                 paged_call=getattr(attention, "layout", None) and attention,
                                 variant=types.SimpleNamespace(causal_alignment=alignment),
                                 settle_if_incomplete=_noop)


def _called(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    q, k, v, out = call_variant(attention, inputs)
    return attention, ref, q, k, v, out, recorded.get("variant_alignment") or "top-left"


def verify_cross_document(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """A document's output moves when the other documents' keys and values change."""
    attention, ref, q, k, v, out, _ = _called(case, inputs, load_variant, recorded)
    probe = document_probe(inputs)
    if probe is None:
        return False, ["this input set packs no documents"], {"cross_doc_max_change": None}
    k2, v2, rows = probe
    moved = output_of(attention(q, k2.requires_grad_(q.requires_grad), v2.requires_grad_(q.requires_grad),
                                **inputs.call_kwargs())).detach()
    change = changed_max(out.detach(), moved, rows)
    noise = _rerun_change(attention, inputs, q, out.detach())
    lines = [f"the even-numbered documents' output changes by up to {change:.4g} when the other documents' keys and "
             f"values change (0 expected)",
             f"the same call again, unperturbed, changes it by up to {noise:.4g} (a leak must be over "
             f"{LEAK_OVER_NOISE:g}x that)"]
    return change > LEAK_OVER_NOISE * noise, lines, {"cross_doc_max_change": change}


def verify_paged_reads(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """The output changes with the contents of cache slots no sequence uses; the paged mistake it matches."""
    attention, ref, q, k, v, out, alignment = _called(case, inputs, load_variant, recorded)
    if getattr(attention, "layout", None) is None:
        return False, ["the variant is not called with a paged cache here"], {"paged_unread_max_change": None}
    cell = _cell_like(case, inputs, attention, ref, q, k, v, out, alignment)
    cell.kwargs = {n: t for n, t in cell.kwargs.items() if n != "mask"}
    measured = paged_reads_columns(cell)
    noise = _rerun_change(attention, inputs, q, out.detach())
    lines = [f"two pools differing only in the slots no sequence uses move the output by up to "
             f"{measured['paged_unread_max_change']:.4g} (0 expected; the same call again: {noise:.4g})",
             f"the paged mistake it matches: {measured['paged_diagnosis'] or 'none'}"]
    return measured["paged_unread_max_change"] > LEAK_OVER_NOISE * noise, lines, measured


def _invariance(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple[Any, dict]:
    attention, ref, q, k, v, out, alignment = _called(case, inputs, load_variant, recorded)
    cell = _cell_like(case, inputs, attention, ref, q, k, v, out, alignment)
    return cell, {**columns("batch", cell, failure_reason), **columns("chunk", cell, failure_reason)}


def verify_batch_invariance(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """Batch row 0 alone differs from the same row in the full batch."""
    _, m = _invariance(case, inputs, load_variant, recorded)
    lines = [f"row 0 alone against row 0 in the batch of {case.batch}: bitwise equal {m['batch_invariant']}, "
             f"largest difference {m['batch_max_diff']}"]
    return m["batch_invariant"] is False, lines, {k: m[k] for k in ("batch_invariant", "batch_max_diff")}


def verify_chunk_invariance(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """The queries in two chunks differ from the single-shot output (and, where recorded, are outside
    the error budget against the float64 golden)."""
    _, m = _invariance(case, inputs, load_variant, recorded)
    lines = [f"two chunks against the single shot: bitwise equal {m['chunk_invariant']}, largest difference "
             f"{m['chunk_max_diff']}, within the error budget {m['chunk_within_budget']}"]
    defect = m["chunk_invariant"] is False or m["chunk_within_budget"] is False
    return defect, lines, {k: m[k] for k in ("chunk_invariant", "chunk_max_diff", "chunk_within_budget")}


def verify_argument_ignored(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """Each argument the cell hands the variant, changed: its output must move as the float64
    golden's does (measure.checks.arguments, with the audit's probes and rule)."""
    attention, ref, q, k, v, out, alignment = _called(case, inputs, load_variant, recorded)
    # a varlen variant was handed cu_seqlens, a window variant the window: the call forms of the arguments
    # the audit probed (a call with no mask passes them on: varlen.in_form)
    kwargs = inputs.call_kwargs(tuple(ARGUMENTS[name].form for name in (recorded.get("arguments") or {})
                                      if name in ARGUMENTS and ARGUMENTS[name].form))
    result = attention(q, k, v, **kwargs)
    out = output_of(result)
    cell = _cell_like(case, inputs, attention, ref, q, k, v, out, alignment)
    cell.kwargs = kwargs
    cell.variant = types.SimpleNamespace(causal_alignment=alignment, compiled=False,
                                         returns_lse=_returns_pair(isinstance(result, (tuple, list))))
    cell.columns = {"within_budget": recorded.get("within_budget")}
    cell.lse = result[1].detach() if isinstance(result, (tuple, list)) else None
    found = argument_columns(cell, _probe_call(attention, q, k, v), failure_reason, None)
    statuses, evidence = found["arguments"] or {}, found["argument_evidence"] or {}
    lines = []
    for name, status in statuses.items():
        e = evidence.get(name) or {}
        numbers = ", ".join(f"{key} {e[key]:.4g}" for key in ("golden_moved", "moved", "err", "budget") if key in e)
        lines.append(f"{name}: {status}" + (f" ({numbers})" if numbers else ""))
    return any(s in NOT_HONOURED for s in statuses.values()), lines or ["no argument probed here"], \
        {"arguments": statuses}


def _returns_pair(pair: bool) -> Callable[[str], bool]:
    """A variant's returns_lse(device), from what its call returned."""
    return functools.partial(_constant, pair)


def _constant(value: bool, *args: Any) -> bool:
    return value


def _probe_call(attention: Callable, q: Any, k: Any, v: Any) -> Callable[..., Any]:
    """(kwargs, kv=None) -> the variant's detached result on q and copies of k and v, or of kv's
    (measure.checks.contract.call_with)."""
    return functools.partial(_probe, attention, q, k, v)


def _probe(attention: Callable, q: Any, k: Any, v: Any, kwargs: dict, kv: Any = None) -> Any:
    grad = q.requires_grad
    k, v = (k, v) if kv is None else kv
    result = attention(q, k.detach().clone().requires_grad_(grad), v.detach().clone().requires_grad_(grad), **kwargs)
    if isinstance(result, (tuple, list)):
        return result[0].detach(), result[1].detach()
    return result.detach()


LAYOUT_VERIFIERS: dict[str, Callable[..., tuple]] = {
    "cross_document": verify_cross_document, "paged_reads": verify_paged_reads,
    "argument_ignored": verify_argument_ignored,
    "batch_invariance": verify_batch_invariance, "chunk_invariance": verify_chunk_invariance,
}
