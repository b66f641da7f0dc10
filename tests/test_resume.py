"""A run killed with SIGKILL mid-way and rerun finishes every cell exactly once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from audit.core import records
from audit.workload import presets

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--preset", "quick", "--variant", "eager", "sdpa_math", "--dtype", "fp32",
        "--d-k", "16", "32", "--seq-len", "32", "64", "128", "--heads", "2", "--kv-heads", "2",
        "--scenario", "normal", "padding", "--no-progress", "--no-report"]


def _expected_ids() -> set[str]:
    overrides = dict(variant=("eager", "sdpa_math"), dtype=("fp32",), d_k=(16, 32), seq_len=(32, 64, 128),
                     heads=(2,), kv_heads=(2,), scenario=("normal", "padding"))
    return {c.id for c in presets.preset_cases(presets.presets()["quick"], overrides)}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_kill_9_then_rerun_measures_only_missing_cells(tmp_path):
    out = tmp_path / "run"
    store = out / records.RECORDS_FILE
    cmd = [sys.executable, "-m", "audit", "run", *ARGS, "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(_lines(store)) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _lines(store)
    expected = _expected_ids()
    assert 4 <= len(before) < len(expected), "the kill must land mid-way for this test to mean anything"

    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = _lines(store)
    ids = [json.loads(line)["id"] for line in after]
    assert len(ids) == len(set(ids)), "duplicate records after resume"
    assert set(ids) == expected
    complete_before = [line for line in before if line.endswith("}")]
    assert after[:len(complete_before)] == complete_before, "finished records were rewritten"
    assert f"resumed {len(complete_before)}" in done.stderr
