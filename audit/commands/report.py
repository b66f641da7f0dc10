"""`audit report DIR|FILE.json`: rebuild findings, figures and index.md/index.html from records."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from ..core.errors import UsageError
from ..core.runfolder import RECORDS_FILE
from .common import quarantine, write_report

HELP = "rebuild findings, figures and index.md/index.html from records"
DESCRIPTION = ("Rebuild findings, figures and index.md/index.html from a run folder's records, or from a "
               "pytest-benchmark JSON file written by suites/test_performance.py (converted into a run "
               "folder first).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="DIR|FILE.json",
                        help="run folder holding records.jsonl, or a pytest-benchmark JSON file")
    parser.add_argument("--out", metavar="DIR",
                        help="for a JSON file: the run folder to write (default: FILE-report/ beside it)")


def report(run_dir: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """Rebuild the report of a run folder (or of a pytest-benchmark JSON file, converted into
    the run folder `out` first). Returns the paths written: index_md, index_html, figures.
    Raises UsageError for a folder without records or a JSON file without audit benchmarks."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        from ..analysis.benchjson import convert
        target = Path(out) if out else run_dir.with_name(run_dir.stem + "-report")
        try:
            run_dir, n_records, ignored = convert(run_dir, target)
        except ValueError as exc:
            raise UsageError(f"report: {exc}") from None
        print(f"converted {n_records} cells from pytest-benchmark JSON into {run_dir}"
              + (f" ({ignored} benchmarks without audit extra_info ignored)" if ignored else ""))
        if n_records == 0:
            raise UsageError("report: the JSON file has no benchmarks from suites/test_performance.py")
    elif out:
        raise UsageError("report: --out applies to a pytest-benchmark JSON file, not a run folder")
    if not (run_dir / RECORDS_FILE).is_file():
        raise UsageError(f"report: {str(run_dir)!r} has no {RECORDS_FILE}; give a run folder written by `run`")
    from ..execute.lock import FolderBusy, RunLock
    try:
        with RunLock(run_dir):           # quarantine only while no run is writing the folder
            quarantine(run_dir)
    except FolderBusy:
        print(f"attn-audit: a run is writing {run_dir}: reporting what is recorded so far", file=sys.stderr)
    return write_report(run_dir)


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    report(args.run_dir, args.out)
    return 0
