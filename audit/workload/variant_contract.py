"""The variant contract: how every attention implementation under audit (built-ins, compiled forms,
SDPA backends, plug-ins) is called, what it returns, and the Variant describing one.

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
The variants themselves: variants.py (the registry), torch_kernels.py (SDPA, flex, compiled) and
plugins.py (a user's functions).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

AttentionFn = Callable[..., Any]
# A negative control's name: this prefix, then its defect (its family is "broken"). One definition:
# the registry names the controls with it, the plan and the analysis tell them from real variants by it.
BROKEN_PREFIX = "broken."


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
    # The library whose code it runs when that is not the audit's ("torch", "transformers", a plug-in's
    # module): a finding about it is that library's, shrunk to its smallest failing cell (execute/shrink.py)
    upstream: str | None = None
    # The same code without torch.compile, where the audit has it as a variant (flex -> flex_eager): a finding
    # that its uncompiled twin shows too is the library's op's, not the compiler's (execute/shrink.py)
    uncompiled: str | None = None

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
# The devices a variant returning its log-sum-exp everywhere returns it on (Variant.lse_on).
LSE_DEVICES: tuple[str, ...] = ("cpu", "cuda")
