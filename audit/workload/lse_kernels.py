"""Built-in attention that returns its log-sum-exp (out, lse), and sinks applied through an lse.

The variants (variants.py) that use them: `flash_op` (SDPA's flash kernel called as its op, which
returns the lse) and flex's sinks (applied after attention over the keys, through flex's lse).
"""
from __future__ import annotations

from ..core.errors import Unsupported
from .draws import causal_keep
from .variant_contract import AttentionFn


def fold_causal(q, k, mask, causal):
    """A mask and causal both given: the causal part folded into the mask (SDPA refuses both)."""
    import torch
    if mask is None or not causal:
        return mask, causal
    keep = causal_keep(q.shape[-2], k.shape[-2], q.device)
    mask = (mask & keep) if mask.dtype == torch.bool else mask.masked_fill(~keep, float("-inf"))
    return mask, False


def apply_sinks_by_lse(out, lse, sinks):
    """Sinks applied after attention over the keys, through its log-sum-exp: with Z = exp(lse) the
    keys' sum and exp(sink) one more term, out · Z / (Z + exp(sink)) = out · sigmoid(lse - sink)
    (transformers' flex_attention_forward, in fp32). A row that sees no key (lse = -inf) gets 0.
    out: (B, H, Tq, d); lse: (B, H, Tq); sinks: (H,) -> (B, H, Tq, d) in out's dtype."""
    import torch
    work = torch.promote_types(out.dtype, torch.float32)                               # fp32, or float64
    weight = torch.sigmoid(lse.to(work) - sinks.to(work).view(1, -1, 1))                # (B, H, Tq)
    return (out.to(work) * weight[..., None]).to(out.dtype)


def _flash_op() -> AttentionFn:
    """SDPA's flash kernel called as its op, which returns the log-sum-exp beside out: on the CPU
    aten._scaled_dot_product_flash_attention_for_cpu (a bool mask given as an additive one in q's
    dtype: the op refuses bool), on CUDA aten._scaled_dot_product_flash_attention (no mask)."""
    import torch

    def call(q, k, v, *, mask=None, causal=False, scale=None):
        mask, causal = fold_causal(q, k, mask, causal)
        if q.device.type == "cpu":
            if mask is not None and mask.dtype == torch.bool:
                mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, causal, attn_mask=None if mask is None else mask.to(q.dtype), scale=scale)
            return out, lse                                                   # (B, H, Tq, d), (B, H, Tq)
        if mask is not None:
            raise Unsupported("aten._scaled_dot_product_flash_attention takes no attention mask on CUDA")
        if k.shape[-3] != q.shape[-3]:
            raise Unsupported("aten._scaled_dot_product_flash_attention takes no GQA on CUDA (k, v of H heads only)")
        result = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return result[0], result[1]

    return call


# The other SDPA ops that return their lse, on CUDA only: (op, its positional arguments after q, k, v,
# attn_bias and compute_log_sumexp up to is_causal: dropout_p, is_causal[, return_debug_mask]).
CUDA_LSE_OPS = {"efficient": "_scaled_dot_product_efficient_attention",
                "cudnn": "_scaled_dot_product_cudnn_attention"}


def _cuda_lse_op(kind: str):
    """aten._scaled_dot_product_{efficient,cudnn}_attention called as an op, with compute_log_sumexp:
    (out, lse). CUDA only; no mask (SDPA's frontend pads and aligns a bias for these kernels, which a
    raw call does not) and no GQA (the ops take k, v of H heads). The efficient op pads its lse to a
    multiple of 32 rows and cuDNN's has a trailing dimension of 1: both cut back to (B, H, Tq)."""
    import torch
    name = CUDA_LSE_OPS[kind]

    def call(q, k, v, *, mask=None, causal=False, scale=None):
        if q.device.type != "cuda":
            raise Unsupported(f"aten.{name} cannot run this cell on {q.device.type}: a CUDA-only op")
        if mask is not None:
            raise Unsupported(f"aten.{name} is called here without a mask (SDPA's frontend pads its bias)")
        if k.shape[-3] != q.shape[-3]:
            raise Unsupported(f"aten.{name} takes no GQA (k, v of H heads only)")
        op = getattr(torch.ops.aten, name)
        extra = (False,) if kind == "cudnn" else ()                            # return_debug_mask
        result = op(q, k, v, None, True, 0.0, causal, *extra, scale=scale)
        lse = result[1]
        lse = lse[..., 0] if lse.dim() == 4 else lse[..., : q.shape[-2]]       # (B, H, Tq)
        return result[0], lse

    return call
