"""The backward judged as the forward is: each gradient's error budget, its finding, the backward
mistakes the diagnosis names, and the controls with a right forward and a wrong backward."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from audit.analysis.findings import compute_findings
from audit.core.grid import Case
from audit.core.records import to_frame
from audit.execute import runner
from audit.measure.cell import cellcache
from audit.measure.diagnosis.diagnosis import attempt_for, diagnose_grads
from audit.measure.golden.numerics import GRAD_BUDGET_FACTOR, budget_bound
from audit.workload import presets
from audit.workload.backward_mistakes import BACKWARD_MISTAKES, backward_of
from audit.workload.inputs import make_inputs

from tests.helpers import platform_skipped

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds

PLUGINS = Path(__file__).resolve().parent / "plugins"
PRESET = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0, max_cell_s=None,
                        energy_window_s=0.0)


@pytest.fixture(scope="module")
def plugin_run():
    """The issue's three kernels (tests/plugins/backward.py: SDPA's forward, a custom backward)
    beside sdpa: fp32 and bf16, d 32, T 128, heads 4, kv_heads 4 and 2, causal and not."""
    sys.path.insert(0, str(PLUGINS))
    try:
        cases = [Case(v, "cpu", dtype, 32, 128, 1, 4, causal, "normal", kv)
                 for v in ("backward:correct", "backward:zero_dq", "backward:half_dk", "sdpa")
                 for dtype in ("fp32", "bf16") for kv in (None, 2) for causal in (False, True)]
        cache = cellcache.InputCache()
        recs = [runner.run_cell(c, cache, PRESET, {}) for c in cases]
    finally:
        sys.path.remove(str(PLUGINS))
    # cells torch refuses on this machine (bf16 SDPA's packing under ATEN_CPU_CAPABILITY=default or avx2 on
    # an AMX CPU): skipped with torch's words; the others must run, fp32 everywhere
    recs = [r for r in recs if not platform_skipped(r)]
    assert all(r["status"] == "ok" for r in recs), [r["reason"] for r in recs]
    assert len(recs) == len(cases) or {r["dtype"] for r in recs} == {"fp32"}
    return recs, compute_findings(to_frame(recs))


def test_a_right_backward_is_within_every_gradient_budget(plugin_run):
    recs, found = plugin_run
    for r in recs:
        if r["variant"] in ("backward:correct", "sdpa"):
            assert [r[f"{g}_within_budget"] for g in ("dq", "dk", "dv")] == [True] * 3, r["id"]
            assert r["grad_diagnosis"] is None
    assert not [f for f in found if f["variant"] in ("backward:correct", "sdpa")], found


@pytest.mark.parametrize("variant, grad, mistake", [("backward:zero_dq", "dq", "dq_zeroed"),
                                                    ("backward:half_dk", "dk", "dk_scaled")])
def test_a_wrong_gradient_is_an_error_naming_it_and_its_mistake(plugin_run, variant, grad, mistake):
    recs, found = plugin_run
    mine = [r for r in recs if r["variant"] == variant]
    for r in mine:                                   # only the wrong gradient is outside its budget
        assert {g: r[f"{g}_within_budget"] for g in ("dq", "dk", "dv")} == \
            {g: g != grad for g in ("dq", "dk", "dv")}, r["id"]
        assert r[f"{grad}_err_ratio"] > 50 and r["grad_diagnosis"] == mistake, (r["id"], r["grad_diagnosis"])
    (finding,) = [f for f in found if f["variant"] == variant]
    assert finding["check"] == "grad_error_budget" and finding["severity"] == "error"
    assert sorted(finding["cells"]) == sorted(r["id"] for r in mine)
    assert len(mine) == 8 or {r["dtype"] for r in mine} == {"fp32"}   # bf16 refused here: fp32's 4
    assert f"{grad} in {len(mine)} cell(s)" in finding["message"]
    others = {"dq", "dk", "dv"} - {grad}
    assert not any(f"{g} in " in finding["message"] for g in others)
    assert finding["diagnosis"] == mistake and BACKWARD_MISTAKES[mistake].title in finding["message"]


def test_gradients_that_are_not_finite_are_the_nonfinite_checks_not_judged_by_the_budget():
    """eager on a fully masked row: NaN gradients; the budget leaves them to `nonfinite`."""
    rec = runner.run_cell(Case("eager", "cpu", "fp32", 16, 32, 1, 2, False, "fully_masked_bool"),
                          cellcache.InputCache(), PRESET, {})
    assert rec["grad_nan"] > 0
    assert [rec[f"{g}_within_budget"] for g in ("dq", "dk", "dv")] == [None] * 3
    sdpa = runner.run_cell(Case("sdpa", "cpu", "fp32", 16, 32, 1, 2, False, "fully_masked_bool"),
                           cellcache.InputCache(), PRESET, {})
    assert [sdpa[f"{g}_within_budget"] for g in ("dq", "dk", "dv")] == [True] * 3    # judged, and right


def test_a_row_that_sees_no_key_gets_no_upstream_gradient():
    inputs = make_inputs(Case("eager", "cpu", "fp32", 16, 32, 2, 2, True, "left_padding"))
    seeing = (inputs.visible & torch.ones(32, 32, dtype=torch.bool).tril()).any(-1)     # (B, 1, Tq)
    assert bool((~seeing).any()) and bool(seeing.any())
    assert (inputs.grad_out[(~seeing).expand(2, 2, 32)] == 0).all()
    assert (inputs.grad_out[seeing.expand(2, 2, 32)] != 0).all()


# --------------------------------------------------------------------------- the backward mistakes

# An implementation that makes each mistake: the float32 backward with that override (or a
# gradient scaled by a factor a fit must find).
MADE = {"dq_zeroed": {}, "dk_zeroed": {}, "dv_zeroed": {}, "dq_scale_missing": {}, "dq_scale_twice": {},
        "dk_scale_missing": {}, "dk_scale_twice": {}, "rowsum_d_missing": {}, "gqa_grad_one_head": {},
        "backward_mask_ignored": {}, "backward_causal_ignored": {}, "dq_scaled": {"dq": 0.5},
        "dk_scaled": {"dk": 3.0}, "dv_scaled": {"dv": 0.7}}


def _attempt(dtype: torch.dtype):
    """GQA (4 query heads on 2), causal, key padding: a cell where every mistake can differ."""
    inputs = make_inputs(Case("eager", "cpu", "fp32", 16, 48, 2, 4, True, "padding", 2))
    a = attempt_for(inputs, [0, 1], [0, 1, 2, 3])
    g = inputs.grad_out.double()
    if dtype != torch.float64:
        a.q, a.k, a.v = (t.to(dtype) for t in (a.q, a.k, a.v))
        g = g.to(dtype)
    a.grad_out = g
    return a


def _made(name: str, a) -> dict:
    """The float32 gradients of an implementation making `name`."""
    if name in ("dq_scaled", "dk_scaled", "dv_scaled"):
        grads = backward_of(a)
        (g, factor), = MADE[name].items()
        grads[g] = grads[g] * factor
        return grads
    return BACKWARD_MISTAKES[name].fn(a)


def test_every_backward_mistake_has_an_implementation_here():
    assert set(MADE) == set(BACKWARD_MISTAKES)


@pytest.mark.parametrize("name", sorted(MADE))
def test_each_backward_mistake_is_named_on_an_implementation_that_makes_it_and_only_there(name):
    exact, low = _attempt(torch.float64), _attempt(torch.float32)
    golden = backward_of(exact)
    right32 = {g: t.double() for g, t in backward_of(low).items()}
    tol = {g: budget_bound(math.sqrt(float(((right32[g] - golden[g]) ** 2).mean())), "fp32", GRAD_BUDGET_FACTOR[g])
           for g in golden}
    made = {g: t.double() for g, t in _made(name, low).items()}
    exact.observed_grads = made
    found = diagnose_grads(exact, golden, made, tol)
    assert found.name == name, (found.name, {k: v[1] for k, v in found.scores.items() if v[1]})
    exact.observed_grads = right32                               # the right backward: nothing
    assert diagnose_grads(exact, golden, right32, tol).name == "none"


# --------------------------------------------------------------------------- the controls

@pytest.mark.parametrize("control, mistake", [("broken.backward_rowsum_d_missing", "rowsum_d_missing"),
                                              ("broken.backward_dq_scale_missing", "dq_scale_missing")])
def test_a_control_with_a_wrong_backward_is_flagged_by_the_gradient_budget_alone_and_named(control, mistake):
    cases = [Case(control, "cpu", dtype, 32, 64, 1, 4, causal, "normal", 2)
             for dtype in ("fp32", "bf16") for causal in (False, True)]
    cache = cellcache.InputCache()
    recs = [runner.run_cell(c, cache, PRESET, {}) for c in cases]
    assert all(r["status"] == "ok" and r["within_budget"] is True for r in recs), recs   # its forward is right
    errors = [f for f in compute_findings(to_frame(recs)) if f["severity"] == "error"]
    assert [f["check"] for f in errors] == ["grad_error_budget"], errors
    assert errors[0]["diagnosis"] == mistake and sorted(errors[0]["cells"]) == sorted(c.id for c in cases)


# --------------------------------------------------------------------------- gradients of a forward mistake

def _grads_of(fn, inputs):
    """(out, (dq, dk, dv)) of fn on the cell's inputs under its upstream gradient."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    out = fn(q, k, v, **inputs.call_kwargs())
    return out.detach(), torch.autograd.grad(out, (q, k, v), inputs.grad_out)


@pytest.mark.parametrize("mistake, causal", [("document_keys_end_inclusive", False),
                                             ("document_keys_end_inclusive", True),
                                             ("causal_next_key", True), ("scale_missing", False)])
def test_gradients_that_are_the_forward_mistakes_own_are_named_by_it(mistake, causal):
    """A kernel whose forward makes a mistake and whose backward differentiates what it computed: no
    backward mistake explains its gradients, the forward's does. Gradients of another making
    (the forward's mistake, the right attention's gradients doubled) are not named by it."""
    from audit.measure.diagnosis.diagnosis import diagnose_grads_as_forward, diagnose_grads_cell
    sys.path.insert(0, str(PLUGINS))
    try:
        import mistaken
    finally:
        sys.path.remove(str(PLUGINS))
    scenario = "packed" if mistake.startswith("document") else "normal"
    case = Case("x", "cpu", "fp32", 16, 32, 2, 2, causal, scenario)
    inputs = make_inputs(case)
    ref = cellcache.build_reference(case, inputs)
    made = getattr(mistaken, mistake)
    out, grads = _grads_of(made, inputs)
    columns, evidence = diagnose_grads_cell(grads, inputs, ref, "fp32")
    assert columns["grad_diagnosis"] == "none"
    if mistake == "document_keys_end_inclusive" and causal:      # causal hides the extra key: nothing wrong
        assert diagnose_grads_as_forward(evidence, inputs, ref, "fp32", mistake, out) is None
        return
    named = diagnose_grads_as_forward(evidence, inputs, ref, "fp32", mistake, out)
    assert named is not None and named["grad_diagnosis"] == mistake
    assert named["grad_diagnosis_err"] < named["grad_diagnosis_golden_err"]

    def other(q, k, v, **kw):         # the mistake's output, the right attention's gradients doubled
        right = mistaken.correct(q, k, v, **kw)
        return made(q, k, v, **kw).detach() + 2.0 * (right - right.detach())
    out2, grads2 = _grads_of(other, inputs)
    _, evidence2 = diagnose_grads_cell(grads2, inputs, ref, "fp32")
    assert diagnose_grads_as_forward(evidence2, inputs, ref, "fp32", mistake, out2) is None
