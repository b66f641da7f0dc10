"""Scenario -> (q, k, v, mask, grad_out), seeded and deterministic.

Inputs are drawn in fp32 on the CPU from a generator seeded by the cell's input
key, then rounded to the cell's dtype and moved to its device, so every variant
and every device sees bit-identical inputs for the same input set.

Besides the tensors a variant receives, each input set carries the *logical*
visibility (which key each query may see): the float64 golden, the leak check
and the fully-masked-row check use it, whatever form the mask takes (bool,
-inf float, finfo.min float). A scenario may also carry a score modification
(ScoreMod, e.g. Gemma 2's logit soft-capping): every variant applies it or
declares it cannot (the cell is then skipped), and the golden applies it too.

K and V have the cell's kv_heads heads (GQA/MQA when fewer than the query heads).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Callable

from ..core.errors import UsageError
from ..core.grid import Case
from .draws import (torch_dtype, _randn, _normal, _scaled, _outliers, _fp16_range, _uniform, _heavy_tailed,
                    _constant_rows, _sparse, causal_keep, _strided_qkv, views, _padding, _left_padding, _low_lse,
                    _shifted_bias, _fully_masked, _sliding_window, _sinks_window, _paged_edges, _sinks, _packed, _paged)
from .variant_contract import BROKEN_PREFIX


@dataclass(frozen=True)
class ScoreMod:
    """An elementwise change of the scaled scores s = q·k·scale, applied before masking.

    kind "softcap": s -> cap · tanh(s / cap), Gemma 2's logit soft-capping. Callable on a
    score tensor of any shape (the eager (B, H, Tq, Tk) scores, FlexAttention's per-element
    score, the float64 golden's), so every implementation applies the same function.
    """

    kind: str
    cap: float

    def __call__(self, scores: Any) -> Any:
        import torch
        return torch.tanh(scores / self.cap) * self.cap

    def __str__(self) -> str:
        return f"{self.kind}({self.cap:g})"


@dataclass
class Inputs:
    """Tensors of one input set. q, k, v are leaves; `mask` may be None."""

    q: Any                    # (B, H, Tq, d): d = d_k
    k: Any                    # (B, Hkv, Tk, d): Hkv = kv_heads, H a multiple of it
    v: Any                    # (B, Hkv, Tk, dv): dv = d_v (d_k unless the cell is latent)
    grad_out: Any             # (B, H, Tq, dv): upstream gradient for the backward pass, 0 on rows that see no key
    mask: Any = None          # what the variant gets: None, bool or additive float, (B|1, 1, Tq|1, Tk)
    causal: bool = False      # top-left causal flag passed to the variant
    visible: Any = None       # logical (B|1, 1, Tq|1, Tk) bool from the mask alone (causal applied separately), or None
    mask_form: str = "none"   # none | bool | neginf | finfo_min | bias (a finite additive bias, nothing masked)
    score_mod: ScoreMod | None = None  # applied to the scaled scores before masking, or None
    sinks: Any = None         # (H,) attention-sink logits in the cell dtype (gpt-oss), or None
    grad_lse: Any = None      # (B, H, Tq) fp32 upstream gradient on a returned LSE, 0 on rows that see no key
    cu_seqlens: Any = None    # packed: (documents + 1,) int32 offsets into the B·T tokens flattened row by row
    max_seqlen: int | None = None   # packed: the longest document
    paged: Any = None         # paged: packing.PagedLayout, where each used key sits in the pool
    window: int | None = None  # a sliding window's width w (|i - j| < w; the mask is that window), or None

    def call_kwargs(self, forms: tuple[str, ...] = ()) -> dict[str, Any]:
        """Keyword arguments of a variant call: mask and causal, and score_mod and sinks only when
        the cell has them (a variant without the capability is never handed them). `forms`: the
        layouts the variant declares (variant_contract.CALL_FORMS). A packed cell hands a "varlen" variant
        cu_seqlens and max_seqlen in place of the document mask they stand for, a sliding-window cell
        a "window" variant window=w in place of the window's mask; a paged cell's layout goes to a
        "paged" variant through packing.PagedCall, not here."""
        kwargs: dict[str, Any] = dict(mask=self.mask, causal=self.causal)
        if self.cu_seqlens is not None and "varlen" in forms:
            kwargs.update(mask=None, cu_seqlens=self.cu_seqlens, max_seqlen=self.max_seqlen)
        if self.paged is not None and "paged" in forms:
            # the used lengths stand for the key padding; the cache's pages where the layout puts them
            kwargs.update(mask=None, pages_moved=False)
        if self.window is not None and "window" in forms:
            kwargs.update(mask=None, window=self.window)
        if self.score_mod is not None:
            kwargs["score_mod"] = self.score_mod
        if self.sinks is not None:
            kwargs["sinks"] = self.sinks
        return kwargs

    def needs(self) -> set[str]:
        """The features (variant_contract.FEATURES, and "mqa") this input set asks of a variant."""
        return needs(self.q.shape[1], self.k.shape[1], self.score_mod, self.sinks is not None,
                     latent=self.v.shape[-1] != self.q.shape[-1])


def needs(heads: int, kv_heads: int, score_mod: Any, sinks: bool = False, latent: bool = False) -> set[str]:
    """What a cell with these heads, score modification and sinks asks of a variant: "gqa" (k, v
    with fewer heads than q), also "mqa" when they have one, "score_mod" (a ScoreMod), "sinks",
    "latent" (values of another head dimension than queries and keys)."""
    out = set()
    if latent:
        out.add("latent")
    if kv_heads != heads:
        out.add("gqa")
        if kv_heads == 1:
            out.add("mqa")
    if score_mod is not None:
        out.add("score_mod")
    if sinks:
        out.add("sinks")
    return out


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    q_len: Callable[[int], int]          # seq_len (kv length) -> query length
    draw: Callable[..., dict]            # (case, gen, tq, tk) -> overrides for Inputs fields
    mask: tuple[str, str] | None = None  # (bool | float, per-batch | per-row | per-sequence) of the mask tensor, if any
    score_mod: ScoreMod | None = None    # a score modification every variant must apply
    sinks: bool = False                  # its draw returns per-head attention-sink logits ("sinks")
    # The verdict's and the budget's mask kind when the scenario is one of its own (packed, paged);
    # None: read off the mask (scenario_mask_kind)
    kind: str | None = None
    # FLOPs count the pairs its visibility leaves (documents, used lengths), not the full square
    work_is_visible: bool = False
    # the call form (variant_contract.CALL_FORMS) a variant takes this scenario's layout in, if any
    form: str | None = None
    # How the reference kernels handle its inputs, with where that is said: a finding about a variant's
    # output on it adds this (analysis/findings.py: "Elsewhere: ...")
    reference_kernels: str | None = None


# Paged caches: what vLLM, FlashAttention and FlashInfer do with a cache's slots past a sequence's used keys.
PAGED_REFERENCES = ("vLLM's paged attention, FlashAttention-2 and FlashInfer never let V's slots past a "
                    "sequence's used length reach the output: they are masked or zeroed before P·V "
                    "(vLLM PR #936, issue #641; FlashInfer #941, fixed by #942 and #945); FlashAttention-3 "
                    "and -4 had this bug (Dao-AILab/flash-attention #1745; #2374 open)")

SOFTCAP = ScoreMod("softcap", 50.0)   # Gemma 2's attn_logit_softcapping
SOFTCAP_Q_SCALE = 16.0                # q × 16: logits of std ~16 reach the cap's curved range


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("normal", "q, k, v ~ N(0, 1)", lambda t: t, _normal),
    *[Scenario(f"scaled_x{a}", f"q multiplied by {a}: logit-saturation sweep", lambda t: t, _scaled(a))
      for a in (1, 4, 16, 64)],
    Scenario("outliers", "N(0,1) + N(0,100)·Bernoulli(0.001) (FlashAttention-3)", lambda t: t, _outliers),
    Scenario("fp16_range", "|q|≈576, |k|≈383 aligned: q·k ≈ 2.2e5 overflows fp16 (pytorch#119131)",
             lambda t: t, _fp16_range),
    Scenario("padding", "key padding mask (B,1,1,T), valid lengths 3/4 T and shorter", lambda t: t, _padding,
             ("bool", "per-batch")),
    Scenario("left_padding", "key padding at the start of each sequence (B,1,1,T), as for generation; causal: "
             "the first rows see no key (unslothai/unsloth#9848: NaN logits on left-padded rows)",
             lambda t: t, _left_padding, ("bool", "per-batch")),
    Scenario("low_lse", "every scaled score near -(100.7 + ln T): each row's logsumexp below -88.7, where "
             "exp underflows fp32 (huggingface/trl#7181, pytorch/pytorch#196678: cuDNN NaN gradients)",
             lambda t: t, _low_lse),
    Scenario("shifted_bias", "additive float bias shifting every score of a row by about -6e4: softmax is "
             "shift-invariant, the output must not change (flashinfer-ai/flashinfer#4450: finite logits "
             "below a sentinel treated as masked)", lambda t: t, _shifted_bias, ("float", "per-row")),
    Scenario("fully_masked_bool", "every 8th query row sees no key: bool mask", lambda t: t,
             _fully_masked("bool"), ("bool", "per-row")),
    Scenario("fully_masked_neginf", "every 8th query row sees no key: float mask of -inf", lambda t: t,
             _fully_masked("neginf"), ("float", "per-row")),
    Scenario("fully_masked_finfo_min", "every 8th query row sees no key: float mask of finfo.min",
             lambda t: t, _fully_masked("finfo_min"), ("float", "per-row")),
    Scenario("decode", "one query against T keys (q_len = 1)", lambda t: 1, _normal),
    Scenario("cross_causal", "q_len = T/2 against T keys: top-left vs bottom-right causal differ",
             lambda t: max(1, t // 2), _normal),
    Scenario("sliding_window", "local attention: |i - j| < T/4 (causal: i - T/4 < j <= i), a bool mask; a variant "
             "taking the window as an argument gets window=T/4 instead", lambda t: t, _sliding_window,
             ("bool", "per-row"), form="window"),
    Scenario("softcap", f"Gemma 2's logit soft-capping s -> {SOFTCAP.cap:g}·tanh(s/{SOFTCAP.cap:g}) "
             f"on q × {SOFTCAP_Q_SCALE:g} (a score modification)", lambda t: t, _scaled(SOFTCAP_Q_SCALE),
             score_mod=SOFTCAP),
    Scenario("sinks", "q, k, v ~ N(0, 1) with gpt-oss's attention sinks: one logit per head, above every score "
             "(heads 0, 4, ...), about half or a sixth of the weight, or none; every 8th query row sees no key "
             "(its weight all on the sink: out 0) (vllm-project/vllm#52148: sinks dropped silently)",
             lambda t: t, _sinks(masked_rows=True), ("bool", "per-row"), sinks=True),
    Scenario("sinks_prefill", "the sinks scenario's q, k, v and sinks with no mask (causal or not): gpt-oss's prefill, "
             "as a kernel taking sinks and causal but no mask runs it", lambda t: t, _sinks(masked_rows=False),
             sinks=True),
    Scenario("sinks_window", "the sinks scenario's q, k, v and sinks in a sliding window (|i - j| < T/4; causal: "
             "i - T/4 < j <= i) and no other mask: gpt-oss's sliding layers; a kernel taking sinks, causal and a "
             "window but no mask gets window=T/4", lambda t: t, _sinks_window, ("bool", "per-row"), sinks=True,
             form="window"),
    Scenario("sinks_decode", "one query (q_len = 1) against T keys with the sinks scenario's sinks: gpt-oss decoding",
             lambda t: 1, _sinks(masked_rows=False), sinks=True),
    Scenario("packed", "packed documents (varlen): each batch row holds documents back to back, one of length 0 "
             "and one of length 1, the last row ending in padding rows no document owns (past cu_seqlens[-1]); "
             "a query sees its own document's keys (causal: within it); varlen kernels get cu_seqlens "
             "(pytorch/pytorch#186786: NaN gradients past cu_seqlens[-1]; flash-attention#2421: length 0)",
             lambda t: t, _packed, ("bool", "per-sequence"), kind="packed", work_is_visible=True, form="varlen"),
    Scenario("paged", "decode against a paged KV cache: one query per sequence, the used keys (3/4 T, shorter "
             "after) in shuffled pages of 16 slots, every slot a kernel must not read NaN (last pages' tails, "
             "an extra page listed after the used ones, an unlisted page); dense variants get the used "
             "lengths as key padding (pegainfer#291: an extra page read every 16th step)",
             lambda t: 1, _paged, ("bool", "per-batch"), kind="paged", work_is_visible=True, form="paged",
             reference_kernels=PAGED_REFERENCES),
    Scenario("paged_edges", "the paged scenario with each sequence's used keys one past, one before and on a "
             "page boundary (a last page of one key, one short of full, full)",
             lambda t: 1, _paged_edges, ("bool", "per-batch"), kind="paged", work_is_visible=True, form="paged",
             reference_kernels=PAGED_REFERENCES),
    Scenario("strided_qkv", "q, k, v ~ N(0, 1) as views into one fused QKV projection (B, T, H + 2·Hkv, d), each "
             "a slice of its heads transposed to (B, H, T, d): not contiguous, other heads' values between a head's "
             "rows, as a model's fused projection hands them over; a kernel reading its inputs as contiguous "
             "memory reads those instead", lambda t: t, _strided_qkv),
    Scenario("uniform", "q, k, v ~ U(-sqrt(3), sqrt(3)): unit variance, bounded; catches a shortcut that holds only "
             "for N(0, 1) inputs (KernelBench#82 tests with uniform inputs)", lambda t: t, _uniform),
    Scenario("heavy_tailed", "q, k, v ~ Student-t(3) scaled to unit variance: a few entries beyond 6 standard "
             "deviations; catches a shortcut that holds only for N(0, 1) inputs (KernelBench#82: Pareto inputs)",
             lambda t: t, _heavy_tailed),
    Scenario("constant_rows", "N(0, 1) with rows of constant scores: every 4th query row (from row 1) all zero, "
             "and every key of the odd kv heads one vector: uniform attention on those rows; catches a "
             "shortcut that holds only for N(0, 1) inputs and breaks on ties (a row of scores without spread)",
             lambda t: t, _constant_rows),
    Scenario("sparse", "90% of q, k, v exactly 0 (the rest N(0, 10): unit variance) and every 8th key (from 3) "
             "an all-zero vector, a real key of score 0; catches a shortcut that holds only for dense N(0, 1) "
             "inputs (zeros skipped, all-zero keys taken for padding)", lambda t: t, _sparse),
]}


# What a cell masks, as the verdict recommends per kind and the budget covers every variant in:
# no mask, causal, key padding. Read off each scenario's own fields (scenario_mask_kind), so a
# new scenario is placed by what it declares.
MASK_KINDS: tuple[str, ...] = ("none", "causal", "padding", "packed", "paged")
MASK_KIND_LABELS = {"none": "no mask", "causal": "causal", "padding": "key padding", "packed": "packed",
                    "paged": "paged"}
PLAIN_MASK_KINDS: tuple[str, ...] = ("none", "causal")   # a plain scenario's, by the causal flag


def scenario_mask_kind(name: str) -> str | None:
    """"plain" (no mask tensor, no score modification: the causal flag makes it none or causal),
    "padding" (a key padding mask, (B, 1, 1, T): the catalogue's per-batch masks), or None (any
    other mask, a score modification, an unknown scenario: no kind)."""
    scenario = SCENARIOS.get(name)
    if scenario is None or scenario.score_mod is not None or scenario.sinks:
        return None
    if scenario.kind is not None:
        return scenario.kind
    if scenario.mask is None:
        return "plain"
    return "padding" if tuple(scenario.mask)[1:] == ("per-batch",) else None


def mask_kind(scenario: str, causal: bool) -> str | None:
    """A cell's mask kind (MASK_KINDS), or None when it has another mask or a score modification."""
    kind = scenario_mask_kind(scenario)
    if kind == "plain":
        return "causal" if causal else "none"
    return kind


# Where batch and chunk invariance are checked (measure/checks/invariance.py): cells with a second batch row and
# at most INVARIANCE_MAX_SEQ_LEN keys (the stability grids' cells: a compiled variant builds its code
# again for a row alone and for each chunk, which the long speed cells would pay for), on normal inputs
# (the question is the kernel's order of work, not its inputs) and, for the batch, in the layouts' own
# scenarios; chunked prefill on normal self-attention cells.
BATCH_INVARIANCE_SCENARIOS: tuple[str, ...] = ("normal", "packed", "paged")
CHUNK_INVARIANCE_SCENARIOS: tuple[str, ...] = ("normal",)
INVARIANCE_MAX_SEQ_LEN = 1024


def invariance_applies(case: Case) -> tuple[bool, bool]:
    """(batch invariance applies, chunk invariance applies) in this cell: known without its tensors, so
    the cost model plans the calls (and a compiled variant's compiles) the checks make."""
    second_row = case.batch >= 2 and case.seq_len <= INVARIANCE_MAX_SEQ_LEN
    return (second_row and case.scenario in BATCH_INVARIANCE_SCENARIOS,
            second_row and case.scenario in CHUNK_INVARIANCE_SCENARIOS and q_len(case) == case.seq_len >= 2)


def check_scenario(name: str) -> None:
    """Validator for grid.validate_axes: raises UsageError for an unknown scenario name."""
    if name not in SCENARIOS:
        raise UsageError(f"--scenario: unknown scenario {name!r}; allowed: {', '.join(SCENARIOS)}")


def seed_for(case: Case) -> int:
    """Deterministic 31-bit seed from the input key (same for every variant)."""
    return zlib.crc32(repr(case.input_key).encode()) & 0x7FFFFFFF


def q_len(case: Case) -> int:
    return SCENARIOS[case.scenario].q_len(case.seq_len)


def mask_shape(case: Case) -> tuple[str, tuple[int, ...]] | None:
    """(bool | float, shape) of the mask tensor a variant gets in this cell, or None: what
    compiled code is specialized on, known without building the tensors."""
    mask = SCENARIOS[case.scenario].mask
    if mask is None:
        return None
    kind, layout = mask
    tq = q_len(case)
    shape = {"per-batch": (case.batch, 1, 1, case.seq_len), "per-row": (1, 1, tq, case.seq_len),
             "per-sequence": (case.batch, 1, tq, case.seq_len)}[layout]
    return kind, shape


def cell_needs(case: Case) -> set[str]:
    """What a cell asks of a variant (needs()), known without building its tensors."""
    scenario = SCENARIOS[case.scenario]
    return needs(case.heads, case.effective_kv_heads, scenario.score_mod, scenario.sinks, latent=case.latent)


def make_inputs(case: Case) -> Inputs:
    if case.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {case.scenario!r}")
    scenario = SCENARIOS[case.scenario]
    return draw_inputs(case, scenario.draw, scenario.q_len(case.seq_len), scenario.score_mod)


def draw_inputs(case: Case, draw: Callable[..., dict], tq: int, score_mod: ScoreMod | None = None) -> Inputs:
    """The input set of `case` from its scenario's draw function, query length and score
    modification.

    Uses no registry: audit.repro.scripts copies it, with the draw function, into standalone
    reproduction scripts (keep what it calls at module level, imports included).
    """
    import torch

    gen = torch.Generator().manual_seed(seed_for(case))
    tk = case.seq_len
    drawn = draw(case, gen, tq, tk)
    dtype = torch_dtype(case.dtype)

    def to_cell(t):
        return t.to(device=case.device, dtype=dtype)

    mask = drawn.get("mask")
    if mask is not None:
        mask = mask.to(case.device) if mask.dtype == torch.bool else to_cell(mask)
    visible = drawn.get("visible")
    visible = None if visible is None else visible.to(case.device)
    grad_out = to_cell(_randn(gen, (case.batch, case.heads, tq, case.effective_d_v)))   # (B, H, Tq, dv)
    if visible is not None:
        # the loss ignores a row that sees no key (a padded query's label is masked too): its
        # upstream gradient is 0, so what the row's output is (a convention: 0, NaN, uniform)
        # reaches no gradient unless it is NaN or inf
        seeing = visible & causal_keep(tq, tk, visible.device) if case.causal else visible   # (B|1, 1, Tq|1, Tk)
        seeing = seeing.expand(*seeing.shape[:2], tq, tk).any(-1)                      # (B|1, 1, Tq)
        grad_out = grad_out.masked_fill(~seeing[..., None], 0.0)
    # drawn after everything else, so the other tensors of every input set are what they always were
    grad_lse = _randn(gen, (case.batch, case.heads, tq)).to(case.device)                # (B, H, Tq) fp32
    if visible is not None:
        grad_lse = grad_lse.masked_fill(~seeing, 0.0)
    sinks = drawn.get("sinks")
    cu_seqlens = drawn.get("cu_seqlens")
    q, k, v = views(drawn.get("views"), to_cell(drawn["q"]), to_cell(drawn["k"]), to_cell(drawn["v"]))
    return Inputs(cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(case.device),
                  max_seqlen=drawn.get("max_seqlen"), paged=drawn.get("paged"), q=q, k=k, v=v,
                  grad_out=grad_out, grad_lse=grad_lse, sinks=None if sinks is None else to_cell(sinks),
                  mask=mask, causal=case.causal,
                  visible=visible,
                  mask_form=drawn.get("mask_form", "none"), score_mod=score_mod, window=drawn.get("window"))


def coverage_kind(variant: str, device: str, dtype: str, scenario: str, causal: bool) -> str | None:
    """"variant device dtype mask-kind" of a real variant's cell, e.g. "flex cpu bf16 causal": what
    the time budget gives every variant one cell of (plan.budget) and the report checks it got.
    None for a negative control (BROKEN_PREFIX), and for a cell of another mask or a score
    modification."""
    if variant.startswith(BROKEN_PREFIX):
        return None
    kind = mask_kind(scenario, causal)
    return None if kind is None else f"{variant} {device} {dtype} {MASK_KIND_LABELS[kind]}"
