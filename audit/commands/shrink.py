"""`audit shrink DIR`: each finding about code the audit did not write, shrunk to its smallest failing
cell (execute/shrink.py), written to DIR/shrunk.jsonl and named in the rebuilt report."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from ..core.errors import UsageError
from ..core.runfolder import RECORDS_FILE, SHRUNK_FILE
from ..core.units import parse_duration
from .common import write_report

HELP = "shrink each finding about torch's, transformers' or a plug-in's code to its smallest failing cell"
DESCRIPTION = ("For each error or warning finding of a run folder about code the audit did not write "
               "(torch's kernels, transformers' attention functions, plug-ins and declared kernels) whose "
               "check a cell decides by itself, measure smaller cells of the same variant and scenario, one "
               "axis at a time (length, batch, heads, head size, then fp32 for a lower precision, then a compiled "
               "variant's uncompiled twin: flex -> flex_eager), and keep "
               "the smallest that still shows the finding. A failed cell's finding is shrunk once per way its "
               "cells failed; one that failed only after other cells (a recompile) is not shrunk alone. Where the "
               "code has a call in its own API, each shrunk finding gets DIR/repro/<check>-<variant>-minimal.py "
               "(torch's or the library's API alone, exit 1 while the defect shows; a recompile's calls the "
               "same function at another length first) and a report draft beside it. Writes DIR/shrunk.jsonl "
               "and rebuilds the report; each finding's message then names its smallest cell and script.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..execute.shrink import SHRINK_MAX_FINDINGS, SHRINK_S
    parser.add_argument("run_dir", metavar="DIR", help="run folder holding records.jsonl")
    parser.add_argument("--seconds", metavar="DURATION", default=f"{SHRINK_S:g}s",
                        help=f"measured cells' time per finding (default {SHRINK_S:g}s; e.g. 30s, 2m); "
                             f"the first {SHRINK_MAX_FINDINGS} findings, errors first, are shrunk")
    parser.add_argument("--no-report", action="store_true", help="write shrunk.jsonl only")
    # a run's own shrinking after its cells (commands/run.py): the run holds the folder's lock, and its
    # shrinking time ends at this time.time()
    parser.add_argument("--in-run", type=float, metavar="DEADLINE", help=argparse.SUPPRESS)


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / RECORDS_FILE).is_file():
        raise UsageError(f"shrink: {str(run_dir)!r} has no {RECORDS_FILE}; give a run folder written by `run`")
    try:
        seconds = parse_duration(args.seconds)
    except UsageError:
        seconds = None
    if seconds is None:
        raise UsageError(f"--seconds: {args.seconds!r} is not a positive duration (e.g. 5s, 30s, 2m)")
    from ..execute.lock import FolderBusy, RunLock
    from ..execute.shrink import import_paths, run_preset, shrink_run
    sys.path[:0] = [p for p in import_paths(run_dir) if p not in sys.path]    # its plug-ins, as the run imported them
    from ..measure.machine.environment import environment

    def shrink_now() -> list[dict]:
        return shrink_run(run_dir, run_preset(run_dir), environment(), seconds, deadline=args.in_run,
                          progress=lambda text: print(f"attn-audit: shrunk {text}", file=sys.stderr))
    if args.in_run is not None:         # the run holds the lock
        lines = shrink_now()
    else:
        try:
            with RunLock(run_dir):
                lines = shrink_now()
        except FolderBusy:
            raise UsageError(f"shrink: a run is writing {run_dir}; shrink it once the run has ended") from None
    print(f"shrunk {len(lines)} finding(s): {run_dir / SHRUNK_FILE}")
    if not args.no_report:
        write_report(run_dir)
    return 0
