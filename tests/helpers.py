"""Shared test inputs."""
from __future__ import annotations

import torch


def random_qkv(b: int = 1, h: int = 2, tq: int = 16, tk: int = 16, d: int = 8,
               dtype: torch.dtype = torch.float32, seed: int = 0, grad_out: bool = False):
    """Seeded N(0,1) q (B,H,Tq,d), k, v (B,H,Tk,d) and, if asked, an upstream gradient (B,H,Tq,d)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(b, h, tq, d), (b, h, tk, d), (b, h, tk, d)] + ([(b, h, tq, d)] if grad_out else [])
    return tuple(torch.randn(shape, generator=gen).to(dtype) for shape in shapes)
