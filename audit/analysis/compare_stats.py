"""Statistics of `compare`: the latency ratio B/A of one cell with a confidence interval, the
run-to-run noise that widens it, floors for memory and error ratios, and `--fail-on` rules.

Pure numpy, no torch and no formatting. Deterministic: every bootstrap draws from a
generator seeded by BOOTSTRAP_SEED and the cell's id, so a comparison gives the same
intervals every time and a cell's interval does not depend on which other cells exist.

The latency statistic is a percentile bootstrap of the ratio of medians: A's and B's raw
samples are resampled independently (with replacement, as many as each has), the ratio
median(B*) / median(A*) is taken N_BOOTSTRAP times, and the central CONFIDENCE of those
ratios is the interval. Samples within one process only show within-run noise; the
run-to-run part (another process, a busy neighbour) is added in log space (widen), per cell
(cell_noise_sd): the run's part, the larger of the matched cells' spread around their variant's
median (run_noise_sd) and the two runs' canaries (canary_floor_sd), with the cell's own timing
intervals in both runs in quadrature.
"""
from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..core.dtypes import dtype_spec

BOOTSTRAP_SEED = 20261130
N_BOOTSTRAP = 2000
CONFIDENCE = 0.95
Z = 1.959963984540054            # two-sided 95% normal quantile, for the run-to-run term
# Run-to-run noise is heavy-tailed (blocks of cells measured while a neighbour was busy), so its
# SD is read from the tail: the SD of the normal distribution with the same 90th percentile of
# |residual|. A change in more than 10% of the cells beyond whole-variant shifts widens it.
# The quantile is the median-unbiased estimate (Hyndman and Fan's type 8): numpy's default
# interpolation reads a small sample's tail low (of 10 cells it is 90% the 9th largest, so one cell
# 1.5x off in one run of ten unchanged cells failed `latency:+20%`); type 8 reads 63% of the way to
# the largest of 10, the largest of 6 or fewer, and of 36 or more it still lets 8-10% of the cells
# move without setting the figure.
NOISE_QUANTILE = 0.9
NOISE_QUANTILE_METHOD = "median_unbiased"
NOISE_QUANTILE_Z = 1.6448536269514722   # |N(0, 1)|'s 90th percentile
MIN_CELLS_FOR_SPREAD = 3         # fewer residuals say nothing of the spread: the canaries' floor alone
MIN_CELLS_FOR_NOISE = 8          # fewer matched cells: the spread is a rough figure, and the page says so
# Least run-to-run noise assumed (standard deviation of log B/A): two processes on one H200
# gave 0.021 (fwd) and 0.007 (fwd+bwd) over 48 cells, a 2-core CPU 0.08-0.34 (docs/compare.md).
# A comparison's own, larger estimate replaces it.
NOISE_FLOOR_SD = 0.03
MEMORY_FLOOR_BYTES = 2 ** 20     # peaks below 1 MiB are page- and allocator-granular noise

KINDS = ("latency", "memory", "error")
SPEC_FORM = "KIND:+N% with KIND latency, memory or error (e.g. latency:+20%, memory:+10%)"


@dataclass(frozen=True)
class RatioCI:
    """B/A with its interval; method says how the interval was made."""

    ratio: float
    low: float
    high: float
    method: str

    def excludes_above(self, limit: float) -> bool:
        """The whole interval lies above `limit`."""
        return math.isfinite(self.low) and self.low > limit


NO_RATIO = RatioCI(math.nan, math.nan, math.nan, "no ratio")


def cell_seed(key: str) -> int:
    """A per-cell seed: fixed, and independent of the other cells in the comparison."""
    return BOOTSTRAP_SEED ^ zlib.crc32(key.encode("utf-8"))


def bootstrap_medians(values: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """The medians of n_boot resamples of `values` (n), drawn from `rng`: the same numbers as
    np.median(values[rng.integers(0, n, (n_boot, n))], axis=1), in a third to a quarter of the time
    (a compare of two quick runs spent 4.6 of its 7.3 s here). A resample's order is its draws'
    ranks' order, so only the middle one or two ranks of each are found, a partition of integers
    rather than a median of floats, and looked up in the sorted values. Samples with a NaN (never a
    timer's) take numpy's way, whose medians are NaN wherever a resample draws one."""
    n = values.size
    if np.isnan(values).any():
        return np.median(values[rng.integers(0, n, (n_boot, n))], axis=1)
    order = np.argsort(values, kind="stable")                                       # (n,)
    rank = np.empty(n, dtype=np.intp)
    rank[order] = np.arange(n)
    ranks = rank[rng.integers(0, n, (n_boot, n))]                                   # (n_boot, n)
    ordered = values[order]                                                         # (n,)
    mid = n // 2
    if n % 2:
        return ordered[np.partition(ranks, mid, axis=1)[:, mid]]
    middle = np.partition(ranks, (mid - 1, mid), axis=1)                            # (n_boot, n)
    return (ordered[middle[:, mid - 1]] + ordered[middle[:, mid]]) / 2


def bootstrap_ratio(a: Sequence[float], b: Sequence[float], *, seed: int = BOOTSTRAP_SEED,
                    n_boot: int = N_BOOTSTRAP, confidence: float = CONFIDENCE) -> RatioCI:
    """Percentile bootstrap of median(b) / median(a) from raw samples (seconds per call)."""
    a_arr = np.asarray(a, dtype=float)
    b_arr = np.asarray(b, dtype=float)
    if a_arr.size == 0 or b_arr.size == 0 or np.median(a_arr) <= 0:
        return NO_RATIO
    rng = np.random.default_rng(seed)
    a_boot = bootstrap_medians(a_arr, rng, n_boot)                                  # (n_boot,)
    b_boot = bootstrap_medians(b_arr, rng, n_boot)                                  # (n_boot,)
    ratios = b_boot / a_boot
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return RatioCI(float(np.median(b_arr) / np.median(a_arr)), float(low), float(high), "bootstrap")


def normal_ratio(a_median: float, a_iqr: float | None, a_n: int | None,
                 b_median: float, b_iqr: float | None, b_n: int | None) -> RatioCI:
    """Without raw samples (pytest-benchmark JSON saved without data): the standard error of
    each median from its IQR and count (1.253 σ / √n, σ = IQR / 1.349), combined in log space."""
    if not (a_median and b_median and a_median > 0 and b_median > 0):
        return NO_RATIO
    ratio = b_median / a_median
    parts = []
    for median, spread, n in ((a_median, a_iqr, a_n), (b_median, b_iqr, b_n)):
        if spread is None or not n or not math.isfinite(spread):
            return RatioCI(ratio, math.nan, math.nan, "medians only")
        parts.append((1.253 * spread / 1.349 / math.sqrt(n) / median) ** 2)
    half = Z * math.sqrt(sum(parts))
    return RatioCI(ratio, ratio * math.exp(-half), ratio * math.exp(half), "normal (IQR, n)")


def canary_floor_sd(noise_a: float | None, noise_b: float | None) -> float:
    """The least run-to-run SD of log B/A the two runs' own canaries measured (each noise figure, a
    95% bound on how far one of its times may be off for the machine alone, as log-SD log1p(n)/Z,
    the two added in quadrature); NOISE_FLOOR_SD where either run has none (no canary readings)."""
    if noise_a is None or noise_b is None:
        return NOISE_FLOOR_SD
    return math.hypot(math.log1p(noise_a), math.log1p(noise_b)) / Z


def run_noise_sd(ratios: Sequence[float], variants: Sequence[str],
                 floor_sd: float = NOISE_FLOOR_SD) -> tuple[float, float | None]:
    """(the run's part of the noise, the spread measured) as SDs of log(B/A), from the residuals:
    each cell's log ratio minus the median of its variant's (scaled by sqrt(n / (n - 1)) for a
    variant of n cells), so a change that shifts a whole variant is not noise. Spread = the
    residuals' 90th percentile of |residual| (median-unbiased: NOISE_QUANTILE_METHOD) / 1.645. A
    variant with one cell says nothing. The run's part is the larger of the spread and `floor_sd`
    (the runs' canaries: canary_floor_sd; the spread already holds what they see, so the two are
    not added); measured is None under MIN_CELLS_FOR_SPREAD residuals."""
    logs = np.log(np.asarray([r if r is not None and r > 0 else np.nan for r in ratios], dtype=float))
    names = np.asarray([str(v) for v in variants])
    residuals = []
    for name in dict.fromkeys(names):
        group = logs[(names == name) & np.isfinite(logs)]
        if group.size > 1:
            residuals.append((group - np.median(group)) * math.sqrt(group.size / (group.size - 1)))
    spread = np.concatenate(residuals) if residuals else np.empty(0)
    if spread.size < MIN_CELLS_FOR_SPREAD:
        return floor_sd, None
    measured = float(np.quantile(np.abs(spread), NOISE_QUANTILE, method=NOISE_QUANTILE_METHOD) / NOISE_QUANTILE_Z)
    return max(floor_sd, measured), measured


def cell_sd(ci_a: float | None, ci_b: float | None) -> float:
    """A cell's own timing intervals in both runs as one SD of log(B/A): each run's ci_rel (its
    median's 95% half-width over the median, core.noise.ci_rel) as log(1 + ci) / 1.96, the two in
    quadrature; a missing interval (records without one, pytest-benchmark JSON) counts 0."""
    parts = [math.log1p(float(c)) if c is not None and math.isfinite(float(c)) and c > 0 else 0.0
             for c in (ci_a, ci_b)]
    return math.hypot(*parts) / Z


def cell_noise_sd(run_sd: float, ci_a: float | None, ci_b: float | None) -> float:
    """The run-to-run SD of log(B/A) one cell's interval is widened by, the one definition the
    significance and --fail-on read: the run's part (run_noise_sd's, or --noise) and the cell's own
    intervals in both runs (cell_sd) in quadrature, as noise_rules.rerun_rel combines a cell's
    interval with its run's canary: a cell measured less surely than its neighbours may move
    further than their spread, and a burst a canary missed shows in the cells' intervals."""
    return math.hypot(run_sd, cell_sd(ci_a, ci_b))


def widen(ci: RatioCI, noise_sd: float) -> RatioCI:
    """The interval with the run-to-run term added: each half-width in log space becomes
    sqrt(half² + (Z · noise_sd)²). Conservative: the spread of ratios already holds some
    within-run noise, so that part counts twice."""
    if not (math.isfinite(ci.low) and math.isfinite(ci.high) and ci.ratio > 0):
        return ci
    extra = (Z * noise_sd) ** 2
    log_r = math.log(ci.ratio)
    down = math.sqrt((log_r - math.log(ci.low)) ** 2 + extra)
    up = math.sqrt((math.log(ci.high) - log_r) ** 2 + extra)
    return RatioCI(ci.ratio, math.exp(log_r - down), math.exp(log_r + up), ci.method + " + run-to-run")


def floored_ratio(a: float | None, b: float | None, floor: float) -> float:
    """max(b, floor) / max(a, floor): tiny values at the noise level compare as equal.
    NaN when either is missing; inf when only B is not finite (a finite error became NaN/inf)."""
    if a is None or b is None or (isinstance(a, float) and math.isnan(a) and math.isnan(b)):
        return math.nan
    a, b = float(a), float(b)
    if math.isnan(a) or math.isinf(a):
        return math.nan
    if math.isnan(b) or math.isinf(b):
        return math.inf
    return max(b, floor) / max(a, floor)


def error_floor(dtype: str) -> float:
    """The dtype's unit roundoff (core/dtypes.py): a relative error below it is what rounding the output
    to the dtype alone gives, so error ratios are taken between max(error, roundoff) values."""
    return dtype_spec(dtype).unit_roundoff


# --------------------------------------------------------------------------- --fail-on

@dataclass(frozen=True)
class Threshold:
    """Fail when a cell's `kind` ratio B/A is significantly above 1 + fraction."""

    kind: str
    fraction: float

    @property
    def limit(self) -> float:
        return 1.0 + self.fraction

    def __str__(self) -> str:
        return f"{self.kind}:+{self.fraction * 100:g}%"


_SPEC = re.compile(r"^(?P<kind>[a-z_]+):\+?(?P<pct>\d+(?:\.\d*)?|\.\d+)%$")


def parse_fail_on(specs: Iterable[str]) -> list[Threshold]:
    """'latency:+20%' (repeatable, or comma-separated) -> thresholds; one per kind, the last
    given wins. Raises ValueError naming the bad value and the allowed form."""
    found: dict[str, Threshold] = {}
    for spec in specs:
        for part in spec.split(","):
            text = part.strip()
            match = _SPEC.match(text.lower())
            if not match or match["kind"] not in KINDS:
                raise ValueError(f"--fail-on: {text!r} is not {SPEC_FORM}")
            found[match["kind"]] = Threshold(match["kind"], float(match["pct"]) / 100)
    return list(found.values())
