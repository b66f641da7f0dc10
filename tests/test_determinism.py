"""Run-to-run determinism: the repeat columns, the nondeterministic and deterministic_mode
findings and --deterministic (the finding's reproduction script: tests/test_repro.py, whose
fault run holds the racy plug-in).

The nondeterministic plug-in (tests/plugins/racy.py) sums key blocks in a fresh random order
per call, as atomic adds do on a GPU; `ordered` is the same code in a fixed order.
"""
from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import torch

from audit.analysis.findings import compute_findings
from audit.core.grid import Case
from audit.measure.cell.repeats import Repeats, bitwise_equal, largest_difference, refuses_determinism

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds

RACY, ORDERED, STUBBORN = "tests.plugins.racy:racy", "tests.plugins.racy:ordered", "tests.plugins.racy:stubborn"
VARIANTS = (RACY, ORDERED, STUBBORN, "eager", "sdpa")


def _cells(deterministic: bool) -> dict[tuple[str, str, bool], dict]:
    """One record per (variant, scenario, causal), fp32, made in this process by run_cell."""
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets

    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0,
                                 deterministic=deterministic)
    cache = cellcache.InputCache()
    got = {}
    for scenario in ("normal", "padding"):
        for causal in (False, True):
            for name in VARIANTS:
                case = Case(name, "cpu", "fp32", 16, 32, 1, 2, causal, scenario)
                got[name, scenario, causal] = runner.run_cell(case, cache, preset, {})
    return got


@pytest.fixture(scope="module")
def plain() -> dict:
    return _cells(deterministic=False)


@pytest.fixture(scope="module")
def deterministic() -> dict:
    before = torch.are_deterministic_algorithms_enabled()
    try:
        return _cells(deterministic=True)
    finally:
        assert torch.are_deterministic_algorithms_enabled() == before   # run_cell restores the mode


def _of(cells: dict, name: str) -> list[dict]:
    return [r for (v, _, _), r in cells.items() if v == name]


def test_a_racy_kernel_differs_between_runs_and_deterministic_ones_do_not(plain):
    for (name, scenario, _), rec in plain.items():
        if name not in (RACY, STUBBORN):
            continue
        assert rec["status"] == "ok", rec["reason"]
        assert rec["repeat_runs"] == 3
        assert rec["repeat_differs"], rec        # which ones depends on the orders drawn
        if scenario == "normal":                 # every key block adds to every row: all of them
            assert rec["repeat_differs"] == ["out", "dq", "dk", "dv"], rec["repeat_differs"]
        assert 0 < rec["repeat_max_diff"] < 1e-4
        assert rec["deterministic_algorithms"] is False
    for name in (ORDERED, "eager", "sdpa"):
        for rec in _of(plain, name):
            assert rec["status"] == "ok", rec["reason"]
            assert (rec["repeat_runs"], rec["repeat_differs"], rec["repeat_max_diff"]) == (3, [], 0.0), name


def test_the_finding_names_the_nondeterministic_variants_and_what_differs(plain):
    found = compute_findings(pd.DataFrame(list(plain.values())))
    nondet = {f["variant"]: f for f in found if f["check"] == "nondeterministic"}
    assert set(nondet) == {RACY, STUBBORN}
    assert nondet[RACY]["severity"] == "warning"
    assert "out, dq, dk, dv differ" in nondet[RACY]["message"] and "in 4 of 4 cell(s)" in nondet[RACY]["message"]
    assert not any(f["check"] == "deterministic_mode" for f in found)      # no --deterministic here


def test_run_to_run_noise_is_not_reported_as_a_leak(plain):
    """The racy kernel's output changes between any two calls; the leak check must not call that a
    leak (its leak_max_change is at rounding level, its repeat_max_diff likewise)."""
    racy = [r for r in _of(plain, RACY) if r["leak_max_change"]]
    assert racy, "the fixture has causal and padding cells, whose leak check ran"
    found = compute_findings(pd.DataFrame(list(plain.values())))
    assert not [f for f in found if f["check"] == "masked_leakage" and f["variant"] == RACY]
    # ... while a real leak, far above the noise, is still one
    leaky = dict(racy[0], variant="leaky", id="leaky-cell", leak_max_change=0.5)
    found = compute_findings(pd.DataFrame(list(plain.values()) + [leaky]))
    assert [f for f in found if f["check"] == "masked_leakage" and f["variant"] == "leaky"]


def test_deterministic_mode_makes_racy_deterministic_and_records_who_refuses(deterministic):
    for rec in _of(deterministic, RACY) + _of(deterministic, ORDERED) + _of(deterministic, "eager"):
        assert rec["status"] == "ok", rec["reason"]
        assert rec["deterministic_algorithms"] is True and rec["deterministic_refused"] is False
        assert rec["repeat_differs"] == []
    for rec in _of(deterministic, STUBBORN):
        assert rec["status"] == "skipped" and rec["deterministic_refused"] is True
        assert rec["reason"].startswith("refuses torch.use_deterministic_algorithms(True)"), rec["reason"]
        assert rec["repeat_differs"] is None
    found = compute_findings(pd.DataFrame(list(deterministic.values())))
    mode = [f for f in found if f["check"] == "deterministic_mode"]
    assert len(mode) == 1 and mode[0]["severity"] == "warning"
    text = mode[0]["message"]
    assert f"refuse (an operation has no deterministic implementation): {STUBBORN}" in text
    assert f"bitwise identical across runs: eager, sdpa, {ORDERED}, {RACY}" in text
    assert not any(f["check"] == "nondeterministic" for f in found)


def test_a_cell_that_fails_otherwise_under_deterministic_mode_is_an_error():
    assert refuses_determinism(RuntimeError("x does not have a deterministic implementation, but you set "
                                            "'torch.use_deterministic_algorithms(True)'"))
    assert not refuses_determinism(RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED (deterministic)"))
    assert not refuses_determinism(ValueError("use_deterministic_algorithms"))


def test_bitwise_comparison_tells_nan_and_signed_zero_apart_and_measures_the_difference():
    a = torch.tensor([1.0, float("nan"), 0.0])
    assert bitwise_equal(a, a.clone())
    assert not bitwise_equal(a, torch.tensor([1.0, float("nan"), -0.0]))
    assert not bitwise_equal(a, torch.tensor([1.0 + 2**-20, float("nan"), 0.0]))
    assert largest_difference(a, torch.tensor([1.5, float("nan"), 0.0])) == 0.5
    assert largest_difference(a, torch.tensor([1.0, 2.0, 0.0])) == math.inf
    rep = Repeats()
    assert rep.columns() == {"repeat_runs": None, "repeat_differs": None, "repeat_max_diff": None}
    for t in (a, a.clone(), torch.tensor([1.25, float("nan"), 0.0])):
        rep.add("out", t)
    assert rep.columns() == {"repeat_runs": 3, "repeat_differs": ["out"], "repeat_max_diff": 0.25}
