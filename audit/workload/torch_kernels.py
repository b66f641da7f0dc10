"""The built-ins that call torch's own kernels: torch.compile of the hand-written math, SDPA
(the dispatcher's choice or one forced backend) and FlexAttention (compiled or eager), each as a
callable of the variant contract (variant_contract.py); and the reasons SDPA declines a cell.
variants.py registers them.
"""
from __future__ import annotations

from typing import Callable

from ..core.errors import BackwardUnsupported, Unsupported
from .compiling import _compiled_fn, compiled_flex_attention
from .eager import eager_attention
from .lse_kernels import apply_sinks_by_lse
from .lse_kernels import fold_causal as _fold_causal
from .variant_contract import AttentionFn
from .varlen import document_owner

SDPA_NO_SCORE_MOD = ("scaled_dot_product_attention has no score modification argument; "
                     "soft-capping would need the scores it never materializes")
SDPA_NO_SINKS = "scaled_dot_product_attention has no sink argument"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


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

