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

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def torch_dtype(name: str):
    import torch
    return getattr(torch, TORCH_DTYPES[name])


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

    q: Any                    # (B, H, Tq, d)
    k: Any                    # (B, Hkv, Tk, d): Hkv = kv_heads, H a multiple of it
    v: Any                    # (B, Hkv, Tk, d)
    grad_out: Any             # (B, H, Tq, d): upstream gradient for the backward pass, 0 on rows that see no key
    mask: Any = None          # what the variant gets: None, bool or additive float, (B|1, 1, Tq|1, Tk)
    causal: bool = False      # top-left causal flag passed to the variant
    visible: Any = None       # logical (B|1, 1, Tq|1, Tk) bool from the mask alone (causal applied separately), or None
    mask_form: str = "none"   # none | bool | neginf | finfo_min | bias (a finite additive bias, nothing masked)
    score_mod: ScoreMod | None = None  # applied to the scaled scores before masking, or None
    sinks: Any = None         # (H,) attention-sink logits in the cell dtype (gpt-oss), or None
    grad_lse: Any = None      # (B, H, Tq) fp32 upstream gradient on a returned LSE, 0 on rows that see no key

    def call_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of a variant call: mask and causal, and score_mod and sinks only when
        the cell has them (a variant without the capability is never handed them)."""
        kwargs: dict[str, Any] = dict(mask=self.mask, causal=self.causal)
        if self.score_mod is not None:
            kwargs["score_mod"] = self.score_mod
        if self.sinks is not None:
            kwargs["sinks"] = self.sinks
        return kwargs

    def needs(self) -> set[str]:
        """The features (variants.FEATURES, and "mqa") this input set asks of a variant."""
        return needs(self.q.shape[1], self.k.shape[1], self.score_mod, self.sinks is not None)


def needs(heads: int, kv_heads: int, score_mod: Any, sinks: bool = False) -> set[str]:
    """What a cell with these heads, score modification and sinks asks of a variant: "gqa" (k, v
    with fewer heads than q), also "mqa" when they have one, "score_mod" (a ScoreMod), "sinks"."""
    out = set()
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
    mask: tuple[str, str] | None = None  # (bool | float, per-batch | per-row) of the mask tensor, if any
    score_mod: ScoreMod | None = None    # a score modification every variant must apply
    sinks: bool = False                  # its draw returns per-head attention-sink logits ("sinks")


def _randn(gen, shape):
    import torch
    return torch.randn(shape, generator=gen, dtype=torch.float32)


def _normal(case: Case, gen, tq: int, tk: int, alpha: float = 1.0) -> dict:
    B, H, Hkv, d = case.batch, case.heads, case.effective_kv_heads, case.d_k
    return dict(q=_randn(gen, (B, H, tq, d)) * alpha, k=_randn(gen, (B, Hkv, tk, d)),
                v=_randn(gen, (B, Hkv, tk, d)))


def _scaled(alpha: float):
    def draw(case, gen, tq, tk):
        return _normal(case, gen, tq, tk, alpha)
    return draw


def _outliers(case, gen, tq, tk) -> dict:
    """FlashAttention-3's distribution: N(0,1) + N(0,100)·Bernoulli(0.001)."""
    import torch
    out = _normal(case, gen, tq, tk)
    for name in ("q", "k", "v"):
        t = out[name]
        spikes = torch.rand(t.shape, generator=gen) < 1e-3
        out[name] = t + _randn(gen, t.shape) * 10.0 * spikes
    return out


def _fp16_range(case, gen, tq, tk) -> dict:
    """|q| ≈ 576, |k| ≈ 383 along a shared direction: q·k ≈ 2.2e5 > 65504 (pytorch#119131)."""
    B, H, Hkv, d = case.batch, case.heads, case.effective_kv_heads, case.d_k
    u = _randn(gen, (d,))
    u = u / u.norm()

    def along(heads, n, norm):
        x = u + 0.1 * _randn(gen, (B, heads, n, d)) / d ** 0.5    # (B, heads, n, d)
        return x / x.norm(dim=-1, keepdim=True) * norm
    return dict(q=along(H, tq, 576.0), k=along(Hkv, tk, 383.0), v=_randn(gen, (B, Hkv, tk, d)))


# Value shortcuts: inputs on which code that holds only for N(0, 1) inputs (an "analytical"
# shortcut a kernel search loop found: KernelBench#82 tests with uniform and Pareto inputs) is wrong.
UNIFORM_BOUND = 3.0 ** 0.5           # U(-sqrt(3), sqrt(3)) has unit variance
STUDENT_T_DOF = 3                    # heavy_tailed: Student-t with 3 degrees of freedom (finite variance 3)
SPARSE_DENSITY = 0.1                 # sparse: the fraction of the entries of q, k and v that are not 0


def _uniform(case, gen, tq, tk) -> dict:
    """q, k, v ~ U(-sqrt(3), sqrt(3)): unit variance as N(0, 1), but bounded (|x| <= sqrt(3))."""
    import torch
    B, H, Hkv, d = case.batch, case.heads, case.effective_kv_heads, case.d_k

    def uniform(shape):
        return (torch.rand(shape, generator=gen, dtype=torch.float32) * 2.0 - 1.0) * UNIFORM_BOUND
    return dict(q=uniform((B, H, tq, d)), k=uniform((B, Hkv, tk, d)), v=uniform((B, Hkv, tk, d)))


def _student_t(gen, shape):
    """Student-t with STUDENT_T_DOF degrees of freedom, scaled to unit variance: z / sqrt(chi2 / nu)
    · sqrt((nu - 2) / nu), chi2 the sum of nu squared N(0, 1) (all drawn from `gen`)."""
    nu = STUDENT_T_DOF
    z = _randn(gen, shape)
    chi2 = (_randn(gen, (nu, *shape)) ** 2).sum(0)
    return z / (chi2 / nu).sqrt() * ((nu - 2) / nu) ** 0.5


def _heavy_tailed(case, gen, tq, tk) -> dict:
    """q, k, v ~ Student-t(3) scaled to unit variance: most entries smaller than N(0, 1)'s, a few
    (about 1 in 500) beyond 6 standard deviations."""
    B, H, Hkv, d = case.batch, case.heads, case.effective_kv_heads, case.d_k
    return dict(q=_student_t(gen, (B, H, tq, d)), k=_student_t(gen, (B, Hkv, tk, d)),
                v=_student_t(gen, (B, Hkv, tk, d)))


def zero_query_rows(tq: int) -> list[int]:
    """constant_rows' query rows that are all-zero vectors: every 4th row, starting at 1 (at least one)."""
    return list(range(min(1, tq - 1), tq, 4))


def constant_key_heads(kv_heads: int) -> list[int]:
    """constant_rows' key/value heads whose keys are all one vector: the odd ones (none with one kv head)."""
    return list(range(1, kv_heads, 2))


def _constant_rows(case, gen, tq, tk) -> dict:
    """q, k, v ~ N(0, 1), then rows of constant scores: the query rows zero_query_rows(Tq) are all
    zero (every score 0), and in the kv heads constant_key_heads(Hkv) every key is that head's first
    key (every score of a row equal, in each query head reading it). Both rows attend uniformly."""
    out = _normal(case, gen, tq, tk)
    q, k = out["q"], out["k"]                                      # (B, H, Tq, d), (B, Hkv, Tk, d)
    q[:, :, zero_query_rows(tq)] = 0.0
    for h in constant_key_heads(k.shape[1]):
        k[:, h] = k[:, h, :1].clone()                              # (B, 1, d) -> every key of head h
    return out


def zero_key_positions(tk: int) -> list[int]:
    """sparse's key positions whose key vector is all zeros: every 8th, starting at 3 (at least one)."""
    return list(range(min(3, tk - 1), tk, 8))


def _sparse(case, gen, tq, tk) -> dict:
    """Mostly exact zeros: each entry of q, k, v is N(0, 1) · sqrt(1 / SPARSE_DENSITY) with
    probability SPARSE_DENSITY (0.1) and exactly 0.0 otherwise (unit variance, as N(0, 1)); and the
    keys at zero_key_positions(Tk) are all-zero vectors in every head: real keys, with score 0."""
    import torch
    out = _normal(case, gen, tq, tk)
    for name in ("q", "k", "v"):
        t = out[name]
        kept = torch.rand(t.shape, generator=gen) < SPARSE_DENSITY
        out[name] = torch.where(kept, t * SPARSE_DENSITY ** -0.5, torch.zeros_like(t))
    out["k"][..., zero_key_positions(tk), :] = 0.0               # (B, Hkv, Tk, d)
    return out


def causal_offset(tq: int, tk: int, alignment: str) -> int:
    """Query i may see keys j <= i + offset: 0 top-left, Tk - Tq bottom-right."""
    if alignment == "top-left":
        return 0
    if alignment == "bottom-right":
        return tk - tq
    raise ValueError(f"unknown causal alignment {alignment!r}")


def causal_keep(tq: int, tk: int, device: Any, offset: int = 0) -> Any:
    """(Tq, Tk) bool, True where query i may see key j: j <= i + offset (0: top-left, the
    contract's; Tk - Tq: bottom-right, KV-cache decoding)."""
    import torch
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(offset)


def _valid_lengths(batch: int, tk: int) -> list[int]:
    """Key lengths per sequence: 3/4 of T for the first, shorter after, at least 1."""
    return [max(1, (tk * 3) // 4 - b * tk // (2 * max(batch, 2))) for b in range(batch)]


def _padding(case, gen, tq, tk) -> dict:
    """Key padding mask of shape (B, 1, 1, Tk): the broadcast the seed gets wrong."""
    import torch
    out = _normal(case, gen, tq, tk)
    lengths = torch.tensor(_valid_lengths(case.batch, tk))
    keep = torch.arange(tk)[None, :] < lengths[:, None]           # (B, Tk)
    keep = keep[:, None, None, :]                                 # (B, 1, 1, Tk)
    out.update(mask=keep, visible=keep, mask_form="bool")
    return out


def _left_padding(case, gen, tq, tk) -> dict:
    """Key padding at the start of each sequence (B, 1, 1, Tk), as transformers pads for generation:
    sequence b's first Tk - length_b keys are padding. With causal masking the first rows see no key."""
    import torch
    out = _normal(case, gen, tq, tk)
    lengths = torch.tensor(_valid_lengths(case.batch, tk))
    keep = torch.arange(tk)[None, :] >= (tk - lengths)[:, None]      # (B, Tk)
    keep = keep[:, None, None, :]                                 # (B, 1, 1, Tk)
    out.update(mask=keep, visible=keep, mask_form="bool")
    return out


LOW_LSE_MARGIN = 12.0   # how far below ln(FLT_MIN) = -87.3 the typical score sits, before ln(Tk)


def low_lse_centre(tk: int) -> float:
    """The scaled score every pair of the low_lse scenario sits near: far enough below -88.7
    that logsumexp(row) = centre + ln(sum over Tk keys of exp(noise)) stays below it."""
    import math
    return -(88.7 + LOW_LSE_MARGIN + math.log(tk))


def _low_lse(case, gen, tq, tk) -> dict:
    """Every scaled score near low_lse_centre(Tk), spread N(0, 1): q along -u, k along +u (u a unit
    vector), plus noise orthogonal to u. So every row's logsumexp is below -88.7, where exp of it
    underflows float32 (huggingface/trl#7181, pytorch/pytorch#196678: NaN gradients)."""
    B, H, Hkv, d = case.batch, case.heads, case.effective_kv_heads, case.d_k
    u = _randn(gen, (d,))
    u = u / u.norm()
    along = (-low_lse_centre(tk) * d ** 0.5) ** 0.5                # |q_u| = |k_u|: their product / sqrt(d) = -centre

    def orthogonal(shape):
        x = _randn(gen, shape)
        return x - (x @ u)[..., None] * u                             # remove the u component
    return dict(q=orthogonal((B, H, tq, d)) - along * u, k=orthogonal((B, Hkv, tk, d)) + along * u,
                v=_randn(gen, (B, Hkv, tk, d)))


SHIFT_BIAS = -59904.0   # about -6e4, exact in fp16 and bf16 (a multiple of 256)
SHIFT_STEP = 256.0      # rows differ by multiples of it: every row has its own shift


def _shifted_bias(case, gen, tq, tk) -> dict:
    """An additive float bias (1, 1, Tq, Tk), constant along each row: row i's scores all shift by
    SHIFT_BIAS - SHIFT_STEP * (i % 4), about -6e4. Softmax is shift-invariant, so the output equals
    unbiased attention; a kernel treating finite logits below a sentinel as masked does not
    (flashinfer-ai/flashinfer#4450). Nothing is masked."""
    import torch
    out = _normal(case, gen, tq, tk)
    shift = SHIFT_BIAS - SHIFT_STEP * (torch.arange(tq) % 4).float()  # (Tq,)
    bias = shift[None, None, :, None].expand(1, 1, tq, tk).contiguous()  # (1, 1, Tq, Tk)
    out.update(mask=bias, mask_form="bias")
    return out


def fully_masked_rows(tq: int) -> list[int]:
    """Query rows that see no key at all: every 8th row, starting at 3 (at least one)."""
    return list(range(min(3, tq - 1), tq, 8))


def _fully_masked(form: str):
    def draw(case, gen, tq, tk):
        import torch
        out = _normal(case, gen, tq, tk)
        keep = torch.ones(1, 1, tq, tk, dtype=torch.bool)         # (1, 1, Tq, Tk)
        keep[..., fully_masked_rows(tq), :] = False
        if form == "bool":
            mask = keep
        else:
            fill = float("-inf") if form == "neginf" else torch.finfo(torch_dtype(case.dtype)).min
            mask = torch.zeros(1, 1, tq, tk).masked_fill(~keep, fill)
        out.update(mask=mask, visible=keep, mask_form=form)
        return out
    return draw


def window_size(tk: int) -> int:
    """sliding_window's width w: a quarter of the keys, at least 1."""
    return max(1, tk // 4)


def _sliding_window(case, gen, tq, tk) -> dict:
    """Local attention: query i sees keys j with |i - j| < w (with causal: i - w < j <= i,
    Mistral's and Gemma 2's local layers), w = T/4. A bool (1, 1, Tq, Tk) mask: SDPA takes it
    as attn_mask, FlexAttention as a block mask, the hand-written variants as masked_fill."""
    import torch
    out = _normal(case, gen, tq, tk)
    i = torch.arange(tq)[:, None]                                 # (Tq, 1)
    j = torch.arange(tk)[None, :]                                 # (1, Tk)
    keep = ((i - j).abs() < window_size(tk))[None, None]          # (1, 1, Tq, Tk)
    out.update(mask=keep, visible=keep, mask_form="bool")
    return out


# The sinks scenario's heads, by h % 4: the sink above every score of its head (it takes most of each
# row's weight: dropping it changes out the most), about half the weight, about a sixth, none.
SINK_ABOVE_MAX = 2.0                  # sink = the head's largest scaled score + this
SINK_NEGLIGIBLE = -30.0


def _sinks(masked_rows: bool):
    def draw(case, gen, tq, tk):
        out = _draw_sinks(case, gen, tq, tk)
        if masked_rows and tq > 1:                # fully masked rows meet the sinks: out 0 there
            import torch
            keep = torch.ones(1, 1, tq, tk, dtype=torch.bool)          # (1, 1, Tq, Tk)
            keep[..., fully_masked_rows(tq), :] = False
            out.update(mask=keep, visible=keep, mask_form="bool")
        return out
    return draw


def _draw_sinks(case, gen, tq, tk) -> dict:
    """q, k, v ~ N(0, 1) and one sink logit per query head (H,), gpt-oss's learned sinks, drawn so
    the sink's share of the weight differs by head (SINK_* above): heads whose sink dominates,
    shares a visible part, or has none. A row that sees no key gives all its weight to the sink."""
    import math
    import torch
    out = _normal(case, gen, tq, tk)
    q, k = out["q"], out["k"]                                            # (B, H, Tq, d), (B, Hkv, Tk, d)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)              # (B, H, Tk, d)
    top = ((q @ k.transpose(-2, -1)) * case.d_k ** -0.5).amax(dim=(0, 2, 3))   # (H,) largest scaled score
    log_keys = math.log(tk) + 0.5                                          # ln(sum of exp(s)), s ~ N(0, 1)
    by_kind = [top + SINK_ABOVE_MAX, torch.full_like(top, log_keys), torch.full_like(top, SINK_NEGLIGIBLE),
               torch.full_like(top, log_keys - 1.6)]
    heads = torch.arange(q.shape[1])
    out["sinks"] = torch.stack(by_kind)[heads % 4, heads]                  # (H,)
    return out


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
    Scenario("sliding_window", "local attention: |i - j| < T/4 (causal: i - T/4 < j <= i), a bool mask",
             lambda t: t, _sliding_window, ("bool", "per-row")),
    Scenario("softcap", f"Gemma 2's logit soft-capping s -> {SOFTCAP.cap:g}·tanh(s/{SOFTCAP.cap:g}) "
             f"on q × {SOFTCAP_Q_SCALE:g} (a score modification)", lambda t: t, _scaled(SOFTCAP_Q_SCALE),
             score_mod=SOFTCAP),
    Scenario("sinks", "q, k, v ~ N(0, 1) with gpt-oss's attention sinks: one logit per head, above every score "
             "(heads 0, 4, ...), about half or a sixth of the weight, or none; every 8th query row sees no key "
             "(its weight all on the sink: out 0) (vllm-project/vllm#52148: sinks dropped silently)",
             lambda t: t, _sinks(masked_rows=True), ("bool", "per-row"), sinks=True),
    Scenario("sinks_decode", "one query (q_len = 1) against T keys with the sinks scenario's sinks: gpt-oss decoding",
             lambda t: 1, _sinks(masked_rows=False), sinks=True),
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
MASK_KINDS: tuple[str, ...] = ("none", "causal", "padding")
MASK_KIND_LABELS = {"none": "no mask", "causal": "causal", "padding": "key padding"}


def scenario_mask_kind(name: str) -> str | None:
    """"plain" (no mask tensor, no score modification: the causal flag makes it none or causal),
    "padding" (a key padding mask, (B, 1, 1, T): the catalogue's per-batch masks), or None (any
    other mask, a score modification, an unknown scenario: no kind)."""
    scenario = SCENARIOS.get(name)
    if scenario is None or scenario.score_mod is not None or scenario.sinks:
        return None
    if scenario.mask is None:
        return "plain"
    return "padding" if tuple(scenario.mask)[1:] == ("per-batch",) else None


def mask_kind(scenario: str, causal: bool) -> str | None:
    """A cell's mask kind (MASK_KINDS), or None when it has another mask or a score modification."""
    kind = scenario_mask_kind(scenario)
    if kind == "plain":
        return "causal" if causal else "none"
    return kind


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
    return kind, ((case.batch, 1, 1, case.seq_len) if layout == "per-batch" else (1, 1, tq, case.seq_len))


def cell_needs(case: Case) -> set[str]:
    """What a cell asks of a variant (needs()), known without building its tensors."""
    scenario = SCENARIOS[case.scenario]
    return needs(case.heads, case.effective_kv_heads, scenario.score_mod, scenario.sinks)


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
    grad_out = to_cell(_randn(gen, (case.batch, case.heads, tq, case.d_k)))        # (B, H, Tq, d)
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
    return Inputs(q=to_cell(drawn["q"]), k=to_cell(drawn["k"]), v=to_cell(drawn["v"]),
                  grad_out=grad_out, grad_lse=grad_lse, sinks=None if sinks is None else to_cell(sinks),
                  mask=mask, causal=case.causal,
                  visible=visible,
                  mask_form=drawn.get("mask_form", "none"), score_mod=score_mod)
