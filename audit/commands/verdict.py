"""`audit verdict RUN_DIR`: pass or fail per variant, with the reasons, and an exit code: the audit
as the correctness (and optionally speed) gate of a loop that generates kernels.

A variant passes when it has an ok cell, no error finding (the numerics, gradient and log-sum-exp
budgets, NaN where float64 is finite, leaks, and every referee check), and, with --min-speedup, a
geometric-mean forward speedup over the baseline (sdpa) of at least that much on the cells they
share. Python: audit.verdict(run_dir, variants=[...], min_speedup=...) returns the same as a dict.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Sequence

from ..core.errors import EXIT_FAILED, UsageError
from ..core.runfolder import RECORDS_FILE

HELP = "pass or fail per variant of a run, with the reasons (exit 0 all pass, 1 one fails): a gate"
DESCRIPTION = (HELP + ". A variant fails on any error finding (numerics, gradients, log-sum-exp, the referee's checks "
               "that every call did the work) or, with --min-speedup, when it is slower than that against the "
               "baseline. docs/generated-kernels.md.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by `run`")
    parser.add_argument("--variant", nargs="+", metavar="NAME", default=None,
                        help="the variants to judge (default: every variant of the run but the negative controls)")
    parser.add_argument("--min-speedup", type=_positive, default=None, metavar="X",
                        help="also fail a variant whose forward is not at least X times as fast as the baseline "
                             "(sdpa) on the cells they share (geometric mean; 1 = as fast)")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON instead of lines")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"--min-speedup: {text!r} is not a positive number (e.g. 1.2)")
    return value


def verdict(run_dir: str | Path, variants: Sequence[str] | None = None, *,
            min_speedup: float | None = None) -> dict[str, Any]:
    """{"passed": all judged variants passed, "variants": {name: {"passed", "reasons", "cells",
    "speedup"}}, "run_dir"}. reasons: each error finding's check and message (a referee finding
    also names its referee check), "no ok cell", or the speed shortfall; [] when it passed.
    Raises UsageError for a folder without records or a variant the run does not have."""
    from ..analysis.findings import compute_findings
    from ..core.records import load
    from ..render.verdict import verdict_rows
    from ..workload.variant_contract import BROKEN_PREFIX
    from ..workload.variants import VERDICT_BASELINE

    run_dir = Path(run_dir)
    if not (run_dir / RECORDS_FILE).is_file():
        raise UsageError(f"verdict: {str(run_dir)!r} has no {RECORDS_FILE}; give a run folder written by `run`")
    frame = load(run_dir)
    present = sorted(set(frame["variant"].astype(str))) if len(frame) else []
    names = list(variants) if variants else [v for v in present if not v.startswith(BROKEN_PREFIX)]
    unknown = [v for v in names if v not in present]
    if unknown:
        raise UsageError(f"--variant: {', '.join(map(repr, unknown))} not in this run; it has: {', '.join(present)}")
    findings = compute_findings(frame)
    speed = {}
    if min_speedup is not None and VERDICT_BASELINE in present:
        rows = verdict_rows(frame, VERDICT_BASELINE)
        speed = {str(r["variant"]): r["speedup"] for _, r in rows.iterrows()}
    out: dict[str, Any] = {}
    for name in names:
        own = frame[frame["variant"] == name]
        ok = int((own["status"] == "ok").sum())
        reasons = []
        if not ok:
            reasons.append({"check": "no_ok_cell", "message": f"{name} has no ok cell of {len(own)}"})
        for f in findings:
            if f.get("variant") == name and f.get("severity") == "error":
                reason = {"check": f["check"], "message": f["message"], "cells": len(f.get("cells") or [])}
                if f.get("referee_check"):
                    reason["referee_check"] = f["referee_check"]
                reasons.append(reason)
        speedup = speed.get(name)
        if min_speedup is not None:
            if VERDICT_BASELINE not in present:
                reasons.append({"check": "speed", "message": f"no {VERDICT_BASELINE} cell to compare speed with"})
            elif speedup is None or not (isinstance(speedup, float) and math.isfinite(speedup)):
                reasons.append({"check": "speed", "message": f"no cell shared with {VERDICT_BASELINE} to compare"})
            elif speedup < min_speedup:
                reasons.append({"check": "speed", "message": f"forward {speedup:.3g}x {VERDICT_BASELINE}'s speed, "
                                                            f"under the required {min_speedup:g}x"})
        out[name] = {"passed": not reasons, "reasons": reasons, "cells": len(own), "ok_cells": ok,
                     "speedup": speedup if isinstance(speedup, float) and math.isfinite(speedup) else None}
    return {"passed": all(v["passed"] for v in out.values()), "variants": out, "run_dir": str(run_dir)}


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    result = verdict(args.run_dir, args.variant, min_speedup=args.min_speedup)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, v in result["variants"].items():
            print(f"{'PASS' if v['passed'] else 'FAIL'} {name} ({v['ok_cells']} of {v['cells']} cells ok)")
            for r in v["reasons"]:
                what = r["check"] + (f" ({r['referee_check']})" if r.get("referee_check") else "")
                print(f"  - {what}: {r['message']}")
    return 0 if result["passed"] else EXIT_FAILED
