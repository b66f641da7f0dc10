"""Tests of the command line, run as `python -m audit` in a subprocess (dry-runs in this process).

Every `run` here uses --dry-run: nothing is measured.
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from audit.core import grid
from audit.core.units import format_duration, parse_duration
from audit.workload import presets
from audit.workload.variants import BUILTIN_NAMES

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"


def cli(*args: str, pythonpath: list[Path] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return subprocess.run([sys.executable, "-m", "audit", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def here(capsys, *args: str) -> subprocess.CompletedProcess:
    """The same command in this test's process: cli.main, stdout and stderr captured (a
    dry-run then skips the 2-3 s of starting Python and importing torch)."""
    from audit import cli as command_line
    code = command_line.main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["attn-audit", *args], code, out, err)


def dry_run_ids(stdout: str) -> tuple[list[str], str]:
    """(cell ids, the "N cells" line) of --dry-run's output: one line per cell, "id  seconds ..."."""
    lines = stdout.splitlines()
    end = next(i for i, line in enumerate(lines) if line.endswith(" cells") and line.split()[0].isdigit())
    return [line.split()[0] for line in lines[:end]], lines[end]


def assert_usage_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("attn-audit: error:"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert proc.stdout == ""
    return lines[0]


def quick_ids(**override) -> list[str]:
    """Cell ids of the quick preset (every sub-grid, deduplicated), axes overridden."""
    return [c.id for c in presets.preset_cases(presets.presets()["quick"], override)]


# --------------------------------------------------------------------------- usage errors

USAGE_ERRORS = {
    "unknown variant": (["--variant", "nope"], ["'nope'", "eager", "sdpa"]),
    "unknown dtype": (["--dtype", "fp64"], ["'fp64'", "fp32", "bf16", "fp16"]),
    "unknown device": (["--device", "tpu"], ["'tpu'", "cpu", "cuda"]),
    "zero d_k": (["--d-k", "0"], ["--d-k", "'0'"]),
    "negative batch": (["--batch", "-3"], ["--batch", "'-3'"]),
    "non-integer seq_len": (["--seq-len", "abc"], ["--seq-len", "'abc'"]),
    "fractional heads": (["--heads", "1.5"], ["--heads", "'1.5'"]),
    "bad causal": (["--causal", "maybe"], ["--causal", "'maybe'"]),
    "bad min-samples": (["--min-samples", "0"], ["--min-samples", "0"]),
    "noise target over 100%": (["--noise-target", "150"], ["--noise-target", "150", "0 to 100"]),
    "negative noise cap": (["--noise-cap-s", "-1"], ["--noise-cap-s", "-1", "non-negative"]),
    "unimportable plug-in": (["--variant", "no_such_module_xyz_123:fn"], ["no_such_module_xyz_123"]),
    "bad plug-in form": (["--variant", "mod:"], ["'mod:'", "package.module:function"]),
}


@pytest.mark.parametrize("args,needles", list(USAGE_ERRORS.values()), ids=list(USAGE_ERRORS))
def test_run_usage_errors(args, needles):
    assert_usage_error(cli("run", "--preset", "quick", *args, "--dry-run"), *needles)


def test_unknown_preset():
    assert_usage_error(cli("run", "--preset", "nosuch", "--dry-run"), "'nosuch'", "quick", "cpu", "gpu")


def test_unknown_command_and_missing_command():
    assert_usage_error(cli("frobnicate"), "frobnicate")
    assert_usage_error(cli())


def test_cuda_device_without_cuda(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = tmp_path / "run"
    assert_usage_error(cli("run", "--preset", "quick", "--device", "cuda", "--out", str(out)), "cuda")
    assert not out.exists(), "a refused run must not create its folder"


def test_gpu_preset_dry_run_lists_cells_without_cuda(capsys):
    """Planning a GPU run works on any machine: --dry-run needs no device."""
    proc = here(capsys, "run", "--preset", "gpu", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    ids, count = dry_run_ids(proc.stdout)
    assert count == f"{len(ids)} cells"
    assert all("-cuda-" in i for i in ids)
    assert "predicted for the reference NVIDIA H200" in proc.stdout
    assert "predicted wall time:" in proc.stdout and "per phase: setup" in proc.stdout


def test_plugin_raising_a_multiline_error_is_still_one_line(tmp_path):
    name = f"multiline_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        'raise ImportError("libfoo.so: cannot open shared object file\\n'
        'hint: install foo\\nsee the docs")\n')
    proc = cli("run", "--preset", "quick", "--variant", f"{name}:fn", "--dry-run", pythonpath=[tmp_path])
    assert_usage_error(proc, name)


def test_report_without_records_is_a_usage_error(tmp_path):
    assert_usage_error(cli("report", str(tmp_path)), "records.jsonl")


# --------------------------------------------------------------------------- list and dry runs

def test_list_prints_every_builtin_variant_and_preset(capsys, monkeypatch):
    from audit.workload import hf
    monkeypatch.setattr(hf, "transformers_version", lambda: None)   # tests/test_hf.py lists the hf: names
    proc = here(capsys, "list")
    assert proc.returncode == 0, proc.stderr
    assert "hf:NAME            transformers' attention functions: pip install 'attn-audit[hf]'" in proc.stdout
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ") and line.strip()}
    for name in BUILTIN_NAMES:
        assert name in listed
    for preset in presets.presets():
        assert preset in listed


def test_dry_run_quick_prints_every_cell(capsys):
    proc = here(capsys, "run", "--preset", "quick", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    ids, count = dry_run_ids(proc.stdout)
    expected = quick_ids()
    assert ids == expected
    assert count == f"{len(expected)} cells"
    # every cell of every sub-grid, each once
    union = {c.id for sub in presets.presets()["quick"].grids for c in grid.expand(grid.validate_axes(sub))}
    assert len(set(expected)) == len(expected)
    assert set(expected) == union


def test_dry_run_restricts_variants(capsys):
    proc = here(capsys, "run", "--preset", "quick", "--variant", "eager", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    ids, count = dry_run_ids(proc.stdout)
    assert ids == quick_ids(variant=("eager",))
    assert all(i.startswith("eager-") for i in ids)
    # eager is in every quick sub-grid but flex's, whose cells it also has: restricting to it
    # keeps exactly its cells
    all_ids = quick_ids()
    assert len(all_ids) > len(ids) > 0
    assert sorted(ids) == sorted(i for i in all_ids if i.startswith("eager-"))
    assert count == f"{len(ids)} cells"


def test_dry_run_variant_override_applies_to_every_sub_grid(capsys):
    # sdpa_flash is only in the first quick sub-grid; --variant puts it in all of them
    quick = presets.presets()["quick"]
    assert any("sdpa_flash" not in sub["variant"] for sub in quick.grids)
    proc = here(capsys, "run", "--preset", "quick", "--variant", "sdpa_flash", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    ids, _ = dry_run_ids(proc.stdout)
    assert ids == quick_ids(variant=("sdpa_flash",))
    scenarios = {i.rsplit("-", 1)[1] for i in ids}
    assert scenarios == {s for sub in quick.grids for s in sub["scenario"]}
    assert len(scenarios) > 1


def test_dry_run_axis_overrides_combine(capsys):
    proc = here(capsys, "run", "--preset", "quick", "--variant", "eager", "sdpa", "--seq-len", "32",
               "--causal", "true", "--dtype", "fp32", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    expected = quick_ids(variant=("eager", "sdpa"), seq_len=(32,), causal=(True,), dtype=("fp32",))
    # each override replaces its axis in every sub-grid; the scenarios stay per sub-grid
    by_hand = {grid.Case(v, "cpu", "fp32", 32, 32, b, h, True, s, kv, dv).id
               for sub in presets.presets()["quick"].grids
               if not all(name.startswith("broken.") for name in sub["variant"])   # a controls-only sub-grid: dropped
               for v in ("eager", "sdpa") for s in sub["scenario"]
               for h in sub["heads"] for kv in grid.sub_grid_values(sub, "kv_heads") for b in sub["batch"]
               for dv in grid.sub_grid_values(sub, "d_v")}
    assert set(expected) == by_hand
    assert len(expected) == len(by_hand)
    assert dry_run_ids(proc.stdout) == (expected, f"{len(expected)} cells")


def test_dry_run_overrides_down_to_one_cell_per_variant(capsys):
    proc = here(capsys, "run", "--preset", "quick", "--variant", "eager", "sdpa", "--seq-len", "32",
               "--causal", "true", "--dtype", "fp32", "--scenario", "normal", "--heads", "2",
               "--kv-heads", "2", "--batch", "1", "--d-k", "32", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert dry_run_ids(proc.stdout) == (["eager-cpu-fp32-d32-T32-B1-H2-causal-normal",
                                         "sdpa-cpu-fp32-d32-T32-B1-H2-causal-normal"], "2 cells")


def test_dry_run_accepts_a_plugin_on_pythonpath():
    spec = "example_plugin:my_attention"
    proc = cli("run", "--preset", "quick", "--variant", spec, "--seq-len", "64", "--dtype", "fp32",
               "--dry-run", pythonpath=[PLUGINS])
    assert proc.returncode == 0, proc.stderr
    ids, _ = dry_run_ids(proc.stdout)
    assert ids and all(i.startswith(spec + "-cpu-fp32-") for i in ids)


def test_bad_budget_is_a_usage_error():
    assert_usage_error(cli("run", "--preset", "quick", "--budget", "ten minutes", "--dry-run"),
                       "--budget", "'ten minutes'", "90s")


def test_dry_run_shows_what_a_budget_cuts(capsys):
    """A budget that cuts on any CPU: sized on this machine's own unlimited plan (twice its reserve
    for start-up, ceilings and report, which scales with the host's speed and load, plus a third
    of the cells' time), never a fixed number of seconds (a 30 s budget left no cell on a slower CI host)."""
    import re
    whole = here(capsys, "run", "--preset", "cpu", "--budget", "none", "--dry-run")
    assert whole.returncode == 0, whole.stderr
    cells_s, reserve_s = (parse_duration(text) for text in re.search(
        r"predicted (.+?) \(\+ (.+?) start-up", whole.stdout.strip().splitlines()[-1]).groups())
    budget_s = int(2 * reserve_s + cells_s / 3)
    proc = here(capsys, "run", "--preset", "cpu", "--budget", f"{budget_s}s", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    ids, count = dry_run_ids(proc.stdout)
    assert count == f"{len(ids)} cells"
    cut = [line for line in proc.stdout.splitlines()
           if "  skipped: over the budget" in line or "over the per-cell limit" in line]
    assert cut and len(cut) < len(ids), (budget_s, cells_s, reserve_s)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("plan: ") and f"budget {format_duration(budget_s)}" in last and f"{len(cut)}" in last
    unlimited = here(capsys, "run", "--preset", "quick", "--budget", "none", "--dry-run")
    assert "no budget" in unlimited.stdout.strip().splitlines()[-1]


def test_budget_none_measures_a_cell_over_the_presets_cell_limit(capsys):
    """A cell predicted over the quick preset's 5 s per-cell limit on any of these CPUs (eager
    fp32 at T 16384: about 20 s) is skipped under the preset's budget; --budget none plans to
    measure it, unless --max-cell-s is given too. (Dry-runs in this process: parsing included.)"""
    from audit import cli as audit_cli
    cell = ["--variant", "eager", "--dtype", "fp32", "--seq-len", "16384", "--d-k", "128", "--batch", "1",
            "--heads", "2", "--kv-heads", "2", "--causal", "false", "--scenario", "normal"]

    def planned(*extra: str) -> str:
        assert audit_cli.main(["run", "--preset", "quick", *cell, *extra, "--dry-run"]) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("eager-cpu-fp32-d128-T16384")]
        return line

    assert "skipped" in planned() and "--max-cell-s" in planned()
    assert "skipped" not in planned("--budget", "none")
    assert "skipped" in planned("--budget", "none", "--max-cell-s", "5")


EXIT_PROCESS_CODE = r'''
import atexit, concurrent.futures, sys, threading, time
from audit.cli import exit_process
pool = concurrent.futures.ThreadPoolExecutor(2)                        # never shut down: its idle
pool.submit(time.sleep, 0.01).result()                                 # workers are stopped at exit
atexit.register(lambda: sys.stdout.write("atexit ran\n"))          # written after: flushed by it
def late():
    time.sleep(0.3)
    sys.stdout.write("thread done\n")
threading.Thread(target=late).start()                                  # not a daemon: waited for
sys.stdout.write("buffered " * 100)                                    # a pipe: block-buffered, unflushed
exit_process(3)
'''


def _buffered_env() -> dict:
    """This environment with stdout block-buffered on a pipe, as Python has it by default."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "PYTHONPATH")}
    return dict(env, PYTHONPATH=str(ROOT))


def test_exit_process_skips_only_pythons_teardown():
    """`python -m audit` ends by os._exit: what a normal exit does first (stopping an executor's
    idle threads, waiting for other threads, atexit handlers, flushing a pipe's buffer) is still
    done, and the exit code kept. (Joining the executor's threads without its exit hook hung a
    measuring process that had compiled: Inductor keeps such a pool.)"""
    done = subprocess.run([sys.executable, "-c", EXIT_PROCESS_CODE], cwd=ROOT, env=_buffered_env(),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered " * 100 + "thread done\natexit ran\n", done.stdout[-200:]


def test_the_command_line_output_reaches_a_pipe_in_full():
    done = subprocess.run([sys.executable, "-m", "audit", "list"], cwd=ROOT, env=_buffered_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listed = done.stdout
    assert all(name in listed for name in ("eager", "sdpa", "flex")) and listed.endswith("\n")
