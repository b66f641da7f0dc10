"""A cell's peak memory before it runs, so a cell that cannot fit is `oom` in milliseconds.

Hand-written attention materializes the score matrix: its peak grows with
B·H·Tq·Tk, and at T = 65536 no device holds it (256 GiB of fp32 scores at H16).
The bytes per score element below are the lowest the shared H200 records show for
one forward+backward (peak_fwd_bwd_bytes / score elements; bf16 inputs unless
said): a lower bound, so a cell predicted not to fit cannot fit. Variants whose
memory does not grow with the score matrix (fused SDPA kernels, flex, plug-ins)
have no prediction here; a real out-of-memory still becomes `oom`. Under GQA the
variants that copy k and v once per query head (repeat_interleave, as SDPA's MATH
backend also does) hold those copies too (kv_copy_elements). Whatever the variant,
the call returns dq (B·H·Tq·d) and dk, dv (B·kv_heads·Tk·d each), all alive at its
end: a second lower bound, which is the larger one when decoding (q_len 1) against a
long key/value cache, and which shrinks with kv_heads.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..core.dtypes import dtype_spec
from ..core.grid import Case
from ..workload.variant_contract import BROKEN_PREFIX

# variant -> bytes per score element of one forward+backward, from the input dtype's size.
# eager (bf16): 8.0-10.0 = 4 x 2 bytes; eager_fp32 and sdpa_math hold fp32 scores: 16.0-23.0;
# compiled_unfused: 4.06 = 2 x 2 bytes; the negative controls are hand-written like eager.
SCORE_BYTES: dict[str, Callable[[int], int]] = {
    "eager": lambda size: 4 * size,
    "eager_fp32": lambda size: 16,
    "sdpa_math": lambda size: 16,
    "compiled_unfused": lambda size: 2 * size,
}
NEGATIVE_CONTROL_SCORE_BYTES: Callable[[int], int] = lambda size: 4 * size  # noqa: E731
# Variants whose GQA form repeats k and v per query head in memory: the hand-written ones
# (eager's repeat_interleave) and SDPA's MATH backend. Compiled code may fuse the repeat away.
KV_EXPANDING: tuple[str, ...] = ("eager", "eager_fp32", "sdpa_math")
FREE_FRACTION = 0.95   # leave the allocator some room


def score_elements(case: Case, q_len: int) -> int:
    """B·H·Tq·Tk: one per query head and (query, key) pair, whatever kv_heads is."""
    return case.batch * case.heads * q_len * case.seq_len


def kv_copy_elements(case: Case) -> int:
    """Elements of k and v repeated per query head (B·H·Tk·(d_k + d_v)) for a GQA cell of a variant
    that materializes them (KV_EXPANDING, the negative controls); 0 otherwise."""
    if not case.gqa or not (case.variant in KV_EXPANDING or case.variant.startswith(BROKEN_PREFIX)):
        return 0
    return case.batch * case.heads * case.seq_len * (case.d_k + case.effective_d_v)


def gradient_elements(case: Case, q_len: int) -> int:
    """dq, dk and dv of one forward+backward: B·H·Tq·d_k + B·kv_heads·Tk·(d_k + d_v)."""
    return case.batch * (case.heads * q_len * case.d_k
                         + case.effective_kv_heads * case.seq_len * (case.d_k + case.effective_d_v))


def predicted_peak_bytes(case: Case, q_len: int) -> tuple[int, str] | None:
    """(lower bound of one forward+backward's peak bytes, how it was computed), or None
    when this variant's memory is not predicted: the larger of the score-matrix bound (with
    GQA's k and v copies) and the gradients' bytes."""
    per_element = SCORE_BYTES.get(case.variant)
    if per_element is None and case.variant.startswith(BROKEN_PREFIX):
        per_element = NEGATIVE_CONTROL_SCORE_BYTES
    if per_element is None:
        return None
    size = dtype_spec(case.dtype).bytes
    n = score_elements(case, q_len)
    per = per_element(size)
    how = f"{per} bytes per score element × B·H·Tq·Tk = {n:.3g} elements"
    copies = kv_copy_elements(case) * size
    if copies:
        how += f", plus k and v repeated per query head ({copies:.3g} bytes)"
    grads = gradient_elements(case, q_len) * size
    if grads > n * per + copies:
        return grads, (f"the gradients dq, dk, dv: B·(H·Tq·d_k + kv_heads·Tk·(d_k + d_v)) = "
                       f"{gradient_elements(case, q_len):.3g} elements of {size} bytes (more than {how})")
    return n * per + copies, how


def free_bytes(device: str) -> int | None:
    """Memory a cell may still take: CUDA: free device memory plus the allocator's cached,
    unused blocks; CPU: MemAvailable. None where it cannot be read."""
    if device.startswith("cuda"):
        import torch
        free, _total = torch.cuda.mem_get_info()
        return int(free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated())
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def too_big(case: Case, q_len: int, free: int | None) -> str | None:
    """The `oom` reason when the cell's predicted peak exceeds what is free, else None."""
    predicted = predicted_peak_bytes(case, q_len)
    if predicted is None or free is None:
        return None
    need, how = predicted
    held = held_copy_bytes(case, q_len)
    if need + held <= FREE_FRACTION * free:
        return None
    return (f"predicted peak {gib(need)} for one forward+backward ({how}), plus {gib(held)} of the first "
            f"run's out and gradients the determinism check keeps, exceeds the {gib(free)} free on "
            f"{case.device}; not run")


def held_copy_bytes(case: Case, q_len: int) -> int:
    """What the determinism check (measure/cell/repeats.py) holds while the cell runs: the first run's
    out (B·H·Tq·d_v) and gradients, in the input dtype: memory beside the peak, not in it."""
    size = dtype_spec(case.dtype).bytes
    return (case.batch * case.heads * q_len * case.effective_d_v + gradient_elements(case, q_len)) * size
