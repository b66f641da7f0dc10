"""The scenarios' draw functions: (case, gen, tq, tk) -> the tensors of an input set, from `gen`
(seeded by the cell), in fp32 on the CPU; and the helpers the golden and the checks share with them
(causal_keep, which rows are fully masked, where the all-zero keys sit, ...). inputs.py holds the
scenario table and turns a draw into an Inputs.

No torch at import (the functions import it): the cost model and the docs read this module. Copied
into reproduction scripts with what it calls (audit.repro.scripts): module-level imports only.
"""
from __future__ import annotations

from typing import Any

from ..core.dtypes import dtype_spec
from ..core.grid import Case
from .packing import PAGE_SIZE, cu_seqlens_of, document_ids, packed_documents, paged_layout


def torch_dtype(name: str):
    """torch's dtype for a registered dtype name (core/dtypes.py): torch.bfloat16 for "bf16"."""
    import torch
    return getattr(torch, dtype_spec(name).torch_name)


def _randn(gen, shape):
    import torch
    return torch.randn(shape, generator=gen, dtype=torch.float32)


def _normal(case: Case, gen, tq: int, tk: int, alpha: float = 1.0) -> dict:
    B, H, Hkv, d, dv = case.batch, case.heads, case.effective_kv_heads, case.d_k, case.effective_d_v
    return dict(q=_randn(gen, (B, H, tq, d)) * alpha, k=_randn(gen, (B, Hkv, tk, d)),
                v=_randn(gen, (B, Hkv, tk, dv)))


def _strided_qkv(case: Case, gen, tq: int, tk: int) -> dict:
    """The normal scenario's q, k, v, handed over as views into one fused QKV projection (views()):
    `views` names the layout, which draw_inputs applies in the cell's dtype and device."""
    return dict(_normal(case, gen, tq, tk), views="fused_qkv")


def views(kind: str | None, q: Any, k: Any, v: Any) -> tuple:
    """q (B, H, T, d), k (B, Hkv, T, d), v (B, Hkv, T, dv) -> the same values as views of another
    layout; kind None: unchanged. "fused_qkv": one (B, T, H + 2·Hkv, d) buffer, as a model's fused
    projection writes it, each of q, k, v a slice of its heads transposed to (B, H, T, d): not
    contiguous, and not dense (between a query head's rows lie the other heads' and k's and v's), the
    last dimension contiguous (what flash-attn asks of its inputs). Where dv != d (latent cells) v
    is its own (B, T, Hkv, dv) buffer transposed."""
    import torch
    if kind is None:
        return q, k, v
    if kind != "fused_qkv":
        raise ValueError(f"unknown input layout {kind!r}")
    B, H, T, d = q.shape
    Hkv = k.shape[1]
    joint = v.shape[-1] == d and k.shape[-2] == T
    fused = torch.empty(B, T, H + (2 if joint else 1) * Hkv, d, dtype=q.dtype, device=q.device)
    parts = [q, k, v] if joint else [q, k]
    starts = [0, H, H + Hkv][:len(parts)]
    for t, s in zip(parts, starts):
        fused[:, :, s:s + t.shape[1]] = t.transpose(1, 2)                       # (B, T, heads, d)
    out = [fused[:, :, s:s + t.shape[1]].transpose(1, 2) for t, s in zip(parts, starts)]   # (B, heads, T, d)
    if not joint:
        out.append(v.transpose(1, 2).contiguous().transpose(1, 2))              # (B, Hkv, Tk, dv) of (B, Tk, Hkv, dv)
    return tuple(out)


def read_as_contiguous(t: Any) -> Any:
    """t's shape read as contiguous memory from t's first element (its storage offset): what a kernel
    indexing a raw pointer by shape alone reads of a view. t itself where it is contiguous."""
    import torch
    if t.is_contiguous():
        return t
    strides = torch.empty(t.shape, device="meta").stride()                         # contiguous strides
    return torch.as_strided(t, t.shape, strides, t.storage_offset())


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
    return dict(q=along(H, tq, 576.0), k=along(Hkv, tk, 383.0), v=_randn(gen, (B, Hkv, tk, case.effective_d_v)))


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
    return dict(q=uniform((B, H, tq, d)), k=uniform((B, Hkv, tk, d)), v=uniform((B, Hkv, tk, case.effective_d_v)))


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
                v=_student_t(gen, (B, Hkv, tk, case.effective_d_v)))


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
                v=_randn(gen, (B, Hkv, tk, case.effective_d_v)))


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
    as attn_mask, FlexAttention as a block mask, the hand-written variants as masked_fill; a variant
    taking the window as an argument gets `window=w` instead (`window` in the draw)."""
    out = _normal(case, gen, tq, tk)
    keep = window_keep(tq, tk, window_size(tk))                   # (1, 1, Tq, Tk)
    out.update(mask=keep, visible=keep, mask_form="bool", window=window_size(tk))
    return out


def window_keep(tq: int, tk: int, width: int, device: Any = None) -> Any:
    """(1, 1, Tq, Tk) bool: query i sees keys j with |i - j| < width (causal masking, applied apart,
    cuts the right half): the sliding window a variant taking the window as an argument
    (variant_contract.CALL_FORMS "window") is handed as `window=width` instead of this mask."""
    import torch
    i = torch.arange(tq, device=device)[:, None]                  # (Tq, 1)
    j = torch.arange(tk, device=device)[None, :]                  # (1, Tk)
    return ((i - j).abs() < width)[None, None]                    # (1, 1, Tq, Tk)


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


def _sinks_window(case, gen, tq, tk) -> dict:
    """The sinks scenario's q, k, v and sinks in a sliding window (|i - j| < T/4) and no other mask:
    gpt-oss's sliding layers (sinks with a window of 128, causal)."""
    out = _draw_sinks(case, gen, tq, tk)
    keep = window_keep(tq, tk, window_size(tk))                   # (1, 1, Tq, Tk)
    out.update(mask=keep, visible=keep, mask_form="bool", window=window_size(tk))
    return out


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


def _packed(case, gen, tq, tk) -> dict:
    """q, k, v ~ N(0, 1), each batch row holding several documents (packing.packed_documents: one of
    length 0, one of length 1, the last row ending in padding rows no document owns). The document
    mask (B, 1, T, T) (a query sees the keys of its own document; causal applies on top, so within
    it) is what dense variants get; a "varlen" variant gets cu_seqlens and max_seqlen instead."""
    import torch
    out = _normal(case, gen, tq, tk)
    documents = packed_documents(case.batch, tk)
    owner = torch.tensor(document_ids(documents, tk))                  # (B, T): document per position, -1 padding
    keep = (owner[:, :, None] == owner[:, None, :]) & (owner[:, :, None] >= 0)   # (B, T, T)
    keep = keep[:, None]                                               # (B, 1, T, T)
    cu = cu_seqlens_of(documents)
    out.update(mask=keep, visible=keep, mask_form="bool",
               cu_seqlens=torch.tensor(cu, dtype=torch.int32),
               max_seqlen=max(b - a for a, b in zip(cu, cu[1:])))
    return out


def _paged(case, gen, tq, tk, used: list[int] | None = None) -> dict:
    """Decode (one query per sequence) against a paged cache of T slots per sequence, of which the
    first used[b] (3/4 T, shorter after: as the padding scenario's lengths) are real keys: dense
    variants get the keys dense with the used lengths as key padding (B, 1, 1, T); a "paged" variant
    gets them in shuffled pages of packing.PAGE_SIZE slots (packing.paged_layout), every slot it
    must not read NaN."""
    import torch
    out = _normal(case, gen, tq, tk)
    used = _valid_lengths(case.batch, tk) if used is None else used
    keep = (torch.arange(tk)[None, :] < torch.tensor(used)[:, None])[:, None, None, :]   # (B, 1, 1, Tk)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    out.update(mask=keep, visible=keep, mask_form="bool", paged=paged_layout(used, PAGE_SIZE, seed))
    return out


def page_edge_lengths(batch: int, tk: int, page: int = PAGE_SIZE) -> list[int]:
    """Used lengths on and around a page boundary, by sequence: one slot past a boundary (a last page
    holding one key), one before it (a last page one short of full), on it (a full last page), then
    again; the boundary the last whole page at or below 3/4 T, each length within 1..T."""
    edge = max(1, (tk * 3 // 4) // page) * page
    return [min(tk, max(1, edge + (1, -1, 0)[b % 3])) for b in range(batch)]


def _paged_edges(case, gen, tq, tk) -> dict:
    """The paged scenario with the used lengths on and around a page boundary (page_edge_lengths)."""
    return _paged(case, gen, tq, tk, used=page_edge_lengths(case.batch, tk))
