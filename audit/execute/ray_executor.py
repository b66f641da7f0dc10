"""Measure a grid's shards as Ray tasks (`audit run --executor ray`), on one multi-GPU node or
a Ray cluster, and gather their records into one run folder.

Each device kind gets its own shards (shard.assign: whole input sets, balanced by predicted
cost). A CUDA shard is a task holding one GPU (Ray sets CUDA_VISIBLE_DEVICES); a CPU shard
holds every CPU of a node (the largest nodes' CPU count), so no two timings share a device.
A task runs the ordinary `audit run --device D --shard I/N` in a folder of its own (the
measuring subprocess, crash and time-limit handling all as on one machine) and pushes each
record to a collector actor the moment it is written; the driver takes them from the actor
into --out/records.jsonl and counts them on a progress bar.

Fault tolerance is Ray's: a task whose worker or node dies is retried (max_retries) on any
worker with the resources. The retry starts from what the collector already holds for its
shard: those records are written into its fresh folder first, so the ordinary resume
measures only the rest. A rerun of the driver with the same --out does the same from the
records in --out. Ray is imported only here, and only when `--executor ray` is given.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..core.argv import to_argv
from ..core.errors import UsageError
from ..core.grid import Case
from ..core.runfolder import PLAN_FILE, RECORDS_FILE, RUN_FILE, SHARD_LOG_FILE
from ..workload.presets import Preset

TASK_RETRIES = 3        # Ray retries a task this many times when its worker or node dies
POLL_S = 0.5            # how often a task looks for new records, and the driver for records
LOG_TAIL_LINES = 20     # of a failed shard's console output, shown in the error
# run options a task sets itself, or that concern only the driver
DRIVER_ONLY = ("executor", "ray_address", "shards", "shard", "out", "no_report", "no_progress", "dry_run",
               "worker", "device", "preset")


def collector_name(run_dir: Path) -> str:
    """The Ray name of a run's collector actor (one run per folder: the folder's lock)."""
    return "attn-audit-collector:" + str(Path(run_dir).resolve())


class Collector:
    """Ray actor holding every record received, per shard, and those not yet taken by the
    driver. A retried task gets its shard's records back from here (begin)."""

    def __init__(self, seeded: dict[str, list[dict]]) -> None:
        self.records = {key: list(recs) for key, recs in seeded.items()}
        self.ids = {key: {r["id"] for r in recs} for key, recs in seeded.items()}
        self.fresh: list[dict] = []
        self.tasks: dict[str, dict] = {}

    def begin(self, key: str, pid: int, host: str) -> tuple[list[dict], int]:
        """A task (attempt) starts: its shard's records so far, and the attempt number."""
        task = self.tasks.setdefault(key, {"attempts": 0})
        task.update(attempts=task["attempts"] + 1, pid=pid, host=host)
        return list(self.records.get(key, [])), task["attempts"]

    def add(self, key: str, recs: list[dict]) -> None:
        """New records of a shard; a cell already held is ignored (a late push from a dead attempt)."""
        ids = self.ids.setdefault(key, set())
        for rec in recs:
            if rec["id"] not in ids:
                ids.add(rec["id"])
                self.records.setdefault(key, []).append(rec)
                self.fresh.append(rec)

    def take(self) -> list[dict]:
        out, self.fresh = self.fresh, []
        return out

    def status(self) -> dict[str, dict]:
        """Per shard: attempts, the pid and host of the latest attempt, records held."""
        return {key: {**task, "records": len(self.records.get(key, []))} for key, task in self.tasks.items()}


class _Tail:
    """New complete lines of a growing records.jsonl, as records."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, path.stat().st_size if path.exists() else 0

    def read(self) -> list[dict]:
        from ..core.records import parse_line
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [parse_line(line) for line in complete.decode("utf-8").splitlines() if line.strip()]


def shard_folder(run_name: str, key: str) -> Path:
    """A shard's folder on the node that measures it: one per run and shard, so a retry on the
    same node clears what a killed attempt left."""
    import hashlib
    import tempfile
    digest = hashlib.sha256(f"{run_name}\n{key}".encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"attn-audit-shard-{digest}"


def measure_shard(collector: Any, key: str, argv: list[str], threads: int, cwd: str,
                  run_name: str) -> dict[str, Any]:
    """Ray task: `audit run ARGV` in a fresh folder seeded with the shard's records so far;
    each new record goes to the collector. Returns the shard's run.json, plan.json and attempt."""
    import platform
    import shutil
    import subprocess
    import time

    import ray

    from ..core.records import dumps
    from ..measure.machine.memory import die_with_parent, libc

    libc()      # looked up before forking: die_with_parent runs in the child
    host = platform.node()
    seeded, attempt = ray.get(collector.begin.remote(key, os.getpid(), host))
    folder = shard_folder(run_name, key)
    shutil.rmtree(folder, ignore_errors=True)     # a killed attempt's (its processes died with it)
    folder.mkdir(parents=True)
    try:
        (folder / RECORDS_FILE).write_text("".join(dumps(r) + "\n" for r in seeded), encoding="utf-8")
        tail = _Tail(folder / RECORDS_FILE)
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, OMP_NUM_THREADS=str(threads),
                   PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
        with open(folder / SHARD_LOG_FILE, "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "audit", *argv, "--out", str(folder)], stdout=log,
                                    stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent,
                                    cwd=cwd if os.path.isdir(cwd) else None)
            while proc.poll() is None:
                time.sleep(POLL_S)
                new = tail.read()
                if new:
                    collector.add.remote(key, new)
        ray.get(collector.add.remote(key, tail.read()))     # every record delivered before returning
        if proc.returncode != 0:
            lines = (folder / SHARD_LOG_FILE).read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            raise RuntimeError(f"shard {key} on {host}: `audit run` exited with {proc.returncode}:\n"
                               + "\n".join(lines))

        def read(name: str) -> Any:
            return json.loads((folder / name).read_text()) if (folder / name).exists() else None
        return {"run": read(RUN_FILE), "plan": read(PLAN_FILE), "attempt": attempt,
                "resumed": len(seeded), "host": host, "pid": os.getpid()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Job:
    """One shard: its key ('cuda 3/8'), device kind, shard number, cells and Ray resources."""

    key: str
    device: str
    index: int
    count: int
    cells: list[Case]
    resources: dict[str, float] = field(default_factory=dict)
    threads: int = 1


def cluster_shape(ray: Any) -> tuple[int, int, int]:
    """(GPUs in the cluster, CPUs of its largest nodes, how many nodes have that many)."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    node_cpus = int(max((n.get("CPU", 0) for n in nodes), default=0))
    return (int(ray.cluster_resources().get("GPU", 0)), node_cpus,
            sum(1 for n in nodes if int(n.get("CPU", 0)) == node_cpus))


def plan_jobs(cases: Sequence[Case], preset: Preset, axis_overrides: dict[str, Any], shards: int | None,
              shape: tuple[int, int, int]) -> list[Job]:
    """The shards per device kind: --shards N each, else one per GPU (CUDA cells) or per largest
    node (CPU cells), at most one per input set. Empty shards get no job."""
    from ..plan.shard import assign, cell_costs
    from ..workload import presets, variants

    gpus, node_cpus, cpu_nodes = shape
    jobs = []
    for device in dict.fromkeys(c.device for c in cases):
        mine = [c for c in cases if c.device == device]
        # a task rebuilds its grid as `--device D`: it must be exactly these cells
        rebuilt = presets.preset_cases(preset, {**axis_overrides, "device": (device,)},
                                       known_variant=variants.check_name)
        if [c.id for c in rebuilt] != [c.id for c in mine]:
            raise UsageError(f"--executor ray: this grid's {device} cells are not the grid of --device {device}; "
                             "run one --device at a time")
        if device == "cuda" and gpus < 1:
            raise UsageError("--executor ray: the grid has cuda cells but the Ray cluster has no GPU")
        if device == "cpu" and node_cpus < 1:
            raise UsageError("--executor ray: the grid has cpu cells but the Ray cluster has no CPU")
        default = gpus if device == "cuda" else cpu_nodes
        count = shards or max(1, min(default, len({c.input_key for c in mine})))
        resources = {"num_gpus": 1, "num_cpus": 1} if device == "cuda" else {"num_cpus": node_cpus}
        for index, cells in enumerate(assign(mine, count, cell_costs(mine, preset))):
            if cells:
                jobs.append(Job(f"{device} {index}/{count}", device, index, count, cells, resources,
                                threads=int(resources["num_cpus"])))
    return jobs


def task_argv(args: Any, actions: Sequence[Any], preset_name: str, job: Job) -> list[str]:
    """The `audit run` command line of a job: the driver's measuring options, its device and shard."""
    argv = ["run", "--preset", preset_name, "--device", job.device, "--shard", f"{job.index}/{job.count}",
            "--no-report", "--no-progress"]
    options = {a.dest: getattr(args, a.dest, None) for a in actions
               if a.option_strings and a.dest not in DRIVER_ONLY}
    return argv + to_argv(options, actions)


@dataclass
class Outcome:
    shards: list[dict[str, Any]]            # per job: key, device, shard, cells, attempts, host, run.json
    failures: list[str]                     # one message per job that failed after Ray's retries


def run(cases: Sequence[Case], preset: Preset, axis_overrides: dict[str, Any], run_dir: Path, *,
        address: str | None, shards: int | None, args: Any, actions: Sequence[Any],
        progress: bool = True) -> Outcome:
    """Measure `cases` on Ray into run_dir/records.jsonl (resuming what it holds). Raises
    KeyboardInterrupt after saving what arrived, when interrupted."""
    import logging

    import ray

    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, ValueError) as exc:
            raise UsageError(f"--ray-address: cannot connect to {address!r}: {exc}") from None
    try:
        return _run(ray, cases, preset, axis_overrides, run_dir, shards=shards, args=args, actions=actions,
                    progress=progress)
    finally:
        if started_here:
            ray.shutdown()


def _run(ray: Any, cases: Sequence[Case], preset: Preset, axis_overrides: dict[str, Any], run_dir: Path, *,
         shards: int | None, args: Any, actions: Sequence[Any], progress: bool) -> Outcome:
    from ..core.records import RecordWriter, read_records

    jobs = plan_jobs(cases, preset, axis_overrides, shards, cluster_shape(ray))
    done = {r["id"]: r for r in read_records(run_dir)}
    seeded = {j.key: [done[c.id] for c in j.cells if c.id in done] for j in jobs}
    collector = ray.remote(num_cpus=0)(Collector).options(name=collector_name(run_dir)).remote(seeded)
    task = ray.remote(measure_shard)
    refs = {}
    for job in jobs:
        if len(seeded[job.key]) < len(job.cells):
            argv = task_argv(args, actions, preset.name, job)
            ref = task.options(**job.resources, max_retries=TASK_RETRIES, name=f"attn-audit {job.key}").remote(
                collector, job.key, argv, job.threads, os.getcwd(), collector_name(run_dir))
            refs[ref] = job
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(cases), initial=sum(c.id in done for c in cases), unit="cell", dynamic_ncols=True,
                   smoothing=0.05, mininterval=0.5)
    results: dict[str, dict] = {}
    failures: list[str] = []
    pending = list(refs)
    try:
        with RecordWriter(run_dir) as writer:
            def drain() -> None:
                for rec in ray.get(collector.take.remote()):
                    writer.write(rec)
                    if bar is not None:
                        bar.update(1)
            try:
                while pending:
                    ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
                    for ref in ready:
                        try:
                            results[refs[ref].key] = ray.get(ref)
                        except Exception as exc:  # noqa: BLE001 - a task failed after Ray's retries
                            failures.append(f"{refs[ref].key}: {exc}")
                    drain()
                    if bar is not None:
                        bar.set_postfix_str(f"shards: {len(pending)} running or queued, {len(results)} done")
            except KeyboardInterrupt:
                for ref in pending:
                    ray.cancel(ref, force=True)
                drain()
                raise
            drain()
        status = ray.get(collector.status.remote())
    finally:
        if bar is not None:
            bar.close()
        ray.kill(collector)
    shards_out = []
    for job in jobs:
        got = results.get(job.key) or {}
        shards_out.append({"key": job.key, "device": job.device, "shard": f"{job.index}/{job.count}",
                           "cells": len(job.cells), "attempts": (status.get(job.key) or {}).get("attempts", 0),
                           "resumed": got.get("resumed"), "host": got.get("host"), "run": got.get("run"),
                           "plan": got.get("plan")})
        run_info = got.get("run")
        if run_info and (run_info.get("shard") or {}).get("cells") != [c.id for c in job.cells]:
            failures.append(f"{job.key}: the task's shard has other cells than the driver assigned "
                            "(another code version on that node?)")
    return Outcome(shards_out, failures)


def measure(run_dir: Path, cases: Sequence[Case], preset: Preset, axis_overrides: dict[str, Any],
            axes: dict[str, tuple], argv: list[str], extra: dict[str, Any], args: Any,
            actions: Sequence[Any]) -> int:
    """`audit run --executor ray` inside the run folder's lock: run.json, the Ray run, run.json
    completed with the shards. 0, or 1 when a shard failed (its cells are missing: a rerun
    measures them)."""
    from ..measure.machine.environment import environment
    from .runner import write_run_file

    path = Path(run_dir) / RUN_FILE
    previous = json.loads(path.read_text()) if path.exists() else None
    write_run_file(run_dir, preset, axes, argv, environment(), len(cases), None, extra)
    print(f"attn-audit: {len(cases)} cells ({preset.name} preset) -> {run_dir}, on Ray", file=sys.stderr)
    outcome = run(cases, preset, axis_overrides, run_dir, address=args.ray_address, shards=args.shards,
                  args=args, actions=actions, progress=not args.no_progress)
    info = finish_run_file(run_dir, outcome, previous)
    for line in info.get("shard_differences") or []:
        print(f"attn-audit: warning: shards ran on different software: {line}", file=sys.stderr)
    for line in outcome.failures:
        print(f"attn-audit: {line}", file=sys.stderr)
    return 1 if outcome.failures else 0


def finish_run_file(run_dir: Path, outcome: Outcome, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """run.json after a Ray run: the measuring machines' environment and ceilings (the first
    shard's; each shard's under `shards`), and where each shard ran and how often it started."""

    from .merge import combined_plan, differences

    path = Path(run_dir) / RUN_FILE
    info = json.loads(path.read_text())
    before = {s["key"]: s for s in (previous or {}).get("shards") or []}
    for s in outcome.shards:        # a shard all of whose cells were recorded before did not run now
        if s["run"] is None and s["key"] in before:
            s.update(before[s["key"]], run=None, plan=None)
    ran = [s for s in outcome.shards if s["run"]]
    if ran:
        info["env"] = ran[0]["run"].get("env")
        ceilings: dict[str, Any] = {}
        for s in ran:
            for device, c in (s["run"].get("ceilings") or {}).items():
                ceilings.setdefault(device, c)
        info["ceilings"] = ceilings
        info["shard_differences"] = differences([s["run"] for s in ran], [s["key"] for s in ran],
                                                fields=("code_version", "env.torch"))
    elif previous:                  # nothing ran now: what measured the records is the earlier run's
        info.update(env=previous.get("env"), ceilings=previous.get("ceilings"))
    info["shards"] = [{"key": s["key"], "cells": s["cells"], "attempts": s["attempts"], "resumed": s["resumed"],
                       "host": s["host"],
                       "device_name": s.get("device_name") or ((s["run"] or {}).get("env") or {}).get("device_name"),
                       "ceilings": s.get("ceilings") or (s["run"] or {}).get("ceilings")} for s in outcome.shards]
    path.write_text(json.dumps(info, indent=2, default=str) + "\n")
    plan = combined_plan([s["plan"] for s in ran])
    if plan is not None:
        (Path(run_dir) / PLAN_FILE).write_text(json.dumps(plan, indent=1) + "\n")
    return info
