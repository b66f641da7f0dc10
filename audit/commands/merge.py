"""`audit merge OUT SHARD_DIR...` / `audit.merge(out, shard_dirs)`: one run folder from a grid's shards."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from .common import write_report

HELP = "combine the run folders of a grid's shards into one run folder"
DESCRIPTION = ("Combine shard run folders (run --shard I/N) into one run folder that report reads like any "
               "other, then build its report. Refuses folders of another grid, code version, torch or "
               "sampling settings, and a cell recorded twice; lists the shards and cells missing.")


def add_arguments(mrg: argparse.ArgumentParser) -> None:
    mrg.add_argument("out", metavar="OUT", help="the merged run folder to write (new, or without records)")
    mrg.add_argument("shard_dirs", metavar="SHARD_DIR", nargs="+", help="run folders of the shards")
    mrg.add_argument("--force", action="store_true",
                     help="merge folders whose grid, code version, torch or sampling settings differ "
                          "(noted in run.json: merged.forced)")
    mrg.add_argument("--no-report", action="store_true", help="write the merged records only, no report")


def merge(out: str | Path, shard_dirs: Sequence[str | Path], *, force: bool = False,
          report: bool = True) -> dict[str, Any]:
    """Merge the shards' run folders into `out` and (report=True) build its report. Returns
    the merged run.json (its `merged` field lists the shards and the cells missing). Raises
    UsageError for folders that do not belong together (unless force=True)."""
    from ..execute.merge import describe, merge as merge_folders

    info = merge_folders(Path(out), [Path(d) for d in shard_dirs], force=force)
    for line in describe(info):
        print(f"attn-audit: {line}", file=sys.stderr)
    if report:
        write_report(Path(out))
    return info


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    merge(args.out, args.shard_dirs, force=args.force, report=not args.no_report)
    return 0
