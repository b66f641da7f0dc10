"""Physically possible: the least time a timed pass can take on this machine, from the work a
correct kernel must do (the visible (query, key) pairs) and the machine's measured ceilings
(machine/roofline.py); a pass faster than that by more than the ceilings' noise did not do it all."""
from __future__ import annotations

import math
from typing import Any, Callable

from ..golden.reference import visibility


# A timed pass is judged impossible when faster than the lower bound on its time by more than the
# ceilings' own noise: the spread of the ceiling's repeats (best over median, recorded with the
# ceilings) times PHYSICAL_MARGIN, and never less than PHYSICAL_MARGIN.
PHYSICAL_MARGIN = 1.25
# Bytes count toward the lower bound only past the caches: a working set smaller than this may be
# served from cache at more than the measured copy (memory) bandwidth.
CACHE_BYTES = 128 * 2**20
BACKWARD_MIN_MATMULS = 2.0   # a backward does at least two forwards' matmuls (dV, dP, dQ, dK)


def visible_pairs(inputs: Any, alignment: str = "top-left") -> int:
    """(query, key) pairs a correct kernel must compute, summed over batch and heads."""
    q, k = inputs.q, inputs.k
    B, H, tq = q.shape[0], q.shape[1], q.shape[-2]
    tk = k.shape[-2]
    vis = visibility(tq, tk, 0, tq, causal=inputs.causal, visible=inputs.visible, device=q.device,
                     alignment=alignment)
    if vis is None:
        return B * H * tq * tk
    while vis.dim() < 4:
        vis = vis[None]
    per_head = vis.expand(B, vis.shape[1], tq, tk).sum() * (H // vis.shape[1])
    return int(per_head)


def lower_bound_s(flops: float, nbytes: float, peak_flops: float, peak_bytes_per_s: float | None) -> tuple[float, str]:
    """(the least seconds a pass can take at these ceilings, how it was bound)."""
    bound_s = flops / peak_flops
    how = f"{flops / 1e9:.3g} GFLOP at {peak_flops / 1e12:.3g} TFLOP/s"
    if peak_bytes_per_s and nbytes >= CACHE_BYTES and nbytes / peak_bytes_per_s > bound_s:
        bound_s = nbytes / peak_bytes_per_s
        how = f"{nbytes / 2**20:.0f} MiB at {peak_bytes_per_s / 1e9:.3g} GB/s"
    return bound_s, how


# The best matmul FLOP/s and copy bytes/s this process has measured again, per (device, what): a
# cell that looks impossible against the run's ceilings is judged against a fresh measurement too
# (ceilings measured while the machine was busy read low, and every honest cell would look
# impossible against them): roofline.matmul_rate_now, about 40 ms.
_RECHECKED: dict[tuple[str, str], float] = {}


def rechecked_rate(device: str, what: str, measure_now: Callable[[], float]) -> float:
    """The larger of what this process measured before for (device, what) and a fresh measurement."""
    key = (device, what)
    try:
        rate = float(measure_now())
    except Exception:  # noqa: BLE001 - a failed re-measurement leaves the run's ceiling
        rate = 0.0
    _RECHECKED[key] = max(_RECHECKED.get(key, 0.0), rate if math.isfinite(rate) else 0.0)
    return _RECHECKED[key]


def physical_verdict(label: str, seconds: float | None, flops: float, nbytes: float, peak_flops: float | None,
                     peak_bytes_per_s: float | None, spread: float | None,
                     recheck: Callable[[], tuple[float, float | None]] | None = None) -> tuple[bool | None, str]:
    """(whether `seconds` is possible on this machine, what was seen) for one timed pass: impossible
    when faster than the lower bound by more than the margin, against the run's ceilings and, where
    `recheck` is given, against ceilings measured again now (the larger of each)."""
    if not seconds or seconds <= 0 or not peak_flops:
        return None, ""
    margin = PHYSICAL_MARGIN * max(1.0, spread or 1.0)
    bound_s, how = lower_bound_s(flops, nbytes, peak_flops, peak_bytes_per_s)
    if seconds * margin >= bound_s:
        return True, ""
    source = "the run's measured ceiling"
    if recheck is not None:
        fresh_flops, fresh_bytes = recheck()
        peak_flops = max(peak_flops, fresh_flops or 0.0)
        peak_bytes_per_s = max(peak_bytes_per_s or 0.0, fresh_bytes or 0.0) or None
        bound_s, how = lower_bound_s(flops, nbytes, peak_flops, peak_bytes_per_s)
        source = "the better of the run's ceiling and one measured again now"
        if seconds * margin >= bound_s:
            return True, ""
    return False, (f"{label} {seconds * 1e3:.4g} ms is {bound_s / seconds:.3g}x faster than this machine can "
                   f"compute it (at least {bound_s * 1e3:.4g} ms: {how}, {source}; margin "
                   f"{margin:.2f}x): the work is not all done")
