"""The comparison page (index.md, index.html), its figure and cells.csv, from a
compare.Comparison. Renders with the report's blocks and writer; never measures."""
from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Union

import numpy as np
import pandas as pd

from ..analysis import compare_stats as stats
from ..analysis.compare import PHASES, Comparison, Side
from ..core.runfolder import COMPARE_CELLS_FILE, COMPARE_FIGURE_FILE
from .finding_tables import findings_table
from .page import Block, Code, Figure, Heading, Mono, Paragraph, Table, format_value, write_page
from .plotting import legend_below, save_figure, suptitle, variant_colors

TITLE = "attn-audit comparison"
WHOLE_RUN_SHIFT = 1.1    # a median B/A over every cell beyond 1.1 or under 1/1.1 gets a note


def _p(*parts: Union[str, Mono]) -> Paragraph:
    return Paragraph(tuple(parts))


def _ci(low: float, high: float) -> str:
    return "—" if not (math.isfinite(low) and math.isfinite(high)) else \
        f"[{format_value(low)}, {format_value(high)}]"


def _verdict(row: pd.Series, failed_ids: set[str]) -> str:
    """FAIL (over a --fail-on threshold), slower / faster (the interval excludes 1), or ''."""
    if row["id"] in failed_ids:
        return "FAIL"
    lows = [row[f"{p}_low"] for p, _ in PHASES]
    highs = [row[f"{p}_high"] for p, _ in PHASES]
    if any(math.isfinite(v) and v > 1 for v in lows):
        return "slower"
    if any(math.isfinite(v) and v < 1 for v in highs):
        return "faster"
    return ""


def cells_table(comparison: Comparison) -> pd.DataFrame:
    """Every matched cell, most surely slower first (by the lower end of its latency interval)."""
    cells = comparison.cells
    if cells.empty:
        return pd.DataFrame()
    failed_ids = set(comparison.failed["id"])
    order = cells[[f"{p}_low" for p, _ in PHASES]].max(axis=1).fillna(-np.inf)
    rows = cells.assign(_order=order).sort_values("_order", ascending=False, kind="stable")
    table = pd.DataFrame({
        "cell": rows["id"],
        "status": [a if a == b else f"{a} → {b}" for a, b in zip(rows["status_a"], rows["status_b"])],
        "verdict": [_verdict(r, failed_ids) for _, r in rows.iterrows()],
    })
    for phase, label in PHASES:
        table[f"{label} B/A"] = rows[f"{phase}_ratio"].to_numpy()
        table[f"{label} 95% CI"] = [_ci(lo, hi) for lo, hi in zip(rows[f"{phase}_low"], rows[f"{phase}_high"])]
    table["peak B/A"] = rows["memory_peak_bytes"].to_numpy()
    table["peak fwd+bwd B/A"] = rows["memory_peak_fwd_bwd_bytes"].to_numpy()
    table["rel_err B/A"] = rows["error"].to_numpy()
    if rows["energy"].notna().any():
        table["energy B/A"] = rows["energy"].to_numpy()
    table["NaN/inf A → B"] = rows["nonfinite"].to_numpy()
    return table.reset_index(drop=True)


def failures_table(comparison: Comparison) -> pd.DataFrame:
    failed = comparison.failed
    return pd.DataFrame({"cell": failed["id"], "rule": failed["rule"], "metric": failed["metric"],
                         "B/A": failed["ratio"],
                         "95% CI": [_ci(lo, hi) for lo, hi in zip(failed["low"], failed["high"])]})


def _median_ratio(cells: pd.DataFrame, phase: str) -> float:
    ratios = cells[f"{phase}_ratio"] if not cells.empty else pd.Series(dtype=float)
    ratios = ratios[np.isfinite(ratios) & (ratios > 0)]
    return float(np.exp(np.median(np.log(ratios)))) if len(ratios) else math.nan


def summary_lines(comparison: Comparison) -> list[str]:
    """Plain sentences shared by the page and the command's output."""
    c = comparison
    lines = [f"{len(c.cells)} matched cells, {len(c.only_a)} only in A, {len(c.only_b)} only in B."]
    shifted = []
    for phase, label in PHASES:
        n = c.noise[phase]
        if not n["cells"]:
            continue
        slower = int((c.cells[f"{phase}_low"] > 1).sum())
        faster = int((c.cells[f"{phase}_high"] < 1).sum())
        measured = ("" if n["measured"] is None else f", spread measured {n['measured']:.3f}")
        own = ("" if n.get("per_cell") is None or n["per_cell"] <= n["used"] else
               f"; with each cell's own intervals added, median {n['per_cell']:.3f}")
        median = _median_ratio(c.cells, phase)
        lines.append(f"Latency {label}: median B/A {format_value(median)} over "
                     f"{n['cells']} cells; {slower} significantly slower, {faster} significantly faster "
                     f"(run-to-run noise SD of log B/A used {n['used']:.3f}{measured}{own}).")
        if not 1 / WHOLE_RUN_SHIFT <= median <= WHOLE_RUN_SHIFT:
            shifted.append(f"{format_value(median)} ({label})")
    if shifted:
        lines.append(f"Note: the cells moved together, median B/A {', '.join(shifted)}. A change to one kernel "
                     "does not do that; another machine or torch can, and so can the load of a shared machine "
                     "(whole runs made minutes apart differed by up to 1.7x on a 2-core one): there, measure "
                     "A and B at the same time before trusting a latency failure.")
    changed_status = int((c.cells["status_a"] != c.cells["status_b"]).sum()) if not c.cells.empty else 0
    nonfinite = int((c.cells["nonfinite"] != "").sum()) if not c.cells.empty else 0
    lines.append(f"{changed_status} cells changed status, {nonfinite} changed NaN/inf counts; findings: "
                 f"{len(c.findings_only_b)} new in B, {len(c.findings_only_a)} gone from A.")
    return lines


def _side_text(side: Side) -> list[Union[str, Mono]]:
    info = side.run_info or {}
    return [f"{side.label}: ", Mono(str(side.given)),
            f" (preset {info.get('preset') or 'unknown'}, started {info.get('started_at') or 'unknown'}, "
            f"{len(side.frame)} cells)."]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def _method_blocks(comparison: Comparison) -> list[Block]:
    noise = comparison.noise
    used = ", ".join(f"{label} {noise[p]['used']:.3f}" for p, label in PHASES)
    floor = noise[PHASES[0][0]].get("floor", stats.NOISE_FLOOR_SD)
    canaries = (f"the two runs' canaries: noise figures {_pct(comparison.a.noise_rel)} (A) and "
                f"{_pct(comparison.b.noise_rel)} (B), as log-SD log(1 + n) / 1.96 added in quadrature"
                if comparison.a.noise_rel is not None and comparison.b.noise_rel is not None else
                f"{stats.NOISE_FLOOR_SD}, unmeasured: a run without canary readings")
    source = ("given with --noise" if comparison.noise_given else
              f"measured here, at least {floor:.3f} ({canaries}); with fewer than "
              f"{stats.MIN_CELLS_FOR_SPREAD} cells of a variant {floor:.3f}")
    return [
        Heading(2, "How ratios and intervals are computed"),
        _p("Latency: B/A of the medians of the raw samples (", Mono("fwd_samples_s"), ", ",
           Mono("fwd_bwd_samples_s"), f"). Its 95% interval is a percentile bootstrap of the ratio of "
           f"medians ({stats.N_BOOTSTRAP} resamples of each run's samples, seeded per cell, so the page is "
           "the same every time), widened by run-to-run noise, which the samples of one process do not "
           "show. That noise is read from the matched cells: each cell's log B/A minus the median of its "
           "variant's (a whole variant moving is a change, not noise); the SD is the 90th percentile of "
           "those residuals' size / 1.645, from the tail because the noise is heavy-tailed, by the "
           "median-unbiased estimate (of 10 cells nearer the largest, of 6 or fewer the largest). To it, "
           "in quadrature, each cell's own timing intervals in both runs (", Mono("fwd_ci_rel"), ", ",
           Mono("fwd_bwd_ci_rel"), ": log(1 + ci) / 1.96 each): a cell measured less surely than its "
           "neighbours may move further. Each half-width in log space becomes sqrt(half² + (1.96 × SD)²), "
           f"the SD per cell in cells.csv. SD of the run's part: {used} ({source}). Without raw "
           "samples (pytest-benchmark JSON saved without data) the interval comes from each median's "
           "standard error, 1.253 × (IQR / 1.349) / √n."),
        _p("Peak memory and error are deterministic: their ratios have no interval. Ratios are "
           f"taken between values floored at {stats.MEMORY_FLOOR_BYTES // 2 ** 20} MiB for peak memory "
           "(smaller peaks are page and allocator granular) and at the dtype's unit roundoff for ",
           Mono("rel_err"), " (fp32 2⁻²⁴, bf16 2⁻⁸, fp16 2⁻¹¹: rounding the output alone gives that "
           "much), so 1e-9 against 3e-9 reads 1. An error that turns NaN or inf reads inf."),
        _p("A ", Mono("--fail-on latency:+T%"), " fails a cell when its whole interval lies above 1 + T "
           "(in either phase); memory and error fail when the floored ratio is above 1 + T. "
           "Findings are recomputed from both runs' records with the same rules and matched on their "
           "check and variant."),
    ]


def _env_blocks(comparison: Comparison) -> list[Block]:
    env = comparison.env
    table = env.table.copy()
    for col in ("A", "B"):
        table[col] = table[col].map(lambda v: "null" if v is None else format_value(v))
    blocks: list[Block] = [Heading(2, "Environments"),
                           _p("The rule: a comparison changes one of machine, torch or code (the ",
                              Mono("group"), " column); if more than one differs, a ratio cannot be "
                              "attributed to either, and it warns. Measurement settings should never differ. "
                              "Fields marked shown only (preset, platform, start) are not checked.")]
    blocks += [_p("Warning: " + w) for w in env.warnings]
    blocks += [_p("Note: " + n) for n in env.notes]
    return blocks + [Table(table)]


def _findings_blocks(comparison: Comparison) -> list[Block]:
    c = comparison
    blocks: list[Block] = [Heading(2, "Findings present in only one run")]
    for found, what in ((c.findings_only_b, "New in B (not in A)"), (c.findings_only_a, "Gone in B (only in A)")):
        blocks.append(Heading(3, what))
        blocks.append(Table(findings_table(found)) if found else _p("None."))
    if not c.findings_changed.empty:
        blocks += [Heading(3, "In both, with other severity or cells"), Table(c.findings_changed)]
    return blocks


def _only_blocks(comparison: Comparison) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Cells in only one run")]
    for rows, label in ((comparison.only_a, "Only in A"), (comparison.only_b, "Only in B")):
        blocks.append(Heading(3, f"{label}: {len(rows)}"))
        if len(rows):
            blocks.append(Table(rows.rename(columns={"id": "cell"})))
    return blocks


def _changes_blocks(comparison: Comparison) -> list[Block]:
    cells = comparison.cells
    blocks: list[Block] = [Heading(2, "Status and NaN/inf changes")]
    if cells.empty:
        return blocks + [_p("No matched cells.")]
    status = cells[cells["status_a"] != cells["status_b"]]
    nonfinite = cells[cells["nonfinite"] != ""]
    blocks.append(Table(pd.DataFrame({"cell": status["id"], "A": status["status_a"], "B": status["status_b"]}),
                        "Cells whose status changed") if len(status) else _p("No cell changed status."))
    blocks.append(Table(pd.DataFrame({"cell": nonfinite["id"], "NaN/inf A → B": nonfinite["nonfinite"]}),
                        "Cells whose NaN/inf counts changed")
                  if len(nonfinite) else _p("No NaN/inf count changed."))
    return blocks


def ratio_figure(comparison: Comparison):
    """Latency B/A per cell, grouped by variant, one panel per phase; log y; whiskers are the
    widened 95% intervals; cells over a --fail-on threshold ringed in red. None: nothing to draw."""
    import matplotlib.pyplot as plt

    cells = comparison.cells
    if cells.empty:
        return None
    finite = np.isfinite(cells[[f"{p}_ratio" for p, _ in PHASES]]).any(axis=1)
    variants = list(dict.fromkeys(cells.loc[finite, "variant"].astype(str)))
    if not variants:
        return None
    colors = variant_colors(variants)
    limit = next((t.limit for t in comparison.thresholds if t.kind == "latency"), None)
    failed = comparison.failed
    fig, axes = plt.subplots(2, 1, figsize=(max(6.5, 0.55 * len(variants) + 3), 7.5), sharex=True,
                             layout="constrained")
    for ax, (phase, label) in zip(axes, PHASES):
        failed_ids = set(failed.loc[failed["metric"] == f"latency {label}", "id"])
        for x, variant in enumerate(variants):
            rows = cells[(cells["variant"].astype(str) == variant) & np.isfinite(cells[f"{phase}_ratio"])]
            if rows.empty:
                continue
            xs = x + (np.linspace(-0.3, 0.3, len(rows)) if len(rows) > 1 else np.zeros(1))
            ratio = rows[f"{phase}_ratio"].to_numpy()
            low = np.where(np.isfinite(rows[f"{phase}_low"]), rows[f"{phase}_low"], ratio)
            high = np.where(np.isfinite(rows[f"{phase}_high"]), rows[f"{phase}_high"], ratio)
            ax.errorbar(xs, ratio, yerr=[ratio - low, high - ratio], fmt="o", ms=3.5,
                        color=colors[variant], elinewidth=0.8, alpha=0.85)
            ring = rows["id"].isin(failed_ids).to_numpy()
            if ring.any():
                ax.scatter(xs[ring], ratio[ring], s=70, facecolors="none", edgecolors="tab:red",
                           linewidths=1.2, label="over the --fail-on limit", zorder=3)
        ax.axhline(1.0, color="black", lw=0.8, label="no change (B/A = 1)")
        if limit is not None:
            ax.axhline(limit, color="tab:red", lw=0.9, ls="--", label=f"--fail-on limit ({limit:g})")
        ax.set_yscale("log")
        ax.set_ylabel(f"{label} latency B/A")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[-1].set_xticks(range(len(variants)))
    axes[-1].set_xticklabels(variants, rotation=35, ha="right", fontsize=8)
    legend_below(fig, axes)
    suptitle(fig, "Latency B/A per cell, by variant (whiskers: 95% interval with run-to-run noise)")
    return fig


FIGURE_CAPTION = ("Each point is one matched cell: B's median latency over A's, log scale; whiskers are the "
                  "bootstrap interval widened by run-to-run noise. Points above 1 got slower.")


def write(comparison: Comparison, out_dir: Path, argv: list[str] | None = None) -> dict[str, Path]:
    """index.md, index.html, the figure and cells.csv in out_dir."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    c = comparison
    blocks: list[Block] = [Heading(1, TITLE), _p(*_side_text(c.a)), _p(*_side_text(c.b))]
    if argv:
        blocks.append(Code(shlex.join(argv)))
    blocks.append(Heading(2, "Verdict"))
    if c.thresholds:
        rules = ", ".join(str(t) for t in c.thresholds)
        if c.failed.empty:
            blocks.append(_p(f"--fail-on {rules}: no cell regressed significantly beyond a threshold (exit 0)."))
        else:
            blocks += [_p(f"--fail-on {rules}: {c.failed['id'].nunique()} cells regressed significantly "
                          "beyond a threshold (exit 1)."), Table(failures_table(c))]
    else:
        blocks.append(_p("No --fail-on threshold given: nothing fails."))
    blocks += [_p(line) for line in summary_lines(c)]
    blocks += [_p("Warning: " + w) for w in c.warnings]
    faster = sum(int((c.cells[f"{p}_high"] < 1).sum()) for p, _ in PHASES) if not c.cells.empty else 0
    if faster:
        blocks.append(_p(f"{faster} cell-phases are significantly faster in B. If nothing in the change "
                         "should make them faster, they are run-to-run interference the interval does not "
                         "cover, and a similar number of the slower ones may be too."))
    fig = ratio_figure(c)
    if fig is not None:
        save_figure(fig, out_dir / COMPARE_FIGURE_FILE)
    blocks += _env_blocks(c) + _method_blocks(c)
    if fig is not None:
        blocks += [Heading(2, "Latency ratios"), Figure(COMPARE_FIGURE_FILE, "latency ratios", FIGURE_CAPTION)]
    blocks += _changes_blocks(c) + _findings_blocks(c) + _only_blocks(c)
    table = cells_table(c)
    blocks += [Heading(2, "Every matched cell"),
               _p("Most surely slower first (by the lower end of the latency interval). verdict: FAIL "
                  "over a --fail-on threshold; slower / faster: the interval excludes 1. Also in ",
                  Mono(COMPARE_CELLS_FILE), ".")]
    blocks.append(Table(table) if not table.empty else _p("No matched cells."))
    paths = write_page(out_dir, blocks, TITLE)
    c.cells.to_csv(out_dir / COMPARE_CELLS_FILE, index=False)
    paths["cells_csv"] = out_dir / COMPARE_CELLS_FILE
    if fig is not None:
        paths["figure"] = out_dir / COMPARE_FIGURE_FILE
    return paths
