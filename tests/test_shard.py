"""Sharding: `run --shard I/N` measures a deterministic, balanced 1/N of the grid, input sets whole."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from audit.core import grid, records
from audit.plan import shard
from audit.workload import presets, variants
from tests.helpers import h200_run

ROOT = Path(__file__).resolve().parents[1]


def _grid(name: str) -> tuple[list[grid.Case], presets.Preset]:
    preset = presets.presets()[name]
    return presets.preset_cases(preset, known_variant=variants.check_name), preset


@pytest.mark.parametrize("text, index, count", [("0/4", 0, 4), ("3/4", 3, 4), (" 0/1 ", 0, 1)])
def test_parse_shard(text, index, count):
    assert shard.parse_shard(text) == shard.Shard(index, count)


@pytest.mark.parametrize("text, needle", [("4/4", "0..3"), ("1/0", "N = 0"), ("/", "not I/N"),
                                          ("-1/4", "not I/N"), ("1-4", "not I/N")])
def test_parse_shard_refuses(text, needle):
    with pytest.raises(grid.UsageError, match=needle.replace(".", r"\.")):
        shard.parse_shard(text)


@pytest.mark.parametrize("name, count", [("gpu", 2), ("gpu", 8), ("quick", 3), ("cpu", 16)])
def test_every_cell_once_and_input_sets_whole(name, count):
    cases, preset = _grid(name)
    parts = shard.assign(cases, count, shard.cell_costs(cases, preset))
    ids = [c.id for part in parts for c in part]
    assert sorted(ids) == sorted(c.id for c in cases)
    owner = {c.input_key: i for i, part in enumerate(parts) for c in part}
    assert all(owner[c.input_key] == i for i, part in enumerate(parts) for c in part), "an input set was split"
    order = {c.id: n for n, c in enumerate(cases)}
    assert all([order[c.id] for c in part] == sorted(order[c.id] for c in part) for part in parts)


@pytest.mark.parametrize("count", [2, 4, 8, 16])
def test_balanced_on_the_gpu_preset(count):
    """Predicted seconds per shard (what the assignment balances) within 5% of an even split."""
    cases, preset = _grid("gpu")
    costs = shard.cell_costs(cases, preset)
    loads = [sum(costs[c.id] for c in part) for part in shard.assign(cases, count, costs)]
    assert max(loads) <= 1.05 * sum(loads) / count


@pytest.mark.parametrize("count, factor", [(2, 1.1), (4, 1.1), (8, 1.3)])
def test_balanced_in_measured_time_on_the_h200_run(tmp_path, count, factor):
    """The H200 `full` run (164 cells, 24 input sets): shards chosen on predictions, judged on the
    seconds the cells really took there (measured 1.01, 1.02, 1.20 of an even split)."""
    import dataclasses

    from audit.plan.settings import Settings
    recs = records.read_records(h200_run("full", tmp_path))
    cases = [grid.Case.from_mapping(r) for r in recs]
    took = {r["id"]: r["elapsed_s"] or 0.0 for r in recs}
    # that run predates the lse checks (schema 10) and the referee (schema 11): its cells are predicted
    # as it measured them
    gpu = presets.presets()["gpu"]
    settings = dataclasses.replace(Settings.of_preset(gpu), lse_checks=False, referee=False)
    parts = shard.assign(cases, count, shard.cell_costs(cases, gpu, settings))
    loads = [sum(took[c.id] for c in part) for part in parts]
    assert max(loads) <= factor * sum(loads) / count


def test_same_assignment_in_another_process_with_local_history(tmp_path):
    """Nothing of this machine or process enters the assignment: another process with another hash
    seed, in a folder whose reports/ holds a run the cost model would refit on, gets the same shards."""
    cases, preset = _grid("cpu")
    here = [[c.id for c in part] for part in shard.assign(cases, 4, shard.cell_costs(cases, preset))]
    history = tmp_path / "reports"
    from tests.helpers import cpu_run
    cpu_run("quick", history)
    code = ("import json; from audit.workload import presets, variants; from audit.plan import shard\n"
            "p = presets.presets()['cpu']; cs = presets.preset_cases(p, known_variant=variants.check_name)\n"
            "print(json.dumps([[c.id for c in s] for s in shard.assign(cs, 4, shard.cell_costs(cs, p))]))")
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == here


def test_run_shard_measures_its_cells_without_ray(tmp_path):
    """`run --shard 1/2` measures exactly shard 1's cells, notes it in run.json, and imports no Ray."""
    args = ["run", "--preset", "quick", "--variant", "eager", "sdpa", "--dtype", "fp32", "--seq-len", "64",
            "--scenario", "normal", "padding", "--no-progress", "--no-report"]
    code = ("import sys; from audit.cli import main\n"
            f"rc = main({args + ['--shard', '1/2', '--out', str(tmp_path)]!r})\n"
            "assert 'ray' not in sys.modules, 'the local runner imported ray'\n"
            "sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    preset = presets.presets()["quick"]
    cases = presets.preset_cases(preset, {"variant": ("eager", "sdpa"), "dtype": ("fp32",), "seq_len": (64,),
                                       "scenario": ("normal", "padding")})
    mine = shard.shard_cases(cases, preset, shard.Shard(1, 2))
    assert 0 < len(mine) < len(cases)
    assert sorted(records.completed_ids(tmp_path)) == sorted(c.id for c in mine)
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["shard"]["index"] == 1 and info["shard"]["count"] == 2
    assert info["shard"]["cells"] == [c.id for c in mine]
    assert info["grid"] == shard.grid_info(cases, preset)
    assert info["code_version"].startswith("0.")


def test_ray_jobs_one_gpu_per_cuda_shard_and_a_whole_node_per_cpu_shard():
    """The Ray executor's shards for a cluster of 8 GPUs and two 16-CPU nodes (no Ray needed)."""
    from audit.execute.ray_executor import plan_jobs

    cases, preset = _grid("gpu")
    jobs = plan_jobs(cases, preset, {}, None, (8, 16, 2))
    assert [j.key for j in jobs] == [f"cuda {i}/8" for i in range(8)]
    assert all(j.resources == {"num_gpus": 1, "num_cpus": 1} for j in jobs)
    assert [[c.id for c in j.cells] for j in jobs] == \
        [[c.id for c in part] for part in shard.assign(cases, 8, shard.cell_costs(cases, preset))]
    mixed = presets.preset_cases(presets.presets()["quick"], {"device": ("cpu", "cuda"), "variant": ("sdpa",)})
    jobs = plan_jobs(mixed, presets.presets()["quick"], {"device": ("cpu", "cuda"), "variant": ("sdpa",)}, 3,
                     (1, 16, 2))
    assert [j.key for j in jobs] == ["cpu 0/3", "cpu 1/3", "cpu 2/3", "cuda 0/3", "cuda 1/3", "cuda 2/3"]
    assert {j.device: (j.resources, j.threads) for j in jobs} == {
        "cpu": ({"num_cpus": 16}, 16), "cuda": ({"num_gpus": 1, "num_cpus": 1}, 1)}
    with pytest.raises(grid.UsageError, match="no GPU"):
        plan_jobs(mixed, presets.presets()["quick"], {"device": ("cpu", "cuda"), "variant": ("sdpa",)}, None,
                  (0, 16, 2))


def test_ray_task_command_keeps_the_measuring_options():
    """A task's `audit run` has the driver's measuring options, its own device and shard, and none
    of the driver's (executor, output, report)."""
    from audit import cli
    from audit.execute.ray_executor import Job, task_argv

    argv = ["run", "--preset", "quick", "--variant", "eager", "sdpa", "--causal", "true", "--budget", "20s",
            "--min-samples", "4", "--l2-flush", "--executor", "ray", "--ray-address", "auto", "--shards", "2",
            "--out", "/tmp/x", "--no-progress"]
    parser = cli.build_parser()
    args = parser.parse_args(argv)
    run_parser = next(a for a in parser._actions if a.dest == "command").choices["run"]
    job = Job("cpu 1/2", "cpu", 1, 2, [])
    got = task_argv(args, run_parser._actions, "quick", job)
    assert got[:8] == ["run", "--preset", "quick", "--device", "cpu", "--shard", "1/2", "--no-report"]
    rest = " ".join(got[8:])
    for part in ("--variant eager sdpa", "--causal true", "--budget 20s", "--min-samples 4", "--l2-flush",
                 "--no-progress"):
        assert part in " ".join(got)
    for driver_only in ("--executor", "--ray-address", "--shards", "--out"):
        assert driver_only not in rest


@pytest.mark.parametrize("extra, needle", [
    (["--shard", "4/4"], "--shard: '4/4': I counts from 0, so it must be in 0..3"),
    (["--shard", "/"], "--shard: '/' is not I/N"),
    (["--shard", "0/2", "--executor", "ray"], "--executor ray makes its own (--shards N)"),
    (["--shards", "2"], "apply to --executor ray only"),
    (["--executor", "ray", "--shards", "0"], "--shards: 0 is not a positive integer"),
    (["--executor", "dask"], "invalid choice: 'dask'"),
])
def test_shard_and_executor_usage_errors(tmp_path, capsys, extra, needle):
    argv = ["run", "--preset", "quick", "--variant", "eager", "--out", str(tmp_path), *extra]
    from audit import cli
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "records.jsonl").exists()
