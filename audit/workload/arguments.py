"""The arguments a variant is called with, each one checked to do something (measure/checks/arguments.py).

The attention bugs a per-cell comparison misses share one shape: an argument accepted and silently
ignored, or applied one step off (a softcap taken and dropped, sinks lost on one code path, a scale
fixed at 1/sqrt(d)). A cell where the argument has its usual value cannot tell. So for each argument
here, a probe: the cell's call made again with that one argument changed, and what correct attention
does under the change (the float64 Attempt of workload.mistakes, with that override). The check
compares how the variant's output moves with how the golden moves.

An Argument says where it is probed (its scenarios, at seq_len <= ARGUMENT_MAX_SEQ_LEN, and only
where the cell's call hands the variant the argument at all), how the call's keyword arguments
change, and the golden under the change. Known from the Case alone (probed_arguments), so the cost
model plans the probes' calls. Adding an argument is adding an entry to ARGUMENTS (docs/extending.md).

Imports no torch at module level; the functions do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..core.grid import Case
from .draws import window_keep
from .inputs import ScoreMod
from .packing import documents_mask
from .varlen import document_owner

# Probed on cells up to this length, per device type: the probes' calls and float64 goldens (on
# the diagnosis slices) stay small beside the cell's own, and a longer cell's argument is the same
# argument. On CUDA the gpu preset's scenario cells (T 1024) are probed.
ARGUMENT_MAX_SEQ_LEN = {"cpu": 256, "cuda": 4096}
SCALE_PROBE = 1.5          # the scale probed: 1.5 × the cell's (1/sqrt(d) by default)
SOFTCAP_PROBE = 0.5        # the cap probed: half the cell's (the softcap scenario's scores pass it)
SINK_PROBE = -2.0          # the sinks probed: each head's sink logit lowered by 2
DOCUMENT_PROBE = 2         # cu_seqlens probed: each interior boundary 2 tokens later
WINDOW_PROBE = 2           # the window probed: its width halved (at least 1 key)


# What a probe finds (measure/checks/arguments.py explains each); the first three are defects.
STATUSES: tuple[str, ...] = ("ignored", "misapplied", "accepted", "honoured", "unjudged", "uninformative", "refused",
                             "failed")
NOT_HONOURED: tuple[str, ...] = ("ignored", "misapplied", "accepted")


@dataclass(frozen=True)
class Argument:
    """One argument of the variant contract (variant_contract.py), and its probe."""

    name: str                              # the contract's keyword: "scale", "causal", "mask", ...
    title: str                             # what it is, a few words
    change: str                            # what the probe does to it, a few words
    scenarios: tuple[str, ...]             # where it is probed
    present: Callable[[dict], bool]        # whether a call with these keyword arguments hands it over
    changed: Callable[[dict, Any], dict]   # (the cell's call kwargs, its Inputs) -> the probe's kwargs
    golden: Callable[[Any, dict, Any], Any]   # (Attempt, the probe's kwargs, Inputs) -> (b, h, Tq, d) float64
    consequence: str                       # what ignoring it costs a user (the finding's last sentence)
    # probed on compiled built-ins too: not the causal flag, whose flip is a whole second compile (1-5 s
    # a shape) of code torch.compile builds from the audited Python, and whose two settings the grid
    # measures anyway (each cell's causal=True and causal=False twin, both against their goldens)
    compiled: bool = True
    # the call form (variant_contract.CALL_FORMS) a variant is handed it in, if only there: its control declares it
    form: str | None = None
    # a probe of what a kernel must refuse: (k, v, H) -> the (k', v') it is called on instead; honoured
    # when the call raises, `accepted` (a defect) when it returns (golden: unused)
    refuse: Callable[[Any, Any, int], tuple] | None = None
    # the cells it is probed in beyond its scenarios (a Case -> bool), if not all
    applies: Callable[[Case], bool] | None = None
    # a change the output must not follow (the golden does not move): honoured when the output stays within
    # twice the budget, ignored when it moves
    invariant: bool = False


def _scale_present(kwargs: dict) -> bool:
    return True                                          # None stands for 1/sqrt(d): always handed over


def _scaled(kwargs: dict, inputs: Any) -> dict:
    scale = kwargs.get("scale")
    base = inputs.q.shape[-1] ** -0.5 if scale is None else scale
    return {**kwargs, "scale": base * SCALE_PROBE}


def _scale_golden(a: Any, kwargs: dict, inputs: Any) -> Any:
    return a.attend(scale=kwargs["scale"])


def _causal_present(kwargs: dict) -> bool:
    return "causal" in kwargs


def _flipped(kwargs: dict, inputs: Any) -> dict:
    return {**kwargs, "causal": not kwargs["causal"]}


def _causal_golden(a: Any, kwargs: dict, inputs: Any) -> Any:
    return a.attend(keep=a.keep(causal=kwargs["causal"]))


def _mask_present(kwargs: dict) -> bool:
    return kwargs.get("mask") is not None


def _unmasked(kwargs: dict, inputs: Any) -> dict:
    return {**kwargs, "mask": None}


def _mask_golden(a: Any, kwargs: dict, inputs: Any) -> Any:
    return a.attend(keep=a.keep(visible=None))


def _softcap_present(kwargs: dict) -> bool:
    return getattr(kwargs.get("score_mod"), "kind", None) == "softcap"


def _softcap(kwargs: dict, inputs: Any) -> dict:
    mod = kwargs["score_mod"]
    return {**kwargs, "score_mod": ScoreMod(mod.kind, mod.cap * SOFTCAP_PROBE)}


def _softcap_golden(a: Any, kwargs: dict, inputs: Any) -> Any:
    return a.attend(score_mod=kwargs["score_mod"])


def _sinks_present(kwargs: dict) -> bool:
    return kwargs.get("sinks") is not None


def _sinks(kwargs: dict, inputs: Any) -> dict:
    return {**kwargs, "sinks": (kwargs["sinks"].detach() + SINK_PROBE)}


def _sinks_golden(a: Any, kwargs: dict, inputs: Any) -> Any:
    return a.attend(sinks=kwargs["sinks"].double())


def _documents_present(kwargs: dict) -> bool:
    return kwargs.get("cu_seqlens") is not None


def shifted_documents(cu_seqlens: Any, length: int) -> Any:
    """cu_seqlens with every interior boundary inside a batch row (of `length` tokens) DOCUMENT_PROBE
    tokens later, kept within its row and before cu_seqlens[-1]; a boundary at a row's start stays.
    The documents the cu_seqlens probe hands a varlen variant: still non-decreasing, none crossing a
    row (the golden's document mask is per row)."""
    import torch
    cu = cu_seqlens.clone().long()
    inner = cu[1:-1]
    row_end = (inner // length + 1) * length
    moved = torch.minimum(torch.minimum(inner + DOCUMENT_PROBE, row_end), cu[-1].expand_as(inner))
    cu[1:-1] = torch.where(inner % length == 0, inner, moved)
    return cu.to(cu_seqlens.dtype)


def _documents(kwargs: dict, inputs: Any) -> dict:
    cu = shifted_documents(kwargs["cu_seqlens"], inputs.q.shape[-2])
    return {**kwargs, "cu_seqlens": cu, "max_seqlen": int((cu[1:] - cu[:-1]).max())}


def _documents_golden(a: Any, kwargs: dict, inputs: Any) -> Any:
    import torch
    keep = documents_mask(document_owner(kwargs["cu_seqlens"], a.n_batch, a.tk))             # (B, 1, T, T)
    return a.attend(keep=a.keep(visible=keep[torch.tensor(a.batches, device=keep.device)]))


def _window_present(kwargs: dict) -> bool:
    return kwargs.get("window") is not None


def _narrowed(kwargs: dict, inputs: Any) -> dict:
    return {**kwargs, "window": max(1, kwargs["window"] // WINDOW_PROBE)}


def _window_golden(a: Any, kwargs: dict, inputs: Any) -> Any:
    return a.attend(keep=a.keep(visible=window_keep(a.tq, a.tk, kwargs["window"], a.q.device)))


KV_HEADS_MAX_SEQ_LEN = 1024   # a refusal does not depend on the length: probed where its call is cheap


def _three_heads(case: Case) -> bool:
    """Cells of 3 or more query heads, up to KV_HEADS_MAX_SEQ_LEN keys: H - 1 key/value heads do not
    divide them. (More kv heads than query heads is not probed: torch 2.13's CPU flash op dies of
    SIGFPE there, taking the run's process with it.)"""
    return case.heads >= 3 and case.seq_len <= KV_HEADS_MAX_SEQ_LEN


def _undividing(k: Any, v: Any, heads: int) -> tuple:
    """k, v (B, Hkv, Tk, d) -> (B, H - 1, Tk, d): the heads each query head reads (repeated to H),
    the last one dropped: a count that does not divide H (H >= 3)."""
    return tuple(t.repeat_interleave(heads // t.shape[1], dim=1)[:, :heads - 1] for t in (k, v))


def _unchanged(kwargs: dict, inputs: Any) -> dict:
    return dict(kwargs)


def _no_golden(a: Any, kwargs: dict, inputs: Any) -> Any:
    raise AssertionError("a probe of what a kernel must refuse has no golden")


def _paged_present(kwargs: dict) -> bool:
    return "pages_moved" in kwargs


def _pages_moved(kwargs: dict, inputs: Any) -> dict:
    return {**kwargs, "pages_moved": True}


def _same_golden(a: Any, kwargs: dict, inputs: Any) -> Any:
    return a.attend()


ARGUMENTS: dict[str, Argument] = {a.name: a for a in (
    Argument("scale", "the softmax scale", f"× {SCALE_PROBE:g}", ("normal",), _scale_present, _scaled, _scale_golden,
             "A model with its own softmax scale (a query pre-scaled, muP, a temperature) gets 1/sqrt(d) instead."),
    # on `normal` cells only, where q_len == kv_len: no causal alignment in play
    Argument("causal", "the causal flag", "flipped", ("normal",), _causal_present, _flipped, _causal_golden,
             "A decoder gets attention to future tokens, or an encoder loses them.", compiled=False),
    Argument("mask", "the attention mask", "left out", ("padding", "sliding_window", "packed"), _mask_present,
             _unmasked, _mask_golden,
             "Padding, windows and fully masked rows are attended as if they were not masked."),
    Argument("softcap", "the soft-capping cap", f"× {SOFTCAP_PROBE:g}", ("softcap",), _softcap_present, _softcap,
             _softcap_golden, "A model's logit soft-capping (Gemma 2's) is not the one it was trained with."),
    Argument("sinks", "the attention sinks", f"each {SINK_PROBE:+g}",
             ("sinks", "sinks_prefill", "sinks_window", "sinks_decode"), _sinks_present, _sinks, _sinks_golden,
             "A model with attention sinks (gpt-oss) gets attention without them."),
    Argument("cu_seqlens", "the documents' offsets", f"boundaries {DOCUMENT_PROBE:+d} tokens", ("packed",),
             _documents_present, _documents, _documents_golden, "Packed documents are not cut where their offsets say.",
             form="varlen"),
    Argument("window", "the sliding window", f"width ÷ {WINDOW_PROBE}", ("sliding_window", "sinks_window"),
             _window_present, _narrowed, _window_golden,
             "A model's local layers (Mistral's, Gemma's, gpt-oss's) attend beyond their window.", form="window"),
    # the pages moved in the pool, the table saying where: what each sequence reads is the same
    Argument("block_table", "the block table", "every page moved in the pool", ("paged", "paged_edges"),
             _paged_present, _pages_moved, _same_golden,
             "A server's cache, whose pages sit wherever its allocator put them, is read from the wrong pages.",
             form="paged", invariant=True),
    # any call hands k and v; on `normal` cells, not on compiled built-ins (a new head count is a recompile)
    Argument("kv_heads", "key/value heads not dividing the query heads", "H - 1 kv heads", ("normal",),
             _scale_present, _unchanged, _no_golden,
             "A model whose head counts the kernel cannot pair gets an output, not an error: query heads paired "
             "with key/value heads by a rule nobody chose.", compiled=False, refuse=_undividing,
             applies=_three_heads),
)}


# What the report calls each checked argument: (title, the probe's change); "lse" is checked on the
# scale probe of a variant returning its log-sum-exp (measure/checks/arguments.py).
ARGUMENT_TITLES: dict[str, tuple[str, str]] = {
    **{a.name: (a.title, a.change) for a in ARGUMENTS.values()},
    "lse": ("the returned log-sum-exp", f"the scale × {SCALE_PROBE:g}"),
}
ARGUMENT_CONSEQUENCES: dict[str, str] = {
    **{a.name: a.consequence for a in ARGUMENTS.values()},
    "lse": "A merge of partial results (split-KV, ring attention, chunked prefill) by this lse goes wrong.",
}


def probed_arguments(case: Case, compiled: bool) -> tuple[str, ...]:
    """The arguments probed in this cell of a (compiled: built per shape) variant, as far as the
    Case tells (the call's keyword arguments decide the rest: a variant handed no mask has none to
    probe)."""
    if case.seq_len > ARGUMENT_MAX_SEQ_LEN["cuda" if case.device.startswith("cuda") else "cpu"]:
        return ()
    return tuple(a.name for a in ARGUMENTS.values()
                 if case.scenario in a.scenarios and (a.compiled or not compiled)
                 and (a.applies is None or a.applies(case)))

