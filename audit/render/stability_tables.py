"""Data tables of the report's numerical-stability sections (stability_sections.py) and its
saturation figure: small functions from the tidy frame (or the run folder) to DataFrames, so tests
check numbers and the sections only render them. Each reads ok cells unless it says otherwise.
No rendering, no torch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.runfolder import SEED_CLAIMS_FILE
from .data import (ALIGNMENT_SCENARIOS, FP16_RANGE_SCENARIO, GOLDEN_SOURCE_PREFERENCE, NORMAL_SCENARIO,
                   OUTLIERS_SCENARIO, SCALED_PREFIX, describe_values, dtype_order, flag_equals, normal_rows,
                   numeric, ok_rows, scenario_alpha, scenario_descriptions, scenario_order, sorted_values,
                   variant_order)


def scenario_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns scenario, description, cells, ok: the input scenarios present."""
    columns = ["scenario", "description", "cells", "ok"]
    if frame.empty or "scenario" not in frame.columns:
        return pd.DataFrame(columns=columns)
    scenario = frame["scenario"].fillna(NORMAL_SCENARIO).astype(str)
    descriptions = scenario_descriptions()
    rows = []
    for name in scenario_order(scenario):
        mask = scenario == name
        rows.append({"scenario": name, "description": descriptions.get(name, ""),
                     "cells": int(mask.sum()), "ok": int((frame["status"][mask] == "ok").sum())})
    return pd.DataFrame(rows, columns=columns)

def fp16_overflow_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Scenario fp16_range, per variant and dtype.

    Columns: variant, dtype, cells, nonfinite_cells (cells with out_nonfinite_visible > 0),
    nonfinite (NaN+inf values in rows that see a key, summed), finite (True: no such value
    in any measured cell; None: not measured), max_qk (largest |q·k|, compare with 65504).
    """
    columns = ["variant", "dtype", "cells", "nonfinite_cells", "nonfinite", "finite", "max_qk"]
    ok = ok_rows(frame)
    rows = ok[ok["scenario"] == FP16_RANGE_SCENARIO]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    nonfinite = numeric(rows, "out_nonfinite_visible")
    rows = rows.assign(_nf=nonfinite, _bad=(nonfinite > 0).astype(int),
                       _measured=nonfinite.notna().astype(int), _qk=numeric(rows, "max_qk"))
    out = []
    for variant in variant_order(rows["variant"]):
        for dtype in dtype_order(rows.loc[rows["variant"] == variant, "dtype"]):
            g = rows[(rows["variant"] == variant) & (rows["dtype"] == dtype)]
            measured = int(g["_measured"].sum())
            bad = int(g["_bad"].sum())
            out.append({"variant": variant, "dtype": dtype, "cells": len(g),
                        "nonfinite_cells": bad,
                        "nonfinite": int(g["_nf"].sum()) if measured else None,
                        "finite": (bad == 0) if measured else None,
                        "max_qk": g["_qk"].max()})
    return pd.DataFrame(out, columns=columns)


def budget_table(frame: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """Error budget per variant x `by` (scenario when several are present, else dtype).

    A cell is within budget when rmse <= 2 * rmse(eager, same dtype) + atol (FlashAttention's
    rule; `within_budget`). Columns: variant, <by>, within (cells True), judged (True + False;
    null = not judged), frac_within (within / judged), median_err_ratio, cells.
    """
    ok = ok_rows(frame)
    if by is None:
        by = "scenario" if ok["scenario"].nunique() > 1 else "dtype"
    columns = ["variant", by, "within", "judged", "frac_within", "median_err_ratio", "cells"]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    within = flag_equals(ok, "within_budget", True)
    judged = within | flag_equals(ok, "within_budget", False)
    rows = ok.assign(_within=within.astype(int), _judged=judged.astype(int),
                     _ratio=numeric(ok, "err_ratio"))
    grouped = rows.groupby(["variant", by], sort=False).agg(
        within=("_within", "sum"), judged=("_judged", "sum"),
        median_err_ratio=("_ratio", "median"), cells=("_within", "size")).reset_index()
    grouped["frac_within"] = (grouped["within"] / grouped["judged"].where(grouped["judged"] > 0))
    order = scenario_order(grouped[by]) if by == "scenario" else (
        dtype_order(grouped[by]) if by == "dtype" else sorted_values(list(grouped[by].unique())))
    grouped = grouped.assign(
        _v=grouped["variant"].map({v: i for i, v in enumerate(variant_order(grouped["variant"]))}),
        _b=grouped[by].map({b: i for i, b in enumerate(order)}))
    return grouped.sort_values(["_v", "_b"]).reset_index(drop=True)[columns]


def gradient_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Median dq_err, dk_err, dv_err per variant x dtype, over scenario normal's ok cells
    (all ok cells when no normal cell exists). Columns: variant, dtype, dq_err, dk_err,
    dv_err, cells."""
    columns = ["variant", "dtype", "dq_err", "dk_err", "dv_err", "cells"]
    ok = ok_rows(frame)
    normal = normal_rows(ok)
    rows = normal if not normal.empty else ok
    rows = rows.assign(**{c: numeric(rows, c) for c in ("dq_err", "dk_err", "dv_err")})
    rows = rows[rows[["dq_err", "dk_err", "dv_err"]].notna().any(axis=1)]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for variant in variant_order(rows["variant"]):
        for dtype in dtype_order(rows.loc[rows["variant"] == variant, "dtype"]):
            g = rows[(rows["variant"] == variant) & (rows["dtype"] == dtype)]
            out.append({"variant": variant, "dtype": dtype, "dq_err": g["dq_err"].median(),
                        "dk_err": g["dk_err"].median(), "dv_err": g["dv_err"].median(),
                        "cells": len(g)})
    return pd.DataFrame(out, columns=columns)


def gradient_budget_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The gradient budget per variant x dtype over every ok cell judged: for each of dq, dk, dv
    "within/judged" (cells within its budget / cells judged: not forward-only, gradients finite,
    a finite baseline) and its largest ratio to the baseline's error. Columns: variant, dtype,
    dq, dk, dv, max dq_err_ratio, max dk_err_ratio, max dv_err_ratio."""
    grads = ("dq", "dk", "dv")
    columns = ["variant", "dtype", *grads, *(f"max {g}_err_ratio" for g in grads)]
    ok = ok_rows(frame)
    if ok.empty or not all(f"{g}_within_budget" in ok.columns for g in grads):
        return pd.DataFrame(columns=columns)
    flags = {g: (flag_equals(ok, f"{g}_within_budget", True), flag_equals(ok, f"{g}_within_budget", False))
             for g in grads}
    judged_any = np.logical_or.reduce([yes | no for yes, no in flags.values()])
    out = []
    for variant in variant_order(ok.loc[judged_any, "variant"]):
        for dtype in dtype_order(ok.loc[judged_any & (ok["variant"] == variant), "dtype"]):
            sel = judged_any & (ok["variant"] == variant) & (ok["dtype"] == dtype)
            row: dict[str, Any] = {"variant": variant, "dtype": dtype}
            for g, (yes, no) in flags.items():
                row[g] = f"{int(yes[sel].sum())}/{int((yes | no)[sel].sum())}"
                row[f"max {g}_err_ratio"] = numeric(ok[sel], f"{g}_err_ratio").max()
            out.append(row)
    return pd.DataFrame(out, columns=columns)


LSE_VERDICTS = (("lse", "lse_within_budget", "lse_err_ratio"), ("merge", "merge_within_budget", "merge_err_ratio"),
                ("context parallel", "shards_within_budget", "shards_err_ratio"),
                ("lse gradient", "lse_grads_within_budget", "lse_dq_err_ratio"))


def lse_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The log-sum-exp checks per variant x dtype over the ok cells of variants returning one: for
    the lse, the merge of two halves, the merge of N shards (context parallel) and the gradient through
    it, "within/judged" and the largest ratio to the baseline's error (the gradient: dq's); whether the
    lse carries a gradient; what it is on rows that see no key. Columns: variant, dtype, lse, merge,
    context parallel, lse gradient, max ratios, differentiable, on empty rows."""
    columns = ["variant", "dtype", *(name for name, _, _ in LSE_VERDICTS),
               *(f"max {ratio}" for _, _, ratio in LSE_VERDICTS), "differentiable", "on empty rows"]
    ok = ok_rows(frame)
    if ok.empty or "lse_within_budget" not in ok.columns:
        return pd.DataFrame(columns=columns)
    returns = ok[numeric(ok, "lse_err").notna()]
    out = []
    for variant in variant_order(returns["variant"]):
        for dtype in dtype_order(returns.loc[returns["variant"] == variant, "dtype"]):
            sel = returns[(returns["variant"] == variant) & (returns["dtype"] == dtype)]
            row: dict[str, Any] = {"variant": variant, "dtype": dtype}
            for name, verdict, ratio in LSE_VERDICTS:
                yes, no = flag_equals(sel, verdict, True), flag_equals(sel, verdict, False)
                row[name] = f"{int(yes.sum())}/{int((yes | no).sum())}"
                row[f"max {ratio}"] = numeric(sel, ratio).max()
            diff = sel["lse_differentiable"].dropna() if "lse_differentiable" in sel else pd.Series(dtype=object)
            row["differentiable"] = ("yes" if diff.astype(bool).all() else "no" if not diff.astype(bool).any()
                                     else "mixed") if len(diff) else "not judged"
            empty = sorted(set(sel["lse_masked_rows"].dropna().astype(str))) if "lse_masked_rows" in sel else []
            row["on empty rows"] = ", ".join(empty) or "no such row"
            out.append(row)
    return pd.DataFrame(out, columns=columns)


def shards_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The error of a merge against the number of key shards it merges, per variant x dtype over the ok
    cells judged: for 2 (merge_err_ratio), then each N of the context-parallel check (shards_err_ratios),
    the largest ratio to the same-dtype baseline's error over the same split. Columns: variant, dtype,
    "N shards" for N = 2 and each of shards_err_ratios' keys, cells."""
    ok = ok_rows(frame)
    if ok.empty or "shards_err_ratios" not in ok.columns:
        return pd.DataFrame(columns=["variant", "dtype", "2 shards", "cells"])
    judged = ok[ok["shards_err_ratios"].map(lambda d: isinstance(d, dict) and bool(d))]
    counts = sorted({int(n) for d in judged["shards_err_ratios"] for n in d})
    columns = ["variant", "dtype", "2 shards", *(f"{n} shards" for n in counts), "cells"]
    out = []
    for variant in variant_order(judged["variant"]):
        for dtype in dtype_order(judged.loc[judged["variant"] == variant, "dtype"]):
            sel = judged[(judged["variant"] == variant) & (judged["dtype"] == dtype)]
            row: dict[str, Any] = {"variant": variant, "dtype": dtype,
                                   "2 shards": numeric(sel, "merge_err_ratio").max(), "cells": len(sel)}
            for n in counts:
                row[f"{n} shards"] = pd.to_numeric(sel["shards_err_ratios"].map(lambda d, n=n: d.get(str(n))),
                                                   errors="coerce").max()
            out.append(row)
    return pd.DataFrame(out, columns=columns)


def leakage_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per variant x scenario: max leak_max_change (0 = no leak) and max leak_mass, over ok
    cells where either was measured. Columns: variant, scenario, leak_max_change,
    leak_mass, cells."""
    columns = ["variant", "scenario", "leak_max_change", "leak_mass", "cells"]
    ok = ok_rows(frame)
    rows = ok.assign(leak_max_change=numeric(ok, "leak_max_change"), leak_mass=numeric(ok, "leak_mass"))
    rows = rows[rows[["leak_max_change", "leak_mass"]].notna().any(axis=1)]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for variant in variant_order(rows["variant"]):
        v = rows[rows["variant"] == variant]
        for scenario in scenario_order(v["scenario"]):
            g = v[v["scenario"] == scenario]
            out.append({"variant": variant, "scenario": scenario,
                        "leak_max_change": g["leak_max_change"].max(),
                        "leak_mass": g["leak_mass"].max(), "cells": len(g)})
    return pd.DataFrame(out, columns=columns)


def alignment_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Causal alignment each variant applies when q_len != kv_len (top-left, bottom-right,
    neither), per scenario among cross_causal and decode. Columns: variant, scenarios."""
    ok = ok_rows(frame)
    if "causal_alignment" not in ok.columns:
        return pd.DataFrame(columns=["variant"])
    ok = ok[ok["causal_alignment"].notna()]
    scenarios = [s for s in ALIGNMENT_SCENARIOS if (ok["scenario"] == s).any()]
    scenarios += [s for s in scenario_order(ok["scenario"]) if s not in scenarios]
    out = []
    for variant in variant_order(ok["variant"]):
        rows = ok[ok["variant"] == variant]
        out.append({"variant": variant,
                    **{s: describe_values(rows[rows["scenario"] == s], "causal_alignment")
                       for s in scenarios}})
    return pd.DataFrame(out, columns=["variant", *scenarios])


def _is_saturation_scenario(name: str) -> bool:
    return scenario_alpha(name) is not None or name == OUTLIERS_SCENARIO


def saturation_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per scenario (normal, scaled_x*, outliers) x variant: mean onehot_frac, min
    min_entropy, max max_logit, mean golden_onehot_frac, the saturation source, cells."""
    columns = ["scenario", "variant", "source", "onehot_frac", "min_entropy", "max_logit",
               "golden_onehot_frac", "cells"]
    ok = ok_rows(frame)
    ok = ok[ok["scenario"].astype(str).map(_is_saturation_scenario)]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    rows = ok.assign(**{c: numeric(ok, c) for c in ("onehot_frac", "min_entropy", "max_logit",
                                                 "golden_onehot_frac")})
    out = []
    for scenario in scenario_order(rows["scenario"]):
        s = rows[rows["scenario"] == scenario]
        for variant in variant_order(s["variant"]):
            g = s[s["variant"] == variant]
            out.append({"scenario": scenario, "variant": variant,
                        "source": describe_values(g, "saturation_source"),
                        "onehot_frac": g["onehot_frac"].mean(),
                        "min_entropy": g["min_entropy"].min(),
                        "max_logit": g["max_logit"].max(),
                        "golden_onehot_frac": g["golden_onehot_frac"].mean(), "cells": len(g)})
    return pd.DataFrame(out, columns=columns)


def saturation_sweep_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean onehot_frac and entropy vs logit scale alpha (normal = 1, scaled_xA = A).

    One line from the golden (rows with saturation_source golden of one variant, sdpa when
    present: the values are the input set's, the same for every such variant), plus one per
    variant whose saturation_source is variant (its own weights). Non-causal cells when any,
    averaged over the other axes. Empty when no scaled_* scenario is present.
    Columns: line, source, alpha, onehot_frac, entropy, cells.
    """
    columns = ["line", "source", "alpha", "onehot_frac", "entropy", "cells"]
    ok = ok_rows(frame)
    if not ok["scenario"].astype(str).str.startswith(SCALED_PREFIX).any():
        return pd.DataFrame(columns=columns)
    alpha = ok["scenario"].map(scenario_alpha)
    rows = ok.assign(alpha=pd.to_numeric(alpha, errors="coerce"),
                     onehot_frac=numeric(ok, "onehot_frac"), entropy=numeric(ok, "entropy"))
    rows = rows[rows["alpha"].notna() & rows[["onehot_frac", "entropy"]].notna().any(axis=1)]
    causal = rows["causal"].astype(bool)
    if (~causal).any():
        rows = rows[~causal]
    source = (rows["saturation_source"].astype(str) if "saturation_source" in rows.columns
              else pd.Series("None", index=rows.index))
    lines: list[tuple[str, str, pd.DataFrame]] = []
    golden = rows[source == "golden"]
    if not golden.empty:
        names = set(golden["variant"])
        ref = next((v for v in GOLDEN_SOURCE_PREFERENCE if v in names), variant_order(names)[0])
        lines.append((f"float64 golden (via {ref})", "golden", golden[golden["variant"] == ref]))
    own = rows[source == "variant"]
    for variant in variant_order(own["variant"]):
        lines.append((variant, "variant", own[own["variant"] == variant]))
    out = []
    for name, kind, g in lines:
        for a, group in g.groupby("alpha", sort=True):
            out.append({"line": name, "source": kind, "alpha": float(a),
                        "onehot_frac": group["onehot_frac"].mean(),
                        "entropy": group["entropy"].mean(), "cells": len(group)})
    return pd.DataFrame(out, columns=columns)


def seed_claims_table(run_dir: str | Path) -> pd.DataFrame | None:
    """DIR/seed_claims.csv as claim, d_k (Int64), seed_value and measured_value (text as
    written), holds (bool); None when the file is absent."""
    path = Path(run_dir) / SEED_CLAIMS_FILE
    if not path.exists():
        return None
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    for column in ("claim", "d_k", "seed_value", "measured_value", "holds"):
        if column not in raw.columns:
            raw[column] = ""
    holds = raw["holds"].str.strip().str.lower().map(
        {"true": True, "false": False, "1": True, "0": False})
    return pd.DataFrame({
        "claim": raw["claim"],
        "d_k": pd.to_numeric(raw["d_k"].replace("", None), errors="coerce").astype("Int64"),
        "seed_value": raw["seed_value"],
        "measured_value": raw["measured_value"],
        "holds": holds.astype(object).where(holds.notna(), None),
    })

def wide_by_variant(long: pd.DataFrame, column: str, value: str,
                    order: list[Any] | None = None) -> pd.DataFrame:
    """variant (rows, correct variants first) x `column` (columns) of `value`."""
    variants = variant_order(long["variant"])
    columns = order if order is not None else list(dict.fromkeys(long[column]))
    wide = (long.set_index(["variant", column])[value].astype(object).unstack(column)
            .reindex(index=variants, columns=columns))
    wide.columns = [str(c) for c in wide.columns]
    wide.insert(0, "variant", wide.index.astype(str))
    return wide.reset_index(drop=True)
