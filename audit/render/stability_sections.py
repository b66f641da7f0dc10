"""The report's sections about numerical stability (scenarios, error budget, fp16 overflow,
leakage, saturation; fully masked rows: masked_rows.py), the seed's claims and the figures. Never measures.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from ..core.runfolder import SEED_CLAIMS_FILE
from .data import (BASELINE_VARIANT, FP16_MAX, FP16_RANGE_SCENARIO, MASK_FORMS, NEGATIVE_CONTROL_PREFIX,
                   NORMAL_SCENARIO, dtype_order, golden_saturation_rows, normal_rows, ok_rows, scenario_alpha,
                   scenario_order, variant_order)
from .page import MISSING, Block, Figure, Heading, Mono, Table, format_value, para
from .stability_tables import (alignment_table, budget_table, fp16_overflow_table, gradient_budget_table,
                               gradient_table, leakage_table, lse_table, saturation_table, scenario_table, shards_table,
                               seed_claims_table, wide_by_variant)


def _names_or_none(values: Iterable[str]) -> str:
    names = list(values)
    return ", ".join(names) if names else "none"


def scenarios_section(frame: pd.DataFrame) -> list[Block]:
    table = scenario_table(frame)
    if table.empty:
        return []
    if not table["description"].astype(bool).any():
        table = table.drop(columns="description")
    return [
        Heading(2, "Input scenarios"),
        para("Each scenario is a seeded, deterministic input set shared by every variant "
             "(the float64 golden is computed once per set). Only ", Mono(NORMAL_SCENARIO),
             " feeds speed and memory; the others are stability checks, reported below."),
        Table(table),
    ]


def budget_section(frame: pd.DataFrame) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Error budget")]
    rule = para("A cell is within budget when its RMSE against the float64 golden is at most "
                "2 × the RMSE of ", Mono(BASELINE_VARIANT), " (hand-written attention) in the "
                "same dtype on the same inputs, plus atol(dtype): FlashAttention's rule. ",
                Mono("err_ratio"), " = rmse / rmse(", Mono(BASELINE_VARIANT),
                ", same dtype), so the baseline itself is 1. Cells whose baseline is not finite "
                "are not judged.")
    table = budget_table(frame)
    if table.empty or int(table["judged"].sum()) == 0:
        blocks += [rule, para("No cell has an error-budget verdict (",
                              Mono("within_budget"), " is null everywhere).")]
    else:
        by = table.columns[1]
        order = (scenario_order(table[by]) if by == "scenario"
                 else dtype_order(table[by]) if by == "dtype" else None)
        text = table.assign(verdict=[
            f"{int(w)}/{int(j)}" if j else MISSING for w, j in zip(table["within"], table["judged"])])
        blocks += [
            rule,
            Table(wide_by_variant(text, by, "verdict", order),
                  caption=f"Cells within budget / cells judged, per variant and {by}"),
            Table(wide_by_variant(table, by, "median_err_ratio", order),
                  caption=f"Median err_ratio (rmse / {BASELINE_VARIANT} rmse, same dtype), "
                          f"per variant and {by}"),
        ]
    grads = gradient_table(frame)
    if grads.empty:
        return blocks
    only_normal = not normal_rows(ok_rows(frame)).empty
    blocks += [
        Heading(3, "Gradient errors"),
        para("Median relative Frobenius error of dL/dq, dL/dk and dL/dv against float64 "
             "gradients" + (f", scenario {NORMAL_SCENARIO}." if only_normal
                             else ", all scenarios.")),
        Table(grads.rename(columns={"dq_err": "median dq_err", "dk_err": "median dk_err",
                                    "dv_err": "median dv_err"})),
    ]
    budget = gradient_budget_table(frame)
    if budget.empty:
        return blocks
    return blocks + [
        para("The gradient budget, every scenario: each of dq, dk, dv is within it when its RMSE "
             "against the float64 golden's is at most 2 × that of hand-written attention's gradient "
             "in the same dtype + atol (cells within / cells judged: forward-only cells, non-finite "
             "gradients and baselines are not judged), and its largest ratio to that baseline's error. "
             "Outside it: a grad_error_budget finding."),
        Table(budget),
    ]


def lse_section(frame: pd.DataFrame) -> list[Block]:
    """The log-sum-exp checks of the variants that return one (docs/numerics.md)."""
    table = lse_table(frame)
    if table.empty:
        return []
    return [
        Heading(3, "The log-sum-exp"),
        para("Variants returning their log-sum-exp (lse): the lse against the float64 golden's, the "
             "(out, lse) of two halves of the keys merged as split-KV and ring attention merge them, the "
             "same over the keys cut in more shards and merged in ring order (context parallel), and "
             "the gradient through the lse alone, each within 2 × hand-written attention's error in the "
             "same dtype + atol (cells within / cells judged), with the largest ratio; whether the lse "
             "carries a gradient, and what it is on rows that see no key (a merge reads only -inf and "
             "+inf as empty). Outside: lse_error_budget and lse_grad_budget findings."),
        Table(table),
        *_shards_blocks(frame),
    ]


def _shards_blocks(frame: pd.DataFrame) -> list[Block]:
    table = shards_table(frame)
    if table.empty:
        return []
    return [para("Context parallel: the largest error of the merged (out, lse) over the hand-written "
                 "baseline's on the same split, against the number of key shards merged. A ratio that "
                 "grows with the shards where 2 is fine is a kernel wrong on short key ranges or on "
                 "shards a row sees no key of (its lse there not -inf)."),
            Table(table)]


def _fp16_verdict(row: pd.Series) -> str:
    if row["finite"] is None or pd.isna(row["finite"]):
        return MISSING
    if row["finite"]:
        return f"finite ({int(row['cells'])} cells)"
    return (f"not finite: {int(row['nonfinite'])} NaN/inf in "
            f"{int(row['nonfinite_cells'])}/{int(row['cells'])} cells")


def fp16_section(frame: pd.DataFrame) -> list[Block]:
    table = fp16_overflow_table(frame)
    if table.empty:
        return []
    dtypes = dtype_order(table["dtype"])
    verdicts = table.assign(verdict=table.apply(_fp16_verdict, axis=1))
    wide = wide_by_variant(verdicts, "dtype", "verdict", dtypes)
    max_qk = table.groupby("variant")["max_qk"].max()
    wide["max |q·k|"] = wide["variant"].map(max_qk)
    wide["max |q·k| / 65504"] = wide["max |q·k|"] / FP16_MAX
    fp16 = table[table["dtype"] == "fp16"]
    largest = table["max_qk"].max()
    scale = (f"|q·k| reaches {format_value(largest)}, {format_value(largest / FP16_MAX)}× the "
             f"fp16 maximum 65504. " if pd.notna(largest) else "")
    if fp16.empty:
        summary = para(scale, "No fp16 cells in this run, so fp16 overflow is not tested.")
    else:
        finite = variant_order(fp16.loc[fp16["finite"].eq(True), "variant"])
        bad = variant_order(fp16.loc[fp16["finite"].eq(False), "variant"])
        correct_bad = [v for v in bad if not v.startswith(NEGATIVE_CONTROL_PREFIX)]
        broken_bad = [v for v in bad if v.startswith(NEGATIVE_CONTROL_PREFIX)]
        summary = para(scale, f"Stay finite in fp16: {_names_or_none(finite)}. Produce inf/NaN in rows "
                       f"that see a key: {_names_or_none(correct_bad)}"
                       + (f" (and negative controls {_names_or_none(broken_bad)})" if broken_bad else "")
                       + ".")
    return [
        Heading(2, "fp16 overflow"),
        para("Scenario ", Mono(FP16_RANGE_SCENARIO), ": q and k aligned with |q| ≈ 576 and "
             "|k| ≈ 383, so q·k overflows fp16 when it is formed before scaling or "
             "accumulated in fp16 (pytorch issue 119131). Counted: NaN and inf in output rows "
             "that see a key (", Mono("out_nonfinite_visible"), "), where float64 is finite."),
        summary,
        Table(wide),
    ]


def leakage_section(frame: pd.DataFrame) -> list[Block]:
    leaks = leakage_table(frame)
    align = alignment_table(frame)
    if leaks.empty and (align.empty or len(align.columns) < 2):
        return []
    blocks: list[Block] = [Heading(2, "Masking and leakage")]
    if not leaks.empty:
        order = scenario_order(leaks["scenario"])
        blocks += [
            para(Mono("leak_max_change"), ": the largest output change, on rows that must not "
                 "see them, when masked-out or future keys and values are changed (0 = no "
                 "leak). ", Mono("leak_mass"), ": the largest probability mass a row puts on "
                 "masked or future keys, for variants that expose their weights. Maxima over "
                 "cells. Under ", Mono(MASK_FORMS[2][0]), " a change is expected: the "
                 "finite mask lets fully masked rows attend to masked keys (see Fully masked "
                 "rows)."),
            Table(wide_by_variant(leaks, "scenario", "leak_max_change", order),
                  caption="Max leak_max_change per variant and scenario (0 = no leak)"),
        ]
        if leaks["leak_mass"].notna().any():
            blocks.append(Table(wide_by_variant(leaks, "scenario", "leak_mass", order),
                                caption="Max leak_mass per variant and scenario "
                                        "(— : weights not exposed)"))
    if not align.empty and len(align.columns) > 1:
        blocks += [
            Heading(3, "Causal alignment when q_len ≠ kv_len"),
            para("Which causal alignment the output follows in causal cells where the query "
                 "and key lengths differ: top-left (", Mono("is_causal=True"), ") or "
                 "bottom-right (", Mono("causal_lower_right"), ", what KV-cache decoding "
                 "needs), or neither."),
            Table(align),
        ]
    return blocks


def saturation_section(frame: pd.DataFrame) -> list[Block]:
    rows = ok_rows(frame)
    blocks: list[Block] = [Heading(2, "Saturation")]
    columns = ["max_prob", "entropy", "onehot_frac"]
    rows = golden_saturation_rows(rows[rows[columns].notna().any(axis=1)])
    if rows.empty:
        return blocks + [para("No saturation metrics recorded.")]
    table = rows.groupby(["scenario", "causal", "dtype", "d_k"])[columns].mean().reset_index()
    blocks += [
        para("Means over cells of the float64 golden's softmax: largest probability, "
             "normalized row entropy, fraction of rows with max p > 0.99."),
        Table(table),
    ]
    ok = ok_rows(frame)
    full = ok[~ok["causal"].astype(bool)]
    sat = saturation_table(full if not full.empty else ok)
    if sat.empty:
        return blocks
    order = scenario_order(sat["scenario"])
    inputs = (sat.groupby("scenario", sort=False)
              .agg(max_logit=("max_logit", "max"), golden=("golden_onehot_frac", "mean"),
                   cells=("cells", "sum"))
              .reindex(order).reset_index())
    inputs.insert(1, "alpha", inputs["scenario"].map(scenario_alpha))
    inputs = inputs.rename(columns={"max_logit": "max |logit|",
                                    "golden": "golden onehot_frac (mean)"})
    inputs = inputs.drop(columns=[c for c in ("max |logit|", "golden onehot_frac (mean)")
                                  if inputs[c].isna().all()])
    source = (sat.groupby("variant")["source"]
              .agg(lambda s: ", ".join(sorted({str(v) for v in s if v is not None}))))
    scope = (", non-causal cells (a causal first row sees one key, so it is one-hot by "
             "construction). " if not full.empty else ". ")
    onehot = wide_by_variant(sat, "scenario", "onehot_frac", order)
    onehot.insert(1, "source", onehot["variant"].map(source))
    return blocks + [
        Heading(3, "Saturation by scenario"),
        para("Scenarios normal, ", Mono("scaled_xA"), " (q multiplied by A) and outliers",
             scope, "Max |logit| is max |q·k·scale| in float64, a property of the inputs; the golden "
             "one-hot fraction is what the inputs alone cause. Per variant, ",
             Mono("source"), " says whether its columns come from its own weights (variant) "
             "or, for variants that hide them, from the float64 golden (golden)."),
        Table(inputs, caption="Inputs: largest logit and golden one-hot fraction per scenario"),
        Table(onehot, caption="Mean onehot_frac (rows with max p > 0.99) per variant and "
                              "scenario"),
        Table(wide_by_variant(sat, "scenario", "min_entropy", order),
              caption="Minimum normalized row entropy per variant and scenario"),
    ]


def _format_measured(text: Any) -> str:
    """A measured value from the CSV: numbers to 3 significant digits, words as written."""
    value = str(text).strip()
    if value == "":
        return MISSING
    try:
        number = float(value)
    except ValueError:
        return value
    if not math.isfinite(number):
        return value
    if number.is_integer() and "." not in value and "e" not in value.lower():
        return str(int(number))
    return format_value(number)


def seed_section(run_dir: Path) -> list[Block]:
    claims = seed_claims_table(run_dir)
    if claims is None:
        return []
    blocks: list[Block] = [
        Heading(2, "The seed's claims, measured"),
        para("The seed tutorial prints illustrative numbers (sample output it says looks "
             "\"roughly like\" this); here each of its experiments is repeated with a fixed "
             "seed, and the measured value is set beside the printed one. A printed number "
             "holds when the measurement is within 25% of it (std claims: within 0.05); a "
             "yes/no claim holds when the behaviour matches."),
    ]
    if claims.empty:
        return blocks + [para(f"{SEED_CLAIMS_FILE} lists no claims.")]
    held = int(claims["holds"].eq(True).sum())
    display = pd.DataFrame({
        "claim": claims["claim"],
        "d_k": claims["d_k"].astype(object).where(claims["d_k"].notna(), None),
        "seed's printed value": claims["seed_value"].map(lambda v: str(v) or MISSING),
        "measured value": claims["measured_value"].map(_format_measured),
        "holds": claims["holds"].map(lambda h: "✓" if h is True else "✗" if h is False
                                     else MISSING),
    })
    return blocks + [para(f"{held} of {len(claims)} printed claims hold."), Table(display)]


def figures_section(figures: list[Figure] | None) -> list[Block]:
    """The figures drawn; None: none were drawn for this page (build_report(figures=False))."""
    if figures is None:
        return [Heading(2, "Figures"), para("Not drawn for this page.")]
    if not figures:
        return [Heading(2, "Figures"), para("No data to plot.")]
    return [Heading(2, "Figures"), *figures]
