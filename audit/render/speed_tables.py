"""Data tables of the report's speed sections (sections.py): the speed-ups, the host-bound cells,
the measured ceilings, and the tables of one stated shape (one cell per entry, each measurable
again). Small functions from the tidy frame (or run.json) to DataFrames; no rendering, no torch.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..analysis.noise_rules import cell_noise, unstable_mask
from .data import numeric, representative_slice, speed_rows, speedup_vs_baseline, variant_order
from .page import format_value


def ceilings_table(run_info: dict | None) -> pd.DataFrame:
    """Measured ceilings per device: matmul TFLOP/s per dtype and copy GB/s (run.json: ceilings)."""
    rows = []
    for device, c in ((run_info or {}).get("ceilings") or {}).items():
        for dtype, rate in (c.get("matmul_flops_per_s") or {}).items():
            measured = "null" if rate is None else f"{rate / 1e12:.3g} TFLOP/s"
            # measure.machine.roofline.matmul_plausibility
            if (c.get("matmul_believable") or {}).get(dtype) is False:
                measured += (" — not believable, every pct_of_limit of this dtype is inflated: "
                             + str((c.get("matmul_believable_why") or {}).get(dtype)))
            rows.append({"device": device, "what": f"{dtype} matmul (n={(c.get('matmul_n') or {}).get(dtype)})",
                         "measured": measured})
        bw = c.get("copy_bytes_per_s")
        rows.append({"device": device, "what": "device-to-device copy (read + write)",
                     "measured": "null" if bw is None else f"{bw / 1e9:.3g} GB/s"})
    return pd.DataFrame(rows, columns=["device", "what", "measured"])

def host_bound_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per variant: cells whose calls take the host longer to issue than the device to run
    (host_bound), of the cells where it was measured, and the medians of both times."""
    columns = ["variant", "host_bound", "measured", "median fwd_ms", "median fwd_host_ms"]
    if "host_bound" not in rows.columns:
        return pd.DataFrame(columns=columns)
    measured = rows[rows["host_bound"].map(lambda v: isinstance(v, (bool, np.bool_)))]
    if measured.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for variant in variant_order(measured["variant"]):
        g = measured[measured["variant"] == variant]
        out.append({"variant": variant, "host_bound": int(g["host_bound"].astype(bool).sum()),
                    "measured": len(g), "median fwd_ms": numeric(g, "fwd_ms").median(),
                    "median fwd_host_ms": numeric(g, "fwd_host_ms").median()})
    return pd.DataFrame(out, columns=columns)


def speedup_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Forward and forward+backward speed-up over the baseline per variant, fastest first; where a
    cell is unstable (noise_rules.unstable_mask), how many of each variant's speed cells are."""
    fwd = speedup_vs_baseline(frame, "fwd_ms").rename(
        columns={"speedup": "fwd speed-up (x)", "cells": "fwd cells"})
    both = speedup_vs_baseline(frame, "fwd_bwd_ms").rename(
        columns={"speedup": "fwd+bwd speed-up (x)", "cells": "fwd+bwd cells"})
    merged = fwd.merge(both, on="variant", how="outer")
    merged = merged.astype({"fwd cells": "Int64", "fwd+bwd cells": "Int64"})
    rows = speed_rows(frame)
    shaky = rows[unstable_mask(rows)] if not rows.empty else rows
    if len(shaky):
        counts = shaky.groupby("variant").size()
        merged["unstable cells"] = [int(counts.get(v, 0)) for v in merged["variant"]]
    return merged.sort_values("fwd speed-up (x)", ascending=False, kind="stable")


def _most_common_largest(values: pd.Series) -> Any:
    """The most common value; among equally common ones, the largest (the harder shape)."""
    counts = values.value_counts()
    return max(counts[counts == counts.max()].index)


def stated_shape(frame: pd.DataFrame, device: str, dtype: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The speed cells of one device and dtype at one stated shape, so a table of them holds one
    cell per entry (nothing pooled) and each number can be measured again.

    Fixes what representative_slice fixes (batch, or tokens B·T; heads, kv_heads, scenario) and
    d_k (its most common value, the largest on a tie); causal and seq_len stay free. Returns the
    rows and the shape: device, dtype, d_k, heads, kv_heads, scenario, batch (None when B·T is
    fixed instead), tokens (B·T, or None).
    """
    rows = speed_rows(frame)
    rows = rows[(rows["device"] == device) & (rows["dtype"] == dtype)]
    if rows.empty:
        return rows, {}
    rows, _ = representative_slice(rows, vary=("causal",))
    d_k = _most_common_largest(rows["d_k"])
    rows = rows[rows["d_k"] == d_k]
    batches = set(rows["batch"].astype(int))
    tokens = set((rows["batch"].astype(int) * rows["seq_len"].astype(int)))
    shape = {"device": device, "dtype": dtype, "d_k": int(d_k), "heads": int(rows["heads"].iloc[0]),
             "kv_heads": int(rows["kv_heads"].iloc[0]), "scenario": str(rows["scenario"].iloc[0]),
             "batch": next(iter(batches)) if len(batches) == 1 else None,
             "tokens": next(iter(tokens)) if len(batches) > 1 and len(tokens) == 1 else None}
    return rows, shape


def describe_shape(shape: dict[str, Any]) -> str:
    """'cpu fp32, B=1, H=2, kv_heads=2, d_k=64, scenario normal' (B·T=16384 when the batch varies)."""
    batch = f"B={shape['batch']}" if shape.get("batch") is not None else f"B·T={shape.get('tokens')}"
    return (f"{shape['device']} {shape['dtype']}, {batch}, H={shape['heads']}, kv_heads={shape['kv_heads']}, "
            f"d_k={shape['d_k']}, scenario {shape['scenario']}")


def rerun_command(shape: dict[str, Any]) -> str:
    """The command line that measures one entry of a stated-shape table again (V, T, C: the
    entry's variant, seq_len and causal flag)."""
    batch = str(shape["batch"]) if shape.get("batch") is not None else f"{shape.get('tokens')}/T"
    return (f"python -m audit run --variant V --device {shape['device']} --dtype {shape['dtype']} "
            f"--d-k {shape['d_k']} --seq-len T --batch {batch} --heads {shape['heads']} "
            f"--kv-heads {shape['kv_heads']} --causal C --scenario {shape['scenario']}")


def shape_table(rows: pd.DataFrame, metric: str, scale: float = 1.0) -> pd.DataFrame:
    """variant (rows) x one column per (causal, seq_len) of stated_shape's rows: metric / scale
    of that one cell; a latency an unstable cell measured (noise_rules.unstable_mask) reads
    "12.3 ±9%". Column names 'T=128' (with 'causal ' or 'full ' in front when both occur;
    ' B=32' after when the batch varies with T)."""
    if rows.empty:
        return pd.DataFrame(columns=["variant"])
    both = rows["causal"].astype(bool).nunique() > 1
    varying_batch = rows["batch"].nunique() > 1

    def label(causal: bool, seq_len: int, batch: int) -> str:
        mask = ("causal " if causal else "full ") if both else ""
        return f"{mask}T={seq_len}" + (f" B={batch}" if varying_batch else "")

    value: pd.Series = numeric(rows, metric) / scale
    if metric in ("fwd_ms", "fwd_bwd_ms"):     # an unstable cell's time carries its width: "12.3 ±9%"
        shaky = unstable_mask(rows)
        width = cell_noise(rows)
        value = value.astype(object)
        value[shaky] = [f"{format_value(v)} ±{w * 100:.0f}%" for v, w in zip(value[shaky], width[shaky])]
    keyed = rows.assign(_col=[label(bool(c), int(t), int(b)) for c, t, b in
                              zip(rows["causal"], rows["seq_len"], rows["batch"])],
                        _order=[(bool(c), int(t)) for c, t in zip(rows["causal"], rows["seq_len"])],
                        _value=value)
    order = list(dict.fromkeys(keyed.sort_values("_order")["_col"]))
    wide = keyed.pivot_table(index="variant", columns="_col", values="_value", aggfunc="first")
    wide = wide.reindex(index=variant_order(keyed["variant"]), columns=order)
    wide.columns = [str(c) for c in wide.columns]
    wide.insert(0, "variant", wide.index.astype(str))
    return wide.reset_index(drop=True)
