"""A plug-in whose every call asks for far more memory than any machine has (64 TiB).

Used by the tests (CPU) and `make gpu-check` (CUDA): the cell must be recorded as `oom`,
and the next cell of the run must be measured normally.
"""
from __future__ import annotations

TOO_MUCH_BYTES = 64 * 2**40


def allocate_too_much(q, k, v, *, mask=None, causal=False, scale=None):
    """Allocates 64 TiB on the inputs' device before attending."""
    import torch
    scratch = torch.empty(TOO_MUCH_BYTES, dtype=torch.uint8, device=q.device)
    scratch.fill_(0)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
