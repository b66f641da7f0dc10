"""Fixtures shared by the suites: the selected preset's cells, audited once per session."""
from __future__ import annotations

import json

import pytest

from audit.core import grid, records
from audit.workload import presets


def selected_preset(config) -> presets.Preset:
    name = config.getoption("--audit-preset")
    table = presets.presets()
    if name not in table:
        raise pytest.UsageError(f"--audit-preset: unknown preset {name!r}; allowed: {', '.join(table)}")
    return table[name]


def selected_cases(config) -> list[grid.Case]:
    """The preset's cells, narrowed by the --audit-* axis filters."""
    from audit.workload import variants

    overrides = {axis: config.getoption(f"--audit-{axis.replace('_', '-')}") for axis in grid.AXES}
    overrides = {k: v for k, v in overrides.items() if v}
    return presets.preset_cases(selected_preset(config), overrides, known_variant=variants.check_name)


@pytest.fixture(scope="session", autouse=True)
def pinned_allocator():
    """Benchmarks in this process see the same allocator behaviour as `audit run` (memory.py)."""
    from audit.measure.machine.memory import pin_malloc_threshold
    return pin_malloc_threshold()


def _cli_overrides(config) -> list[str]:
    args = []
    for axis in grid.AXES:
        values = config.getoption(f"--audit-{axis.replace('_', '-')}")
        if values:
            args += [f"--{axis.replace('_', '-')}", *map(str, values)]
    return args


@pytest.fixture(scope="session")
def audited_run(request, default_suite_grid, tmp_path_factory):
    """The selected cells, audited once: (run_dir, {id: record}, findings). The default
    selection (the quick preset, no --audit-* filter) is the session's shared quick run
    (conftest.py: quick_run); any other is run here the same way, through the CLI in a
    subprocess (a native crash in one cell is isolated as that cell's error record), with no
    time budget, so no cell of the contract is skipped for time."""
    import subprocess
    import sys
    from pathlib import Path

    overrides = _cli_overrides(request.config)
    preset = selected_preset(request.config).name
    if default_suite_grid:
        run_dir = request.getfixturevalue("quick_run")
    else:
        run_dir = tmp_path_factory.mktemp("audit-run")
        cmd = [sys.executable, "-m", "audit", "run", "--preset", preset, *overrides, "--budget", "none",
               "--out", str(run_dir), "--no-progress"]
        done = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads((run_dir / "findings.json").read_text())
    return run_dir, {r["id"]: r for r in records.read_records(run_dir)}, found
