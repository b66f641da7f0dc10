"""`python -m audit ...` / `attn-audit ...`: list, run, report, compare.

Usage errors print one line naming the bad value and what is allowed, and exit
with code 2 (no traceback).
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Callable, Sequence

from .core.grid import AXES
from .core.errors import UsageError
from .workload.inputs import SCENARIOS
from .execute.interrupt import stop_on_signals
from .core.paths import reports_root
from .core.records import NewerSchema
from .core.runfolder import LATEST_LINK, QUARANTINE_FILE, RECORDS_FILE, RUN_FILE

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _axis_flag(axis: str) -> str:
    return "--" + axis.replace("_", "-")


AXIS_HELP = {
    "variant": "variants: built-in names (see `list`) or package.module:function",
    "device": "devices: cpu, cuda",
    "dtype": "dtypes: fp32, fp16, bf16",
    "d_k": "head dimensions (positive integers)",
    "seq_len": "sequence lengths (positive integers)",
    "batch": "batch sizes (positive integers)",
    "heads": "numbers of heads (positive integers)",
    "kv_heads": "numbers of key/value heads (positive integers dividing --heads; default: = heads, "
                "multi-head; fewer: GQA, 1: MQA)",
    "causal": "causal masking: true, false or both (true false)",
    "scenario": "input scenarios: " + ", ".join(SCENARIOS) + " (README: Input scenarios)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attn-audit", description="Benchmark and numerically audit attention implementations.")
    sub = parser.add_subparsers(dest="command", metavar="{list,run,report,compare,merge}", parser_class=_Parser)
    sub.required = True

    sub.add_parser("list", help="print the built-in variants and the presets")

    run = sub.add_parser("run", help="measure every cell of a grid and write records plus a report",
                         description="Measure every cell of the grid: one JSON record per cell is appended "
                                     "to DIR/records.jsonl as soon as it is measured; rerunning with the same "
                                     "--out finishes the remaining cells. Axis options take one or more values "
                                     "and replace the preset's values for that axis.")
    run.add_argument("--preset", help="quick, cpu, gpu or gpu-check (default: gpu when CUDA is available, else cpu)")
    for axis in AXES:
        run.add_argument(_axis_flag(axis), dest=axis, nargs="+", metavar="V", help=AXIS_HELP[axis])
    run.add_argument("--out", metavar="DIR",
                     help="run folder (default reports/<timestamp>/; reports/latest points to the newest)")
    run.add_argument("--budget", metavar="DURATION",
                     help="wall-time budget of the run, e.g. 90s, 10m, 1h30m, or none (default: the preset's: "
                          "quick 60s, cpu 10m, gpu 8m, gpu-check 3m). Cells that do not fit are recorded "
                          "as skipped with their predicted time, most expensive first (README: Time budget)")
    run.add_argument("--cell-timeout", type=float, metavar="S",
                     help="per-cell time limit in seconds: a cell still running after it is recorded as "
                          "timeout and its worker killed (default: 10 times the cell's predicted time, at "
                          "least 30 s)")
    run.add_argument("--max-cell-s", type=float, metavar="S",
                     help="skip a cell (status skipped) when its warm-up predicts it would take more "
                          "than S seconds (default: the preset's; none with --budget none)")
    run.add_argument("--min-samples", type=int, metavar="N",
                     help="timed samples per measurement, at least (default: the preset's)")
    run.add_argument("--energy-window-s", type=float, metavar="S",
                     help="CUDA: least seconds between the two NVML energy-counter updates that bound a "
                          "cell's energy window (default: the preset's, 0.05 for gpu; 0 turns energy off)")
    run.add_argument("--l2-flush", action="store_true",
                     help="CUDA: overwrite a 256 MiB buffer before every timed sample so each starts with "
                          "a cold L2; samples are then single calls")
    run.add_argument("--cuda-graph", action="store_true",
                     help="CUDA: time CUDA-graph replays of the call (less launch overhead); "
                          "recorded per cell, falls back to eager calls where capture fails")
    run.add_argument("--dry-run", action="store_true",
                     help="print the cells, each with its predicted time, and the predicted total per phase "
                          "and per variant (README: Cost model); measure nothing but the ceilings")
    run.add_argument("--shard", metavar="I/N",
                     help="measure only shard I of N (I from 0; e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT): "
                          "whole input sets, balanced by predicted cost, the same on every machine; "
                          "combine the shards' folders with `merge` (README: Many GPUs and machines)")
    run.add_argument("--executor", choices=("local", "ray"), default="local",
                     help="local: this machine (default); ray: the grid's shards as Ray tasks, one GPU each "
                          "for cuda cells, a whole node's CPUs for cpu cells, gathered into --out")
    run.add_argument("--ray-address", metavar="ADDR",
                     help="with --executor ray: the cluster to join (default: $RAY_ADDRESS, else a new "
                          "local Ray instance on this machine)")
    run.add_argument("--shards", type=int, metavar="N",
                     help="with --executor ray: shards per device kind (default: one per GPU for cuda cells, "
                          "one per largest node for cpu cells)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--no-report", action="store_true", help="write records only, no figures or index")
    run.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # internal: the measuring process

    rep = sub.add_parser("report", help="rebuild findings, figures and index.md/index.html from records",
                         description="Rebuild findings, figures and index.md/index.html from a run folder's "
                                     "records, or from a pytest-benchmark JSON file written by "
                                     "suites/test_performance.py (converted into a run folder first).")
    rep.add_argument("run_dir", metavar="DIR|FILE.json",
                     help="run folder holding records.jsonl, or a pytest-benchmark JSON file")
    rep.add_argument("--out", metavar="DIR",
                     help="for a JSON file: the run folder to write (default: FILE-report/ beside it)")

    cmp = sub.add_parser("compare", help="compare run A (before) with run B (after), cell by cell",
                         description="Compare run A (before) with run B (after): per matched cell the latency "
                                     "ratio B/A with a 95% interval, peak-memory and error ratios, status and "
                                     "NaN/inf changes; findings and cells present in only one run; the two "
                                     "environments. Writes index.md, index.html, latency_ratios.png and "
                                     "cells.csv (README: Compare two runs).")
    cmp.add_argument("a", metavar="A", help="before: run folder, or pytest-benchmark JSON file")
    cmp.add_argument("b", metavar="B", help="after: run folder, or pytest-benchmark JSON file")
    cmp.add_argument("--out", metavar="DIR", help="folder to write (default reports/compare-<timestamp>/)")
    cmp.add_argument("--fail-on", action="append", default=[], metavar="SPEC",
                     help="exit 1 when a cell regresses significantly beyond KIND:+N%%, KIND latency, memory "
                          "or error (e.g. latency:+20%%); repeatable or comma-separated")
    cmp.add_argument("--noise", type=float, metavar="SD",
                     help="run-to-run noise to assume, as the standard deviation of log(B/A) (e.g. 0.1 for "
                          "about 10%%), instead of measuring it from the matched cells")
    mrg = sub.add_parser("merge", help="combine the run folders of a grid's shards into one run folder",
                         description="Combine shard run folders (run --shard I/N) into one run folder that "
                                     "report reads like any other, then build its report. Refuses folders "
                                     "of another grid, code version, torch or sampling settings, and a cell "
                                     "recorded twice; lists the shards and cells missing.")
    mrg.add_argument("out", metavar="OUT", help="the merged run folder to write (new, or without records)")
    mrg.add_argument("shard_dirs", metavar="SHARD_DIR", nargs="+", help="run folders of the shards")
    mrg.add_argument("--force", action="store_true",
                     help="merge folders whose grid, code version, torch or sampling settings differ "
                          "(noted in run.json: merged.forced)")
    mrg.add_argument("--no-report", action="store_true", help="write the merged records only, no report")
    return parser


def _cmd_list() -> int:
    from .workload.presets import presets
    from .workload.variants import builtin_variants

    print("variants:")
    for v in builtin_variants().values():
        print(f"  {v.name:<18} {v.description}")
    print("  package.module:function  your own (see README: Your own variant)")
    print("\npresets:")
    for p in presets().values():
        print(f"  {p.name:<8} {p.description}")
    return 0


def _resolve_out(out: str | None) -> Path:
    if out:
        return Path(out)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return reports_root() / stamp


def _point_latest(run_dir: Path) -> None:
    """reports/latest -> the newest run folder under reports/ (audit.core.paths)."""
    reports = reports_root()
    try:
        if run_dir.resolve().parent != reports.resolve():
            return
        latest = reports / LATEST_LINK
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(run_dir.name)
    except OSError:
        pass


def _cmd_run(args: argparse.Namespace, argv: Sequence[str], started: float | None = None) -> int:
    import dataclasses
    import time

    started = started or time.time()

    from .workload import presets, variants
    from .execute import runner

    table = presets.presets()
    if args.preset is not None and args.preset not in table:
        raise UsageError(f"--preset: unknown preset {args.preset!r}; allowed: {', '.join(table)}")
    preset = table[args.preset or presets.default_preset_name()]
    overrides = {}
    if args.max_cell_s is not None:
        if not args.max_cell_s > 0:
            raise UsageError(f"--max-cell-s: {args.max_cell_s!r} is not a positive number of seconds")
        overrides["max_cell_s"] = args.max_cell_s
    if args.min_samples is not None:
        if args.min_samples < 1:
            raise UsageError(f"--min-samples: {args.min_samples!r} is not a positive integer")
        overrides["min_samples"] = args.min_samples
    if args.l2_flush:
        overrides["l2_flush"] = True
    if args.cuda_graph:
        overrides["cuda_graph"] = True
    if args.energy_window_s is not None:
        if args.energy_window_s < 0:
            raise UsageError(f"--energy-window-s: {args.energy_window_s!r} is negative (0 turns energy off)")
        overrides["energy_window_s"] = args.energy_window_s
    if args.cell_timeout is not None and not args.cell_timeout > 0:
        raise UsageError(f"--cell-timeout: {args.cell_timeout!r} is not a positive number of seconds")
    if args.budget is not None:
        from .core.units import parse_duration
        overrides["budget_s"] = parse_duration(args.budget)
        if overrides["budget_s"] is None and args.max_cell_s is None:
            overrides["max_cell_s"] = None     # --budget none measures every cell asked for
    preset = dataclasses.replace(preset, **overrides)

    overrides = {axis: getattr(args, axis) for axis in AXES if getattr(args, axis)}
    cases = presets.preset_cases(preset, overrides, known_variant=variants.check_name)
    axes = {a: tuple(dict.fromkeys(c.axes()[a] for c in cases)) for a in AXES}
    cases, extra = _shard(args, cases, preset)
    if args.dry_run:
        return _dry_run(cases, preset, Path(args.out) if args.out else None, started)
    for flag, on in (("--cuda-graph", preset.cuda_graph), ("--l2-flush", preset.l2_flush)):
        if on and not any(c.device == "cuda" for c in cases):
            raise UsageError(f"{flag}: needs cuda cells (--device cuda); this grid is cpu only")
    if any(c.device == "cuda" for c in cases) and args.executor == "local":
        import torch
        if not torch.cuda.is_available():
            raise UsageError("--device: cuda is not available on this machine "
                             "(torch.cuda.is_available() is False); allowed here: cpu")

    run_dir = _resolve_out(args.out)
    if args.worker:
        return _work(cases, run_dir, preset, args)

    from .measure.environment import environment

    from .execute.lock import FolderBusy, RunLock

    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = RunLock(run_dir).acquire()
    except FolderBusy as exc:
        raise UsageError(str(exc)) from None
    try:
        _quarantine(run_dir)
        _point_latest(run_dir)
        if args.executor == "ray":
            code = _measure_on_ray(args, argv, cases, preset, overrides, axes, extra, run_dir)
        else:
            ceilings, measured = runner.ceilings_for(cases, run_dir, preset.ceilings_s)
            runner.write_run_file(run_dir, preset, axes, list(argv), environment(), len(cases), ceilings, extra)
            print(f"attn-audit: {len(cases)} cells ({preset.name} preset) -> {run_dir}", file=sys.stderr)
            _plan(cases, preset, run_dir, started, ceilings_measured=measured)
            code = _supervise(cases, run_dir, [a for a in argv[1:] if a != "--worker"], args.cell_timeout)
        if code != 0:
            return code
        from .measure.seed import write_claims
        write_claims(run_dir)
        if args.no_report:
            print(f"records: {run_dir / 'records.jsonl'}")
            return 0
        return _write_report(run_dir)
    finally:
        lock.release()


def _shard(args: argparse.Namespace, cases: list, preset) -> tuple[list, dict]:
    """--shard I/N: this shard's cells; and run.json's `grid` (and `shard`) fields."""
    from .plan.shard import grid_info, parse_shard, shard_cases, shard_info

    extra = {"grid": grid_info(cases, preset)}
    if args.executor == "ray":
        if args.shard is not None:
            raise UsageError("--shard: measures one shard on this machine; --executor ray makes its own (--shards N)")
        if args.shards is not None and args.shards < 1:
            raise UsageError(f"--shards: {args.shards!r} is not a positive integer")
        extra["executor"] = {"name": "ray", "address": args.ray_address, "shards": args.shards}
    elif args.ray_address or args.shards:
        raise UsageError("--ray-address/--shards: apply to --executor ray only")
    if args.shard is None:
        return cases, extra
    spec = parse_shard(args.shard)
    mine = shard_cases(cases, preset, spec)
    return mine, {**extra, "shard": shard_info(spec, mine)}


def _measure_on_ray(args, argv, cases, preset, axis_overrides, axes, extra, run_dir: Path) -> int:
    """--executor ray: the shards as Ray tasks, their records gathered into run_dir."""
    from .execute.ray_executor import measure

    run_parser = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    try:
        return measure(run_dir, cases, preset, axis_overrides, axes, list(argv), extra, args, run_parser._actions)
    except KeyboardInterrupt:
        print(f"\nattn-audit: interrupted; finished cells are saved in {run_dir}. "
              f"Rerun with --out {run_dir} to measure the rest.", file=sys.stderr)
        return EXIT_INTERRUPTED


def _quarantine(run_dir: Path) -> None:
    """Move damaged record lines aside (their cells are measured again); say so in one line.
    Records of a newer schema stop the run: exit 2, naming both versions."""
    from .core.records import NewerSchema, quarantine_damaged
    try:
        moved = quarantine_damaged(run_dir)
    except NewerSchema as exc:
        raise UsageError(f"{run_dir / 'records.jsonl'}: {exc}") from None
    if moved:
        lines = ", ".join(str(n) for n, _ in moved[:10]) + (" ..." if len(moved) > 10 else "")
        print(f"attn-audit: {len(moved)} damaged line(s) of records.jsonl (line {lines}) moved to "
              f"{run_dir / QUARANTINE_FILE}; their cells are measured again by a run", file=sys.stderr)


def _not_recorded(cases, run_dir: Path | None) -> list:
    """The cells a run in run_dir still has to measure."""
    from .core.records import completed_ids
    done = completed_ids(run_dir) if run_dir is not None else set()
    return [c for c in cases if c.id not in done]


def _plan(cases, preset, run_dir: Path, started: float, ceilings_measured: bool) -> None:
    """Predict the cells not yet recorded, choose what fits the budget, write DIR/plan.json:
    the plan a dry-run shows (budget.plan_run)."""
    from .plan.budget import describe, plan_run

    todo = _not_recorded(cases, run_dir)
    plan, _pred, _notes = plan_run(todo, preset, run_dir, budget_s=preset.budget_s, started_unix=started,
                                   measure=False, ceilings_measured=ceilings_measured)
    plan.write(run_dir)
    print(f"attn-audit: {describe(plan, len(todo))}", file=sys.stderr)


def _dry_run(cases, preset, run_dir: Path | None, started: float) -> int:
    """Every cell with its predicted status and seconds, then the totals per phase and variant,
    and what the budget would skip."""
    from .plan.budget import describe, plan_run
    from .plan.costmodel import summary

    todo = _not_recorded(cases, run_dir)
    plan, pred, notes = plan_run(todo, preset, run_dir, budget_s=preset.budget_s, started_unix=started)
    if len(todo) < len(cases):
        notes.insert(0, f"{len(cases) - len(todo)} cells already recorded in {run_dir}: not predicted")
    for row in pred.itertuples():
        status, reason = (("skipped", plan.skip[row.id]) if row.id in plan.skip
                          else (row.status, row.reason))
        extra = f"  {status}: {reason}" if status != "ok" else ""
        print(f"{row.id}  {plan.predicted.get(row.id, row.total_s):.2f} s{extra}")
    print(f"{len(cases)} cells")
    for note in notes:
        print(f"cost model: {note}")
    print(summary(pred[~pred["id"].isin(plan.skip)]))
    print(describe(plan, len(todo)))
    return 0


MAX_CRASHES = 100


def _work(cases, run_dir: Path, preset, args: argparse.Namespace) -> int:
    """The measuring process: every cell not yet recorded, one record each."""
    from .execute import runner
    from .measure.environment import environment

    try:
        ceilings = json.loads((run_dir / RUN_FILE).read_text()).get("ceilings")
        from .plan.budget import Plan
        counts = runner.run_grid(cases, run_dir, preset, environment(), progress=not args.no_progress,
                                 ceilings=ceilings, plan=Plan.read(run_dir))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except runner.WorkerRestart as exc:
        print(f"attn-audit: {exc}", file=sys.stderr)
        return EXIT_RESTART
    summary = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    print(f"attn-audit: {summary}", file=sys.stderr)
    return 0


CELL_TIMEOUT_FLOOR_S = 30.0     # a cell's time limit is at least this ...
CELL_TIMEOUT_FACTOR = 10.0      # ... and this many times its predicted time
EXIT_RESTART = 75               # the worker asks for a fresh process (a cell leaked memory)
POLL_S = 0.25


def cell_limits(run_dir: Path, fixed_s: float | None) -> "Callable[[str], float]":
    """The per-cell time limit: --cell-timeout, else max(30 s, 10 × the cell's predicted time
    from DIR/plan.json), so the budget's plan and the limit agree."""
    from .plan.budget import Plan
    plan = Plan.read(run_dir)
    predicted = plan.predicted if plan else {}

    def limit(cell_id: str) -> float:
        if fixed_s is not None:
            return fixed_s
        return max(CELL_TIMEOUT_FLOOR_S, CELL_TIMEOUT_FACTOR * predicted.get(cell_id, 0.0))
    return limit


def _supervise(cases, run_dir: Path, argv: list[str], cell_timeout_s: float | None = None) -> int:
    """Measure in a worker process. A native crash (segfault, abort) in one cell becomes that
    cell's `error` record, a cell over its time limit its `timeout` record (the worker is
    killed), and a new worker resumes with the rest. Ctrl-C ends the whole run."""
    import signal
    import subprocess
    import time

    from .core import records
    from .execute import runner

    from .measure.memory import die_with_parent, libc
    libc()  # look it up here: die_with_parent runs in the forked child, where spawning ldconfig is unwise
    cmd = [sys.executable, "-m", "audit", *argv, "--out", str(run_dir), "--worker"]
    by_id = {c.id: c for c in cases}
    limit = cell_limits(run_dir, cell_timeout_s)
    for _ in range(MAX_CRASHES + 1):
        timed_out: tuple[str, float] | None = None
        proc = subprocess.Popen(cmd, preexec_fn=die_with_parent)
        try:
            while True:
                try:
                    code = proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                found = runner.inflight_since(run_dir)
                if found and found[0] in by_id and time.time() - found[1] > limit(found[0]):
                    timed_out = (found[0], limit(found[0]))
                    proc.kill()
                    code = proc.wait()
                    break
        except KeyboardInterrupt:
            if proc.poll() is None:          # a signal to this process alone reaches the worker too
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)        # let the worker stop cleanly (audit.execute.interrupt)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            code = EXIT_INTERRUPTED
        if code == 0:
            return 0
        if timed_out is not None:
            cell, seconds = timed_out
            how = ("--cell-timeout" if cell_timeout_s is not None else
                   f"{CELL_TIMEOUT_FACTOR:g} × its predicted time, at least {CELL_TIMEOUT_FLOOR_S:g} s; --cell-timeout")
            reason = (f"over the per-cell time limit of {seconds:.0f} s ({how}); its measuring process was "
                      "killed and the run went on in a new one")
            runner.record_crash(run_dir, by_id[cell], reason, status="timeout")
            print(f"attn-audit: {cell}: {reason}", file=sys.stderr)
            continue
        if code == EXIT_RESTART:
            continue
        if code in (EXIT_INTERRUPTED, -signal.SIGINT, -signal.SIGTERM):
            print(f"\nattn-audit: interrupted; finished cells are saved in {run_dir / RECORDS_FILE}. "
                  f"Rerun with --out {run_dir} to measure the rest.", file=sys.stderr)
            return EXIT_INTERRUPTED
        cell = runner.read_inflight(run_dir)
        if cell is None or cell not in by_id or cell in records.completed_ids(run_dir):
            print(f"attn-audit: the measuring process exited with {_describe_exit(code)} outside any cell; "
                  f"rerun with --out {run_dir} to resume", file=sys.stderr)
            return 1
        reason = (f"the measuring process died with {_describe_exit(code)} in this cell (a crash in the "
                  f"variant or in torch); the run went on in a new process")
        runner.record_crash(run_dir, by_id[cell], reason)
        print(f"attn-audit: {cell}: {reason}", file=sys.stderr)
    print(f"attn-audit: more than {MAX_CRASHES} crashes; stopping", file=sys.stderr)
    return 1


def _describe_exit(code: int) -> str:
    import signal
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _write_report(run_dir: Path) -> int:
    """Findings from the records, then figures and index: no torch computation."""
    from .analysis.findings import write_findings
    from .core.records import read_records, to_frame
    from .repro.scripts.scripts import write_repro_scripts
    from .render import build_report, is_control_finding, negative_control_check

    found = write_repro_scripts(run_dir, write_findings(run_dir))   # DIR/repro/: a script per finding
    paths = build_report(run_dir)
    real = [f for f in found if not is_control_finding(f)]
    by_severity = {s: sum(f["severity"] == s for f in real) for s in ("error", "warning", "info")}
    controls = negative_control_check(to_frame(read_records(run_dir)), found)
    missed = ", ".join(controls.loc[~controls["flagged"], "control"])
    print(f"findings about real code: {by_severity['error']} error, {by_severity['warning']} warning, "
          f"{by_severity['info']} info ({run_dir / 'findings.json'}); negative controls flagged: "
          f"{int(controls['flagged'].sum())}/{len(controls)}" + (f" (NOT flagged: {missed})" if missed else ""))
    print(f"report: {paths['index_md']} (also {paths['index_html'].name}, {len(paths['figures'])} figures)")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:


    run_dir = Path(args.run_dir)
    if run_dir.is_file():
        from .analysis.benchjson import convert
        target = Path(args.out) if args.out else run_dir.with_name(run_dir.stem + "-report")
        try:
            run_dir, n_records, ignored = convert(run_dir, target)
        except ValueError as exc:
            raise UsageError(f"report: {exc}") from None
        print(f"converted {n_records} cells from pytest-benchmark JSON into {run_dir}"
              + (f" ({ignored} benchmarks without audit extra_info ignored)" if ignored else ""))
        if n_records == 0:
            raise UsageError("report: the JSON file has no benchmarks from suites/test_performance.py")
    elif args.out:
        raise UsageError("report: --out applies to a pytest-benchmark JSON file, not a run folder")
    if not (run_dir / RECORDS_FILE).is_file():
        raise UsageError(f"report: {str(run_dir)!r} has no {RECORDS_FILE}; give a run folder written by `run`")
    from .execute.lock import FolderBusy, RunLock
    try:
        with RunLock(run_dir):           # quarantine only while no run is writing the folder
            _quarantine(run_dir)
    except FolderBusy:
        print(f"attn-audit: a run is writing {run_dir}: reporting what is recorded so far", file=sys.stderr)
    return _write_report(run_dir)


def _cmd_compare(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Exit 1 when a cell regresses significantly beyond a --fail-on threshold, else 0."""
    from .analysis import compare
    from .render import compare_page
    from .analysis.compare_stats import parse_fail_on

    try:
        thresholds = parse_fail_on(args.fail_on)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.noise is not None and not args.noise >= 0:
        raise UsageError(f"--noise: {args.noise!r} is not a standard deviation >= 0 (e.g. 0.1)")
    out = Path(args.out) if args.out else reports_root() / f"compare-{datetime.now():%Y%m%d-%H%M%S}"
    result = compare.compare_runs(args.a, args.b, out, thresholds, args.noise)
    paths = compare_page.write(result, out, list(argv))
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


def _cmd_merge(args: argparse.Namespace) -> int:
    from .execute.merge import describe, merge

    info = merge(Path(args.out), [Path(d) for d in args.shard_dirs], force=args.force)
    for line in describe(info):
        print(f"attn-audit: {line}", file=sys.stderr)
    return 0 if args.no_report else _write_report(Path(args.out))


def main(argv: Sequence[str] | None = None) -> int:
    import time
    started = time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        if args.command == "list":
            return _cmd_list()
        if args.command == "run":
            with stop_on_signals():
                try:
                    return _cmd_run(args, ["attn-audit", *argv], started)
                except KeyboardInterrupt:     # before the first cell or in the report
                    print("\nattn-audit: interrupted", file=sys.stderr)
                    return EXIT_INTERRUPTED
        if args.command == "compare":
            return _cmd_compare(args, ["attn-audit", *argv])
        if args.command == "merge":
            return _cmd_merge(args)
        return _cmd_report(args)
    except (UsageError, NewerSchema) as exc:
        lines = str(exc).strip().splitlines() or [""]
        print(f"attn-audit: error: {lines[0]}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
