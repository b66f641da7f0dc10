"""Declared kernels: `audit.adapt(fn, ...)` turns a library's attention function into a plug-in.

A kernel from a library has its own tensor layout, mask forms, causal convention and argument
names. Wrapping it by hand takes 10-20 lines a user can get wrong, and then the audit measures
the wrapper. Here the user declares what the kernel takes; the audit converts each cell's
inputs into those forms, and skips (status `skipped`, with the reason) the cells whose mask or
causal case the kernel cannot take. Nothing is computed some other way.

    flash = adapt(flash_attn_func, layout="bthd", causal="bottom-right", causal_arg="causal",
                  scale_arg="softmax_scale", softcap_arg="softcap", gqa=True)
    xformers = adapt(memory_efficient_attention, layout="bthd", causal="bottom-right",
                     causal_arg=("attn_bias", LowerTriangularFromBottomRightMask()),
                     masks=("additive",), mask_arg="attn_bias", scale_arg="scale")

    varlen = adapt(flash_attn_varlen_func, layout="thd", causal="bottom-right", scale_arg="softmax_scale",
                   softcap_arg="softcap", gqa=True, cu_seqlens_arg=("cu_seqlens_q", "cu_seqlens_k"),
                   max_seqlen_arg=("max_seqlen_q", "max_seqlen_k"))

The result is a plug-in like any other (docs/variants.md): `--variant mymodule:flash`.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from ..core.errors import Unsupported, UsageError
from .draws import causal_keep
from .plugins import declare_plugin
from .varlen import batch_cu_seqlens, from_thd, to_thd

LAYOUTS: tuple[str, ...] = ("bhtd", "bthd", "thd")
CAUSAL_KINDS: tuple[str | None, ...] = ("top-left", "bottom-right", None)
MASK_FORMS: tuple[str, ...] = ("none", "bool", "additive", "key_padding")
RETURNS: tuple[str, ...] = ("out", "first", "out_lse")
LSE_LAYOUTS: tuple[str, ...] = ("bht", "bth")
# How a kernel takes a sliding window of width w (query i sees keys j with |i - j| < w; causal: i - w < j <= i):
# "left_right": (left, right), each end inclusive, -1 unbounded (flash-attn's window_size): (w - 1, w - 1),
#   causal (w - 1, 0); "left": the keys left of the query, inclusive (FlashInfer's window_left): w - 1,
#   causal cells only; "width": w itself (transformers' and gpt-oss's sliding_window), causal cells only.
WINDOW_FORMS: tuple[str, ...] = ("left_right", "left", "width")


def _check(name: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise UsageError(f"audit.adapt: {name}={value!r}; allowed: {', '.join(map(repr, allowed))}")


def adapt(fn: Callable[..., Any], *, layout: str = "bhtd", causal: str | None = "top-left",
          causal_arg: str | tuple[str, Any] | None = "causal", masks: Iterable[str] = ("none",),
          mask_arg: str = "attn_mask", key_padding_arg: str = "key_padding_mask",
          scale_arg: str | None = "scale", softcap_arg: str | None = None, gqa: bool = False,
          returns: str = "out", lse_layout: str = "bht", lse_base: float | None = None,
          sink_arg: str | None = None, lse_includes_sink: bool = False, causal_with_mask: bool = True,
          latent: bool = False, cu_seqlens_arg: str | tuple[str, str] | None = None,
          max_seqlen_arg: str | tuple[str, str] | None = None, block_table_arg: str | None = None,
          seqused_arg: str | None = None, page_size: int | None = None, window_arg: str | None = None,
          window_form: str = "left_right", name: str | None = None, **fixed: Any) -> Callable[..., Any]:
    """A plug-in calling `fn` the way it is declared to be called.

    layout: "bhtd" (q (B, H, T, d), SDPA's), "bthd" (q (B, T, H, d), flash-attn's and xFormers') or
      "thd" (q (total, H, d): the batch's sequences packed back to back, flash-attn's varlen layout;
      needs cu_seqlens_arg). A thd kernel gets a packed cell's documents as cu_seqlens, and in any
      other cell each batch row as one sequence.
    causal: the alignment the kernel's own causal masking follows when q_len != kv_len
      ("top-left", "bottom-right"), or None when it has none (causal cells then go to it as a
      mask, when it takes one; its golden follows the declared alignment).
    causal_arg: the keyword that turns causal masking on: a name (given True/False) or a
      (name, value) pair given only in causal cells (xFormers' attn_bias=LowerTriangular...).
    masks: the mask forms it takes besides none: "bool" (True = may attend), "additive" (a float
      tensor added to the scores), "key_padding" ((B, Tk) bool, True = a real key); given as
      `mask_arg` (bool, additive) or `key_padding_arg` (key padding).
    scale_arg: the keyword of the softmax scale (None: the kernel always uses 1/sqrt(d)).
    softcap_arg: the keyword of tanh soft-capping (flash-attn's softcap), if it has one.
    gqa: it takes k and v with fewer heads than q (query head h meets key/value head h // group).
    returns: "out" (a tensor), "first" (a tuple whose first element is the output) or "out_lse" (a
      tuple (out, lse, ...): the log-sum-exp is checked too, docs/numerics.md).
    lse_layout: the lse's layout, "bht" ((B, H, Tq): flash-attn's softmax_lse) or "bth" ((B, Tq, H)).
    lse_base: the base of its logarithm when not e (2 for FlashInfer's return_lse); it is converted.
    sink_arg: the keyword of per-head attention sinks (H,) (flash-attn's learnable_sink, s_aux), if any.
    lse_includes_sink: its lse counts the sink (flash-attn's and FlashInfer's do; flex's does not).
    causal_with_mask: False when the kernel refuses its causal flag together with a mask (SDPA's math
      rule: "Explicit attn_mask should not be set when is_causal=True"): such cells get causal folded
      into the mask, in the declared alignment.
    latent: it takes v of another head dimension than q and k (d_v != d_k: MLA).
    cu_seqlens_arg: the keyword(s) of the cumulative sequence offsets: one name, or (for q, for k).
    max_seqlen_arg: the keyword(s) of the longest sequence: one name, or (for q, for k).
    block_table_arg, seqused_arg, page_size: a paged KV cache: the keyword of the block table ((B,
      width) int32 page indices), of the used keys per sequence ((B,) int32; None: a thd kernel gets
      them as cu_seqlens for k instead, flash_attn_varlen_func's way), and the page size the kernel
      needs (None: the preset's). k and v then arrive as pools (pages, page_size, Hkv, d).
    window_arg, window_form: the keyword of a sliding window and the form it takes (WINDOW_FORMS:
      "left_right" for flash-attn's window_size=(left, right), "left" for FlashInfer's window_left,
      "width" for gpt-oss's sliding_window). Sliding-window cells then hand it the window, not its mask.
    fixed: keyword arguments passed on every call (dropout_p=0.0, ...).
    """
    masks = _validated(layout=layout, causal=causal, causal_arg=causal_arg, masks=masks, returns=returns,
                       lse_layout=lse_layout, lse_base=lse_base, lse_includes_sink=lse_includes_sink)
    cu_names, max_names = _packed_names(layout, cu_seqlens_arg, max_seqlen_arg)
    _check_paged(block_table_arg, seqused_arg, page_size, layout)
    _check_window(window_arg, window_form)
    takes = frozenset(m for m in masks if m != "none")
    label = name or getattr(fn, "__qualname__", None) or type(fn).__name__
    declared = causal        # the kernel's alignment (the call's `causal` is the cell's flag)

    def attention(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None, sinks=None,
                  cu_seqlens=None, max_seqlen=None, block_table=None, seqused=None, window=None):
        # q: (B, H, Tq, d); k, v: (B, Hkv, Tk, d) (a paged call: pools (pages, page_size, Hkv, d)):
        # the audit's contract (variant_contract.py, varlen.py)
        kwargs = dict(fixed)
        paged = block_table is not None
        if paged:
            kwargs[block_table_arg] = block_table
            if seqused_arg is not None:
                kwargs[seqused_arg] = seqused
        kwargs.update(_value_kwargs(label, sinks, score_mod, scale, sink_arg, softcap_arg, scale_arg))
        if window is not None:
            kwargs[_window_name(label, window_arg)] = _window_value(label, window, causal, window_form)
        kwargs.update(_masking_kwargs(_convert_mask(label, takes, q, k, mask, causal, declared, causal_arg, mask_arg,
                                                    causal_with_mask), causal_arg, mask_arg, key_padding_arg))
        batch = q.shape[0]
        if layout == "thd":
            kwargs.update(_packed_kwargs(q, k, cu_seqlens, max_seqlen, seqused if paged and seqused_arg is None
                                         else None, cu_names, max_names, paged))
        result = fn(*_to_layout(layout, q, k, v, paged), **kwargs)
        out = _from_layout(layout, result[0] if returns in ("first", "out_lse") else result, batch)
        if returns != "out_lse":
            return out
        return out, _lse_of(result[1], layout, lse_layout, lse_base, batch)

    attention.__doc__ = (f"{label} by declaration (audit.adapt): layout {layout}, causal {causal or 'none'}, "
                         f"masks {', '.join(sorted(takes)) or 'none'}")
    attention.__name__ = attention.__qualname__ = f"adapted_{getattr(fn, '__name__', 'kernel')}"
    return _declare(attention, dict(layout=layout, causal=causal, masks=sorted(takes), gqa=gqa,
                                    returns=returns, lse_layout=lse_layout, lse_base=lse_base, sink_arg=sink_arg,
                                    softcap_arg=softcap_arg, lse_includes_sink=lse_includes_sink,
                                    causal_with_mask=causal_with_mask, latent=latent, cu_seqlens_arg=cu_seqlens_arg,
                                    max_seqlen_arg=max_seqlen_arg, block_table_arg=block_table_arg,
                                    seqused_arg=seqused_arg, page_size=page_size, window_arg=window_arg,
                                    window_form=window_form))


def _declare(attention: Callable[..., Any], declaration: dict[str, Any]) -> Callable[..., Any]:
    """The plug-in attributes (docs/variants.md, plugins.declare_plugin) of an adapted kernel, from its
    declaration: the features and layouts it takes, its page size, causal alignment and what it returns."""
    d = declaration
    supports = tuple(f for f, ok in (
        ("gqa", d["gqa"]), ("score_mod", d["softcap_arg"] is not None), ("sinks", d["sink_arg"] is not None),
        ("latent", d["latent"]), ("varlen", d["layout"] == "thd"), ("paged", d["block_table_arg"] is not None),
        ("window", d["window_arg"] is not None)) if ok)
    declare_plugin(attention, supports=supports, page_size=d["page_size"], causal_alignment=d["causal"] or "top-left",
                   returns="out_lse" if d["returns"] == "out_lse" else "out",
                   lse_includes_sink=d["lse_includes_sink"])
    attention.audit_declaration = d
    return attention


def _value_kwargs(label: str, sinks: Any, score_mod: Any, scale: float | None, sink_arg: str | None,
                  softcap_arg: str | None, scale_arg: str | None) -> dict[str, Any]:
    """The sinks, soft-capping and scale of a cell under the kernel's names; Unsupported where it
    declares no argument for one the cell has."""
    kwargs: dict[str, Any] = {}
    if sinks is not None:
        if sink_arg is None:
            raise Unsupported(f"{label} declares no sinks argument (sink_arg)")
        kwargs[sink_arg] = sinks
    if score_mod is not None:
        if softcap_arg is None or getattr(score_mod, "kind", None) != "softcap":
            raise Unsupported(f"{label} declares no {score_mod.kind} argument (softcap_arg)")
        kwargs[softcap_arg] = score_mod.cap
    if scale is not None:
        if scale_arg is None:
            raise Unsupported(f"{label} declares no scale argument (scale_arg) and this cell's scale "
                              f"is not 1/sqrt(d)")
        kwargs[scale_arg] = scale
    return kwargs


def _check_window(window_arg: Any, window_form: str) -> None:
    _check("window_form", window_form, WINDOW_FORMS)
    if window_arg is not None and not isinstance(window_arg, str):
        raise UsageError(f"audit.adapt: window_arg={window_arg!r}; allowed: an argument name or None")


def _masking_kwargs(converted: tuple[Any, Any, bool], causal_arg: Any, mask_arg: str,
                    key_padding_arg: str) -> dict[str, Any]:
    """_convert_mask's (tensor mask, key padding, causal flag) under the kernel's argument names."""
    tensor_mask, key_padding, causal_flag = converted
    kwargs: dict[str, Any] = {}
    if tensor_mask is not None:
        kwargs[mask_arg] = tensor_mask
    if key_padding is not None:
        kwargs[key_padding_arg] = key_padding
    if isinstance(causal_arg, str):
        kwargs[causal_arg] = causal_flag
    elif causal_arg is not None and causal_flag:
        kwargs[causal_arg[0]] = causal_arg[1]
    return kwargs


def _window_name(label: str, window_arg: str | None) -> str:
    if window_arg is None:
        raise Unsupported(f"{label} declares no window argument (window_arg)")
    return window_arg


def _window_value(label: str, width: int, causal: bool, form: str) -> Any:
    """The sliding window of width `width` (|i - j| < width; causal cuts the right side) in the
    kernel's form (WINDOW_FORMS); Unsupported for a two-sided window the form cannot say."""
    if form == "left_right":
        return (width - 1, 0 if causal else width - 1)
    if not causal:
        raise Unsupported(f"{label} takes a window on the left of each query only ({form}); this cell's "
                          f"window is two-sided (not causal)")
    return width - 1 if form == "left" else width


def _to_layout(layout: str, q: Any, k: Any, v: Any, paged: bool) -> tuple[Any, Any, Any]:
    """(B, H, T, d) q, k, v -> the kernel's layout; a paged call's k and v are pools, left as they are."""
    if layout == "thd":
        q = to_thd(q)                                                     # (B·Tq, H, d)
        return (q, k, v) if paged else (q, to_thd(k), to_thd(v))          # (B·Tk, Hkv, d)
    if layout == "bthd":                                                  # (B, T, H, d) views, last dim contiguous
        q = q.transpose(1, 2)
        return (q, k, v) if paged else (q, k.transpose(1, 2), v.transpose(1, 2))
    return q, k, v


def _from_layout(layout: str, out: Any, batch: int) -> Any:
    """The kernel's output -> (B, H, Tq, d_v)."""
    if layout == "thd":
        return from_thd(out, batch)
    return out.transpose(1, 2) if layout == "bthd" else out


def _lse_of(lse: Any, layout: str, lse_layout: str, lse_base: float | None, batch: int) -> Any:
    """The kernel's lse -> (B, H, Tq), natural log."""
    if layout == "thd":
        lse = lse.reshape(lse.shape[0], batch, -1).transpose(0, 1)        # (H, B·Tq) -> (B, H, Tq)
    lse = lse.transpose(1, 2) if lse_layout == "bth" else lse             # (B, H, Tq)
    return lse if lse_base is None else lse * math.log(lse_base)          # log_b(x) · ln b = ln x


def _packed_names(layout: str, cu_seqlens_arg: Any, max_seqlen_arg: Any) -> tuple[tuple, tuple]:
    """((cu name for q, for k), (max name for q, for k)) of a thd kernel (one name: both the same)."""
    if layout != "thd":
        if cu_seqlens_arg is not None or max_seqlen_arg is not None:
            raise UsageError("audit.adapt: cu_seqlens_arg and max_seqlen_arg describe packed sequences: give "
                             "layout='thd'")
        return (), ()
    if cu_seqlens_arg is None:
        raise UsageError("audit.adapt: layout='thd' needs cu_seqlens_arg: the argument(s) of the cumulative "
                         "sequence offsets (one name, or (for q, for k))")

    def pair(name: str, value: Any) -> tuple:
        if value is None:
            return (None, None)
        if isinstance(value, str):
            return (value, value)
        if isinstance(value, tuple) and len(value) == 2 and all(isinstance(x, str) for x in value):
            return value
        raise UsageError(f"audit.adapt: {name}={value!r}; allowed: an argument name, (name for q, name for k) "
                         "or None")
    return pair("cu_seqlens_arg", cu_seqlens_arg), pair("max_seqlen_arg", max_seqlen_arg)


def _check_paged(block_table_arg: Any, seqused_arg: Any, page_size: Any, layout: str) -> None:
    if block_table_arg is None:
        if seqused_arg is not None or page_size is not None:
            raise UsageError("audit.adapt: seqused_arg and page_size describe a paged cache: give block_table_arg")
        return
    if not isinstance(block_table_arg, str):
        raise UsageError(f"audit.adapt: block_table_arg={block_table_arg!r}; allowed: an argument name")
    if seqused_arg is None and layout != "thd":
        raise UsageError("audit.adapt: a paged kernel needs seqused_arg (the used keys per sequence), unless it "
                         "takes them as cu_seqlens for k (layout='thd')")
    if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1):
        raise UsageError(f"audit.adapt: page_size={page_size!r}; allowed: a positive integer or None")


def _packed_kwargs(q: Any, k: Any, cu_seqlens: Any, max_seqlen: Any, seqused: Any, cu_names: tuple,
                   max_names: tuple, paged: bool) -> dict[str, Any]:
    """cu_seqlens and max_seqlen for a thd kernel: the packed cell's documents, else each batch row
    one sequence; a paged kernel without seqused_arg gets the used lengths as cu_seqlens for k."""
    import torch
    batch, tq = q.shape[0], q.shape[-2]
    if cu_seqlens is not None:
        cu_q = cu_k = cu_seqlens
        max_q = max_k = max_seqlen
    else:
        cu_q, max_q = batch_cu_seqlens(batch, tq, q.device), tq
        if paged:
            cu_k = max_k = None                  # the used lengths stand for them (seqused_arg)
        else:
            cu_k, max_k = batch_cu_seqlens(batch, k.shape[-2], q.device), k.shape[-2]
    if seqused is not None:
        cu_k = torch.nn.functional.pad(seqused.cumsum(0), (1, 0)).to(torch.int32)
        max_k = int(seqused.max())
    out = {}
    for names, values in ((cu_names, (cu_q, cu_k)), (max_names, (max_q, max_k))):
        for name, value in zip(names, values):
            if name is not None and value is not None:
                out[name] = value
    return out



def _validated(*, layout: str, causal: str | None, causal_arg: Any, masks: Iterable[str] | str, returns: str,
               lse_layout: str, lse_base: float | None, lse_includes_sink: bool) -> tuple[str, ...]:
    """adapt()'s declaration checked (UsageError naming the bad value and what is allowed); the
    mask forms as a tuple."""
    _check("layout", layout, LAYOUTS)
    _check("causal", causal, CAUSAL_KINDS)
    _check("returns", returns, RETURNS)
    _check("lse_layout", lse_layout, LSE_LAYOUTS)
    if lse_base is not None and not (isinstance(lse_base, (int, float)) and lse_base > 1):
        raise UsageError(f"audit.adapt: lse_base={lse_base!r}; allowed: a number > 1 (2 for base-2 LSEs), "
                         "or None for the natural log")
    if returns != "out_lse" and (lse_base is not None or lse_includes_sink):
        raise UsageError("audit.adapt: lse_base and lse_includes_sink describe a returned lse: give returns='out_lse'")
    masks = (masks,) if isinstance(masks, str) else tuple(masks)
    bad = [m for m in masks if m not in MASK_FORMS]
    if bad:
        raise UsageError(f"audit.adapt: masks names unknown form(s) {', '.join(map(repr, bad))}; "
                         f"allowed: {', '.join(MASK_FORMS)}")
    if causal is not None and causal_arg is None:
        raise UsageError("audit.adapt: causal is declared but causal_arg is None: name the argument "
                         "that turns it on, or give causal=None")
    if not (causal_arg is None or isinstance(causal_arg, str)
            or (isinstance(causal_arg, tuple) and len(causal_arg) == 2 and isinstance(causal_arg[0], str))):
        raise UsageError(f"audit.adapt: causal_arg={causal_arg!r}; allowed: an argument name, "
                         "(name, value) or None")
    return masks


def _convert_mask(label: str, takes: frozenset, q: Any, k: Any, mask: Any, causal: bool,
                  declared: str | None, causal_arg: Any, mask_arg: str,
                  causal_with_mask: bool = True) -> tuple[Any, Any, bool]:
    """The cell's mask and causal flag in forms the kernel takes: (tensor mask for mask_arg,
    (B, Tk) key padding, causal flag). Raises Unsupported where no declared form fits."""
    import torch

    # Causal goes to the kernel as its own flag, unless it has none, the flag shares the mask's
    # argument (xFormers' attn_bias), or the kernel refuses the flag beside a mask (SDPA's math
    # rule, causal_with_mask=False): then it is folded into the mask, in the kernel's declared
    # alignment (top-left, the contract's, when it declares none).
    shares_arg = isinstance(causal_arg, tuple) and causal_arg[0] == mask_arg
    fold = causal and (declared is None or (mask is not None and (shares_arg or not causal_with_mask)))
    if fold and not takes & {"bool", "additive"}:
        why = "no causal masking" if declared is None else f"causal and a mask both through {mask_arg!r}"
        raise Unsupported(f"{label} declares {why}, and no bool or additive mask to fold causal into")
    if mask is None and not fold:
        return None, None, causal
    tq, tk = q.shape[-2], k.shape[-2]
    if fold:
        keep = causal_keep(tq, tk, q.device, tk - tq if declared == "bottom-right" else 0)[None, None]
        if mask is None:                                                         # keep: (1, 1, Tq, Tk)
            mask = keep
        elif mask.dtype == torch.bool:
            mask = mask & keep
        else:
            mask = mask.masked_fill(~keep, float("-inf"))
        causal = False
    if mask.dtype == torch.bool:
        if "bool" in takes:
            return mask, None, causal
        if "key_padding" in takes and mask.shape[-2] == 1:                       # (B|1, 1, 1, Tk)
            return None, mask[:, 0, 0, :].expand(q.shape[0], tk), causal        # (B, Tk)
        if "additive" in takes:
            zeros = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
            return zeros.masked_fill(~mask, float("-inf")), None, causal         # (B|1, 1, Tq|1, Tk)
        form = "a per-row bool mask" if mask.shape[-2] > 1 else "a key padding mask"
        raise Unsupported(f"{label} takes masks: {', '.join(sorted(takes)) or 'none'}; this cell has {form} "
                          f"of shape {tuple(mask.shape)}")
    if "additive" in takes:
        return mask, None, causal
    raise Unsupported(f"{label} takes masks: {', '.join(sorted(takes)) or 'none'}; this cell has an additive "
                      f"float mask (its scenario tests how a kernel treats its values)")
