"""Fixtures shared by the suites: the selected preset's cells, audited once per session."""
from __future__ import annotations

import pytest

from audit import grid, records


def selected_preset(config) -> grid.Preset:
    name = config.getoption("--audit-preset")
    table = grid.presets()
    if name not in table:
        raise pytest.UsageError(f"--audit-preset: unknown preset {name!r}; allowed: {', '.join(table)}")
    return table[name]


def selected_cases(config) -> list[grid.Case]:
    """The preset's cells, narrowed by the --audit-* axis filters."""
    from audit import variants

    overrides = {axis: config.getoption(f"--audit-{axis.replace('_', '-')}") for axis in grid.AXES}
    overrides = {k: v for k, v in overrides.items() if v}
    return grid.preset_cases(selected_preset(config), overrides, known_variant=variants.check_name)


@pytest.fixture(scope="session")
def audited_run(request, tmp_path_factory):
    """Run the selected cells once through the audit runner: (run_dir, {id: record}, findings)."""
    from audit import runner
    from audit.findings import write_findings
    from audit.telemetry import environment

    preset = selected_preset(request.config)
    cases = selected_cases(request.config)
    run_dir = tmp_path_factory.mktemp("audit-run")
    env = environment()
    runner.write_run_file(run_dir, preset, {}, ["pytest"], env, len(cases))
    runner.run_grid(cases, run_dir, preset, env, progress=False)
    found = write_findings(run_dir)
    return run_dir, {r["id"]: r for r in records.read_records(run_dir)}, found
