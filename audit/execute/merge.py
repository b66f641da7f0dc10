"""Combine the run folders of a grid's shards into one run folder (`audit merge OUT DIR...`).

The merged folder is an ordinary run folder: records.jsonl (every shard's records, in the
order the folders are given), run.json (the first shard's, with the whole grid's cell
count and a `merged` entry naming each shard, its machine and ceilings, and what is
missing), plan.json (the shards' plans side by side) and seed_claims.csv, so `report`
reads it like any other.

Shards are refused when they cannot belong to one run: another grid (preset, cells),
another code version, another torch, or other sampling settings (exit 2, naming the field
and both values; --force merges anyway and notes it). A cell found in two folders is always
an error: one of them would have to be dropped.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from ..core.errors import UsageError
from ..core.runfolder import PLAN_FILE, RECORDS_FILE, RUN_FILE, SEED_CLAIMS_FILE

# run.json fields that shards of one run share (dotted paths; budget_s may differ per shard).
CHECKED_FIELDS: tuple[str, ...] = (
    "preset", "grid.hash", "axes", "code_version", "env.torch",
    "timing.min_samples", "timing.min_time_s", "timing.max_cell_s", "timing.energy_window_s",
)


def field_value(info: dict[str, Any], path: str) -> Any:
    value: Any = info
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def differences(infos: Sequence[dict[str, Any]], names: Sequence[str],
                fields: Sequence[str] = CHECKED_FIELDS) -> list[str]:
    """One line per field (CHECKED_FIELDS) where a folder differs from the first."""
    out = []
    for path in fields:
        first = field_value(infos[0], path)
        for info, name in zip(infos[1:], names[1:]):
            value = field_value(info, path)
            if value != first:
                out.append(f"run.json field {path} differs: {first!r} in {names[0]} but {value!r} in {name}")
                break
    return out


def combined_run_info(infos: Sequence[dict[str, Any]], names: Sequence[str],
                      recorded: Sequence[set[str]], forced: Sequence[str] = ()) -> dict[str, Any]:
    """run.json of the merged run: the first shard's, with the whole grid's cell count, every
    device's ceilings, and `merged` (each shard: folder, index, cells, records, machine,
    ceilings; the shards and cells missing; the differences --force let through)."""
    base = {k: v for k, v in infos[0].items() if k != "shard"}
    ceilings: dict[str, Any] = {}
    for info in infos:
        for device, c in (info.get("ceilings") or {}).items():
            ceilings.setdefault(device, c)
    shards = [info.get("shard") for info in infos]
    counts = {s["count"] for s in shards if s}
    seen = {s["index"] for s in shards if s}
    missing_cells = [cell for s, done in zip(shards, recorded) if s for cell in s["cells"] if cell not in done]
    grid = base.get("grid") or {}
    base.update(
        n_cells=grid.get("cells") or sum(len(r) for r in recorded),
        started_at=min((str(i.get("started_at")) for i in infos if i.get("started_at")), default=None),
        ceilings=ceilings or None,
        merged={
            "shards": [{"dir": name, "shard": f"{s['index']}/{s['count']}" if s else None,
                        "cells": len(s["cells"]) if s else None, "records": len(done),
                        "device_name": (info.get("env") or {}).get("device_name"),
                        "host": s.get("host") if s else None,
                        "started_at": info.get("started_at"), "ceilings": info.get("ceilings")}
                       for info, name, s, done in zip(infos, names, shards, recorded)],
            "missing_shards": sorted(set(range(max(counts))) - seen) if len(counts) == 1 else [],
            "missing_cells": missing_cells,
            "forced": list(forced),
        })
    return base


def combined_plan(plans: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """plan.json of the merged run: every shard's predictions and skips (None if a shard has none)."""
    if not plans or any(p is None for p in plans):
        return None
    return {"budget_s": plans[0].get("budget_s"), "deadline_unix": None,
            "predicted": {k: v for p in plans for k, v in (p.get("predicted") or {}).items()},
            "skip": {k: v for p in plans for k, v in (p.get("skip") or {}).items()},
            "tier": {k: v for p in plans for k, v in (p.get("tier") or {}).items()},
            "uncovered": list(dict.fromkeys(u for p in plans for u in (p.get("uncovered") or []))),
            "reserve_s": max(float(p.get("reserve_s") or 0.0) for p in plans)}


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def write_records(run_dir: Path, recs: Sequence[dict[str, Any]]) -> None:
    """All records at once, made durable, then moved into place."""
    from ..core.records import dumps
    tmp = run_dir / (RECORDS_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(dumps(r) + "\n" for r in recs)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, run_dir / RECORDS_FILE)


def merge(out: Path, shard_dirs: Sequence[Path], *, force: bool = False) -> dict[str, Any]:
    """Write the merged run folder `out`; returns its run.json. Raises UsageError for a folder
    that is not a run, an `out` that holds records already, a field that differs (unless
    force) and a cell recorded in two folders."""

    from ..core.records import read_records
    from .lock import FolderBusy, RunLock

    out, dirs = Path(out), [Path(d) for d in shard_dirs]
    names = [str(d) for d in dirs]
    for d in dirs:
        if [x.resolve() for x in dirs].count(d.resolve()) > 1:
            raise UsageError(f"merge: {str(d)!r} is given twice")
        if not (d / RUN_FILE).is_file() or not (d / RECORDS_FILE).is_file():
            raise UsageError(f"merge: {str(d)!r} is not a run folder (it needs {RUN_FILE} and {RECORDS_FILE})")
        if d.resolve() == out.resolve():
            raise UsageError(f"merge: OUT {str(out)!r} is also a shard folder; give a new folder")
    if (out / RECORDS_FILE).exists():
        raise UsageError(f"merge: {str(out)!r} already holds {RECORDS_FILE}; give a new folder")
    infos = [json.loads((d / RUN_FILE).read_text()) for d in dirs]
    found = differences(infos, names)
    if found and not force:
        raise UsageError(f"merge: {found[0]} (--force merges anyway)")
    owner: dict[str, str] = {}
    merged: list[dict[str, Any]] = []
    recorded: list[set[str]] = []
    for d, name in zip(dirs, names):
        recs = read_records(d)
        for rec in recs:
            if rec["id"] in owner:
                raise UsageError(f"merge: cell {rec['id']} is recorded in both {owner[rec['id']]} and {name}; "
                                 "a cell must come from one shard")
            owner[rec["id"]] = name
        merged.extend(recs)
        recorded.append({r["id"] for r in recs})
    info = combined_run_info(infos, names, recorded, forced=found)
    plan = combined_plan([_read_json(d / PLAN_FILE) for d in dirs])
    claims = next((d / SEED_CLAIMS_FILE for d in dirs if (d / SEED_CLAIMS_FILE).is_file()), None)
    try:
        with RunLock(out):                  # no run (or other merge) writes OUT meanwhile
            if (out / RECORDS_FILE).exists():
                raise UsageError(f"merge: {str(out)!r} already holds {RECORDS_FILE}; give a new folder")
            write_records(out, merged)
            (out / RUN_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
            if plan is not None:
                (out / PLAN_FILE).write_text(json.dumps(plan, indent=1) + "\n")
            if claims is not None:
                shutil.copy(claims, out / SEED_CLAIMS_FILE)
    except FolderBusy as exc:
        raise UsageError(str(exc)) from None
    return info


def describe(info: dict[str, Any]) -> list[str]:
    """Console lines: what was merged, and what is missing."""
    m = info["merged"]
    n = sum(s["records"] for s in m["shards"])
    lines = [f"merged {n} records of {info['n_cells']} cells from {len(m['shards'])} folder(s)"]
    if m["missing_shards"]:
        given = sum(s["cells"] or s["records"] for s in m["shards"])
        lines.append(f"missing shards (not given): {', '.join(str(i) for i in m['missing_shards'])}, "
                     f"holding {info['n_cells'] - given} of the grid's cells")
    if m["missing_cells"]:
        head = ", ".join(m["missing_cells"][:10]) + (" ..." if len(m["missing_cells"]) > 10 else "")
        lines.append(f"{len(m['missing_cells'])} cells of the given shards have no record: {head}")
    lines += [f"merged despite: {f}" for f in m["forced"]]
    return lines
