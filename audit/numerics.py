"""Pure numerical metrics. Each takes tensors and returns plain Python numbers.

Adding a metric: write one function here, call it in runner.measure_cell, add
its column to records.COLUMNS.
"""
from __future__ import annotations

import math
from typing import Any, Iterable


def nonfinite_counts(tensors: Iterable[Any]) -> tuple[int, int]:
    """(NaN count, inf count) over all given tensors (None entries ignored)."""
    import torch
    nan = inf = 0
    for t in tensors:
        if t is None:
            continue
        nan += int(torch.isnan(t).sum())
        inf += int(torch.isinf(t).sum())
    return nan, inf


def error_vs_reference(out: Any, golden: Any) -> dict[str, float]:
    """max |out - golden| and ||out - golden||_F / ||golden||_F, in float64.

    NaN/inf in `out` propagate into the error (a NaN error is a measurement).
    """
    diff = out.double() - golden.double()
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    ref_norm = float(golden.double().norm())
    diff_norm = float(diff.norm())
    if math.isnan(diff_norm) or ref_norm > 0:
        rel = diff_norm / ref_norm if ref_norm > 0 else math.nan
    else:
        rel = 0.0 if diff_norm == 0 else math.inf
    return {"max_abs_err": max_abs, "rel_err": rel}


class SaturationAccumulator:
    """Softmax saturation over query rows, accumulated chunk by chunk.

    For each row p (probabilities over its visible keys): max p, normalized
    entropy H(p) / log(n_visible) (rows with one visible key count as 0), and
    whether max p > 0.99. Fully masked rows (no visible key) are excluded.
    """

    ONEHOT_THRESHOLD = 0.99

    def __init__(self) -> None:
        self.rows = 0
        self.sum_max = 0.0
        self.sum_entropy = 0.0
        self.onehot = 0

    def add(self, probs: Any, visible: Any) -> None:
        """probs: (..., Tk) float64 rows summing to 1; visible: (..., Tk) bool or None."""
        import torch
        n_visible = (probs.new_full(probs.shape[:-1], probs.shape[-1]) if visible is None
                     else visible.sum(-1).to(probs.dtype))                     # (...,)
        valid = n_visible > 0
        pmax = probs.amax(-1)                                                  # (...,)
        plogp = torch.where(probs > 0, probs * probs.log(), torch.zeros_like(probs))
        entropy = -plogp.sum(-1)                                               # (...,)
        log_n = n_visible.clamp(min=1).log()
        norm_entropy = torch.where(log_n > 0, entropy / log_n.clamp(min=1e-300), torch.zeros_like(entropy))
        self.rows += int(valid.sum())
        self.sum_max += float(pmax[valid].sum())
        self.sum_entropy += float(norm_entropy[valid].sum())
        self.onehot += int((pmax[valid] > self.ONEHOT_THRESHOLD).sum())

    def result(self) -> dict[str, float | None]:
        if self.rows == 0:
            return {"max_prob": None, "entropy": None, "onehot_frac": None}
        return {"max_prob": self.sum_max / self.rows,
                "entropy": self.sum_entropy / self.rows,
                "onehot_frac": self.onehot / self.rows}


def attention_flops(batch: int, heads: int, tq: int, tk: int, d: int, causal: bool) -> int:
    """Forward FLOPs, FlashAttention convention: 4·B·H·(visible pairs)·d.

    Causal (top-left) counts only the pairs a query can see.
    """
    if causal:
        # query i sees keys 0..min(i, tk-1): a triangle, then full rows past tk
        tri = min(tq, tk)
        pairs = tri * (tri + 1) // 2 + max(tq - tk, 0) * tk
    else:
        pairs = tq * tk
    return 4 * batch * heads * pairs * d


BACKWARD_FLOP_FACTOR = 2.5  # backward = 2.5 x forward (FlashAttention convention)
