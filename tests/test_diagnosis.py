"""The diagnosis: each known mistake (audit.workload.mistakes) is named on an implementation that
makes it (tests/plugins/mistaken.py) and on no correct one; the negative controls get their own
defect named where the audit flags them, on the leak probes where their own inputs hide it;
slices, tolerance, ties, plug-in mistakes, devices."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from audit.core.grid import Case
from audit.measure.diagnosis import diagnosis
from audit.measure.golden import reference
from audit.measure.cell.cellcache import build_reference
from audit.measure.diagnosis.diagnosis import diagnose, diagnose_cell, diagnosis_slices, tolerance
from audit.core.dtypes import dtype_spec
from audit.measure.golden.numerics import budget_bound, error_vs_reference, within_budget
from audit.workload import mistakes as library
from audit.workload.inputs import make_inputs
from audit.workload.mistake_base import PRECISIONS, ROWS, Attempt, Mistake, mistake
from audit.workload.mistakes import MISTAKES
from audit.workload.variants import builtin_variants

from tests.device_provenance import HostProvenance
from tests.plugins import mistaken

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds

ROOT = Path(__file__).resolve().parents[1]

# mistake -> the cell (Case fields over BASE) where an implementation making it is wrong
CELLS: dict[str, dict] = {
    "gqa_interleaved": dict(heads=4, kv_heads=2),
    "gqa_permuted": dict(heads=4, kv_heads=2),
    "causal_alignment_swapped": dict(scenario="cross_causal", causal=True),
    "causal_diagonal_excluded": dict(causal=True),
    "causal_next_key": dict(causal=True),
    "causal_upper": dict(causal=True),
    "causal_ignored": dict(causal=True),
    "mask_ignored": dict(scenario="padding"),
    "mask_inverted": dict(scenario="padding"),
    "mask_after_softmax": dict(scenario="padding"),
    "mask_after_softmax_renormalised": dict(scenario="scaled_x64", causal=True),   # fp32 underflow
    "fully_masked_nan": dict(scenario="fully_masked_bool"),
    "fully_masked_uniform": dict(scenario="fully_masked_bool"),
    "zero_keys_as_padding": dict(scenario="sparse", causal=True),
    "scale_squared": {},
    "scale_missing": {},
    "scale_inverted": {},
    "softmax_wrong_dim": {},
    "qk_swapped": {},
    "last_key_dropped": {},
    "probs_clamped": dict(causal=True),
    "no_max_subtraction": dict(scenario="scaled_x64", causal=True),              # fp32 overflow
    "score_mod_ignored": dict(scenario="softcap"),
    "sink_ignored": dict(scenario="sinks", heads=4),
    "sink_after_normalisation": dict(scenario="sinks", heads=4),
    "sink_shared": dict(scenario="sinks", heads=4),
    "sink_wrong_head": dict(scenario="sinks", heads=4, causal=True),
    "document_boundary_ignored": dict(scenario="packed"),
    "cu_seqlens_off_by_one": dict(scenario="packed"),
    **{name: dict(scenario="packed") for name in ("cu_seqlens_one_early", "document_keys_end_inclusive",
                                                  "document_keys_end_short", "document_keys_start_early",
                                                  "document_keys_start_exclusive", "document_queries_late",
                                                  "document_queries_early")},
    "v_read_at_k_stride": dict(d_v=8),
    "strides_ignored": dict(scenario="strided_qkv", heads=4, kv_heads=2),
    "window_left_inclusive": dict(scenario="sliding_window", causal=True),
    "window_left_short": dict(scenario="sliding_window"),
    **{name: dict(scenario="sliding_window") for name in ("window_right_inclusive", "window_right_short",
                                                          "window_both_inclusive")},
}
BASE = dict(variant="x", device="cpu", dtype="fp32", d_k=16, seq_len=32, batch=2, heads=2, causal=False,
            scenario="normal")
BUILTIN = [name for name, m in MISTAKES.items() if getattr(m.fn, "func", m.fn).__module__ in library.LIBRARY_MODULES]


def cell(**fields) -> tuple[Case, object, object]:
    case = Case(**{**BASE, **fields})
    inputs = make_inputs(case)
    return case, inputs, build_reference(case, inputs)


def output_of(fn, inputs, k=None, v=None):
    """The variant's (B, H, Tq, d) output on the cell's inputs (k, v replaced when given); of a
    variant returning (out, lse), out."""
    with torch.no_grad():
        got = fn(inputs.q, inputs.k if k is None else k, inputs.v if v is None else v, **inputs.call_kwargs())
    return got[0] if isinstance(got, tuple) else got


def diagnosed(fn, case, inputs, ref, baseline="ref", probes=False) -> dict:
    """diagnose_cell on fn's output; probes: with the variant's call on the leak probes' keys, as
    the `diagnosis` check passes it."""
    call = (lambda k2, v2: output_of(fn, inputs, k2, v2)) if probes else None
    return diagnose_cell(output_of(fn, inputs), inputs, ref, case.dtype,
                         ref.baseline_rmse if baseline == "ref" else baseline, call=call)


# --------------------------------------------------------------------------- every mistake

def test_every_mistake_of_the_library_has_an_implementation_and_a_cell():
    assert set(CELLS) == set(BUILTIN)
    assert all(callable(getattr(mistaken, name, None)) for name in BUILTIN)


def test_the_library_imports_no_torch():
    code = "import sys, audit.workload.mistakes as m; assert m.MISTAKES; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_every_mistake_has_its_texts():
    for m in MISTAKES.values():
        assert m.title and m.what.endswith(".") and m.where and m.rows in ROWS
        assert len(m.title) < 50 and m.precision in PRECISIONS


@pytest.mark.parametrize("name", BUILTIN)
def test_an_implementation_making_the_mistake_is_diagnosed_with_it(name):
    case, inputs, ref = cell(**CELLS.get(name, {}))
    got = diagnosed(getattr(mistaken, name), case, inputs, ref)
    assert got["diagnosis"] == name, got
    assert got["diagnosis_err"] <= budget_bound(ref.baseline_rmse, "fp32")
    assert not got["diagnosis_golden_err"] <= got["diagnosis_err"]       # NaN (a NaN row) counts as worse


@pytest.mark.parametrize("name", BUILTIN)
def test_a_correct_implementation_is_not_diagnosed_on_that_cell(name):
    case, inputs, ref = cell(**CELLS.get(name, {}))
    got = diagnosed(mistaken.correct, case, inputs, ref, probes=True)    # its leak probes too
    assert got["diagnosis"] == "none", got
    assert got["diagnosis_err"] is None and got["diagnosis_golden_err"] < 1e-6


@pytest.mark.parametrize("variant", ["eager_fp32", "sdpa", "eager"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("fields", [
    dict(), dict(causal=True), dict(scenario="scaled_x16"), dict(scenario="padding", causal=True),
    dict(scenario="cross_causal", causal=True), dict(scenario="sliding_window"), dict(scenario="outliers"),
    dict(scenario="decode", causal=True), dict(heads=4, kv_heads=2, causal=True),
    dict(scenario="sparse", causal=True), dict(scenario="constant_rows"), dict(scenario="heavy_tailed"),
], ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()) or "normal")
def test_no_mistake_matches_a_correct_variant(variant, dtype, fields):
    case, inputs, ref = cell(dtype=dtype, **fields)
    got = diagnosed(builtin_variants()[variant].build(), case, inputs, ref)
    assert got["diagnosis"] == "none", got


def test_the_fully_masked_conventions_of_correct_variants_are_named():
    """Rows that see no key: plain softmax of -inf gives NaN (eager), a finfo.min mask uniform
    weights (every variant); SDPA's 0 is the golden's own convention, so nothing to name."""
    v = builtin_variants()
    for scenario, causal, name, expect in [("fully_masked_bool", False, "eager", "fully_masked_nan"),
                                           ("fully_masked_bool", False, "sdpa", "none"),
                                           ("fully_masked_finfo_min", False, "sdpa", "fully_masked_uniform"),
                                           ("fully_masked_finfo_min", True, "eager", "fully_masked_uniform")]:
        case, inputs, ref = cell(scenario=scenario, causal=causal)
        assert diagnosed(v[name].build(), case, inputs, ref)["diagnosis"] == expect, (scenario, name)


# --------------------------------------------------------------------------- negative controls

QUICK = dict(d_k=32, seq_len=64, batch=1, heads=2)     # the quick preset's control cells
CONTROLS = [
    ("broken.unscaled", dict(), "scale_missing"),
    ("broken.unscaled", dict(dtype="bf16", causal=True), "scale_missing"),
    ("broken.softmax_wrong_dim", dict(), "softmax_wrong_dim"),
    ("broken.softmax_wrong_dim", dict(dtype="fp16", causal=True, scenario="sliding_window"), "softmax_wrong_dim"),
    ("broken.gqa_wrong_head", dict(heads=4, kv_heads=2, causal=True), "gqa_interleaved"),
    ("broken.mask_after_softmax", dict(causal=True, scenario="scaled_x64"), "mask_after_softmax_renormalised"),
    ("broken.mask_after_softmax", dict(dtype="fp16", causal=True, scenario="scaled_x16"),
     "mask_after_softmax_renormalised"),
    ("broken.clamped", dict(causal=True), "probs_clamped"),
    ("broken.no_max_subtraction", dict(dtype="fp16", scenario="scaled_x4"), "no_max_subtraction"),
    ("broken.no_max_subtraction", dict(causal=True, scenario="scaled_x64"), "no_max_subtraction"),
    ("broken.zero_keys_as_padding", dict(scenario="sparse"), "zero_keys_as_padding"),
    ("broken.zero_keys_as_padding", dict(dtype="bf16", causal=True, scenario="sparse"), "zero_keys_as_padding"),
]


@pytest.mark.parametrize("variant, fields, expect", CONTROLS, ids=[f"{v}-{e}-{i}" for i, (v, _, e) in
                                                                    enumerate(CONTROLS)])
def test_a_negative_control_is_named_by_its_own_defect_where_the_audit_flags_it(variant, fields, expect):
    case, inputs, ref = cell(**{**QUICK, **fields})
    with torch.no_grad():
        out = builtin_variants()[variant].build()(inputs.q, inputs.k, inputs.v, **inputs.call_kwargs())
    err = error_vs_reference(ref.take(out), ref.golden.out, ref.golden.row_visible)["rmse"]
    assert within_budget(err, ref.baseline_rmse, case.dtype) is False         # error_budget (or NaN)
    got = diagnose_cell(out, inputs, ref, case.dtype, ref.baseline_rmse)
    assert got["diagnosis"] == expect, got


def test_mask_after_softmax_ties_with_the_nan_convention_on_fully_masked_rows():
    """Renormalising after the softmax is exact but for 0/0 on rows that see no key: there its
    output is plain softmax's, so the more specific fully_masked_nan is named."""
    case, inputs, ref = cell(**QUICK, scenario="fully_masked_bool")
    got = diagnosed(builtin_variants()["broken.mask_after_softmax"].build(), case, inputs, ref)
    assert got["diagnosis"] == "fully_masked_nan"


# --------------------------------------------------------------------------- leak probes

PROBED = dict(d_k=32, seq_len=128, batch=1, heads=2)     # the quick preset's T=128 cells (issue 30)
PROBE_CELLS = [dict(causal=True), dict(scenario="padding"), dict(scenario="cross_causal", causal=True)]
PROBE_IDS = ["normal-causal", "padding", "cross_causal-causal"]


@pytest.mark.parametrize("fields", PROBE_CELLS + [dict(scenario="padding", dtype="bf16"),
                                                  dict(scenario="cross_causal", causal=True, dtype="fp16")],
                         ids=PROBE_IDS + ["padding-bf16", "cross_causal-causal-fp16"])
def test_mask_after_softmax_is_named_on_the_leak_probes_where_its_cell_hides_it(fields):
    """Softmax over every key, then masked and renormalised, is exact in float64: on N(0, 1)
    inputs it leaks at roundoff (fp32: up to 5e-7) and no mistake is distinguishable there. On a
    leak probe's keys, scaled past the dtype's range, the hidden keys flush the visible weights of
    the probe's rows to zero and renormalising gives NaN, as the mistake run in the cell's dtype:
    named in every dtype. (Not mask_after_softmax: without renormalising, its rows are ~0, not NaN.)"""
    case, inputs, ref = cell(**{**PROBED, **fields})
    fn = builtin_variants()["broken.mask_after_softmax"].build()
    assert ref.leak_probes
    assert diagnosed(fn, case, inputs, ref)["diagnosis"] == "none"         # its own inputs: nothing
    got = diagnosed(fn, case, inputs, ref, probes=True)
    assert got["diagnosis"] == "mask_after_softmax_renormalised", got
    assert got["diagnosis_err"] <= tolerance(ref.baseline_rmse, case.dtype)
    assert not got["diagnosis_golden_err"] <= got["diagnosis_err"]       # NaN rows: NaN against the golden


@pytest.mark.parametrize("variant", ["eager", "sdpa"])
@pytest.mark.parametrize("fields", PROBE_CELLS, ids=PROBE_IDS)
def test_the_leak_probes_name_no_mistake_on_a_correct_variant(variant, fields, monkeypatch):
    """The same cells and probes: the hidden keys never reach a correct variant's probed rows,
    so every probe is evaluated (the cell names nothing) and names nothing."""
    probed = []

    def spy(*args, **kwargs):
        found = real(*args, **kwargs)
        if kwargs.get("within") is not None:
            probed.append(found)
        return found
    real = diagnosis.diagnose
    monkeypatch.setattr(diagnosis, "diagnose", spy)
    case, inputs, ref = cell(**PROBED, **fields)
    got = diagnosed(builtin_variants()[variant].build(), case, inputs, ref, probes=True)
    assert got["diagnosis"] == "none", got
    assert len(probed) == len(ref.leak_probes) >= 1 and all(f.name == "none" for f in probed)
    assert not any(f.scores["mask_after_softmax_renormalised"][3] for f in probed)


def test_a_probe_the_variant_raises_on_keeps_the_cells_diagnosis():
    """A variant refusing the scaled keys loses the probe, not the cell's diagnosis."""
    case, inputs, ref = cell(**PROBED, causal=True)

    def refuses(k2, v2):
        raise ValueError("keys out of range")
    out = output_of(builtin_variants()["broken.mask_after_softmax"].build(), inputs)
    got = diagnose_cell(out, inputs, ref, "fp32", ref.baseline_rmse, call=refuses)
    assert got["diagnosis"] == "none"


def test_the_probes_are_scaled_past_the_dtypes_range():
    """A softmax weight e^-x is 0 in the dtype past its smallest subnormal; the probe's hidden
    scores are pushed PROBE_REACH times that far, never scaled down."""
    assert diagnosis.weight_range("fp32") == pytest.approx(149 * math.log(2))
    assert diagnosis.weight_range("bf16") == pytest.approx(133 * math.log(2))
    assert diagnosis.weight_range("fp16") == pytest.approx(24 * math.log(2))
    case, inputs, ref = cell(**PROBED, causal=True)
    attempt = diagnosis.attempt_for(inputs, [0], [0, 1])
    (k2, _, rows), = ref.leak_probes
    gain = diagnosis.probe_gain(attempt, k2.double(), rows)
    assert gain > 10 and diagnosis.probe_gain(attempt, attempt.k, rows) == 1.0   # nothing changed: 1


# --------------------------------------------------------------------------- matcher

def test_a_mistake_is_matched_only_where_it_differs_from_the_golden():
    """gqa_interleaved on a multi-head cell: nothing to tell apart, the function says None."""
    case, inputs, ref = cell()
    got = diagnosed(mistaken.gqa_interleaved, case, inputs, ref)
    assert got["diagnosis"] == "none"


def test_ties_go_to_the_more_specific_mistake():
    """On a decode cell bottom-right alignment sees every key: the same as causal ignored."""
    case, inputs, ref = cell(scenario="decode", causal=True)
    got = diagnosed(mistaken.causal_ignored, case, inputs, ref)
    assert got["diagnosis"] == "causal_alignment_swapped"
    case, inputs, ref = cell(heads=4, kv_heads=2)          # the fitted pairing is the interleaved one
    with torch.no_grad():
        out = mistaken.gqa_interleaved(inputs.q, inputs.k, inputs.v)
    attempt = diagnosis.attempt_for(inputs, [0, 1], [0, 1, 2, 3], observed=out)
    found = diagnose(attempt.observed, attempt, diagnosis._golden_for(ref, [0, 1], [0, 1, 2, 3]),
                     tolerance(ref.baseline_rmse, "fp32"))
    assert found.name == "gqa_interleaved" and found.scores["gqa_permuted"][3]   # both match


def test_without_a_baseline_the_tolerance_comes_from_the_golden_rounding():
    case, inputs, ref = cell(causal=True)
    golden = ref.golden.out
    assert tolerance(None, "fp32") == dtype_spec("fp32").atol
    fallback = tolerance(math.nan, "bf16", golden)
    rounding = error_vs_reference(golden.bfloat16(), golden)["rmse"]
    assert fallback == pytest.approx(dtype_spec("bf16").budget_factor * diagnosis.FALLBACK_ROUNDING * rounding + 1e-3)
    assert diagnosed(mistaken.causal_next_key, case, inputs, ref, baseline=None)["diagnosis"] == "causal_next_key"


def test_a_broken_mistake_does_not_lose_the_cell():
    case, inputs, ref = cell(causal=True)
    boom = Mistake("boom", "boom", "Raises.", "here", lambda a: 1 / 0)
    attempt = diagnosis.attempt_for(inputs, [0], [0, 1])
    found = diagnose(attempt.q * 0, attempt, diagnosis._golden_for(ref, [0], [0, 1]), 1e-6,
                     mistakes={"boom": boom, "causal_ignored": MISTAKES["causal_ignored"]})
    assert "ZeroDivisionError" in found.failed["boom"] and found.name == "none"


# --------------------------------------------------------------------------- plug-in mistakes

def test_a_user_registered_mistake_is_found():
    @mistake("scale_halved", title="scale halved", what="Scores times 1/(2 sqrt(d)).", where="a factor 2")
    def scale_halved(a: Attempt):
        return a.attend(scale=a.scale / 2)

    try:
        case, inputs, ref = cell(causal=True)
        got = diagnosed(lambda q, k, v, **kw: mistaken.attention(q, k, v, **{**kw, "scale": 0.5 / 4.0}),
                        case, inputs, ref)
        assert got["diagnosis"] == "scale_halved"
        assert diagnosed(mistaken.correct, case, inputs, ref)["diagnosis"] == "none"
        mistake("scale_halved", title="t", what="w.", where="w")(scale_halved)     # the same again: fine
        with pytest.raises(ValueError, match="already registered"):
            mistake("scale_halved", title="t", what="w.", where="w")(lambda a: None)
    finally:
        MISTAKES.pop("scale_halved", None)
    with pytest.raises(ValueError, match="rows"):
        mistake("x", title="t", what="w.", where="w", rows="some")


# --------------------------------------------------------------------------- slices and cost

def test_slices_keep_whole_batches_within_the_budget():
    assert diagnosis_slices(2, 4, 2, 64, 64, 32, "cpu") == ([0, 1], [0, 1, 2, 3])
    one = diagnosis.attention_flops(1, 1, 2048, 2048, 128, False)
    assert one > diagnosis.DIAGNOSIS_FLOP_BUDGET["cpu"]
    assert diagnosis_slices(1, 16, 4, 2048, 2048, 128, "cpu") == ([0], [1])     # one slice, a telling head
    batches, heads = diagnosis_slices(4, 8, 2, 512, 512, 64, "cpu")
    assert len(batches) * len(heads) * diagnosis.attention_flops(1, 1, 512, 512, 64, False) \
        <= diagnosis.DIAGNOSIS_FLOP_BUDGET["cpu"]
    assert any(h // 4 != h % 2 for h in heads) and batches == [0]
    assert diagnosis_slices(4, 8, 2, 512, 512, 64, "cuda") == ([0, 1, 2, 3], list(range(8)))


def test_slices_stay_within_the_golden_subset(monkeypatch):
    monkeypatch.setitem(reference.GOLDEN_FLOP_BUDGET, "cpu", 2 * reference.golden_flops(32, 32, 16, True) * 2)
    case, inputs, ref = cell(batch=3, heads=4, kv_heads=2, causal=True)
    assert ref.slices is not None and len(ref.slices) < 12
    got = diagnosed(mistaken.gqa_interleaved, case, inputs, ref)
    assert got["diagnosis"] == "gqa_interleaved"
    assert {tuple(s) for s in got["diagnosis_slices"]} <= set(ref.slices)


def test_no_host_tensor_meets_device_data():
    """On CUDA a CPU-made tensor meeting the inputs raises: built on the inputs' device throughout."""
    case, inputs, ref = cell(heads=4, kv_heads=2, causal=True, scenario="padding")
    with torch.no_grad():
        out = mistaken.gqa_interleaved(inputs.q, inputs.k, inputs.v, **inputs.call_kwargs())
    with HostProvenance() as mode:
        got = diagnose_cell(out, inputs, ref, "fp32", ref.baseline_rmse)
    assert mode.violations == [] and got["diagnosis"] == "gqa_interleaved"
