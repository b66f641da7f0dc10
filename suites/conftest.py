"""Fixtures shared by the suites: the selected preset's cells, audited once per session."""
from __future__ import annotations

import pytest

from audit import grid, presets, records


def selected_preset(config) -> presets.Preset:
    name = config.getoption("--audit-preset")
    table = presets.presets()
    if name not in table:
        raise pytest.UsageError(f"--audit-preset: unknown preset {name!r}; allowed: {', '.join(table)}")
    return table[name]


def selected_cases(config) -> list[grid.Case]:
    """The preset's cells, narrowed by the --audit-* axis filters."""
    from audit import variants

    overrides = {axis: config.getoption(f"--audit-{axis.replace('_', '-')}") for axis in grid.AXES}
    overrides = {k: v for k, v in overrides.items() if v}
    return presets.preset_cases(selected_preset(config), overrides, known_variant=variants.check_name)


@pytest.fixture(scope="session", autouse=True)
def pinned_allocator():
    """Benchmarks in this process see the same allocator behaviour as `audit run` (memory.py)."""
    from audit.memory import pin_malloc_threshold
    return pin_malloc_threshold()


def _cli_overrides(config) -> list[str]:
    args = []
    for axis in grid.AXES:
        values = config.getoption(f"--audit-{axis.replace('_', '-')}")
        if values:
            args += [f"--{axis.replace('_', '-')}", *map(str, values)]
    return args


@pytest.fixture(scope="session")
def audited_run(request, tmp_path_factory):
    """Audit the selected cells once, through the CLI in a subprocess (so a native crash
    in one cell is isolated as that cell's error record): (run_dir, {id: record}, findings)."""
    import subprocess
    import sys
    from pathlib import Path

    from audit.findings import write_findings

    run_dir = tmp_path_factory.mktemp("audit-run")
    cmd = [sys.executable, "-m", "audit", "run", "--preset", selected_preset(request.config).name,
           *_cli_overrides(request.config), "--out", str(run_dir), "--no-progress", "--no-report"]
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    found = write_findings(run_dir)
    return run_dir, {r["id"]: r for r in records.read_records(run_dir)}, found
