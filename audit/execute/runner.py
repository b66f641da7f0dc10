"""Run one cell -> record; run a grid with progress, resume and failure isolation.

Cells are ordered so those sharing inputs are adjacent (grid.expand): inputs and
the float64 reference are built once per input set and reused by its variants
(cellcache.InputCache). measurement.measure_cell measures a cell; this module turns that,
or its failure, into the cell's record, walks the grid and keeps the run folder's files.
"""
from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from ..core import records
from ..core.columns import COLUMNS
from ..core.errors import Unsupported
from ..core.grid import Case
from ..core.timesplit import PhaseClock
from ..core.runfolder import FAILURES_DIR, INFLIGHT_FILE, RUN_FILE, WORKERS_FILE, failure_file_name
from ..measure.machine import compile_cache
from ..measure.cell.cellcache import BuildCache, InputCache
from ..measure.cell.failures import failure_reason, failure_text
from ..measure.cell.measurement import LEAK_REPORT_BYTES, CellSkipped, measure_cell
from ..measure.cell.repeats import deterministic_algorithms, refuses_determinism
from ..measure.machine.memory import pin_malloc_threshold
from ..workload.inputs import cell_needs
from ..workload.presets import Preset
from ..workload.variants import builtin_variants, resolve


class CellTooBig(Exception):
    """A cell predicted to need more memory than is free: recorded as `oom` without running."""


class WorkerRestart(Exception):
    """The measuring process should be replaced before the next cell (a cell leaked memory)."""


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def _is_oom(exc: BaseException) -> bool:
    """An allocation failure on any device: CUDA's OutOfMemoryError, the CPU allocator's
    "can't allocate memory", Python's MemoryError."""
    import torch
    if isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MESSAGES)


def run_cell(case: Case, cache: InputCache, preset: Preset, env: dict[str, Any], *,
             ceilings: dict | None = None, meter: Any = None,
             builds: BuildCache | None = None) -> dict[str, Any]:
    """One record for one cell; every failure becomes a status with a reason."""
    rec = records.new_record(case.axes(), case.id)
    rec["started_at"] = _utc_now()
    rec["env"] = env
    start = time.perf_counter()
    phases = PhaseClock()
    oom = refused = False
    variant = None
    try:
        with phases("setup"):
            variant = resolve(case.variant)
            refusal = variant.refusal(cell_needs(case))
            if refusal is not None:
                raise Unsupported(refusal)
            _check_memory(case)
        with phases("golden"):
            calls, reads = cache.golden_calls, cache.golden_reads
            inputs, ref = cache.get(case, variant.causal_alignment)
            if cache.golden_calls > calls:
                rec["golden_source"] = "read" if cache.golden_reads > reads else "built"
        with deterministic_algorithms(preset.deterministic):
            rec.update(measure_cell(case, variant, inputs, ref, preset, ceilings=(ceilings or {}).get(case.device),
                                    meter=meter, builds=builds, phases=phases))
        rec["status"] = "ok"
    except (Unsupported, CellSkipped) as exc:
        rec["status"], rec["reason"] = "skipped", str(exc)
    except CellTooBig as exc:
        rec["status"], rec["reason"] = "oom", str(exc)
    except KeyboardInterrupt:
        raise
    except NotImplementedError as exc:
        if variant is not None and variant.family == "plugin":   # a plug-in (or hf:) declining a cell it does not take
            rec["status"], rec["reason"] = "skipped", declined(exc)
        else:
            rec["status"], rec["reason"] = "error", failure_reason(exc)
            rec[FAILURE_TEXT] = failure_text(exc)
    except BaseException as exc:  # noqa: BLE001 - one cell's failure must not stop the run
        oom = _is_oom(exc)
        if preset.deterministic and refuses_determinism(exc):
            rec["status"], rec["reason"] = ("skipped", "refuses torch.use_deterministic_algorithms(True) "
                                            f"(--deterministic): {failure_reason(exc)}")
            refused = True
        else:
            rec["status"], rec["reason"] = ("oom" if oom else "error"), failure_reason(exc)
        rec[FAILURE_TEXT] = failure_text(exc)          # run_grid writes it to DIR/failures/, one file a cell
    if oom:
        # Outside the except block: the traceback (and the tensors its frames hold) is gone.
        cache.clear()
        _release_device_memory(case.device)
    rec["elapsed_s"] = time.perf_counter() - start
    if rec["status"] != "ok":
        # A failed cell carries no measurements, not partial ones (where its time went, and how it got its
        # golden, are not ones).
        for col in COLUMNS:
            if col not in case.axes() and col not in ("schema", "id", "status", "reason", "env",
                                                       "started_at", "elapsed_s", "golden_source", "failure_file"):
                rec[col] = None
    rec["phase_s"] = phases.record()
    rec["deterministic_refused"] = True if refused else (False if preset.deterministic else None)
    return rec


FAILURE_TEXT = "_failure_text"      # a failed cell's whole failure, until run_grid writes it out


def write_failure(run_dir: Path, rec: dict[str, Any], after: list[str]) -> None:
    """A failed cell's whole failure (failures.failure_text: the exception chain, stacks and the
    compiler's output) in DIR/failures/<id>.txt, its path in the record (failure_file); and in
    failed_after the cells of the same variant this measuring process ran before it, in order
    (a compile failure that only a recompile shows: its reproduction replays them)."""
    text = rec.pop(FAILURE_TEXT, None)
    if text is None:
        return
    name = failure_file_name(rec["id"])
    folder = Path(run_dir) / FAILURES_DIR
    try:
        folder.mkdir(exist_ok=True)
        (folder / name).write_text(f"{rec['id']}: {rec.get('status')}: {rec.get('reason')}\n\n{text}", encoding="utf-8")
        rec["failure_file"] = f"{FAILURES_DIR}/{name}"
    except OSError:
        pass
    rec["failed_after"] = list(after) or None


def declined(exc: NotImplementedError) -> str:
    """A skipped cell's reason when a plug-in raised NotImplementedError: its message."""
    return f"the plug-in declined this cell (NotImplementedError): {str(exc).strip() or 'no message'}"


def _check_memory(case: Case) -> None:
    """Raise CellTooBig when the cell's predicted peak exceeds the memory free on its device
    (free memory is read only for the variants whose memory is predicted)."""
    from ..plan.memory_model import free_bytes, predicted_peak_bytes, too_big
    from ..workload.inputs import q_len
    if predicted_peak_bytes(case, q_len(case)) is None:
        return
    if case.device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()
    reason = too_big(case, q_len(case), free_bytes(case.device))
    if reason is not None:
        raise CellTooBig(reason)


def read_inflight(run_dir: Path) -> str | None:
    """Id of the cell the measuring process was in when it last stopped, if any."""
    found = inflight_since(run_dir)
    return found[0] if found else None


def inflight_since(run_dir: Path) -> tuple[str, float] | None:
    """(id, start time in seconds since the epoch) of the cell being measured, if any."""
    path = Path(run_dir) / INFLIGHT_FILE
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text:
        return None
    case_id, _, started = text.partition("\t")
    try:
        return case_id, float(started) if started else path.stat().st_mtime
    except (ValueError, OSError):
        return case_id, time.time()


def mark_inflight(run_dir: Path, case_id: str | None) -> None:
    """Mark a cell (or a model audit step, measure.model_audit.step_id) as being measured now; None: none."""
    path = Path(run_dir) / INFLIGHT_FILE
    if case_id is None:
        path.unlink(missing_ok=True)
        return
    with open(path, "w") as fh:           # read by the supervisor on this machine: no fsync needed
        fh.write(f"{case_id}\t{time.time():.3f}")


def record_crash(run_dir: Path, case: Case, reason: str, status: str = "error") -> None:
    """The record of a cell whose process died or was killed (no measurements): `error`, or
    `timeout` when the supervisor killed it for running past its time limit."""
    rec = records.new_record(case.axes(), case.id)
    rec.update(status=status, reason=reason, started_at=_utc_now())
    with records.RecordWriter(run_dir) as writer:
        writer.write(rec)
    mark_inflight(run_dir, None)


def _release_device_memory(device: str) -> None:
    """After an out-of-memory, hand cached blocks back so the next cell starts clean."""
    import gc
    gc.collect()
    if device.startswith("cuda"):
        import torch
        torch.cuda.empty_cache()


def write_run_file(run_dir: Path, preset: Preset, axes: dict[str, tuple], argv: list[str],
                   env: dict[str, Any], n_cells: int, ceilings: dict | None = None,
                   extra: dict[str, Any] | None = None) -> None:
    """DIR/run.json; `extra`: more top-level fields (grid, shard, executor)."""
    from ..core.version import code_version
    info = {"schema": records.SCHEMA_VERSION, "code_version": code_version(), "preset": preset.name,
            "axes": {k: list(v) for k, v in axes.items()}, "argv": argv,
            # where plug-ins were imported from (cwd and PYTHONPATH): reproduction scripts import them so
            "cwd": os.getcwd(), "pythonpath": os.environ.get("PYTHONPATH", ""),
            "started_at": _utc_now(), "env": env, "n_cells": n_cells, "ceilings": ceilings,
            # Inductor's cache the compiled variants use (a later plan predicts their compiles from it)
            **_compile_cache_info(axes.get("variant", ())),
            "timing": {"min_samples": preset.min_samples, "min_time_s": preset.min_time_s,
                       "max_cell_s": preset.max_cell_s, "energy_window_s": preset.energy_window_s,
                       "ceilings_s": preset.ceilings_s, "deterministic": preset.deterministic,
                       "budget_s": preset.budget_s, "noise_target": preset.noise_target or None,
                       "noise_cap_s": preset.noise_cap_s}, **(extra or {})}
    (run_dir / RUN_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")


def _compile_cache_info(variants: Iterable[str]) -> dict[str, str | None]:
    """run.json's compile_cache_dir and compile_cache_id, and whether Inductor's precompiled headers were
    built before the run compiled (compile_headers: the first compile builds them where not), for a grid
    with compiled variants."""
    if not any(getattr(builtin_variants().get(v), "compiled", False) for v in variants):
        return {"compile_cache_dir": None, "compile_cache_id": None, "compile_headers": None}
    folder = compile_cache.cache_dir()
    return {"compile_cache_dir": folder, "compile_cache_id": compile_cache.identity(folder, create=True),
            "compile_headers": "built" if compile_cache.headers_built() else "absent"}


def run_grid(cases: Iterable[Case], run_dir: Path, preset: Preset, env: dict[str, Any], *,
             progress: bool = True, ceilings: dict | None = None,
             on_record: Callable[[dict[str, Any]], None] | None = None,
             plan: Any = None, on_start: Callable[[], None] | None = None) -> dict[str, int]:
    """Measure every cell not already in DIR/records.jsonl; append each record at once.

    ceilings: {device: measure_ceilings(...)} for the roofline columns (None: nulls);
    plan: a budget.Plan (predictions, cells to skip, deadline), kept by a keeper.Keeper;
    on_start: called once set up, before the first cell (a worker's start-up ends there).
    Returns counts per status of the cells measured in this call (plus "resumed").
    """
    from ..plan.keeper import Keeper
    cases = list(cases)
    env = dict(env, cpu_allocator=pin_malloc_threshold())
    meter = _energy_meter(cases)
    done = records.completed_ids(run_dir)
    todo = [c for c in cases if c.id not in done]
    if plan is not None:                    # the plan's order: its coverage cells first (tiers.run_order)
        from ..plan.tiers import run_order
        by_id = {c.id: c for c in todo}
        todo = [by_id[i] for i in run_order(list(by_id), plan.tier, plan.level)]
    counts = {"resumed": len(cases) - len(todo)}
    cache = InputCache()
    builds = BuildCache()
    variant_cells: dict[str, list[str]] = {}       # per variant, the cells this process measured (in order)
    keeper = Keeper(plan, [c.id for c in todo])
    canary = CanaryTimes(run_dir, cases, on=bool(preset.noise_target))
    bar = None
    if progress:
        from .progress import Progress
        bar = Progress([c.id for c in todo], len(cases) - len(todo), keeper, plan)
    if on_start is not None:
        on_start()
    try:
        with records.RecordWriter(run_dir) as writer:
            def measure(case: Case) -> None:
                """Measure one cell and write its record at once (durable)."""
                if bar is not None:
                    bar.start_cell(case.id)
                mark_inflight(run_dir, case.id)
                rec = run_cell(case, cache, preset, env, ceilings=ceilings, meter=meter, builds=builds)
                keeper.done(case.id, rec["elapsed_s"])
                write_failure(run_dir, rec, after=variant_cells.get(case.variant, []))
                if rec["status"] in ("ok", "error"):
                    variant_cells.setdefault(case.variant, []).append(case.id)
                finish(case, rec, durable=True)
                canary.after_cell(keeper.progress())
                leaked = rec.get("leaked_bytes") or 0
                if leaked > LEAK_REPORT_BYTES:
                    raise WorkerRestart(f"{case.id} kept {leaked / 2**20:.0f} MiB across its calls: the rest "
                                        "of the run goes on in a fresh process")

            def finish(case: Case, rec: dict[str, Any], durable: bool) -> None:
                rec["predicted_s"] = keeper.predicted.get(case.id)
                writer.write(rec, durable=durable)        # a lost skip is planned again by a rerun
                mark_inflight(run_dir, None)
                counts[rec["status"]] = counts.get(rec["status"], 0) + 1
                if on_record:
                    on_record(rec)
                if bar is not None:
                    bar.end_cell(case.id)

            # The cells skipped for time are recorded last: the time the measured ones leave may buy
            # them after all (keeper.Keeper.admit), tier 0's first, then the cheapest.
            deferred: list[Case] = []
            for case in todo:
                if keeper.reason(case.id) is None:
                    measure(case)
                else:
                    deferred.append(case)
            by_id = {c.id: c for c in deferred}
            for cell_id in keeper.reclaim_order(list(by_id)):
                if keeper.admit(cell_id):
                    measure(by_id[cell_id])
            for case in deferred:
                if case.id in keeper.skip:
                    rec = records.new_record(case.axes(), case.id)
                    rec.update(status="skipped", reason=keeper.skip[case.id], started_at=_utc_now(), env=env,
                               elapsed_s=0.0)
                    finish(case, rec, durable=False)
        canary.at_end()
    finally:
        if bar is not None:
            bar.close()
        if meter is not None:
            meter.close()
    line = keeper.reclaimed_line()
    if line and progress:
        print(f"attn-audit: {line}", file=sys.stderr)
    return counts


def write_worker_timing(run_dir: Path, segments: dict[str, float] | None = None, *, started: bool = True) -> None:
    """Append a line about this measuring process to DIR/workers.jsonl, at once (a worker that
    later crashes has said it already). started: at its first cell, its start-up (from its
    process start to now, less the `segments` it spent preparing the run: core.timesplit parts
    such as ceilings and plan); else only `segments` (the seed claims, at its end)."""
    from ..core.timesplit import process_start_unix
    now = time.time()
    line: dict[str, Any] = {"pid": os.getpid(), "ready_unix": now, "segments": dict(segments or {})}
    if started:
        began = process_start_unix()
        age = 0.0 if began is None else max(0.0, now - began)
        line.update(started_unix=now - age, start_s=max(0.0, age - sum(line["segments"].values())))
    with open(Path(run_dir) / WORKERS_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def read_worker_timing(run_dir: Path, since_unix: float) -> list[dict[str, float]]:
    """The measuring processes DIR/workers.jsonl lists as started at or after since_unix."""
    from ..core.runfolder import read_jsonl
    return [item for item in read_jsonl(Path(run_dir) / WORKERS_FILE)
            if float(item.get("ready_unix") or 0.0) >= since_unix]


class CanaryTimes:
    """When a worker times the run's canary (measure/machine/canary.py): a reading as this process's
    measuring passes each quarter of its planned work (25%, middle, 75%: Keeper.progress, by the cells'
    predicted seconds; quarters of every record all fell at a run's end, its cells skipped for time
    being recorded last), its end reading after the last cell (the start's is the first process's,
    before the plan). Each label once per run folder, whichever worker gets there; none with
    --noise-target 0 (nothing judged).

    A reading says how fast the machine was while the cells since the one before it were measured, so
    none is taken without a cell since the last: a cell passing several quarters gets one reading (the
    last quarter's label), and the end's is left out when no cell followed the last quarter's. A
    one-cell run took five readings, four of them back to back after its cell (1 s of a 3.8 s run on a
    2-core Xeon); it takes two (measure/machine/canary.readings_for)."""

    def __init__(self, run_dir: Path, cases: list[Case], on: bool = True) -> None:
        from ..measure.machine.canary import QUARTERS, canary_device
        self.run_dir, self.on = run_dir, on
        self.due = [(quarter / 4, label) for quarter, label in enumerate(QUARTERS, start=1)]   # (share, label)
        self.device = canary_device(c.device for c in cases)
        self.cells_since = 0            # cells this process measured since its last reading

    def after_cell(self, progress: float) -> None:
        """After a measured cell, `progress` (0-1) of the planned work done."""
        self.cells_since += 1
        passed = []
        while self.on and self.due and progress >= self.due[0][0]:
            passed.append(self.due.pop(0)[1])
        if passed:
            self._reading(passed[-1])

    def at_end(self) -> None:
        if self.on and self.cells_since:
            self._reading("end")

    def _reading(self, label: str) -> None:
        from ..measure.machine.canary import record_canary
        record_canary(self.run_dir, label, self.device)
        self.cells_since = 0


def _energy_meter(cases: list[Case]) -> Any:
    """One NVML meter for the run's CUDA device (None without CUDA cells)."""
    if not any(c.device == "cuda" for c in cases):
        return None
    from ..measure.machine.energy import EnergyMeter
    import torch
    return EnergyMeter(device_index=torch.cuda.current_device())


def ceilings_for(cases: Iterable[Case], run_dir: Path, budget_s: float) -> tuple[dict[str, dict], bool]:
    """The machine's measured limits per device, once per run folder (reused on resume), each
    measured in about budget_s seconds (the preset's ceilings_s), and whether any were measured now.
    A CUDA device's also carry the energy counter's check on a steady load (energy.run_counter_check,
    about 1.6 s more: plan/overhead.py counts it)."""
    from ..measure.machine.roofline import measure_ceilings
    path = Path(run_dir) / RUN_FILE
    known = (json.loads(path.read_text()).get("ceilings") or {}) if path.exists() else {}
    out, measured = {}, False
    for device in dict.fromkeys(c.device for c in cases):
        dtypes = tuple(dict.fromkeys(c.dtype for c in cases if c.device == device))
        have = known.get(device)
        if have and all(d in (have.get("matmul_flops_per_s") or {}) for d in dtypes):
            out[device] = have
        else:
            out[device], measured = measure_ceilings(device, dtypes, budget_s=budget_s), True
            if device.startswith("cuda"):   # right after the matmuls, the GPU busy: the counter's check
                from ..measure.machine.energy import run_counter_check
                out[device]["energy_counter_check"] = run_counter_check(device)
    return out, measured
