"""Sliding windows handed as an argument (call form "window"): a kernel of gpt-oss's call form (sinks,
causal, window_size, no mask) gets ok sinks-window cells with its window and sinks honoured; a kernel
whose window reads one key too far is named as that member of the window-bounds family; the window
conversions of audit.adapt; the controls caught."""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

from audit.core.errors import Unsupported, UsageError
from audit.core.grid import Case

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"
DTYPES = ("fp32", "bf16", "fp16")


def _run(cases):
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets
    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
    cache = cellcache.InputCache()
    return [runner.run_cell(c, cache, preset, {}) for c in cases]


@pytest.fixture(scope="module")
def window_run():
    """The declared sink kernels (right, and with its window's left bound one key too far) on the sinks
    window cells, and the window controls on sliding-window cells, in each dtype, causal or not."""
    sys.path.insert(0, str(PLUGINS))
    try:
        cases = [Case(v, "cpu", dtype, 16, 32, 1, 4, causal, "sinks_window", 2) for dtype in DTYPES
                 for causal in (False, True)
                 for v in ("declared:sink_kernel", "declared:sink_kernel_window_inclusive")]
        cases += [Case(v, "cpu", dtype, 16, 32, 1, 2, causal, "sliding_window") for dtype in DTYPES
                  for causal in (False, True)
                  for v in ("broken.window_ignored", "broken.window_left_inclusive", "declared:flash")]
        return _run(cases)
    finally:
        sys.path.remove(str(PLUGINS))


def _of(records, variant):
    mine = [r for r in records if r["variant"] == variant]
    assert len(mine) == 6 and {r["dtype"] for r in mine} == set(DTYPES)
    return mine


def test_a_sink_kernel_of_gpt_oss_call_form_gets_ok_sinks_window_cells(window_run):
    from audit.analysis.findings import compute_findings
    from audit.core.records import to_frame
    mine = _of(window_run, "declared:sink_kernel")
    assert all(r["status"] == "ok" and r["within_budget"] and r["lse_within_budget"] for r in mine), [
        (r["id"], r["status"], r["reason"]) for r in mine]
    assert all(r["arguments"] == {"sinks": "honoured", "window": "honoured"} for r in mine)
    # a half of the keys would move a window handed as an argument: no merge, and the reason says why
    assert all(r["merge_err"] is None and "window is handed as an argument" in r["reason"] for r in mine)
    found = compute_findings(to_frame(mine))
    assert [f for f in found if f["severity"] != "info"] == []


def test_a_window_one_key_too_far_is_named_as_that_family_member_in_every_dtype(window_run):
    for variant in ("declared:sink_kernel_window_inclusive", "broken.window_left_inclusive"):
        mine = _of(window_run, variant)
        assert all(r["status"] == "ok" and r["within_budget"] is False for r in mine)
        assert {r["diagnosis"] for r in mine} == {"window_left_inclusive"}, [(r["id"], r["diagnosis"]) for r in mine]


def test_a_kernel_dropping_its_window_is_caught_by_the_window_probe(window_run):
    mine = _of(window_run, "broken.window_ignored")
    assert all(r["arguments"] == {"window": "ignored"} for r in mine)


def test_flash_attn_declared_with_its_window_size_runs_sliding_window_cells_by_it(window_run):
    mine = _of(window_run, "declared:flash")
    assert all(r["status"] == "ok" and r["within_budget"] for r in mine), [(r["id"], r["reason"]) for r in mine]
    assert all(r["arguments"] == {"window": "honoured"} for r in mine)


def test_a_window_variant_gets_the_width_and_the_others_the_mask():
    from audit.workload.draws import window_size
    from audit.workload.inputs import make_inputs
    inputs = make_inputs(Case("eager", "cpu", "fp32", 16, 32, 1, 2, True, "sliding_window"))
    assert inputs.window == window_size(32) == 8
    windowed = inputs.call_kwargs(("window",))
    assert windowed["window"] == 8 and windowed["mask"] is None
    dense = inputs.call_kwargs(())
    assert "window" not in dense and dense["mask"] is inputs.mask
    assert make_inputs(Case("eager", "cpu", "fp32", 16, 32, 1, 2, True, "padding")).window is None


@pytest.mark.parametrize("form, causal, want", [
    ("left_right", False, (7, 7)), ("left_right", True, (7, 0)),
    ("left", True, 7), ("width", True, 8),
])
def test_adapt_hands_the_window_in_the_declared_form(form, causal, want):
    import audit
    seen = {}

    def kernel(q, k, v, causal=False, window=None):
        seen["window"] = window
        return q

    plugin = audit.adapt(kernel, window_arg="window", window_form=form, scale_arg=None)
    q = torch.zeros(1, 2, 32, 8)
    plugin(q, q, q, causal=causal, window=8)
    assert seen["window"] == want
    assert "window" in plugin.audit_supports


@pytest.mark.parametrize("form", ["left", "width"])
def test_a_one_sided_window_form_refuses_a_two_sided_window(form):
    import audit
    plugin = audit.adapt(lambda q, k, v, causal=False, w=None: q, window_arg="w", window_form=form, scale_arg=None)
    q = torch.zeros(1, 2, 32, 8)
    with pytest.raises(Unsupported, match="two-sided"):
        plugin(q, q, q, causal=False, window=8)


def test_a_kernel_without_a_window_argument_refuses_the_window_and_a_bad_form_is_named():
    import audit
    plugin = audit.adapt(lambda q, k, v, causal=False: q, scale_arg=None)
    q = torch.zeros(1, 2, 32, 8)
    with pytest.raises(Unsupported, match="window_arg"):
        plugin(q, q, q, window=8)
    with pytest.raises(UsageError, match="window_form='both'.*left_right"):
        audit.adapt(lambda q, k, v: q, window_arg="w", window_form="both")


def test_the_window_family_moves_the_bounds_it_names_and_only_those():
    """Each member's keys differ from the window's by exactly the keys it names; on causal cells the
    right-end members are not applicable (causal masking hides them)."""
    from audit.measure.diagnosis.diagnosis import attempt_for
    from audit.workload.inputs import make_inputs
    from audit.workload.mistake_base import MISTAKES, family_members
    assert family_members("window_bounds") == ["window_left_inclusive", "window_left_short", "window_right_inclusive",
                                               "window_right_short", "window_both_inclusive"]
    inputs = make_inputs(Case("eager", "cpu", "fp32", 16, 32, 1, 2, False, "sliding_window"))
    a = attempt_for(inputs, [0], [0, 1])
    right = a.attend()
    for name in family_members("window_bounds"):
        assert not torch.allclose(MISTAKES[name].fn(a), right), name
    causal = attempt_for(make_inputs(Case("eager", "cpu", "fp32", 16, 32, 1, 2, True, "sliding_window")), [0], [0])
    assert [n for n in family_members("window_bounds") if MISTAKES[n].fn(causal) is not None] == [
        "window_left_inclusive", "window_left_short"]
    assert MISTAKES["window_left_inclusive"].fn(attempt_for(make_inputs(Case("eager", "cpu", "fp32", 16, 32, 1, 2,
                                                                              False, "padding")), [0], [0])) is None


def test_the_docs_declare_the_sink_kernel_as_the_tested_plugin_does():
    pattern = r"^(sink_kernel = audit\.adapt\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\))"
    docs = [re.sub(r"\s+", " ", d) for d in re.findall(pattern, (ROOT / "docs" / "variants.md").read_text(), re.M)]
    tested = [re.sub(r"\s+", " ", d) for d in re.findall(pattern, (PLUGINS / "declared.py").read_text(), re.M)]
    assert len(tested) == 1 and docs == tested, (docs, tested)
