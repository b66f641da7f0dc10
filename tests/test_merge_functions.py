"""Functions that merge partial attention, audited on real splits and edge states (measure/merging):
the reference is right on every state, each negative control is caught and named by its own mistake,
merges declared in FlashInfer's and vLLM's call forms are judged as written, and torch's
context-parallel merge is audited as it ships."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from audit.core.diagnosis_names import members
from audit.core.errors import UsageError
from audit.measure.merging.judge import audit_merge, audit_merges, outcome_of
from audit.measure.merging.states import EDGES, SPLITS, all_states, build_state
from audit.workload.merge_functions import declare_merge, merge_partials
from audit.workload.merges import CONTROL_PREFIX, builtin_merges
from tests.helpers import skip_without_torch_merger
from tests.plugins.merge_standins import merge_attn_states, merge_state, merge_state_nan_on_empty
from audit.workload.merge_mistakes import MERGE_MISTAKES

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds


@pytest.fixture(scope="module")
def states():
    return all_states()


def _by_state(records):
    return {(r["state"], r["dtype"]): r for r in records}


def test_every_state_has_its_parts_and_a_golden_with_empty_rows_where_it_says(states):
    names = {s.name for s in states}
    assert names == {s.name for s in SPLITS + EDGES}
    both = next(s for s in states if s.name == "both_empty" and s.dtype == "fp32")
    assert (both.golden[1] == -math.inf).sum() == 8 and both.golden[0][both.golden[1] == -math.inf].abs().max() == 0
    posinf = next(s for s in states if s.name == "posinf_empty")
    assert (posinf.parts[0][1] == math.inf).any() and not (posinf.parts[0][1] == -math.inf).any()
    far = next(s for s in states if s.name == "far_apart")
    assert float(far.parts[1][1].min() - far.parts[0][1].max()) > 88.7          # past float32's exp
    assert all(p[1].dtype == torch.float32 for s in states for p in s.parts)
    assert {str(s.parts[0][0].dtype) for s in states} == {"torch.float32", "torch.bfloat16", "torch.float16"}


def test_the_reference_merge_is_right_on_every_state_values_and_gradients(states):
    records = audit_merges({"reference": builtin_merges()["reference"]}, states)
    assert [(r["state"], r["dtype"], r["outcome"]) for r in records if r["outcome"] != "right"] == []
    assert [(r["state"], r["dtype"], r["grad_outcome"]) for r in records if r["grad_outcome"] != "right"] == []
    assert all(r["diagnosis"] == "none" and r["grad_diagnosis"] == "none" for r in records)


def test_a_merge_with_detached_weights_is_right_in_value_and_caught_by_its_gradient_alone(states):
    records = audit_merges({"d": builtin_merges()[CONTROL_PREFIX + "weights_detached"]}, states)
    assert all(r["outcome"] == "right" for r in records)
    assert all(r["grad_outcome"] == "wrong" for r in records if r["state"] in ("two_shards", "ring_4"))


def test_a_merge_written_into_a_tensor_is_not_differentiable_and_not_judged(states):
    rec = audit_merge(declare_merge(merge_attn_states, form="vllm"), states[0])
    assert rec["outcome"] == "right" and rec["grad_outcome"] == "not_differentiable" and rec["grad_max_err"] is None


@pytest.mark.parametrize("mistake", list(MERGE_MISTAKES))
def test_each_control_is_caught_and_named_by_its_own_mistake_wherever_it_is_wrong(states, mistake):
    records = audit_merges({mistake: builtin_merges()[CONTROL_PREFIX + mistake]}, states)
    wrong = [r for r in records if r["outcome"] != "right"]
    wrong_grads = [r for r in records if r["grad_outcome"] in ("nan", "wrong")]
    assert wrong or wrong_grads, f"{mistake}: right on every state, values and gradients, so nothing tests it"
    unnamed = [(r["state"], r["dtype"], r["diagnosis"]) for r in wrong if mistake not in members(r["diagnosis"])]
    unnamed += [(r["state"], r["dtype"], r["grad_diagnosis"]) for r in wrong_grads
                if mistake not in members(r["grad_diagnosis"])]
    assert unnamed == []


def test_a_chain_shows_the_lse_left_unupdated_in_the_output(states):
    """Right out for one merge, wrong in a chain: the next merge weighs the parts by the stale lse."""
    control = builtin_merges()[CONTROL_PREFIX + "lse_not_updated"]
    two = audit_merge(control, build_state(SPLITS[0], "fp32"))
    ring = audit_merge(control, build_state(SPLITS[1], "fp32"))
    assert two["max_abs_err"] <= two["out_tol"] and two["lse_max_err"] > two["lse_tol"]
    assert ring["max_abs_err"] > 100 * ring["out_tol"]


def test_the_rule_judges_nan_inf_wrong_and_right():
    base = {"out_nan_rows": 0, "lse_nan_rows": 0, "out_inf_rows": 0, "lse_inf_rows": 0, "max_abs_err": 0.0,
            "lse_max_err": 0.0, "empty_out_max": 0.0, "empty_lse_right": True}
    assert outcome_of(base, 1e-6, 1e-6) == "right"
    assert outcome_of({**base, "lse_nan_rows": 1}, 1e-6, 1e-6) == "nan"
    assert outcome_of({**base, "lse_inf_rows": 2}, 1e-6, 1e-6) == "inf"
    assert outcome_of({**base, "max_abs_err": 1e-3}, 1e-6, 1e-6) == "wrong"
    assert outcome_of({**base, "empty_lse_right": False}, 1e-6, 1e-6) == "wrong"    # (0, 0) for an empty row


# --------------------------------------------------------------------------- declared call forms

def test_a_flashinfer_merge_state_declared_as_its_docs_say_is_right_and_its_mistake_is_named(states):
    right = declare_merge(merge_state, form="flashinfer", name="merge_state")
    assert right.lse_base == "2"
    assert [r["state"] for r in audit_merges({"m": right}, states) if r["outcome"] != "right"] == []
    wrong = audit_merges({"m": declare_merge(merge_state_nan_on_empty, form="flashinfer")}, states)
    bad = {(r["state"], r["outcome"]) for r in wrong if r["outcome"] != "right"}
    assert ("both_empty", "nan") in bad and all(s in ("both_empty", "causal_fully_masked") for s, _ in bad)
    assert all("nan_on_empty" in members(r["diagnosis"]) for r in wrong if r["outcome"] != "right")


def test_a_merge_declared_in_the_wrong_base_is_caught():
    """The same right function declared with a natural-log lse: every merge of unequal lses is wrong."""
    wrong = declare_merge(merge_state, form="flashinfer", lse_base="e")
    assert audit_merge(wrong, build_state(SPLITS[0], "fp32"))["outcome"] == "wrong"


def test_a_vllm_merge_attn_states_is_right_on_every_state_with_fa_s_plus_inf_too(states):
    merge = declare_merge(merge_attn_states, form="vllm")
    assert [r["state"] for r in audit_merges({"v": merge}, states) if r["outcome"] != "right"] == []


def test_declaring_an_unknown_form_or_base_says_what_is_allowed():
    with pytest.raises(UsageError, match="one of pairs, flashinfer, vllm, stateful"):
        declare_merge(merge_state, form="triton")
    with pytest.raises(UsageError, match="lse_base '10'"):
        declare_merge(merge_state, lse_base="10")


def test_a_merge_that_raises_is_an_error_with_its_reason_not_numbers():
    def broken(out_a, lse_a, out_b, lse_b):
        raise RuntimeError("no kernel for this head size")
    rec = audit_merge(declare_merge(broken), build_state(SPLITS[0], "fp32"))
    assert rec["status"] == "error" and rec["reason"] == "RuntimeError: no kernel for this head size"
    assert "max_abs_err" not in rec


# --------------------------------------------------------------------------- torch's own

def test_torch_context_parallel_merge_is_audited_as_it_ships(states):
    """Whatever torch's _SDPAMerger returns, the audit's outcome is what calling it by hand shows, and
    a NaN or a +inf that wins is named by the mistake that gives it. (torch 2.13: NaN on two empty
    parts and on an empty first part; an empty part's +inf lse wins.)"""
    skip_without_torch_merger()      # at run time: the check imports torch.distributed (0.7 s a collection)
    from torch.distributed.tensor.experimental._context_parallel._attention import _SDPAMerger
    records = _by_state(audit_merges({"t": builtin_merges()["torch_context_parallel"]}, states))
    for state in states:
        merger = _SDPAMerger(convert_to_f32=True, seq_dim=2)
        for out, lse in state.parts:
            merger.step(out, lse, partial=False)
        out, lse = merger.results()
        rec = records[state.name, state.dtype]
        assert (rec["out_nan_rows"] + rec["lse_nan_rows"] > 0) == bool(out.isnan().any() or lse.isnan().any())
        if rec["outcome"] == "nan" and state.name == "both_empty":
            assert "nan_on_empty" in members(rec["diagnosis"])
        if rec["outcome"] == "inf" and state.name == "posinf_empty":
            assert "posinf_wins" in members(rec["diagnosis"])
        if rec["outcome"] != "right":
            assert rec["diagnosis"] != "none", (state.name, rec)


def test_the_reference_merge_is_the_lse_checks_merge():
    """One definition: the merge the lse checks use is the audited reference."""
    from audit.measure.golden import lse as golden_lse
    assert golden_lse.merge_partials is merge_partials


def test_the_smallest_failing_case_is_one_row_of_two_features_and_none_for_a_right_merge():
    """Kept in the record as numbers (the report writes its script from them, running nothing)."""
    from audit.measure.merging.judge import audit_merge
    from audit.measure.merging.smallest import FEATURES, smallest_cases, value_case
    state = build_state(EDGES[2], "fp32")                                   # both_empty
    case = value_case(builtin_merges()[CONTROL_PREFIX + "nan_on_empty"], state)
    assert case is not None and [len(o) for o, _ in case["parts"]] == [FEATURES] * len(state.parts)
    assert case["golden"][1] == [-math.inf] and case["state"] == "both_empty" and case["dtype"] == "fp32"
    assert value_case(builtin_merges()["reference"], state) is None
    control = builtin_merges()[CONTROL_PREFIX + "nan_on_empty"]      # the audit's own mistake: no script, no case
    assert smallest_cases(control, state, audit_merge(control, state)) == {"smallest": None, "smallest_grad": None}
    real = dataclasses.replace(control, control=None)
    assert smallest_cases(real, state, audit_merge(real, state))["smallest"] == case
    right = builtin_merges()["reference"]
    assert smallest_cases(right, state, audit_merge(right, state)) == {"smallest": None, "smallest_grad": None}
