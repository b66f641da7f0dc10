"""The numerics checks of one cell: each a small function of what the cell has measured so far,
returning its record columns.

A check declares what it needs (NEEDS) and measurement.measure_cell runs it as soon as that
exists, in the order checks are registered:

- "out": the numerics forward's output (CellState.out), and the variant contract met;
- "grads": the numerics forward+backward's (dq, dk, dv) (CellState.grads; not for a forward-only
  cell, whose gradient checks do not run);
- "golden": the float64 golden and the same-dtype baseline of the cell's input set (CellState.ref);
- "variant": the variant called again (leak probes) or asked for its weights (saturation);
- "record": every column measured before, timing included (the diagnosis reads the verdicts).

Checks needing "grads" run in the gradients phase, those needing "record" after timing, the
others in the numerics phase. Each one's seconds count in its `phase` of the record's phase_s
(core.timesplit.CELL_PHASES). Adding a check is adding a function here with @check, its columns
to core.columns.COLUMNS and a rule that reads them (analysis.findings).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.defects import grad_outside_budget, lse_outside_budget, numerics_defect
from ..core.dtypes import by_torch_name
from ..core.errors import Unsupported
from ..core.grid import Case
from ..core.timesplit import CELL_PHASES
from ..workload.arguments import probed_arguments
from ..workload.inputs import Inputs, invariance_applies
from ..workload.presets import Preset
from ..workload.variants import Variant
from .cellcache import Reference, lse_rmse, merged_output, sinks_for_slices
from .numerics import (GRAD_BUDGET_FACTOR, GRADIENTS, SaturationAccumulator, changed_max, classify_masked_rows,
                       error_vs_reference, nonfinite_counts, relative_error, small_sample_factor, within_budget)
from .lse import classify_lse_rows, keys_only_lse
from .failures import ContractError, FAILURE_HEADER, failure_reason, failure_text  # noqa: F401  (one definition)
from .reference import Golden, golden_prob_chunks

NEEDS: tuple[str, ...] = ("out", "grads", "golden", "variant", "record")
STAGES: tuple[str, ...] = ("output", "gradients", "record")   # when a check runs (Check.stage)


@dataclass
class CellState:
    """What one cell has measured so far, for its checks to read."""

    case: Case
    variant: Variant
    inputs: Inputs
    ref: Reference
    preset: Preset
    fn: Callable[..., Any]                 # the variant's callable for this cell
    q: Any                                 # (B, H, Tq, d) leaves the calls use (requires_grad unless forward-only)
    k: Any                                 # (B, Hkv, Tk, d)
    v: Any
    kwargs: dict[str, Any]                 # mask, causal, score_mod, ... (inputs.call_kwargs())
    out: Any = None                        # (B, H, Tq, d) the numerics forward's output, detached
    lse: Any = None                        # (B, H, Tq) its log-sum-exp, for a variant returning one, detached
    lse_loss_grads: tuple | None = None    # (dq, dk) through the lse alone (the lse_grads check)
    merged: Any = None                     # (B, H, Tq, d) float64 its halves' merge (the lse_merge check)
    grads: tuple | None = None             # (dq, dk, dv[, dsinks]) of the numerics forward+backward
    columns: dict[str, Any] = field(default_factory=dict)   # the record's measured columns so far
    paged_call: Any = None                 # workload.varlen.PagedCall of a paged variant in a paged cell, or None
    grad_evidence: Any = None              # diagnosis.GradEvidence of gradients no backward mistake matched, or None
    probe_memo: dict | None = None         # the run's argument probes of compiled variants (cellcache.BuildCache)

    @property
    def golden(self) -> Golden:
        return self.ref.golden

    def settle_if_incomplete(self) -> None:
        """After a call a check reads at once: nothing here; a measured cell waits for work its
        variant left running once the referee found it does (measurement._Cell)."""


@dataclass(frozen=True)
class Check:
    name: str
    needs: frozenset[str]
    phase: str                              # core.timesplit.CELL_PHASES: where its seconds count
    fn: Callable[[CellState], dict[str, Any]]
    when: Callable[[CellState], bool] | None = None   # runs (and is timed) only where this holds

    @property
    def stage(self) -> str:
        """STAGES: after timing when it reads the record, else once its tensors exist."""
        if "record" in self.needs:
            return "record"
        return "gradients" if "grads" in self.needs else "output"


CHECKS: dict[str, Check] = {}


def check(name: str, *, needs: tuple[str, ...], phase: str = "numerics",
          when: Callable[[CellState], bool] | None = None) -> Callable[[Callable], Callable]:
    """Register a numerics check: fn(CellState) -> {column: value}; `when`: the cells it applies to
    (default all)."""
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"check {name!r}: unknown needs {sorted(unknown)}; allowed: {', '.join(NEEDS)}")
    if phase not in CELL_PHASES:
        raise ValueError(f"check {name!r}: phase {phase!r} is not one of {', '.join(CELL_PHASES)}")

    def register(fn: Callable) -> Callable:
        CHECKS[name] = Check(name, frozenset(needs), phase, fn, when)
        return fn
    return register


def run_checks(stage: str, cell: CellState, phases: Any) -> None:
    """Every registered check of `stage`, in order, each timed in its phase; columns into the cell."""
    for c in CHECKS.values():
        if c.stage == stage and (c.when is None or c.when(cell)):
            with phases(c.phase):
                cell.columns.update(c.fn(cell))


# --------------------------------------------------------------------------- the output

@check("nonfinite_out", needs=("out", "golden"))
def nonfinite_out(cell: CellState) -> dict[str, Any]:
    """NaN/inf in the output, and in the rows that see a key (where the golden is finite)."""
    import torch
    out = cell.out
    nan, inf = nonfinite_counts([out])
    seeing = cell.ref.row_visible.expand(out.shape[:-1])                           # (B, H, Tq)
    return {"out_nan": nan, "out_inf": inf,
            "out_nonfinite_visible": int((~torch.isfinite(out) & seeing[..., None]).sum())}


@check("error_budget", needs=("out", "golden"))
def error_budget(cell: CellState) -> dict[str, Any]:
    """Error against the float64 golden on the rows that see a key, and the budget's verdict."""
    m = error_vs_reference(cell.ref.take(cell.out), cell.golden.out, cell.golden.row_visible)
    base = cell.ref.baseline_rmse
    m["err_ratio"] = _ratio(m["rmse"], base)
    m["within_budget"] = within_budget(m["rmse"], base, cell.case.dtype)
    return m


@check("masked_rows", needs=("out", "golden"))
def masked_rows(cell: CellState) -> dict[str, Any]:
    """What the variant returns on rows that see no key: nan, zero, uniform, other or mixed."""
    return {"masked_rows": classify_masked_rows(cell.out, ~cell.ref.row_visible, cell.inputs.v)}


def forward_with(cell: CellState) -> Callable[[Any, Any], Any]:
    """(k', v') -> the variant's detached output on (q, k', v') with the cell's keyword arguments,
    in the timed calls' grad mode and requires_grad, so compiled code is reused: the leak check's
    probes and the diagnosis's (measure.diagnosis.diagnose_probes)."""
    grad = cell.q.requires_grad

    def call(k2: Any, v2: Any) -> Any:
        # copies: the probes are the input set's, shared by its variants (a call may write into its inputs)
        out = out_of(cell, cell.fn(cell.q, k2.detach().clone().requires_grad_(grad),
                                   v2.detach().clone().requires_grad_(grad), **cell.kwargs)).detach()
        cell.settle_if_incomplete()         # a variant the referee found incomplete: its work, first
        return out
    return call


@check("leak", needs=("out", "golden", "variant"), phase="leak")
def leak(cell: CellState) -> dict[str, Any]:
    """Largest output change on rows that must not see the keys and values the probes change."""
    probes = cell.ref.leak_probes
    if not probes:
        return {"leak_max_change": None}
    call = forward_with(cell)
    return {"leak_max_change": max(changed_max(cell.out, call(k2, v2), rows) for k2, v2, rows in probes)}


@check("cross_document", needs=("out", "golden", "variant"), phase="leak",
       when=lambda cell: cell.ref.document_probe is not None)
def cross_document(cell: CellState) -> dict[str, Any]:
    """Packed cells: the largest change of a document's output when the other documents' keys and
    values change (every other document kept, the rest and the padding perturbed)."""
    k2, v2, rows = cell.ref.document_probe
    return {"cross_doc_max_change": changed_max(cell.out, forward_with(cell)(k2, v2), rows)}


@check("paged_reads", needs=("out", "golden", "variant"), phase="leak", when=lambda cell: cell.paged_call is not None)
def paged_reads(cell: CellState) -> dict[str, Any]:
    """Paged cells: the variant on two pools that differ only in the slots it must not read (finite
    values there, not NaN): its output must not change. Where it does, which paged mistake
    (workload/paged_mistakes.py) its output on the first pool matches, in float64."""
    from .paged import paged_reads_columns
    return paged_reads_columns(cell)


def call_with(cell: CellState) -> Callable[..., Any]:
    """(kwargs, kv=None) -> the variant's detached result ((out, lse) for a variant returning its lse)
    on the cell's q and copies of k and v (of kv's (k', v') when given) with these keyword arguments,
    in the timed calls' grad mode (the argument probes: measure/arguments.py)."""
    grad = cell.q.requires_grad

    def call(kwargs: dict, kv: Any = None) -> Any:
        k, v = (cell.k, cell.v) if kv is None else kv
        result = cell.fn(cell.q, k.detach().clone().requires_grad_(grad),
                         v.detach().clone().requires_grad_(grad), **kwargs)
        cell.settle_if_incomplete()
        if cell.variant.returns_lse(cell.case.device):
            out, lse = split_out_lse(result, cell.q)
            return out.detach(), lse.detach()
        return result.detach()
    return call


@check("arguments", needs=("out", "golden", "variant"), phase="leak",
       when=lambda cell: bool(probed_arguments(cell.case, cell.variant.compiled)))
def arguments(cell: CellState) -> dict[str, Any]:
    """Each argument the cell hands the variant, changed: its output must move as the float64
    golden moves (measure/arguments.py)."""
    from .arguments import argument_columns
    lse_baseline = cell.ref.baseline_extra.get(_lse_convention(cell)[2]) if cell.lse is not None else None
    columns = argument_columns(cell, call_with(cell), failure_reason, lse_baseline)
    if "reason" in columns:
        columns["reason"] = _joined(cell, columns["reason"])
    return columns


@check("batch_invariance", needs=("out", "golden", "variant"), phase="invariance",
       when=lambda cell: invariance_applies(cell.case)[0])
def batch_invariance(cell: CellState) -> dict[str, Any]:
    """Batch row 0 computed alone against the same row in the full batch (measure/invariance.py)."""
    from .invariance import columns
    return columns("batch", cell, failure_reason)


@check("chunk_invariance", needs=("out", "golden", "variant"), phase="invariance",
       when=lambda cell: invariance_applies(cell.case)[1])
def chunk_invariance(cell: CellState) -> dict[str, Any]:
    """The queries in two chunks (chunked prefill) against the single-shot output (measure/invariance.py)."""
    from .invariance import columns
    return columns("chunk", cell, failure_reason)


@check("causal_alignment", needs=("out", "golden"))
def causal_alignment(cell: CellState) -> dict[str, Any]:
    """Which causal alignment the output follows when q_len != kv_len."""
    if not cell.ref.by_alignment:
        return {}
    return {"causal_alignment": alignment_of(cell.ref.take(cell.out), cell.ref.by_alignment["top-left"],
                                             cell.ref.by_alignment["bottom-right"]),
            "golden_alignment": cell.ref.alignment}


def alignment_of(out: Any, top_left: Golden, bottom_right: Golden) -> str:
    """Which causal alignment the output follows: top-left, bottom-right or neither."""
    err_tl = error_vs_reference(out, top_left.out, top_left.row_visible)["rel_err"]
    err_br = error_vs_reference(out, bottom_right.out, bottom_right.row_visible)["rel_err"]
    close = 0.05
    if err_tl <= close and (err_tl < err_br or not math.isfinite(err_br)):
        return "top-left"
    if err_br <= close and (err_br < err_tl or not math.isfinite(err_tl)):
        return "bottom-right"
    return "neither"


# --------------------------------------------------------------------------- the gradients

@check("nonfinite_grads", needs=("grads",))
def nonfinite_grads(cell: CellState) -> dict[str, Any]:
    nan, inf = nonfinite_counts(cell.grads)
    return {"grad_nan": nan, "grad_inf": inf}


@check("grad_errors", needs=("grads", "golden"))
def grad_errors(cell: CellState) -> dict[str, Any]:
    """Relative Frobenius error of dq, dk and dv against the float64 golden's gradients."""
    ref, golden = cell.ref, cell.golden
    return {f"{g}_err": relative_error(take(got), want)
            for g, got, want, take in zip(GRADIENTS, cell.grads,
                                             (golden.dq, golden.dk, golden.dv), (ref.take, ref.take_kv, ref.take_kv))}


@check("grad_budget", needs=("grads", "golden"))
def grad_budget(cell: CellState) -> dict[str, Any]:
    """Each gradient's RMSE against the golden's over the same-dtype baseline's, and its verdict
    (numerics.GRAD_BUDGET_FACTOR). Not judged (null) where the gradients are not finite (the
    nonfinite check's finding) or the baseline's are not."""
    out: dict[str, Any] = {f"{g}_{col}": None for g in GRADIENTS for col in ("err_ratio", "within_budget")}
    base = cell.ref.baseline_grad_rmse
    if base is None or cell.columns.get("grad_nan") or cell.columns.get("grad_inf"):
        return out
    for g, rmse in grad_rmse(cell.grads, cell.ref).items():
        b = base[g]
        out[f"{g}_err_ratio"] = _ratio(rmse, b)
        out[f"{g}_within_budget"] = within_budget(rmse, b, cell.case.dtype, GRAD_BUDGET_FACTOR[g])
    return out


def grad_rmse(grads: tuple, ref: Reference) -> dict[str, float]:
    """{dq, dk, dv: RMSE against the golden's gradient} on the golden's slices (every row and key:
    a row that sees no key has no upstream gradient, so 0 in both)."""
    golden = ref.golden
    return {g: error_vs_reference(take(got), want)["rmse"]
            for g, got, want, take in zip(GRADIENTS, grads, (golden.dq, golden.dk, golden.dv),
                                          (ref.take, ref.take_kv, ref.take_kv))}


@check("grad_diagnosis", needs=("grads", "golden"), phase="diagnosis",
       when=lambda cell: grad_outside_budget(cell.columns))
def grad_diagnosis(cell: CellState) -> dict[str, Any]:
    """The known backward mistake the gradients match (measure.diagnosis), for cells whose
    gradients are outside their budget; a failing diagnosis keeps the cell, with a reason."""
    from .diagnosis import diagnose_grads_cell
    try:
        columns, evidence = diagnose_grads_cell(cell.grads[:3], cell.inputs, cell.ref, cell.case.dtype)
    except Exception as exc:  # noqa: BLE001
        return {"reason": _joined(cell, f"gradient diagnosis failed: {failure_reason(exc)}")}
    if columns["grad_diagnosis"] == "none":
        cell.grad_evidence = evidence       # the forward's mistake is tried once it is known (grad_forward_diagnosis)
    return columns


@check("sink_grad", needs=("grads", "golden"), when=lambda cell: len(cell.grads) > 3)
def sink_grad(cell: CellState) -> dict[str, Any]:
    """The sinks' gradient (H,) against the golden's: relative error, ratio to the same-dtype
    baseline's RMSE and its verdict (factor GRAD_BUDGET_FACTOR["dq"] widened for H values by
    numerics.small_sample_factor: an RMSE of 2 values strays far by chance). Null where the golden covers
    a subset of (batch, head) slices (a sink's gradient sums over every batch) or is not finite."""
    golden, dsinks = cell.golden, cell.grads[3]
    out: dict[str, Any] = {"dsinks_err": None, "dsinks_err_ratio": None, "dsinks_within_budget": None}
    if golden.dsinks is None or cell.ref.slices is not None or cell.columns.get("grad_nan") \
            or cell.columns.get("grad_inf"):
        return out
    rmse = error_vs_reference(dsinks, golden.dsinks)["rmse"]
    base = cell.ref.baseline_extra.get("dsinks")
    out["dsinks_err"] = relative_error(dsinks, golden.dsinks)
    out["dsinks_err_ratio"] = _ratio(rmse, base)
    factor = GRAD_BUDGET_FACTOR["dq"] * small_sample_factor(dsinks.numel())   # one value per head: few
    out["dsinks_within_budget"] = within_budget(rmse, base, cell.case.dtype, factor)
    return out


def _ratio(err: float, base: float | None) -> float | None:
    return err / base if base and math.isfinite(base) and base > 0 else None


# --------------------------------------------------------------------------- the log-sum-exp

def split_out_lse(result: Any, q: Any) -> tuple[Any, Any]:
    """A variant declared to return (out, lse): the pair, its lse checked against the contract
    ((B, H, Tq) floating, on q's device); ContractError otherwise."""
    import torch
    if not isinstance(result, (tuple, list)) or len(result) < 2:
        raise ContractError(f"the variant declares it returns (out, lse) but returned {type(result).__name__}; "
                            "expected a pair (docs/variants.md: returns)")
    out, lse = result[0], result[1]
    want = f"the lse as a floating tensor of shape {tuple(q.shape[:-1])} on {q.device}"
    if not isinstance(lse, torch.Tensor):
        raise ContractError(f"the variant returned {type(lse).__name__} as its lse; expected {want}")
    if tuple(lse.shape) != tuple(q.shape[:-1]) or not lse.is_floating_point() or lse.device != q.device:
        raise ContractError(f"the variant returned an lse of shape {tuple(lse.shape)}, dtype "
                            f"{_dtype_name(lse.dtype)}, on {lse.device}; expected {want}")
    return out, lse


def out_of(cell: CellState, result: Any) -> Any:
    """A call's out: the first of (out, lse) for a variant returning its lse, else the result."""
    return split_out_lse(result, cell.q)[0] if cell.variant.returns_lse(cell.case.device) else result


def _returns_lse(cell: CellState) -> bool:
    return cell.lse is not None


def _lse_convention(cell: CellState) -> tuple[Any, Any, str]:
    """What the variant's lse is compared with: (the golden's lse, its gradient through the lse, the
    baseline_extra prefix) in the variant's convention: the keys only, or in a sinks cell with
    the sink counted when it declares lse_includes_sink (the golden converted, never its lse:
    taking a dominant sink out of a kernel's lse would cost its rounding many times over)."""
    golden = cell.golden
    if cell.variant.lse_includes_sink and golden.lse_sink is not None:
        return golden.lse_sink, golden.lse_sink_grads, "lse_sink"
    return golden.lse, golden.lse_grads, "lse"


@check("lse_error", needs=("out", "golden"), when=_returns_lse)
def lse_error(cell: CellState) -> dict[str, Any]:
    """The returned lse against the float64 golden's on the rows that see a key (RMSE, absolute),
    its ratio to the same-dtype baseline's and the budget's verdict; and what it is on rows that
    see no key (measure.lse.classify_lse_rows)."""
    want, _, key = _lse_convention(cell)
    rmse = lse_rmse(cell.ref.take(cell.lse), cell.golden, want)
    base = cell.ref.baseline_extra.get(key)
    return {"lse_err": rmse, "lse_err_ratio": _ratio(rmse, base),
            "lse_within_budget": within_budget(rmse, base, cell.case.dtype),
            "lse_masked_rows": classify_lse_rows(_keys_only(cell), ~cell.ref.row_visible)}


def _keys_only(cell: CellState) -> Any:
    """The variant's lse in the keys-only convention, for what it is on rows that see no key: there a
    kernel counting the sink writes the sink itself (exactly: the keys' part is -inf)."""
    return keys_only_lse(cell.lse, cell.inputs.sinks, cell.variant.lse_includes_sink)


@check("lse_merge", needs=("out", "golden", "variant"),
       when=lambda cell: _returns_lse(cell) and "cu_seqlens" not in cell.kwargs)   # documents cannot be halved
def lse_merge(cell: CellState) -> dict[str, Any]:
    """The variant on the keys split in two, the halves' (out, lse) merged as split-KV and ring
    attention merge them (sinks applied once, after), against the float64 golden: RMSE, ratio to
    the same-dtype baseline's merge and the verdict. Null, with a reason, where the variant cannot
    take a half's mask, or the keys cannot be split."""
    import torch
    out = {"merge_err": None, "merge_err_ratio": None, "merge_within_budget": None}
    if cell.kwargs.get("window") is not None:
        return {**out, "reason": _joined(cell, "merge check not run: the window is handed as an argument, and a "
                                               "half of the keys puts it elsewhere (it is drawn from each query's "
                                               "position in the call)")}
    extra = {name: value for name, value in cell.kwargs.items() if name not in ("mask", "causal", "sinks")}

    def call(q, k, v, *, mask=None, causal=False):
        return split_out_lse(cell.fn(q, k, v, mask=mask, causal=causal, **extra), q)

    try:
        with torch.no_grad():
            merged = merged_output(call, cell.q.detach(), cell.k.detach(), cell.v.detach(), cell.kwargs.get("mask"),
                                   cell.inputs.causal, cell.ref.alignment, cell.kwargs.get("sinks"))
    except Unsupported as exc:
        return {**out, "reason": _joined(cell, f"merge check not run: {exc}")}
    if merged is None:
        return out
    cell.merged = merged
    rmse = error_vs_reference(cell.ref.take(merged), cell.golden.out, cell.golden.row_visible)["rmse"]
    base = cell.ref.baseline_extra.get("merge")
    return {"merge_err": rmse, "merge_err_ratio": _ratio(rmse, base),
            "merge_within_budget": within_budget(rmse, base, cell.case.dtype)}


@check("lse_grads", needs=("grads", "golden", "variant"),
       when=lambda cell: cell.lse is not None and cell.golden.lse_grads is not None)
def lse_grads(cell: CellState) -> dict[str, Any]:
    """The gradient through the returned lse alone: dq and dk of <lse, grad_lse> (grad_lse drawn
    per cell; the lse does not depend on v) against the golden's, each RMSE over the same-dtype
    baseline's, and one verdict for both. A kernel with no gradient through its lse gets zeros
    (pytorch/torchtitan#4796); lse_differentiable says whether the lse carries a gradient at all."""
    import torch
    with torch.enable_grad():
        out, lse = split_out_lse(cell.fn(cell.q, cell.k, cell.v, **cell.kwargs), cell.q)
        grads = (None, None)
        if lse.requires_grad:
            grads = torch.autograd.grad(lse.double(), (cell.q, cell.k), cell.inputs.grad_lse.double(),
                                        allow_unused=True)
    grads = tuple(torch.zeros_like(t) if g is None else g for g, t in zip(grads, (cell.q, cell.k)))
    cell.lse_loss_grads = grads             # for the lse diagnosis, after timing
    ref = cell.ref
    _, want, key = _lse_convention(cell)
    cols: dict[str, Any] = {"lse_differentiable": bool(lse.requires_grad)}
    if cell.columns.get("grad_nan") or cell.columns.get("grad_inf"):
        return cols                         # not judged where the gradients are not finite (the nonfinite check's)
    verdicts = []
    for g, got, take in zip(LSE_GRADIENTS, grads, (ref.take, ref.take_kv)):
        rmse = error_vs_reference(take(got), want[g])["rmse"]
        base = ref.baseline_extra.get(f"{key}_{g}")
        cols[f"lse_{g}_err_ratio"] = _ratio(rmse, base)
        verdicts.append(within_budget(rmse, base, cell.case.dtype, GRAD_BUDGET_FACTOR[g]))
    cols["lse_grads_within_budget"] = None if None in verdicts else all(verdicts)
    return cols


LSE_GRADIENTS: tuple[str, ...] = ("dq", "dk")   # what the lse depends on (not v)


@check("lse_diagnosis", needs=("out", "golden", "record"), phase="diagnosis",
       when=lambda cell: bool(set(lse_outside_budget(cell.columns)) & {"lse_within_budget", "merge_within_budget"}))
def lse_diagnosis(cell: CellState) -> dict[str, Any]:
    """The known mistake of the lse the variant's lse or merge matches (measure.lse_diagnosis), for
    cells whose lse or merge is outside its budget."""
    from .lse_diagnosis import diagnose_lse_cell
    try:
        return diagnose_lse_cell(cell)
    except Exception as exc:  # noqa: BLE001
        return {"reason": _joined(cell, f"lse diagnosis failed: {failure_reason(exc)}")}


@check("lse_grad_diagnosis", needs=("golden", "record"), phase="diagnosis",
       when=lambda cell: "lse_grads_within_budget" in lse_outside_budget(cell.columns)
       and cell.lse_loss_grads is not None)
def lse_grad_diagnosis(cell: CellState) -> dict[str, Any]:
    """The known mistake of the gradient through the lse its dq and dk match, for cells where that
    gradient is outside its budget."""
    from .lse_diagnosis import diagnose_lse_grads_cell
    try:
        return diagnose_lse_grads_cell(cell)
    except Exception as exc:  # noqa: BLE001
        return {"reason": _joined(cell, f"lse gradient diagnosis failed: {failure_reason(exc)}")}


def _joined(cell: CellState, note: str) -> str:
    return "; ".join(filter(None, [cell.columns.get("reason"), note]))


# --------------------------------------------------------------------------- after timing

@check("saturation", needs=("golden", "variant", "record"), phase="saturation",
       when=lambda cell: cell.variant.probs is not None)
def saturation(cell: CellState) -> dict[str, Any]:
    """Saturation, underflow and leaked mass from the variant's own attention weights (a variant
    without Variant.probs gets the golden's saturation: measurement's derived columns)."""
    return variant_weight_metrics(cell.variant, cell.inputs, cell.ref, cell.q.detach(), cell.k.detach())


def variant_weight_metrics(variant: Variant, inputs: Inputs, ref: Reference, q: Any, k: Any) -> dict[str, Any]:
    """Saturation, underflow and leaked mass from the variant's own attention weights, on the
    golden's (batch, head) slices (all of them unless golden_subset says otherwise)."""
    import torch

    q, k = ref.take(q), ref.take_kv(k)                                           # (B|1, H|k, Tq, d)
    mask, visible = ref.take(inputs.mask), ref.take(inputs.visible)
    sinks = sinks_for_slices(inputs.sinks, ref.slices)
    with torch.no_grad():
        probs = variant.probs(q, k, mask=mask, causal=inputs.causal, score_mod=inputs.score_mod,
                              **({} if sinks is None else {"sinks": sinks}))      # (B, H, Tq, Tk)
    sat = SaturationAccumulator()
    zero_where_golden_positive = golden_positive = 0
    leaked = None
    for r0, r1, gold, vis in golden_prob_chunks(q, k, causal=inputs.causal, visible=visible,
                                                score_mod=inputs.score_mod, sinks=sinks):
        p = probs[:, :, r0:r1].double()                                          # (B, H, rows, Tk)
        visx = None if vis is None else vis.expand_as(p)
        sat.add(p, visx)
        positive = gold > 0
        golden_positive += int(positive.sum())
        zero_where_golden_positive += int(((p == 0) & positive).sum())
        if visx is not None:
            seeing = visx.any(-1, keepdim=True)
            mass = torch.where(~visx & seeing, p, torch.zeros_like(p)).sum(-1)   # (B, H, rows)
            leaked = mass.amax() if leaked is None else torch.maximum(leaked, mass.amax())
    m = sat.result()
    m["underflow_frac"] = zero_where_golden_positive / golden_positive if golden_positive else None
    m["leak_mass"] = None if leaked is None else float(leaked)
    m["saturation_source"] = "variant"
    return m


@check("diagnosis", needs=("out", "golden", "variant", "record"), phase="diagnosis",
       when=lambda cell: numerics_defect(cell.columns))
def diagnosis(cell: CellState) -> dict[str, Any]:
    """The known mistake a defective output matches (measure.diagnosis), for the cells an error
    finding about numerics covers; if the audit's own diagnosis fails, the cell keeps its
    measurements and its reason says so (a diagnosis is an explanation, not a measurement)."""
    from .diagnosis import diagnose_cell
    try:
        return diagnose_cell(cell.out, cell.inputs, cell.ref, cell.case.dtype, cell.ref.baseline_rmse,
                             call=forward_with(cell))
    except Exception as exc:  # noqa: BLE001
        return {"reason": _joined(cell, f"diagnosis failed: {failure_reason(exc)}")}


@check("grad_forward_diagnosis", needs=("out", "golden", "record"), phase="diagnosis",
       when=lambda cell: cell.grad_evidence is not None and cell.columns.get("diagnosis") not in (None, "none"))
def grad_forward_diagnosis(cell: CellState) -> dict[str, Any]:
    """Gradients no backward mistake explains, of a cell whose output is diagnosed: where they match
    the gradients of the forward's mistake itself (a kernel differentiating what it wrongly
    computed), the gradient diagnosis names that mistake too (measure.diagnosis.diagnose_grads_as_forward)."""
    from .diagnosis import diagnose_grads_as_forward
    evidence, cell.grad_evidence = cell.grad_evidence, None
    try:
        found = diagnose_grads_as_forward(evidence, cell.inputs, cell.ref, cell.case.dtype,
                                          cell.columns["diagnosis"], cell.out)
    except Exception as exc:  # noqa: BLE001
        return {"reason": _joined(cell, f"gradient diagnosis by the forward's mistake failed: {failure_reason(exc)}")}
    return found or {}


# --------------------------------------------------------------------------- the contract, and failures

def check_output(out: Any, q: Any, v: Any) -> None:
    """The variant contract: a tensor of shape (B, H, Tq, d_v), q's dtype, on q's device."""
    import torch
    expected = (*q.shape[:-1], v.shape[-1])
    want = f"a tensor of shape {tuple(expected)}, dtype {_dtype_name(q.dtype)}, on {q.device}"
    if not isinstance(out, torch.Tensor):
        raise ContractError(f"the variant returned {type(out).__name__}"
                            f"{'' if out is None else ' ' + repr(out)[:60]}; expected {want}")
    problems = []
    if tuple(out.shape) != tuple(expected):
        problems.append(f"shape {tuple(out.shape)}")
    if out.dtype != q.dtype:
        problems.append(f"dtype {_dtype_name(out.dtype)}")
    if out.device != q.device:
        problems.append(f"device {out.device}")
    if problems:
        raise ContractError(f"the variant returned a tensor of {', '.join(problems)}; expected {want}")


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    spec = by_torch_name(name)                  # a registered dtype by its short name, another by torch's
    return name if spec is None else spec.name



