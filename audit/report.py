"""Turn a run folder's records into figures, index.md and index.html.

The report reads records only and never measures, so it can be rebuilt
anywhere without torch. Markdown and HTML are rendered from one list of
blocks (heading, paragraph, code, table, figure), so the two never diverge.
"""
from __future__ import annotations

import html
import json
import math
import numbers
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Union

import numpy as np
import pandas as pd

from .grid import AXES
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
)
NONFINITE_COLUMNS = ("out_nan", "out_inf", "grad_nan", "grad_inf")
MATCH_AXES = tuple(axis for axis in AXES if axis != "variant")


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
    """Measurement columns as floats (null -> NaN) so pandas can aggregate them."""
    numeric = {col: pd.to_numeric(frame[col], errors="coerce").astype(float)
               for col in METRIC_COLUMNS if col in frame.columns}
    return frame.assign(**numeric)


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"]


def _speed_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured cells of the variants that may be ranked for speed and memory."""
    ok = _ok(frame)
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


def _representative_slice(rows: pd.DataFrame,
                          vary: tuple[str, ...] = ()) -> tuple[pd.DataFrame, str]:
    """Fix the axes a plot does not show, so its lines compare like with like.

    causal=False is preferred; device, batch, heads and scenario take their most
    common value. Returns the rows and a description such as "cpu B1 H2 full normal".
    """
    chosen = rows
    if "causal" not in vary and len(chosen):
        causal = chosen["causal"].astype(bool)
        chosen = chosen[~causal] if (~causal).any() else chosen
    labels: list[str] = []
    for axis in ("device", "batch", "heads", "causal", "scenario"):
        if axis in vary or not len(chosen):
            continue
        value = chosen[axis].mode().iloc[0]
        chosen = chosen[chosen[axis] == value]
        labels.append(_axis_label(axis, value))
    return chosen, " ".join(labels)


def _axis_label(axis: str, value: Any) -> str:
    if axis == "batch":
        return f"B{value}"
    if axis == "heads":
        return f"H{value}"
    if axis == "causal":
        return "causal" if value else "full"
    return str(value)


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


def _legend_below(fig: Any, axes: Iterable[Any]) -> None:
    """One legend for all panels, outside them, so it never covers data."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="outside lower center",
                   ncol=min(len(handles), 4), frameon=False)


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
    fig.suptitle(title, fontsize=10)
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
    fig.suptitle(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    fig.legend(title="dtype", loc="outside right upper", frameon=False)
    _save(fig, path)


def _draw_error(frame: pd.DataFrame, path: Path, colors: dict) -> str | None:
    rows = _ok(frame)
    if not rows["rel_err"].notna().any():
        return None
    table = rows.pivot_table(index="variant", columns="dtype", values="rel_err",
                             aggfunc="median", dropna=False)
    table = table[_dtype_order(table.columns)]
    clipped = int((table < LOG_FLOOR).sum().sum())
    note = (f"; {clipped} medians below {LOG_FLOOR:g} (e.g. exact 0) drawn at {LOG_FLOOR:g}"
            if clipped else "")
    _grouped_bars(table, path, ylabel="median relative error vs float64", yscale="log",
                  floor=LOG_FLOOR,
                  title=f"Relative error ‖out − golden‖/‖golden‖ vs float64, median over ok cells\n"
                        f"(log scale{note})")
    return ("Median relative Frobenius error against the float64 golden reference, per variant "
            f"and dtype (log scale, floor {LOG_FLOOR:g}; n/a: no cell or no finite value){note}.")


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
    rows, selected = _representative_slice(_ok(frame), vary=("scenario",))
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
    fig.suptitle(f"Softmax saturation of the float64 golden ({selected}; mean over seq_len)",
                 fontsize=10)
    _legend_below(fig, axes[:1])
    _save(fig, path)
    return ("Softmax saturation vs head dimension: mean largest probability, normalized "
            f"entropy and one-hot fraction ({selected}, averaged over seq_len).")


FIGURES: tuple[tuple[str, str, Callable[[pd.DataFrame, Path, dict], str | None]], ...] = (
    ("latency_fwd.png", "Forward latency", _draw_latency("fwd_ms", "forward")),
    ("latency_fwd_bwd.png", "Forward+backward latency",
     _draw_latency("fwd_bwd_ms", "forward+backward")),
    ("memory.png", "Peak memory", _draw_memory),
    ("throughput.png", "Throughput", _draw_throughput),
    ("error.png", "Error vs float64", _draw_error),
    ("nonfinite.png", "NaN and inf counts", _draw_nonfinite),
    ("saturation.png", "Softmax saturation", _draw_saturation),
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
    table = pd.DataFrame({
        "severity": [f.get("severity") for f in findings],
        "check": [f.get("check") for f in findings],
        "variant": [f.get("variant") for f in findings],
        "message": [f.get("message") for f in findings],
        "cells": [len(f.get("cells") or []) for f in findings],
    })
    rank = (table["severity"].map({s: i for i, s in enumerate(SEVERITY_ORDER)})
            .fillna(len(SEVERITY_ORDER)))
    table = table.assign(rank=rank).sort_values("rank", kind="stable").drop(columns="rank")
    return blocks + [Table(table)]


def _environment_section(run_info: dict | None, records: list[dict]) -> list[Block]:
    env = (run_info or {}).get("env")
    if env is None and records:
        env = records[0].get("env")
    if not env:
        return [Heading(2, "Environment"), _para("No environment recorded.")]
    table = pd.DataFrame(_flatten(env), columns=["key", "value"])
    table["value"] = table["value"].map(lambda v: "null" if v is None else format_value(v))
    return [Heading(2, "Environment"), Table(table)]


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
        lambda r: r if len(r) <= REASON_WIDTH else r[:REASON_WIDTH - 1] + "…")
    grouped = (not_ok.assign(reason=reasons).groupby(["variant", "status", "reason"])
               .size().reset_index(name="cells")
               .sort_values(["status", "cells"], ascending=[True, False], kind="stable"))
    return blocks + [Table(grouped, caption="Cells that are not ok, by variant, status and reason")]


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
        "Negative controls (", Mono(NEGATIVE_CONTROL_PREFIX + "*"),
        ") are left out of speed and memory; they appear under Numerics.")]
    if rows.empty:
        return blocks + [_para("No ok cells to compare.")]
    for dtype in _dtype_order(rows["dtype"].unique()):
        blocks.append(Table(_median_pivot(rows[rows["dtype"] == dtype], "fwd_ms"),
                            caption=f"{dtype}: median forward latency (ms), other axes pooled"))
    blocks.append(Heading(3, f"Speed-up vs {BASELINE_VARIANT}"))
    if BASELINE_VARIANT not in set(rows["variant"]):
        return blocks + [_para(f"No ok cells of the {BASELINE_VARIANT} variant: "
                               "no speed-up table.")]
    return blocks + [
        _para(f"Geometric mean over matched cells (same axes except variant, both ok) of "
              f"{BASELINE_VARIANT} latency / variant latency; above 1 is faster."),
        Table(_speedup_table(frame)),
    ]


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
        blocks.append(Table(_median_pivot(rows[rows["dtype"] == dtype], "peak_bytes", MIB),
                            caption=f"{dtype}: median forward peak memory (MiB), "
                                    "other axes pooled"))
    return blocks


def _compile_section(frame: pd.DataFrame) -> list[Block]:
    rows = _speed_rows(frame)
    compiled = rows[rows["compile_s"].notna() | rows["fused_sdpa"].notna()]
    blocks: list[Block] = [Heading(2, "Compiled variants")]
    if compiled.empty:
        return blocks + [_para("No compiled variants in this run.")]
    fused = compiled["fused_sdpa"]
    table = (compiled.assign(fused_true=fused.eq(True).astype(int),
                             fused_false=fused.eq(False).astype(int))
             .groupby("variant")
             .agg(median_compile=("compile_s", "median"), cells=("id", "size"),
                  fused_true=("fused_true", "sum"), fused_false=("fused_false", "sum"))
             .reset_index()
             .rename(columns={"median_compile": "median compile (s)",
                              "fused_true": "fused_sdpa true", "fused_false": "fused_sdpa false"}))
    return blocks + [
        Table(table),
        _para(Mono("fused_sdpa=true"), " means Inductor rewrote the hand-written code into fused "
              "SDPA, so its numerics and speed are SDPA's."),
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
    return blocks + [
        _para("Errors against the float64 golden reference; NaN/inf counts summed over ok "
              "cells (negative controls included)."),
        Table(table),
    ]


def _saturation_section(frame: pd.DataFrame) -> list[Block]:
    rows = _ok(frame)
    blocks: list[Block] = [Heading(2, "Saturation")]
    columns = ["max_prob", "entropy", "onehot_frac"]
    rows = rows[rows[columns].notna().any(axis=1)]
    if rows.empty:
        return blocks + [_para("No saturation metrics recorded.")]
    table = rows.groupby(["scenario", "causal", "dtype", "d_k"])[columns].mean().reset_index()
    return blocks + [
        _para("Means over cells of the float64 golden's softmax: largest probability, "
              "normalized row entropy, fraction of rows with max p > 0.99."),
        Table(table),
    ]


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
        *_speed_section(frame),
        *_memory_section(frame),
        *_compile_section(frame),
        *_numerics_section(frame),
        *_saturation_section(frame),
        *_figures_section(figures),
    ]
    index_md = run_dir / "index.md"
    index_html = run_dir / "index.html"
    index_md.write_text(render_markdown(blocks), encoding="utf-8")
    index_html.write_text(render_html(blocks), encoding="utf-8")
    return {"index_md": index_md, "index_html": index_html,
            "figures": [run_dir / f.filename for f in figures]}
