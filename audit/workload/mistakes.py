"""Known attention mistakes, each a float64 function of one cell's inputs: the diagnosis library.

When a variant's output is wrong, audit.measure.diagnosis.diagnosis evaluates every mistake here on the
cell's own inputs (the golden's (batch, head) slices, in float64) and names the one the variant's
output matches within its dtype's error budget. A mistake is a few lines on an Attempt (the
cell's float64 context, with `attend`: correct attention with one thing overridden), returning
the (b, h, Tq, d) float64 output the mistaken code would give, or None when the mistake cannot
differ on this cell (a GQA pairing on multi-head attention, a causal mistake on a non-causal cell).

Rows a mistake is compared on (`rows`): "seen" — rows that see a key in the golden and that the
mistaken code leaves a key (its output there is not NaN; a row it empties gets a convention of
the code's, 0 or NaN, which says nothing); "all" — every row, NaN matching NaN: the fully-masked
row conventions and the mistakes whose point is a NaN (overflow, underflow). Ties (two mistakes
explaining the output equally, e.g. bottom-right alignment and causal ignored on a decode cell)
go to the higher `specificity`, then to the one registered first.

Precision: a mistake is evaluated in float64 (and once more in the cell's dtype, for the error
the mistaken code itself has there: the tolerance of a match), except those of precision
"cell", whose whole effect is the working dtype's range (softmax without max subtraction
overflows; masking after softmax flushes visible weights to zero). In float64 they equal
correct attention but for rows with no key and scores past float64's own range (the
fp16_range and shifted_bias scenarios), and whether a row overflows or underflows is decided
by the last bits of its scores, so they are evaluated on q, k, v in the cell's dtype
(Attempt.in_dtype) as the mistaken code computes them, and compared NaN for NaN.

Your own mistake, from the plug-in module your variant lives in (imported when the variant is
loaded, so its mistakes are registered before any cell is diagnosed):

    from audit.workload.mistake_base import Attempt, mistake

    @mistake("bias_twice", title="additive bias added twice",
             what="The additive bias is added to the scores twice.",
             where="a bias folded into the scores and passed to the kernel as well")
    def bias_twice(a: Attempt):
        if a.bias is None:
            return None                   # cannot differ: the cell has no bias
        return a.attend(weights=lambda scores, keep: a.softmax(scores + a.bias, keep))

The machinery (Mistake, the registry, @mistake, @mistake_family, Attempt) is in mistake_base.py;
MISTAKES, the registry once this module has registered its mistakes, is read from here. Imports no
torch at module level (the report's texts come from here); the functions do.
"""
from __future__ import annotations

from typing import Any

from .draws import causal_offset
from .packing import v_at_k_stride
from . import mistake_base
from .mistake_base import Attempt, Member, mistake, mistake_family, nearest_form, sq_diff


# --------------------------------------------------------------------------- GQA

@mistake("gqa_interleaved", title="GQA heads paired interleaved",
         what="Query head h reads key/value head h % kv_heads (k and v tiled with repeat instead of "
              "repeat_interleave) instead of h // (heads / kv_heads).",
         where="where k and v are expanded to the query heads: repeat vs repeat_interleave, or a "
               "reshape of (kv_heads, group) in the wrong order.")
def gqa_interleaved(a: Attempt) -> Any:
    wrong = [h % a.kv_heads for h in a.heads]
    return a.attend(pairing=wrong) if a.gqa and wrong != a.pairing() else None


@mistake("gqa_permuted", title="GQA heads paired wrongly",
         what="Some query heads read another key/value head than h // (heads / kv_heads) (the "
              "pairing is fitted per query head to the variant's output).",
         where="where k and v are expanded or indexed per query head: a head index, view or "
               "transpose over the head dimension.", specificity=0)
def gqa_permuted(a: Attempt) -> Any:
    import torch
    if not a.gqa or a.observed is None:
        return None
    rows = slice(0, a.tq, max(1, a.kv_heads))            # fit on every kv_heads-th row: bounded cost
    obs = a.observed[:, :, rows]                                             # (b, h, r, d)
    seen = a.seen()[..., rows]                                               # (b|1, 1, r)
    misfit = torch.stack([sq_diff(a.attend(pairing=[g] * len(a.heads), rows=rows), obs).sum(-1)
                          .masked_fill(~seen, 0.0).sum((0, 2))
                          for g in range(a.kv_heads)])                       # (Hkv, h)
    best = misfit.argmin(0).tolist()
    return None if best == a.pairing() else a.attend(pairing=best)


# --------------------------------------------------------------------------- causal

@mistake("causal_alignment_swapped", title="causal mask aligned to the other corner",
         what="The causal mask is aligned bottom-right (query i sees keys j <= i + Tk - Tq, as KV-cache "
              "decoding does) where top-left is meant, or top-left where bottom-right is meant.",
         where="the causal flag of a kernel with its own convention (flash-attn, xformers are "
               "bottom-right; SDPA is top-left), or tril(diagonal=...) when q_len != kv_len.",
         specificity=2)
def causal_alignment_swapped(a: Attempt) -> Any:
    if not a.causal or a.tq == a.tk:
        return None
    other = "bottom-right" if a.alignment == "top-left" else "top-left"
    return a.attend(keep=a.keep(offset=causal_offset(a.tq, a.tk, other)))


@mistake("causal_diagonal_excluded", title="causal mask off by one (diagonal hidden)",
         what="Query i sees keys j < i + offset: its own position is masked too.",
         where="triu(diagonal=0) where triu(diagonal=1) was meant, or `j < i` for `j <= i`.")
def causal_diagonal_excluded(a: Attempt) -> Any:
    return a.attend(keep=a.keep(offset=a.offset - 1)) if a.causal else None


@mistake("causal_next_key", title="causal mask off by one (next key visible)",
         what="Query i sees keys j <= i + offset + 1: one future key leaks in.",
         where="tril(diagonal=1) for tril(), or triu(diagonal=2) for triu(diagonal=1).")
def causal_next_key(a: Attempt) -> Any:
    return a.attend(keep=a.keep(offset=a.offset + 1)) if a.causal else None


@mistake("causal_upper", title="causal mask transposed",
         what="Query i sees keys j >= i + offset (the future) instead of j <= i + offset.",
         where="triu where tril was meant (or the keep/mask sense of one swapped).")
def causal_upper(a: Attempt) -> Any:
    return a.attend(keep=a.keep(upper=True)) if a.causal else None


@mistake("causal_ignored", title="causal mask not applied",
         what="Every query sees every key the scenario's mask allows: no causal mask.",
         where="is_causal or causal=True not passed on (dropped when a mask is given, or by a wrapper).")
def causal_ignored(a: Attempt) -> Any:
    return a.attend(keep=a.keep(causal=False)) if a.causal else None


# --------------------------------------------------------------------------- masks

@mistake("mask_ignored", title="attention mask not applied",
         what="The scenario's mask (padding, window, fully masked rows) is dropped; causal still applies.",
         where="a mask argument not passed on, or passed where the kernel expects another form.")
def mask_ignored(a: Attempt) -> Any:
    return a.attend(keep=a.keep(visible=None)) if a.visible is not None else None


@mistake("mask_inverted", title="attention mask inverted",
         what="Keys the mask hides are seen and keys it allows are hidden (True read as 'masked out').",
         where="a bool mask's sense (SDPA: True = attend; key_padding_mask: True = ignore), or ~mask.")
def mask_inverted(a: Attempt) -> Any:
    return a.attend(keep=a.keep(visible=~a.visible)) if a.visible is not None else None


def _masks_anything(a: Attempt) -> bool:
    return a.causal or (a.visible is not None and not bool(a.visible.all()))


@mistake("mask_after_softmax", title="mask applied after softmax",
         what="Softmax over every key, then the masked weights set to zero without renormalising: "
              "each row's weights sum to less than 1.",
         where="probs.masked_fill(~mask, 0) (or probs * mask) after the softmax instead of -inf before it.")
def mask_after_softmax(a: Attempt) -> Any:
    if not _masks_anything(a):
        return None
    return a.attend(weights=lambda s, keep: a.softmax(s, None) * keep)


@mistake("mask_after_softmax_renormalised", title="mask applied after softmax, renormalised",
         what="Softmax over every key, then masked weights zeroed and the rest renormalised. Exact in "
              "arithmetic except rows with no visible key (0/0 = NaN), but in the working dtype the "
              "masked keys can push a row's visible weights below its smallest number: they flush "
              "to zero and the row becomes NaN or keeps a few keys.",
         where="probs * mask / (probs * mask).sum(-1) after the softmax instead of -inf before it.",
         rows="all", precision="cell")
def mask_after_softmax_renormalised(a: Attempt) -> Any:
    if not _masks_anything(a):
        return None

    def weights(scores: Any, keep: Any) -> Any:
        kept = a.stored(a.softmax(scores, None)) * keep                     # (b, h, Tq, Tk)
        return kept / kept.sum(-1, keepdim=True)                             # 0/0: NaN
    return a.attend(weights=weights)


def _no_key_rows(a: Attempt) -> Any:
    """(b|1, 1, Tq, 1) bool of the rows that see no key in the golden, or None when there are none."""
    unseen = ~a.seen()
    return unseen[..., None] if bool(unseen.any()) else None


@mistake("fully_masked_nan", title="NaN on fully masked rows",
         what="A row that sees no key gets softmax of all -inf: NaN, which poisons the loss and every "
              "gradient; the other rows are right.",
         where="masked_fill(-inf) and softmax with no guard for empty rows (SDPA returns 0 there).",
         rows="all", specificity=2)
def fully_masked_nan(a: Attempt) -> Any:
    return a.attend() if _no_key_rows(a) is not None else None      # the plain softmax already gives NaN


@mistake("fully_masked_uniform", title="uniform weights on fully masked rows",
         what="A row that sees no key attends equally to every key (the mean of v; with causal "
              "masking as -inf, every key up to its position): what a finite mask value such as "
              "finfo.min gives; the other rows are right.",
         where="a float mask of finfo(dtype).min or -1e9 instead of -inf (or a bool mask).",
         rows="all", specificity=2)
def fully_masked_uniform(a: Attempt) -> Any:
    import torch
    empty = _no_key_rows(a)
    if empty is None:
        return None
    out = torch.nan_to_num(a.attend(), nan=0.0)                              # (b, h, Tq, d)
    forms = [a.pair(a.v).mean(-2, keepdim=True).expand_as(out)]              # every key equally
    if a.causal:                                                             # the causal keys equally
        forms.append(torch.nan_to_num(a.attend(keep=a.keep(visible=None), scale=0.0), nan=0.0))
    fills = [torch.where(empty, f, out) for f in forms]
    if a.observed is None or len(fills) == 1:
        return fills[-1]
    return nearest_form(fills, a.observed)                                   # the form it uses


@mistake("zero_keys_as_padding", title="all-zero keys taken for padding",
         what="Every key whose vector is exactly zero is masked out as if it were padding: right on dense "
              "inputs, wrong where a real key is all zeros (its score 0 is a real score).",
         where="a padding mask inferred from the data (k.abs().sum(-1) == 0, a zero-key check) instead of "
               "taken as an argument.")
def zero_keys_as_padding(a: Attempt) -> Any:
    zero = (a.k == 0).all(-1)                                                # (b, Hkv, Tk)
    if not bool(zero.any()):
        return None                                                          # cannot differ: no all-zero key
    real = ~a.pair(zero)[:, :, None, :]                                      # (b, h, 1, Tk)
    keep = a.keep()
    return a.attend(keep=real if keep is None else keep & real)


# --------------------------------------------------------------------------- scale

SCALE_POWERS = (
    Member("scale_squared", "scores scaled by 1/d",
           "Scores are multiplied by 1/d_k instead of 1/sqrt(d_k) (or 1/sqrt(d_k) applied twice).", (("power", 2),)),
    Member("scale_missing", "scores not scaled", "Scores are Q Kᵀ without 1/sqrt(d_k): softmax saturates.",
           (("power", 0),)),
    Member("scale_inverted", "scores multiplied by sqrt(d)",
           "Scores are multiplied by sqrt(d_k) instead of divided by it.", (("power", -1),)),
)


@mistake_family("softmax_scale", SCALE_POWERS,
                where="q pre-scaled and the kernel's own scale left on (applied twice), scale=1.0 passed or the "
                      "division by sqrt(d_k) left out (missing), scale = sqrt(d_k) where d_k ** -0.5 was meant "
                      "(inverted).")
def softmax_scale(a: Attempt, *, power: int) -> Any:
    """A member of the scale family: the scores scaled by the cell's scale to the `power` (2: twice
    or 1/d; 0: not at all; -1: multiplied by sqrt(d))."""
    return a.attend(scale=a.scale ** power)


# --------------------------------------------------------------------------- softmax and scores

@mistake("softmax_wrong_dim", title="softmax over the query axis",
         what="Softmax normalises each key's column over the queries (dim=-2) instead of each "
              "query's row over the keys.",
         where="softmax(dim=-2) or dim=2 on (B, H, Tq, Tk) scores, or dim=1 after a transpose.")
def softmax_wrong_dim(a: Attempt) -> Any:
    return a.attend(dim=-2)


@mistake("qk_swapped", title="queries and keys swapped",
         what="Scores are K Qᵀ (the transpose of Q Kᵀ): query i gets the weights that key i gives "
              "the queries.",
         where="scores = k @ q.transpose(-2, -1), or q and k passed in each other's place.")
def qk_swapped(a: Attempt) -> Any:
    if a.tq != a.tk:
        return None
    return a.attend(weights=lambda s, keep: a.softmax(s.transpose(-2, -1), keep))


@mistake("last_key_dropped", title="last key dropped",
         what="The last key and value are left out of every row.",
         where="an exclusive end (range(T - 1), [:-1], a length minus one) in a loop or slice over keys.")
def last_key_dropped(a: Attempt) -> Any:
    if a.tk < 2:
        return None
    keep = a.keep()
    return a.attend(k=a.k[..., :-1, :], v=a.v[..., :-1, :],
                    keep=None if keep is None else keep[..., :-1])


@mistake("probs_clamped", title="probabilities clamped from below",
         what="After the softmax, probabilities are clamped to at least 1e-6 (and not renormalised): "
              "weight returns to masked keys and every row sums to more than 1.",
         where="probs.clamp(min=1e-6) (or + eps) to avoid log(0) or division by zero downstream.")
def probs_clamped(a: Attempt) -> Any:
    return a.attend(weights=lambda s, keep: a.softmax(s, keep).clamp(min=1e-6))


@mistake("no_max_subtraction", title="softmax without max subtraction",
         what="exp(scores) / sum without subtracting the row max: right in exact arithmetic, but "
              "exp overflows the working dtype (inf / inf = NaN) on large scores and underflows "
              "on very negative ones (0 / 0 = NaN).",
         where="a hand-written softmax: scores.exp() / scores.exp().sum(-1) with no .amax() subtracted.",
         rows="all", precision="cell")
def no_max_subtraction(a: Attempt) -> Any:
    def weights(scores: Any, keep: Any) -> Any:
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        e = a.stored(scores.exp())                                           # (b, h, Tq, Tk)
        return e / a.stored(e.sum(-1, keepdim=True))
    return a.attend(weights=weights)


@mistake("score_mod_ignored", title="score modification not applied",
         what="The score modification (e.g. logit soft-capping) is not applied to the scores.",
         where="a softcap or score_mod argument not passed on (a kernel or path that lacks it).")
def score_mod_ignored(a: Attempt) -> Any:
    return a.attend(score_mod=None) if a.score_mod is not None else None


# --------------------------------------------------------------------------- sinks (output mistakes)

def _has_sinks(a: Attempt) -> bool:
    return a.sinks is not None


@mistake("sink_ignored", title="attention sinks ignored",
         what="The sinks argument is taken and never read: each row's weight stays on its keys, as if the "
              "model had no sinks.",
         where="a kernel path that accepts sinks and drops them (vllm-project/vllm#52148: the FA2 prefill "
               "path; radixark/miles#1500: eager and SDPA fallbacks)", specificity=2)
def sink_ignored(a: Attempt) -> Any:
    return a.attend(sinks=None) if _has_sinks(a) else None


@mistake("sink_after_normalisation", title="sink added after normalisation",
         what="The keys' weights are normalised first and exp(sink) then added to the normalised "
              "denominator (1 + exp(sink)) instead of to the sum of exp(scores).",
         where="a sink bolted onto a finished softmax, or applied inside flex's score_mod "
               "(huggingface/transformers#41026)")
def sink_after_normalisation(a: Attempt) -> Any:
    if not _has_sinks(a):
        return None
    import torch
    return a.attend(sinks=None) / (1.0 + torch.exp(a.head_sinks()))                  # (b, h, Tq, d)


@mistake("sink_shared", title="one sink shared by every head",
         what="Every head uses the first head's sink instead of its own.",
         where="a sink tensor indexed without the head, or broadcast from a scalar")
def sink_shared(a: Attempt) -> Any:
    if not _has_sinks(a) or bool((a.sinks == a.sinks[0]).all()):
        return None
    return a.attend(sinks=a.sinks[:1].expand_as(a.sinks))


@mistake("sink_wrong_head", title="sink of the wrong head",
         what="Head h uses the sink of head h + 1: the sinks are indexed off by one head.",
         where="a head index offset (tensor parallelism's local head range, GQA's kv head) used for the sinks")
def sink_wrong_head(a: Attempt) -> Any:
    if not _has_sinks(a) or a.n_heads < 2 or bool((a.sinks == a.sinks[0]).all()):
        return None
    return a.attend(sinks=a.sinks.roll(-1))


# --------------------------------------------------------------------------- layouts: packed documents, latent heads


@mistake("document_boundary_ignored", title="document boundaries ignored", specificity=2,
         what="Packed documents attend each other: every key a document owns is visible (with causal "
              "masking, the earlier documents'); only the padding past cu_seqlens[-1] is masked.",
         where="a varlen fallback to dense attention that keeps only the total length, or ignores cu_seqlens.")
def document_boundary_ignored(a: Attempt) -> Any:
    if a.cu_seqlens is None or a.visible is None:
        return None
    return a.attend(keep=a.keep(visible=a.visible.any(-2, keepdim=True)))          # (b, 1, 1, Tk): owned keys


def _shifted(cu: list[int], shift: int) -> list[int]:
    """cu_seqlens with every interior boundary moved by `shift` tokens (the first and last kept)."""
    return cu[:1] + [c + shift for c in cu[1:-1]] + cu[-1:]


def _document_ranges(a: Attempt, *, key_start: int, key_end: int, query_shift: int, key_shift: int,
                     flattened: bool) -> Any:
    """Attention over packed documents with the document ranges mistaken: query p (of the document
    d that the queries' boundaries, shifted by query_shift, give it) sees the keys j with
    start_d + key_start <= j < end_d + key_end, (start_d, end_d) from the keys' boundaries shifted
    by key_shift; causal: j <= p as well. Queries past cu_seqlens[-1] see nothing.

    flattened: the keys range over the B·T tokens flattened row by row, as a kernel on packed
    (total, H, d) tensors reads them (a document ending at its row's end sees the next row's first
    token one key past it); else within the query's batch row only, as a dense kernel reading the
    documents off a (B, 1, T, T) mask does. -> (b, h, T, d)."""
    import torch
    B, T = a.n_batch, a.tk
    cu = [int(c) for c in a.cu_seqlens.tolist()]
    q_bounds, k_bounds = _shifted(cu, query_shift), _shifted(cu, key_shift)
    dev = a.q.device
    rows = torch.tensor(a.batches, device=dev)[:, None]                                # (b, 1)
    p = rows * T + torch.arange(T, device=dev)[None, :]                                 # (b, T) query positions
    reach = 1 if flattened else 0                                                       # keys beyond the row
    j = rows * T + torch.arange(-reach, T + reach, device=dev)[None, :]                 # (b, T + 2·reach)
    q_doc = torch.searchsorted(torch.tensor(q_bounds, device=dev), p, right=True) - 1   # (b, T)
    owned = p < cu[-1]
    starts = torch.tensor(k_bounds[:-1] + [cu[-1]], device=dev)[q_doc.clamp(0, len(cu) - 1)] + key_start
    ends = torch.tensor(k_bounds[1:] + [cu[-1]], device=dev)[q_doc.clamp(0, len(cu) - 2)] + key_end
    keep = ((j[:, None, :] >= starts[..., None]) & (j[:, None, :] < ends[..., None])
            & (j[:, None, :] >= 0) & (j[:, None, :] < B * T) & owned[..., None])       # (b, T, Tk')
    if a.causal:
        keep &= j[:, None, :] <= p[..., None]
    if not flattened:
        return a.attend(keep=keep[:, None])
    flat_k, flat_v = a.flat_kv                                                          # (B·T, Hkv, d)
    index = j.clamp(0, B * T - 1)                                                       # (b, T + 2)
    k, v = (t[index].permute(0, 2, 1, 3) for t in (flat_k, flat_v))                    # (b, Hkv, T + 2, d)
    return a.attend(keep=keep[:, None], k=k, v=v)


DOCUMENT_RANGES = (
    Member("cu_seqlens_off_by_one", "cu_seqlens off by one",
           "Each interior document boundary sits one token late, for queries and keys: a document's first "
           "token is read as the last token of the document before it.",
           (("query_shift", 1), ("key_shift", 1))),
    Member("cu_seqlens_one_early", "cu_seqlens one early",
           "Each interior document boundary sits one token early, for queries and keys: a document's last "
           "token is read as the first token of the next.", (("query_shift", -1), ("key_shift", -1))),
    Member("document_keys_end_inclusive", "one key past each document's end",
           "Each document sees one key past its end (the next document's first): an inclusive end on the keys.",
           (("key_end", 1),)),
    Member("document_keys_end_short", "last key of each document dropped",
           "Each document misses its own last key: the end on the keys one short.", (("key_end", -1),)),
    Member("document_keys_start_early", "one key before each document's start",
           "Each document sees one key before its start (the previous document's last): the start on the keys "
           "one early.", (("key_start", -1),)),
    Member("document_keys_start_exclusive", "first key of each document dropped",
           "Each document misses its own first key: an exclusive start on the keys.", (("key_start", 1),)),
    Member("document_queries_late", "queries' boundaries one token late",
           "The queries' document boundaries sit one token late (the keys' are right): each document's first "
           "query attends as the previous document's.", (("query_shift", 1),)),
    Member("document_queries_early", "queries' boundaries one token early",
           "The queries' document boundaries sit one token early (the keys' are right): each document's last "
           "query attends as the next document's.", (("query_shift", -1),)),
)


@mistake_family("document_ranges", DOCUMENT_RANGES,
                where="cu_seqlens built from lengths off by one (an inclusive end, a shifted cumsum), a <= for < "
                      "in a kernel's key loop bound, or the queries' offsets and the keys' read from different arrays")
def document_ranges(a: Attempt, *, key_start: int = 0, key_end: int = 0, query_shift: int = 0,
                    key_shift: int = 0) -> Any:
    """A member of the document-range family: the documents' key ranges or query boundaries off by
    one (_document_ranges); of its two forms (keys within the row, or over the flattened tokens),
    the one nearer the variant's output when there is one to compare with."""
    if a.cu_seqlens is None or not a.batches:
        return None
    forms = [_document_ranges(a, key_start=key_start, key_end=key_end, query_shift=query_shift,
                              key_shift=key_shift, flattened=flat)
             for flat in ((False, True) if a.flat_kv is not None else (False,))]
    if a.observed is None or len(forms) == 1:
        return forms[0]
    # the forms differ only where a document's range crosses its row's end, where one of them may
    # leave a query no key: compared there too, by the variant's convention (nearest_form)
    return nearest_form(forms, a.observed)


WINDOW_BOUNDS = (
    Member("window_left_inclusive", "one key past the window's left end",
           "Each query also sees the key just left of its window (i - j <= w where i - j < w is meant): the "
           "window's left bound inclusive, one key too far.", (("left", 1),)),
    Member("window_left_short", "window's oldest key dropped",
           "Each query misses the oldest key of its window (i - j < w - 1): the window's left bound one short.",
           (("left", -1),)),
    Member("window_right_inclusive", "one key past the window's right end",
           "Each query also sees the key just right of its window (j - i <= w): the right bound inclusive, one "
           "key too far (a two-sided window).", (("right", 1),)),
    Member("window_right_short", "window's newest key dropped",
           "Each query misses the farthest key right of it in its window (j - i < w - 1): the right bound one "
           "short (a two-sided window).", (("right", -1),)),
    Member("window_both_inclusive", "one key past both window ends",
           "Each query sees one key past each end of its window (|i - j| <= w): both bounds inclusive "
           "(a two-sided window).", (("left", 1), ("right", 1))),
)


@mistake_family("window_bounds", WINDOW_BOUNDS,
                where="a window width converted between conventions off by one: flash-attn's window_size=(left, "
                      "right) and FlashInfer's window_left count the keys beside the query (w - 1 for a window of "
                      "w), transformers' and gpt-oss's sliding_window count the query too (w); or a < for <= in a "
                      "kernel's window mask")
def window_bounds(a: Attempt, *, left: int = 0, right: int = 0) -> Any:
    """A member of the window-bounds family: the sliding window's left end `left` keys wider (negative:
    narrower), its right end `right` keys: query i sees keys j with -(w - 1 + left) <= j - i <= w - 1 + right
    (and causal masking, which hides every right-end change: None there). -> (b, h, Tq, d)."""
    import torch
    if a.window is None or (a.causal and right):
        return None
    d = (torch.arange(a.tk, device=a.q.device)[None, :]
         - torch.arange(a.tq, device=a.q.device)[:, None])                              # (Tq, Tk): j - i
    keep = (d >= -(a.window - 1 + left)) & (d <= a.window - 1 + right)                  # (Tq, Tk)
    return a.attend(keep=a.keep(visible=keep[None, None]))


@mistake("strides_ignored", title="inputs read as contiguous",
         what="q, k and v are read as contiguous memory from where each starts, whatever their strides: on views of a "
              "fused QKV buffer a head's rows are read from the other heads' (and k's and v's) values.",
         where="a kernel indexing raw pointers by shape alone (data_ptr() with strides assumed, a .view of "
               "a transposed tensor's storage), fed the views a fused projection hands over.")
def strides_ignored(a: Attempt) -> Any:
    if a.read_contiguous is None:
        return None
    from dataclasses import replace
    q, k, v = a.read_contiguous
    return replace(a, q=q, k=k, v=v).attend()


@mistake("v_read_at_k_stride", title="V read at K's row stride",
         what="Where d_v != d_k, V's rows are stepped through with K's row length: row j is read from element "
              "j·d_k of the head's values, so every row past the first is garbage (a mix of rows, or 0 past the end).",
         where="a kernel for one head size indexing V with K's stride (ik_llama.cpp#2031: MLA decode).")
def v_read_at_k_stride(a: Attempt) -> Any:
    return None if a.v.shape[-1] == a.q.shape[-1] else a.attend(v=v_at_k_stride(a.v, a.q.shape[-1]))


LIBRARY_MODULES: tuple[str, ...] = (__name__,)   # the modules of the library's own mistakes
# The library, every mistake above registered in mistake_base's registry. Read it from here, not from
# mistake_base: importing this module is what registers them, so mistake_base's alone may still be empty.
MISTAKES = mistake_base.MISTAKES
