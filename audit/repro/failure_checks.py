"""The verifier of a failed cell (cell_failed): the call again in a fresh child process, and where
it runs alone, once more after the calls the audit's measuring process made before it (a compiled
variant can fail only on a recompile). Copied into standalone scripts like audit/repro/checks.py:
keep what it calls at module level."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
from typing import Any, Callable

from ..core.grid import Case
from ..measure.cell.cellcache import build_reference
from ..measure.checks.contract import check_output
from ..measure.cell.measurement import input_grads
from ..workload.inputs import draw_inputs

from .checks import CHILD_AUDIT_FAILED, CHILD_FLAG, CHILD_OK, CHILD_READY, call_variant

REPLAY_FLAG = "--replay"      # the child calls the variant on the cells that ran before the failed one, first


def verify_cell_failed(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """The cell failed (error, oom, timeout): run the call in a child process, as the audit's
    worker did, and report how it ends. The variant is imported in the child only. Where the cell
    runs alone but the audit's measuring process had called the variant on other cells first
    (recorded["replay_ids"]: a compiled variant can fail only on a recompile), a second child
    replays those calls in order, then the cell: NOT REPRODUCED only once that passes too."""
    limit = recorded.get("time_limit_s") or 600.0
    lines = [f"the audit recorded: {recorded.get('status')}: {recorded.get('reason')}"]
    defect, how = _child_outcome([CHILD_FLAG], limit)
    replay = list(recorded.get("replay_ids") or [])
    if defect is None:
        lines.append(f"now: the call did not finish within {limit:g} s (the cell's time limit)")
        return True, lines, {"status": "timeout"}
    if not defect:
        lines.append("now: the variant runs this cell (forward and backward) and returns a valid output"
                     + (" alone in a fresh process" if replay else ""))
        if not replay:
            return False, lines, {"status": "ok"}
        defect, after = _child_outcome([CHILD_FLAG, REPLAY_FLAG], limit * (1 + len(replay)))
        lines.append(f"then, after calling it on the {len(replay)} cell(s) the audit's measuring process ran it on "
                     f"before (in order: {', '.join(replay)}):")
        if defect is None:
            lines.append(f"  the calls did not finish within {limit * (1 + len(replay)):g} s")
            return True, lines + ["fails on a recompile: only after those calls"], {"status": "timeout"}
        if not defect:
            lines.append("  the variant runs this cell too")
            return False, lines, {"status": "ok"}
        lines += ["  " + line for line in after]
        lines.append(f"fails on a recompile: after {replay[0]}" + (f" and {len(replay) - 1} more" if len(replay) > 1
                                                                    else "") + " (alone it runs)")
        return True, lines, {"status": "error", "fails_on": "recompile"}
    lines += [("now: " if i == 0 else "") + line for i, line in enumerate(how)]
    return True, lines, {"status": "error"}


def _child_outcome(args: list[str], limit: float) -> tuple[bool | None, list[str]]:
    """Run this script as a child with `args`: (True and how it failed, False when the variant ran
    the cell, None when it ran past `limit` seconds)."""
    try:
        done = subprocess.run([sys.executable, sys.argv[0], *args], capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, []
    text = (done.stdout + done.stderr).strip()
    if CHILD_READY not in text:
        raise RuntimeError(f"the child process failed before calling the variant:\n{text[-2000:]}")
    if CHILD_OK in text and done.returncode == 0:
        return False, []
    if done.returncode < 0:
        how = f"died with signal {signal.Signals(-done.returncode).name}"
    else:
        tail = [line for line in text.splitlines() if line.strip() and not line.startswith("repro-child:")]
        errors = [line.strip() for line in tail if re.search(r"(?:^|\s|:)error\s?:\s*\S", line, re.IGNORECASE)]
        how = f"exit code {done.returncode}" + (f": {tail[-1].strip()}" if tail else "")
        if errors:
            how += f" (the compiler: {errors[0]})"
    who = "attn-audit's measuring code (not the variant)" if CHILD_AUDIT_FAILED in text else "the call"
    return True, [f"{who}: {how}"] + ["  " + line for line in text.splitlines()[-12:]
                                     if not line.startswith("repro-child:")]


def replay_calls(replay: list, draws: dict, load_variant: Callable) -> None:
    """The calls the audit's measuring process made before the failed cell: each earlier cell's
    inputs drawn as the audit drew them (axes, query length, scenario), the variant called forward
    and, where its inputs take gradients, backward; their own failures ignored (the audit recorded
    them)."""
    attention, _ = load_variant()
    for axes, tq, scenario in replay:
        draw, score_mod = draws[scenario]
        try:
            earlier = draw_inputs(Case(**axes), draw, tq, score_mod)
            q, k, v, out = call_variant(attention, earlier)
            if q.requires_grad:
                input_grads(out, (q, k, v), earlier.grad_out)
        except Exception as exc:  # noqa: BLE001 - an earlier cell's own failure: recorded by the audit
            print(f"repro-child: an earlier cell failed too ({type(exc).__name__})", flush=True)


def cell_failed_child(case: Any, inputs: Any, load_variant: Callable, replay: list | None = None,
                      replay_draws: dict | None = None) -> int:
    """The child of verify_cell_failed: with REPLAY_FLAG, first the calls the audit made before
    this cell (replay_calls); then the audit's reference for the cell (a cell can fail there
    too), the variant's forward, its output contract, backward."""
    if REPLAY_FLAG in sys.argv[2:]:
        replay_calls(replay or [], replay_draws or {}, load_variant)
    attention, _ = load_variant()
    print(CHILD_READY, flush=True)
    try:
        build_reference(case, inputs)
    except Exception:
        print(CHILD_AUDIT_FAILED, flush=True)
        raise
    q, k, v, out = call_variant(attention, inputs)
    check_output(out, q, v)
    if q.requires_grad:
        input_grads(out, (q, k, v), inputs.grad_out)
    print(CHILD_OK, flush=True)
    return 0


FAILURE_VERIFIERS: dict[str, Callable[..., tuple]] = {"cell_failed": verify_cell_failed}
