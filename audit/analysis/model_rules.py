"""The model audit's records judged (measure/model_audit.py): a variant whose error through the decoder
grows past sdpa's in the same model and dtype, or that flips a next token sdpa does not."""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ..core.dtypes import dtype_spec
from ..workload.model import DECISIVE_MARGIN
from .finding_rows import _finding

# The yardstick: what a transformers model runs by default, sdpa; where it cannot run (a model with sinks:
# transformers' gpt-oss runs eager), eager
MODEL_BASELINES: tuple[str, ...] = ("sdpa", "eager")
MODEL_BASELINE = MODEL_BASELINES[0]
ERROR_FACTOR = 2.0            # a final hidden-state error over this × the baseline's ...
# ... and over a floor: no finding between two runs both exact to their dtype's rounding. min(ERROR_FLOOR,
# FLOOR_EPS × the dtype's machine epsilon): fp32 1.2e-6 (measured: the correct variants' fp32 error through
# llama-tiny is 6.0-6.3e-7, llama-small's 3.0-3.1e-6, within 5% of sdpa's; broken.clamped's 8.3e-6 and 7.0e-5),
# fp16 and bf16 1e-3 (their rounding hides a 1e-6 clamp: sdpa's own error is 2e-3 to 5e-2)
ERROR_FLOOR = 1e-3
FLOOR_EPS = 10.0                # × the dtype's machine epsilon (core/dtypes.py: Dtype.epsilon)
GROWTH_FACTOR = 1.25          # a per-layer growth (median) over this × the baseline's, with the error over this ×
# the baseline's too: an error over the baseline's alone is a coin flip between two correct variants (measured,
# llama-tiny bf16: eager's and broken.clamped's (its clamp under bf16's rounding) final error 1.04-1.08 × sdpa's
# natively and under ATEN_CPU_CAPABILITY=default and avx2 + ONEDNN_MAX_CPU_ISA=AVX2, its growth 0.98-1.03 ×
# sdpa's), an edge the growth alone kept from a finding
# Flips: the yardstick's own decisive flips (|S|) are what the dtype's rounding does through this model; a
# variant flipping more than FLIP_FACTOR × |S| + FLIP_SLACK decisive positions the yardstick keeps changes
# the model beyond rounding (measured, llama-small bf16: eager 8 beyond sdpa's 6, sdpa 4 beyond eager's)
FLIP_FACTOR = 2.0
FLIP_SLACK = 2
MODEL_CHECKS: tuple[str, ...] = ("model_error", "model_top1_flip", "model_failed")
# a variant's run that raised, whose measuring process died in it, or that was killed over its time limit
FAILED_STATUSES: tuple[str, ...] = ("failed", "error", "timeout")


def variant_rows(records: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """The per-variant records (kind "variant") as a frame; empty when there are none."""
    frame = records if isinstance(records, pd.DataFrame) else pd.DataFrame(list(records))
    if frame.empty or "kind" not in frame.columns:
        return pd.DataFrame()
    return frame[frame["kind"] == "variant"].reset_index(drop=True)


def _finite(value: Any) -> float | None:
    """value as a finite float, else None (an inf error is no number to compare with a yardstick's)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def error_floor(dtype: str) -> float:
    """The final error under which no variant is found worse than the yardstick in `dtype`."""
    return min(ERROR_FLOOR, FLOOR_EPS * dtype_spec(dtype).epsilon)


def check_model(records: list[dict] | pd.DataFrame) -> list[dict]:
    """The model audit's findings: model_error, model_top1_flip (error), model_failed (warning)."""
    rows = variant_rows(records)
    if rows.empty:
        return []
    out = []
    ok = rows[rows["status"] == "ok"] if "status" in rows.columns else rows.iloc[0:0]
    for (model, dtype), group in ok.groupby(["model", "dtype"]):
        present = [b for b in MODEL_BASELINES if (group["variant"] == b).any()]
        if not present:
            continue
        yardstick = present[0]
        base = group[group["variant"] == yardstick].iloc[0]
        base_err, base_growth = _finite(base.get("final_hidden_err")), _finite(base.get("growth_median"))
        base_flips = set(base.get("decisive_mismatches") or [])
        floor = error_floor(str(dtype))
        for _, r in group[group["variant"] != yardstick].iterrows():
            cell = f"{r['variant']} {model} {dtype}"
            err, growth = _finite(r.get("final_hidden_err")), _finite(r.get("growth_median"))
            worse = err is None or (base_err is not None and err > max(ERROR_FACTOR * base_err, floor))
            faster = (growth is not None and base_growth is not None and growth > GROWTH_FACTOR * base_growth
                      and err is not None and base_err is not None and err > max(GROWTH_FACTOR * base_err, floor))
            if worse or faster:
                why = ("its final hidden state is not finite" if err is None else
                       f"its hidden state's error after the last layer is {err:.3g} against {yardstick}'s "
                       f"{base_err:.3g}" + (f", growing {growth:.2f}× a layer (median) against {base_growth:.2f}×"
                                            if growth is not None and base_growth is not None else ""))
                out.append(_finding("model_error", "error", str(r["variant"]),
                                    f"Swapping {yardstick} for {r['variant']} in the {model} decoder ({dtype}) "
                                    f"changes the model: {why}; next-token KL {_fmt(r.get('kl'))}, top-1 agreement "
                                    f"with float64 {_fmt(r.get('top1_agreement'))}.", [cell]))
            flips = sorted(set(r.get("decisive_mismatches") or []) - base_flips)
            if len(flips) > FLIP_FACTOR * len(base_flips) + FLIP_SLACK:
                out.append(_finding("model_top1_flip", "error", str(r["variant"]),
                                    f"In the {model} decoder ({dtype}), {r['variant']} changes the most likely next "
                                    f"token at {len(flips)} position(s) where float64's leads by more than "
                                    f"{DECISIVE_MARGIN} nats and {yardstick} keeps it ({yardstick} itself flips "
                                    f"{len(base_flips)} such position(s) by rounding; first: "
                                    f"position {flips[0]}); vLLM's logprob check "
                                    f"{'passes' if r.get('logprob_check') else 'fails'} there.", [cell]))
    bad = rows[rows["status"].isin(FAILED_STATUSES)] if "status" in rows.columns else rows.iloc[0:0]
    for _, r in bad.iterrows():
        how = {"failed": "failed", "error": "crashed", "timeout": "ran out of time"}[r["status"]]
        out.append(_finding("model_failed", "warning", str(r["variant"]),
                            f"{r['variant']} {how} in the {r['model']} decoder ({r['dtype']}): {r.get('reason')}",
                            [f"{r['variant']} {r['model']} {r['dtype']}"]))
    return out


def _fmt(value: Any) -> str:
    v = _finite(value)
    return "n/a" if v is None else f"{v:.3g}"
