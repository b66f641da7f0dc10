"""Attention implementations under audit: built-ins, compiled forms, SDPA backends, plug-ins.

Every variant is a callable fn(q, k, v, *, mask=None, causal=False, scale=None) -> out with
q (B, H, Tq, d), k (B, Hkv, Tk, d), v (B, Hkv, Tk, d_v), out (B, H, Tq, d_v) in q's dtype. Fewer
kv heads (GQA, MQA at 1) pair query head h with kv head h // (H / Hkv) (repeat_interleave).
mask: None, bool (True = may attend) or additive float, broadcastable to (B, H, Tq, Tk); causal:
top-left (query i sees keys j <= i), as SDPA's is_causal; scale None: 1/sqrt(d). Only in cells
that have them: score_mod (inputs.ScoreMod, on the scaled scores before masking), sinks ((H,)
logits, gpt-oss's extra softmax column), and in the layouts a variant declares (Variant.forms)
cu_seqlens / a paged cache (varlen.py) / window (a sliding window's width w: query i sees keys j with
|i - j| < w, causal masking cutting the right side as usual).

A variant returning the log-sum-exp (Variant.lse_on) returns (out, lse), lse (B, H, Tq), natural
log over the keys (with the sink where it declares lse_includes_sink): measure.checks.lse checks it.
What a variant cannot take (Hkv < H, d_v != d_k, a score_mod, sinks) is in Variant.unsupported
(a plug-in: what it does not declare); such cells are skipped with the reason, never run wrong.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ..core.errors import BackwardUnsupported, Unsupported, UsageError
from .compiling import (_compiled_fn, _private_copy, compiled_flex_attention, compiled_graph_count,  # noqa: F401
                        configure_dynamo, fused_attention_count, graph_break_count)
from .controls import (BACKWARD_CONTROLS, LSE_CONTROLS, broken_lse_base2, broken_lse_no_grad, broken_sink_ignored,
                       broken_sink_ignored_probs,
                       broken_clamped_probs, broken_gqa_wrong_head_probs, broken_mask_after_softmax_probs,
                       broken_no_max_subtraction_probs, broken_softmax_wrong_dim_probs, broken_unscaled_probs,
                       broken_zero_keys_as_padding_probs,
                       broken_backward_dq_scale_missing, broken_backward_rowsum_d_missing, kv_tiled)
from .eager import (_from_probs, eager_attention, eager_fp32_attention, eager_fp32_lse_attention,  # noqa: F401
                    eager_fp32_probs, eager_lse_attention, eager_probs, kv_for_queries)
from . import argument_controls, layout_controls, referee_controls, varlen
from .argument_controls import ARGUMENT_CONTROL_CELLS, ARGUMENT_CONTROLS
from .arguments import ARGUMENTS
from .layout_controls import LAYOUT_CONTROL_CELLS, LAYOUT_CONTROLS
from .varlen import document_owner
from .inputs import causal_keep
from .referee_controls import REFEREE_CONTROLS
from .lse_kernels import _cuda_lse_op, _flash_op, apply_sinks_by_lse  # noqa: F401  (apply_sinks_by_lse: measure uses it)
from .lse_kernels import fold_causal as _fold_causal

AttentionFn = Callable[..., Any]


@dataclass(frozen=True)
class Variant:
    """A named way to compute attention. `build()` is called once per cell."""

    name: str
    description: str
    build: Callable[[], AttentionFn]
    compiled: bool = False          # torch.compile: compile time and fusion are recorded
    family: str = "eager"           # eager | compiled | sdpa | plugin | broken
    probs: Callable[..., Any] | None = None  # exposes attention weights (B, H, Tq, Tk), if it can
    backend: Callable[..., str] | None = None  # SDPA: which kernel runs for these inputs
    # FEATURES this variant cannot take -> why (its cells needing one are skipped) ...
    unsupported: Mapping[str, str] = field(default_factory=dict)
    # ... and those it needs a cell to have -> why (a GQA negative control has nothing to show on MHA)
    requires: Mapping[str, str] = field(default_factory=dict)
    # The causal alignment it implements when q_len != kv_len: top-left (the contract's) or
    # bottom-right (KV-cache decoding: flash-attn's, transformers'); its golden follows it.
    causal_alignment: str = "top-left"
    # A negative control: the scenarios whose every cell shows its defect (empty: any cell it
    # runs). The time budget gives its self-check the cheapest of those cells first, not a grid.
    reveals: tuple[str, ...] = ()
    # The devices where it returns (out, lse) instead of out (module docstring), and whether that
    # lse counts the sink in its sum (default: over the keys only, flex's convention).
    lse_on: tuple[str, ...] = ()
    lse_includes_sink: bool = False
    # The layouts it is called in where a cell has them (CALL_FORMS): "varlen" (packed cells hand it
    # cu_seqlens and max_seqlen for the document mask), "paged" (paged cells hand it the cache's pools
    # and block table, varlen.PagedCall), "window" (sliding-window cells hand it window=w, the width:
    # |i - j| < w, for the window's mask). A variant without one gets the same cell dense.
    forms: tuple[str, ...] = ()
    # The page size its paged cache must have (a kernel's constraint, e.g. flash-attn's multiples of
    # 256); None: the preset's (Preset.page_size)
    page_size: int | None = None
    # False: it takes no mask tensor (a layout-only kernel: cu_seqlens or a cache's used lengths only)
    masks: bool = True

    @property
    def negative_control(self) -> bool:
        return self.family == "broken"

    def returns_lse(self, device: str) -> bool:
        """True when its calls on `device` ("cpu", "cuda", "cuda:0") return (out, lse)."""
        return device.split(":")[0] in self.lse_on

    def refusal(self, needs: Iterable[str]) -> str | None:
        """Why this variant does not run a cell needing these features, or None when it does."""
        needs = set(needs)
        for feature in sorted(needs & set(self.unsupported)):
            return f"{self.name} cannot take {FEATURE_NAMES[feature]}: {self.unsupported[feature]}"
        for feature in sorted(set(self.requires) - needs):
            return f"{self.name} runs on {FEATURE_NAMES[feature]} cells only: {self.requires[feature]}"
        return None


# Capabilities a cell may need beyond plain multi-head attention (inputs.needs): "gqa" (k, v with
# fewer heads than q, MQA included) and "score_mod" (inputs.ScoreMod). A plug-in declares those it
# has; a cell's needs may also name "mqa" (one key/value head), which "gqa" covers.
FEATURES: tuple[str, ...] = ("gqa", "score_mod", "sinks", "latent")
# Layouts a variant may be called in (Variant.forms): not needed by any cell, since a variant without
# them gets the cell dense; a plug-in declares them in audit_supports beside the features.
CALL_FORMS: tuple[str, ...] = ("varlen", "paged", "window")
FEATURE_NAMES = {"gqa": "GQA/MQA (kv_heads < heads)", "mqa": "MQA (kv_heads = 1)",
                 "score_mod": "a score modification (soft-capping)",
                 "sinks": "attention sinks (one logit per head, gpt-oss)",
                 "latent": "values of another head dimension than keys (d_v != d_k, MLA)",
                 "varlen": "packed sequences (cu_seqlens)", "paged": "a paged KV cache (block table)",
                 "window": "a sliding window as an argument (window=w)"}
# What the returned (out, lse) may be: RETURNS of a plug-in's `audit_returns` and audit.adapt's returns.
PLUGIN_RETURNS: tuple[str, ...] = ("out", "out_lse")
LSE_DEVICES: tuple[str, ...] = ("cpu", "cuda")


# --------------------------------------------------------------------------- compiled


def _compiled(options: dict | None) -> AttentionFn:
    return _compiled_fn(eager_attention, options)


# --------------------------------------------------------------------------- SDPA

# torch's own refusals of a forced backend: "No available kernel. Aborting execution." (CUDA:
# every kernel of the forced set declined, with the reasons as warnings) and "No viable backend
# for scaled_dot_product_attention was found." (CPU). Nothing else is a backend limit: a cuDNN
# frontend or driver failure that says "not supported" is an error, and recorded as one.
_NO_KERNEL_MARKERS = ("No available kernel", "No viable backend for scaled_dot_product_attention")


def _sdpa(backend_name: str | None) -> AttentionFn:
    import torch
    import torch.nn.functional as F

    backend = None
    if backend_name is not None:
        from torch.nn.attention import SDPBackend
        backend = getattr(SDPBackend, backend_name, None)
        if backend is None:
            raise Unsupported(f"this torch has no SDPA backend {backend_name}")

    def call(q, k, v, *, mask=None, causal=False, scale=None):
        mask, causal = _fold_causal(q, k, mask, causal)
        kwargs = dict(attn_mask=mask, is_causal=causal, scale=scale)
        if k.shape[-3] != q.shape[-3]:
            kwargs["enable_gqa"] = True        # only then: multi-head calls stay exactly as they were
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
        from torch.nn.attention import sdpa_kernel
        try:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        except RuntimeError as exc:
            text = str(exc)
            if any(m in text for m in _NO_KERNEL_MARKERS):
                raise Unsupported(f"SDPA backend {backend_name} cannot run this cell on "
                                  f"{q.device.type}/{str(q.dtype).replace('torch.', '')}: "
                                  f"{_first_line(exc)}") from None
            raise

    return call


def sdpa_dispatch_choice(q, k, v, *, mask=None, causal=False, scale=None) -> str:
    """The SDPA backend the dispatcher picks for these inputs (torch._fused_sdp_choice)."""
    import torch
    from torch.nn.attention import SDPBackend
    mask, causal = _fold_causal(q, k, mask, causal)
    gqa = {"enable_gqa": True} if k.shape[-3] != q.shape[-3] else {}
    return SDPBackend(torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, scale=scale, **gqa)).name


def _forced(name: str) -> Callable[..., str]:
    return lambda *args, **kwargs: name


# --------------------------------------------------------------------------- FlexAttention

# torch 2.13: compiled flex on the CPU "only supports inference and `return_lse` is not supported yet".
FLEX_CPU_NO_LSE = ("compiled flex_attention on the CPU cannot return the log-sum-exp (torch: \"return_lse is "
                   "not supported yet\"), which sinks are applied through")
FLEX_LSE_DEVICES = ("cuda",)


def _flex(compiled_flex: bool = True) -> AttentionFn:
    """torch.compile(flex_attention, fullgraph=True) (compiled_flex=False: flex_attention itself,
    eager, the dense math torch runs uncompiled); causal and bool masks as block masks, float
    masks and the cell's ScoreMod as score_mod, GQA with enable_gqa. Where flex returns the
    log-sum-exp (eager everywhere, compiled on CUDA: FLEX_LSE_DEVICES) the call returns
    (out, lse), and sinks are applied through it (apply_sinks_by_lse).

    fullgraph: a graph break inside flex_attention would make Dynamo run the frame eagerly, and
    flex's eager branch only warns, then builds the whole score matrix: such a cell would be
    timed and reported as "flex". With fullgraph the break is the cell's error instead.
    """
    import torch
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    compiled = compiled_flex_attention() if compiled_flex else flex_attention   # torch's refusals first
    block_mask_for: list = []     # [(mask tensor, causal, BlockMask)]: the last one built

    def call(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None, sinks=None, cu_seqlens=None,
             max_seqlen=None):
        with_lse = not compiled_flex or q.device.type in FLEX_LSE_DEVICES
        if sinks is not None and not with_lse:
            raise Unsupported(FLEX_CPU_NO_LSE)
        if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise BackwardUnsupported("FlexAttention has no backward on CPU in this torch "
                                      "(NotImplementedError); forward measured without grad")
        tq, tk = q.shape[-2], k.shape[-2]
        bool_mask = mask if mask is not None and mask.dtype == torch.bool else None
        float_mask = mask if mask is not None and mask.dtype != torch.bool else None

        def pick(m, b, qi, ki):
            # m: (B|1, 1, Tq|1, Tk) -> the entry for batch b, query qi, key ki (broadcast dims read
            # index 0). One index expression: the chained m[b, 0, qi][ki] compiled for the CPU
            # reads out of bounds for a (1, 1, Tq, Tk) mask (heap corruption, SIGSEGV/SIGABRT).
            return m[b if m.shape[0] > 1 else 0, 0, qi if m.shape[-2] > 1 else 0, ki]

        owner = None if cu_seqlens is None else document_owner(cu_seqlens, q.shape[0], tq)   # (B, T)

        def mask_mod(b, h, qi, ki):
            keep = (qi >= ki) if causal else (qi >= 0)
            if bool_mask is not None:
                keep = keep & pick(bool_mask, b, qi, ki)
            if owner is not None:                       # the document mask: same document, none for padding
                keep = keep & (owner[b, qi] == owner[b, ki]) & (owner[b, qi] >= 0)
            return keep

        modify = score_mod

        def flex_score_mod(score, b, h, qi, ki):
            if modify is not None:
                score = modify(score)                  # before masking, as in the golden
            if float_mask is not None:
                score = score + pick(float_mask, b, qi, ki).to(score.dtype)
            return score

        block_mask = None
        if causal or bool_mask is not None or owner is not None:
            # One callable serves many cells (cellcache.BuildCache): the block mask is rebuilt when
            # the mask tensor itself changes (compared by identity while it is held, so a new
            # tensor at a recycled address is never mistaken for the old one).
            shape_of = bool_mask if bool_mask is not None else cu_seqlens
            if not (block_mask_for and block_mask_for[0][0] is shape_of and block_mask_for[0][1] == (causal, tq, tk)):
                batch = bool_mask.shape[0] if bool_mask is not None and bool_mask.shape[0] > 1 else None
                batch = q.shape[0] if owner is not None else batch
                block_mask_for[:] = [(shape_of, (causal, tq, tk),
                                      create_block_mask(mask_mod, batch, None, tq, tk, device=q.device.type))]
            block_mask = block_mask_for[0][2]
        gqa = {"enable_gqa": True} if k.shape[-3] != q.shape[-3] else {}
        if with_lse:
            gqa["return_aux"] = AuxRequest(lse=True)
        try:
            result = compiled(q, k, v, block_mask=block_mask, scale=scale, **gqa,
                              score_mod=flex_score_mod if (modify is not None or float_mask is not None) else None)
        except torch._dynamo.exc.Unsupported as exc:
            raise RuntimeError(f"flex_attention did not compile as one graph (fullgraph=True), so it "
                               f"would have run eagerly: {_first_line(exc)}") from exc
        if not with_lse:
            return result
        out, lse = result[0], result[1].lse                                       # (B, H, Tq, d), (B, H, Tq)
        return (out if sinks is None else apply_sinks_by_lse(out, lse, sinks)), lse

    return call


# --------------------------------------------------------------------------- registry

BROKEN_PREFIX = "broken."
SDPA_NO_SCORE_MOD = ("scaled_dot_product_attention has no score modification argument; "
                     "soft-capping would need the scores it never materializes")
SDPA_NO_SINKS = "scaled_dot_product_attention has no sink argument"


def _builtins() -> dict[str, Variant]:
    """Every built-in variant by name: the implementations, then the negative controls."""
    return {v.name: v for v in _implementations() + _negative_controls()}


def _implementations() -> list[Variant]:
    """The attention implementations the audit ships (BUILTIN_NAMES, in that order)."""
    sdpa_limits = {"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS}
    both = LSE_DEVICES
    return [
        Variant("eager", "hand-written softmax(QKᵀ·scale)V, every step in the input dtype; returns its logsumexp",
                lambda: eager_lse_attention, probs=eager_probs, lse_on=both),
        Variant("eager_fp32", "hand-written; scores, softmax and logsumexp upcast to fp32, cast back for P·V",
                lambda: eager_fp32_lse_attention, probs=eager_fp32_probs, lse_on=both),
        Variant("compiled", "torch.compile(eager), default settings (Inductor may rewrite it into SDPA)",
                functools.partial(_compiled, None), compiled=True, family="compiled"),
        Variant("compiled_unfused", "torch.compile(eager) with pattern matching off: the hand-written math compiled",
                functools.partial(_compiled, {"pattern_matcher": False}), compiled=True, family="compiled"),
        Variant("sdpa", "F.scaled_dot_product_attention, the dispatcher's choice of backend",
                lambda: _sdpa(None), family="sdpa", backend=sdpa_dispatch_choice,
                unsupported=sdpa_limits),
        Variant("sdpa_math", "SDPA forced to the MATH backend (reference C++ composite)",
                lambda: _sdpa("MATH"), family="sdpa", backend=_forced("MATH"),
                unsupported=sdpa_limits),
        Variant("sdpa_flash", "SDPA forced to the FLASH_ATTENTION backend",
                lambda: _sdpa("FLASH_ATTENTION"), family="sdpa", backend=_forced("FLASH_ATTENTION"),
                unsupported=sdpa_limits),
        Variant("sdpa_efficient", "SDPA forced to the EFFICIENT_ATTENTION (memory-efficient) backend",
                lambda: _sdpa("EFFICIENT_ATTENTION"), family="sdpa", backend=_forced("EFFICIENT_ATTENTION"),
                unsupported=sdpa_limits),
        Variant("sdpa_cudnn", "SDPA forced to the CUDNN_ATTENTION backend",
                lambda: _sdpa("CUDNN_ATTENTION"), family="sdpa", backend=_forced("CUDNN_ATTENTION"),
                unsupported=sdpa_limits),
        Variant("flex", "torch.compile(flex_attention): causal/padding/window as block masks, float masks "
                "and soft-capping as score_mod, GQA with enable_gqa; on CUDA its LSE, sinks through it",
                _flex, compiled=True, family="compiled", lse_on=FLEX_LSE_DEVICES, forms=("varlen",)),
        Variant("flex_eager", "flex_attention uncompiled (torch's dense fallback) with its LSE, sinks through it",
                functools.partial(_flex, False), family="eager", lse_on=both, forms=("varlen",)),
        Variant("flash_op", "SDPA's flash kernel as its op (aten._scaled_dot_product_flash_attention[_for_cpu]), "
                "returning out and the LSE", _flash_op, family="sdpa", lse_on=both,
                unsupported={"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS,
                             "latent": "the flash kernel needs q, k and v of one head size (torch: \"Q/K/V should "
                                       "have the same head size\")"}),
        Variant("packed_loop", "packed sequences' plain reference: SDPA's math on each document of cu_seqlens in a "
                "Python loop (dense cells: each batch row one document)", lambda: varlen.packed_loop,
                forms=("varlen",), masks=False, unsupported={"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS}),
        Variant("nested_sdpa", "SDPA on jagged nested tensors built from cu_seqlens (torch's packed sequences "
                "without flash-attn)", lambda: varlen.nested_sdpa, family="sdpa", forms=("varlen",), masks=False,
                unsupported={"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS,
                             "gqa": "nested-tensor SDPA takes no enable_gqa"}),
        Variant("varlen_attn", "torch.nn.attention.varlen.varlen_attn on cu_seqlens (flash-attn's varlen kernel; "
                "CUDA only)", lambda: varlen.varlen_attn, family="sdpa", forms=("varlen",), masks=False,
                causal_alignment="bottom-right",
                unsupported={"score_mod": "varlen_attn has no score modification argument", "sinks": SDPA_NO_SINKS}),
        Variant("paged_flex", "torch's PagedAttention over compiled FlexAttention: the pools as its physical cache, "
                "the block table as its page table, the used keys as a logical mask it converts to pages",
                varlen.paged_flex, compiled=True, family="compiled", forms=("paged",), masks=False,
                causal_alignment="bottom-right",
                unsupported={"score_mod": "the paged call takes no score modification here", "sinks": SDPA_NO_SINKS}),
        Variant("paged_gather", "paged decoding's plain reference: gather each sequence's pages by its block "
                "table, mask past its used length, SDPA's math", lambda: varlen.paged_gather, forms=("paged",),
                masks=False,
                causal_alignment="bottom-right",
                unsupported={"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS}),
        *(Variant(f"{kind}_op", f"SDPA's {kind} kernel as its op (aten._scaled_dot_product_{kind}_attention, "
                  "compute_log_sumexp), returning out and the LSE; CUDA only, no mask", functools.partial(_cuda_lse_op, kind),
                  family="sdpa", lse_on=("cuda",), unsupported={"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS})
          for kind in ("efficient", "cudnn")),
    ]


def _negative_controls() -> list[Variant]:
    """The negative controls (NEGATIVE_CONTROLS, in order): numerics, backward, lse, layouts, referee."""
    both = LSE_DEVICES
    specs: list[Variant] = []
    no_sinks = {"sinks": "a negative control of another defect: its weights function takes no sinks"}
    # Each control with the scenarios whose cells show its defect (every cell, in each dtype,
    # causal or not: tests/test_variants.py), the first the one its fp32 cells are also diagnosed
    # in as its mistake: a wrong scale or softmax dimension shows anywhere, a mask applied after
    # a renormalised softmax only on rows that see no key (elsewhere it is right to rounding), a
    # clamp where keys are masked, a missing max where exp overflows, all-zero keys taken for
    # padding where real keys are all zeros (sparse; dense inputs have none).
    anywhere = ("normal", "scaled_x4", "scaled_x16", "scaled_x64", "outliers")
    for probs_fn, reveals in ((broken_unscaled_probs, anywhere + ("padding",)),
                              (broken_mask_after_softmax_probs, ("fully_masked_bool", "fully_masked_neginf")),
                              (broken_clamped_probs, ("padding", "fully_masked_bool", "fully_masked_neginf")),
                              (broken_no_max_subtraction_probs, ("scaled_x64", "fp16_range")),
                              (broken_softmax_wrong_dim_probs, anywhere + ("fully_masked_bool", "fully_masked_neginf")),
                              (broken_zero_keys_as_padding_probs, ("sparse",))):
        name = BROKEN_PREFIX + probs_fn.__name__.removeprefix("broken_").removesuffix("_probs")
        doc = (probs_fn.__doc__ or "").strip().splitlines()[0]
        specs.append(Variant(name, "NEGATIVE CONTROL: " + doc,
                             (lambda f=probs_fn: _from_probs(f)), family="broken", probs=probs_fn,
                             reveals=reveals, unsupported=no_sinks))
    specs.append(Variant(
        "broken.gqa_wrong_head", "NEGATIVE CONTROL: " + broken_gqa_wrong_head_probs.__doc__.strip(),
        lambda: _from_probs(broken_gqa_wrong_head_probs, pair_kv=kv_tiled), family="broken",
        probs=broken_gqa_wrong_head_probs,
        requires={"gqa": "with kv_heads == heads, h % kv_heads is h, the right pairing: nothing to detect"},
        unsupported={"mqa": "with one key/value head every pairing is the same: nothing to detect", **no_sinks},
        reveals=()))                  # any GQA cell it runs
    for attention in (broken_backward_rowsum_d_missing, broken_backward_dq_scale_missing):
        # right forward, wrong backward: shows in any cell with a backward
        name = BROKEN_PREFIX + attention.__name__.removeprefix("broken_")
        doc = BACKWARD_CONTROLS[name.removeprefix(BROKEN_PREFIX + "backward_")]
        specs.append(Variant(name, f"NEGATIVE CONTROL: eager's forward, {doc}", (lambda a=attention: a),
                             family="broken", probs=eager_probs,
                             unsupported={"score_mod": "its hand-written backward takes no score modification",
                                          **no_sinks},
                             reveals=("normal", "scaled_x4", "outliers", "padding")))
    for attention, reveals in ((broken_sink_ignored, ("sinks",)), (broken_lse_base2, ("normal", "padding")),
                               (broken_lse_no_grad, ("normal", "padding"))):
        # right out (but for the sinks it drops), wrong or missing extras: the LSE and sinks checks
        name = BROKEN_PREFIX + attention.__name__.removeprefix("broken_")
        needs_sinks = {"sinks": "it drops the sinks: a cell without them has nothing to show"} \
            if attention is broken_sink_ignored else {}
        probs = broken_sink_ignored_probs if attention is broken_sink_ignored else eager_probs
        specs.append(Variant(name, f"NEGATIVE CONTROL: eager's (out, lse), {LSE_CONTROLS[name.removeprefix(BROKEN_PREFIX)]}",
                             (lambda a=attention: a), family="broken", probs=probs, lse_on=both,
                             unsupported={"score_mod": "its hand-written form takes no score modification"},
                             requires=needs_sinks, reveals=reveals))
    return specs + _layout_controls(no_sinks) + _referee_controls()


def _layout_controls(no_sinks: Mapping[str, str]) -> list[Variant]:
    """One layout mistake each (packed, paged, latent, the work's cut): layout_controls.py; and one
    argument ignored each (argument_controls.py): only its argument's probe sees it."""
    no_extras = {"score_mod": "its hand-written form takes no score modification", **no_sinks}
    specs = []
    for name, (forms, reveals, requires) in LAYOUT_CONTROL_CELLS.items():
        specs.append(Variant(BROKEN_PREFIX + name, f"NEGATIVE CONTROL: {LAYOUT_CONTROLS[name]}",
                             (lambda a=getattr(layout_controls, f"broken_{name}"): a), family="broken", forms=forms,
                             reveals=reveals, requires=requires, unsupported=no_extras,
                             causal_alignment="bottom-right" if "paged" in forms else "top-left"))
    for name, (reveals, requires) in ARGUMENT_CONTROL_CELLS.items():
        form = ARGUMENTS[ARGUMENT_CONTROLS[name][0]].form        # handed its argument in that call form only
        specs.append(Variant(BROKEN_PREFIX + name, f"NEGATIVE CONTROL (arguments): {ARGUMENT_CONTROLS[name][1]}",
                             (lambda a=getattr(argument_controls, f"broken_{name}"): a), family="broken",
                             reveals=reveals, requires=requires, forms=(form,) if form else (),
                             causal_alignment="bottom-right" if form == "paged" else "top-left",
                             unsupported={k: v for k, v in no_extras.items() if k not in requires}))
    return specs


def _referee_controls() -> list[Variant]:
    """The referee's controls: right values when checked once, one trick each (REFEREE_CONTROLS)."""
    specs = []
    for name, (check, doc) in REFEREE_CONTROLS.items():
        # right values when checked once, one trick each: only the referee's `check` can flag them
        attention = getattr(referee_controls, f"broken_{name}")
        specs.append(Variant(BROKEN_PREFIX + name, f"NEGATIVE CONTROL (referee: {check}): {doc}",
                             (lambda a=attention: a), family="broken",
                             unsupported={"score_mod": "it games its benchmark with SDPA, which has no score "
                                                       "modification", "sinks": SDPA_NO_SINKS},
                             reveals=("normal",)))
    return specs


VERDICT_BASELINE = "sdpa"      # what a PyTorch user gets by default: the verdict's yardstick
BUILTIN_NAMES: tuple[str, ...] = (
    "eager", "eager_fp32", "compiled", "compiled_unfused",
    "sdpa", "sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flex", "flex_eager", "flash_op",
    "packed_loop", "nested_sdpa", "varlen_attn", "paged_flex", "paged_gather", "efficient_op", "cudnn_op",
)
NEGATIVE_CONTROLS: tuple[str, ...] = (
    "broken.unscaled", "broken.mask_after_softmax", "broken.clamped",
    "broken.no_max_subtraction", "broken.softmax_wrong_dim", "broken.zero_keys_as_padding",
    "broken.gqa_wrong_head", "broken.backward_rowsum_d_missing", "broken.backward_dq_scale_missing",
    "broken.sink_ignored", "broken.lse_base2", "broken.lse_no_grad",
    *(BROKEN_PREFIX + name for name in LAYOUT_CONTROLS),
    *(BROKEN_PREFIX + name for name in ARGUMENT_CONTROLS),
    *(BROKEN_PREFIX + name for name in REFEREE_CONTROLS),
)
ARGUMENT_CONTROL_NAMES: tuple[str, ...] = tuple(BROKEN_PREFIX + name for name in ARGUMENT_CONTROLS)
REFEREE_CONTROL_NAMES: tuple[str, ...] = tuple(BROKEN_PREFIX + name for name in REFEREE_CONTROLS)
GQA_CONTROLS: tuple[str, ...] = ("broken.gqa_wrong_head",)   # run (and flagged) on GQA cells only


@functools.lru_cache(maxsize=1)
def _builtin_table() -> dict[str, Variant]:
    return _builtins()


def builtin_variants() -> dict[str, Variant]:
    """The built-in variants by name: the registry is made once per process (the cost model
    asks it for every cell it predicts: 37k calls in a cpu preset's plan, 3 s when rebuilt
    each time); a fresh dict each call, so a caller's change stays its own."""
    return dict(_builtin_table())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def is_plugin_name(name: str) -> bool:
    """A user's `package.module:function` (hf: names are transformers' functions, not plug-ins)."""
    from .hf import is_hf_name
    return ":" in name and not is_hf_name(name)


def hf_variant(spec: str) -> Variant:
    """`hf:NAME` -> the Variant of transformers' attention function NAME (audit.workload.hf)."""
    from . import hf
    name = spec[len(hf.HF_PREFIX):]
    hf.check_name(name)
    return Variant(spec, f"transformers' {name} attention function, called as a model calls it "
                         f"(mask from masking_utils, KV-cache causal alignment)",
                   lambda: hf.build(name), compiled=hf.split(name)[1] == "flex_attention", family="plugin",
                   unsupported=hf.capabilities(name), causal_alignment="bottom-right")


def load_plugin(spec: str) -> Variant:
    """`package.module:function` -> Variant; UsageError with a clear message on failure."""
    import os
    import sys

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--variant: {spec!r} is not of the form package.module:function")
    if os.getcwd() not in sys.path:  # the console script does not put cwd on sys.path
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see
        raise UsageError(f"--variant: cannot import module {module_name!r} for {spec!r}: "
                         f"{type(exc).__name__}: {_first_line(exc)}") from None
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise UsageError(f"--variant: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise UsageError(f"--variant: {spec!r} is a {type(fn).__name__}, not a callable")
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    description = doc[0] if doc else f"user plug-in {spec}"
    forms = tuple(f for f in _declared_supports(spec, fn) if f in CALL_FORMS)
    page_size = getattr(fn, PAGE_SIZE_ATTRIBUTE, None)
    if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1):
        raise UsageError(f"--variant: {spec}.{PAGE_SIZE_ATTRIBUTE} is {page_size!r}; allowed: a positive integer")
    return Variant(spec, description, lambda: fn, family="plugin", unsupported=_undeclared(spec, fn), forms=forms,
                   page_size=page_size,
                   causal_alignment=_declared_alignment(spec, fn), **declared_returns(f"--variant: {spec}", fn))


SUPPORTS_ATTRIBUTE = "audit_supports"
ALIGNMENT_ATTRIBUTE = "audit_causal_alignment"
RETURNS_ATTRIBUTE = "audit_returns"
LSE_SINK_ATTRIBUTE = "audit_lse_includes_sink"
PAGE_SIZE_ATTRIBUTE = "audit_page_size"
CAUSAL_ALIGNMENTS: tuple[str, ...] = ("top-left", "bottom-right")


def declared_returns(where: str, fn: Any) -> dict[str, Any]:
    """Variant fields from a callable's `audit_returns` ("out", the default, or "out_lse": it
    returns (out, lse) on every device) and `audit_lse_includes_sink` (its lse counts the sink)."""
    returns = getattr(fn, RETURNS_ATTRIBUTE, "out")
    if returns not in PLUGIN_RETURNS:
        raise UsageError(f"{where}.{RETURNS_ATTRIBUTE} is {returns!r}; allowed: {', '.join(PLUGIN_RETURNS)}")
    includes_sink = getattr(fn, LSE_SINK_ATTRIBUTE, False)
    if not isinstance(includes_sink, bool):
        raise UsageError(f"{where}.{LSE_SINK_ATTRIBUTE} is {includes_sink!r}; allowed: True, False")
    return {"lse_on": LSE_DEVICES if returns == "out_lse" else (), "lse_includes_sink": includes_sink}


def _declared_alignment(spec: str, fn: Any) -> str:
    """A plug-in's causal alignment: its `audit_causal_alignment` attribute, top-left without one."""
    declared = getattr(fn, ALIGNMENT_ATTRIBUTE, "top-left")
    if declared not in CAUSAL_ALIGNMENTS:
        raise UsageError(f"--variant: {spec}.{ALIGNMENT_ATTRIBUTE} is {declared!r}; allowed: "
                         f"{', '.join(CAUSAL_ALIGNMENTS)}")
    return declared


def _declared_supports(spec: str, fn: Any) -> tuple[str, ...]:
    """A plug-in's `audit_supports`, checked: names from FEATURES and CALL_FORMS."""
    declared = getattr(fn, SUPPORTS_ATTRIBUTE, ())
    allowed = FEATURES + CALL_FORMS
    if isinstance(declared, str) or not isinstance(declared, Iterable):
        raise UsageError(f"--variant: {spec}.{SUPPORTS_ATTRIBUTE} is {declared!r}; expected a tuple of "
                         f"feature names from: {', '.join(allowed)}")
    declared = tuple(declared)
    unknown = [f for f in declared if f not in allowed]
    if unknown:
        raise UsageError(f"--variant: {spec}.{SUPPORTS_ATTRIBUTE} names unknown feature(s) "
                         f"{', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}")
    return declared


def _undeclared(spec: str, fn: Any) -> dict[str, str]:
    """A plug-in's unsupported features: those its `audit_supports` attribute does not name.

    Undeclared means unsupported: a plug-in written for k and v of H heads could broadcast
    an MQA cell's single key/value head and look right by accident, or ignore a score_mod
    keyword it swallows with **kwargs, so the audit never guesses.
    """
    declared = _declared_supports(spec, fn)
    return {f: f"the plug-in does not declare it (add {f!r} to {spec}.{SUPPORTS_ATTRIBUTE}; "
               "docs/variants.md)" for f in FEATURES if f not in declared}


def resolve(name: str) -> Variant:
    """Built-in name, hf: name or plug-in spec -> Variant; UsageError listing the valid names."""
    from .hf import is_hf_name
    if is_hf_name(name):
        return hf_variant(name)
    if is_plugin_name(name):
        return load_plugin(name)
    table = builtin_variants()
    if name not in table:
        raise UsageError(f"--variant: unknown variant {name!r}; allowed: {', '.join(table)}, "
                         "hf:NAME (transformers' attention functions: python -m audit list) "
                         "or package.module:function")
    return table[name]


def check_name(name: str) -> None:
    """Validator for grid.validate_axes: raises UsageError for a bad variant name."""
    resolve(name)
