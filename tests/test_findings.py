"""Findings about several variants at once ("*") are about real code: the negative controls
(broken.*), built to fail, are left out of them (each control keeps its own findings)."""
from __future__ import annotations

import pandas as pd
import pytest

from audit.analysis.findings import check_alignment, check_finfo_min_masks, check_fp16_range, compute_findings


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
