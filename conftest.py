"""pytest configuration shared by tests/ and suites/.

`--audit-preset` chooses the grid the suites run over (default: quick); the
`--audit-<axis>` options narrow it like the CLI's axis options.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

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


def pytest_unconfigure(config):
    home = config.stash.get(_MADE_HOME, None)
    if home:
        shutil.rmtree(home, ignore_errors=True)
