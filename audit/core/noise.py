"""How well a timed median is known: the distribution-free confidence interval of a median, and the
rule that keeps a measurement sampling until that interval is narrow enough.

A shared machine's neighbour makes one cell's five samples read 179, 292, 392, 181 and 223 ms
(a 2-core EPYC runner): the median, 223 ms, is then known to no better than ±40%. The
interval is made from order statistics, not a normal approximation: samples of a busy machine
are skewed and bimodal, and the order statistics' coverage holds whatever their distribution.
Pure Python: nothing here imports torch (measure/machine/canary.py times the reference cell).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

CONFIDENCE = 0.95        # the median's interval: two-sided, at least this coverage
# default --noise-target: keep sampling until the median is known to ±5%. ±3% (the first choice) was
# out of reach within the caps on an idle 2-core Xeon VM: 1-2 of 18 quick cells flagged with 2 threads,
# and 14 of 20 beside one busy core; ±5% flagged 0 of 20 twice (docs/measurement.md, Timing noise).
# An H200's device-timed medians: ±0.3% median, 1 of 146 over ±3%.
NOISE_TARGET = 0.05
NOISE_TARGET_ENV = "ATTN_AUDIT_NOISE_TARGET"   # percent: another default (0: judge nothing; the tests' own)


def default_noise_target() -> float:
    """--noise-target's default, a fraction: $ATTN_AUDIT_NOISE_TARGET (percent) where set, else
    NOISE_TARGET. Raises UsageError naming a value that is not a percentage from 0 to 100."""
    raw = os.environ.get(NOISE_TARGET_ENV, "").strip()
    if not raw:
        return NOISE_TARGET
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value < 100:
        from .errors import UsageError
        raise UsageError(f"{NOISE_TARGET_ENV}: {raw!r} is not a percentage from 0 to 100 (0: judge nothing)")
    return value / 100


CHECK_EVERY = 4          # samples between two looks at the interval, or a twentieth of those taken,
                         # whichever is more (sorting 500 samples: ~60 µs; ~60 looks at most)


def _coverage(n: int, j: int) -> float:
    """P(x_(j) <= median <= x_(n+1-j)) for n samples of any continuous distribution:
    1 - 2 P(Binomial(n, 1/2) <= j - 1)."""
    tail = sum(math.comb(n, i) for i in range(j)) / 2.0 ** n
    return 1.0 - 2.0 * tail


@lru_cache(maxsize=1024)
def _rank(n: int, confidence: float) -> int:
    """The largest j whose order statistics x_(j), x_(n+1-j) cover the median with at least
    `confidence` (0: none does). O(n) exact integers, once per n: each look of the sampling rule
    used to sum binomials afresh (1.6 ms for 200 samples)."""
    allowed = (1.0 - confidence) / 2 * 2 ** n          # P(B <= j - 1) <= (1 - confidence) / 2, scaled
    term, below, j = 1, 0, 0                            # term = C(n, i); below = sum of C(n, k), k < i
    for i in range((n + 1) // 2):
        below += term
        if below > allowed:
            break
        j = i + 1
        term = term * (n - i) // (i + 1)
    return j


@lru_cache(maxsize=8)
def _first_interval_n(confidence: float) -> int:
    """The fewest samples with a `confidence` interval of the median (6 at 95%)."""
    return next(n for n in range(1, 64) if _rank(n, confidence))


def median_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """(low, high): the order statistics x_(j) and x_(n+1-j) with the largest j whose coverage is at
    least `confidence`; None for fewer samples than that takes (6 at 95%)."""
    n = len(values)
    j = _rank(n, confidence) if n else 0
    if j == 0:
        return None
    ordered = sorted(values)
    return ordered[j - 1], ordered[n - j]


def ci_rel(values: Sequence[float], confidence: float = CONFIDENCE) -> float | None:
    """The interval's half-width over the median (0.03: the median is known to ±3%). Under the
    samples a 95% interval takes (a slow cell stopped by its cap), the whole range stands in (its
    coverage 1 - 2^(1-n): 94% for 5 samples, 75% for 3); None for one sample or a zero median."""
    n = len(values)
    if n < 2:
        return None
    ordered = sorted(values)                  # once: the sampling rule asks this every few samples
    j = _rank(n, confidence) or 1             # no 95% interval: the whole range
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return (ordered[n - j] - ordered[j - 1]) / 2 / median if median > 0 else None


@dataclass(frozen=True)
class SamplingRule:
    """When a measurement may stop: once its fixed minimum (samples, seconds) is met, it samples
    on while its median's interval is wider than ±target, for at most cap_s more seconds (and
    timing.MAX_SAMPLES samples). target None or 0: the fixed minimum only."""

    target: float | None = None
    cap_s: float = 0.0

    def more(self, per_call_s: Sequence[float], extra_s: float) -> bool:
        """Whether to take another sample after the minimum, `extra_s` seconds spent beyond it."""
        if not self.target or extra_s >= self.cap_s:
            return False
        n, first = len(per_call_s), _first_interval_n(CONFIDENCE)
        if n < first:                         # no 95% interval yet (under 6 samples): three samples' narrow
            return True                       # range covers the median 75% of the time, not 95%
        if (n - first) % max(CHECK_EVERY, n // 20) and extra_s > 0:
            return True                       # between two looks: keep going
        width = ci_rel(per_call_s)
        return width is None or width > self.target
