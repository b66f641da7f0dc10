"""What the cells of a run share: an input set's inputs, float64 golden(s), same-dtype
baseline and leak probes (InputCache, rebuilt when the input set changes), and compiled
callables (BuildCache, one per shapes, dtype, causal flag and mask kind).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.grid import Case
from ..workload.inputs import Inputs, make_inputs
from ..workload.eager import kv_for_queries, masked_scores
from ..workload.variants import Variant
from .numerics import error_vs_reference
from .reference import Golden, golden_attention, golden_slices, row_visibility, take_slices, visibility


def _leak_checks(inputs: Inputs, tq: int, tk: int, alignment: str = "top-left") -> list[tuple[Any, Any]]:
    """(keys to perturb (B|1, 1, 1, Tk), rows that must not change (B|1, 1, Tq)) pairs.

    A: keys hidden from at least half of the rows that see anything; the rows
    that see none of them must not change. B: every key, for fully masked rows.
    None of the pairs exists when the scenario masks nothing.
    """
    import torch
    vis = visibility(tq, tk, 0, tq, causal=inputs.causal, visible=inputs.visible,
                     device=inputs.q.device, alignment=alignment)
    if vis is None:
        return []
    while vis.dim() < 4:
        vis = vis[None]
    vis = vis.expand(vis.shape[0], 1, tq, tk)                                  # (B|1, 1, Tq, Tk)
    seeing = vis.any(-1)                                                       # (B|1, 1, Tq)
    hidden = (~vis & seeing[..., None]).sum(-2)                                # (B|1, 1, Tk)
    n_seeing = seeing.sum(-1, keepdim=True).clamp(min=1)                       # (B|1, 1, 1)
    keys = (2 * hidden >= n_seeing)[..., None, :]                              # (B|1, 1, 1, Tk)
    rows = seeing & ~(vis & keys).any(-1)                                      # (B|1, 1, Tq)
    checks = []
    if bool(keys.any()) and bool(rows.any()):
        checks.append((keys, rows))
    if bool((~seeing).any()):
        checks.append((torch.ones_like(keys), ~seeing))
    return checks


def leak_probes(inputs: Inputs, alignment: str = "top-left") -> list[tuple[Any, Any, Any]]:
    """(k', v', rows) per leak check: k and v with large random changes on the keys the
    rows must not see (under the causal alignment the variant declares). Built once per
    input set and shared by its variants."""
    import torch
    tq, tk = inputs.q.shape[-2], inputs.k.shape[-2]
    gen = torch.Generator().manual_seed(1234)
    probes = []
    for keys, rows in _leak_checks(inputs, tq, tk, alignment):
        noise_k = (3.0 + torch.randn(inputs.k.shape, generator=gen)).to(inputs.k.device, inputs.k.dtype)
        noise_v = (3.0 + torch.randn(inputs.v.shape, generator=gen)).to(inputs.v.device, inputs.v.dtype)
        sel = keys.transpose(-1, -2)                                            # (B|1, 1, Tk, 1)
        probes.append((torch.where(sel, inputs.k + noise_k, inputs.k),
                       torch.where(sel, inputs.v + noise_v, inputs.v), rows))
    return probes


@dataclass
class Reference:
    """Everything computed once per input set: float64 golden(s) and the same-dtype baseline.

    The goldens cover `slices` (golden_subset: None means every (batch, head) slice);
    take() cuts a variant's output or dq down to the same slices before comparing, take_kv()
    k, v, dk or dv (Hkv heads: each slice's group once). `row_visible` covers the whole
    output, for the NaN/inf and masked-row checks.
    """

    golden: Golden                       # of `alignment`, with gradients
    by_alignment: dict[str, Golden]      # causal and Tq != Tk: the forward golden of each alignment, else {}
    baseline_rmse: float | None          # `eager` in the input dtype against the golden
    # ... and its gradients' RMSE: {"dq": ..., "dk": ..., "dv": ...} (None without gradients or a baseline)
    baseline_grad_rmse: dict[str, float] | None = None
    leak_probes: list = field(default_factory=list)  # leak_probes(inputs)
    slices: list[tuple[int, int]] | None = None
    row_visible: Any = None              # (B|1, 1, Tq) bool: rows that see a key
    heads: int | None = None             # query heads (take_kv maps them to kv heads)
    alignment: str = "top-left"          # causal alignment of golden, row_visible and leak probes

    def take(self, t: Any) -> Any:
        return take_slices(t, self.slices)

    def take_kv(self, t: Any) -> Any:
        return take_slices(t, self.slices, heads=self.heads)


def reference_alignment(inputs: Inputs, declared: str) -> str:
    """The causal alignment a cell's golden follows for a variant declaring `declared`: its own
    where the two differ (causal, Tq != Tk), else top-left (one golden serves every variant)."""
    tq, tk = inputs.q.shape[-2], inputs.k.shape[-2]
    return declared if inputs.causal and tq != tk else "top-left"


class InputCache:
    """Inputs, float64 golden(s) and baseline of the current input set, rebuilt when the set
    changes; a golden per causal alignment the variants of the set declare."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.inputs: Inputs | None = None
        self.refs: dict[str, Reference] = {}
        self.golden_calls = 0

    def clear(self) -> None:
        """Drop the current input set (after an out-of-memory, so its memory can be freed)."""
        self.key = self.inputs = None
        self.refs = {}

    def get(self, case: Case, alignment: str = "top-left") -> tuple[Inputs, Reference]:
        if case.input_key != self.key:
            self.inputs, self.refs = None, {}  # free the previous set first
            self.key = None
            self.inputs = make_inputs(case)
            self.key = case.input_key
        alignment = reference_alignment(self.inputs, alignment)
        if alignment not in self.refs:
            self.refs[alignment] = build_reference(case, self.inputs, alignment)
            self.golden_calls += 1
        return self.inputs, self.refs[alignment]


def build_reference(case: Case, inputs: Inputs, alignment: str = "top-left") -> Reference:
    """Float64 golden(s), same-dtype baseline and leak probes of one input set, for a variant
    whose causal masking follows `alignment` (reference_alignment)
    (audit.repro.scripts copies this into reproduction scripts: keep its imports at module level)."""
    alignment = reference_alignment(inputs, alignment)
    tq, tk = inputs.q.shape[-2], inputs.k.shape[-2]
    slices = golden_slices(case.batch, case.heads, tq, tk, case.d_k, case.causal, case.device,
                           kv_heads=case.effective_kv_heads)
    q, grad_out = (take_slices(t, slices) for t in (inputs.q, inputs.grad_out))
    k, v = (take_slices(t, slices, heads=case.heads) for t in (inputs.k, inputs.v))
    visible = take_slices(inputs.visible, slices)
    mod = inputs.score_mod
    golden = golden_attention(q, k, v, grad_out=grad_out, causal=inputs.causal, visible=visible,
                              score_mod=mod, alignment=alignment)
    by_alignment = {}
    if inputs.causal and tq != tk:
        other = "bottom-right" if alignment == "top-left" else "top-left"
        by_alignment = {alignment: golden,
                        other: golden_attention(q, k, v, causal=True, visible=visible, alignment=other,
                                                score_mod=mod)}
    rows = row_visibility(tq, tk, causal=inputs.causal, device=inputs.q.device, visible=inputs.visible,
                          alignment=alignment)
    base_out, base_grads = _baseline_errors(q, k, v, take_slices(inputs.mask, slices), inputs.causal, golden, mod,
                                            alignment, grad_out)
    return Reference(golden, by_alignment, base_out, base_grads,
                     leak_probes(inputs, alignment), slices, rows, case.heads, alignment)


def baseline_attention(q: Any, k: Any, v: Any, mask: Any, causal: bool, score_mod: Any, seeing: Any) -> Any:
    """Hand-written attention in the input dtype (eager's math), rows that see no key 0 (the
    golden's convention: the scores of such a row are 0 before softmax, so no NaN reaches its
    gradients): the error budgets' yardstick. seeing: (B|1, H|1, Tq) bool, rows that see a key."""
    import torch
    scores = masked_scores(q, k, mask, causal, None, upcast=False, score_mod=score_mod)   # (B, H, Tq, Tk)
    empty = ~seeing[..., None]
    probs = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return probs @ kv_for_queries(q, v)                                                    # (B, H, Tq, d)


def _baseline_errors(q: Any, k: Any, v: Any, mask: Any, causal: bool, golden: Golden,
                     score_mod: Any = None, alignment: str = "top-left",
                     grad_out: Any = None) -> tuple[float | None, dict[str, float] | None]:
    """RMSE of baseline_attention against the golden (on the golden's slices; causal in the
    golden's alignment, as a mask when bottom-right), and of its dq, dk, dv against the golden's
    with the same upstream gradient (None where it cannot run: budgets become null, not fake)."""
    import torch
    try:
        if causal and alignment != "top-left":
            keep = visibility(q.shape[-2], k.shape[-2], 0, q.shape[-2], causal=True, device=q.device,
                              alignment=alignment)                          # (Tq, Tk)
            mask = keep if mask is None else (keep & mask if mask.dtype == torch.bool
                                              else mask.masked_fill(~keep, float("-inf")))
            causal = False
        wants_grads = grad_out is not None and golden.dq is not None
        leaves = [t.detach().requires_grad_(wants_grads) for t in (q, k, v)]
        with torch.enable_grad() if wants_grads else torch.no_grad():
            out = baseline_attention(*leaves, mask, causal, score_mod, golden.row_visible)
        grads = torch.autograd.grad(out, leaves, grad_out) if wants_grads else None
    except Exception:  # noqa: BLE001 - no baseline: budgets become null, not fake
        return None, None
    out_rmse = error_vs_reference(out.detach(), golden.out, golden.row_visible)["rmse"]
    if grads is None:
        return out_rmse, None
    return out_rmse, {name: error_vs_reference(g, want)["rmse"]
                      for name, g, want in zip(("dq", "dk", "dv"), grads, (golden.dq, golden.dk, golden.dv))}


@dataclass
class Build:
    """A variant's callable for one kind of cell, whether compiling it fused SDPA, and the graph
    breaks Dynamo met compiling and running it."""

    fn: Callable[..., Any]
    fused: bool | None = None
    graph_breaks: int | None = None


class BuildCache:
    """Callables reused across the cells of a run.

    Compiled variants (compiled, compiled_unfused, flex) are compiled once per shapes,
    dtype, causal flag and mask kind, and reused by every cell with the same: the
    stability cells of one size differ only in their input values. Other variants are
    cheap to build and get a fresh callable per cell.
    """

    def __init__(self) -> None:
        self._builds: dict[tuple, Build] = {}

    @staticmethod
    def key(variant: Variant, inputs: Inputs) -> tuple:
        mask = inputs.mask
        mask_kind = None if mask is None else (str(mask.dtype), tuple(mask.shape))
        return (variant.name, str(inputs.q.device), str(inputs.q.dtype), tuple(inputs.q.shape),
                tuple(inputs.k.shape), inputs.causal, mask_kind, str(inputs.score_mod))

    def get(self, variant: Variant, inputs: Inputs) -> tuple[Callable[..., Any], Build]:
        if not variant.compiled:
            build = Build(variant.build())
            return build.fn, build
        key = self.key(variant, inputs)
        if key not in self._builds:
            self._builds[key] = Build(variant.build())
        build = self._builds[key]
        return build.fn, build
