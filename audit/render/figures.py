"""The report's figures: one draw function per PNG, each reading the tidy frame and
returning (matplotlib figure, caption) or None when there is nothing to plot.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from .data import (LOG_FLOOR, MIB, NEGATIVE_CONTROL_PREFIX, NONFINITE_COLUMNS, NORMAL_SCENARIO, dtype_order,
                   golden_saturation_rows, normal_rows, ok_rows, representative_slice, speed_rows)
from .page import Figure
from .plotting import (dtype_color, dtype_style, grouped_bars, legend_below, line_panels, log2_x_axis,
                       save_figure, suptitle, variant_colors)
from .stability_tables import saturation_sweep_table

Drawn = tuple[Any, str]            # (matplotlib figure, caption)
Draw = Callable[[pd.DataFrame, dict], "Drawn | None"]


def _draw_latency(metric: str, label: str) -> Draw:
    def draw(frame: pd.DataFrame, colors: dict) -> Drawn | None:
        rows, selected = representative_slice(speed_rows(frame))
        fig = line_panels(rows, y=metric, yerr=f"{metric.removesuffix('_ms')}_iqr_ms",
                          ylabel=f"{label} latency (ms)", panel_rows="dtype", panel_cols="d_k",
                          colors=colors, title=f"{label} latency, median ± IQR/2 ({selected})")
        return None if fig is None else (
            fig, f"Median {label} latency vs sequence length per variant ({selected}); "
                 "error bars span the interquartile range.")
    return draw


def _line_d_k(rows: pd.DataFrame) -> int:
    """The head dim a figure of lines over sequence length shows: the largest measured at two lengths or
    more (the cpu preset's d_k sweep, 72-192, runs at one length: its largest drew a figure of dots, and
    then none), else the largest."""
    lengths = rows.groupby("d_k")["seq_len"].nunique()
    return int((lengths[lengths >= 2] if (lengths >= 2).any() else lengths).index.max())


def _draw_memory(frame: pd.DataFrame, colors: dict) -> Drawn | None:
    rows, selected = representative_slice(speed_rows(frame))
    if rows.empty:
        return None
    d_k = _line_d_k(rows)
    rows = rows[rows["d_k"] == d_k]
    omitted = int((rows["peak_bytes"] <= 0).sum())
    note = f"; {omitted} cells with 0 bytes omitted" if omitted else ""
    fig = line_panels(rows, y="peak_bytes", scale=MIB, ylabel="peak memory (MiB)",
                      panel_cols="dtype", colors=colors,
                      title=f"Peak forward memory (d_k={d_k}, {selected}{note})")
    return None if fig is None else (
        fig, f"Peak memory of one forward call above the baseline, d_k={d_k} ({selected}){note}.")


def _draw_throughput(frame: pd.DataFrame, colors: dict) -> Drawn | None:
    rows, selected = representative_slice(speed_rows(frame))
    if rows.empty:
        return None
    d_k = _line_d_k(rows)
    fig = line_panels(rows[rows["d_k"] == d_k], y="gflops_per_s",
                      ylabel="forward GFLOP/s", panel_cols="dtype", colors=colors,
                      title=f"Achieved forward throughput (d_k={d_k}, {selected})")
    return None if fig is None else (
        fig, f"Achieved forward GFLOP/s (forward FLOPs / median forward time) vs sequence "
             f"length, d_k={d_k} ({selected}).")


def _draw_roofline(frame: pd.DataFrame, colors: dict) -> Drawn | None:
    """Achieved forward FLOP/s against arithmetic intensity, under the run's measured roofline."""
    import matplotlib.pyplot as plt

    rows = speed_rows(frame)
    needed = ["flops", "bytes", "gflops_per_s", "peak_flops_per_s", "peak_bytes_per_s"]
    if rows.empty or any(c not in rows for c in needed):
        return None
    rows = rows.dropna(subset=needed)
    if rows.empty:
        return None
    dtypes = dtype_order(rows["dtype"].unique())
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
    legend_below(fig, axes[0])
    suptitle(fig, "Forward throughput against the measured ceiling\n"
                 "(min of matmul FLOP/s and copy bandwidth × intensity)", fontsize=10)
    return fig, ("Roofline: each point is a speed cell's achieved forward GFLOP/s at its arithmetic intensity "
            "(FLOPs / fewest bytes); the grey line is the run's measured ceiling (run.json: ceilings).")


def _draw_compile(frame: pd.DataFrame, colors: dict) -> Drawn | None:
    rows = speed_rows(frame)
    rows = rows[rows["compile_s"].notna()]
    fig = line_panels(rows, y="compile_s", ylabel="compile time (s)", colors=colors,
                      panel_cols="device", logy=False,
                      title="Compile time of compiled variants (median over other axes)")
    return None if fig is None else (
        fig, "Compile time (first call minus steady state, fwd plus fwd+bwd) per compiled "
             "variant vs sequence length.")


def _draw_error(frame: pd.DataFrame, colors: dict) -> Drawn | None:
    rows = normal_rows(ok_rows(frame))
    if rows.empty or not rows["rel_err"].notna().any():
        return None
    table = rows.pivot_table(index="variant", columns="dtype", values="rel_err",
                             aggfunc="median", dropna=False)
    table = table[dtype_order(table.columns)]
    clipped = int((table < LOG_FLOOR).sum().sum())
    note = (f"; {clipped} medians below {LOG_FLOOR:g} (e.g. exact 0) drawn at {LOG_FLOOR:g}"
            if clipped else "")
    fig = grouped_bars(table, ylabel="median relative error vs float64", yscale="log",
                       floor=LOG_FLOOR,
                       title=f"Relative error ‖out − golden‖/‖golden‖ vs float64, median over "
                             f"ok cells of scenario {NORMAL_SCENARIO}\n(log scale{note})")
    return fig, ("Median relative Frobenius error against the float64 golden reference, per variant "
            f"and dtype, scenario {NORMAL_SCENARIO} only (log scale, floor {LOG_FLOOR:g}; n/a: no "
            f"cell or no finite value){note}. Other scenarios: see Error budget.")


def _draw_nonfinite(frame: pd.DataFrame, colors: dict) -> Drawn | None:
    rows = ok_rows(frame)
    if rows.empty:
        return None
    counts = rows.assign(nonfinite=rows[list(NONFINITE_COLUMNS)].fillna(0).sum(axis=1))
    table = counts.pivot_table(index="variant", columns="dtype", values="nonfinite", aggfunc="sum")
    table = table[dtype_order(table.columns)].fillna(0)
    total = int(table.to_numpy().sum())
    title = ("NaN/inf counts: no NaN/inf in any cell" if total == 0
             else f"NaN/inf counts in outputs and gradients (total {total})")
    fig = grouped_bars(table, ylabel="NaN + inf count (sum over cells)", yscale="symlog",
                       title=title, label_counts=True)
    return fig, ("Sum over cells of NaN and inf counts in outputs and q/k/v gradients "
            f"({'none found' if total == 0 else f'{total} in total'}).")


def _draw_saturation(frame: pd.DataFrame, colors: dict) -> Drawn | None:
    import matplotlib.pyplot as plt

    metrics = (("max_prob", "mean max probability"),
               ("entropy", "normalized entropy H/log n"),
               ("onehot_frac", "fraction of rows with max p > 0.99"))
    rows, selected = representative_slice(golden_saturation_rows(ok_rows(frame)),
                                          vary=("scenario",))
    rows = rows[rows[[m for m, _ in metrics]].notna().any(axis=1)]
    if rows.empty:
        return None
    several_scenarios = rows["scenario"].nunique() > 1
    line_keys = ["scenario", "dtype"] if several_scenarios else ["dtype"]
    means = rows.groupby([*line_keys, "d_k"])[[m for m, _ in metrics]].mean().reset_index()
    # a line needs two head dims: a scenario measured at one (the cpu preset's stability cells, 57 of
    # them with their dtypes) was a dot and a legend entry each, whose legend collapsed the axes; the
    # report's saturation table gives their numbers
    means = means[means.groupby(line_keys)["d_k"].transform("nunique") >= 2]
    if means.empty:
        return None
    fig, axes = plt.subplots(1, 3, layout="constrained", figsize=(12, 3.8))
    for ax, (metric, label) in zip(axes, metrics):
        for key, line in means.groupby(line_keys):
            name = " ".join(str(k) for k in key)
            style = dtype_style(key[-1])
            ax.plot(line["d_k"], line[metric], marker=style[0], linestyle=style[1],
                    markerfacecolor="none", label=name,
                    color=None if several_scenarios else dtype_color(key[-1]))
        log2_x_axis(ax, means["d_k"])
        ax.set_xlabel("head dim d_k")
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
    suptitle(fig, f"Softmax saturation of the float64 golden ({selected}; mean over seq_len)",
                 fontsize=10)
    legend_below(fig, axes[:1])
    return fig, ("Softmax saturation vs head dimension: mean largest probability, normalized "
            f"entropy and one-hot fraction ({selected}, averaged over seq_len).")


def _draw_saturation_sweep(frame: pd.DataFrame, colors: dict) -> Drawn | None:
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
        log2_x_axis(ax, sweep["alpha"])
        ax.set_xlabel("logit scale α (q × α; normal = 1)")
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
    suptitle(fig, "Softmax saturation vs logit scale: float64 golden and variants' own weights "
                 "(non-causal cells, mean over dtype, d_k, seq_len)", fontsize=10)
    legend_below(fig, axes)
    return fig, ("Saturation sweep: fraction of one-hot rows and mean normalized entropy vs the "
            "logit scale α (scenario scaled_xα; normal is α = 1). The wide grey line is the "
            "float64 golden; the others are variants that expose their own weights (negative "
            "controls dashed); a variant drawn on the grey line matches the golden.")


FIGURES: tuple[tuple[str, str, Draw], ...] = (
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


FIGURE_PROCESSES = 2        # figures drawn side by side: a report runs after the cells, with the cores idle
_FORKED: dict[str, Any] = {}  # what the forked drawing processes read (inherited, never pickled)


def _draw_one(index: int) -> tuple[str, str, str] | None:
    """Draw and save FIGURES[index] from the frame in _FORKED: (filename, title, caption) or None."""
    import matplotlib

    matplotlib.use("Agg")
    filename, title, draw = FIGURES[index]
    try:
        drawn = draw(_FORKED["frame"], _FORKED["colors"])
    except Exception:  # noqa: BLE001 - a figure that cannot be drawn from these records is left out, the page kept
        import matplotlib.pyplot as plt
        plt.close("all")
        return None
    if drawn is None:
        return None
    fig, caption = drawn
    save_figure(fig, Path(_FORKED["out_dir"]) / filename)
    return filename, title, caption


def draw_figures(frame: pd.DataFrame, out_dir: Path, processes: int | None = None) -> list[Figure]:
    """Draw every figure there is data for, save each as out_dir/NAME.png; their blocks.

    Where the machine has more than one core and fork is available, `processes` forked
    processes draw them (matplotlib renders one figure on one core: 10 figures took 5 s on 2
    cores of an AMD EPYC, 2.7 s side by side); else, or if a drawing process fails, here.
    processes: default FIGURE_PROCESSES (1: here, as tests that inspect the figures need)."""
    import os

    processes = FIGURE_PROCESSES if processes is None else processes
    _FORKED.update(frame=frame, colors=variant_colors(frame["variant"].astype(str)), out_dir=str(out_dir))
    drawn: list[tuple[str, str, str] | None] | None = None
    try:
        if processes > 1 and (os.cpu_count() or 1) > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401 - once, here: each forked process would import it again (0.25 s)
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=min(processes, os.cpu_count() or 1), mp_context=context) as pool:
                drawn = list(pool.map(_draw_one, range(len(FIGURES)), timeout=600))
    except Exception:  # noqa: BLE001 - no fork, a broken pool, a process that died: draw them here
        drawn = None
    try:
        if drawn is None:
            drawn = [_draw_one(i) for i in range(len(FIGURES))]
    finally:
        _FORKED.clear()
    return [Figure(*made) for made in drawn if made is not None]
