"""Shared selections of the tidy records frame: which cells count for what, in what order.

Pure pandas, no rendering and no torch: the tables, figures and sections all read the
frame through these, so "speed cells" or "variant order" mean the same everywhere.
"""
from __future__ import annotations

import itertools
import numbers
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..analysis.finding_rows import NEGATIVE_CONTROL_PREFIX
from ..core.dtypes import dtype_names
from ..core.grid import FOLLOWS, INPUT_AXES

BASELINE_VARIANT = "eager"
MIB = 2 ** 20
LOG_FLOOR = 1e-12          # rel_err values below this (exact 0 included) are drawn here
REASON_WIDTH = 120

METRIC_COLUMNS = (
    "fwd_ms", "fwd_iqr_ms", "fwd_n", "fwd_bwd_ms", "fwd_bwd_iqr_ms", "fwd_bwd_n",
    "compile_s", "peak_bytes", "peak_fwd_bwd_bytes", "flops", "gflops_per_s",
    "fwd_bwd_gflops_per_s", "out_nan", "out_inf", "grad_nan", "grad_inf",
    "max_abs_err", "rel_err", "max_prob", "entropy", "onehot_frac", "elapsed_s",
    "q_len", "out_nonfinite_visible", "rmse", "err_ratio", "dq_err", "dk_err", "dv_err",
    "max_logit", "max_qk", "min_entropy", "golden_onehot_frac", "underflow_frac",
    "leak_mass", "leak_max_change",
)
NONFINITE_COLUMNS = ("out_nan", "out_inf", "grad_nan", "grad_inf")
MATCH_AXES = INPUT_AXES          # cells that differ only in the variant are compared
NORMAL_SCENARIO = "normal"      # speed and memory are compared on these cells only
MASK_FORMS = (("fully_masked_bool", "bool"), ("fully_masked_neginf", "-inf float"),
              ("fully_masked_finfo_min", "finfo.min float"))
FP16_RANGE_SCENARIO = "fp16_range"
FP16_MAX = 65504.0
ALIGNMENT_SCENARIOS = ("cross_causal", "decode")
SCALED_PREFIX = "scaled_x"
OUTLIERS_SCENARIO = "outliers"
GOLDEN_SOURCE_PREFERENCE = ("sdpa", "sdpa_math", "compiled")
# Axes along which a per-cell label (masked_rows, causal_alignment) may differ; the first
# axis that explains the difference is named, e.g. "nan (fp32), other (fp16)": dtype and
# causal first, then every other input axis but the scenario (the label's own subject).
DESCRIBE_FIRST = ("dtype", "causal")
DESCRIBE_AXES = DESCRIBE_FIRST + tuple(a for a in INPUT_AXES if a not in DESCRIBE_FIRST and a != "scenario")
# The axes a figure draws along; representative_slice fixes every other input axis.
PLOTTED_AXES = ("dtype", "d_k", "seq_len")


def is_negative_control(variants: pd.Series) -> pd.Series:
    """Deliberately broken variants: kept for numerics, never ranked for speed."""
    return variants.astype(str).str.startswith(NEGATIVE_CONTROL_PREFIX)


def prepare(frame: pd.DataFrame) -> pd.DataFrame:
    """Measurement columns as floats (null -> NaN) so pandas can aggregate them; a frame without
    an optional axis (made before it) reads it as the axis it follows (core.grid.FOLLOWS: kv_heads
    as heads, multi-head; d_v as d_k)."""
    as_float = {col: pd.to_numeric(frame[col], errors="coerce").astype(float)
                for col in METRIC_COLUMNS if col in frame.columns}
    for axis, follows in FOLLOWS.items():
        if axis not in frame.columns and follows in frame.columns:
            as_float[axis] = frame[follows]
    return frame.assign(**as_float)


def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Cells that were measured (status ok)."""
    return frame[frame["status"] == "ok"]


def normal_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Cells of the `normal` scenario (a missing scenario counts as normal, as in old runs)."""
    if "scenario" not in frame.columns:
        return frame
    scenario = frame["scenario"]
    return frame[scenario.isna() | (scenario.astype(str) == NORMAL_SCENARIO)]


def speed_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured cells that may be ranked for speed and memory: scenario normal only (the
    other scenarios are stability checks), negative controls left out."""
    ok = normal_rows(ok_rows(frame))
    return ok[~is_negative_control(ok["variant"])]


def _matched_ratios(frame: pd.DataFrame, metric: str, baseline: str) -> pd.DataFrame:
    """variant metric / baseline metric for every cell both measured (same axes but variant)."""
    rows = prepare(speed_rows(frame))
    rows = rows[np.isfinite(rows[metric]) & (rows[metric] > 0)]
    base = (rows[rows["variant"] == baseline][list(MATCH_AXES) + [metric]]
            .rename(columns={metric: "baseline_value"}))
    others = rows[rows["variant"] != baseline][["variant", *MATCH_AXES, metric]]
    matched = others.merge(base, on=list(MATCH_AXES), how="inner")
    return matched.assign(ratio=matched[metric] / matched["baseline_value"])[["variant", "ratio"]]


def _geometric_mean_by_variant(ratios: pd.DataFrame) -> pd.DataFrame:
    """Columns variant, ratio (geometric mean of the cells' ratios), cells."""
    grouped = (ratios.assign(log_ratio=np.log(ratios["ratio"]))
               .groupby("variant", sort=True)["log_ratio"].agg(["mean", "size"]))
    return pd.DataFrame({
        "variant": grouped.index.astype(str),
        "ratio": np.exp(grouped["mean"].to_numpy()),
        "cells": grouped["size"].to_numpy().astype(int),
    }).reset_index(drop=True)


def speedup_vs_baseline(frame: pd.DataFrame, metric: str = "fwd_ms",
                        baseline: str = BASELINE_VARIANT) -> pd.DataFrame:
    """Geometric-mean speed-up of each variant over the baseline, on matched ok cells.

    Speed-up of one cell is baseline latency / variant latency; a geometric mean
    keeps a 2x win and a 2x loss symmetric. Negative controls are left out.
    Columns: variant, speedup, cells (matched cells used), fastest first.
    """
    ratios = _geometric_mean_by_variant(_matched_ratios(frame, metric, baseline))
    result = ratios.assign(speedup=1.0 / ratios["ratio"])[["variant", "speedup", "cells"]]
    return result.sort_values("speedup", ascending=False, kind="stable").reset_index(drop=True)


def memory_ratio_vs_baseline(frame: pd.DataFrame, metric: str = "peak_bytes",
                             baseline: str = BASELINE_VARIANT) -> pd.DataFrame:
    """Geometric-mean memory of each variant relative to the baseline (below 1: smaller).

    Cells where either peak is 0 or null are skipped, since a ratio of them means nothing.
    Columns: variant, ratio, cells.
    """
    result = _geometric_mean_by_variant(_matched_ratios(frame, metric, baseline))
    return result.sort_values("ratio", kind="stable").reset_index(drop=True)


def representative_slice(rows: pd.DataFrame,
                         vary: tuple[str, ...] = ()) -> tuple[pd.DataFrame, str]:
    """Fix the axes a plot does not show, so its lines compare like with like.

    causal=False is preferred; device, heads, kv_heads and scenario take their most common value.
    The batch is fixed in one of two ways, whichever keeps more sequence lengths: at its
    most common value (a sweep at fixed B), or at a fixed number of tokens B·T per cell
    (a sweep like the gpu preset's, where B shrinks as T grows). Returns the rows and a
    description such as "cpu B1 H2 full normal" or "cuda 16384 tokens (B·T) H16 full normal".
    """
    chosen = rows
    if "causal" not in vary and len(chosen):
        causal = chosen["causal"].astype(bool)
        chosen = chosen[~causal] if (~causal).any() else chosen
    labels: list[str] = []
    for axis in (a for a in INPUT_AXES if a not in PLOTTED_AXES):
        if axis in vary or not len(chosen) or axis not in chosen.columns:
            continue
        if axis == "batch":
            chosen, label = _fix_batch(chosen)
            labels.append(label)
            continue
        if axis == "d_v" and "d_k" in chosen.columns:        # values of the keys' head dimension first
            plain = chosen["d_v"] == chosen["d_k"]
            if plain.any():
                chosen = chosen[plain]
                continue
        value = chosen[axis].mode().iloc[0]
        chosen = chosen[chosen[axis] == value]
        if axis != "kv_heads" or (chosen["kv_heads"] != chosen["heads"]).any():   # MHA: no KV label
            labels.append(axis_label(axis, value))
    return chosen, " ".join(labels)


def _fix_batch(rows: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Rows of one batch size, or of one token count B·T when that keeps more seq_lens."""
    batch = rows["batch"].mode().iloc[0]
    by_batch = rows[rows["batch"] == batch]
    tokens = rows["batch"].astype(int) * rows["seq_len"].astype(int)
    by_tokens = rows[tokens == tokens.mode().iloc[0]]
    if by_tokens["seq_len"].nunique() > by_batch["seq_len"].nunique():
        return by_tokens, f"{int(tokens.mode().iloc[0])} tokens (B·T)"
    return by_batch, axis_label("batch", batch)


def axis_label(axis: str, value: Any) -> str:
    if axis == "batch":
        return f"B{value}"
    if axis == "heads":
        return f"H{value}"
    if axis == "kv_heads":
        return f"KV{value}"
    if axis == "causal":
        return "causal" if value else "full"
    if axis in ("d_k", "d_v"):
        return f"{axis}={value}"
    if axis == "seq_len":
        return f"T={value}"
    return str(value)


def numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    """A column as floats (null and text -> NaN); all NaN when the column is absent."""
    if column not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").astype(float)


def flag_equals(frame: pd.DataFrame, column: str, value: bool) -> pd.Series:
    """True where a true/false/null column holds exactly `value`."""
    if column not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame[column].map(lambda v: isinstance(v, (bool, np.bool_)) and bool(v) == value)


def variant_order(variants: Iterable[Any]) -> list[str]:
    """Correct variants first (sorted), negative controls after."""
    names = sorted({str(v) for v in variants})
    return ([n for n in names if not n.startswith(NEGATIVE_CONTROL_PREFIX)]
            + [n for n in names if n.startswith(NEGATIVE_CONTROL_PREFIX)])


def dtype_order(values: Iterable[str]) -> list[str]:
    """The registered dtypes first, widest to narrowest (core/dtypes.py), anything else after."""
    present = set(values)
    known = [d for d in dtype_names() if d in present]
    return known + sorted(present - set(known))


def sorted_values(values: list[Any]) -> list[Any]:
    try:
        return sorted(values)
    except TypeError:  # mixed types
        return sorted(values, key=str)


def scenario_descriptions() -> dict[str, str]:
    """name -> description from audit.workload.inputs (torch-free at import), in its order."""
    try:
        from ..workload.inputs import SCENARIOS
    except Exception:  # the report must render even if the catalogue cannot be read
        return {}
    return {name: str(getattr(s, "description", "")) for name, s in SCENARIOS.items()}


def scenario_order(scenarios: Iterable[Any]) -> list[str]:
    """normal first, then the catalogue's order, then unknown names sorted."""
    present = {str(s) for s in scenarios if s is not None and not pd.isna(s)}
    known = [NORMAL_SCENARIO, *scenario_descriptions()]
    ordered = list(dict.fromkeys(n for n in known if n in present))
    return ordered + sorted(present - set(ordered))


def scenario_alpha(scenario: Any) -> float | None:
    """Logit scale of a saturation-sweep scenario: normal -> 1, scaled_xA -> A, else None."""
    name = str(scenario)
    if name == NORMAL_SCENARIO:
        return 1.0
    if name.startswith(SCALED_PREFIX):
        try:
            return float(name[len(SCALED_PREFIX):])
        except ValueError:
            return None
    return None


def describe_values(rows: pd.DataFrame, column: str) -> str | None:
    """One label for the non-null values of `column` over some cells.

    One value: that value. Several: split by the first axis that explains them
    ("nan (fp32), other (fp16)"); else the set ("{other, uniform}"). None if no value.
    """
    present = rows[rows[column].notna()] if column in rows.columns else rows.iloc[0:0]
    if present.empty:
        return None
    values = present[column].astype(str)
    unique = sorted(set(values))
    if len(unique) == 1:
        return unique[0]
    axes = [a for a in DESCRIBE_AXES if a in present.columns and not present[a].isna().any()
            and present[a].nunique() > 1]
    for split in [(a,) for a in axes] + list(itertools.combinations(axes, 2)):
        labels = present[list(split)].apply(
            lambda row: " ".join(axis_label(a, row[a]) for a in split), axis=1)
        groups: dict[str, set[str]] = {}
        for label, value in zip(labels, values):
            groups.setdefault(label, set()).add(value)
        if any(len(group) != 1 for group in groups.values()):
            continue
        by_value: dict[str, list[str]] = {}
        for label in _split_order(present, split, labels):
            by_value.setdefault(next(iter(groups[label])), []).append(label)
        return ", ".join(f"{value} ({', '.join(names)})" for value, names in by_value.items())
    return "{" + ", ".join(unique) + "}"


def _split_order(rows: pd.DataFrame, split: tuple[str, ...], labels: pd.Series) -> list[str]:
    """Labels of a split in axis order (dtype widest first, full before causal)."""
    def rank(axis: str, value: Any) -> Any:
        if axis == "dtype":
            return dtype_order(rows["dtype"]).index(value)
        return value if isinstance(value, numbers.Real) else str(value)
    keyed = {label: tuple(rank(a, row[a]) for a in split)
             for label, (_, row) in zip(labels, rows[list(split)].iterrows())}
    return sorted(keyed, key=lambda label: keyed[label])


def golden_saturation_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Cells whose saturation columns come from the float64 golden (source golden or null,
    as in schema-1 runs); all cells if none are."""
    if "saturation_source" not in rows.columns:
        return rows
    golden = rows[rows["saturation_source"].astype(str) != "variant"]
    return golden if not golden.empty else rows
