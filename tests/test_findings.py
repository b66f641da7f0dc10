"""Findings about several variants at once ("*") are about real code: the negative controls
(broken.*), built to fail, are left out of them (each control keeps its own findings)."""
from __future__ import annotations

import pandas as pd
import pytest

from audit.analysis.findings import (check_alignment, check_finfo_min_masks, check_fp16_range,
                                     check_fully_masked_rows, compute_findings)


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
