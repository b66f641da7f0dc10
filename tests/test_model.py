"""The model audit (audit/measure/model_audit.py): small decoders built from a config in code, each
variant as their attention, against float64 layer by layer. A variant with a known per-call error has a
larger model-level error than sdpa and gets a finding; sdpa and eager get none; the weights are shaped
(peaked attention and next tokens); chunked prefill and a batch of one agree with one prefill."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    import audit
    out = tmp_path_factory.mktemp("model")
    records = audit.model(["llama-tiny"], ["eager", "sdpa", "broken.unscaled", "broken.clamped"], ["fp32", "bf16"], out)
    return records, out


def _run(records, variant, dtype):
    return next(r for r in records if r.get("variant") == variant and r.get("dtype") == dtype)


def test_a_variant_with_a_per_call_error_has_a_larger_model_error_than_sdpa_and_a_finding(llama):
    from audit.analysis.model_rules import check_model
    records, _ = llama
    for dtype in ("fp32", "bf16"):
        sdpa, broken = _run(records, "sdpa", dtype), _run(records, "broken.unscaled", dtype)
        assert sdpa["status"] == broken["status"] == "ok"
        assert broken["final_hidden_err"] > 10 * max(sdpa["final_hidden_err"], 1e-6)
        assert broken["kl"] > 10 * sdpa["kl"] and broken["top1_agreement"] < sdpa["top1_agreement"]
        assert len(broken["hidden_err"]) == broken["layers"] == 4
    assert _run(records, "sdpa", "fp32")["final_hidden_err"] < 1e-5 < _run(records, "sdpa", "bf16")["final_hidden_err"]
    found = check_model(records)
    assert {f["variant"] for f in found} == {"broken.unscaled", "broken.clamped"}
    assert {f["check"] for f in found if f["variant"] == "broken.unscaled"} == {"model_error", "model_top1_flip"}
    # the seed's clamp(min=1e-6): many times sdpa's error in fp32, under half precision's rounding in bf16
    clamped = [f for f in found if f["variant"] == "broken.clamped"]
    assert [f["check"] for f in clamped] == ["model_error"] and "(fp32)" in clamped[0]["message"]
    assert _run(records, "broken.clamped", "fp32")["final_hidden_err"] > 5 * _run(records, "sdpa", "fp32")["final_hidden_err"]


def test_the_weights_are_shaped_as_a_trained_models(llama):
    records, _ = llama
    ref = next(r for r in records if r["kind"] == "reference")
    assert all(3.0 <= s <= 8.0 for s in ref["logit_std"]) and len(ref["logit_std"]) == 4
    assert ref["next_token_top1_prob"] > 0.3                       # uniform over 256 tokens: 0.004


def test_a_batch_of_one_and_a_chunked_prefill_agree_with_one_prefill_in_float(llama):
    records, _ = llama
    eager = _run(records, "eager", "fp32")
    assert eager["batch_bitwise"] is True and eager["chunk_err"] < 1e-5


def test_the_page_figure_and_records_are_written(llama):
    _, out = llama
    lines = [json.loads(line) for line in (out / "model.jsonl").read_text().splitlines()]
    assert len(lines) == 9 and lines[0]["kind"] == "reference"
    assert (out / "model_error.png").stat().st_size > 1000
    page = (out / "index.md").read_text()
    assert "Model audit" in page and "broken.unscaled" in page and "model_error.png" in page


def test_a_sink_model_runs_the_variants_that_take_sinks_and_skips_the_others():
    import audit
    records = audit.model(["gpt-oss-tiny"], ["eager", "sdpa"], ["fp32"])
    assert _run(records, "eager", "fp32")["status"] == "ok"
    sdpa = _run(records, "sdpa", "fp32")
    assert sdpa["status"] == "skipped" and "sinks" in sdpa["reason"]


def test_the_command_line_names_a_bad_model(tmp_path):
    got = subprocess.run([sys.executable, "-m", "audit", "model", "--model", "gpt5", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert got.returncode == 2 and "unknown model 'gpt5'" in got.stderr and "llama-tiny" in got.stderr


def _rec(variant, err, flips, status="ok", growth=1.3, dtype="bf16"):
    return {"kind": "variant", "model": "m", "variant": variant, "dtype": dtype, "status": status,
            "final_hidden_err": err, "growth_median": growth, "decisive_mismatches": flips, "kl": 0.01,
            "top1_agreement": 0.9, "logprob_check": True, "reason": "RuntimeError: x" if status == "failed" else None}


def test_the_rules_tell_rounding_from_a_changed_model():
    """Flips within what the yardstick's own rounding flips are not a finding; an error twice sdpa's is;
    a variant failing in the model is a warning; with no sdpa, eager is the yardstick."""
    from audit.analysis.model_rules import check_model
    sdpa = _rec("sdpa", 0.05, list(range(6)))
    rounding = _rec("eager", 0.056, [0, 1, 10, 11, 12, 13, 14, 15, 16, 17])        # 8 beyond sdpa's 6
    wrong = _rec("k", 0.06, list(range(100, 115)))                                 # 15 > 2 · 6 + 2
    far = _rec("far", 0.2, [])
    failed = _rec("bad", None, [], status="failed")
    found = {(f["check"], f["variant"]) for f in check_model([sdpa, rounding, wrong, far, failed])}
    assert found == {("model_top1_flip", "k"), ("model_error", "far"), ("model_failed", "bad")}
    no_sdpa = check_model([_rec("eager", 0.05, []), _rec("far", 0.2, [])])
    assert [(f["check"], f["variant"]) for f in no_sdpa] == [("model_error", "far")]
    assert check_model([]) == [] and check_model([{"kind": "reference", "model": "m"}]) == []


def test_a_faster_growth_is_a_finding_only_with_an_error_clearly_over_the_yardsticks():
    """A growth over 1.25 × sdpa's needs the error over 1.25 × sdpa's too: an error a few percent over it
    is what two correct variants differ by (eager's bf16 error through llama-tiny: 1.04-1.08 × sdpa's)."""
    from audit.analysis.model_rules import check_model
    sdpa = _rec("sdpa", 0.05, [], growth=1.3)
    assert check_model([sdpa, _rec("even", 0.054, [], growth=1.7)]) == []
    assert [(f["check"], f["variant"]) for f in check_model([sdpa, _rec("grows", 0.07, [], growth=1.7)])] == [
        ("model_error", "grows")]
    assert check_model([sdpa, _rec("same_growth", 0.07, [], growth=1.3)]) == []


def test_the_error_floor_follows_the_dtype():
    """fp32: a variant many times sdpa's error is found even far under 1e-3 (the measured fp32 errors of
    llama-tiny: correct variants 6.0-6.3e-7, broken.clamped 8.3e-6); one within rounding of sdpa's is not.
    bf16: the same small errors are under its floor."""
    from audit.analysis.model_rules import check_model, error_floor
    assert error_floor("fp32") < 2e-6 and error_floor("bf16") == error_floor("fp16") == 1e-3
    fp32 = [_rec("sdpa", 6.0e-7, [], dtype="fp32"), _rec("eager", 6.25e-7, [], dtype="fp32"),
            _rec("clamped", 8.3e-6, [], dtype="fp32")]
    assert [(f["check"], f["variant"]) for f in check_model(fp32)] == [("model_error", "clamped")]
    bf16 = [_rec("sdpa", 2e-4, []), _rec("k", 8e-4, [])]
    assert check_model(bf16) == []


def test_the_quick_preset_runs_the_model_audit_after_its_cells_and_reports_it(quick_run):
    """The quick preset's models (llama-tiny, gpt-oss-tiny) with the run's eligible variants: the records,
    the findings of the controls among them in model_findings.json, the section and its figure; its time is a
    part of the run's time split."""
    import json as _json
    from audit.core.runfolder import MODEL_FILE
    records = [_json.loads(line) for line in (quick_run / MODEL_FILE).read_text().splitlines()]
    assert {r["model"] for r in records if r["kind"] == "reference"} == {"llama-tiny", "gpt-oss-tiny"}
    ran = {(r["model"], r["variant"]) for r in records if r["kind"] == "variant" and r["status"] == "ok"}
    assert {("llama-tiny", "sdpa"), ("llama-tiny", "broken.unscaled"), ("gpt-oss-tiny", "broken.sink_ignored")} <= ran
    found = _json.loads((quick_run / "model_findings.json").read_text())
    assert not [f for f in _json.loads((quick_run / "findings.json").read_text()) if f["check"].startswith("model_")]
    model = {(f["check"], f["variant"]) for f in found}
    assert ("model_error", "broken.unscaled") in model and ("model_error", "broken.sink_ignored") in model
    assert not [v for _, v in model if not v.startswith("broken.")]
    page = (quick_run / "index.md").read_text()
    assert "## Model audit" in page and (quick_run / "model_error.png").is_file()
    parts = _json.loads((quick_run / "run.json").read_text())["time_split"]["parts_s"]
    assert parts["model audit"] > 0
