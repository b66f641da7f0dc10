"""`run --executor ray` on a local 2-CPU Ray cluster: part of the quick preset as 2 shards gives
the cells, and the verdicts, of the session's unsharded quick run, and a worker killed mid-shard
costs no cell (one run checks both)."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import threading
import time

import pytest

from audit import cli
from audit.core import records
from audit.workload import presets, variants

# Skipped without Ray, which is imported by the tests that use it (not at collection: every
# pytest-xdist worker collects this module, and importing Ray costs each 1.2 s).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="Ray is an optional extra: pip install attn-audit[ray] (make test installs it)")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance with this machine's 2 CPUs (a CPU shard takes both: shards run one by one)."""
    import logging

    import ray
    ray.init(num_cpus=2, object_store_memory=100 * 2**20, logging_level=logging.WARNING, log_to_driver=False)
    yield
    ray.shutdown()


def _ids(preset: str, overrides: dict | None = None) -> list[str]:
    cases = presets.preset_cases(presets.presets()[preset], overrides, known_variant=variants.check_name)
    return [c.id for c in cases]


# Part of the quick preset (32 cells: eager, two SDPA backends, a negative control, GQA cells;
# no compiled variant: its GQA shapes would compile here); the cells it shares with the
# session's quick run must get the same verdicts
SHARDED = {"variant": ("eager", "sdpa", "sdpa_math", "broken.clamped"), "dtype": ("fp32",), "seq_len": (64,),
           "causal": ("true",), "scenario": ("normal", "padding")}
VERDICTS = ("status", "out_nan", "grad_nan", "within_budget", "masked_rows", "fused_sdpa")


@pytest.mark.slow           # 20 s on a worker: started first among the tests reading the quick run
def test_part_of_the_quick_preset_as_two_ray_shards_one_of_them_killed_and_retried(cluster, quick_run, tmp_path):
    """Two shards as Ray tasks: every cell of the unsharded grid once, with the session's local
    run's verdicts; SIGKILL of the Ray worker running the first shard (the pid it reports) once it
    has delivered a record: Ray retries the task, which starts from the records already delivered.
    (One run for both: each Ray run costs three Python starts on 2 cores.)"""
    from audit.execute.ray_executor import collector_name, shard_folder

    out = tmp_path / "run"
    axes = [arg for axis, values in SHARDED.items() for arg in (f"--{axis.replace('_', '-')}", *map(str, values))]
    killed: dict = {}

    def kill_when_a_record_arrived() -> None:
        import ray
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            try:
                status = ray.get(ray.get_actor(collector_name(out)).status.remote())
            except ValueError:          # the actor does not exist yet
                status = {}
            for key, task in status.items():
                if task["records"] >= 1 and task["attempts"] == 1:
                    os.kill(task["pid"], signal.SIGKILL)
                    killed.update(key=key, records=task["records"])
                    break
            time.sleep(0.1)

    killer = threading.Thread(target=kill_when_a_record_arrived, daemon=True)
    killer.start()
    assert cli.main(["run", "--preset", "quick", *axes, "--executor", "ray", "--shards", "2", "--budget", "none",
                     "--no-progress", "--no-report", "--out", str(out)]) == 0
    killer.join(timeout=5)
    assert killed, "the worker was never killed"
    recs = {r["id"]: r for r in records.read_records(out)}
    assert len(recs) == len(records.read_records(out)), "a cell recorded twice"
    assert sorted(recs) == sorted(_ids("quick", SHARDED))   # every cell of the unsharded grid, skipped ones too
    info = json.loads((out / "run.json").read_text())
    shards = {s["key"]: s for s in info["shards"]}
    assert sorted(shards) == ["cpu 0/2", "cpu 1/2"]
    assert all(s["cells"] > 0 for s in shards.values())
    assert sum(s["cells"] for s in shards.values()) == info["n_cells"] == len(recs)
    retried = shards[killed["key"]]
    assert retried["attempts"] == 2 and [s["attempts"] for k, s in shards.items() if k != killed["key"]] == [1]
    # the retry was seeded with what the killed attempt delivered, and measured the rest itself
    assert killed["records"] <= retried["resumed"] < retried["cells"], "the kill must land mid-shard to mean anything"
    assert not shard_folder(collector_name(out), retried["key"]).exists(), "the shard's folder was left behind"
    assert info["ceilings"]["cpu"]["matmul_flops_per_s"] and info["shard_differences"] == []
    assert json.loads((out / "plan.json").read_text())["budget_s"] is None   # the shards got the option
    unsharded = {r["id"]: r for r in records.read_records(quick_run)}
    shared = sorted(set(recs) & set(unsharded))
    assert len(shared) >= 10 and {unsharded[i]["variant"] for i in shared} >= {"eager", "sdpa", "broken.clamped"}
    for cell_id in shared:                                # the same verdicts as the local run's
        assert {c: recs[cell_id][c] for c in VERDICTS} == {c: unsharded[cell_id][c] for c in VERDICTS}, cell_id
    assert cli.main(["report", str(out)]) == 0
    assert f"Cells expected: {len(recs)}; records present: {len(recs)}." in (out / "index.md").read_text()
