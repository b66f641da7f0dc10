"""Where a run's wall time went: the phases of a cell, the parts of a run, and their split.

A cell's `elapsed_s` is split into phases (CELL_PHASES, the record's `phase_s`), timed by a
PhaseClock as the cell goes through them. A run's wall time, from its process's start to the
end of its report, is split into parts (RUN_PARTS): the cells' phases summed, and what lies
outside the cells (start-up, ceilings, planning, the measuring processes' own start, the
bookkeeping between cells, the report). run.json's `time_split` holds the split of the run's
latest invocation; the report's Time budget section shows it. Pure Python: the measuring code
times with it, the report reads what it wrote.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

# The phases of one cell, in the order a cell goes through them (measure.cell.measurement.measure_cell).
CELL_PHASES: dict[str, str] = {
    "setup": "resolving and building the variant, the memory check",
    "golden": "drawing the input set, its float64 golden and same-dtype baseline (once per input set)",
    "compile": "compiling: the first calls' time beyond a steady call (compiled variants)",
    "warmup": "the warm-up calls (one forward, one forward+backward), less compiling",
    "numerics": "the memory and numerics calls and comparing them with the golden",
    "leak": "the leak probes: forward calls with the hidden keys and values changed (other documents, unread pages)",
    "invariance": "batch and chunk invariance: a batch row alone, the queries in two chunks",
    "determinism": "keeping and comparing the repeated outputs and gradients bit for bit",
    "diagnosis": "matching a defective output against the library of known mistakes",
    "saturation": "the variant's own attention weights against the float64 probabilities",
    "referee": "the referee's checks: inputs compared, outputs read again, the calls with new values or new tensors",
    "timed": "the timed calls",
    "energy": "the NVML energy window (CUDA)",
}

# The parts of a run's wall time: name -> (group, what it is). The groups are what the report
# and run.json sum: what measuring costs, and the audit's own overhead.
RUN_PARTS: dict[str, tuple[str, str]] = {
    "start-up": ("process start-up", "starting Python and the command line; the environment and run.json"),
    "worker start-up": ("process start-up", "each measuring process: starting Python, importing torch, "
                                            "until its first cell"),
    "ceilings": ("planning", "measuring this machine's matmul and copy ceilings"),
    "plan": ("planning", "the cost model's prediction and the budget's plan"),
    **{f"cell {phase}": ({"timed": "measuring", "energy": "measuring", "warmup": "measuring",
                          "compile": "compiling", "golden": "golden",
                          "numerics": "checks", "leak": "checks", "determinism": "checks",
                          "diagnosis": "checks", "saturation": "checks"}.get(phase, "bookkeeping"), text)
       for phase, text in CELL_PHASES.items()},
    "cell other": ("bookkeeping", "the rest of the cells' time: building records, skipped cells"),
    "between cells": ("bookkeeping", "writing records, keeping to the budget, the progress bar, "
                                     "a measuring process's exit"),
    "seed claims": ("report", "measuring the seed tutorial's printed claims again"),
    "merge audit": ("report", "the merge functions audited on partial states (numerics.md: Merging partial "
                              "attention)"),
    "model audit": ("report", "the model audit: small decoders with each variant as their attention (model.md)"),
    "shrink": ("report", "shrinking the findings about code the audit did not write to their smallest failing "
                         "cells and minimal scripts (numerics.md: Smallest failing cell)"),
    "report": ("report", "findings, reproduction scripts, figures and the report page"),
    "other": ("bookkeeping", "what no part above accounts for"),
}
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(group for group, _ in RUN_PARTS.values()))
MEASURED_PARTS = ("cell timed", "cell compile")    # the time inside timed calls and compiles


class PhaseClock:
    """Seconds per named phase: `with clock("golden"): ...`; phases may be entered many times."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if phase not in CELL_PHASES:
            raise ValueError(f"unknown cell phase {phase!r}; known: {', '.join(CELL_PHASES)}")
        start = self.clock()
        try:
            yield
        finally:
            self.add(phase, self.clock() - start)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def move(self, seconds: float, source: str, target: str) -> None:
        """Count `seconds` of `source` as `target` instead (compiling, timed within the warm-up)."""
        seconds = max(0.0, min(seconds, self.seconds.get(source, 0.0)))
        if seconds:
            self.add(source, -seconds)
            self.add(target, seconds)

    def record(self) -> dict[str, float]:
        """The record's phase_s: every phase entered, in CELL_PHASES order."""
        return {p: round(self.seconds[p], 6) for p in CELL_PHASES if p in self.seconds}


def split_wall(wall_s: float, segments: Mapping[str, float], cells: Iterable[Mapping[str, Any]],
               workers: Iterable[Mapping[str, float]]) -> dict[str, Any]:
    """run.json's time_split: the wall time, seconds per part (RUN_PARTS) and per group.

    segments: seconds of the run's own parts ("start-up", "seed claims", "report"), and "cells":
    the time from starting the first measuring process to the end of the last; cells: the
    records measured in it (elapsed_s, phase_s); workers: the lines of workers.jsonl
    (runner.write_worker_timing): a measuring process's start-up (start_s, to its first cell)
    and the parts it spent outside cells ("segments": preparing the run, the seed claims)."""
    parts = {part: 0.0 for part in RUN_PARTS}
    for name in ("start-up", "ceilings", "plan", "seed claims", "merge audit", "model audit", "shrink", "report"):
        parts[name] = float(segments.get(name, 0.0))
    in_cells = 0.0
    for rec in cells:
        elapsed = float(rec.get("elapsed_s") or 0.0)
        in_cells += elapsed
        phases = rec.get("phase_s") or {}
        for phase, seconds in phases.items():
            if f"cell {phase}" in parts:
                parts[f"cell {phase}"] += float(seconds)
        parts["cell other"] += elapsed - sum(float(s) for s in phases.values())
    in_workers = 0.0
    for worker in workers:
        parts["worker start-up"] += float(worker.get("start_s") or 0.0)
        in_workers += float(worker.get("start_s") or 0.0)
        for name, seconds in (worker.get("segments") or {}).items():
            if name in parts:
                parts[name] += float(seconds)
                in_workers += float(seconds)
    parts["between cells"] = float(segments.get("cells", 0.0)) - in_cells - in_workers
    parts["other"] = wall_s - sum(v for k, v in parts.items() if k != "other")
    groups = {g: sum(v for k, v in parts.items() if RUN_PARTS[k][0] == g) for g in GROUPS}
    measured = sum(parts[p] for p in MEASURED_PARTS)
    return {"wall_s": wall_s, "parts_s": {k: round(v, 3) for k, v in parts.items()},
            "groups_s": {k: round(v, 3) for k, v in groups.items()},
            "measured_s": round(measured, 3), "wall_over_measured": round(wall_s / measured, 3) if measured else None}


def largest_overhead(split: Mapping[str, Any]) -> tuple[str, float] | None:
    """(part, seconds) of the largest part that is neither timed calls nor compiling."""
    parts = {k: v for k, v in (split.get("parts_s") or {}).items() if k not in MEASURED_PARTS}
    if not parts:
        return None
    name = max(parts, key=parts.get)
    return name, float(parts[name])


def process_start_unix() -> float | None:
    """When this process started (Linux: /proc, to 10 ms), so a run's wall time includes starting
    Python; None elsewhere."""
    import os
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")     # field 22: starttime, in ticks
        return time.time() - max(0.0, age)
    except (OSError, ValueError, IndexError):
        return None
