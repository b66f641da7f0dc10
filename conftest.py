"""pytest configuration shared by tests/ and suites/.

`--audit-preset` chooses the grid the suites run over (default: quick); the
`--audit-<axis>` options narrow it like the CLI's axis options. Here too: the test session's
own folder for runs and caches (hermetic tests), and the one quick-preset run the suites,
repro, compare, Ray and report tests all read (`quick_run`).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

TEST_HOME_ENV = "ATTN_AUDIT_TEST_HOME"   # the test session's own folder (shared by xdist workers)
_MADE_HOME = pytest.StashKey[str]()      # set when this process made that folder (and removes it)

AXIS_OPTIONS = ("variant", "device", "dtype", "d_k", "seq_len", "batch", "heads", "kv_heads", "causal",
                "scenario")


def pytest_addoption(parser):
    group = parser.getgroup("attn-audit")
    group.addoption("--audit-preset", default="quick",
                    help="grid the suites/ run over: quick (default), cpu or gpu")
    for axis in AXIS_OPTIONS:
        flag = "--audit-" + axis.replace("_", "-")
        group.addoption(flag, nargs="+", default=None, metavar="V",
                        help=f"only these {axis} values (like the CLI's --{axis.replace('_', '-')})")


def pytest_benchmark_update_machine_info(config, machine_info):
    """Saved benchmark runs carry the torch/CUDA stack and the device they ran on."""
    import torch

    from audit.telemetry import cpu_model, nvml_info

    machine_info["torch"] = torch.__version__
    machine_info["cuda"] = torch.version.cuda
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["cpu_model"] = cpu_model()
    machine_info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    nvml, reason = nvml_info()
    machine_info["nvidia_driver"] = nvml["driver"] if nvml else None
    machine_info["nvml_reason"] = reason


def pytest_configure(config):
    """Hermetic tests: the runs they make, the cost model's history, the ceilings cache and
    Inductor's kernel cache all live in a folder of the session's own (ATTN_AUDIT_TEST_HOME,
    made here unless given, e.g. by `make test` for both of its pytest calls), so what the
    tests check never depends on `reports/` or caches earlier runs left on the machine. A test
    about history makes its own folder."""
    from audit.paths import CACHE_ENV, REPORTS_ENV

    home = os.environ.get(TEST_HOME_ENV)
    if not home:
        home = os.environ[TEST_HOME_ENV] = tempfile.mkdtemp(prefix="attn-audit-tests-")
        config.stash[_MADE_HOME] = home                        # removed when the session ends
    os.environ[REPORTS_ENV] = os.path.join(home, "reports")
    os.environ[CACHE_ENV] = os.path.join(home, "cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(home, "inductor")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        # pytest-xdist workers share the cores: an OpenMP team each, as wide as its share (two
        # teams on too few cores stall each other); the runs they start inherit it
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))


def pytest_unconfigure(config):
    home = config.stash.get(_MADE_HOME, None)
    if home:
        shutil.rmtree(home, ignore_errors=True)


SHARED_RUN_GROUP = "quick_run"
SHARED_RUN_FIXTURES = ("quick_run", "audited_run")   # audited_run reads quick_run for the default grid


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`--dist loadgroup`, as `make test` runs it) the tests that read the
    shared quick run go to one worker, so the run is made once."""
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in SHARED_RUN_FIXTURES):
            item.add_marker(pytest.mark.xdist_group(SHARED_RUN_GROUP))


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory) -> Path:
    """The quick preset, every cell (`--budget none`: nothing skipped for time, whatever the
    machine), with its findings, report and reproduction scripts: one run per test session,
    through the CLI in a subprocess as a user makes it. Read it; copy it before changing it."""
    out = tmp_path_factory.mktemp("quick-run") / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "audit", "run", "--preset", "quick", "--budget", "none",
                           "--no-progress", "--out", str(out)], cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return out
