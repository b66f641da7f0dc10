"""The seed tutorial's printed claims, measured (../shared/seed/, Chinese).

The tutorial prints sample outputs "roughly like" its numbers; this module
repeats each experiment with a fixed seed and sets the printed value beside the
measured one. Written to DIR/seed_claims.csv with columns
claim, d_k, seed_value, measured_value, holds.

`holds` for a printed number: the measured value is within 25% of it (std
claims: within 0.05 of the expected value); for a yes/no claim: the measured
behaviour matches.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from ..core.runfolder import SEED_CLAIMS_FILE

COLUMNS = ("claim", "d_k", "seed_value", "measured_value", "holds")
REL_TOL = 0.25

# scaling_demo(): d_k -> (score min, score max, std, max_weight) as printed
SCALED_PRINTED = {16: (-4.32, 4.15, 1.00, 0.1234), 32: (-3.89, 3.76, 1.00, 0.0912),
                  64: (-3.45, 3.54, 1.00, 0.0723), 128: (-3.12, 3.21, 1.00, 0.0567)}
# no_scaling_demo(): d_k -> (std, max_weight) as printed
UNSCALED_PRINTED = {64: (8.0, 0.9876), 128: (11.3, 0.9992)}


def _close(measured: float, printed: float, tol: float = REL_TOL) -> bool:
    return abs(measured - printed) <= tol * abs(printed)


def _row(claim: str, d_k: int | None, seed_value: Any, measured: Any, holds: bool) -> dict:
    if isinstance(measured, float):
        measured = float(f"{measured:.6g}")
    return {"claim": claim, "d_k": d_k, "seed_value": seed_value, "measured_value": measured,
            "holds": bool(holds)}


def measure_claims(seed: int = 0) -> list[dict]:
    """Run the seed's experiments (1000 × d_k N(0,1) q and k, as in the tutorial)."""
    import torch
    import torch.nn.functional as F

    from ..workload.controls import broken_clamped_probs
    from ..workload.eager import eager_attention, eager_probs

    gen = torch.Generator().manual_seed(seed)
    rows: list[dict] = []
    for d_k, (lo, hi, std, max_w) in SCALED_PRINTED.items():
        q = torch.randn(1000, d_k, generator=gen)
        k = torch.randn(1000, d_k, generator=gen)
        dots = (q @ k.T) / d_k ** 0.5                                          # (1000, 1000)
        weight = float(F.softmax(dots[:1], dim=-1).max())
        rows += [
            _row("scaled scores: std", d_k, std, float(dots.std()), abs(float(dots.std()) - 1.0) <= 0.05),
            _row("scaled scores: min", d_k, lo, float(dots.min()), _close(float(dots.min()), lo)),
            _row("scaled scores: max", d_k, hi, float(dots.max()), _close(float(dots.max()), hi)),
            _row("scaled: max attention weight of row 0", d_k, max_w, weight, _close(weight, max_w)),
        ]
    for d_k, (std, max_w) in UNSCALED_PRINTED.items():
        q = torch.randn(1000, d_k, generator=gen)
        k = torch.randn(1000, d_k, generator=gen)
        dots = q @ k.T                                                         # (1000, 1000)
        weight = float(F.softmax(dots[:1], dim=-1).max())
        rows += [
            _row("unscaled scores: std ≈ sqrt(d_k)", d_k, std, float(dots.std()),
                 abs(float(dots.std()) - d_k ** 0.5) <= 0.05 * d_k ** 0.5),
            _row("unscaled: max attention weight of row 0", d_k, max_w, weight, _close(weight, max_w)),
            _row("unscaled: row 0 near one-hot (max weight > 0.9)", d_k, True, weight > 0.9, weight > 0.9),
        ]

    # demonstrate_mask_timing(): mask after softmax, renormalized, "breaks" the distribution.
    scores = torch.tensor([2.0, 1.0, 0.5])
    keep = torch.tensor([True, True, False])
    right = F.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    wrong = F.softmax(scores, dim=-1) * keep.float()
    wrong = wrong / wrong.sum()
    rows += [
        _row("mask after softmax (renormalized): weights no longer sum to 1", None, True,
             float(wrong.sum()), abs(float(wrong.sum()) - 1.0) > 1e-6),
        _row("mask after softmax (renormalized) gives different weights than before", None, True,
             float((right - wrong).abs().max()), float((right - wrong).abs().max()) > 1e-6),
    ]

    # Fully masked rows give NaN: true of hand-written attention, not of SDPA.
    q = torch.randn(1, 1, 4, 8, generator=gen)
    k = torch.randn(1, 1, 4, 8, generator=gen)
    v = torch.randn(1, 1, 4, 8, generator=gen)
    none = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    eager_out = eager_attention(q, k, v, mask=none)
    sdpa_out = F.scaled_dot_product_attention(q, k, v, attn_mask=none)
    rows += [
        _row("fully masked row gives NaN (hand-written softmax)", None, "NaN",
             "NaN" if bool(eager_out.isnan().all()) else "finite", bool(eager_out.isnan().all())),
        _row("fully masked row gives NaN (F.scaled_dot_product_attention)", None, "NaN",
             "NaN" if bool(sdpa_out.isnan().any()) else f"{float(sdpa_out.abs().max()):g} (zeros)",
             bool(sdpa_out.isnan().any())),
    ]

    # Causal masking: upper triangle of the weights is 0; the "production" class's clamp is not.
    T = 6
    q = torch.randn(1, T, 16, generator=gen)
    k = torch.randn(1, T, 16, generator=gen)
    causal_w = eager_probs(q, k, causal=True)                                  # (1, T, T)
    clamped_w = broken_clamped_probs(q, k, causal=True)
    rows += [
        _row("causal mask: upper-triangle weight sum ≈ 0", None, 0.0,
             float(causal_w[0].triu(1).sum()), float(causal_w[0].triu(1).sum()) < 1e-6),
        _row("clamp(min=1e-6) class: future positions get 0 weight", None, True,
             float(clamped_w[0].triu(1).max()), float(clamped_w[0].triu(1).max()) == 0.0),
        _row("clamp(min=1e-6) class: rows still sum to 1", None, True,
             float((clamped_w.sum(-1) - 1).abs().max()), float((clamped_w.sum(-1) - 1).abs().max()) < 1e-6),
        # test_single_head_full(): `row[T:]` on a length-T row is always empty.
        _row("seed test checks future positions (row[T:] elements examined)", None, T - 1,
             int(causal_w[0, 0][T:].numel()), int(causal_w[0, 0][T:].numel()) > 0),
    ]
    return rows


def write_claims(run_dir: str | Path) -> Path:
    path = Path(run_dir) / SEED_CLAIMS_FILE
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in measure_claims():
            writer.writerow(row)
    return path
