"""Functions that merge partial attention: (out, lse) pairs computed over disjoint sets of keys ->
the (out, lse) of attention over all of them. Split-KV decoding (FlashInfer's merge_state, vLLM's
merge_attn_states), context-parallel and ring attention (torch's _SDPAMerger) and chunked prefill
all end in one; measure/merging audits them on the partial states of real splits and on the edge
states that break them (an empty part, two, an empty part with FlashAttention's +inf lse).

A merge function is declared by its call form, as a kernel is (MERGE_FORMS): which arguments it
takes in which layout, whether it returns or writes its result, and the base of the lse it reads
and writes (FlashInfer's kernels keep theirs in base 2). The audit hands every form the same
parts in its own canonical state and reads the result back into it:

  out (B, H, T, d) in the state's dtype; lse (B, H, T) float32, natural log, keys only;
  a row that sees no key of a part: out 0 and lse -inf (FlashAttention's +inf in one edge state).

The built-ins by name (the reference, torch's, the controls) are workload/merges.py's.
Imports no torch at module level; the functions do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..core.errors import UsageError

LSE_BASES = ("e", "2")                 # the base of the logarithm a form's lse is in
Part = tuple[Any, Any]                  # (out (B, H, T, d), lse (B, H, T)) in the canonical state


# Context parallel and ring attention over N ranks: the keys cut into N contiguous shards, each
# rank's (out, lse) merged in ring order (measure.golden.lse.shard_calls; the lse_shards check). The
# two-way split is the lse_merge check's. A shard of few keys shows what a two-way split hides: a
# kernel that mishandles a key range shorter than its tile (T 64 in 4 shards: 16 keys each).
SHARD_COUNTS: tuple[int, ...] = (4, 8)
# ... on cells of at most this many keys: beyond, a shard of 8 holds 512 keys or more, and the check's
# two forwards of a long cell cost what its short cells show (0.16 s a cell of T 16384 on the reference
# H200: its speed grid went 4 s over the gpu preset's 8 minutes)
SHARD_MAX_KEYS = 4096


def merge_partials(first: Part, second: Part) -> Part:
    """Two partial results over disjoint keys -> the full one, in float64, as split-KV and ring
    attention merge them: lse = log(exp(lse1) + exp(lse2)), out = Σ exp(lse_i - lse) · out_i, each
    exponential taken against the larger lse. A part with no key weighs 0, whatever its out: its lse
    is -inf, or +inf (FlashAttention-2's final lse of an empty row; vLLM's merge_attn_states reads both
    infinities as empty); two empty parts give out 0 and lse -inf (a naive merge: NaN). An lse of 0 or
    another finite value there weighs the part's out in; NaN makes the row NaN. Its gradient is finite
    on empty parts too (0 through them): no exponential of -inf - -inf is taken, even where unused.
    out_i: (B, H, Tq, d); lse_i: (B, H, Tq) -> ((B, H, Tq, d), (B, H, Tq))."""
    import torch
    (o1, l1), (o2, l2) = first, second
    l1, l2 = (torch.where(t == math.inf, torch.full_like(t, -math.inf), t) for t in (l1.double(), l2.double()))
    empty1, empty2 = l1 == -math.inf, l2 == -math.inf                           # (B, H, Tq)
    both = empty1 & empty2
    top = torch.where(both, torch.zeros_like(l1), torch.maximum(l1, l2))
    w1, w2 = (torch.where(e, torch.zeros_like(lp), torch.exp(torch.where(e, top, lp) - top))
              for e, lp in ((empty1, l1), (empty2, l2)))                         # each <= 1, 0 where empty
    total = torch.where(both, torch.ones_like(w1), w1 + w2)
    lse = torch.where(both, torch.full_like(top, -math.inf), top + torch.log(total))
    # an empty part weighs 0 whatever its out holds (a hand-written kernel's NaN on a row with no key)
    parts = [torch.where(w[..., None] == 0, torch.zeros_like(o, dtype=torch.float64), w[..., None] * o.double())
             for w, o in ((w1, o1), (w2, o2))]
    return (parts[0] + parts[1]) / total[..., None], lse                          # (B, H, Tq, d), (B, H, Tq)


# --------------------------------------------------------------------------- the call forms

def _to_base(lse: Any, base: str) -> Any:
    """A natural-log lse in `base` (±inf kept)."""
    return lse if base == "e" else lse * (1.0 / math.log(2.0))


def _from_base(lse: Any, base: str) -> Any:
    return lse if base == "e" else lse * math.log(2.0)


def _tokens(out: Any) -> Any:
    """(B, H, T, d) -> (B·T, H, d): the token-major layout of FlashInfer and vLLM."""
    b, h, t, d = out.shape
    return out.permute(0, 2, 1, 3).reshape(b * t, h, d).contiguous()


def _untokens(x: Any, like: Any) -> Any:
    """(B·T, H, d) -> (B, H, T, d) shaped as `like`."""
    b, h, t, d = like.shape
    return x.reshape(b, t, h, d).permute(0, 2, 1, 3)


def _lse_tokens(lse: Any) -> Any:
    """(B, H, T) -> (B·T, H)."""
    b, h, t = lse.shape
    return lse.permute(0, 2, 1).reshape(b * t, h).contiguous()


def _untokens_lse(x: Any, like: Any) -> Any:
    b, h, t = like.shape
    return x.reshape(b, t, h).permute(0, 2, 1)


def chain(fn: Callable, parts: Sequence[Part]) -> Part:
    """fn(out_a, lse_a, out_b, lse_b) -> (out, lse) folded left over the parts, in key order: how a two-part
    merge merges many (a ring, split-KV's splits)."""
    out, lse = parts[0]
    for o, l in parts[1:]:
        out, lse = fn(out, lse, o, l)
    return out, lse


def reference_pairs(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> Part:
    """merge_partials in the pairs form: the reference merge as an audited function and as what the
    judge compares with."""
    return merge_partials((out_a, lse_a), (out_b, lse_b))


def _pairs(fn: Callable, parts: Sequence[Part], base: str) -> Part:
    """fn(out_a, lse_a, out_b, lse_b) -> (out, lse), (B, H, T, d) and (B, H, T), its lse in `base`: chained."""
    def in_base(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> Part:
        out, lse = fn(out_a, _to_base(lse_a, base), out_b, _to_base(lse_b, base))
        return out, _from_base(lse, base)
    return chain(in_base, parts)


def _flashinfer(fn: Callable, parts: Sequence[Part], base: str) -> Part:
    """FlashInfer's merge_state(v_a, s_a, v_b, s_b) -> (v, s): v (tokens, heads, d), s (tokens, heads)
    float32, base 2 as FlashInfer keeps it (flashinfer.cascade.merge_state); folded left."""
    like_out, like_lse = parts[0]
    v, s = _tokens(like_out), _to_base(_lse_tokens(like_lse), base)
    for o, l in parts[1:]:
        v, s = fn(v, s, _tokens(o), _to_base(_lse_tokens(l), base))
    return _untokens(v, like_out), _from_base(_untokens_lse(s, like_lse), base)


def _vllm(fn: Callable, parts: Sequence[Part], base: str) -> Part:
    """vLLM's merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
    output_lse): writes output (tokens, heads, d) and output_lse (heads, tokens); the lse of
    both parts (heads, tokens), natural log; folded left, each merge written into new tensors."""
    import torch
    like_out, like_lse = parts[0]
    v = _tokens(like_out)
    s = _to_base(_lse_tokens(like_lse), base).t().contiguous()              # (heads, tokens)
    for o, l in parts[1:]:
        out, out_lse = torch.empty_like(v), torch.empty_like(s)
        fn(out, v, s, _tokens(o), _to_base(_lse_tokens(l), base).t().contiguous(), out_lse)
        v, s = out, out_lse
    return _untokens(v, like_out), _from_base(_untokens_lse(s.t(), like_lse), base)


def _stateful(factory: Callable, parts: Sequence[Part], base: str) -> Part:
    """A merger object as torch's context parallelism keeps one: factory() -> merger;
    merger.step(out, lse, partial=False) per part, in order; merger.results() -> (out, lse)."""
    merger = factory()
    for o, l in parts:
        merger.step(o, _to_base(l, base), partial=False)
    out, lse = merger.results()
    return out, _from_base(lse, base)


@dataclass(frozen=True)
class MergeForm:
    """How a merge function is called: `call(fn, parts, base)` hands it the canonical parts in its own
    layout and reads its result back; `base` the lse base it takes unless declared otherwise."""

    name: str
    description: str
    call: Callable[[Callable, Sequence[Part], str], Part]
    base: str = "e"


MERGE_FORMS: dict[str, MergeForm] = {f.name: f for f in (
    MergeForm("pairs", "fn(out_a, lse_a, out_b, lse_b) -> (out, lse); out (B, H, T, d), lse (B, H, T)", _pairs),
    MergeForm("flashinfer", "FlashInfer's merge_state(v_a, s_a, v_b, s_b) -> (v, s); v (tokens, heads, d), "
                            "s (tokens, heads) float32 in base 2", _flashinfer, base="2"),
    MergeForm("vllm", "vLLM's merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, "
                      "output_lse) writing output (tokens, heads, d) and output_lse; lse (heads, tokens)", _vllm),
    MergeForm("stateful", "torch's context-parallel merger: factory() -> m; m.step(out, lse, partial=False) per "
                          "part; m.results() -> (out, lse); out (B, H, T, d), lse (B, H, T)", _stateful),
)}


@dataclass(frozen=True)
class MergeFunction:
    """A merge function under audit: its callable, call form, lse base, and for a negative control the
    mistake (workload/merge_mistakes.py) it makes."""

    name: str
    fn: Callable = field(repr=False)
    form: str = "pairs"
    lse_base: str = "e"
    description: str = ""
    control: str | None = None
    # (the import line, the expression naming the function or factory) a reproduction script calls it by in
    # its own library's API (repro/merge_scripts.py); None where it has no importable name
    api: tuple[str, str] | None = None

    def merge(self, parts: Sequence[Part]) -> Part:
        """The merge of `parts` (two or more, in key order) as this function computes it, in the
        canonical state (a chain of two-part merges for the two-part forms)."""
        return MERGE_FORMS[self.form].call(self.fn, parts, self.lse_base)


def declare_merge(fn: Callable, *, form: str = "pairs", lse_base: str | None = None, name: str | None = None,
                  description: str = "") -> MergeFunction:
    """A library's merge function by its call form (MERGE_FORMS) and the base of its lse (the form's
    unless given): `declare_merge(flashinfer.merge_state, form="flashinfer")` (docs/variants.md)."""
    if form not in MERGE_FORMS:
        raise UsageError(f"merge form {form!r}: one of {', '.join(MERGE_FORMS)}")
    base = MERGE_FORMS[form].base if lse_base is None else str(lse_base)
    if base not in LSE_BASES:
        raise UsageError(f"lse_base {lse_base!r}: one of {', '.join(LSE_BASES)}")
    label = name or getattr(fn, "__qualname__", None) or repr(fn)
    return MergeFunction(label, fn, form, base, description or MERGE_FORMS[form].description, api=importable(fn))


def importable(fn: Callable) -> tuple[str, str] | None:
    """(import line, expression) naming `fn` from its module, or None (a lambda, a local function, __main__)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or not qualname or "<" in qualname:
        return None
    return f"from {module} import {qualname.split('.')[0]}", qualname


TORCH_MERGER_API = ("from torch.distributed.tensor.experimental._context_parallel._attention import _SDPAMerger",
                    "lambda: _SDPAMerger(convert_to_f32=True, seq_dim=2)")


def torch_context_parallel_merger() -> Any:
    """torch's context-parallel merge as it ships (torch.distributed.tensor.experimental
    ._context_parallel._attention._SDPAMerger, fp32 on, the sequence on dim 2): what
    context_parallel's ring attention runs on each rank; it needs no process group."""
    from torch.distributed.tensor.experimental._context_parallel._attention import _SDPAMerger
    return _SDPAMerger(convert_to_f32=True, seq_dim=2)


def torch_merger_available() -> str | None:
    """None where this torch has the context-parallel merger, else why not."""
    import importlib
    try:
        module = importlib.import_module("torch.distributed.tensor.experimental._context_parallel._attention")
    except Exception as exc:                    # an older torch, or one built without distributed
        return f"torch's context-parallel merge cannot be imported here: {type(exc).__name__}: {exc}"
    return None if hasattr(module, "_SDPAMerger") else "this torch's context parallelism has no _SDPAMerger"
