"""`audit run` / `audit.run(...)`: measure every cell of a grid, write records and a report.

run() is the Python API; the command line parses into the same arguments and calls
execute(), so the two check their input alike and record the same run.json.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ..core.argv import to_argv
from ..core.dtypes import dtype_names
from ..core.errors import EXIT_INTERRUPTED, RunFailed, UsageError
from ..core.grid import AXES
from ..core.runfolder import RECORDS_FILE
from ..workload.inputs import SCENARIOS
from .common import UsageArgumentParser, point_latest, quarantine, resolve_out, write_report

HELP = "measure every cell of a grid and write records plus a report"
DESCRIPTION = ("Measure every cell of the grid: one JSON record per cell is appended to DIR/records.jsonl "
               "as soon as it is measured; rerunning with the same --out finishes the remaining cells. "
               "Axis options take one or more values and replace the preset's values for that axis.")
AXIS_HELP = {
    "variant": "variants: built-in names (see `list`) or package.module:function",
    "device": "devices: cpu, cuda",
    "d_k": "head dimensions of queries and keys (positive integers)",
    "d_v": "head dimensions of values (positive integers; default: = d_k; MLA: --d-k 192 --d-v 128)",
    "seq_len": "sequence lengths (positive integers)",
    "batch": "batch sizes (positive integers)",
    "heads": "numbers of heads (positive integers)",
    "kv_heads": "numbers of key/value heads (positive integers dividing --heads; default: = heads, "
                "multi-head; fewer: GQA, 1: MQA)",
    "causal": "causal masking: true, false or both (true false)",
    "scenario": "input scenarios: " + ", ".join(SCENARIOS) + " (docs/scenarios.md)",
}


def axis_help(axis: str) -> str:
    """An axis option's help (AXIS_HELP); the dtypes are the registry's when the parser is built (core/dtypes.py)."""
    if axis == "dtype":
        return "dtypes: " + ", ".join(dtype_names())
    return AXIS_HELP[axis]


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--preset", help="quick, cpu, gpu or gpu-check (default: gpu when CUDA is available, else cpu)")
    for axis in AXES:
        run.add_argument("--" + axis.replace("_", "-"), dest=axis, nargs="+", metavar="V", help=axis_help(axis))
    run.add_argument("--out", metavar="DIR",
                     help="run folder (default reports/<timestamp>/; reports/latest points to the newest)")
    run.add_argument("--budget", metavar="DURATION",
                     help="wall-time budget of the run, e.g. 90s, 10m, 1h30m, or none (default: the preset's: "
                          "quick 60s, cpu 10m, gpu 8m, gpu-check 3m). It buys one cell of every variant per "
                          "dtype and mask kind and each negative control's self-check first, then the cheapest "
                          "cells; cells that do not fit are recorded as skipped with their predicted time "
                          "(docs/planning.md)")
    run.add_argument("--shrink", metavar="DURATION",
                     help="time after the cells for shrinking each error or warning finding about torch's, "
                          "transformers' or a plug-in's code to its smallest failing cell and a minimal script in "
                          "its own API (repro/*-minimal.py; docs/numerics.md, Smallest failing cell), e.g. 40s, or "
                          "0 for none (default: the preset's, cpu 40s, within 7%% of --budget and none under 10 s; "
                          "none on --shard or Ray: `audit shrink DIR` afterwards)")
    run.add_argument("--cell-timeout", type=float, metavar="S",
                     help="per-cell time limit in seconds: a cell still running after it is recorded as "
                          "timeout and its worker killed (default: 10 times the cell's predicted time, at "
                          "least 30 s)")
    run.add_argument("--max-cell-s", type=float, metavar="S",
                     help="skip a cell (status skipped) when its warm-up predicts it would take more "
                          "than S seconds (default: the preset's; none with --budget none)")
    run.add_argument("--min-samples", type=int, metavar="N",
                     help="timed samples per measurement, at least (default: the preset's)")
    run.add_argument("--noise-target", type=float, metavar="PCT",
                     help="after the minimum, keep sampling until each median's 95%% interval is within "
                          "±PCT percent, or --noise-cap-s is spent; a cell still wider is flagged unstable "
                          "(default 5, or $ATTN_AUDIT_NOISE_TARGET; 0: the minimum only, nothing judged, no canary)")
    run.add_argument("--noise-cap-s", type=float, metavar="S",
                     help="the most seconds a measurement samples beyond its minimum to reach --noise-target "
                          "(default: the preset's, 0.2 quick and cpu, 0.05 gpu and gpu-check)")
    run.add_argument("--energy-window-s", type=float, metavar="S",
                     help="CUDA: least seconds between the two NVML energy-counter updates that bound a "
                          "cell's energy window, lengthened where one counter read is over 5%% of it (default: "
                          "the preset's, 0.05 for gpu; 0 turns energy off)")
    run.add_argument("--l2-flush", action="store_true",
                     help="CUDA: overwrite a 256 MiB buffer before every timed sample so each starts with "
                          "a cold L2; samples are then single calls")
    run.add_argument("--cuda-graph", action="store_true",
                     help="CUDA: time CUDA-graph replays of the call (less launch overhead); "
                          "recorded per cell, falls back to eager calls where capture fails")
    run.add_argument("--deterministic", action="store_true",
                     help="measure every cell under torch.use_deterministic_algorithms(True) (CUDA: with "
                          "CUBLAS_WORKSPACE_CONFIG=:4096:8): a variant that raises is recorded as skipped "
                          "with deterministic_refused; the others' repeat_differs says whether they became "
                          "deterministic")
    run.add_argument("--merge-fn", nargs="+", metavar="NAME",
                     help="merge functions of partial attention to audit after the cells (docs/numerics.md, Merging "
                          "partial attention): all (every built-in), none, built-in names (attn-audit list), or "
                          "module:attr, a declare_merge(...) or a function in a module on the Python path "
                          "(default: the quick and cpu presets' own grid audits every built-in; chosen axes none)")
    run.add_argument("--merge-parts", nargs="+", metavar="VARIANT",
                     help="attention variants that return their log-sum-exp (uncompiled, on the CPU: eager, "
                          "flash_op, flex_eager, a plug-in's) whose own (out, lse) over parts of the keys the merge "
                          "functions are audited on too, beside the golden's (docs/numerics.md, Merging partial "
                          "attention); a kernel whose parts no merge can merge right is a merge_parts_wrong finding. "
                          "Without a merge function (--merge-fn, or the preset's) the reference merge is audited")
    run.add_argument("--dry-run", action="store_true",
                     help="print the cells, each with its predicted time, and the predicted total per phase "
                          "and per variant (docs/planning.md); measure nothing but the ceilings")
    run.add_argument("--shard", metavar="I/N",
                     help="measure only shard I of N (I from 0; e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT): "
                          "whole input sets, balanced by predicted cost, the same on every machine; "
                          "combine the shards' folders with `merge` (docs/scaling.md)")
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
    # internal: the first measuring process of a run also prepares it (ceilings, run.json, plan);
    # the value is when the run's own process started (the budget's deadline counts from it)
    run.add_argument("--prepare", type=float, metavar="UNIX", help=argparse.SUPPRESS)


def run_parser() -> argparse.ArgumentParser:
    parser = UsageArgumentParser(prog="attn-audit run", description=DESCRIPTION)
    add_arguments(parser)
    return parser


def run(preset: str | None = None, out: str | Path | None = None, **options: Any) -> Path | None:
    """Measure a grid and write its run folder: records, plan, findings and report.

    preset: quick, cpu, gpu or gpu-check (default: gpu with CUDA, else cpu). out: the run
    folder (default reports/<timestamp>/); a folder with records is resumed. options: any
    `run` option by its flag's name (--seq-len 128 256 -> seq_len=[128, 256], --no-report ->
    no_report=True), axes included. Returns the run folder (None for dry_run=True).
    Raises UsageError for bad input, RunFailed when a run ends early, KeyboardInterrupt on
    Ctrl-C; what was measured stays in the folder.

        import audit
        run_dir = audit.run(preset="quick", variant=["eager", "sdpa"], out="reports/mine")
        frame = audit.load(run_dir)
    """
    parser = run_parser()
    if not options.get("dry_run"):
        out = resolve_out(out)
    argv = ["run", *to_argv({"preset": preset, "out": out, **options}, parser._actions)]
    args = parser.parse_args(argv[1:])
    code = execute(args, ["attn-audit", *argv])
    if code == EXIT_INTERRUPTED:
        raise KeyboardInterrupt(f"run interrupted; finished cells are in {out}")
    if code != 0:
        raise RunFailed(code, out)
    return None if args.dry_run else Path(out)


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """The command line's `run`: exit 0 when done, 130 on Ctrl-C, 1 when a run ends early."""
    return execute(args, ["attn-audit", *argv], exiting=True)


def execute(args: argparse.Namespace, argv: Sequence[str], started: float | None = None, *,
            exiting: bool = False) -> int:
    """The run as parsed options; argv (the command line, "attn-audit" first) goes to run.json
    and, but for the program name, to the measuring process. Ctrl-C or SIGTERM stop it;
    exiting: the process ends after it (the command line), so once stopped it ignores them."""
    from ..execute.interrupt import stop_on_signals
    started = started or time.time()
    with stop_on_signals(ignore_after_stop=exiting):
        try:
            return _execute(args, list(argv), started)
        except KeyboardInterrupt:     # before the first cell or in the report
            print("\nattn-audit: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED


def _preset(args: argparse.Namespace) -> Any:
    """The preset named by --preset with the run options' overrides."""
    from ..workload import presets

    table = presets.presets()
    if args.preset is not None and args.preset not in table:
        raise UsageError(f"--preset: unknown preset {args.preset!r}; allowed: {', '.join(table)}")
    preset = table[args.preset or presets.default_preset_name()]
    overrides: dict[str, Any] = {}
    if args.max_cell_s is not None:
        if not args.max_cell_s > 0:
            raise UsageError(f"--max-cell-s: {args.max_cell_s!r} is not a positive number of seconds")
        overrides["max_cell_s"] = args.max_cell_s
    if args.min_samples is not None:
        if args.min_samples < 1:
            raise UsageError(f"--min-samples: {args.min_samples!r} is not a positive integer")
        overrides["min_samples"] = args.min_samples
    if args.noise_target is not None:
        if not 0 <= args.noise_target < 100:
            raise UsageError(f"--noise-target: {args.noise_target!r} is not a percentage from 0 to 100 (0: off)")
        overrides["noise_target"] = args.noise_target / 100
    if args.noise_cap_s is not None:
        if not args.noise_cap_s >= 0:
            raise UsageError(f"--noise-cap-s: {args.noise_cap_s!r} is not a non-negative number of seconds")
        overrides["noise_cap_s"] = args.noise_cap_s
    if args.l2_flush:
        overrides["l2_flush"] = True
    if args.cuda_graph:
        overrides["cuda_graph"] = True
    if args.deterministic:
        overrides["deterministic"] = True
    if args.energy_window_s is not None:
        if args.energy_window_s < 0:
            raise UsageError(f"--energy-window-s: {args.energy_window_s!r} is negative (0 turns energy off)")
        overrides["energy_window_s"] = args.energy_window_s
    if args.cell_timeout is not None and not args.cell_timeout > 0:
        raise UsageError(f"--cell-timeout: {args.cell_timeout!r} is not a positive number of seconds")
    if args.budget is not None:
        from ..core.units import parse_duration
        overrides["budget_s"] = parse_duration(args.budget)
        if overrides["budget_s"] is None and args.max_cell_s is None:
            overrides["max_cell_s"] = None     # --budget none measures every cell asked for
    budget = overrides.get("budget_s", preset.budget_s)
    if budget is not None:
        # a small budget measures the ceilings in less time (a share of it), keeping the rest for cells
        overrides["ceilings_s"] = min(preset.ceilings_s, max(MIN_CEILINGS_S, CEILINGS_SHARE * budget))
    overrides["shrink_s"] = _shrink_s(args, preset.shrink_s, budget)
    return dataclasses.replace(preset, **overrides)


SHRINK_SHARE = 0.07        # of a budget, at most, for the preset's shrinking after the cells ...
MIN_SHRINK_S = 10.0        # ... and none where that leaves less (a cpu-preset --budget 30s measures cells)


def _shrink_s(args: argparse.Namespace, preset_s: float, budget: float | None) -> float:
    """The seconds after the cells for shrinking (Preset.shrink_s): --shrink's, else the preset's within
    SHRINK_SHARE of the budget (none under MIN_SHRINK_S); none on a shard or on Ray (`audit shrink DIR`)."""
    if args.shrink is not None:
        from ..core.units import parse_duration
        try:
            seconds = 0.0 if args.shrink.strip() in ("0", "none") else parse_duration(args.shrink)
        except UsageError:
            seconds = None
        if seconds is None:
            raise UsageError(f"--shrink: {args.shrink!r} is not a duration (e.g. 20s, 2m) or 0 for none")
        chosen = float(seconds)
    else:
        chosen = preset_s if budget is None else min(preset_s, SHRINK_SHARE * budget)
        chosen = chosen if chosen >= MIN_SHRINK_S else 0.0
    return 0.0 if args.shard is not None or args.executor == "ray" else chosen


CEILINGS_SHARE = 0.04      # of a budget, at most, for measuring the ceilings (the preset's ceilings_s, at most)
MIN_CEILINGS_S = 0.5       # ... and at least (the quick preset's)


def _merges(args: argparse.Namespace, preset: Any, chosen: bool) -> tuple[str, ...]:
    """The merge functions the run audits: --merge-fn's (all: every built-in; none), else the preset's own where
    the grid is the preset's, none where axes are chosen; none on a shard or Ray's (a run of one machine,
    as the model audit). Each name resolved here, so a wrong one exits 2 before anything runs."""
    from ..workload.merges import builtin_merges, merge_names, resolve_merge
    sharded = args.shard is not None or args.executor == "ray"
    if args.merge_fn is None:
        return () if chosen or sharded else tuple(preset.merges)
    names = [n for name in args.merge_fn
             for n in (merge_names() if name == "all" else () if name == "none" else (name,))]
    if names and sharded:
        raise UsageError("--merge-fn: the merge audit runs with a run on one machine, "
                         "not with --shard or --executor ray")
    builtins = builtin_merges()
    for name in names:
        if name != "torch_context_parallel":          # where this torch lacks it, its record says so
            resolve_merge(name, builtins)
    return tuple(dict.fromkeys(names))


def _merge_parts(args: argparse.Namespace, preset: Any) -> dict[str, tuple[str, ...]]:
    """--merge-parts' variants, each checked here (a wrong one exits 2 naming those allowed), and the reference
    merge where no merge function is audited (their states would be judged by nothing)."""
    from ..measure.merging.run_audit import parts_variant
    names = tuple(dict.fromkeys(args.merge_parts or ()))
    if not names:
        return {}
    if args.shard is not None or args.executor == "ray":
        raise UsageError("--merge-parts: the merge audit runs with a run on one machine, "
                         "not with --shard or --executor ray")
    for name in names:
        parts_variant(name)
    return {"merge_parts": names, "merges": preset.merges or ("reference",)}


def _execute(args: argparse.Namespace, argv: list[str], started: float) -> int:
    from ..execute.supervisor import supervise, work
    from ..workload import presets, variants

    preset = _preset(args)
    overrides = {axis: getattr(args, axis) for axis in AXES if getattr(args, axis)}
    if overrides or args.shard is not None or args.executor == "ray":
        # the model audit goes with a preset's own grid on one machine: a grid of chosen axes leaves it
        # out (`audit model --variant ...` runs it for any variant), as do a shard and Ray's shards
        preset = dataclasses.replace(preset, models=())
    preset = dataclasses.replace(preset, merges=_merges(args, preset, chosen=bool(overrides)))
    preset = dataclasses.replace(preset, **_merge_parts(args, preset))
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

    if preset.deterministic:      # before the first cuBLAS handle, here and in the measuring processes
        from ..measure.cell.repeats import CUBLAS_WORKSPACE
        os.environ.setdefault(*CUBLAS_WORKSPACE)
    run_dir = resolve_out(args.out)
    if args.worker:
        import torch  # noqa: F401  - the measuring process's start-up, not its first measurement
        prepared = None
        if args.prepare is not None:
            prepared = _prepare(cases, preset, axes, _run_argv(argv), extra, run_dir, args.prepare)
        return work(cases, run_dir, preset, progress=not args.no_progress, prepared=prepared)

    from ..execute.lock import FolderBusy, RunLock

    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = RunLock(run_dir).acquire()
    except FolderBusy as exc:
        raise UsageError(str(exc)) from None
    try:
        quarantine(run_dir)
        point_latest(run_dir)
        clock = WallSplit(run_dir, started)
        if args.executor == "ray":
            code = _measure_on_ray(args, argv, cases, preset, overrides, axes, extra, run_dir)
            if code == 0:
                from ..measure.seed import write_claims
                with clock.segment("seed claims"):
                    write_claims(run_dir)
        else:
            # The measuring processes import torch; this one never does: the first prepares the
            # run (ceilings, run.json, the plan), the last measures the seed's claims.
            with clock.segment("cells"):
                code = supervise(cases, run_dir, [a for a in argv[1:] if a != "--worker"], args.cell_timeout,
                                 first_extra=["--prepare", repr(clock.process_started)])
        if code != 0:
            return code
        _shrink_after_cells(run_dir, clock)
        if args.no_report:
            clock.write()
            print(f"records: {run_dir / RECORDS_FILE}")
            return 0
        with clock.segment("report"):
            write_report(run_dir, before_page=clock.write)
        clock.write()
        return 0
    finally:
        lock.release()


SHRINK_GRACE_S = 30.0      # past its shrinking time, the shrinking process is stopped (a cell or script hung)


def _shrink_after_cells(run_dir: Path, clock: "WallSplit") -> None:
    """The plan's shrinking (Plan.shrink_s, --shrink) in a process of its own (`audit shrink DIR`; this one
    never imports torch), until its time is spent: each finding about code the audit did not write gets its
    smallest failing cell and minimal script in shrunk.jsonl, which the report reads. A failure or a hang
    costs the run nothing more than the time: the findings then say nothing of it."""
    import subprocess
    from ..plan.budget import Plan
    plan = Plan.read(run_dir)
    if plan is None or not plan.shrink_s:
        return
    deadline = time.time() + plan.shrink_s
    cmd = [sys.executable, "-m", "audit", "shrink", str(run_dir), "--no-report", "--in-run", repr(deadline)]
    with clock.segment("shrink"):
        try:
            done = subprocess.run(cmd, stdout=subprocess.DEVNULL, timeout=plan.shrink_s + SHRINK_GRACE_S)
            if done.returncode != 0:
                print(f"attn-audit: shrinking exited with {done.returncode}; the report goes on without it",
                      file=sys.stderr)
        except subprocess.TimeoutExpired:
            print(f"attn-audit: shrinking ran past its {plan.shrink_s:.0f} s and was stopped; the report goes on "
                  "without it", file=sys.stderr)


class WallSplit:
    """The run's own segments of wall time (start-up, ceilings, plan, cells, seed claims, report),
    and run.json's time_split made from them and the records (core.timesplit.split_wall)."""

    def __init__(self, run_dir: Path, started: float) -> None:
        from ..core.records import completed_ids
        from ..core.timesplit import process_start_unix
        self.run_dir = run_dir
        self.process_started = min(started, process_start_unix() or started)
        self.segments: dict[str, float] = {"start-up": time.time() - self.process_started}
        self.opened: dict[str, float] = {}
        self.done_before = completed_ids(run_dir)

    @contextlib.contextmanager
    def segment(self, name: str) -> Any:
        start = time.time()
        self.opened[name] = start
        try:
            yield
        finally:
            self.opened.pop(name, None)
            self.segments[name] = self.segments.get(name, 0.0) + time.time() - start

    def write(self) -> None:
        """run.json's time_split, now: an open segment (the report, while its page is made)
        counts up to now."""
        import json

        from ..core.records import read_records
        from ..core.runfolder import RUN_FILE
        from ..core.timesplit import split_wall
        from ..execute.runner import read_worker_timing
        now = time.time()
        segments = {k: v + (now - self.opened[k] if k in self.opened else 0.0) for k, v in self.segments.items()}
        segments.update({k: now - t for k, t in self.opened.items() if k not in segments})
        cells = [r for r in read_records(self.run_dir) if r["id"] not in self.done_before]
        split = split_wall(now - self.process_started, segments, cells,
                           read_worker_timing(self.run_dir, self.process_started))
        path = self.run_dir / RUN_FILE
        info = json.loads(path.read_text()) if path.exists() else {}
        info["time_split"] = split
        info["noise"] = _noise_summary(self.run_dir)
        path.write_text(json.dumps(info, indent=2, default=str) + "\n")


def _noise_summary(run_dir: Path) -> dict:
    """run.json's noise: the canary's readings and the run's noise figure (analysis.noise_rules),
    and how many cells were judged and unstable."""
    from ..analysis.noise_rules import canary_summary, judged_mask, unstable_mask
    from ..core.records import load
    from ..core.runfolder import read_canaries
    frame = load(run_dir)
    summary = canary_summary(read_canaries(run_dir), frame)
    if not frame.empty:
        summary.update(cells_judged=int(judged_mask(frame).sum()), cells_unstable=int(unstable_mask(frame).sum()))
    return summary


def _shard(args: argparse.Namespace, cases: list, preset: Any) -> tuple[list, dict]:
    """--shard I/N: this shard's cells; and run.json's `grid` (and `shard`) fields."""
    from ..plan.shard import grid_info, parse_shard, shard_cases, shard_info

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


def _measure_on_ray(args: argparse.Namespace, argv: list[str], cases: list, preset: Any,
                    axis_overrides: dict, axes: dict, extra: dict, run_dir: Path) -> int:
    """--executor ray: the shards as Ray tasks, their records gathered into run_dir."""
    from ..execute.ray_executor import measure

    try:
        return measure(run_dir, cases, preset, axis_overrides, axes, argv, extra, args, run_parser()._actions)
    except KeyboardInterrupt:
        print(f"\nattn-audit: interrupted; finished cells are saved in {run_dir}. "
              f"Rerun with --out {run_dir} to measure the rest.", file=sys.stderr)
        return EXIT_INTERRUPTED


def _not_recorded(cases: list, run_dir: Path | None) -> list:
    """The cells a run in run_dir still has to measure."""
    from ..core.records import completed_ids
    done = completed_ids(run_dir) if run_dir is not None else set()
    return [c for c in cases if c.id not in done]


def _run_argv(worker_argv: list[str]) -> list[str]:
    """The run's own command line from a measuring process's: without what the supervisor added
    to it (supervise: `--out DIR --worker`, then `--prepare UNIX` for the first)."""
    argv = list(worker_argv)
    if "--prepare" in argv:
        i = argv.index("--prepare")
        del argv[i:i + 2]
    if argv and argv[-1] == "--worker":
        argv.pop()
    if len(argv) >= 2 and argv[-2] == "--out":
        del argv[-2:]
    return argv


def _prepare(cases: list, preset: Any, axes: dict, argv: list[str], extra: dict, run_dir: Path,
             started: float) -> dict[str, float]:
    """In the run's first measuring process: time the canary's start reading (measure/machine/canary.py:
    before the ceilings, whose matmuls left it 4-15% slower than every later reading), measure the
    ceilings (once per run folder), write run.json, print the cell count, plan the budget (plan.json).
    Returns its seconds per part of the time split (core.timesplit: start-up, ceilings, plan), for
    workers.jsonl."""
    from ..execute import runner
    from ..measure.machine.environment import environment

    spent: dict[str, float] = {}
    start = time.time()
    from ..measure.machine.canary import canary_device, record_canary
    if preset.noise_target:                    # the run's speed before its cells (--noise-target 0: none)
        record_canary(run_dir, "start", canary_device(c.device for c in cases))
    ceilings, measured = runner.ceilings_for(cases, run_dir, preset.ceilings_s)
    spent["ceilings"] = time.time() - start
    start = time.time()
    runner.write_run_file(run_dir, preset, axes, argv, environment(), len(cases), ceilings, extra)
    print(f"attn-audit: {len(cases)} cells ({preset.name} preset) -> {run_dir}", file=sys.stderr)
    spent["start-up"] = time.time() - start
    start = time.time()
    _plan(cases, preset, run_dir, started, ceilings_measured=measured)
    spent["plan"] = time.time() - start
    return spent


def _plan(cases: list, preset: Any, run_dir: Path, started: float, ceilings_measured: bool) -> None:
    """Predict the cells not yet recorded, choose what fits the budget, write DIR/plan.json:
    the plan a dry-run shows (budget.plan_run)."""
    from ..plan.budget import plan_run
    from ..plan.plan_text import describe, model_audit_line, smallest_plan_line

    todo = _not_recorded(cases, run_dir)
    plan, _pred, _notes = plan_run(todo, preset, run_dir, budget_s=preset.budget_s, started_unix=started,
                                   measure=False, ceilings_measured=ceilings_measured, now_unix=time.time())
    plan.write(run_dir)
    smallest = smallest_plan_line(plan)
    if smallest and (plan.uncovered or plan.measured == 0):
        print(f"attn-audit: {smallest}", file=sys.stderr)
    print(f"attn-audit: {describe(plan, len(todo))}", file=sys.stderr)
    if plan.model_audit_skip:
        print(f"attn-audit: {model_audit_line(plan, tuple(preset.models))}", file=sys.stderr)


def _dry_run(cases: list, preset: Any, run_dir: Path | None, started: float) -> int:
    """Every cell with its predicted status and seconds, then the totals per phase and variant,
    and what the budget would skip."""
    from ..plan.budget import plan_run
    from ..plan.plan_text import describe, model_audit_line, smallest_plan_line, summary

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
    print(summary(pred[~pred["id"].isin(plan.skip)], plan.reserve_s))
    smallest = smallest_plan_line(plan)
    if smallest:
        print(smallest)
    models = model_audit_line(plan, tuple(preset.models))
    if models:
        print(models)
    print(describe(plan, len(todo)))
    return 0
