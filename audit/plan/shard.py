"""Split a grid into N shards that separate machines (a Slurm array, Ray tasks) measure.

A shard is `I/N`, I counted from 0 (as Slurm's `--array=0-3` numbers its tasks). Cells
sharing an input set (Case.input_key) stay in one shard, so its inputs and float64 golden
are computed once. Shards are balanced by predicted cost: whole input sets, most expensive
first, each to the shard with the least predicted work so far (longest processing time
first; ties go to the lower shard number).

The assignment must be the same on every machine that computes it (each Slurm task
computes it for itself), so the cost it balances is not this machine's: it is the cost
model's prediction with the shipped priors only (no refit on local run folders) on the
priors' reference machine (its ceilings and free memory), in whole microseconds (integer
sums, no float rounding that could differ between machines). The priors ship with the
code, so the same code version and grid give the same shards everywhere. Machines of
another speed change every shard's time by about the same factor, which keeps the
balance.
"""
from __future__ import annotations

import hashlib
import heapq
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..core.errors import UsageError
from ..core.grid import Case
from ..workload.presets import Preset

_SPEC = re.compile(r"(\d+)/(\d+)")


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (index 0 .. count-1)."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """'2/4' -> Shard(2, 4); a usage error names the bad value and the allowed range."""
    match = _SPEC.fullmatch(str(text).strip())
    if not match:
        raise UsageError(f"--shard: {text!r} is not I/N (e.g. 0/4, or "
                         "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1:
        raise UsageError(f"--shard: {text!r} has N = 0; N is the number of shards, at least 1")
    if index >= count:
        raise UsageError(f"--shard: {text!r}: I counts from 0, so it must be in 0..{count - 1} "
                         f"(a Slurm array for {count} shards is --array=0-{count - 1})")
    return Shard(index, count)


def cell_costs(cases: Sequence[Case], preset: Preset, settings: Any = None) -> dict[str, int]:
    """{id: predicted microseconds} on the priors' reference machine, the same on every machine.

    A cell's cost leaves out what a run pays once whatever cells it holds (start-up, a
    backend's first use): every shard pays those. Its input set's golden and compiled code
    stay in (they go with the set). settings: settings.Settings to predict with (default: the
    preset's, today's checks)."""
    from .costmodel import CostModel
    from .priors import load_priors
    from .settings import Settings

    params = load_priors()
    ceilings = {dev: ref.get("ceilings") for dev, ref in params.reference.items()}
    free = {dev: ref.get("free_bytes") for dev, ref in params.reference.items()}
    pred = CostModel(params).predict(list(cases), settings or Settings.of_preset(preset), ceilings, free)
    once = pred["shared_s"] - pred["golden"] - pred["compile"]
    seconds = (pred["total_s"] - once).clip(lower=0.0)
    return {cell: int(round(s * 1e6)) for cell, s in zip(pred["id"], seconds)}


def assign(cases: Sequence[Case], count: int, costs: dict[str, int]) -> list[list[Case]]:
    """The cells of each of `count` shards, each in the grid's order. Whole input sets, largest
    first, each to the shard with the least cost so far (ties: the lower shard number)."""
    sets: dict[tuple, list[int]] = {}
    for position, case in enumerate(cases):
        sets.setdefault(case.input_key, []).append(position)
    order = sorted(sets.values(), key=lambda members: (-sum(costs[cases[i].id] for i in members), members[0]))
    loads = [(0, shard) for shard in range(count)]
    owner = [0] * len(cases)
    for members in order:
        load, shard = heapq.heappop(loads)
        for i in members:
            owner[i] = shard
        heapq.heappush(loads, (load + sum(costs[cases[i].id] for i in members), shard))
    return [[c for c, o in zip(cases, owner) if o == shard] for shard in range(count)]


def shard_cases(cases: Sequence[Case], preset: Preset, shard: Shard) -> list[Case]:
    """The cells of one shard of the grid `cases`."""
    if shard.count == 1:
        return list(cases)
    return assign(cases, shard.count, cell_costs(cases, preset))[shard.index]


def grid_hash(cases: Sequence[Case]) -> str:
    """A short fingerprint of a grid's cells (their ids in order): equal grids, equal hashes."""
    return hashlib.sha256("\n".join(c.id for c in cases).encode()).hexdigest()[:16]


def grid_info(cases: Sequence[Case], preset: Preset) -> dict[str, Any]:
    """run.json's `grid`: the whole grid a run (or shard) belongs to."""
    return {"preset": preset.name, "cells": len(cases), "hash": grid_hash(cases)}


def shard_info(shard: Shard, cells: Sequence[Case]) -> dict[str, Any]:
    """run.json's `shard`: which shard this folder is, the machine that measured it, and its
    cells (merge lists those without a record)."""
    import platform
    return {"index": shard.index, "count": shard.count, "host": platform.node(), "cells": [c.id for c in cells]}
