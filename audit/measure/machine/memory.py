"""Peak memory of one call above the baseline, in bytes.

CUDA: the caching allocator's peak (reset before, baseline subtracted).
CPU: the kernel's resident-set high-water mark. Writing 5 to /proc/self/clear_refs
resets VmHWM to the current RSS; after the call VmHWM - RSS_before is the peak.
tracemalloc and plain RSS deltas do not see torch's allocations (design.md §4).
Free heap is trimmed first so glibc's cached pages do not hide the allocation.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path
from typing import Any, Callable

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


@functools.lru_cache(maxsize=1)
def libc() -> ctypes.CDLL | None:
    """The C library, looked up once (find_library runs ldconfig); None where there is none."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def die_with_parent() -> None:
    """Linux, in a child between fork and exec: the child gets SIGKILL when its parent dies
    (kill -9 included), so no measuring process outlives the one that started it."""
    import signal
    lib = libc()
    if lib is not None and hasattr(lib, "prctl"):
        lib.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _malloc_trim() -> None:
    lib = libc()
    if lib is not None and hasattr(lib, "malloc_trim"):
        lib.malloc_trim(0)


M_TRIM_THRESHOLD = -1           # mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20   # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD_BYTES = 64 * 2**20   # what glibc sets with it (2 x the mmap threshold)


def pin_malloc_threshold() -> str:
    """Fix glibc's mmap and trim thresholds at the values its dynamic rule ends at.

    glibc raises the mmap threshold after large frees, so a tensor temporary is either
    mmapped fresh (page faults on every call) or served warm from the heap depending on
    what ran before: the same eager bf16 cell measured 5 ms or 19 ms in one session.
    Pinned at the steady state a long-running process reaches (allocations under
    32 MiB from the heap, larger ones mmapped), cells no longer depend on their order.
    peak_during still trims the heap first, so peak memory is unaffected.
    Returns a description for the record's env.
    """
    lib = libc()
    ok = lib is not None and hasattr(lib, "mallopt") \
        and lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 \
        and lib.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not ok:
        return "allocator not pinned (no glibc mallopt)"
    return (f"glibc malloc, mmap threshold pinned at {MMAP_THRESHOLD_BYTES >> 20} MiB, "
            f"trim threshold at {TRIM_THRESHOLD_BYTES >> 20} MiB")


def cpu_peak_supported() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        _status_kib("VmHWM")
        return True
    except (OSError, RuntimeError):
        return False


def peak_during(fn: Callable[[], Any], device: str) -> tuple[Any, int | None]:
    """Run `fn` once; return (its result, peak bytes above the baseline or None)."""
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        result = fn()
        torch.cuda.synchronize()
        return result, int(torch.cuda.max_memory_allocated() - base)
    if not cpu_peak_supported():
        return fn(), None
    _malloc_trim()
    base_kib = _status_kib("VmRSS")
    _CLEAR_REFS.write_text("5")
    result = fn()
    peak_kib = _status_kib("VmHWM")
    return result, max(0, peak_kib - base_kib) * 1024


def held_bytes(device: str) -> int | None:
    """Memory the process holds now: CUDA allocator bytes, or the CPU resident set after
    handing free heap back to the OS (None where it cannot be read). measure_cell compares two
    readings around a cell's timed calls to find memory a variant keeps (leaked_bytes)."""
    import gc
    gc.collect(0)           # the youngest generation only: a full collection costs ~70 ms here
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()
        return int(torch.cuda.memory_allocated())
    try:
        _malloc_trim()
        return _status_kib("VmRSS") * 1024
    except (OSError, RuntimeError):
        return None
