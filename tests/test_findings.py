"""Findings about several variants at once ("*") are about real code: the negative controls
(broken.*), built to fail, are left out of them (each control keeps its own findings)."""
from __future__ import annotations

import pandas as pd
import pytest

from audit.analysis.findings import compute_findings
from audit.analysis.numerics_rules import (check_alignment, check_finfo_min_masks, check_fp16_range,
                                           check_fully_masked_rows)
from audit.analysis.run_rules import check_graph_breaks


def _frame(rows: list[dict]) -> pd.DataFrame:
    base = {"status": "ok", "dtype": "fp32", "scenario": "normal", "leak_max_change": None,
            "out_nonfinite_visible": 0, "causal_alignment": None}
    return pd.DataFrame([{**base, "id": f"{r['variant']}-{i}", **r} for i, r in enumerate(rows)])


CASES = {
    "finfo_min_mask": (check_finfo_min_masks,
                       dict(scenario="fully_masked_finfo_min", leak_max_change=0.8)),
    "fp16_overflow": (check_fp16_range, dict(scenario="fp16_range", dtype="fp16", out_nonfinite_visible=5)),
    "causal_alignment": (check_alignment, dict(scenario="cross_causal", causal_alignment="top-left")),
}


@pytest.mark.parametrize("check", list(CASES))
def test_a_cross_variant_finding_names_real_variants_only(check: str) -> None:
    rule, fires = CASES[check]
    frame = _frame([{"variant": "eager", **fires}, {"variant": "broken.clamped", **fires}])
    [finding] = rule(frame)
    assert finding["check"] == check and finding["variant"] == "*"
    assert "eager" in finding["message"] and "broken." not in finding["message"]
    assert finding["cells"] == ["eager-0"]


@pytest.mark.parametrize("check", list(CASES))
def test_a_cross_variant_finding_needs_a_real_variant(check: str) -> None:
    rule, fires = CASES[check]
    assert rule(_frame([{"variant": "broken.clamped", **fires}])) == []
    assert [f["check"] for f in compute_findings(_frame([{"variant": "sdpa", **fires}]))].count(check) == 1


def _gqa_cells(masked: dict[str, dict[int, str]]) -> pd.DataFrame:
    """One fully-masked cell per variant and kv_heads value, every other axis alike."""
    axes = dict(device="cpu", dtype="bf16", d_k=64, seq_len=256, batch=2, heads=4, causal=False,
                scenario="fully_masked_bool")
    return _frame([{"variant": v, **axes, "kv_heads": kv, "masked_rows": rows}
                   for v, by_kv in masked.items() for kv, rows in by_kv.items()])


def test_fully_masked_rows_compares_each_cell_with_sdpas_cell_of_the_same_inputs():
    """With two kv_heads values in one run (issue: the message printed a pandas Series, its
    sdpa rows indexed by axes without kv_heads), each cell meets sdpa's cell of its own kv_heads."""
    frame = _gqa_cells({"eager": {4: "nan", 2: "nan"}, "sdpa": {4: "zero", 2: "zero"}})
    [finding] = check_fully_masked_rows(frame)
    assert finding["message"].startswith("eager returns NaN on fully masked rows while sdpa returns zero "
                                          "(fully_masked_bool; 2 cell(s))")
    frame = _gqa_cells({"eager": {2: "nan"}, "sdpa": {4: "nan", 2: "uniform"}})
    assert "while sdpa returns uniform (" in check_fully_masked_rows(frame)[0]["message"]


def test_no_finding_message_holds_a_pandas_repr():
    frame = _gqa_cells({"eager": {4: "nan", 2: "nan"}, "compiled": {4: "nan", 2: "zero"},
                        "sdpa": {4: "zero", 2: "zero"}})
    found = compute_findings(frame)
    assert any(f["check"] == "fully_masked_rows" for f in found)
    for f in found:
        assert "Name:" not in f["message"] and "dtype:" not in f["message"], f["message"]


def test_no_finding_message_of_the_quick_run_holds_a_pandas_repr(quick_run):
    """The session's quick run has cells with kv_heads 4, 2 and 1 (its GQA sub-grid) beside
    multi-head ones: every finding message it got is plain text."""
    import json

    from audit.core import records
    from audit.core.runfolder import FINDINGS_FILE

    kv = {r["kv_heads"] for r in records.read_records(quick_run) if r["heads"] == 4}
    assert kv >= {4, 2}
    found = json.loads((quick_run / FINDINGS_FILE).read_text())
    assert len(found) >= 5
    for f in found:
        assert "Name:" not in f["message"] and "dtype:" not in f["message"], f["message"]


# --------------------------------------------------------------------------- diagnosis

# Each negative control and the known mistake (workload.mistakes) that is its own defect.
OWN_DEFECT = {"broken.unscaled": "scale_missing", "broken.mask_after_softmax": "mask_after_softmax_renormalised",
              "broken.gqa_wrong_head": "gqa_interleaved", "broken.softmax_wrong_dim": "softmax_wrong_dim",
              "broken.clamped": "probs_clamped", "broken.no_max_subtraction": "no_max_subtraction",
              "broken.backward_rowsum_d_missing": "rowsum_d_missing",
              "broken.backward_dq_scale_missing": "dq_scale_missing",
              "broken.sink_ignored": "sink_ignored", "broken.lse_base2": "lse_base2",
              "broken.lse_no_grad": "lse_no_grad", "broken.zero_keys_as_padding": "zero_keys_as_padding",
              "broken.document_boundary_ignored": "document_boundary_ignored",
              "broken.cu_seqlens_off_by_one": "cu_seqlens_off_by_one", "broken.v_read_at_k_stride": "v_read_at_k_stride",
              "broken.paged_extra_page": "reads_past_used",                        # the paged_reads finding's
              "broken.paged_wrong_sequence": "block_table_wrong_sequence",
              # the argument probes' (argument_ignored: the argument and what it does)
              "broken.scale_ignored": "scale_ignored", "broken.softcap_fixed": "softcap_ignored",
              "broken.causal_ignored": "causal_ignored", "broken.mask_ignored": "mask_ignored",
              "broken.window_ignored": "window_ignored", "broken.window_left_inclusive": "window_left_inclusive",
              "broken.strides_ignored": "strides_ignored", "broken.block_table_stale": "block_table_ignored"}
# a control of a warning-level defect (core.defects.WARNING_DEFECTS): the warnings it must get
OWN_WARNINGS = {"broken.batch_dependent_splits": {"batch_invariance", "chunk_invariance"}}


def test_every_negative_control_gets_an_error_finding_diagnosed_as_its_own_defect(quick_run):
    import json

    from audit.core import records
    from audit.core.runfolder import FINDINGS_FILE
    from audit.workload.variants import NEGATIVE_CONTROLS

    from audit.workload.variants import REFEREE_CONTROL_NAMES
    assert set(OWN_DEFECT) | set(OWN_WARNINGS) == set(NEGATIVE_CONTROLS) - set(REFEREE_CONTROL_NAMES)
    found = json.loads((quick_run / FINDINGS_FILE).read_text())
    # the referee's controls: a referee finding naming the check each is for (no numerics defect to diagnose)
    from audit.workload.referee_controls import REFEREE_CONTROLS
    ran = {r["variant"] for r in records.read_records(quick_run) if r["status"] == "ok"}
    for name, (check, _) in REFEREE_CONTROLS.items():
        if f"broken.{name}" in ran:
            named = {(f["check"], f.get("referee_check")) for f in found if f["variant"] == f"broken.{name}"
                     and f["severity"] == "error"}
            also = ({("argument_ignored", None)} if name in ("finds_reference", "skips_after_warmup")   # the probes
                    else set())                                                 # see them: tests/test_referee.py
            assert named - also == {("referee", check)}, (name, named)
    for control, checks in OWN_WARNINGS.items():
        assert checks <= {f["check"] for f in found if f["variant"] == control and f["severity"] == "warning"}
    for control, mistake in OWN_DEFECT.items():
        named = {f.get("diagnosis") for f in found if f["variant"] == control and f["severity"] == "error"}
        assert mistake in named, (control, named)
        finding = next(f for f in found if f["variant"] == control and f.get("diagnosis") == mistake)
        assert "Diagnosis: in" in finding["message"] and finding["diagnosis_title"] in finding["message"]
        golden_err = finding["diagnosis_golden_err"]                  # None: NaN against the golden
        assert golden_err is None or finding["diagnosis_err"] < golden_err
    # correct code does the work on every call: no referee finding about a real variant, on any scenario
    assert not [(f["variant"], f.get("referee_check")) for f in found
                if f["check"] == "referee" and not f["variant"].startswith("broken.")]
    # correct code has no numerics defect, so nothing diagnosed: no diagnosis of its output at all,
    # and none of its gradients on normal inputs (sdpa's fp32 gradients at huge logits are outside
    # their budget: the CPU flash backward's own error, matching no known mistake)
    recs = records.read_records(quick_run)
    for variant in ("sdpa", "sdpa_math", "sdpa_flash"):
        rows = [r for r in recs if r["variant"] == variant and r["status"] == "ok"]
        assert rows and all(r["diagnosis"] is None for r in rows), variant
        assert all(r["grad_diagnosis"] in (None, "none") for r in rows), variant
        assert all(r["grad_diagnosis"] is None for r in rows if r["scenario"] == "normal"), variant


def test_a_finding_names_the_diagnosis_most_of_its_cells_match_and_says_when_none_does():
    frame = _frame([{"variant": "mine", "within_budget": False, "err_ratio": 9.0, "diagnosis": d,
                     "diagnosis_err": 1e-7, "diagnosis_golden_err": 0.4} for d in
                    ("gqa_interleaved", "gqa_interleaved", "scale_missing", "none")])
    [finding] = [f for f in compute_findings(frame) if f["check"] == "error_budget"]
    assert (finding["diagnosis"], finding["diagnosis_cells"]) == ("gqa_interleaved", 2)
    assert finding["diagnosis_title"] == "GQA heads paired interleaved"
    assert "in 2 of 4 diagnosed cell(s)" in finding["message"]
    assert "h % kv_heads" in finding["message"]                      # what the code does
    assert "Other cells match: scale_missing (1)" in finding["message"]
    frame["diagnosis"] = "none"
    [finding] = [f for f in compute_findings(frame) if f["check"] == "error_budget"]
    assert finding["diagnosis"] == "none" and "no known mistake matches" in finding["message"]
    old = frame.drop(columns=["diagnosis", "diagnosis_err", "diagnosis_golden_err"])   # records before schema 7
    [finding] = [f for f in compute_findings(old) if f["check"] == "error_budget"]
    assert "diagnosis" not in finding and "Diagnosis" not in finding["message"]


def test_graph_breaks_finding_fires_on_a_broken_compile_only():
    frame = _frame([{"variant": "compiled", "graph_breaks": 0}, {"variant": "compiled_unfused", "graph_breaks": 2},
                    {"variant": "sdpa", "graph_breaks": None}])
    [finding] = check_graph_breaks(frame)
    assert finding["variant"] == "compiled_unfused" and finding["severity"] == "warning"
    assert "up to 2 graph break(s)" in finding["message"] and finding["cells"] == ["compiled_unfused-1"]
    assert check_graph_breaks(frame.assign(graph_breaks=0)) == []
    assert check_graph_breaks(frame.drop(columns="graph_breaks")) == []


def test_every_rule_is_registered_and_runs_in_its_order():
    """A check_* function of a rules module runs only if it is marked @rule(order): one left unmarked
    would judge nothing, silently. RULES holds each once, in the order the numbers state."""
    from audit.analysis import findings
    from audit.analysis.rule_registry import rule

    defined = {name for module in findings.RULE_MODULES for name, value in vars(module).items()
               if name.startswith("check_") and callable(value) and value.__module__ == module.__name__}
    names = [r.__name__ for r in findings.RULES]
    assert sorted(names) == sorted(defined) and len(names) == len(set(names))
    assert names[:3] == ["check_nonfinite", "check_error_budget", "check_grad_error_budget"]
    assert names[-1] == "check_timing_noise"
    with pytest.raises(ValueError, match="taken by check_nonfinite"):
        rule(10)(lambda frame: [])


@pytest.mark.parametrize("variant, scenario, told", [
    ("paged_flex", "paged_edges", True), ("paged_flex", "paged", True),
    ("sdpa", "normal", False),                      # no known handling of plain inputs to tell
    ("broken.paged_extra_page", "paged", False),    # a control's defect is the audit's own
])
def test_an_output_finding_on_a_scenario_whose_reference_kernels_are_known_says_what_they_do(variant, scenario,
                                                                                          told):
    from audit.workload.inputs import PAGED_REFERENCES
    [finding] = [f for f in compute_findings(_frame([{"variant": variant, "scenario": scenario,
                                                      "out_nonfinite_visible": 3, "out_nan": 3}]))
                 if f["check"] == "nonfinite"]
    assert (f"Elsewhere: {PAGED_REFERENCES}." in finding["message"]) is told
    assert finding.get("reference_kernels") == ([PAGED_REFERENCES] if told else None)
