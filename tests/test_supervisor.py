"""A native crash in one cell becomes that cell's error record; the run finishes the rest."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"


def test_segfault_in_one_cell_is_recorded_and_the_run_goes_on(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
    cmd = [sys.executable, "-m", "audit", "run", "--preset", "quick", "--variant", "crash_plugin:attention",
           "eager", "--scenario", "normal", "--dtype", "fp32", "--d-k", "16", "--seq-len", "32", "48", "64",
           "--heads", "2", "--kv-heads", "2",
           "--causal", "false", "--out", str(out), "--no-progress", "--no-report", "--min-samples", "1"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    recs = {r["id"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}
    assert len(recs) == 6, sorted(recs)
    crashed = recs["crash_plugin:attention-cpu-fp32-d16-T48-B1-H2-full-normal"]
    assert crashed["status"] == "error" and "SIGSEGV" in crashed["reason"]
    others = [r for i, r in recs.items() if "T48" not in i or not i.startswith("crash_plugin")]
    assert all(r["status"] == "ok" for r in others), [(r["id"], r["reason"]) for r in others]
    assert "SIGSEGV" in done.stderr
    assert not (out / "inflight").exists()
