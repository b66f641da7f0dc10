"""`audit fit-costs fit DIR... | check DIR...`: refit the cost model's constants on run folders,
or check its predictions against what they recorded (plan.costfit)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from ..core.errors import UsageError

HELP = "refit the cost model's constants on run folders, or check its predictions against them"
DESCRIPTION = ("fit: refit the cost model's constants on the records of run folders (the shipped priors, "
               "audit/plan/cost_priors.json, are this fit of tests/data's reference runs); check: predicted "
               "against recorded elapsed_s per folder (docs/planning.md).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("fit", "check"), help="fit the constants, or check the priors")
    parser.add_argument("runs", nargs="+", metavar="DIR", help="run folders with records.jsonl and run.json")
    parser.add_argument("--out", metavar="FILE", help="fit: write the parameters here (default: print them)")
    parser.add_argument("--free-gib", nargs="*", default=[], metavar="DEVICE=GIB",
                        help="fit: the reference machine's free memory per device type, e.g. cuda=139")


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ..plan.costfit import check_folders, fit_folders

    if args.action == "check":
        for line in check_folders(args.runs):
            print(line)
        return 0
    free = {}
    for item in args.free_gib:
        device, _, gib = item.partition("=")
        try:
            free[device] = float(gib) * 2**30
        except ValueError:
            raise UsageError(f"--free-gib: {item!r} is not DEVICE=GIB (e.g. cuda=139)") from None
    params = fit_folders(args.runs, free)
    if args.out:
        Path(args.out).write_text(params.to_json())
    else:
        print(params.to_json(), end="")
    return 0
