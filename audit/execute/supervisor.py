"""A run's two processes: the supervisor, which starts a measuring process (the worker) and
outlives its crashes and hangs, and the worker, which measures every cell not yet recorded.

A native crash (segfault, abort) in one cell becomes that cell's `error` record, a cell over
its time limit its `timeout` record (the worker is killed), and a new worker resumes with the
rest. Ctrl-C ends the whole run; what was measured stays in the run folder.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..core import records
from ..core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED
from ..core.runfolder import RECORDS_FILE, RUN_FILE
from ..plan.budget import Plan
from . import runner

EXIT_RESTART = 75               # the worker asks for a fresh process (a cell leaked memory)
MAX_CRASHES = 100
CELL_TIMEOUT_FLOOR_S = 30.0     # a cell's time limit is at least this ...
CELL_TIMEOUT_FACTOR = 10.0      # ... and this many times its predicted time
POLL_S = 0.25


def work(cases: Sequence[Any], run_dir: Path, preset: Any, *, progress: bool = True,
         prepared: dict[str, float] | None = None) -> int:
    """The measuring process: every cell not yet recorded, one record each; once none is left,
    the seed tutorial's claims (measure.seed), so the supervising process needs no torch, the preset's
    merge functions on their partial states (measure.merging), then the preset's model audit
    (measure.model_audit; its steps marked in flight like cells) unless the plan left it out.
    prepared: the seconds per part this process spent preparing the run (its first process),
    for workers.jsonl."""
    from ..measure.machine.environment import environment
    from ..measure.seed import write_claims

    try:
        ceilings = json.loads((run_dir / RUN_FILE).read_text()).get("ceilings")
        plan = Plan.read(run_dir)
        counts = runner.run_grid(cases, run_dir, preset, environment(), progress=progress,
                                 ceilings=ceilings, plan=plan,
                                 on_start=lambda: runner.write_worker_timing(run_dir, prepared))
        start = time.time()
        write_claims(run_dir)
        runner.write_worker_timing(run_dir, {"seed claims": time.time() - start}, started=False)
        if getattr(preset, "merges", ()):
            from ..measure.merging.run_audit import write_merge_audit
            start = time.time()
            write_merge_audit(run_dir, preset.merges, getattr(preset, "merge_parts", ()))
            runner.write_worker_timing(run_dir, {"merge audit": time.time() - start}, started=False)
        if getattr(preset, "models", ()):
            from ..measure.model_audit import write_run_audit
            start = time.time()
            try:
                write_run_audit(run_dir, preset.models, list(dict.fromkeys(c.variant for c in cases)),
                                model_device(cases), before=lambda step: runner.mark_inflight(run_dir, step),
                                left_out=plan.model_audit_skip if plan else None)
            finally:
                runner.mark_inflight(run_dir, None)
                runner.write_worker_timing(run_dir, {"model audit": time.time() - start}, started=False)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except runner.WorkerRestart as exc:
        print(f"attn-audit: {exc}", file=sys.stderr)
        return EXIT_RESTART
    summary = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    print(f"attn-audit: {summary}", file=sys.stderr)
    return 0


def model_device(cases: Sequence[Any]) -> str:
    """Where a run's model audit runs: on the GPU when the run has cells there, else on the CPU."""
    return "cuda" if any(str(c.device).startswith("cuda") for c in cases) else "cpu"


MODEL_STEP_TIMEOUT_S = 300.0    # a model audit step's time limit without --cell-timeout (a variant's run, or the
                                # float64 one; the slowest measured: gpt-oss-medium's float64 run, 24 s on 2 CPU cores)


def cell_limits(run_dir: Path, fixed_s: float | None) -> Callable[[str], float]:
    """The per-cell time limit: --cell-timeout, else max(30 s, 10 × the cell's predicted time
    from DIR/plan.json), so the budget's plan and the limit agree. plan.json is read again
    whenever it changes: the run's first measuring process writes it."""
    from ..core.runfolder import PLAN_FILE
    seen: dict[str, Any] = {"stamp": None, "predicted": {}}

    def predicted() -> dict[str, float]:
        try:
            stat = (run_dir / PLAN_FILE).stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            return seen["predicted"]
        if stamp != seen["stamp"]:
            plan = Plan.read(run_dir)
            seen.update(stamp=stamp, predicted=plan.predicted if plan else {})
        return seen["predicted"]

    def limit(cell_id: str) -> float:
        if fixed_s is not None:
            return fixed_s
        if is_model_step(cell_id):
            return MODEL_STEP_TIMEOUT_S
        return max(CELL_TIMEOUT_FLOOR_S, CELL_TIMEOUT_FACTOR * predicted().get(cell_id, 0.0))
    return limit


def supervise(cases: Sequence[Any], run_dir: Path, argv: list[str], cell_timeout_s: float | None = None,
              first_extra: Sequence[str] = ()) -> int:
    """Measure in worker processes (`python -m audit <argv> --out DIR --worker`) until every
    cell has a record; 0 when done, EXIT_INTERRUPTED on Ctrl-C, 1 when the worker dies
    outside any cell or crashes more than MAX_CRASHES times. first_extra: arguments for the
    first worker only (commands.run: `--prepare`, it prepares the run)."""
    from ..measure.machine.memory import die_with_parent, libc
    libc()  # look it up here: die_with_parent runs in the forked child, where spawning ldconfig is unwise
    cmd = [sys.executable, "-m", "audit", *argv, "--out", str(run_dir), "--worker"]
    by_id = {c.id: c for c in cases}
    limit = cell_limits(run_dir, cell_timeout_s)
    for attempt in range(MAX_CRASHES + 1):
        timed_out: tuple[str, float] | None = None
        proc = subprocess.Popen([*cmd, *(first_extra if attempt == 0 else ())], preexec_fn=die_with_parent)
        try:
            while True:
                try:
                    code = proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                found = runner.inflight_since(run_dir)
                if (found and (found[0] in by_id or is_model_step(found[0]))
                        and time.time() - found[1] > limit(found[0])):
                    timed_out = (found[0], limit(found[0]))
                    proc.kill()
                    code = proc.wait()
                    break
        except KeyboardInterrupt:
            if proc.poll() is None:          # a signal to this process alone reaches the worker too
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)        # let the worker stop cleanly (execute.interrupt)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            code = EXIT_INTERRUPTED
        if code == 0:
            return 0
        if timed_out is not None:
            cell, seconds = timed_out
            if cell_timeout_s is not None:
                how = "--cell-timeout"
            elif is_model_step(cell):
                how = f"{MODEL_STEP_TIMEOUT_S:g} s for a model audit step; --cell-timeout"
            else:
                how = (f"{CELL_TIMEOUT_FACTOR:g} × its predicted time, at least {CELL_TIMEOUT_FLOOR_S:g} s; "
                       "--cell-timeout")
            reason = (f"over the per-cell time limit of {seconds:.0f} s ({how}); its measuring process was "
                      "killed and the run went on in a new one")
            _record_crash(run_dir, by_id, cell, reason, status="timeout")
            print(f"attn-audit: {cell}: {reason}", file=sys.stderr)
            continue
        if code == EXIT_RESTART:
            continue
        if code in (EXIT_INTERRUPTED, -signal.SIGINT, -signal.SIGTERM):
            print(f"\nattn-audit: interrupted; finished cells are saved in {run_dir / RECORDS_FILE}. "
                  f"Rerun with --out {run_dir} to measure the rest.", file=sys.stderr)
            return EXIT_INTERRUPTED
        cell = runner.read_inflight(run_dir)
        if cell is not None and is_model_step(cell):
            pass                                   # a model audit step: recorded below, then resumed after it
        elif cell is None or cell not in by_id or cell in records.completed_ids(run_dir):
            if code == EXIT_INTERNAL:                  # it said what, in one line
                return EXIT_INTERNAL
            print(f"attn-audit: the measuring process exited with {describe_exit(code)} outside any cell; "
                  f"rerun with --out {run_dir} to resume", file=sys.stderr)
            return 1
        where = "this model audit step" if is_model_step(cell) else "this cell"
        reason = (f"the measuring process died with {describe_exit(code)} in {where} (a crash in the "
                  f"variant or in torch); the run went on in a new process")
        _record_crash(run_dir, by_id, cell, reason)
        print(f"attn-audit: {cell}: {reason}", file=sys.stderr)
    print(f"attn-audit: more than {MAX_CRASHES} crashes; stopping", file=sys.stderr)
    return 1


def is_model_step(marked: str) -> bool:
    """Whether an in-flight mark names a model audit step (measure.model_audit.step_id), not a cell."""
    from ..measure.model_audit import STEP_PREFIX
    return marked.startswith(STEP_PREFIX + ":")


def _record_crash(run_dir: Path, by_id: dict, marked: str, reason: str, status: str = "error") -> None:
    """A dead or killed measuring process's record: the cell's, or the model audit step's (model.jsonl)."""
    if is_model_step(marked):
        from ..measure.model_audit import record_crash
        record_crash(run_dir, marked, reason, status)
        runner.mark_inflight(run_dir, None)
    else:
        runner.record_crash(run_dir, by_id[marked], reason, status=status)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
