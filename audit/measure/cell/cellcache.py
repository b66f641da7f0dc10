"""What the cells of a run share: an input set's inputs, float64 golden(s), same-dtype
baseline and leak probes (InputCache, rebuilt when the input set changes), and compiled
callables (BuildCache, one per shapes, dtype, causal flag and mask kind).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from ...core.grid import Case
from ...workload.inputs import Inputs, make_inputs
from ...workload.eager import eager_lse_attention, kv_for_queries, masked_scores, softmax_with_sinks
from ...workload.lse_kernels import apply_sinks_by_lse
from ...workload.variant_contract import Variant
from ...workload.varlen import document_owner
from ..golden import golden_store
from ..golden.lse import merge_ring, shard_calls
from ..diagnosis.mistake_memo import MistakeMemo
from ..referee.tensors import shifted_values
from ..golden.numerics import error_vs_reference
from ..golden.reference import Golden, golden_attention, golden_slices, row_visibility, take_slices, visibility


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


def document_probe(inputs: Inputs) -> tuple[Any, Any, Any] | None:
    """(k', v', rows) of a packed cell: k and v with large random changes on every odd-numbered
    document and on the padding past cu_seqlens[-1]; rows: the even-numbered documents' rows, whose
    output must not move. None for a cell without documents."""
    import torch
    if inputs.cu_seqlens is None:
        return None
    B, tk = inputs.k.shape[0], inputs.k.shape[-2]
    owner = document_owner(inputs.cu_seqlens, B, tk)                            # (B, Tk)
    kept = (owner >= 0) & (owner % 2 == 0)                                      # (B, Tk)
    gen = torch.Generator().manual_seed(4321)
    noise_k = (3.0 + torch.randn(inputs.k.shape, generator=gen)).to(inputs.k.device, inputs.k.dtype)
    noise_v = (3.0 + torch.randn(inputs.v.shape, generator=gen)).to(inputs.v.device, inputs.v.dtype)
    changed = (~kept)[:, None, :, None]                                         # (B, 1, Tk, 1)
    return (torch.where(changed, inputs.k + noise_k, inputs.k), torch.where(changed, inputs.v + noise_v, inputs.v),
            kept[:, None, :])                                                   # rows: (B, 1, Tq)


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
    # ... and the baseline's RMSE on what a returned LSE is checked by (BASELINE_EXTRAS: its lse, the
    # merge of its halves, the gradients with the lse in the loss, the sinks' gradient), None where not
    baseline_extra: dict[str, float | None] = field(default_factory=dict)
    # the forward golden with v's values shifted (referee.tensors.shifted_values): what the referee's
    # values_follow check compares a variant's move with; None where not built
    values_moved: Golden | None = None
    # the referee's decoy of this input set and its offset's signs (referee.vault.Vault.plant), built by its
    # first cell and taken by the others: one per input set, like the golden it is made from
    decoy: tuple | None = None
    # a packed cell's cross-document probe (document_probe), None elsewhere
    document_probe: tuple | None = None
    # the known mistakes' outputs on this input set, for every variant diagnosed on it (not stored)
    memo: MistakeMemo = field(default_factory=MistakeMemo)

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
    """Inputs, float64 golden(s) and baseline of the current input set, made again when the set
    changes; a golden per causal alignment the variants of the set declare. A reference worth it
    is kept on disk (golden_store) and read back when a run comes back to its set, or a later run
    meets it: golden_calls counts the references built or read, golden_reads those read."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.inputs: Inputs | None = None
        self.refs: dict[str, Reference] = {}
        self.golden_calls = 0
        self.golden_reads = 0

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
            self.refs[alignment], read = stored_reference(case, self.inputs, alignment)
            self.golden_calls += 1
            self.golden_reads += read
        return self.inputs, self.refs[alignment]


def stored_reference(case: Case, inputs: Inputs, alignment: str) -> tuple[Reference, bool]:
    """(the input set's Reference of `alignment`, whether it was read from golden_store rather than
    built): read back where stored, else built, and stored where that was worth it."""
    key = golden_store.entry_key(case.input_key, alignment, case.device)
    payload = golden_store.load(key, str(inputs.q.device))
    if payload is not None:
        try:
            return reference_from_payload(payload, inputs), True
        except (KeyError, TypeError, ValueError):        # another layout of the payload: build again
            pass
    started = time.perf_counter()
    ref = build_reference(case, inputs, alignment)
    built_s = time.perf_counter() - started
    payload = reference_payload(ref)
    if golden_store.worth_storing(built_s, golden_store.tensor_bytes(payload)):
        golden_store.save(key, payload)
    return ref, False


_GOLDEN_FIELDS = tuple(f.name for f in fields(Golden))


def _golden_payload(golden: Golden | None) -> dict | None:
    return None if golden is None else {name: getattr(golden, name) for name in _GOLDEN_FIELDS}


def _golden_of(payload: dict | None) -> Golden | None:
    return None if payload is None else Golden(**{name: payload[name] for name in _GOLDEN_FIELDS})


def reference_payload(ref: Reference) -> dict[str, Any]:
    """A Reference as plain dicts, tensors and numbers (golden_store's file): what is costly to
    build. The leak and document probes are drawn again from the inputs when it is read (cheap);
    the referee's decoy is drawn per run."""
    others = {a: _golden_payload(g) for a, g in ref.by_alignment.items() if g is not ref.golden}
    return {"golden": _golden_payload(ref.golden), "by_alignment": others,
            "baseline_rmse": ref.baseline_rmse, "baseline_grad_rmse": ref.baseline_grad_rmse,
            "slices": None if ref.slices is None else [list(s) for s in ref.slices],
            "row_visible": ref.row_visible, "heads": ref.heads, "alignment": ref.alignment,
            "baseline_extra": dict(ref.baseline_extra), "values_moved": _golden_payload(ref.values_moved)}


def reference_from_payload(payload: dict[str, Any], inputs: Inputs) -> Reference:
    """The Reference reference_payload stored, with the probes of `inputs` drawn again."""
    golden = _golden_of(payload["golden"])
    alignment = payload["alignment"]
    others = {a: _golden_of(g) for a, g in payload["by_alignment"].items()}
    by_alignment = {alignment: golden, **others} if others else {}
    slices = payload["slices"]
    return Reference(golden, by_alignment, payload["baseline_rmse"], payload["baseline_grad_rmse"],
                     leak_probes(inputs, alignment), None if slices is None else [tuple(s) for s in slices],
                     payload["row_visible"], payload["heads"], alignment, dict(payload["baseline_extra"]),
                     _golden_of(payload["values_moved"]), document_probe=document_probe(inputs))


def build_reference(case: Case, inputs: Inputs, alignment: str = "top-left") -> Reference:
    """Float64 golden(s), same-dtype baseline and leak probes of one input set, for a variant
    whose causal masking follows `alignment` (reference_alignment)
    (audit.repro.scripts copies this into reproduction scripts: keep its imports at module level)."""
    alignment = reference_alignment(inputs, alignment)
    tq, tk = inputs.q.shape[-2], inputs.k.shape[-2]
    slices = golden_slices(case.batch, case.heads, tq, tk, case.d_k, case.causal, case.device,
                           kv_heads=case.effective_kv_heads, d_v=case.effective_d_v)
    q, grad_out = (take_slices(t, slices) for t in (inputs.q, inputs.grad_out))
    k, v = (take_slices(t, slices, heads=case.heads) for t in (inputs.k, inputs.v))
    visible = take_slices(inputs.visible, slices)
    mod = inputs.score_mod
    sinks = sinks_for_slices(inputs.sinks, slices)
    grad_lse = take_slices(inputs.grad_lse, slices)
    golden = golden_attention(q, k, v, grad_out=grad_out, causal=inputs.causal, visible=visible,
                              score_mod=mod, alignment=alignment, sinks=sinks, grad_lse=grad_lse,
                              moved_values=shifted_values(v))       # the referee's new values: their output too
    by_alignment = {}
    if inputs.causal and tq != tk:
        other = "bottom-right" if alignment == "top-left" else "top-left"
        by_alignment = {alignment: golden,
                        other: golden_attention(q, k, v, causal=True, visible=visible, alignment=other,
                                                score_mod=mod, sinks=sinks)}
    rows = row_visibility(tq, tk, causal=inputs.causal, device=inputs.q.device, visible=inputs.visible,
                          alignment=alignment)
    mask = take_slices(inputs.mask, slices)
    base_out, base_grads, extra = _baseline_errors(q, k, v, mask, inputs.causal, golden, mod, alignment, grad_out,
                                                   sinks, grad_lse)
    extra["merge"] = _baseline_merge(q, k, v, mask, inputs.causal, golden, alignment, sinks)
    moved = Golden(out=golden.moved_out, dq=None, dk=None, dv=None, row_visible=golden.row_visible,
                   saturation=golden.saturation, alignment=alignment, lse=golden.lse)   # the referee's new values
    golden.moved_out = None
    return Reference(golden, by_alignment, base_out, base_grads,
                     leak_probes(inputs, alignment), slices, rows, case.heads, alignment, extra, moved,
                     document_probe=document_probe(inputs))


def sinks_for_slices(sinks: Any, slices: list[tuple[int, int]] | None) -> Any:
    """The sinks (H,) of the golden's (batch, head) slices, in their order: (k,), or all (None)."""
    if sinks is None or slices is None:
        return sinks
    return sinks[[h for _, h in slices]]


# What Reference.baseline_extra holds: the baseline's RMSE on its lse, on its merged halves, on
# dq and dk through its lse alone, on the sinks' gradient, and in sinks cells on its lse with the
# sink counted and the gradient through that (measure.checks.lse reads them).
BASELINE_EXTRAS: tuple[str, ...] = ("lse", "merge", "lse_dq", "lse_dk", "dsinks",
                                    "lse_sink", "lse_sink_dq", "lse_sink_dk")   # the last: lse with the sink counted


def baseline_attention(q: Any, k: Any, v: Any, mask: Any, causal: bool, score_mod: Any, seeing: Any,
                       sinks: Any = None) -> tuple[Any, Any]:
    """Hand-written attention in the input dtype (eager's math) and its logsumexp, rows that see no
    key 0 (the golden's convention: the scores of such a row are 0 before softmax, so no NaN reaches
    its gradients) and lse -inf there: the error budgets' yardstick. seeing: (B|1, H|1, Tq) bool,
    rows that see a key; sinks (H,) or None. -> (out (B, H, Tq, d), lse (B, H, Tq))."""
    import torch
    scores = masked_scores(q, k, mask, causal, None, upcast=False, score_mod=score_mod)   # (B, H, Tq, Tk)
    empty = ~seeing[..., None]
    scores = scores.masked_fill(empty, 0.0)
    probs = softmax_with_sinks(scores, sinks).masked_fill(empty, 0.0)
    lse = torch.logsumexp(scores, dim=-1).masked_fill(empty[..., 0], float("-inf"))      # (B, H, Tq)
    return probs @ kv_for_queries(q, v), lse                                              # (B, H, Tq, d)


def _baseline_errors(q: Any, k: Any, v: Any, mask: Any, causal: bool, golden: Golden,
                     score_mod: Any = None, alignment: str = "top-left",
                     grad_out: Any = None, sinks: Any = None,
                     grad_lse: Any = None) -> tuple[float | None, dict[str, float] | None, dict[str, float | None]]:
    """RMSE of baseline_attention against the golden (on the golden's slices; causal in the
    golden's alignment, as a mask when bottom-right), of its dq, dk, dv against the golden's
    with the same upstream gradient, and BASELINE_EXTRAS but the merge (None where it cannot run:
    budgets become null, not fake)."""
    import torch
    extra: dict[str, float | None] = dict.fromkeys(BASELINE_EXTRAS)
    try:
        if causal and alignment != "top-left":
            keep = visibility(q.shape[-2], k.shape[-2], 0, q.shape[-2], causal=True, device=q.device,
                              alignment=alignment)                          # (Tq, Tk)
            mask = keep if mask is None else (keep & mask if mask.dtype == torch.bool
                                              else mask.masked_fill(~keep, float("-inf")))
            causal = False
        wants_grads = grad_out is not None and golden.dq is not None
        leaves = [t.detach().requires_grad_(wants_grads) for t in (q, k, v)]
        sink_leaf = None if sinks is None else sinks.detach().requires_grad_(wants_grads)
        with torch.enable_grad() if wants_grads else torch.no_grad():
            out, lse = baseline_attention(*leaves, mask, causal, score_mod, golden.row_visible, sink_leaf)
        grads = torch.autograd.grad(out, leaves + ([] if sink_leaf is None else [sink_leaf]), grad_out,
                                    retain_graph=True) if wants_grads else None
        judge_lse_grads = wants_grads and grad_lse is not None and golden.lse_grads is not None
        lse_grads = torch.autograd.grad(lse, leaves[:2], grad_lse.to(lse.dtype), retain_graph=True) \
            if judge_lse_grads else None
        lse_sink = None if sink_leaf is None else torch.logaddexp(lse, sink_leaf.detach().view(1, -1, 1))
        lse_sink_grads = torch.autograd.grad(lse_sink, leaves[:2], grad_lse.to(lse.dtype)) \
            if judge_lse_grads and lse_sink is not None and golden.lse_sink_grads is not None else None
    except Exception:  # noqa: BLE001 - no baseline: budgets become null, not fake
        return None, None, extra
    out_rmse = error_vs_reference(out.detach(), golden.out, golden.row_visible)["rmse"]
    extra["lse"] = lse_rmse(lse.detach(), golden)
    if lse_grads is not None:
        for name, g in zip(("dq", "dk"), lse_grads):
            extra[f"lse_{name}"] = error_vs_reference(g, golden.lse_grads[name])["rmse"]
    if lse_sink is not None and golden.lse_sink is not None:
        extra["lse_sink"] = lse_rmse(lse_sink.detach(), golden, golden.lse_sink)
    if lse_sink_grads is not None:
        for name, g in zip(("dq", "dk"), lse_sink_grads):
            extra[f"lse_sink_{name}"] = error_vs_reference(g, golden.lse_sink_grads[name])["rmse"]
    if grads is None:
        return out_rmse, None, extra
    if sink_leaf is not None and golden.dsinks is not None:
        extra["dsinks"] = error_vs_reference(grads[3], golden.dsinks)["rmse"]
    return out_rmse, {name: error_vs_reference(g, want)["rmse"]
                      for name, g, want in zip(("dq", "dk", "dv"), grads, (golden.dq, golden.dk, golden.dv))}, extra


def lse_rmse(lse: Any, golden: Golden, want: Any = None) -> float:
    """RMSE of an lse (B, H, Tq) against the golden's (or `want`, in another convention) on the rows
    that see a key (absolute: an lse error of e is a factor exp(e) on every weight it scales)."""
    want = golden.lse if want is None else want
    return error_vs_reference(lse[..., None], want[..., None], golden.row_visible)["rmse"]


def merged_output(call: Any, q: Any, k: Any, v: Any, mask: Any, causal: bool, alignment: str,
                  sinks: Any = None) -> Any:
    """`call`'s (out, lse) on the keys split in two, merged as split-KV and ring attention merge them
    (measure.golden.lse), the sinks applied once after through the merged lse: (B, H, Tq, d) float64, or
    None where the keys cannot be split (one key). The halves are called without sinks: shards_output's
    two shards."""
    return shards_output(call, q, k, v, mask, causal, alignment, sinks, 2)


def shards_output(call: Any, q: Any, k: Any, v: Any, mask: Any, causal: bool, alignment: str, sinks: Any,
                  n: int) -> Any:
    """`call`'s (out, lse) on n key shards (context parallel: measure.golden.lse.shard_calls), merged in
    ring order, the sinks applied once after through the merged lse: (B, H, Tq, d) float64, or None
    where there are fewer keys than shards. The shards are called without sinks."""
    parts = shard_calls(call, q, k, v, mask, causal, alignment, n)
    if parts is None:
        return None
    out, lse = merge_ring(parts)
    return out if sinks is None else apply_sinks_by_lse(out, lse, sinks)


def baseline_shards(ref: "Reference", inputs: Inputs, n: int) -> float | None:
    """RMSE of eager's (out, lse) in the input dtype over n key shards merged (shards_output), against the
    golden on its slices: the lse_shards check's budget. Computed by the first variant of an input set
    that returns an lse, and kept in ref.baseline_extra as shards_<n> (most cells' variants return none:
    building it with every reference cost each cell 12 calls). None where it cannot run."""
    import torch
    key = f"shards_{n}"
    if key not in ref.baseline_extra:
        q, mask = (take_slices(t, ref.slices) for t in (inputs.q, inputs.mask))
        k, v = (take_slices(t, ref.slices, heads=ref.heads) for t in (inputs.k, inputs.v))
        try:
            with torch.no_grad():
                out = shards_output(eager_lse_attention, q, k, v, mask, inputs.causal, ref.alignment,
                                    sinks_for_slices(inputs.sinks, ref.slices), n)
        except Exception:  # noqa: BLE001 - no baseline: the budget becomes null, not fake
            out = None
        ref.baseline_extra[key] = None if out is None else \
            error_vs_reference(out, ref.golden.out, ref.golden.row_visible)["rmse"]
    return ref.baseline_extra[key]


def _baseline_merge(q: Any, k: Any, v: Any, mask: Any, causal: bool, golden: Golden, alignment: str,
                    sinks: Any) -> float | None:
    """RMSE of eager's (out, lse) in the input dtype, merged over the keys' halves, against the golden."""
    import torch
    try:
        with torch.no_grad():
            out = merged_output(eager_lse_attention, q, k, v, mask, causal, alignment, sinks)
    except Exception:  # noqa: BLE001 - no baseline: the merge budget becomes null, not fake
        return None
    return None if out is None else error_vs_reference(out, golden.out, golden.row_visible)["rmse"]


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
        # a compiled variant's argument probes, shared by its cells of a run (measure/checks/arguments.py):
        # variant -> {argument: {name: (status, evidence, cell id)}}
        self.probe_memo: dict[str, dict] = {}

    @staticmethod
    def key(variant: Variant, inputs: Inputs) -> tuple:
        mask = inputs.mask
        mask_kind = None if mask is None else (str(mask.dtype), tuple(mask.shape))
        return (variant.name, str(inputs.q.device), str(inputs.q.dtype), tuple(inputs.q.shape),
                tuple(inputs.k.shape), tuple(inputs.v.shape), inputs.causal, mask_kind, str(inputs.score_mod),
                inputs.sinks is not None)

    def get(self, variant: Variant, inputs: Inputs) -> tuple[Callable[..., Any], Build]:
        if not variant.compiled:
            build = Build(variant.build())
            return build.fn, build
        key = self.key(variant, inputs)
        if key not in self._builds:
            self._builds[key] = Build(variant.build())
        build = self._builds[key]
        return build.fn, build
