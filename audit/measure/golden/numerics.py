"""Pure numerical metrics. Each takes tensors and returns plain Python numbers.

Adding a metric: write one function here, call it from a check in measure/checks/, add
its column to core.columns.COLUMNS.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

from ...core.dtypes import dtype_spec


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


def error_vs_reference(out: Any, golden: Any, rows: Any = None) -> dict[str, float]:
    """max abs, RMSE and relative Frobenius error of `out` against `golden`, in float64.

    rows: optional (…, Tq) bool selecting the query rows that count (fully masked
    rows, whose output is a convention, are left out). NaN/inf in `out`
    propagate into the error: a NaN error is a measurement.
    """
    import torch
    diff = out.double() - golden.double()                                     # (B, H, Tq, d)
    ref = golden.double()
    if rows is not None:
        keep = rows.expand(diff.shape[:-1])                                   # (B, H, Tq)
        diff, ref = diff[keep], ref[keep]                                      # (n_rows, d)
    if diff.numel() == 0:
        return {"max_abs_err": 0.0, "rmse": 0.0, "rel_err": 0.0}
    max_abs = float(diff.abs().max())                                         # NaN propagates
    ref_norm = float(ref.norm())
    diff_norm = float(diff.norm())
    if math.isnan(diff_norm) or ref_norm > 0:
        rel = diff_norm / ref_norm if ref_norm > 0 else math.nan
    else:
        rel = 0.0 if diff_norm == 0 else math.inf
    rmse = diff_norm / math.sqrt(diff.numel())
    return {"max_abs_err": max_abs, "rmse": rmse, "rel_err": rel}


def relative_error(value: Any, golden: Any) -> float:
    """||value - golden||_F / ||golden||_F in float64 (NaN propagates)."""
    diff_norm = float((value.double() - golden.double()).norm())
    ref_norm = float(golden.double().norm())
    if ref_norm == 0:
        return 0.0 if diff_norm == 0 else (math.nan if math.isnan(diff_norm) else math.inf)
    return diff_norm / ref_norm


# The gradient budget, per gradient, the output's rule (budget_bound) on each gradient's RMSE against the golden's:
# FlashAttention's tests hold dq, dk and dv to 2x a same-dtype PyTorch implementation's error
# (plus the reference's own rounding); PyTorch's SDPA tests use fudge factors 180 (dq), 16 (dk)
# and 4 (dv), but against an fp32 reference and a low-precision math backend, not against the
# same-dtype hand-written attention this budget compares with (docs/numerics.md: the factors).
GRADIENTS: tuple[str, ...] = ("dq", "dk", "dv")
GRAD_BUDGET_FACTOR = {"dq": 2.0, "dk": 2.0, "dv": 2.0}


# Error budget (FlashAttention's rule): err <= factor(dtype) * err(baseline) + atol(dtype),
# errors as RMSE against float64, baseline = `eager` in the same dtype on the same inputs; the
# factor (2 for every dtype) and the atol are the dtype's record's (core/dtypes.py), read by
# budget_bound alone.
def budget_bound(baseline_err: float, dtype: str, factor: float | None = None) -> float:
    """The largest error the budget allows: factor * baseline + atol(dtype), the factor the dtype's
    budget_factor unless given (a gradient's, GRAD_BUDGET_FACTOR; widened by small_sample_factor)."""
    spec = dtype_spec(dtype)
    return (spec.budget_factor if factor is None else factor) * baseline_err + spec.atol


def within_budget(err: float, baseline_err: float | None, dtype: str, factor: float | None = None) -> bool | None:
    """True/False against the budget err <= budget_bound(baseline); None when the baseline itself
    is not finite."""
    if baseline_err is None or not math.isfinite(baseline_err):
        return None
    if not math.isfinite(err):
        return False
    return err <= budget_bound(baseline_err, dtype, factor)


# A gradient budget on few values (the sinks' gradient has one per head): the ratio of two RMSEs
# of n values each carries chance of its own (squared, an F(n, n) variable when both errors are
# rounding noise of one scale), so its factor is widened to the SMALL_SAMPLE_LEVEL quantile of that
# spread: with 2 heads 2 × 31.6, with 16 heads 2 × 2.2, with thousands of values 2 × ~1.1.
SMALL_SAMPLE_LEVEL = 0.999


def small_sample_factor(n: int, level: float = SMALL_SAMPLE_LEVEL) -> float:
    """sqrt of the `level` quantile of F(n, n): how far the RMSE of n noise values can stray above
    that of n others of the same scale by chance alone (1 for n = 0: nothing to judge)."""
    if n <= 0:
        return 1.0
    lo, hi = 1.0, 1e8
    for _ in range(200):                        # bisection on the F(n, n) CDF
        mid = math.sqrt(lo * hi)
        if _f_equal_dof_cdf(mid, n) < level:
            lo = mid
        else:
            hi = mid
    return math.sqrt(hi)


def _f_equal_dof_cdf(f: float, n: int) -> float:
    """P(F <= f) for F(n, n): the regularized incomplete beta I_x(n/2, n/2), x = f / (1 + f)."""
    a = n / 2.0
    x = f / (1.0 + f)
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(2 * a) - 2 * math.lgamma(a) + a * math.log(x) + a * math.log1p(-x))
    if x < 0.5:                                  # symmetric a = b: I_x(a, a) = 1 - I_{1-x}(a, a)
        return front * _beta_fraction(a, x) / a
    return 1.0 - front * _beta_fraction(a, 1.0 - x) / a


def _beta_fraction(a: float, x: float) -> float:
    """The continued fraction of the incomplete beta I_x(a, a) (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - 2 * a * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (a - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (2 * a + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def classify_masked_rows(out: Any, rows: Any, v: Any) -> str | None:
    """What a variant returns on fully masked query rows: nan, zero, uniform, other or mixed.

    out: (B, H, Tq, d); rows: (…, Tq) bool of fully masked rows; v: (B, Hkv, Tk, d), query
    head h reading v's head h // (H / Hkv) (GQA).
    `uniform` means the mean of v over all keys (equal weight on every key), within 1%
    of (1 + |mean|) per element. Vectorized: a handful of device syncs, not one per row.
    """
    import torch
    sel = rows.expand(out.shape[:-1])                                         # (B, H, Tq)
    if not bool(sel.any()):
        return None
    o = out.double()
    mean_v = v.double().mean(dim=-2, keepdim=True)                            # (B, Hkv, 1, d)
    mean_v = mean_v.repeat_interleave(o.shape[1] // mean_v.shape[1], dim=1).expand_as(o)  # (B, H, Tq, d)
    o, mean_v = o[sel], mean_v[sel]                                           # (n, d)
    nan = torch.isnan(o).any(-1)                                              # (n,)
    zero = (o == 0).all(-1) & ~nan
    uniform = ((o - mean_v).abs() <= 1e-2 * (1.0 + mean_v.abs())).all(-1) & ~nan & ~zero
    other = ~(nan | zero | uniform)
    found = torch.stack([nan.any(), zero.any(), uniform.any(), other.any()]).tolist()
    kinds = [name for name, hit in zip(("nan", "zero", "uniform", "other"), found) if hit]
    return kinds[0] if len(kinds) == 1 else "mixed"


def changed_max(before: Any, after: Any, rows: Any) -> float:
    """Largest |after - before| on the selected rows; NaN equal to NaN counts as unchanged,
    finite turned NaN (or back) counts as inf. rows: (…, Tq) bool."""
    import torch
    sel = rows.expand(before.shape[:-1])
    a, b = before[sel].double(), after[sel].double()
    if a.numel() == 0:
        return 0.0
    both_nan = torch.isnan(a) & torch.isnan(b)
    one_nan = torch.isnan(a) ^ torch.isnan(b)
    if bool(one_nan.any()):
        return math.inf
    diff = torch.where(both_nan, torch.zeros_like(a), (a - b).abs())
    return float(diff.max())


class SaturationAccumulator:
    """Softmax saturation over query rows, accumulated chunk by chunk.

    For each row p (probabilities over its visible keys): max p, normalized
    entropy H(p) / log(n_visible), and
    whether max p > 0.99. Rows that see fewer than two keys (fully masked rows, the
    first causal row) are excluded: their one-hotness says nothing about saturation.
    Sums stay on the tensors' device until result(), so a chunk costs no device sync.
    """

    ONEHOT_THRESHOLD = 0.99

    def __init__(self) -> None:
        self._sums: Any = None   # (5,) float64: rows, sum max p, sum entropy, one-hot rows, -min entropy

    def add(self, probs: Any, visible: Any) -> None:
        """probs: (..., Tk) float64 rows summing to 1; visible: (..., Tk) bool or None."""
        import torch
        n_visible = (probs.new_full(probs.shape[:-1], probs.shape[-1]) if visible is None
                     else visible.sum(-1).to(probs.dtype))                     # (...,)
        valid = n_visible > 1  # a row seeing one key is one-hot by construction, not saturated
        pmax = probs.amax(-1)                                                  # (...,)
        entropy = -torch.special.xlogy(probs, probs).sum(-1)                   # (...,): 0 log 0 = 0
        log_n = n_visible.clamp(min=1).log()
        norm_entropy = torch.where(log_n > 0, entropy / log_n.clamp(min=1e-300), torch.zeros_like(entropy))
        zero = torch.zeros_like(pmax)
        chunk = torch.stack([
            valid.sum().to(probs.dtype),
            torch.where(valid, pmax, zero).sum(),
            torch.where(valid, norm_entropy, zero).sum(),
            (valid & (pmax > self.ONEHOT_THRESHOLD)).sum().to(probs.dtype),
            torch.where(valid, -norm_entropy, torch.full_like(zero, -math.inf)).amax()
            if valid.numel() else probs.new_tensor(-math.inf),
        ])                                                                     # (5,)
        if self._sums is None:
            self._sums = chunk
        else:
            self._sums = torch.cat([self._sums[:4] + chunk[:4], torch.maximum(self._sums[4:], chunk[4:])])

    @property
    def rows(self) -> int:
        """Rows counted so far (those seeing at least two keys)."""
        return 0 if self._sums is None else int(self._sums[0])

    def result(self) -> dict[str, float | None]:
        rows, sum_max, sum_entropy, onehot, neg_min = (self._sums.tolist() if self._sums is not None
                                                       else (0.0, 0.0, 0.0, 0.0, -math.inf))
        if rows == 0:
            return {"max_prob": None, "entropy": None, "min_entropy": None, "onehot_frac": None}
        return {"max_prob": sum_max / rows,
                "entropy": sum_entropy / rows,
                "min_entropy": -neg_min,
                "onehot_frac": onehot / rows}


def attention_flops(batch: int, heads: int, tq: int, tk: int, d: int, causal: bool, *,
                    d_v: int | None = None, pairs: int | None = None) -> int:
    """Forward FLOPs, FlashAttention convention: 2·B·H·(visible pairs)·(d + d_v), which is
    4·B·H·pairs·d when d_v = d (QKᵀ costs 2·d per pair, PV 2·d_v).

    Causal (top-left) counts only the pairs a query can see. `pairs`: the visible (query, key)
    pairs summed over batch and heads, where the scenario's own visibility is the work
    (Scenario.work_is_visible: packed documents, a paged cache's used lengths), instead of the
    causal or full count of each slice.
    """
    d_v = d if d_v is None else d_v
    if pairs is not None:
        return 2 * pairs * (d + d_v)
    if causal:
        # query i sees keys 0..min(i, tk-1): a triangle, then full rows past tk
        tri = min(tq, tk)
        pairs = tri * (tri + 1) // 2 + max(tq - tk, 0) * tk
    else:
        pairs = tq * tk
    return 2 * batch * heads * pairs * (d + d_v)


BACKWARD_FLOP_FACTOR = 2.5  # backward = 2.5 x forward (FlashAttention convention)
