"""A diagnosis that rounding cannot flip (issue 54): a mistake is named alone only where no other
explains the output; mistakes the cell cannot tell apart are named together ("a or b"), and a
joined name is read as its members everywhere a diagnosis is read (core.diagnosis_names): the
findings, the paged finding, the reproduction scripts, the gradients named by the forward's mistake.
The form of a document-range mistake is chosen on the rows where the forms differ, not by the last
bits of the rows where they agree."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from audit.core import diagnosis_names as names
from audit.core.grid import Case
from audit.measure.diagnosis import diagnosis, lse_diagnosis
from audit.measure.cell.cellcache import build_reference
from audit.measure.diagnosis.diagnosis import Candidate, diagnose, diagnose_cell, named_matches, tolerance
from audit.workload import mistakes as library
from audit.workload.inputs import make_inputs
from audit.workload.mistake_base import Mistake, nearest_form

from tests.plugins import mistaken

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds

BASE = dict(variant="x", device="cpu", dtype="fp32", d_k=16, seq_len=32, batch=2, heads=2, causal=False,
            scenario="normal")


def cell(**fields):
    case = Case(**{**BASE, **fields})
    inputs = make_inputs(case)
    return case, inputs, build_reference(case, inputs)


# --------------------------------------------------------------------------- the names

def test_a_joined_name_is_read_as_its_members():
    assert names.joined(["a", "b", "a", "none"]) == "a or b" and names.joined([]) == "none"
    assert names.members("a or b") == ["a", "b"] and names.members("a") == ["a"]
    assert names.members("none") == [] and names.members(None) == [] and names.members(float("nan")) == []
    assert names.agrees("a or b", "a") and names.agrees("b", "a or b") and names.agrees("none", None)
    assert not names.agrees("a or b", "c") and not names.agrees("a", "none") and not names.agrees("none", "a")
    library_ = {"a": Mistake("a", "title a", "w.", "w", lambda x: None)}
    assert names.title_of("a or b", library_) == "title a or b" and names.title_of("none", library_) == "none"


# --------------------------------------------------------------------------- the forms of a mistake

def test_a_forms_row_with_no_key_is_compared_as_the_outputs_convention_there():
    """Two forms that agree where both have a key, differing in the last bits there: the row one of
    them empties decides, whichever way the last bits fall."""
    torch.manual_seed(0)
    within_row = torch.randn(1, 1, 4, 3, dtype=torch.float64)
    within_row[0, 0, 2] = float("nan")                                       # query 2: no key in its row
    flattened = within_row.clone()
    flattened[0, 0, 2] = torch.randn(3, dtype=torch.float64)                 # the next row's key
    flattened[0, 0, [0, 1, 3]] += 1e-15                                      # rounded otherwise
    observed = flattened.clone()                                             # the row form's, 0 on its empty row,
    observed[0, 0, 2] = 0.0                                                  # rounded as the flattened form
    assert nearest_form([within_row, flattened], observed) is within_row
    assert nearest_form([flattened, within_row], observed) is within_row    # not the order
    observed[0, 0, 2] = float("nan")                                         # its convention NaN
    assert nearest_form([within_row, flattened], observed) is within_row
    observed[0, 0, 2] = flattened[0, 0, 2]                                   # the flattened form's code
    assert nearest_form([within_row, flattened], observed) is flattened


def test_a_document_range_mistake_is_named_whichever_form_its_rounding_favours():
    """issue 54: the output of a kernel making document_queries_late within each batch row, on the rows
    both forms see exactly the flattened form's values (as ATEN_CPU_CAPABILITY=default rounded it on
    the first machine), elsewhere its own: named, not `none`."""
    case, inputs, ref = cell(scenario="packed")
    with torch.no_grad():
        out = mistaken.document_queries_late(inputs.q, inputs.k, inputs.v, **inputs.call_kwargs())
    attempt = diagnosis.attempt_for(inputs, [0, 1], [0, 1], observed=out)
    forms = [library._document_ranges(attempt, key_start=0, key_end=0, query_shift=1, key_shift=0, flattened=f)
             for f in (False, True)]
    keyed = [torch.isfinite(f).all(-1) for f in forms]                        # (b, h, T)
    assert (~keyed[0] & keyed[1]).any()                                      # rows only the flattened form keys
    nudged = torch.where((keyed[0] & keyed[1])[..., None], forms[1], out.double())
    got = diagnose_cell(nudged, inputs, ref, "fp32", ref.baseline_rmse)
    assert got["diagnosis"] == "document_queries_late", got
    assert diagnose_cell(out, inputs, ref, "fp32", ref.baseline_rmse)["diagnosis"] == "document_queries_late"


# --------------------------------------------------------------------------- which matches are named

def _offset(name: str, shift, specificity: int = 1) -> Mistake:
    """A mistake whose output is correct attention plus `shift` (b, h, Tq, d)."""
    return Mistake(name, name, "Shifted.", "a test", lambda a: a.attend() + shift, specificity=specificity)


def _shifted_cell():
    case, inputs, ref = cell(causal=True)
    attempt = diagnosis.attempt_for(inputs, [0, 1], [0, 1])
    golden = diagnosis._golden_for(ref, [0, 1], [0, 1]).double()
    tol = tolerance(ref.baseline_rmse, "fp32")
    u = torch.ones_like(golden)                                              # RMS 1
    w = torch.ones_like(golden)
    w[..., ::2] = -1.0                                                       # RMS 1, orthogonal to u
    return attempt, golden, tol, u, w


def test_two_mistakes_an_output_sits_between_are_both_named():
    """Both within their budget of the output, 1.5 budgets apart: which came out nearer is rounding,
    so both are named, in registration order; an output on one of them names it alone."""
    attempt, golden, tol, u, w = _shifted_cell()
    a, b = _offset("a", 10 * tol * u), _offset("b", 10 * tol * u + 1.5 * tol * w)
    between = golden + 10 * tol * u + 0.76 * tol * w                        # a hair nearer b
    found = diagnose(between, attempt, golden, tol, mistakes={"a": a, "b": b}, own_error=False)
    assert found.name == "a or b" and found.scores["a"][3] and found.scores["b"][3]
    on_a = golden + 10 * tol * u
    found = diagnose(on_a, attempt, golden, tol, mistakes={"a": a, "b": b}, own_error=False)
    assert found.name == "a" and not found.scores["b"][3]


def test_mistakes_the_cell_cannot_tell_apart_are_named_together_and_a_special_case_alone():
    attempt, golden, tol, u, _ = _shifted_cell()
    same = golden + 10 * tol * u
    pair = {"a": _offset("a", 10 * tol * u), "a_again": _offset("a_again", 10 * tol * u)}
    assert diagnose(same, attempt, golden, tol, mistakes=pair, own_error=False).name == "a or a_again"
    pair["a_again"] = _offset("a_again", 10 * tol * u, specificity=2)      # a special case of a
    assert diagnose(same, attempt, golden, tol, mistakes=pair, own_error=False).name == "a_again"
    # one just over its budget (the other's error in the last bits) but within a tolerance of the match
    near = {"a": _offset("a", 10 * tol * u), "c": _offset("c", 10 * tol * u + 0.9 * tol * u)}
    found = diagnose(golden + 10 * tol * u - 0.2 * tol * u, attempt, golden, tol, mistakes=near, own_error=False)
    assert not found.scores["c"][3] and found.name == "a or c"
    far = {"a": _offset("a", 10 * tol * u), "d": _offset("d", 13 * tol * u)}
    assert diagnose(same, attempt, golden, tol, mistakes=far, own_error=False).name == "a"


def test_a_mistake_is_named_where_the_output_is_told_from_correct_attention():
    """The edges of naming sit where the defect's own do: an output making a mistake 1.5 budgets from
    the golden is named (the rule before issue 54 wanted it two budgets away: `none`); an output within
    the budget never is, though within the mistake's; a mistake nearer the golden than its own budget
    is no mistake to name."""
    attempt, golden, tol, u, _ = _shifted_cell()
    near = {"m": _offset("m", 1.5 * tol * u)}
    assert diagnose(golden + 1.5 * tol * u, attempt, golden, tol, mistakes=near, own_error=False).name == "m"
    assert diagnose(golden + 0.8 * tol * u, attempt, golden, tol, mistakes=near, own_error=False).name == "none"
    slight = {"t": _offset("t", 0.5 * tol * u)}
    assert diagnose(golden + 1.2 * tol * u, attempt, golden, tol, mistakes=slight, own_error=False).name == "none"


def test_a_kernel_clamping_its_probabilities_is_named_on_a_cell_where_the_clamp_is_two_budgets_away():
    """Measured: on this fp32 cell the clamp moves the output 0.97 (native Xeon) to 1.01 (=default) times
    two budgets from the golden; the kernel is named on both, a correct one on neither."""
    case, inputs, ref = cell(scenario="scaled_x64", causal=True)
    for fn, expect in ((mistaken.probs_clamped, "probs_clamped"), (mistaken.correct, "none")):
        with torch.no_grad():
            out = fn(inputs.q, inputs.k, inputs.v, **inputs.call_kwargs())
        assert diagnose_cell(out, inputs, ref, "fp32", ref.baseline_rmse)["diagnosis"] == expect


def test_named_matches_names_nothing_without_a_match():
    c = [Candidate("x", 0, 1, 1.0, False, 0.0), Candidate("y", 1, 1, 1.0, False, 0.0)]
    assert named_matches(c, lambda a, b: True) == []


def test_gradients_two_backward_mistakes_explain_are_both_named():
    attempt, _, _, _, _ = _shifted_cell()
    torch.manual_seed(1)
    gold = {g: torch.randn(2, 2, 32, 16, dtype=torch.float64) for g in ("dq", "dk", "dv")}
    tol = {g: 1e-3 for g in gold}

    def scaled(name: str, factor: float) -> Mistake:
        return Mistake(name, name, "Scaled.", "a test", lambda a: {**gold, "dq": gold["dq"] * factor})
    both = {"x": scaled("x", 2.0), "x_again": scaled("x_again", 2.0), "y": scaled("y", 3.0)}
    observed = {**gold, "dq": gold["dq"] * 2.0}
    found = diagnosis.diagnose_grads(attempt, gold, observed, tol, mistakes=both)
    assert found.name == "x or x_again"
    assert diagnosis.diagnose_grads(attempt, gold, observed, tol, mistakes={"y": both["y"]}).name == "none"


def test_gradients_of_a_mistake_nearer_than_two_budgets_are_named_and_right_ones_not():
    attempt, _, _, _, _ = _shifted_cell()
    torch.manual_seed(3)
    gold = {g: torch.randn(2, 2, 32, 16, dtype=torch.float64) for g in ("dq", "dk", "dv")}
    tol = {g: 1e-3 for g in gold}
    shift = torch.ones_like(gold["dq"]) * 1.5e-3                             # 1.5 budgets (RMS)
    near = {"near": Mistake("near", "near", "w.", "w", lambda a: {**gold, "dq": gold["dq"] + shift})}
    made = {**gold, "dq": gold["dq"] + shift}
    assert diagnosis.diagnose_grads(attempt, gold, made, tol, mistakes=near).name == "near"
    assert diagnosis.diagnose_grads(attempt, gold, dict(gold), tol, mistakes=near).name == "none"


def test_the_lse_names_every_match():
    """lse_diagnosis._best: two lse mistakes alike on the compared rows are both named."""
    torch.manual_seed(2)
    right = torch.randn(1, 2, 8, dtype=torch.float64)
    rows = torch.ones(1, 2, 8, dtype=torch.bool)
    tol = 1e-4
    comparisons = {"lse": (right + 1.0, right, rows, tol)}
    found = {n: Mistake(n, n, "w.", "w", lambda a, s=s: right + s) for n, s in
             (("plus_one", 1.0), ("plus_one_again", 1.0), ("plus_two", 2.0))}
    got = lse_diagnosis._best(comparisons, found, lambda m: {"lse": lambda: m.fn(None)})
    assert got[0] == "plus_one or plus_one_again" and got[1] == 0.0
    del found["plus_one_again"]
    assert lse_diagnosis._best(comparisons, found, lambda m: {"lse": lambda: m.fn(None)})[0] == "plus_one"
    # a mistake 1.5 budgets from the right lse, made exactly: named; the right lse: not
    near = {"near": Mistake("near", "near", "w.", "w", lambda a: right + 1.5 * tol)}
    made = {"lse": (right + 1.5 * tol, right, rows, tol)}
    assert lse_diagnosis._best(made, near, lambda m: {"lse": lambda: m.fn(None)})[0] == "near"
    assert lse_diagnosis._best({"lse": (right, right, rows, tol)}, near, lambda m: {"lse": lambda: m.fn(None)}) is None


# --------------------------------------------------------------------------- measured cells

def _run(cases):
    from audit.workload import presets
    from tests.helpers import run_cells
    return run_cells(cases, dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0))


def test_a_paged_mistake_the_cell_cannot_tell_from_another_is_named_with_it(monkeypatch):
    """A second name for reads_past_used: the paged diagnosis says both, the finding both titles."""
    from audit.analysis.findings import compute_findings
    from audit.core.records import to_frame
    from audit.workload.paged_mistakes import PAGED_MISTAKES
    case = Case("broken.paged_extra_page", "cpu", "fp32", 16, 64, 2, 2, False, "paged")
    [alone] = _run([case]).values()
    assert alone["paged_diagnosis"] == "reads_past_used"
    twin = dataclasses.replace(PAGED_MISTAKES["reads_past_used"], name="reads_past_used_again", title="twin")
    monkeypatch.setitem(PAGED_MISTAKES, "reads_past_used_again", twin)
    [rec] = _run([case]).values()
    assert rec["paged_diagnosis"] == "reads_past_used or reads_past_used_again"
    [finding] = [f for f in compute_findings(to_frame([rec])) if f["check"] == "paged_reads"]
    assert finding["diagnosis_title"] == f"{PAGED_MISTAKES['reads_past_used'].title} or twin"
    assert "cannot tell apart" in finding["message"]


@pytest.mark.parametrize("kernel, column, mistake", [("lse_base2", "lse_diagnosis", "lse_base2"),
                                                     ("lse_no_grad", "lse_grad_diagnosis", "lse_no_grad")])
def test_an_lse_mistake_the_cell_cannot_tell_from_another_is_named_with_it(monkeypatch, kernel, column, mistake):
    from audit.workload.lse_mistakes import LSE_GRAD_MISTAKES, LSE_MISTAKES
    registry = LSE_GRAD_MISTAKES if column == "lse_grad_diagnosis" else LSE_MISTAKES
    case = Case(f"lse_kernels:{kernel}", "cpu", "fp32", 16, 32, 2, 4, True, "normal", 2)
    [alone] = _run([case]).values()
    assert alone[column] == mistake, alone["reason"]
    monkeypatch.setitem(registry, f"{mistake}_again", dataclasses.replace(registry[mistake], name=f"{mistake}_again"))
    [rec] = _run([case]).values()
    assert rec[column] == f"{mistake} or {mistake}_again"


# --------------------------------------------------------------------------- reading a joined name

def _frame(diagnoses):
    return pd.DataFrame([{"status": "ok", "dtype": "fp32", "scenario": "normal", "leak_max_change": None,
                          "out_nonfinite_visible": 0, "causal_alignment": None, "id": f"mine-{i}",
                          "variant": "mine", "within_budget": False, "err_ratio": 9.0, "diagnosis": d,
                          "diagnosis_err": 1e-7, "diagnosis_golden_err": 0.4} for i, d in enumerate(diagnoses)])


def test_a_finding_reads_a_joined_diagnosis_as_its_members():
    from audit.analysis.findings import compute_findings
    [finding] = [f for f in compute_findings(_frame(["gqa_interleaved or scale_missing"] * 2 + ["causal_upper"]))
                 if f["check"] == "error_budget"]
    assert finding["diagnosis"] == "gqa_interleaved or scale_missing" and finding["diagnosis_cells"] == 2
    assert finding["diagnosis_title"] == (f"{library.MISTAKES['gqa_interleaved'].title} or "
                                          f"{library.MISTAKES['scale_missing'].title}")
    assert "cannot tell apart" in finding["message"]
    assert library.MISTAKES["gqa_interleaved"].what in finding["message"]
    assert library.MISTAKES["scale_missing"].what in finding["message"]
    assert "Other cells match: causal_upper (1)" in finding["message"]
    # cells that could not tell a from b agree with the cells named a: counted with them
    [finding] = [f for f in compute_findings(_frame(["scale_missing", "gqa_interleaved or scale_missing",
                                                     "causal_upper"])) if f["check"] == "error_budget"]
    assert (finding["diagnosis"], finding["diagnosis_cells"]) == ("scale_missing", 2)
    assert "Other cells" in finding["message"] and "gqa_interleaved or" not in finding["message"].split("Other")[1]


def test_a_reproduction_holds_a_joined_diagnosis_where_a_member_is_named_again():
    from audit.repro.checks import _rediagnosed
    found = {"diagnosis": "scale_missing", "diagnosis_err": 1e-7, "diagnosis_golden_err": 0.3}
    for recorded, holds in (("scale_missing or scale_squared", True), ("scale_missing", True),
                            ("scale_squared or causal_upper", False), ("none", False)):
        defect, lines, _ = _rediagnosed(True, [], {}, {"diagnosis": recorded}, dict(found), "diagnosis", "the output")
        assert defect is holds, (recorded, lines)
    defect, _, _ = _rediagnosed(True, [], {}, {"diagnosis": "scale_missing"},
                                {**found, "diagnosis": "scale_missing or scale_squared"}, "diagnosis", "the output")
    assert defect is True


def test_gradients_are_named_by_a_member_of_a_joined_forward_diagnosis():
    """The forward's diagnosis "a or b": its members are tried on the gradients, the one that matches named."""
    from audit.measure.diagnosis.diagnosis import diagnose_grads_as_forward, diagnose_grads_cell
    case, inputs, ref = cell(causal=True)
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    made = mistaken.causal_next_key(q, k, v, **inputs.call_kwargs())
    out, grads = made.detach(), torch.autograd.grad(made, (q, k, v), inputs.grad_out)
    columns, evidence = diagnose_grads_cell(grads, inputs, ref, "fp32")
    assert columns["grad_diagnosis"] == "none"
    named = diagnose_grads_as_forward(evidence, inputs, ref, "fp32", "causal_upper or causal_next_key", out)
    assert named is not None and named["grad_diagnosis"] == "causal_next_key"
    assert diagnose_grads_as_forward(evidence, inputs, ref, "fp32", "causal_upper or scale_missing", out) is None
