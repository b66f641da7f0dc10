"""pytest-benchmark JSON -> audit records, so a CI job's benchmark file becomes the audit's report.

suites/test_performance.py stores each cell's axes, phase, FLOPs, peak memory and
error in `extra_info`; the fwd and fwd_bwd benchmarks of one cell merge into one record.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core import records
from ..core.grid import AXES, OPTIONAL_AXES
from ..core.runfolder import RECORDS_FILE, RUN_FILE


def records_from_benchmarks(data: dict[str, Any]) -> tuple[list[dict], int]:
    """(records, number of benchmarks without audit extra_info, which are ignored)."""
    env = environment_from_machine_info(data)
    by_id: dict[str, dict] = {}
    ignored = 0
    for bench in data.get("benchmarks", []):
        info = bench.get("extra_info") or {}
        if "id" not in info or info.get("phase") not in ("fwd", "fwd_bwd") \
                or any(a not in info for a in AXES if a not in OPTIONAL_AXES):
            ignored += 1
            continue
        rec = by_id.get(info["id"])
        if rec is None:
            axes = {a: info.get(a) for a in AXES}
            axes["kv_heads"] = axes["kv_heads"] or axes["heads"]   # files from before the axis: multi-head
            rec = records.new_record(axes, info["id"])
            rec.update(status="ok", env=env, started_at=data.get("datetime"),
                       timer="pytest-benchmark: " + str((bench.get("options") or {}).get("timer")))
            by_id[info["id"]] = rec
        stats = bench["stats"]
        phase = info["phase"]
        rec[f"{phase}_ms"] = stats["median"] * 1e3
        rec[f"{phase}_iqr_ms"] = stats["iqr"] * 1e3
        rec[f"{phase}_n"] = stats["rounds"]
        rec[f"{phase}_samples_s"] = stats.get("data")
        if phase == "fwd":
            rec.update(flops=info.get("flops"), gflops_per_s=info.get("gflops_per_s"),
                       peak_bytes=info.get("peak_bytes"), rel_err=info.get("rel_err"), rmse=info.get("rmse"))
        else:
            rec.update(fwd_bwd_gflops_per_s=info.get("gflops_per_s"),
                       peak_fwd_bwd_bytes=info.get("peak_bytes"))
    return list(by_id.values()), ignored


def environment_from_machine_info(data: dict[str, Any]) -> dict[str, Any]:
    machine = data.get("machine_info") or {}
    commit = data.get("commit_info") or {}
    cpu = machine.get("cpu") or {}
    return {
        "torch": machine.get("torch"), "python": machine.get("python_version"),
        "platform": machine.get("system"), "cpu_model": machine.get("cpu_model") or cpu.get("brand_raw"),
        "threads": machine.get("torch_threads"), "cuda": machine.get("cuda"),
        "device_name": machine.get("gpu") or machine.get("cpu_model") or cpu.get("brand_raw"),
        "git_commit": commit.get("id"), "nvidia_driver": machine.get("nvidia_driver"),
        "nvml_reason": machine.get("nvml_reason"), "source": "pytest-benchmark JSON",
    }


def convert(json_path: str | Path, run_dir: str | Path) -> tuple[Path, int, int]:
    """Write run_dir/records.jsonl and run.json from a pytest-benchmark file.

    Returns (run_dir, records written, benchmarks ignored). Raises ValueError when
    the file is not pytest-benchmark JSON.
    """
    path = Path(json_path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {str(path)!r} as JSON: {exc}") from None
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise ValueError(f"{str(path)!r} is not a pytest-benchmark JSON file (no 'benchmarks' list)")
    recs, ignored = records_from_benchmarks(data)
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    store = out / RECORDS_FILE
    if store.exists():
        store.unlink()  # the JSON is the source of truth: rebuild, never append twice
    with records.RecordWriter(out) as writer:
        for rec in recs:
            writer.write(rec)
    axes = {a: sorted({r[a] for r in recs}, key=str) for a in AXES}
    run_info = {"schema": records.SCHEMA_VERSION, "preset": f"pytest-benchmark ({path.name})",
                "axes": axes, "argv": [str(path)], "started_at": data.get("datetime"),
                "env": recs[0]["env"] if recs else environment_from_machine_info(data),
                "n_cells": len(recs)}
    (out / RUN_FILE).write_text(json.dumps(run_info, indent=2, default=str) + "\n")
    return out, len(recs), ignored
