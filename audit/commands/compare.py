"""`audit compare A B` / `audit.compare(a, b)`: run A (before) against run B (after), cell by cell."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from ..core.errors import UsageError
from .common import resolve_out

HELP = "compare run A (before) with run B (after), cell by cell"
DESCRIPTION = ("Compare run A (before) with run B (after): per matched cell the latency ratio B/A with a "
               "95% interval, peak-memory and error ratios, status and NaN/inf changes; findings and cells "
               "present in only one run; the two environments. Writes index.md, index.html, "
               "latency_ratios.png and cells.csv (docs/compare.md).")


def add_arguments(cmp: argparse.ArgumentParser) -> None:
    cmp.add_argument("a", metavar="A", help="before: run folder, or pytest-benchmark JSON file")
    cmp.add_argument("b", metavar="B", help="after: run folder, or pytest-benchmark JSON file")
    cmp.add_argument("--out", metavar="DIR", help="folder to write (default reports/compare-<timestamp>/)")
    cmp.add_argument("--fail-on", action="append", default=[], metavar="SPEC",
                     help="exit 1 when a cell regresses significantly beyond KIND:+N%%, KIND latency, memory "
                          "or error (e.g. latency:+20%%); repeatable or comma-separated")
    cmp.add_argument("--noise", type=float, metavar="SD",
                     help="run-to-run noise to assume, as the standard deviation of log(B/A) (e.g. 0.1 for "
                          "about 10%%), instead of measuring it from the matched cells' spread and the canaries; "
                          "each cell's own timing intervals still add to it")


def compare(a: str | Path, b: str | Path, out: str | Path | None = None, *, fail_on: Sequence[str] = (),
            noise: float | None = None, argv: Sequence[str] | None = None) -> Any:
    """Compare two run folders (or pytest-benchmark JSON files) and write the comparison's
    folder (default reports/compare-<timestamp>/). fail_on: thresholds like "latency:+20%".
    Returns analysis.compare's Comparison: its `cells`, `failed` (the cells regressing beyond a
    threshold; empty when none), `warnings` and `paths` (index_md, index_html, cells_csv). Raises
    UsageError for bad input."""
    from ..analysis.compare import compare_runs
    from ..analysis.compare_stats import parse_fail_on
    from ..render import compare_page

    try:
        thresholds = parse_fail_on(list(fail_on))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if noise is not None and not noise >= 0:
        raise UsageError(f"--noise: {noise!r} is not a standard deviation >= 0 (e.g. 0.1)")
    out = resolve_out(out, prefix="compare-")
    result = compare_runs(str(a), str(b), out, thresholds, noise)
    result.paths = compare_page.write(result, out, list(argv or ["compare", str(a), str(b)]))
    return result


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Exit 1 when a cell regresses significantly beyond a --fail-on threshold, else 0."""
    from ..render import compare_page

    result = compare(args.a, args.b, args.out, fail_on=args.fail_on, noise=args.noise,
                     argv=["attn-audit", *argv])
    paths, thresholds = result.paths, result.thresholds
    for warning in result.warnings:
        print(f"attn-audit: warning: {warning}", file=sys.stderr)
    for line in compare_page.summary_lines(result):
        print(line)
    print(f"comparison: {paths['index_md']} (also {paths['index_html'].name}, {paths['cells_csv'].name}"
          + (f", {paths['figure'].name})" if "figure" in paths else ")"))
    if result.failed.empty:
        if thresholds:
            print(f"no cell regressed significantly beyond {', '.join(str(t) for t in thresholds)}")
        return 0
    print(f"FAILED: {result.failed['id'].nunique()} cells regressed significantly beyond a --fail-on threshold:")
    for row in result.failed.itertuples(index=False):
        interval = f" 95% CI [{row.low:.3g}, {row.high:.3g}]" if row.low == row.low else ""
        print(f"  {row.id}  {row.metric} B/A {row.ratio:.3g}{interval}  ({row.rule})")
    return 1
