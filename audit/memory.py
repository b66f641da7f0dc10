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
from pathlib import Path
from typing import Any, Callable

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _malloc_trim() -> None:
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
