"""Faulty attention plug-ins: what a user's broken kernel does to a run (tests/test_faults.py).

Each is `fn(q, k, v, *, mask=None, causal=False, scale=None)`, correct SDPA except for its fault.
"""
from __future__ import annotations

import os
import signal
import time

import torch
import torch.nn.functional as F

LEAKED: list = []


def _sdpa(q, k, v, mask=None, causal=False, scale=None):
    if mask is not None and causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        mask = (mask & keep) if mask.dtype == torch.bool else mask.masked_fill(~keep, float("-inf"))
        causal = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def raises(q, k, v, *, mask=None, causal=False, scale=None):
    """Raises ValueError."""
    raise ValueError("this kernel does not support d_k=32")


def returns_nan(q, k, v, *, mask=None, causal=False, scale=None):
    """Returns NaN everywhere (still differentiable)."""
    return _sdpa(q, k, v, mask, causal, scale) * float("nan")


def segfaults(q, k, v, *, mask=None, causal=False, scale=None):
    """Kills its own process with SIGSEGV, as a bad pointer in a C++ extension would."""
    os.kill(os.getpid(), signal.SIGSEGV)


def exits(q, k, v, *, mask=None, causal=False, scale=None):
    """Calls os._exit(3), as a library's fatal error handler might."""
    os._exit(3)


def wrong_last_dim(q, k, v, *, mask=None, causal=False, scale=None):
    """Returns (B, H, Tq, d/2)."""
    return _sdpa(q, k, v, mask, causal, scale)[..., : q.shape[-1] // 2]


def returns_none(q, k, v, *, mask=None, causal=False, scale=None):
    """Returns None."""
    _sdpa(q, k, v, mask, causal, scale)
    return None


def returns_float64(q, k, v, *, mask=None, causal=False, scale=None):
    """Returns float64 for float32 inputs."""
    return _sdpa(q, k, v, mask, causal, scale).double()


def allocates_64_tib(q, k, v, *, mask=None, causal=False, scale=None):
    """Allocates 64 TiB on the inputs' device."""
    torch.empty(64 * 2**40, dtype=torch.uint8, device=q.device).fill_(0)
    return _sdpa(q, k, v, mask, causal, scale)


def hangs(q, k, v, *, mask=None, causal=False, scale=None):
    """Sleeps for an hour: a deadlocked kernel."""
    time.sleep(3600)
    return _sdpa(q, k, v, mask, causal, scale)


class _HangInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(3600)
        return grad


def hangs_in_backward(q, k, v, *, mask=None, causal=False, scale=None):
    """Forward is fine; its backward sleeps for an hour."""
    return _HangInBackward.apply(_sdpa(q, k, v, mask, causal, scale))


def leaks(q, k, v, *, mask=None, causal=False, scale=None):
    """Keeps a 2 MiB tensor from every call in a module-level list."""
    LEAKED.append(torch.ones(512 * 1024, dtype=torch.float32, device=q.device))     # 2 MiB
    return _sdpa(q, k, v, mask, causal, scale)


class CompileFailed(RuntimeError):
    """Stands in for Inductor's CppCompileError: the compiler's output is in its message."""


_SHAPES: list = []        # fails_on_recompile: the shapes it has "compiled" in this process


def fails_on_recompile(q, k, v, *, mask=None, causal=False, scale=None):
    """Right on the first shape it sees in a process; on any other shape after it, fails as a
    recompile of a compiled function can (hf:flex_attention on the CPU, docs/variants.md): an
    error whose first line says little, raised from one whose message holds the compiler's line."""
    shape = tuple(q.shape)
    if _SHAPES and shape not in _SHAPES:
        try:
            raise CompileFailed("C++ compile error\n\nOutput:\n/tmp/inductor/cabc.main.cpp:65:51: error: operands to "
                                "'?:' have different types 'VecMask<int, 1>' and 'VecMask<float, 1>'\n   65 | ...")
        except CompileFailed as exc:
            raise RuntimeError("backend compiler failed") from exc
    _SHAPES.append(shape)
    return _sdpa(q, k, v, mask, causal, scale)
