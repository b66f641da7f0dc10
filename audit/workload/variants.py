"""The variants by name: the built-ins (the implementations the audit ships, then the negative
controls, each made to fail one way) registered once, and resolve(), which also turns an `hf:NAME`
or a plug-in spec into its Variant (plugins.py). What a variant is and promises: variant_contract.py;
the built-ins calling torch's kernels: torch_kernels.py.
"""
from __future__ import annotations

import functools
from typing import Mapping

from ..core.errors import UsageError
from . import argument_controls, layout_controls, referee_controls, varlen
from .argument_controls import ARGUMENT_CONTROL_CELLS, ARGUMENT_CONTROLS
from .arguments import ARGUMENTS
from .controls import (BACKWARD_CONTROLS, LSE_CONTROLS, broken_backward_dq_scale_missing,
                       broken_backward_rowsum_d_missing, broken_clamped_probs, broken_gqa_wrong_head_probs,
                       broken_lse_base2, broken_lse_no_grad, broken_mask_after_softmax_probs,
                       broken_no_max_subtraction_probs, broken_sink_ignored, broken_sink_ignored_probs,
                       broken_softmax_wrong_dim_probs, broken_unscaled_probs, broken_zero_keys_as_padding_probs,
                       kv_tiled)
from .eager import _from_probs, eager_fp32_lse_attention, eager_fp32_probs, eager_lse_attention, eager_probs
from .layout_controls import LAYOUT_CONTROL_CELLS, LAYOUT_CONTROLS
from .lse_kernels import _cuda_lse_op, _flash_op
from .plugins import hf_variant, is_plugin_name, load_plugin
from .referee_controls import REFEREE_CONTROLS
from .torch_kernels import (FLEX_LSE_DEVICES, SDPA_NO_SCORE_MOD, SDPA_NO_SINKS, _compiled, _flex, _forced, _sdpa,
                            sdpa_dispatch_choice)
from .variant_contract import BROKEN_PREFIX, LSE_DEVICES, Variant


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
                functools.partial(_sdpa, None), family="sdpa", upstream=TORCH, backend=sdpa_dispatch_choice,
                unsupported=sdpa_limits),
        Variant("sdpa_math", "SDPA forced to the MATH backend (reference C++ composite)",
                functools.partial(_sdpa, "MATH"), family="sdpa", upstream=TORCH, backend=_forced("MATH"),
                unsupported=sdpa_limits),
        Variant("sdpa_flash", "SDPA forced to the FLASH_ATTENTION backend",
                functools.partial(_sdpa, "FLASH_ATTENTION"), family="sdpa", upstream=TORCH,
                backend=_forced("FLASH_ATTENTION"), unsupported=sdpa_limits),
        Variant("sdpa_efficient", "SDPA forced to the EFFICIENT_ATTENTION (memory-efficient) backend",
                functools.partial(_sdpa, "EFFICIENT_ATTENTION"), family="sdpa", upstream=TORCH,
                backend=_forced("EFFICIENT_ATTENTION"), unsupported=sdpa_limits),
        Variant("sdpa_cudnn", "SDPA forced to the CUDNN_ATTENTION backend",
                functools.partial(_sdpa, "CUDNN_ATTENTION"), family="sdpa", upstream=TORCH,
                backend=_forced("CUDNN_ATTENTION"), unsupported=sdpa_limits),
        Variant("flex", "torch.compile(flex_attention): causal/padding/window as block masks, float masks "
                "and soft-capping as score_mod, GQA with enable_gqa; on CUDA its LSE, sinks through it",
                _flex, compiled=True, family="compiled", upstream=TORCH, lse_on=FLEX_LSE_DEVICES, forms=("varlen",),
                uncompiled="flex_eager"),
        Variant("flex_eager", "flex_attention uncompiled (torch's dense fallback) with its LSE, sinks through it",
                functools.partial(_flex, False), family="eager", upstream=TORCH, lse_on=both, forms=("varlen",)),
        Variant("flash_op", "SDPA's flash kernel as its op (aten._scaled_dot_product_flash_attention[_for_cpu]), "
                "returning out and the LSE", _flash_op, family="sdpa", upstream=TORCH, lse_on=both,
                unsupported={"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS,
                             "latent": "the flash kernel needs q, k and v of one head size (torch: \"Q/K/V should "
                                       "have the same head size\")"}),
        Variant("packed_loop", "packed sequences' plain reference: SDPA's math on each document of cu_seqlens in a "
                "Python loop (dense cells: each batch row one document)", lambda: varlen.packed_loop,
                forms=("varlen",), masks=False, unsupported={"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS}),
        Variant("nested_sdpa", "SDPA on jagged nested tensors built from cu_seqlens (torch's packed sequences "
                "without flash-attn)", lambda: varlen.nested_sdpa, family="sdpa", upstream=TORCH, forms=("varlen",), masks=False,
                unsupported={"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS,
                             "gqa": "nested-tensor SDPA takes no enable_gqa"}),
        Variant("varlen_attn", "torch.nn.attention.varlen.varlen_attn on cu_seqlens (flash-attn's varlen kernel; "
                "CUDA only)", lambda: varlen.varlen_attn, family="sdpa", upstream=TORCH, forms=("varlen",), masks=False,
                causal_alignment="bottom-right",
                unsupported={"score_mod": "varlen_attn has no score modification argument", "sinks": SDPA_NO_SINKS}),
        Variant("paged_flex", "torch's PagedAttention over compiled FlexAttention: the pools as its physical cache, "
                "the block table as its page table, the used keys as a logical mask it converts to pages",
                varlen.paged_flex, compiled=True, family="compiled", upstream=TORCH, forms=("paged",), masks=False,
                causal_alignment="bottom-right",
                unsupported={"score_mod": "the paged call takes no score modification here", "sinks": SDPA_NO_SINKS}),
        Variant("paged_gather", "paged decoding's plain reference: gather each sequence's pages by its block "
                "table, mask past its used length, SDPA's math", lambda: varlen.paged_gather, forms=("paged",),
                masks=False,
                causal_alignment="bottom-right",
                unsupported={"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS}),
        *(Variant(f"{kind}_op", f"SDPA's {kind} kernel as its op (aten._scaled_dot_product_{kind}_attention, "
                  "compute_log_sumexp), returning out and the LSE; CUDA only, no mask",
                  functools.partial(_cuda_lse_op, kind),
                  family="sdpa", upstream=TORCH, lse_on=("cuda",), unsupported={"score_mod": SDPA_NO_SCORE_MOD, "sinks": SDPA_NO_SINKS})
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
        doc = LSE_CONTROLS[name.removeprefix(BROKEN_PREFIX)]
        specs.append(Variant(name, f"NEGATIVE CONTROL: eager's (out, lse), {doc}",
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


@functools.lru_cache(maxsize=1)
def _builtin_table() -> dict[str, Variant]:
    return _builtins()


TORCH = "torch"                # Variant.upstream of the variants that run torch's own kernels
VERDICT_BASELINE = "sdpa"      # what a PyTorch user gets by default: the verdict's yardstick
# The names in their registration order, made from the registrations: the implementations, then the
# negative controls (family "broken").
BUILTIN_NAMES: tuple[str, ...] = tuple(n for n, v in _builtin_table().items() if not v.negative_control)
NEGATIVE_CONTROLS: tuple[str, ...] = tuple(n for n, v in _builtin_table().items() if v.negative_control)
ARGUMENT_CONTROL_NAMES: tuple[str, ...] = tuple(BROKEN_PREFIX + name for name in ARGUMENT_CONTROLS)
REFEREE_CONTROL_NAMES: tuple[str, ...] = tuple(BROKEN_PREFIX + name for name in REFEREE_CONTROLS)
# Run (and flagged) on GQA cells only: the controls that need a cell with fewer kv heads.
GQA_CONTROLS: tuple[str, ...] = tuple(n for n in NEGATIVE_CONTROLS if "gqa" in _builtin_table()[n].requires)


def builtin_variants() -> dict[str, Variant]:
    """The built-in variants by name: the registry is made once per process (the cost model
    asks it for every cell it predicts: 37k calls in a cpu preset's plan, 3 s when rebuilt
    each time); a fresh dict each call, so a caller's change stays its own."""
    return dict(_builtin_table())


def has_upstream(name: str) -> bool:
    """Whether a variant runs code the audit did not write (its findings shrink: execute/shrink.py): a
    built-in's `upstream`; a plug-in, an `hf:` function or a declared kernel always (resolved without
    importing them)."""
    table = _builtin_table()
    return bool(table[name].upstream) if name in table else True


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
