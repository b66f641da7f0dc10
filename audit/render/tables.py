"""Data tables of the report: small functions from the tidy frame (or run.json,
findings) to DataFrames, so tests check numbers and the sections only render them.
Each reads ok cells unless it says otherwise. No rendering, no torch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.defects import WARNING_DEFECTS
from ..core.runfolder import SEED_CLAIMS_FILE
from ..analysis.noise_rules import cell_noise, unstable_mask
from .page import format_value, slugify
from .data import ALIGNMENT_SCENARIOS, FP16_RANGE_SCENARIO, GOLDEN_SOURCE_PREFERENCE, NEGATIVE_CONTROL_PREFIX, NORMAL_SCENARIO, OUTLIERS_SCENARIO, SCALED_PREFIX, SEVERITY_ORDER, describe_values, dtype_order, flag_equals, is_negative_control, normal_rows, numeric, ok_rows, representative_slice, scenario_alpha, scenario_descriptions, scenario_order, sorted_values, speed_rows, speedup_vs_baseline, variant_order


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


def findings_table(findings: list[dict]) -> pd.DataFrame:
    """Columns severity, check, variant, message (in full), cells (count), and repro (the
    path of its reproduction script relative to the run folder, else why there is none:
    `repro_reason`) when any finding has one, and failure (a failed cell's failures/ file) when any
    has one; most severe first."""
    table = pd.DataFrame({
        "severity": [f.get("severity") for f in findings],
        "check": [f.get("check") for f in findings],
        "variant": [f.get("variant") for f in findings],
        "message": [f.get("message") for f in findings],
        "cells": [len(f.get("cells") or []) for f in findings],
    })
    if any(f.get("repro") or f.get("repro_reason") for f in findings):
        table["repro"] = [f.get("repro") or f.get("repro_reason") or None for f in findings]
    if any(f.get("failure_file") for f in findings):          # a failed cell's whole failure (failures/)
        table["failure"] = [f.get("failure_file") for f in findings]
    rank = (table["severity"].map({s: i for i, s in enumerate(SEVERITY_ORDER)})
            .fillna(len(SEVERITY_ORDER)))
    return (table.assign(rank=rank).sort_values("rank", kind="stable").drop(columns="rank")
            .reset_index(drop=True))


def finding_anchors(findings: list[dict]) -> list[str]:
    """One page anchor per finding, in list order: `finding-<check>-<variant>` ("all" for a finding
    about several, "*"), -1, -2 for a repeat. The verdict links to the findings table through these."""
    seen: dict[str, int] = {}
    anchors = []
    for f in findings:
        variant = str(f.get("variant"))
        slug = slugify(f"finding {f.get('check')} {'all' if variant == '*' else variant}")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.append(slug if count == 0 else f"{slug}-{count}")
    return anchors


def by_severity(findings: list[dict]) -> list[dict]:
    """Most severe first, the list's order kept within a severity (as findings_table sorts)."""
    rank = {s: i for i, s in enumerate(SEVERITY_ORDER)}
    return sorted(findings, key=lambda f: rank.get(f.get("severity"), len(SEVERITY_ORDER)))


def anchored_findings(findings: list[dict] | None) -> list[tuple[dict, str]]:
    """The findings about real code, most severe first, each with its page anchor: what the
    findings table shows and what the verdict links to (one function, so the two agree)."""
    real = by_severity([f for f in findings or [] if not is_control_finding(f)])
    return list(zip(real, finding_anchors(real)))


def findings_summary(findings: list[dict], about: str = "") -> str:
    """'41 findings: 15 error, 14 warning, 12 info.' (severities in order, others after);
    with about="about real code": '41 findings about real code: ...'."""
    counts: dict[str, int] = {}
    for f in findings:
        severity = str(f.get("severity"))
        counts[severity] = counts.get(severity, 0) + 1
    order = [s for s in SEVERITY_ORDER if s in counts] + sorted(set(counts) - set(SEVERITY_ORDER))
    parts = ", ".join(f"{counts[s]} {s}" for s in order)
    what = f" {about}" if about else ""
    return f"{len(findings)} finding{'s' if len(findings) != 1 else ''}{what}: {parts}."


def is_control_finding(finding: dict) -> bool:
    """A finding about a negative control (broken.*): expected, so not about real code."""
    return str(finding.get("variant") or "").startswith(NEGATIVE_CONTROL_PREFIX)


def negative_control_check(frame: pd.DataFrame, findings: list[dict]) -> pd.DataFrame:
    """The audit's self-check: was every measured negative control caught?

    One row per negative control with at least one ok record (a control that never ran
    cannot be caught). Columns control, flagged (some error-severity finding names it, or a warning
    of a check whose warnings are defects: core.defects.WARNING_DEFECTS),
    checks (the checks of those findings, comma-separated; "" when none), diagnosed (the
    known mistakes those findings' diagnoses name, most cells first; "" when none).
    """
    columns = ["control", "flagged", "checks", "diagnosed"]
    ok = ok_rows(frame) if "status" in frame.columns else frame.iloc[0:0]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    controls = variant_order(ok.loc[is_negative_control(ok["variant"]), "variant"])
    rows = []
    for control in controls:
        errors = [f for f in findings if f.get("variant") == control
                  and (f.get("severity") == "error" or f.get("check") in WARNING_DEFECTS)]
        checks = sorted({str(f.get("check")) + (f": {f['referee_check']}" if f.get("referee_check") else "")
                         for f in errors})                     # a referee finding names its check
        named = sorted((f for f in errors if f.get("diagnosis") not in (None, "none")),
                       key=lambda f: -int(f.get("diagnosis_cells") or 0))
        diagnosed = list(dict.fromkeys(str(f.get("diagnosis_title") or f["diagnosis"]) for f in named))
        rows.append({"control": control, "flagged": bool(checks), "checks": ", ".join(checks),
                     "diagnosed": ", ".join(diagnosed)})
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
                ("lse gradient", "lse_grads_within_budget", "lse_dq_err_ratio"))


def lse_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The log-sum-exp checks per variant x dtype over the ok cells of variants returning one: for
    the lse, the merge of two halves and the gradient through it, "within/judged" and the largest
    ratio to the baseline's error (the gradient: dq's); whether the lse carries a gradient; what it
    is on rows that see no key. Columns: variant, dtype, lse, merge, lse gradient, max ratios,
    differentiable, on empty rows."""
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


BUDGET_KINDS = (("over the budget at run time", "over the time budget while running (see Time budget)"),
                ("over the budget", "over the time budget when planned (see Time budget)"),
                ("over the per-cell limit", "predicted over the per-cell limit (see Time budget)"))


def budget_kind(reason: str) -> str | None:
    """The time-budget rule a skip reason names (its numbers differ per cell), or None."""
    for marker, kind in BUDGET_KINDS:
        if marker in reason:
            return kind
    return None


def budget_cuts_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Cells skipped by the time budget or the per-cell limit, most expensive first:
    id, variant, predicted_s, rule."""
    columns = ["id", "variant", "predicted_s", "rule"]
    if frame.empty or "reason" not in frame.columns:
        return pd.DataFrame(columns=columns)
    skipped = frame[frame["status"] == "skipped"].copy()
    skipped["rule"] = skipped["reason"].fillna("").astype(str).map(budget_kind)
    skipped = skipped[skipped["rule"].notna()]
    skipped["predicted_s"] = numeric(skipped, "predicted_s")
    return skipped.sort_values("predicted_s", ascending=False)[columns].reset_index(drop=True)


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
    of that one cell; a latency an unstable cell measured (noise_rules.unstable_mask) reads "12.3 ±9%". Column names 'T=128' (with 'causal ' or 'full ' in front when both occur;
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
