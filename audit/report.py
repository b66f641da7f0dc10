"""Turn a run folder's records into figures, index.md and index.html.

The report reads records only and never measures, so it can be rebuilt
anywhere without torch. Markdown and HTML are rendered from one list of
blocks (heading, paragraph, code, table, figure), so the two never diverge.
"""
from __future__ import annotations

import html
import itertools
import json
import math
import numbers
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Union

import numpy as np
import pandas as pd

from .grid import AXES, INPUT_AXES
from .records import read_records, to_frame

NEGATIVE_CONTROL_PREFIX = "broken."
BASELINE_VARIANT = "eager"
SEVERITY_ORDER = ("error", "warning", "info")
MIB = 2 ** 20
LOG_FLOOR = 1e-12          # rel_err values below this (exact 0 included) are drawn here
REASON_WIDTH = 120
MISSING = "—"

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
SEED_CLAIMS_FILE = "seed_claims.csv"
GOLDEN_SOURCE_PREFERENCE = ("sdpa", "sdpa_math", "compiled")
# Axes along which a per-cell label (masked_rows, causal_alignment) may differ; the first
# axis that explains the difference is named, e.g. "nan (fp32), other (fp16)".
DESCRIBE_AXES = ("dtype", "causal", "device", "d_k", "seq_len", "batch", "heads", "kv_heads")


# --------------------------------------------------------------------------- blocks

@dataclass(frozen=True)
class Mono:
    """Inline code inside a paragraph (names such as `fwd_ms` or `broken.*`)."""

    text: str


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    parts: tuple[Union[str, Mono], ...]


@dataclass(frozen=True)
class Code:
    text: str


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    filename: str
    title: str
    caption: str


Block = Union[Heading, Paragraph, Code, Table, Figure]


def _para(*parts: Union[str, Mono]) -> Paragraph:
    return Paragraph(tuple(parts))


# --------------------------------------------------------------------------- formatting

def format_value(value: Any) -> str:
    """Display text of one table cell: 3 significant digits, blanks for missing."""
    if value is None or value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isnan(number):
            return MISSING
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        if number == 0:
            return "0"
        magnitude = math.floor(math.log10(abs(number)))
        if magnitude >= 5 or magnitude < -3:
            return f"{number:.2e}"
        return f"{number:.{max(0, 2 - magnitude)}f}"
    return str(value)


def _display_frame(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.astype(object).map(format_value)


def markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame (index ignored) as a GitHub-flavoured markdown table."""
    def cell(text: str) -> str:
        return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")

    shown = _display_frame(frame)
    lines = ["| " + " | ".join(cell(c) for c in shown.columns) + " |",
             "|" + "|".join("---" for _ in shown.columns) + "|"]
    for row in shown.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def html_table(frame: pd.DataFrame) -> str:
    """A DataFrame (index ignored) as an HTML table with the same cell text as markdown."""
    return _display_frame(frame).to_html(index=False, escape=True, border=0)


def _markdown_inline(parts: Iterable[Union[str, Mono]]) -> str:
    return "".join(f"`{p.text}`" if isinstance(p, Mono) else p for p in parts)


def _html_inline(parts: Iterable[Union[str, Mono]]) -> str:
    return "".join(f"<code>{html.escape(p.text)}</code>" if isinstance(p, Mono)
                   else html.escape(p) for p in parts)


def render_markdown(blocks: Iterable[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + block.text)
        elif isinstance(block, Paragraph):
            out.append(_markdown_inline(block.parts))
        elif isinstance(block, Code):
            out.append("```\n" + block.text + "\n```")
        elif isinstance(block, Table):
            caption = f"*{block.caption}*\n\n" if block.caption else ""
            out.append(caption + markdown_table(block.frame))
        else:
            out.append(f"![{block.title}]({block.filename})\n\n{block.caption}")
    return "\n\n".join(out) + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f2f2f2; }
td:first-child, th:first-child { text-align: left; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
code { background: #f2f2f2; padding: 0 0.2em; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
.caption { font-style: italic; margin-bottom: 0.2em; }
"""


def render_html(blocks: Iterable[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{_html_inline(block.parts)}</p>")
        elif isinstance(block, Code):
            out.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
        elif isinstance(block, Table):
            caption = (f'<p class="caption">{html.escape(block.caption)}</p>'
                       if block.caption else "")
            out.append(caption + html_table(block.frame))
        else:
            out.append(f'<figure><img src="{html.escape(block.filename)}" '
                       f'alt="{html.escape(block.title)}">'
                       f"<figcaption>{html.escape(block.caption)}</figcaption></figure>")
    body = "\n".join(out)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>attn-audit report</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            f"{body}\n</body>\n</html>\n")


# --------------------------------------------------------------------------- data

def is_negative_control(variants: pd.Series) -> pd.Series:
    """Deliberately broken variants: kept for numerics, never ranked for speed."""
    return variants.astype(str).str.startswith(NEGATIVE_CONTROL_PREFIX)


def _prepare(frame: pd.DataFrame) -> pd.DataFrame:
    """Measurement columns as floats (null -> NaN) so pandas can aggregate them; a frame without
    kv_heads (made before the axis) is multi-head."""
    numeric = {col: pd.to_numeric(frame[col], errors="coerce").astype(float)
               for col in METRIC_COLUMNS if col in frame.columns}
    if "kv_heads" not in frame.columns and "heads" in frame.columns:
        numeric["kv_heads"] = frame["heads"]
    return frame.assign(**numeric)


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"]


def _normal_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Cells of the `normal` scenario (a missing scenario counts as normal, as in old runs)."""
    if "scenario" not in frame.columns:
        return frame
    scenario = frame["scenario"]
    return frame[scenario.isna() | (scenario.astype(str) == NORMAL_SCENARIO)]


def _speed_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured cells that may be ranked for speed and memory: scenario normal only (the
    other scenarios are stability checks), negative controls left out."""
    ok = _normal_rows(_ok(frame))
    return ok[~is_negative_control(ok["variant"])]


def _matched_ratios(frame: pd.DataFrame, metric: str, baseline: str) -> pd.DataFrame:
    """variant metric / baseline metric for every cell both measured (same axes but variant)."""
    rows = _prepare(_speed_rows(frame))
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


def _median_pivot(rows: pd.DataFrame, value: str, scale: float = 1.0) -> pd.DataFrame:
    """Median of `value` by variant (rows) x seq_len (columns), other axes pooled."""
    pivot = (rows.assign(value=rows[value] / scale)
             .pivot_table(index="variant", columns="seq_len", values="value", aggfunc="median"))
    pivot.columns = [f"T={c}" for c in pivot.columns]
    return pivot.reset_index()


def median_table(frame: pd.DataFrame, dtype: str, metric: str = "fwd_ms",
                  scale: float = 1.0) -> pd.DataFrame:
    """Median `metric` / scale by variant x seq_len for one dtype, over the speed cells
    (ok, scenario normal, no negative controls), other axes pooled. Columns: variant, T=..."""
    rows = _prepare(_speed_rows(frame))
    return _median_pivot(rows[rows["dtype"] == dtype], metric, scale)


def _representative_slice(rows: pd.DataFrame,
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
    for axis in ("device", "batch", "heads", "kv_heads", "causal", "scenario"):
        if axis in vary or not len(chosen) or axis not in chosen.columns:
            continue
        if axis == "batch":
            chosen, label = _fix_batch(chosen)
            labels.append(label)
            continue
        value = chosen[axis].mode().iloc[0]
        chosen = chosen[chosen[axis] == value]
        if axis != "kv_heads" or (chosen["kv_heads"] != chosen["heads"]).any():   # MHA: no KV label
            labels.append(_axis_label(axis, value))
    return chosen, " ".join(labels)


def _fix_batch(rows: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Rows of one batch size, or of one token count B·T when that keeps more seq_lens."""
    batch = rows["batch"].mode().iloc[0]
    by_batch = rows[rows["batch"] == batch]
    tokens = rows["batch"].astype(int) * rows["seq_len"].astype(int)
    by_tokens = rows[tokens == tokens.mode().iloc[0]]
    if by_tokens["seq_len"].nunique() > by_batch["seq_len"].nunique():
        return by_tokens, f"{int(tokens.mode().iloc[0])} tokens (B·T)"
    return by_batch, _axis_label("batch", batch)


def _axis_label(axis: str, value: Any) -> str:
    if axis == "batch":
        return f"B{value}"
    if axis == "heads":
        return f"H{value}"
    if axis == "kv_heads":
        return f"KV{value}"
    if axis == "causal":
        return "causal" if value else "full"
    if axis == "d_k":
        return f"d_k={value}"
    if axis == "seq_len":
        return f"T={value}"
    return str(value)


# --------------------------------------------------------------------------- stability tables
#
# Small functions that return DataFrames, so tests check numbers and the sections only
# render them. Each takes the tidy frame (records.load or to_frame) and reads ok cells.

def _num(frame: pd.DataFrame, column: str) -> pd.Series:
    """A column as floats (null and text -> NaN); all NaN when the column is absent."""
    if column not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").astype(float)


def _flag(frame: pd.DataFrame, column: str, value: bool) -> pd.Series:
    """True where a true/false/null column holds exactly `value`."""
    if column not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame[column].map(lambda v: isinstance(v, (bool, np.bool_)) and bool(v) == value)


def _variant_order(variants: Iterable[Any]) -> list[str]:
    """Correct variants first (sorted), negative controls after."""
    names = sorted({str(v) for v in variants})
    return ([n for n in names if not n.startswith(NEGATIVE_CONTROL_PREFIX)]
            + [n for n in names if n.startswith(NEGATIVE_CONTROL_PREFIX)])


def _scenario_descriptions() -> dict[str, str]:
    """name -> description from audit.inputs (torch-free at import), in its order."""
    try:
        from .inputs import SCENARIOS
    except Exception:  # the report must render even if the catalogue cannot be read
        return {}
    return {name: str(getattr(s, "description", "")) for name, s in SCENARIOS.items()}


def _scenario_order(scenarios: Iterable[Any]) -> list[str]:
    """normal first, then the catalogue's order, then unknown names sorted."""
    present = {str(s) for s in scenarios if s is not None and not pd.isna(s)}
    known = [NORMAL_SCENARIO, *_scenario_descriptions()]
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
            lambda row: " ".join(_axis_label(a, row[a]) for a in split), axis=1)
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
            return _dtype_order(rows["dtype"]).index(value)
        return value if isinstance(value, numbers.Real) else str(value)
    keyed = {label: tuple(rank(a, row[a]) for a in split)
             for label, (_, row) in zip(labels, rows[list(split)].iterrows())}
    return sorted(keyed, key=lambda label: keyed[label])


def scenario_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns scenario, description, cells, ok: the input scenarios present."""
    columns = ["scenario", "description", "cells", "ok"]
    if frame.empty or "scenario" not in frame.columns:
        return pd.DataFrame(columns=columns)
    scenario = frame["scenario"].fillna(NORMAL_SCENARIO).astype(str)
    descriptions = _scenario_descriptions()
    rows = []
    for name in _scenario_order(scenario):
        mask = scenario == name
        rows.append({"scenario": name, "description": descriptions.get(name, ""),
                     "cells": int(mask.sum()), "ok": int((frame["status"][mask] == "ok").sum())})
    return pd.DataFrame(rows, columns=columns)


def findings_table(findings: list[dict]) -> pd.DataFrame:
    """Columns severity, check, variant, message (in full), cells (count); most severe first."""
    table = pd.DataFrame({
        "severity": [f.get("severity") for f in findings],
        "check": [f.get("check") for f in findings],
        "variant": [f.get("variant") for f in findings],
        "message": [f.get("message") for f in findings],
        "cells": [len(f.get("cells") or []) for f in findings],
    })
    rank = (table["severity"].map({s: i for i, s in enumerate(SEVERITY_ORDER)})
            .fillna(len(SEVERITY_ORDER)))
    return (table.assign(rank=rank).sort_values("rank", kind="stable").drop(columns="rank")
            .reset_index(drop=True))


def findings_summary(findings: list[dict]) -> str:
    """'41 findings: 15 error, 14 warning, 12 info.' (severities in order, others after)."""
    counts: dict[str, int] = {}
    for f in findings:
        severity = str(f.get("severity"))
        counts[severity] = counts.get(severity, 0) + 1
    order = [s for s in SEVERITY_ORDER if s in counts] + sorted(set(counts) - set(SEVERITY_ORDER))
    parts = ", ".join(f"{counts[s]} {s}" for s in order)
    return f"{len(findings)} finding{'s' if len(findings) != 1 else ''}: {parts}."


def masked_rows_table(frame: pd.DataFrame) -> pd.DataFrame:
    """What each variant returns on fully masked rows, per mask form.

    Columns: variant, then one per form present (bool, -inf float, finfo.min float);
    values nan, zero, uniform, other, mixed, or a split such as "nan (fp32), other (fp16)".
    """
    ok = _ok(frame)
    if "masked_rows" not in ok.columns:
        return pd.DataFrame(columns=["variant"])
    ok = ok[ok["masked_rows"].notna()]
    forms = [(s, label) for s, label in MASK_FORMS if (ok["scenario"] == s).any()]
    ok = ok[ok["scenario"].isin([s for s, _ in forms])]
    out = []
    for variant in _variant_order(ok["variant"]):
        rows = ok[ok["variant"] == variant]
        out.append({"variant": variant, **{label: describe_values(rows[rows["scenario"] == s],
                                                                  "masked_rows")
                                           for s, label in forms}})
    return pd.DataFrame(out, columns=["variant", *[label for _, label in forms]])


def fp16_overflow_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Scenario fp16_range, per variant and dtype.

    Columns: variant, dtype, cells, nonfinite_cells (cells with out_nonfinite_visible > 0),
    nonfinite (NaN+inf values in rows that see a key, summed), finite (True: no such value
    in any measured cell; None: not measured), max_qk (largest |q·k|, compare with 65504).
    """
    columns = ["variant", "dtype", "cells", "nonfinite_cells", "nonfinite", "finite", "max_qk"]
    ok = _ok(frame)
    rows = ok[ok["scenario"] == FP16_RANGE_SCENARIO]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    nonfinite = _num(rows, "out_nonfinite_visible")
    rows = rows.assign(_nf=nonfinite, _bad=(nonfinite > 0).astype(int),
                       _measured=nonfinite.notna().astype(int), _qk=_num(rows, "max_qk"))
    out = []
    for variant in _variant_order(rows["variant"]):
        for dtype in _dtype_order(rows.loc[rows["variant"] == variant, "dtype"]):
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
    ok = _ok(frame)
    if by is None:
        by = "scenario" if ok["scenario"].nunique() > 1 else "dtype"
    columns = ["variant", by, "within", "judged", "frac_within", "median_err_ratio", "cells"]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    within = _flag(ok, "within_budget", True)
    judged = within | _flag(ok, "within_budget", False)
    rows = ok.assign(_within=within.astype(int), _judged=judged.astype(int),
                     _ratio=_num(ok, "err_ratio"))
    grouped = rows.groupby(["variant", by], sort=False).agg(
        within=("_within", "sum"), judged=("_judged", "sum"),
        median_err_ratio=("_ratio", "median"), cells=("_within", "size")).reset_index()
    grouped["frac_within"] = (grouped["within"] / grouped["judged"].where(grouped["judged"] > 0))
    order = _scenario_order(grouped[by]) if by == "scenario" else (
        _dtype_order(grouped[by]) if by == "dtype" else _sorted_values(list(grouped[by].unique())))
    grouped = grouped.assign(
        _v=grouped["variant"].map({v: i for i, v in enumerate(_variant_order(grouped["variant"]))}),
        _b=grouped[by].map({b: i for i, b in enumerate(order)}))
    return grouped.sort_values(["_v", "_b"]).reset_index(drop=True)[columns]


def gradient_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Median dq_err, dk_err, dv_err per variant x dtype, over scenario normal's ok cells
    (all ok cells when no normal cell exists). Columns: variant, dtype, dq_err, dk_err,
    dv_err, cells."""
    columns = ["variant", "dtype", "dq_err", "dk_err", "dv_err", "cells"]
    ok = _ok(frame)
    normal = _normal_rows(ok)
    rows = normal if not normal.empty else ok
    rows = rows.assign(**{c: _num(rows, c) for c in ("dq_err", "dk_err", "dv_err")})
    rows = rows[rows[["dq_err", "dk_err", "dv_err"]].notna().any(axis=1)]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for variant in _variant_order(rows["variant"]):
        for dtype in _dtype_order(rows.loc[rows["variant"] == variant, "dtype"]):
            g = rows[(rows["variant"] == variant) & (rows["dtype"] == dtype)]
            out.append({"variant": variant, "dtype": dtype, "dq_err": g["dq_err"].median(),
                        "dk_err": g["dk_err"].median(), "dv_err": g["dv_err"].median(),
                        "cells": len(g)})
    return pd.DataFrame(out, columns=columns)


def leakage_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per variant x scenario: max leak_max_change (0 = no leak) and max leak_mass, over ok
    cells where either was measured. Columns: variant, scenario, leak_max_change,
    leak_mass, cells."""
    columns = ["variant", "scenario", "leak_max_change", "leak_mass", "cells"]
    ok = _ok(frame)
    rows = ok.assign(leak_max_change=_num(ok, "leak_max_change"), leak_mass=_num(ok, "leak_mass"))
    rows = rows[rows[["leak_max_change", "leak_mass"]].notna().any(axis=1)]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for variant in _variant_order(rows["variant"]):
        v = rows[rows["variant"] == variant]
        for scenario in _scenario_order(v["scenario"]):
            g = v[v["scenario"] == scenario]
            out.append({"variant": variant, "scenario": scenario,
                        "leak_max_change": g["leak_max_change"].max(),
                        "leak_mass": g["leak_mass"].max(), "cells": len(g)})
    return pd.DataFrame(out, columns=columns)


def alignment_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Causal alignment each variant applies when q_len != kv_len (top-left, bottom-right,
    neither), per scenario among cross_causal and decode. Columns: variant, scenarios."""
    ok = _ok(frame)
    if "causal_alignment" not in ok.columns:
        return pd.DataFrame(columns=["variant"])
    ok = ok[ok["causal_alignment"].notna()]
    scenarios = [s for s in ALIGNMENT_SCENARIOS if (ok["scenario"] == s).any()]
    scenarios += [s for s in _scenario_order(ok["scenario"]) if s not in scenarios]
    out = []
    for variant in _variant_order(ok["variant"]):
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
    ok = _ok(frame)
    ok = ok[ok["scenario"].astype(str).map(_is_saturation_scenario)]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    rows = ok.assign(**{c: _num(ok, c) for c in ("onehot_frac", "min_entropy", "max_logit",
                                                 "golden_onehot_frac")})
    out = []
    for scenario in _scenario_order(rows["scenario"]):
        s = rows[rows["scenario"] == scenario]
        for variant in _variant_order(s["variant"]):
            g = s[s["variant"] == variant]
            out.append({"scenario": scenario, "variant": variant,
                        "source": describe_values(g, "saturation_source"),
                        "onehot_frac": g["onehot_frac"].mean(),
                        "min_entropy": g["min_entropy"].min(),
                        "max_logit": g["max_logit"].max(),
                        "golden_onehot_frac": g["golden_onehot_frac"].mean(), "cells": len(g)})
    return pd.DataFrame(out, columns=columns)


def _golden_saturation_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Cells whose saturation columns come from the float64 golden (source golden or null,
    as in schema-1 runs); all cells if none are."""
    if "saturation_source" not in rows.columns:
        return rows
    golden = rows[rows["saturation_source"].astype(str) != "variant"]
    return golden if not golden.empty else rows


def saturation_sweep_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean onehot_frac and entropy vs logit scale alpha (normal = 1, scaled_xA = A).

    One line from the golden (rows with saturation_source golden of one variant, sdpa when
    present: the values are the input set's, the same for every such variant), plus one per
    variant whose saturation_source is variant (its own weights). Non-causal cells when any,
    averaged over the other axes. Empty when no scaled_* scenario is present.
    Columns: line, source, alpha, onehot_frac, entropy, cells.
    """
    columns = ["line", "source", "alpha", "onehot_frac", "entropy", "cells"]
    ok = _ok(frame)
    if not ok["scenario"].astype(str).str.startswith(SCALED_PREFIX).any():
        return pd.DataFrame(columns=columns)
    alpha = ok["scenario"].map(scenario_alpha)
    rows = ok.assign(alpha=pd.to_numeric(alpha, errors="coerce"),
                     onehot_frac=_num(ok, "onehot_frac"), entropy=_num(ok, "entropy"))
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
        ref = next((v for v in GOLDEN_SOURCE_PREFERENCE if v in names), _variant_order(names)[0])
        lines.append((f"float64 golden (via {ref})", "golden", golden[golden["variant"] == ref]))
    own = rows[source == "variant"]
    for variant in _variant_order(own["variant"]):
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


# --------------------------------------------------------------------------- figures

def _variant_colors(variants: Iterable[str]) -> dict[str, Any]:
    import matplotlib

    names = sorted(set(variants))
    cmap = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


DTYPE_COLORS = {"fp32": "tab:blue", "fp16": "tab:orange", "bf16": "tab:green"}
# Marker and line style per dtype, so lines that coincide (saturation is a property of
# the inputs, nearly equal across dtypes) stay visible.
DTYPE_STYLES = {"fp32": ("o", "-"), "fp16": ("s", "--"), "bf16": ("^", ":")}


def _log2_x(ax: Any, values: Iterable[Any]) -> None:
    from matplotlib.ticker import NullLocator, ScalarFormatter

    ticks = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def _suptitle(fig: Any, text: str, fontsize: float = 10) -> None:
    """A figure title wrapped to the figure's width, so a long one is never cut off."""
    import textwrap

    width = max(20, int(fig.get_figwidth() * 72 / (0.62 * fontsize)))
    lines = [textwrap.fill(line, width) for line in text.split("\n")]
    fig.suptitle("\n".join(lines), fontsize=fontsize)


def overflowing_artists(fig: Any, tolerance_px: float = 1.0) -> list[str]:
    """Texts, legends and axes that reach outside the figure's canvas (drawn cut off)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    out = []
    candidates = [*fig.texts, *fig.legends, *fig.axes]
    for ax in fig.axes:
        candidates += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        if ax.get_legend() is not None:
            candidates.append(ax.get_legend())
    for artist in candidates:
        if not artist.get_visible() or (hasattr(artist, "get_text") and not artist.get_text()):
            continue
        box = artist.get_tightbbox(renderer) if hasattr(artist, "get_tightbbox") \
            else artist.get_window_extent(renderer)
        if box is None or box.width == 0:
            continue
        if (box.x0 < canvas.x0 - tolerance_px or box.y0 < canvas.y0 - tolerance_px
                or box.x1 > canvas.x1 + tolerance_px or box.y1 > canvas.y1 + tolerance_px):
            label = artist.get_text() if hasattr(artist, "get_text") else type(artist).__name__
            out.append(f"{type(artist).__name__} {label[:40]!r}: {box.bounds} outside {canvas.bounds}")
    return out


def _legend_below(fig: Any, axes: Iterable[Any]) -> None:
    """One legend for all panels, outside them, so it never covers data; as many columns
    (at most 4) as fit the figure's width."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if not handles:
        return
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(len(handles), 4), 0, -1):
        legend = fig.legend(handles.values(), handles.keys(), loc="outside lower center",
                            ncol=ncol, frameon=False)
        if ncol == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return
        legend.remove()


def _panel_values(data: pd.DataFrame, axis: str | None) -> list[Any]:
    if axis is None:
        return [None]
    return _dtype_order(data[axis]) if axis == "dtype" else sorted(data[axis].unique())


def _panel_title(axis: str | None, value: Any) -> str:
    if axis is None:
        return ""
    return str(value) if axis in ("dtype", "device") else f"{axis}={value}"


def _readable_log_y(ax: Any) -> None:
    """Log y axis labelled 1, 2, 5 x 10^k in plain numbers instead of 6 x 10^-1."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _line_panels(rows: pd.DataFrame, path: Path, *, y: str, ylabel: str, title: str,
                 colors: dict[str, Any], panel_rows: str | None = None,
                 panel_cols: str | None = None, yerr: str | None = None, scale: float = 1.0,
                 logy: bool = True) -> bool:
    """Lines of median y vs seq_len, one per variant, in a grid of panels."""
    import matplotlib.pyplot as plt

    data = rows.assign(y=rows[y] / scale,
                       err=(rows[yerr] / scale) if yerr else np.nan)
    data = data[np.isfinite(data["y"]) & ((data["y"] > 0) | (not logy))]
    if data.empty:
        return False
    row_values = _panel_values(data, panel_rows)
    col_values = _panel_values(data, panel_cols)
    fig, axes = plt.subplots(len(row_values), len(col_values), squeeze=False, sharex=True,
                             sharey=True, layout="constrained",
                             figsize=(max(6.0, 3.6 * len(col_values) + 1.0),
                                      2.8 * len(row_values) + 1.4))
    for i, row_value in enumerate(row_values):
        for j, col_value in enumerate(col_values):
            ax = axes[i][j]
            panel = data
            for axis, value in ((panel_rows, row_value), (panel_cols, col_value)):
                if axis is not None:
                    panel = panel[panel[axis] == value]
            lines = panel.groupby(["variant", "seq_len"])[["y", "err"]].median().reset_index()
            for variant, line in lines.groupby("variant"):
                upper = line["err"].fillna(0) / 2
                lower = np.minimum(upper, line["y"] * 0.9)  # keep bars above 0 on a log axis
                ax.errorbar(line["seq_len"], line["y"], yerr=[lower, upper] if yerr else None,
                            marker="o", markersize=3, capsize=2, linewidth=1.2,
                            color=colors.get(variant), label=variant,
                            linestyle="--" if variant.startswith(NEGATIVE_CONTROL_PREFIX) else "-")
            _log2_x(ax, data["seq_len"])
            if logy:
                _readable_log_y(ax)
            else:
                ax.set_ylim(bottom=0)
            ax.grid(True, which="major", alpha=0.3)
            ax.set_title(", ".join(t for t in (_panel_title(panel_rows, row_value),
                                               _panel_title(panel_cols, col_value)) if t),
                         fontsize=9)
            if i == len(row_values) - 1:
                ax.set_xlabel("seq_len T (tokens)")
            if j == 0:
                ax.set_ylabel(ylabel)
    _suptitle(fig, title, fontsize=10)
    _legend_below(fig, axes.flat)
    _save(fig, path)
    return True


def _draw_latency(metric: str, label: str) -> Callable[[pd.DataFrame, Path, dict], str | None]:
    def draw(frame: pd.DataFrame, path: Path, colors: dict) -> str | None:
        rows, selected = _representative_slice(_speed_rows(frame))
        drawn = _line_panels(rows, path, y=metric, yerr=f"{metric.removesuffix('_ms')}_iqr_ms",
                             ylabel=f"{label} latency (ms)", panel_rows="dtype", panel_cols="d_k",
                             colors=colors,
                             title=f"{label} latency, median ± IQR/2 ({selected})")
        return (f"Median {label} latency vs sequence length per variant ({selected}); "
                "error bars span the interquartile range.") if drawn else None
    return draw


def _draw_memory(frame: pd.DataFrame, path: Path, colors: dict) -> str | None:
    rows, selected = _representative_slice(_speed_rows(frame))
    if rows.empty:
        return None
    d_k = int(rows["d_k"].max())
    rows = rows[rows["d_k"] == d_k]
    omitted = int((rows["peak_bytes"] <= 0).sum())
    note = f"; {omitted} cells with 0 bytes omitted" if omitted else ""
    drawn = _line_panels(rows, path, y="peak_bytes", scale=MIB, ylabel="peak memory (MiB)",
                         panel_cols="dtype", colors=colors,
                         title=f"Peak forward memory (d_k={d_k}, {selected}{note})")
    return (f"Peak memory of one forward call above the baseline, d_k={d_k} ({selected}){note}."
            if drawn else None)


def _draw_throughput(frame: pd.DataFrame, path: Path, colors: dict) -> str | None:
    rows, selected = _representative_slice(_speed_rows(frame))
    if rows.empty:
        return None
    d_k = int(rows["d_k"].max())
    drawn = _line_panels(rows[rows["d_k"] == d_k], path, y="gflops_per_s",
                         ylabel="forward GFLOP/s", panel_cols="dtype", colors=colors,
                         title=f"Achieved forward throughput (d_k={d_k}, {selected})")
    return (f"Achieved forward GFLOP/s (forward FLOPs / median forward time) vs sequence length, "
            f"d_k={d_k} ({selected}).") if drawn else None


def _draw_roofline(frame: pd.DataFrame, path: Path, colors: dict) -> str | None:
    """Achieved forward FLOP/s against arithmetic intensity, under the run's measured roofline."""
    import matplotlib.pyplot as plt
    import numpy as np

    rows = _speed_rows(frame)
    needed = ["flops", "bytes", "gflops_per_s", "peak_flops_per_s", "peak_bytes_per_s"]
    if rows.empty or any(c not in rows for c in needed):
        return None
    rows = rows.dropna(subset=needed)
    if rows.empty:
        return None
    dtypes = _dtype_order(rows["dtype"].unique())
    fig, axes = plt.subplots(1, len(dtypes), squeeze=False, figsize=(max(7.0, 4.6 * len(dtypes)), 4.8),
                             layout="constrained")
    for ax, dtype in zip(axes[0], dtypes):
        sub = rows[rows["dtype"] == dtype]
        intensity = pd.to_numeric(sub["flops"]) / pd.to_numeric(sub["bytes"])
        peak = float(pd.to_numeric(sub["peak_flops_per_s"]).iloc[0])
        bandwidth = float(pd.to_numeric(sub["peak_bytes_per_s"]).iloc[0])
        x = np.logspace(np.log10(max(intensity.min() / 4, 1e-3)), np.log10(intensity.max() * 4), 200)
        ax.plot(x, np.minimum(peak, bandwidth * x) / 1e9, color="0.3", lw=2,
                label="measured ceiling")
        for variant, group in sub.groupby("variant"):
            ax.scatter(pd.to_numeric(group["flops"]) / pd.to_numeric(group["bytes"]),
                       pd.to_numeric(group["gflops_per_s"]), s=14, color=colors.get(variant), label=variant)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte)")
        ax.set_ylabel("forward GFLOP/s")
        ax.set_title(f"{dtype}: {peak / 1e12:.3g} TFLOP/s, {bandwidth / 1e9:.3g} GB/s", fontsize=9)
    _legend_below(fig, axes[0])
    _suptitle(fig, "Forward throughput against the measured ceiling\n"
                 "(min of matmul FLOP/s and copy bandwidth × intensity)", fontsize=10)
    _save(fig, path)
    return ("Roofline: each point is a speed cell's achieved forward GFLOP/s at its arithmetic intensity "
            "(FLOPs / fewest bytes); the grey line is the run's measured ceiling (run.json: ceilings).")


def _draw_compile(frame: pd.DataFrame, path: Path, colors: dict) -> str | None:
    rows = _speed_rows(frame)
    rows = rows[rows["compile_s"].notna()]
    drawn = _line_panels(rows, path, y="compile_s", ylabel="compile time (s)", colors=colors,
                         panel_cols="device", logy=False,
                         title="Compile time of compiled variants (median over other axes)")
    return ("Compile time (first call minus steady state, fwd plus fwd+bwd) per compiled "
            "variant vs sequence length.") if drawn else None


def _dtype_order(values: Iterable[str]) -> list[str]:
    """fp32, fp16, bf16 first (widest to narrowest), anything else after."""
    present = set(values)
    known = [d for d in DTYPE_COLORS if d in present]
    return known + sorted(present - set(known))


def _grouped_bars(table: pd.DataFrame, path: Path, *, ylabel: str, title: str,
                  yscale: str, floor: float | None = None, label_counts: bool = False) -> None:
    """Bars of table (index: variant, columns: dtype), one group per variant."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    variants = list(table.index)
    dtypes = list(table.columns)
    width = 0.8 / max(len(dtypes), 1)
    fig, ax = plt.subplots(layout="constrained", figsize=(max(6.0, 1.1 * len(variants) + 2), 4.2))
    positions = np.arange(len(variants))
    for k, dtype in enumerate(dtypes):
        values = table[dtype].to_numpy(dtype=float)
        shown = np.maximum(values, floor) if floor is not None else values
        x = positions + (k - (len(dtypes) - 1) / 2) * width
        bars = ax.bar(x, np.nan_to_num(shown, nan=0.0), width=width, label=dtype,
                      color=DTYPE_COLORS.get(dtype))
        if label_counts:
            ax.bar_label(bars, labels=[f"{int(v)}" if v else "" for v in np.nan_to_num(values)],
                         fontsize=7)
        for xi, value in zip(x, values):
            if math.isnan(value):
                ax.annotate("n/a", (xi, floor or 0), ha="center", va="bottom", fontsize=7,
                            rotation=90)
    if yscale == "symlog":
        ax.set_yscale("symlog", linthresh=1)
        highest = float(np.nanmax(table.to_numpy(dtype=float), initial=0.0))
        ax.set_ylim(bottom=0, top=max(3.0 * highest, 10.0))  # room for the count labels
    else:
        ax.set_yscale(yscale)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    if floor is not None:
        ax.set_ylim(bottom=floor / 2)
    ax.set_xticks(positions, variants, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    _suptitle(fig, title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    fig.legend(title="dtype", loc="outside right upper", frameon=False)
    _save(fig, path)


def _draw_error(frame: pd.DataFrame, path: Path, colors: dict) -> str | None:
    rows = _normal_rows(_ok(frame))
    if rows.empty or not rows["rel_err"].notna().any():
        return None
    table = rows.pivot_table(index="variant", columns="dtype", values="rel_err",
                             aggfunc="median", dropna=False)
    table = table[_dtype_order(table.columns)]
    clipped = int((table < LOG_FLOOR).sum().sum())
    note = (f"; {clipped} medians below {LOG_FLOOR:g} (e.g. exact 0) drawn at {LOG_FLOOR:g}"
            if clipped else "")
    _grouped_bars(table, path, ylabel="median relative error vs float64", yscale="log",
                  floor=LOG_FLOOR,
                  title=f"Relative error ‖out − golden‖/‖golden‖ vs float64, median over ok cells "
                        f"of scenario {NORMAL_SCENARIO}\n(log scale{note})")
    return ("Median relative Frobenius error against the float64 golden reference, per variant "
            f"and dtype, scenario {NORMAL_SCENARIO} only (log scale, floor {LOG_FLOOR:g}; n/a: no "
            f"cell or no finite value){note}. Other scenarios: see Error budget.")


def _draw_nonfinite(frame: pd.DataFrame, path: Path, colors: dict) -> str | None:
    rows = _ok(frame)
    if rows.empty:
        return None
    counts = rows.assign(nonfinite=rows[list(NONFINITE_COLUMNS)].fillna(0).sum(axis=1))
    table = counts.pivot_table(index="variant", columns="dtype", values="nonfinite", aggfunc="sum")
    table = table[_dtype_order(table.columns)].fillna(0)
    total = int(table.to_numpy().sum())
    title = ("NaN/inf counts: no NaN/inf in any cell" if total == 0
             else f"NaN/inf counts in outputs and gradients (total {total})")
    _grouped_bars(table, path, ylabel="NaN + inf count (sum over cells)", yscale="symlog",
                  title=title, label_counts=True)
    return ("Sum over cells of NaN and inf counts in outputs and q/k/v gradients "
            f"({'none found' if total == 0 else f'{total} in total'}).")


def _draw_saturation(frame: pd.DataFrame, path: Path, colors: dict) -> str | None:
    import matplotlib.pyplot as plt

    metrics = (("max_prob", "mean max probability"),
               ("entropy", "normalized entropy H/log n"),
               ("onehot_frac", "fraction of rows with max p > 0.99"))
    rows, selected = _representative_slice(_golden_saturation_rows(_ok(frame)),
                                           vary=("scenario",))
    rows = rows[rows[[m for m, _ in metrics]].notna().any(axis=1)]
    if rows.empty:
        return None
    several_scenarios = rows["scenario"].nunique() > 1
    line_keys = ["scenario", "dtype"] if several_scenarios else ["dtype"]
    means = rows.groupby([*line_keys, "d_k"])[[m for m, _ in metrics]].mean().reset_index()
    fig, axes = plt.subplots(1, 3, layout="constrained", figsize=(12, 3.8))
    for ax, (metric, label) in zip(axes, metrics):
        for key, line in means.groupby(line_keys):
            name = " ".join(str(k) for k in key)
            style = DTYPE_STYLES.get(str(key[-1]), ("o", "-"))
            ax.plot(line["d_k"], line[metric], marker=style[0], linestyle=style[1],
                    markerfacecolor="none", label=name,
                    color=None if several_scenarios else DTYPE_COLORS.get(str(key[-1])))
        _log2_x(ax, means["d_k"])
        ax.set_xlabel("head dim d_k")
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
    _suptitle(fig, f"Softmax saturation of the float64 golden ({selected}; mean over seq_len)",
                 fontsize=10)
    _legend_below(fig, axes[:1])
    _save(fig, path)
    return ("Softmax saturation vs head dimension: mean largest probability, normalized "
            f"entropy and one-hot fraction ({selected}, averaged over seq_len).")


def _draw_saturation_sweep(frame: pd.DataFrame, path: Path, colors: dict) -> str | None:
    import matplotlib.pyplot as plt

    sweep = saturation_sweep_table(frame)
    if sweep.empty:
        return None
    metrics = (("onehot_frac", "fraction of rows with max p > 0.99"),
               ("entropy", "mean normalized entropy H/log n"))
    fig, axes = plt.subplots(1, 2, layout="constrained", figsize=(11, 4.2))
    for ax, (metric, label) in zip(axes, metrics):
        for name, line in sweep.groupby("line", sort=False):
            golden = line["source"].iloc[0] == "golden"
            # The golden is a wide grey band underneath, so variants that match it stay visible.
            ax.plot(line["alpha"], line[metric], label=name,
                    marker="o" if golden else "s", markersize=9 if golden else 4,
                    markerfacecolor=None if golden else "none",
                    color="0.7" if golden else colors.get(name),
                    linewidth=6 if golden else 1.3,
                    linestyle="--" if str(name).startswith(NEGATIVE_CONTROL_PREFIX) else "-",
                    zorder=1 if golden else 2)
        _log2_x(ax, sweep["alpha"])
        ax.set_xlabel("logit scale α (q × α; normal = 1)")
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
    _suptitle(fig, "Softmax saturation vs logit scale: float64 golden and variants' own weights "
                 "(non-causal cells, mean over dtype, d_k, seq_len)", fontsize=10)
    _legend_below(fig, axes)
    _save(fig, path)
    return ("Saturation sweep: fraction of one-hot rows and mean normalized entropy vs the "
            "logit scale α (scenario scaled_xα; normal is α = 1). The wide grey line is the "
            "float64 golden; the others are variants that expose their own weights (negative "
            "controls dashed); a variant drawn on the grey line matches the golden.")


FIGURES: tuple[tuple[str, str, Callable[[pd.DataFrame, Path, dict], str | None]], ...] = (
    ("latency_fwd.png", "Forward latency", _draw_latency("fwd_ms", "forward")),
    ("latency_fwd_bwd.png", "Forward+backward latency",
     _draw_latency("fwd_bwd_ms", "forward+backward")),
    ("memory.png", "Peak memory", _draw_memory),
    ("throughput.png", "Throughput", _draw_throughput),
    ("roofline.png", "Against the measured ceiling", _draw_roofline),
    ("error.png", "Error vs float64", _draw_error),
    ("nonfinite.png", "NaN and inf counts", _draw_nonfinite),
    ("saturation.png", "Softmax saturation", _draw_saturation),
    ("saturation_sweep.png", "Saturation vs logit scale", _draw_saturation_sweep),
    ("compile.png", "Compile time", _draw_compile),
)


# --------------------------------------------------------------------------- sections

def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _flatten(mapping: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            items.extend(_flatten(value, f"{prefix}{key}."))
        else:
            items.append((f"{prefix}{key}", value))
    return items


def _title_section(run_dir: Path, run_info: dict | None, frame: pd.DataFrame) -> list[Block]:
    info = run_info or {}
    started = info.get("started_at")
    if started is None and frame["started_at"].notna().any():
        started = str(frame["started_at"].dropna().min())
    blocks: list[Block] = [
        Heading(1, "attn-audit report"),
        _para("Run folder: ", Mono(run_dir.name), f". Started: {started or 'unknown'}. "
              f"Preset: {info.get('preset') or 'unknown'}."),
    ]
    if info.get("argv"):
        blocks += [_para("Command line:"), Code(shlex.join(str(a) for a in info["argv"]))]
    if run_info is None:
        blocks.append(_para("No ", Mono("run.json"), ": environment from the first record, "
                            "axes from the data."))
    return blocks


def _findings_section(findings: list[dict] | None) -> list[Block]:
    if findings is None:
        return []
    blocks: list[Block] = [Heading(2, "Findings")]
    if not findings:
        return blocks + [_para("No findings.")]
    return blocks + [
        _para(findings_summary(findings), " Most severe first; ", Mono("cells"),
              " is the number of cells a finding covers (their ids are in ",
              Mono("findings.json"), ")."),
        Table(findings_table(findings)),
    ]


def _environment_section(run_info: dict | None, records: list[dict]) -> list[Block]:
    env = (run_info or {}).get("env")
    if env is None and records:
        env = records[0].get("env")
    if not env:
        return [Heading(2, "Environment"), _para("No environment recorded.")]
    table = pd.DataFrame(_flatten(env), columns=["key", "value"])
    table["value"] = table["value"].map(lambda v: "null" if v is None else format_value(v))
    return [Heading(2, "Environment"), Table(table), *_ceilings_blocks(run_info)]


def ceilings_table(run_info: dict | None) -> pd.DataFrame:
    """Measured ceilings per device: matmul TFLOP/s per dtype and copy GB/s (run.json: ceilings)."""
    rows = []
    for device, c in ((run_info or {}).get("ceilings") or {}).items():
        for dtype, rate in (c.get("matmul_flops_per_s") or {}).items():
            rows.append({"device": device, "what": f"{dtype} matmul (n={(c.get('matmul_n') or {}).get(dtype)})",
                         "measured": "null" if rate is None else f"{rate / 1e12:.3g} TFLOP/s"})
        bw = c.get("copy_bytes_per_s")
        rows.append({"device": device, "what": "device-to-device copy (read + write)",
                     "measured": "null" if bw is None else f"{bw / 1e9:.3g} GB/s"})
    return pd.DataFrame(rows, columns=["device", "what", "measured"])


def _ceilings_blocks(run_info: dict | None) -> list[Block]:
    table = ceilings_table(run_info)
    if table.empty:
        return []
    return [_para("Measured ceilings (best of repeated blocks, at the start of the run); "
                  "`pct_of_limit` is relative to these."), Table(table)]


def _sorted_values(values: list[Any]) -> list[Any]:
    try:
        return sorted(values)
    except TypeError:  # mixed types
        return sorted(values, key=str)


def _grid_section(run_info: dict | None, frame: pd.DataFrame) -> list[Block]:
    axes = (run_info or {}).get("axes") or {
        axis: _sorted_values(frame[axis].dropna().unique().tolist()) for axis in AXES}
    axes_table = pd.DataFrame({
        "axis": list(axes),
        "values": [", ".join(format_value(v) for v in values) for values in axes.values()],
        "count": [len(values) for values in axes.values()],
    })
    expected = (run_info or {}).get("n_cells")
    status = frame["status"].value_counts().rename_axis("status").reset_index(name="cells")
    blocks: list[Block] = [
        Heading(2, "Grid"), Table(axes_table),
        _para(f"Cells expected: {expected if expected is not None else 'unknown'}; "
              f"records present: {len(frame)}."),
        Table(status, caption="Cells by status"),
    ]
    not_ok = frame[frame["status"] != "ok"]
    if not_ok.empty:
        return blocks + [_para("Every recorded cell is ok.")]
    reasons = not_ok["reason"].fillna("(no reason given)").astype(str).map(
        lambda r: _budget_kind(r) or (r if len(r) <= REASON_WIDTH else r[:REASON_WIDTH - 1] + "…"))
    grouped = (not_ok.assign(reason=reasons).groupby(["variant", "status", "reason"])
               .size().reset_index(name="cells")
               .sort_values(["status", "cells"], ascending=[True, False], kind="stable"))
    return blocks + [Table(grouped, caption="Cells that are not ok, by variant, status and reason")]


BUDGET_KINDS = (("over the budget at run time", "over the time budget while running (see Time budget)"),
                ("over the budget", "over the time budget when planned (see Time budget)"),
                ("over the per-cell limit", "predicted over the per-cell limit (see Time budget)"))


def _budget_kind(reason: str) -> str | None:
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
    skipped["rule"] = skipped["reason"].fillna("").astype(str).map(_budget_kind)
    skipped = skipped[skipped["rule"].notna()]
    skipped["predicted_s"] = _num(skipped, "predicted_s")
    return skipped.sort_values("predicted_s", ascending=False)[columns].reset_index(drop=True)


def _time_budget_section(run_info: dict | None, frame: pd.DataFrame) -> list[Block]:
    budget = ((run_info or {}).get("timing") or {}).get("budget_s")
    cuts = budget_cuts_table(frame)
    if budget is None and cuts.empty:
        return []
    measured = frame[frame["status"] != "skipped"] if not frame.empty else frame
    predicted = _num(measured, "predicted_s")
    blocks: list[Block] = [Heading(2, "Time budget"), _para(
        f"Budget: {'none' if budget is None else format_value(float(budget)) + ' s'} (--budget; each preset "
        "declares one). Before measuring, the cost model predicted every cell (",
        Mono("predicted_s"), "); cells over the per-cell limit and, while the prediction exceeded the "
        "budget, the most expensive cells were skipped; while running, cells were skipped when the rest "
        "would have overrun it. "
        f"The {len(measured)} cells measured took {format_value(float(_num(measured, 'elapsed_s').sum()))} s "
        f"against {format_value(float(predicted.sum()))} s predicted.")]
    if cuts.empty:
        return blocks + [_para("No cell was skipped for time.")]
    by_rule = cuts.groupby("rule").agg(cells=("id", "size"), predicted_s=("predicted_s", "sum")).reset_index()
    shown = cuts.head(40)
    return blocks + [Table(by_rule, caption="Cells skipped for time, by rule (predicted seconds they would "
                                            "have taken)"),
                     Table(shown, caption=f"The {len(shown)} most expensive of the {len(cuts)} cells skipped "
                                          "for time (all are in records.jsonl with their reason)")]


def _speedup_table(frame: pd.DataFrame) -> pd.DataFrame:
    fwd = speedup_vs_baseline(frame, "fwd_ms").rename(
        columns={"speedup": "fwd speed-up (x)", "cells": "fwd cells"})
    both = speedup_vs_baseline(frame, "fwd_bwd_ms").rename(
        columns={"speedup": "fwd+bwd speed-up (x)", "cells": "fwd+bwd cells"})
    merged = fwd.merge(both, on="variant", how="outer")
    merged = merged.astype({"fwd cells": "Int64", "fwd+bwd cells": "Int64"})
    return merged.sort_values("fwd speed-up (x)", ascending=False, kind="stable")


def _speed_section(frame: pd.DataFrame) -> list[Block]:
    rows = _speed_rows(frame)
    blocks: list[Block] = [Heading(2, "Speed"), _para(
        "Speed, memory and their figures use cells of scenario ", Mono(NORMAL_SCENARIO),
        " only; the other scenarios are stability checks. Negative controls (",
        Mono(NEGATIVE_CONTROL_PREFIX + "*"),
        ") are left out of speed and memory; they appear under Numerics.")]
    if rows.empty:
        return blocks + [_para(f"No ok cells of scenario {NORMAL_SCENARIO} to compare.")]
    for dtype in _dtype_order(rows["dtype"].unique()):
        blocks.append(Table(median_table(frame, dtype),
                            caption=f"{dtype}: median forward latency (ms), other axes pooled"))
    blocks += _host_bound_blocks(rows)
    blocks.append(Heading(3, f"Speed-up vs {BASELINE_VARIANT}"))
    if BASELINE_VARIANT not in set(rows["variant"]):
        return blocks + [_para(f"No ok cells of the {BASELINE_VARIANT} variant: "
                               "no speed-up table.")]
    return blocks + [
        _para(f"Geometric mean over matched cells (same axes except variant, both ok) of "
              f"{BASELINE_VARIANT} latency / variant latency; above 1 is faster."),
        Table(_speedup_table(frame)),
    ]


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
    for variant in _variant_order(measured["variant"]):
        g = measured[measured["variant"] == variant]
        out.append({"variant": variant, "host_bound": int(g["host_bound"].astype(bool).sum()),
                    "measured": len(g), "median fwd_ms": _num(g, "fwd_ms").median(),
                    "median fwd_host_ms": _num(g, "fwd_host_ms").median()})
    return pd.DataFrame(out, columns=columns)


def _host_bound_blocks(rows: pd.DataFrame) -> list[Block]:
    table = host_bound_table(rows)
    if table.empty:
        return []
    return [_para("CUDA latencies are the device's own time (CUDA events around calls queued behind "
                  "a spin kernel). A cell is ", Mono("host_bound"), " when issuing a call (",
                  Mono("fwd_host_ms"), ": Python, dispatch, launches) takes longer than running it: "
                  "in a plain Python loop that GPU would wait for the host, so capture such calls in "
                  "a CUDA graph or batch more work per call."),
            Table(table, caption="host-bound cells per variant (forward or forward+backward)")]


def _memory_section(frame: pd.DataFrame) -> list[Block]:
    rows = _speed_rows(frame)
    blocks: list[Block] = [Heading(2, "Memory")]
    if rows.empty or not rows["peak_bytes"].notna().any():
        return blocks + [_para("No peak memory measured.")]
    if BASELINE_VARIANT in set(rows["variant"]):
        ratios = memory_ratio_vs_baseline(frame).rename(
            columns={"ratio": f"peak / {BASELINE_VARIANT} peak"})
        blocks += [
            _para(f"Geometric mean over matched cells of variant peak / {BASELINE_VARIANT} peak "
                  f"(forward); cells where either peak is 0 or null are skipped. "
                  f"{int(ratios['cells'].sum())} cell pairs used."),
            Table(ratios),
        ]
    else:
        blocks.append(_para(f"No ok cells of the {BASELINE_VARIANT} variant: no memory ratio."))
    for dtype in _dtype_order(rows["dtype"].unique()):
        blocks.append(Table(median_table(frame, dtype, "peak_bytes", MIB),
                            caption=f"{dtype}: median forward peak memory (MiB), "
                                    "other axes pooled"))
    return blocks


def _compile_section(frame: pd.DataFrame) -> list[Block]:
    ok = _ok(frame)
    ok = ok[~is_negative_control(ok["variant"])]
    compiled = ok[ok["compile_s"].notna() | ok["fused_sdpa"].notna()]
    blocks: list[Block] = [Heading(2, "Compiled variants")]
    if compiled.empty:
        return blocks + [_para("No compiled variants in this run.")]
    fused = compiled["fused_sdpa"]
    normal = compiled.index.isin(_normal_rows(compiled).index)
    table = (compiled.assign(fused_true=fused.eq(True).astype(int),
                             fused_false=fused.eq(False).astype(int),
                             compile_normal=compiled["compile_s"].where(normal),
                             normal=normal.astype(int))
             .groupby("variant")
             .agg(median_compile=("compile_normal", "median"), normal_cells=("normal", "sum"),
                  cells=("fused_true", "size"),
                  fused_true=("fused_true", "sum"), fused_false=("fused_false", "sum"))
             .reset_index()
             .rename(columns={"median_compile": "median compile (s), normal",
                              "normal_cells": "normal cells", "cells": "all cells",
                              "fused_true": "fused_sdpa true", "fused_false": "fused_sdpa false"}))
    reused = int(compiled["compile_reused"].eq(True).sum()) if "compile_reused" in compiled.columns else 0
    return blocks + [
        Table(table),
        _para("Compile time is taken over cells of scenario ", Mono(NORMAL_SCENARIO),
              " that compiled; the fused_sdpa counts over every scenario. ", Mono("fused_sdpa=true"),
              " means Inductor rewrote the hand-written code into fused "
              "SDPA, so its numerics and speed are SDPA's. "
              f"{reused} of {len(compiled)} cells reused code compiled by an earlier cell of the same "
              "shapes, dtype, causal flag and mask kind (", Mono("compile_reused"), ")."),
    ]


def _numerics_section(frame: pd.DataFrame) -> list[Block]:
    rows = _ok(frame)
    blocks: list[Block] = [Heading(2, "Numerics")]
    if rows.empty:
        return blocks + [_para("No ok cells.")]
    table = rows.groupby(["variant", "dtype"]).agg(
        max_abs_err=("max_abs_err", "max"), median_rel_err=("rel_err", "median"),
        out_nan=("out_nan", "sum"), out_inf=("out_inf", "sum"),
        grad_nan=("grad_nan", "sum"), grad_inf=("grad_inf", "sum"), cells=("id", "size"),
    ).reset_index()
    table = table.astype({c: "Int64" for c in NONFINITE_COLUMNS})
    table = table.rename(columns={"max_abs_err": "max max_abs_err",
                                  "median_rel_err": "median rel_err"})
    subset = rows[rows["golden_subset"].notna()] if "golden_subset" in rows.columns else rows.iloc[0:0]
    note = []
    if not subset.empty:
        note = [_para(f"{len(subset)} cells were judged on a subset of (batch, head) slices: the float64 "
                      "golden of a large input set covers evenly spaced slices within a FLOP budget (",
                      Mono("golden_subset"), "); their error columns are over those slices, their NaN/inf "
                      "counts over the whole output.")]
    return blocks + [
        _para("Errors against the float64 golden reference; NaN/inf counts summed over ok "
              "cells of every scenario (negative controls included). NaN on fully masked rows "
              "is counted here too; see Fully masked rows for what it means."),
        Table(table),
    ] + note


def _wide(long: pd.DataFrame, column: str, value: str,
          order: list[Any] | None = None) -> pd.DataFrame:
    """variant (rows, correct variants first) x `column` (columns) of `value`."""
    variants = _variant_order(long["variant"])
    columns = order if order is not None else list(dict.fromkeys(long[column]))
    wide = (long.set_index(["variant", column])[value].astype(object).unstack(column)
            .reindex(index=variants, columns=columns))
    wide.columns = [str(c) for c in wide.columns]
    wide.insert(0, "variant", wide.index.astype(str))
    return wide.reset_index(drop=True)


def _names(values: Iterable[str]) -> str:
    names = list(values)
    return ", ".join(names) if names else "none"


def _scenarios_section(frame: pd.DataFrame) -> list[Block]:
    table = scenario_table(frame)
    if table.empty:
        return []
    if not table["description"].astype(bool).any():
        table = table.drop(columns="description")
    return [
        Heading(2, "Input scenarios"),
        _para("Each scenario is a seeded, deterministic input set shared by every variant "
              "(the float64 golden is computed once per set). Only ", Mono(NORMAL_SCENARIO),
              " feeds speed and memory; the others are stability checks, reported below."),
        Table(table),
    ]


def _budget_section(frame: pd.DataFrame) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Error budget")]
    rule = _para("A cell is within budget when its RMSE against the float64 golden is at most "
                 "2 × the RMSE of ", Mono(BASELINE_VARIANT), " (hand-written attention) in the "
                 "same dtype on the same inputs, plus atol(dtype): FlashAttention's rule. ",
                 Mono("err_ratio"), " = rmse / rmse(", Mono(BASELINE_VARIANT),
                 ", same dtype), so the baseline itself is 1. Cells whose baseline is not finite "
                 "are not judged.")
    table = budget_table(frame)
    if table.empty or int(table["judged"].sum()) == 0:
        blocks += [rule, _para("No cell has an error-budget verdict (",
                               Mono("within_budget"), " is null everywhere).")]
    else:
        by = table.columns[1]
        order = (_scenario_order(table[by]) if by == "scenario"
                 else _dtype_order(table[by]) if by == "dtype" else None)
        text = table.assign(verdict=[
            f"{int(w)}/{int(j)}" if j else MISSING for w, j in zip(table["within"], table["judged"])])
        blocks += [
            rule,
            Table(_wide(text, by, "verdict", order),
                  caption=f"Cells within budget / cells judged, per variant and {by}"),
            Table(_wide(table, by, "median_err_ratio", order),
                  caption=f"Median err_ratio (rmse / {BASELINE_VARIANT} rmse, same dtype), "
                          f"per variant and {by}"),
        ]
    grads = gradient_table(frame)
    if grads.empty:
        return blocks
    only_normal = not _normal_rows(_ok(frame)).empty
    return blocks + [
        Heading(3, "Gradient errors"),
        _para("Median relative Frobenius error of dL/dq, dL/dk and dL/dv against float64 "
              "gradients" + (f", scenario {NORMAL_SCENARIO}." if only_normal
                             else ", all scenarios.")),
        Table(grads.rename(columns={"dq_err": "median dq_err", "dk_err": "median dk_err",
                                    "dv_err": "median dv_err"})),
    ]


def _fp16_verdict(row: pd.Series) -> str:
    if row["finite"] is None or pd.isna(row["finite"]):
        return MISSING
    if row["finite"]:
        return f"finite ({int(row['cells'])} cells)"
    return (f"not finite: {int(row['nonfinite'])} NaN/inf in "
            f"{int(row['nonfinite_cells'])}/{int(row['cells'])} cells")


def _fp16_section(frame: pd.DataFrame) -> list[Block]:
    table = fp16_overflow_table(frame)
    if table.empty:
        return []
    dtypes = _dtype_order(table["dtype"])
    wide = _wide(table.assign(verdict=table.apply(_fp16_verdict, axis=1)), "dtype", "verdict",
                 dtypes)
    max_qk = table.groupby("variant")["max_qk"].max()
    wide["max |q·k|"] = wide["variant"].map(max_qk)
    wide["max |q·k| / 65504"] = wide["max |q·k|"] / FP16_MAX
    fp16 = table[table["dtype"] == "fp16"]
    largest = table["max_qk"].max()
    scale = (f"|q·k| reaches {format_value(largest)}, {format_value(largest / FP16_MAX)}× the "
             f"fp16 maximum 65504. " if pd.notna(largest) else "")
    if fp16.empty:
        summary = _para(scale, "No fp16 cells in this run, so fp16 overflow is not tested.")
    else:
        finite = _variant_order(fp16.loc[fp16["finite"].eq(True), "variant"])
        bad = _variant_order(fp16.loc[fp16["finite"].eq(False), "variant"])
        correct_bad = [v for v in bad if not v.startswith(NEGATIVE_CONTROL_PREFIX)]
        broken_bad = [v for v in bad if v.startswith(NEGATIVE_CONTROL_PREFIX)]
        summary = _para(scale, f"Stay finite in fp16: {_names(finite)}. Produce inf/NaN in rows "
                        f"that see a key: {_names(correct_bad)}"
                        + (f" (and negative controls {_names(broken_bad)})" if broken_bad else "")
                        + ".")
    return [
        Heading(2, "fp16 overflow"),
        _para("Scenario ", Mono(FP16_RANGE_SCENARIO), ": q and k aligned with |q| ≈ 576 and "
              "|k| ≈ 383, so q·k overflows fp16 when it is formed before scaling or "
              "accumulated in fp16 (pytorch issue 119131). Counted: NaN and inf in output rows "
              "that see a key (", Mono("out_nonfinite_visible"), "), where float64 is finite."),
        summary,
        Table(wide),
    ]


def _masked_rows_section(frame: pd.DataFrame) -> list[Block]:
    table = masked_rows_table(frame)
    if table.empty or len(table.columns) < 2:
        return []
    return [
        Heading(2, "Fully masked rows"),
        _para("Hand-written softmax gives NaN for query rows that see no key; SDPA returns 0 "
              "for them. A finfo.min float mask is finite, so such rows are not masked at all: "
              "they attend uniformly to the masked keys."),
        _para("Where the table says other under finfo.min, the rows are finite but not exactly "
              "the mean of all values, for example because causal masking still limits a row to "
              "the keys before it."),
        _para("Per variant and mask form, what the fully masked rows hold: nan, zero, uniform "
              "(the mean of all values), other (finite, neither zero nor uniform) or mixed (more "
              "than one in a cell). A split such as \"nan (fp32), other (fp16)\" names the axis "
              "along which the answer changes; {a, b}: differs with no single axis."),
        Table(table),
    ]


def _leakage_section(frame: pd.DataFrame) -> list[Block]:
    leaks = leakage_table(frame)
    align = alignment_table(frame)
    if leaks.empty and (align.empty or len(align.columns) < 2):
        return []
    blocks: list[Block] = [Heading(2, "Masking and leakage")]
    if not leaks.empty:
        order = _scenario_order(leaks["scenario"])
        blocks += [
            _para(Mono("leak_max_change"), ": the largest output change, on rows that must not "
                  "see them, when masked-out or future keys and values are changed (0 = no "
                  "leak). ", Mono("leak_mass"), ": the largest probability mass a row puts on "
                  "masked or future keys, for variants that expose their weights. Maxima over "
                  "cells. Under ", Mono(MASK_FORMS[2][0]), " a change is expected: the "
                  "finite mask lets fully masked rows attend to masked keys (see Fully masked "
                  "rows)."),
            Table(_wide(leaks, "scenario", "leak_max_change", order),
                  caption="Max leak_max_change per variant and scenario (0 = no leak)"),
        ]
        if leaks["leak_mass"].notna().any():
            blocks.append(Table(_wide(leaks, "scenario", "leak_mass", order),
                                caption="Max leak_mass per variant and scenario "
                                        "(— : weights not exposed)"))
    if not align.empty and len(align.columns) > 1:
        blocks += [
            Heading(3, "Causal alignment when q_len ≠ kv_len"),
            _para("Which causal alignment the output follows in causal cells where the query "
                  "and key lengths differ: top-left (", Mono("is_causal=True"), ") or "
                  "bottom-right (", Mono("causal_lower_right"), ", what KV-cache decoding "
                  "needs), or neither."),
            Table(align),
        ]
    return blocks


def _saturation_section(frame: pd.DataFrame) -> list[Block]:
    rows = _ok(frame)
    blocks: list[Block] = [Heading(2, "Saturation")]
    columns = ["max_prob", "entropy", "onehot_frac"]
    rows = _golden_saturation_rows(rows[rows[columns].notna().any(axis=1)])
    if rows.empty:
        return blocks + [_para("No saturation metrics recorded.")]
    table = rows.groupby(["scenario", "causal", "dtype", "d_k"])[columns].mean().reset_index()
    blocks += [
        _para("Means over cells of the float64 golden's softmax: largest probability, "
              "normalized row entropy, fraction of rows with max p > 0.99."),
        Table(table),
    ]
    ok = _ok(frame)
    full = ok[~ok["causal"].astype(bool)]
    sat = saturation_table(full if not full.empty else ok)
    if sat.empty:
        return blocks
    order = _scenario_order(sat["scenario"])
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
    onehot = _wide(sat, "scenario", "onehot_frac", order)
    onehot.insert(1, "source", onehot["variant"].map(source))
    return blocks + [
        Heading(3, "Saturation by scenario"),
        _para("Scenarios normal, ", Mono("scaled_xA"), " (q multiplied by A) and outliers",
              scope, "Max |logit| is max |q·k·scale| in float64, a property of the inputs; the golden "
              "one-hot fraction is what the inputs alone cause. Per variant, ",
              Mono("source"), " says whether its columns come from its own weights (variant) "
              "or, for variants that hide them, from the float64 golden (golden)."),
        Table(inputs, caption="Inputs: largest logit and golden one-hot fraction per scenario"),
        Table(onehot, caption="Mean onehot_frac (rows with max p > 0.99) per variant and "
                              "scenario"),
        Table(_wide(sat, "scenario", "min_entropy", order),
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


def _seed_section(run_dir: Path) -> list[Block]:
    claims = seed_claims_table(run_dir)
    if claims is None:
        return []
    blocks: list[Block] = [
        Heading(2, "The seed's claims, measured"),
        _para("The seed tutorial prints illustrative numbers (sample output it says looks "
              "\"roughly like\" this); here each of its experiments is repeated with a fixed "
              "seed, and the measured value is set beside the printed one. A printed number "
              "holds when the measurement is within 25% of it (std claims: within 0.05); a "
              "yes/no claim holds when the behaviour matches."),
    ]
    if claims.empty:
        return blocks + [_para(f"{SEED_CLAIMS_FILE} lists no claims.")]
    held = int(claims["holds"].eq(True).sum())
    display = pd.DataFrame({
        "claim": claims["claim"],
        "d_k": claims["d_k"].astype(object).where(claims["d_k"].notna(), None),
        "seed's printed value": claims["seed_value"].map(lambda v: str(v) or MISSING),
        "measured value": claims["measured_value"].map(_format_measured),
        "holds": claims["holds"].map(lambda h: "✓" if h is True else "✗" if h is False
                                     else MISSING),
    })
    return blocks + [_para(f"{held} of {len(claims)} printed claims hold."), Table(display)]


def _figures_section(figures: list[Figure]) -> list[Block]:
    if not figures:
        return [Heading(2, "Figures"), _para("No data to plot.")]
    return [Heading(2, "Figures"), *figures]


def build_report(run_dir: str | Path) -> dict[str, Path | list[Path]]:
    """Read DIR's records (and run.json/findings.json), write figures (PNG) into DIR,
    DIR/index.md and DIR/index.html. Return {"index_md": ..., "index_html": ...,
    "figures": [paths...]}. Never measures anything.
    """
    import matplotlib

    matplotlib.use("Agg")
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    frame = _prepare(to_frame(records))
    run_info = _read_json(run_dir / "run.json")
    findings = _read_json(run_dir / "findings.json")

    colors = _variant_colors(frame["variant"].astype(str))
    figures: list[Figure] = []
    for filename, title, draw in FIGURES:
        caption = draw(frame, run_dir / filename, colors)
        if caption is not None:
            figures.append(Figure(filename, title, caption))

    blocks: list[Block] = [
        *_title_section(run_dir, run_info, frame),
        *_findings_section(findings),
        *_environment_section(run_info, records),
        *_grid_section(run_info, frame),
        *_time_budget_section(run_info, frame),
        *_scenarios_section(frame),
        *_speed_section(frame),
        *_memory_section(frame),
        *_compile_section(frame),
        *_numerics_section(frame),
        *_budget_section(frame),
        *_fp16_section(frame),
        *_masked_rows_section(frame),
        *_leakage_section(frame),
        *_saturation_section(frame),
        *_seed_section(run_dir),
        *_figures_section(figures),
    ]
    index_md = run_dir / "index.md"
    index_html = run_dir / "index.html"
    index_md.write_text(render_markdown(blocks), encoding="utf-8")
    index_html.write_text(render_html(blocks), encoding="utf-8")
    return {"index_md": index_md, "index_html": index_html,
            "figures": [run_dir / f.filename for f in figures]}
