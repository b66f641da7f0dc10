"""Matplotlib helpers shared by the report's figures: colours, log axes, titles and
legends that fit, line panels and grouped bars, and a check that nothing is cut off.

Draw helpers return the matplotlib figure; figures.py saves it (one place, save_figure).
matplotlib is imported inside the functions, so importing the report stays cheap.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..core.dtypes import dtype_spec
from .data import NEGATIVE_CONTROL_PREFIX, dtype_order


def dtype_color(dtype: str) -> str:
    """A dtype's colour in the figures (its record's, core/dtypes.py; UsageError for an unknown one)."""
    return dtype_spec(str(dtype)).color


def dtype_style(dtype: str) -> tuple[str, str]:
    """A dtype's (marker, line style), so lines that coincide (saturation is a property of the inputs,
    nearly equal across dtypes) stay visible (its record's, core/dtypes.py)."""
    spec = dtype_spec(str(dtype))
    return spec.marker, spec.line


def variant_colors(variants: Iterable[str]) -> dict[str, Any]:
    """One colour per variant name, stable for a given set of names."""
    import matplotlib

    names = sorted(set(variants))
    cmap = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def log2_x_axis(ax: Any, values: Iterable[Any]) -> None:
    """Base-2 log x axis with a plain-number tick at every value present."""
    from matplotlib.ticker import NullLocator, ScalarFormatter

    ticks = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())


def save_figure(fig: Any, path: Path) -> None:
    """Write the figure as PNG and free it."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def suptitle(fig: Any, text: str, fontsize: float = 10) -> None:
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


def legend_below(fig: Any, axes: Iterable[Any]) -> None:
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
    return dtype_order(data[axis]) if axis == "dtype" else sorted(data[axis].unique())


def _panel_title(axis: str | None, value: Any) -> str:
    if axis is None:
        return ""
    return str(value) if axis in ("dtype", "device") else f"{axis}={value}"


def readable_log_y(ax: Any) -> None:
    """Log y axis labelled 1, 2, 5 x 10^k in plain numbers instead of 6 x 10^-1."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def line_panels(rows: pd.DataFrame, *, y: str, ylabel: str, title: str,
                colors: dict[str, Any], panel_rows: str | None = None,
                panel_cols: str | None = None, yerr: str | None = None, scale: float = 1.0,
                logy: bool = True) -> Any | None:
    """Lines of median y vs seq_len, one per variant, in a grid of panels; None when no
    row has a value to draw, or when the rows hold one sequence length: a line needs two, and the
    report's tables give the numbers of one (a one-cell run drew 4 figures of a dot each, 0.4 s)."""
    import matplotlib.pyplot as plt

    data = rows.assign(y=rows[y] / scale,
                       err=(rows[yerr] / scale) if yerr else np.nan)
    data = data[np.isfinite(data["y"]) & ((data["y"] > 0) | (not logy))]
    if data["seq_len"].nunique() < 2:
        return None
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
            log2_x_axis(ax, data["seq_len"])
            if logy:
                readable_log_y(ax)
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
    suptitle(fig, title, fontsize=10)
    legend_below(fig, axes.flat)
    return fig


# Above this many variants grouped_bars lays its bars out horizontally: a row per variant, the figure
# as tall as they need at a fixed width. Vertical, its width grew 1.1 in a variant: the cpu preset's 50
# (with the negative controls) made a 55-inch figure, a strip of unreadable bars at page width.
HORIZONTAL_BARS_FROM = 16


def grouped_bars(table: pd.DataFrame, *, ylabel: str, title: str, yscale: str,
                 floor: float | None = None, label_counts: bool = False) -> Any:
    """Bars of table (index: variant, columns: dtype), one group per variant: side by side, or, above
    HORIZONTAL_BARS_FROM variants, one row each (the value axis then horizontal)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    variants = list(table.index)
    dtypes = list(table.columns)
    width = 0.8 / max(len(dtypes), 1)
    horizontal = len(variants) > HORIZONTAL_BARS_FROM
    size = (10.0, 0.28 * len(variants) * max(len(dtypes), 1) ** 0.5 + 1.6) if horizontal else (
        max(6.0, 1.1 * len(variants) + 2), 4.2)
    fig, ax = plt.subplots(layout="constrained", figsize=size)
    positions = np.arange(len(variants))
    value_axis = ax.xaxis if horizontal else ax.yaxis
    for k, dtype in enumerate(dtypes):
        values = table[dtype].to_numpy(dtype=float)
        shown = np.maximum(values, floor) if floor is not None else values
        x = positions + (k - (len(dtypes) - 1) / 2) * width
        draw = ax.barh if horizontal else ax.bar
        bars = draw(x, np.nan_to_num(shown, nan=0.0), width, label=dtype, color=dtype_color(dtype))
        if label_counts:
            ax.bar_label(bars, labels=[f"{int(v)}" if v else "" for v in np.nan_to_num(values)],
                         fontsize=7)
        for xi, value in zip(x, values):
            if math.isnan(value):
                ax.annotate("n/a", (floor or 0, xi) if horizontal else (xi, floor or 0),
                            ha="left" if horizontal else "center", va="center" if horizontal else "bottom",
                            fontsize=7, rotation=0 if horizontal else 90)
    set_scale, set_lim = (ax.set_xscale, ax.set_xlim) if horizontal else (ax.set_yscale, ax.set_ylim)
    if yscale == "symlog":
        set_scale("symlog", linthresh=1)
        highest = float(np.nanmax(table.to_numpy(dtype=float), initial=0.0))
        set_lim(0, max(3.0 * highest, 10.0))           # room for the count labels
    else:
        set_scale(yscale)
    value_axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    if floor is not None:
        set_lim(floor / 2)
    if horizontal:
        ax.set_yticks(positions, variants)
        ax.invert_yaxis()                              # the first variant on top, as in the tables
        ax.set_xlabel(ylabel)
    else:
        ax.set_xticks(positions, variants, rotation=30, ha="right")
        ax.set_ylabel(ylabel)
    suptitle(fig, title, fontsize=10)
    ax.grid(True, axis="x" if horizontal else "y", alpha=0.3)
    fig.legend(title="dtype", loc="outside right upper", frameon=False)
    return fig
