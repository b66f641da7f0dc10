"""`make test` runs the tests that time nothing on pytest-xdist workers with `--dist loadgroup`: the
tests of a module using a module-scoped fixture must reach one worker, or each worker builds the
fixture (conftest.py: _suffix_group; pytest 9.2 with xdist 3.8 ignored the groups silently)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = '''
import os, pytest

@pytest.fixture(scope="module")
def built():
    return os.getpid()

@pytest.mark.parametrize("i", range(6))
def test_shares(built, i):
    with open("seen.txt", "a") as f:
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER')} {built}\\n")
'''


def test_a_module_fixtures_tests_reach_one_worker(tmp_path):
    pytest.importorskip("xdist")
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "conftest.py").write_text(      # the project's hook, under another module name
        f"import importlib.util, sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        f"spec = importlib.util.spec_from_file_location('project_conftest', {str(ROOT / 'conftest.py')!r})\n"
        "project = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(project)\n"
        "pytest_collection_modifyitems = project.pytest_collection_modifyitems\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
                           "-p", "no:cacheprovider", "test_probe.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    seen = (tmp_path / "seen.txt").read_text().split("\n")[:-1]          # "<worker> <fixture's pid>" a test
    assert len(seen) == 6 and len(set(seen)) == 1, seen
