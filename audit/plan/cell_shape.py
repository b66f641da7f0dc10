"""What a cell's cost depends on, known from its Case alone: its shape (FLOPs, score elements, mask),
the features its per-call time is a combination of (call_features: FLOPs over this machine's measured
matmul and attention rates, score bytes over its copy bandwidth), its golden's size, and the few
properties of a variant the cost model asks about. Pure Python + numpy: no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..core.dtypes import dtype_spec
from ..core.grid import Case
from ..measure.golden.numerics import attention_flops
from ..workload.variant_contract import BROKEN_PREFIX
from .cell_work import device_type
from .settings import Settings

PROBS_VARIANTS = ("eager", "eager_fp32")     # and the negative controls (BROKEN_PREFIX)


@dataclass(frozen=True)
class CellShape:
    """What a cell's cost depends on, without torch."""

    case: Case
    q_len: int
    flops: float          # forward FLOPs (per query head: GQA does not change them)
    score_elems: float    # B·H·Tq·Tk, plus GQA's copies of k and v per query head where made
    mask: tuple | None    # (kind, shape) of the mask tensor, or None

    @classmethod
    def of(cls, case: Case) -> "CellShape":
        from ..workload.inputs import mask_shape, q_len
        from .memory_model import kv_copy_elements
        tq = q_len(case)
        return cls(case, tq, float(attention_flops(case.batch, case.heads, tq, case.seq_len, case.d_k,
                                                   case.causal, d_v=case.effective_d_v)),
                   float(case.batch * case.heads * tq * case.seq_len + kv_copy_elements(case)),
                   mask_shape(case))


def call_features(shape: CellShape, ceilings: Mapping[str, Any] | None) -> np.ndarray:
    """[1, F/P_dtype, F/P_fp32, S·size/BW, F/A_dtype] for one forward, from the device's ceilings;
    P_fp32 the rate of the dtype a kernel may upcast to (core/dtypes.py: fp32 for every dtype today);
    A_dtype the measured attention probe's rate in the cell's dtype (roofline._attention_rate: a fused
    kernel's speed in a dtype is not that dtype's matmul's), P_dtype where none was measured (a GPU,
    ceilings of an older run, a dtype the probe's kernel refused)."""
    c = ceilings or {}
    spec = dtype_spec(shape.case.dtype)
    rates = c.get("matmul_flops_per_s") or {}
    p_dt = rates.get(spec.name) or rates.get(spec.upcast) or 1e11
    p_32 = rates.get(spec.upcast) or p_dt
    a_dt = (c.get("attention_flops_per_s") or {}).get(spec.name) or p_dt
    bw = c.get("copy_bytes_per_s") or 2e10
    size = spec.bytes
    return np.array([1.0, shape.flops / p_dt, shape.flops / p_32, shape.score_elems * size / bw, shape.flops / a_dt])


N_CALL_FEATURES = 5


def measured_attention(ceilings: Mapping[str, Any] | None) -> bool:
    """Whether these ceilings carry the attention probe (call_features' last feature is its own)."""
    return any((ceilings or {}).get("attention_flops_per_s", {}).values()) if isinstance(ceilings, Mapping) else False


def golden_cost_inputs(shape: CellShape, settings: Settings) -> tuple[float, float, float]:
    """(slices covered, float64 FLOPs, chunks) of the golden of this cell's input set."""
    from ..measure.golden.reference import golden_flops, golden_slices
    case = shape.case
    dev = device_type(case.device)
    slices = (golden_slices(case.batch, case.heads, shape.q_len, case.seq_len, case.d_k, case.causal, dev,
                            kv_heads=case.effective_kv_heads, d_v=case.effective_d_v)
              if settings.golden == "subset" else None)
    n = case.batch * case.heads if slices is None else len(slices)
    flops = n * golden_flops(shape.q_len, case.seq_len, case.d_k, case.causal, case.effective_d_v)
    chunk_bytes = settings.cuda_chunk_bytes if dev == "cuda" else settings.cpu_chunk_bytes
    rows = max(1, chunk_bytes // max(1, n * case.seq_len * 8))
    return float(n), flops, float(math.ceil(shape.q_len / rows))


def exposes_weights(variant: str) -> bool:
    return variant in PROBS_VARIANTS or variant.startswith(BROKEN_PREFIX)


CUDNN_VARIANTS = ("sdpa", "sdpa_cudnn")


def cudnn_config(shape: CellShape) -> tuple | None:
    """The configuration cuDNN builds an execution plan for (the H200 records: a new one costs
    1-2 s in the first `sdpa` or `sdpa_cudnn` cell that uses it); None for other cells (and for a
    dtype cuDNN does not take: core/dtypes.py, fused_kernels)."""
    case = shape.case
    if device_type(case.device) != "cuda" or case.variant not in CUDNN_VARIANTS \
            or not dtype_spec(case.dtype).fused_kernels:
        return None
    return case.dtype, case.d_k, case.d_v, case.causal, shape.mask
