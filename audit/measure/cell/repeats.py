"""Run-to-run determinism: are a variant's out, dq, dk and dv bitwise identical when it runs
again on identical inputs?

Several GPU backward kernels are not (FlashAttention-2's dQ and cuDNN's backward add with
atomics; the memory-efficient backward with split keys too), and training reproducibility
depends on it. measure_cell already runs every cell's forward three times on the same
inputs (the warm-up call, the numerics call and the warm-up forward+backward's forward), and
forward+backward more (the warm-up
call, the numerics call, then the timed calls, of which the last one's gradients are kept);
Repeats compares the later runs of each tensor against the first, so the check costs a
comparison per tensor and one held copy of the first run, not extra calls.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Iterator

from ...core.defects import REPEATED_TENSORS


def bitwise_equal(a: Any, b: Any) -> bool:
    """True when a and b hold the same bits (NaN equal to the same NaN, -0.0 unequal to 0.0)."""
    import torch
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.contiguous().view(bits), b.contiguous().view(bits)))


def largest_difference(a: Any, b: Any) -> float:
    """max |a - b| in float64; inf where one is NaN and the other not (NaN = NaN counts as 0)."""
    import torch
    x, y = a.double(), b.double()
    nan_x, nan_y = torch.isnan(x), torch.isnan(y)
    if bool((nan_x ^ nan_y).any()):
        return math.inf
    diff = torch.where(nan_x, torch.zeros_like(x), (x - y).abs())
    return float(diff.max()) if diff.numel() else 0.0


class Repeats:
    """The first run of each named tensor, and which later runs differed from it (and by how much)."""

    def __init__(self) -> None:
        self._first: dict[str, Any] = {}
        self._runs: dict[str, int] = {}
        self._max_diff: dict[str, float] = {}

    def add(self, name: str, tensor: Any) -> None:
        """One run's `name` (out, dq, dk or dv): kept if it is the first, else compared with it."""
        t = tensor.detach()
        self._runs[name] = self._runs.get(name, 0) + 1
        if name not in self._first:
            self._first[name] = t.clone()
            return
        if not bitwise_equal(self._first[name], t):
            self._max_diff[name] = max(self._max_diff.get(name, 0.0), largest_difference(self._first[name], t))

    def differing(self) -> list[str]:
        """The names whose runs so far were not all bitwise identical."""
        return list(self._max_diff)

    def first(self, name: str) -> Any:
        """The held first run of `name` (a copy taken when it was added), or None."""
        return self._first.get(name)

    def add_grads(self, grads: tuple[Any, Any, Any]) -> None:
        for name, grad in zip(REPEATED_TENSORS[1:], grads):
            self.add(name, grad)

    def columns(self) -> dict[str, Any]:
        """repeat_runs, repeat_differs (names not bitwise identical, in REPEATED_TENSORS order) and
        repeat_max_diff; null columns when nothing ran twice."""
        repeated = [n for n in REPEATED_TENSORS if self._runs.get(n, 0) >= 2]
        if not repeated:
            return {"repeat_runs": None, "repeat_differs": None, "repeat_max_diff": None}
        differs = [n for n in repeated if n in self._max_diff]
        return {"repeat_runs": min(self._runs[n] for n in repeated),
                "repeat_differs": differs,
                "repeat_max_diff": max((self._max_diff[n] for n in differs), default=0.0)}

    def release(self) -> None:
        """Drop the held first runs (their memory) once every run is in."""
        self._first.clear()


def deterministic_algorithms_enabled() -> bool:
    """Whether torch.use_deterministic_algorithms(True) is in force (--deterministic)."""
    import torch
    return bool(torch.are_deterministic_algorithms_enabled())


# CUDA: cuBLAS is deterministic only with a fixed workspace configuration, set before the
# process's first cuBLAS call; torch refuses matmuls in deterministic mode without it.
CUBLAS_WORKSPACE = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def refuses_determinism(exc: BaseException) -> bool:
    """An operation's refusal under torch.use_deterministic_algorithms(True), as torch words it
    ("... does not have a deterministic implementation, but you set
    'torch.use_deterministic_algorithms(True)'"), not any error that mentions determinism."""
    return isinstance(exc, RuntimeError) and "use_deterministic_algorithms" in str(exc)


@contextlib.contextmanager
def deterministic_algorithms(on: bool) -> Iterator[None]:
    """torch.use_deterministic_algorithms(True) for the block when `on`, restored after."""
    if not on:
        yield
        return
    import torch
    before = torch.are_deterministic_algorithms_enabled()
    os.environ.setdefault(*CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)
