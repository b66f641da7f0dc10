"""Scenario -> (q, k, v, mask, grad_out), seeded and deterministic.

Inputs are drawn in fp32 on the CPU from a generator seeded by the cell's input
key, then rounded to the cell's dtype and moved to its device, so every variant
and every device sees bit-identical inputs for the same input set.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from .grid import Case

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def torch_dtype(name: str):
    import torch
    return getattr(torch, TORCH_DTYPES[name])


@dataclass
class Inputs:
    """Tensors of one input set. q, k, v are leaves; `mask` may be None."""

    q: Any          # (B, H, Tq, d)
    k: Any          # (B, H, Tk, d)
    v: Any          # (B, H, Tk, d)
    grad_out: Any   # (B, H, Tq, d): the upstream gradient for the backward pass
    mask: Any = None
    causal: bool = False


def seed_for(case: Case) -> int:
    """Deterministic 31-bit seed from the input key (same for every variant)."""
    return zlib.crc32(repr(case.input_key).encode()) & 0x7FFFFFFF


def make_inputs(case: Case) -> Inputs:
    import torch

    gen = torch.Generator().manual_seed(seed_for(case))
    shape_q = (case.batch, case.heads, case.seq_len, case.d_k)      # (B, H, T, d)
    shape_kv = (case.batch, case.heads, case.seq_len, case.d_k)
    if case.scenario != "normal":
        raise ValueError(f"unknown scenario {case.scenario!r}")
    dtype = torch_dtype(case.dtype)

    def draw(shape):
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=case.device, dtype=dtype)

    q, k, v = draw(shape_q), draw(shape_kv), draw(shape_kv)
    grad_out = draw(shape_q)
    return Inputs(q=q, k=k, v=v, grad_out=grad_out, mask=None, causal=case.causal)
