"""pytest configuration shared by tests/ and suites/.

`--audit-preset` chooses the grid the suites run over (default: quick); the
`--audit-<axis>` options narrow it like the CLI's axis options. Here too: the test session's
own folder for runs and caches (hermetic tests), and the one quick-preset run the suites,
repro, compare, Ray and report tests all read (`quick_run`).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from audit.core.grid import AXES

ROOT = Path(__file__).resolve().parent

TEST_HOME_ENV = "ATTN_AUDIT_TEST_HOME"   # the test session's own folder (shared by xdist workers)
_MADE_HOME = pytest.StashKey[str]()      # set when this process made that folder (and removes it)

AXIS_OPTIONS = AXES      # one --audit-<axis> option per axis of the grid (core.grid: one definition)


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

    from audit.measure.machine.environment import cpu_model
    from audit.measure.machine.nvml import nvml_info

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
    Inductor's kernel cache all live in a folder of the session's own (the golden store is off) (ATTN_AUDIT_TEST_HOME,
    made here unless given, e.g. by `make test` for both of its pytest calls), so what the
    tests check never depends on `reports/` or caches earlier runs left on the machine. A test
    about history makes its own folder."""
    from audit.core.paths import CACHE_ENV, REPORTS_ENV

    home = os.environ.get(TEST_HOME_ENV)
    if not home:
        home = os.environ[TEST_HOME_ENV] = tempfile.mkdtemp(prefix="attn-audit-tests-")
        config.stash[_MADE_HOME] = home                        # removed when the session ends
    os.environ[REPORTS_ENV] = os.path.join(home, "reports")
    os.environ[CACHE_ENV] = os.path.join(home, "cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(home, "inductor")
    # Inductor takes the vector ISAs the CPU reports (/proc/cpuinfo) as usable instead of proving
    # each one by building a test library and loading it from a new Python process that imports
    # torch: four such processes, about 9 s, in the first compile of every process (each pytest-xdist
    # worker, the shared quick run, every run or script a test starts that compiles; a cold compile
    # took 14 s, now 5 s). It picks the same ISA (here avx512 with AMX); a compiler that could not
    # build for it would make the compiles fail, not pass.
    os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
    # The golden store off: a reference one test's run stores would change what another test's plan
    # predicts (the workers share the folder). Its own tests turn it on in a folder of their own.
    from audit.measure.golden.golden_store import STORE_ENV
    os.environ[STORE_ENV] = "0"
    # Timing noise not judged (--noise-target's default 0): the tests share a loaded machine by design,
    # where a timing_unstable finding would join every run's findings; the tests of the noise set
    # their own target (tests/test_noise_run.py: --noise-target 5).
    from audit.core.noise import NOISE_TARGET_ENV
    os.environ.setdefault(NOISE_TARGET_ENV, "0")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        # pytest-xdist workers share the cores: an OpenMP team each, as wide as its share (two
        # teams on too few cores stall each other); the runs they start inherit it
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))


def _whole_suite(config) -> bool:
    """A run of the whole suite (`make test`'s first call: `tests suites` under pytest-xdist,
    nothing narrowed), which reads the shared quick run for sure."""
    args = [str(a).rstrip("/") for a in config.args]
    return (bool(getattr(config.option, "numprocesses", None)) and sorted(args) == ["suites", "tests"]
            and not config.getoption("keyword") and not config.option.collectonly
            and default_suite_selection(config))


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    """The whole suite starts the shared quick run at once, in the controlling process, so it
    runs while the workers collect (7-13 s each on 2 cores) instead of after."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and _whole_suite(session.config):
        _shared_run_start()


def pytest_unconfigure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):   # the session's own process, after its workers
        _shared_run_stop()
    home = config.stash.get(_MADE_HOME, None)
    if home:
        shutil.rmtree(home, ignore_errors=True)


# The shared quick run, made through the Python API as a notebook would (audit.run), so that
# every test reading it also checks the API; tests/test_api.py checks what it recorded.
QUICK_RUN_OPTIONS = {"preset": "quick", "budget": "none", "no_progress": True}
QUICK_RUN_CODE = "import sys, audit; audit.run(out=sys.argv[1], **{options})"
QUICK_RUN_WAIT_S = 1200


def default_suite_selection(config) -> bool:
    """The suites' grid is the quick preset, unnarrowed: then they read the shared quick run."""
    return config.getoption("--audit-preset") == "quick" and not any(
        config.getoption("--audit-" + axis.replace("_", "-")) for axis in AXIS_OPTIONS)


@pytest.fixture(scope="session")
def default_suite_grid(request) -> bool:
    """Whether the suites run over the unnarrowed quick preset (and so read the quick run)."""
    return default_suite_selection(request.config)


def _uses_shared_run(item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "quick_run" in names or ("audited_run" in names and default_suite_selection(item.config))


def _uses_a_module_fixture(item) -> bool:
    """Whether a test uses a module-scoped fixture (its own module's or conftest's)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)        # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(config, items):
    """The tests that read the shared quick run go last (in collection order, which every
    pytest-xdist worker keeps alike): by the time one is reached the run, started in the
    background when collection ends, is made, and no worker waits for it. They are marked
    `shared_run`: `make test`'s emulated CPU kinds leave them out (the run is the whole quick preset).
    Within each of the two parts the tests marked `slow` go first: last, one took 20 s on one worker
    while the other had finished (tests/test_ray.py, 14 s of a 262 s phase with a core idle).

    The tests of a module that use a module-scoped fixture (a run of faulty plug-ins, a built
    report) go to one pytest-xdist worker (`make test`: `--dist loadgroup`): spread over two,
    each worker built the fixture (tests/test_repro.py's run of faulty plug-ins, 11-14 s on 2
    cores of an AVX2-only AMD EPYC, was made twice)."""
    items.sort(key=lambda item: (_uses_shared_run(item), item.get_closest_marker("slow") is None))
    for item in items:
        if _uses_shared_run(item):
            item.add_marker(pytest.mark.shared_run)
        if _uses_a_module_fixture(item):
            group = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))
            _suffix_group(config, item, group)


def _suffix_group(config, item, group: str) -> None:
    """Give the item the `@group` suffix pytest-xdist's loadgroup schedules by. xdist writes it to
    `item._nodeid`, which pytest 9.2 no longer reads (its node ids are structured, `item._id`), so the
    groups were silently ignored and each worker built the module fixtures again (tests/test_faults.py's
    21 s run of faulty plug-ins twice; pytest-dev/pytest-xdist#1386, fix pending in #1388). Here the
    structured id gets the suffix, where it exists, and only on a loadgroup worker."""
    if not getattr(config.option, "loadgroup", False) or "@" in item.nodeid.rpartition("]")[2]:
        return
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:         # pytest before 9.2: xdist's own suffix works
        return
    if hasattr(item, "_id"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")


def pytest_collection_finish(session):
    if not session.config.option.collectonly and any(_uses_shared_run(i) for i in session.items):
        _shared_run_start()


def _shared_run_folder() -> Path:
    return Path(os.environ[TEST_HOME_ENV]) / "quick-run"


def _shared_run_start() -> None:
    """Start the quick run in the background, once per session: the first process to get here
    (the only one without pytest-xdist, the first worker with it) makes the `started` file."""
    folder = _shared_run_folder()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / "started", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = '"$@" > "$0/console.log" 2>&1; echo $? > "$0/rc.part" && mv "$0/rc.part" "$0/rc"'
    code = QUICK_RUN_CODE.format(options=QUICK_RUN_OPTIONS)
    proc = subprocess.Popen(["sh", "-c", script, str(folder), sys.executable, "-c", code, str(folder / "run")],
                            cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)),
                            stdin=subprocess.DEVNULL, start_new_session=True)
    os.write(fd, str(proc.pid).encode())
    os.close(fd)


def _shared_run_stop() -> None:
    """At the end of the session: a quick run still going (the session was cut short) is killed."""
    folder = _shared_run_folder()
    try:
        pid = int((folder / "started").read_text())
    except (OSError, ValueError):
        return
    if not (folder / "rc").exists():
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture(scope="session")
def quick_run() -> Path:
    """The quick preset, every cell (`--budget none`: nothing skipped for time, whatever the
    machine), with its findings, report and reproduction scripts: one run per test session,
    through audit.run in a subprocess as a user's script makes it (its measuring process is
    started by the same command line as the CLI's), started when collection ends (shared by
    every pytest-xdist worker). Read it; copy it before changing it."""
    import time
    _shared_run_start()                      # started already, unless collected without it
    folder = _shared_run_folder()
    deadline = time.monotonic() + QUICK_RUN_WAIT_S
    while not (folder / "rc").exists():
        assert time.monotonic() < deadline, f"the shared quick run took over {QUICK_RUN_WAIT_S} s"
        time.sleep(0.2)
    log = (folder / "console.log").read_text(errors="replace")
    assert (folder / "rc").read_text().strip() == "0", log[-4000:]
    return folder / "run"
