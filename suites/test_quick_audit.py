"""The audit of a preset's grid as pytest: every cell measured once, then checked.

Runs the grid in-process into a temporary run folder (one fixture for the
session), then asserts per cell: a status with a reason, finite outputs and
gradients, error against float64 within the dtype's tolerance, and sane
measurements; finally that the report renders from the records.
"""
from __future__ import annotations

import math

import pytest

from audit import grid, records

# rel_err (Frobenius, vs float64) allowed per dtype for correct variants on N(0,1) inputs.
REL_TOL = {"fp32": 1e-5, "bf16": 3e-2, "fp16": 5e-3}


def _preset(config) -> grid.Preset:
    name = config.getoption("--audit-preset")
    table = grid.presets()
    if name not in table:
        raise pytest.UsageError(f"--audit-preset: unknown preset {name!r}; allowed: {', '.join(table)}")
    return table[name]


def _cases(config) -> list[grid.Case]:
    preset = _preset(config)
    from audit import variants
    return grid.expand(grid.validate_axes(preset.axes, known_variant=variants.check_name))


def pytest_generate_tests(metafunc):
    if "cell_id" in metafunc.fixturenames:
        ids = [c.id for c in _cases(metafunc.config)]
        metafunc.parametrize("cell_id", ids, ids=ids)


@pytest.fixture(scope="session")
def audited_run(request, tmp_path_factory):
    """Run the preset's grid once; return (run_dir, {id: record})."""
    from audit import runner
    from audit.telemetry import environment

    preset = _preset(request.config)
    run_dir = tmp_path_factory.mktemp("audit-run")
    cases = _cases(request.config)
    env = environment()
    runner.write_run_file(run_dir, preset, {}, ["pytest"], env, len(cases))
    runner.run_grid(cases, run_dir, preset, env, progress=False)
    return run_dir, {r["id"]: r for r in records.read_records(run_dir)}


def test_cell(audited_run, cell_id):
    _, by_id = audited_run
    rec = by_id[cell_id]
    assert rec["status"] in records.STATUSES
    if rec["status"] != "ok":
        assert rec["reason"], f"{cell_id}: status {rec['status']} without a reason"
        assert rec["status"] == "skipped", f"{cell_id}: {rec['status']}: {rec['reason']}"
        return
    assert rec["out_nan"] == rec["out_inf"] == 0, f"{cell_id}: non-finite output"
    assert rec["grad_nan"] == rec["grad_inf"] == 0, f"{cell_id}: non-finite gradients"
    assert rec["rel_err"] <= REL_TOL[rec["dtype"]], f"{cell_id}: rel_err {rec['rel_err']:.3g}"
    for col in ("fwd_ms", "fwd_bwd_ms", "gflops_per_s"):
        assert rec[col] > 0 and math.isfinite(rec[col]), f"{cell_id}: {col}={rec[col]}"
    assert rec["fwd_n"] >= 1 and len(rec["fwd_samples_s"]) == rec["fwd_n"]


def test_every_cell_recorded_once(audited_run, request):
    run_dir, by_id = audited_run
    lines = (run_dir / records.RECORDS_FILE).read_text().splitlines()
    assert len(lines) == len(by_id) == len(_cases(request.config))


def test_report_renders(audited_run):
    from audit.report import build_report

    run_dir, _ = audited_run
    paths = build_report(run_dir)
    assert len(paths["figures"]) >= 6
    text = paths["index_md"].read_text()
    for fig in paths["figures"]:
        assert fig.name in text
