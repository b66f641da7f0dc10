"""The numerics contract, one test per cell of the selected preset.

For correct variants: no NaN/inf where the float64 golden is finite, error within
budget (rmse <= 2 x rmse(eager, same dtype) + atol), each gradient within its budget
(the same rule on dq, dk and dv), no weight leaking to masked
keys, fully masked rows give NaN or 0 (never garbage), a returned log-sum-exp within its
budgets (its value, the merge of two halves, the gradient through it). Known, documented
failures of correct variants and every cell of a negative control are marked
xfail with the reason; a control that nobody flags fails `test_negative_controls_are_flagged`.
"""
from __future__ import annotations

import pytest

from audit.core.defects import WARNING_DEFECTS
from audit.core.referee import failed_checks
from audit.workload import variants
from audit.workload.variant_contract import BROKEN_PREFIX

from .conftest import selected_cases

FULLY_MASKED = ("fully_masked_bool", "fully_masked_neginf", "fully_masked_finfo_min")
HAND_WRITTEN = ("eager", "eager_fp32", "compiled", "compiled_unfused")
HUGE_LOGITS = ("scaled_x64", "fp16_range", "low_lse")
CPU_FLASH = ("sdpa", "sdpa_flash")


def known_failure(rec: dict) -> str | None:
    """Why a cell of a correct variant is expected to break the contract, or None."""
    name, scenario = rec["variant"], rec["scenario"]
    if name in variants.REFEREE_CONTROL_NAMES:
        return "negative control: built to fail a referee check (right values, one trick)"
    if name.startswith(BROKEN_PREFIX):
        return "negative control: built to fail the numerics checks"
    if scenario == "fp16_range" and rec["dtype"] == "fp16" and name in ("eager", "compiled", "compiled_unfused"):
        return "fp16 Q·Kᵀ before scaling overflows 65504 (pytorch#119131)"
    fully_masked = scenario in ("fully_masked_bool", "fully_masked_neginf", "packed") or (
        scenario == "left_padding" and rec["causal"])            # left padding + causal: the first rows see no key;
                                                                 # packed: the padding rows past cu_seqlens[-1]
    if fully_masked and name in HAND_WRITTEN and not rec.get("fused_sdpa"):
        return "hand-written softmax over a row of -inf is 0/0: NaN output rows and NaN gradients"
    if scenario == "fully_masked_finfo_min":
        return "a finfo.min mask is finite: fully masked rows attend uniformly to masked keys (a leak)"
    if (rec["device"] == "cpu" and rec["dtype"] == "fp32" and scenario in HUGE_LOGITS
            and (name in CPU_FLASH or rec.get("sdpa_backend") == "FLASH_ATTENTION" or rec.get("fused_sdpa"))):
        return ("the CPU flash kernel's backward recomputes P from the logsumexp: at huge logits its fp32 "
                "gradients carry up to ~50x hand-written fp32 attention's error (a grad_error_budget finding)")
    if name == "flash_op" and rec["device"] == "cpu":
        return LSE_OP_KNOWN
    return None


# torch's own ops, reported as the audit finds them: every SDPA op marks its logsumexp
# non-differentiable (derivatives.yaml), and the CPU flash op writes lse 0 on a row that sees no key.
LSE_OP_KNOWN = ("aten._scaled_dot_product_flash_attention_for_cpu: its lse carries no gradient and is 0 on rows "
                "that see no key, so merges of causal halves and gradients through it fail (lse_error_budget, "
                "lse_grad_budget)")
KNOWN_FINDINGS = {("flash_op", "lse_error_budget"), ("flash_op", "lse_grad_budget")}


def _cell_ids(config) -> list[str]:
    return [c.id for c in selected_cases(config)]


def pytest_generate_tests(metafunc):
    if "cell_id" in metafunc.fixturenames:
        ids = _cell_ids(metafunc.config)
        metafunc.parametrize("cell_id", ids, ids=ids)


def check_contract(rec: dict) -> list[str]:
    """Every way the record breaks the numerics contract (empty when it holds)."""
    problems = []
    if rec["out_nonfinite_visible"]:
        problems.append(f"{rec['out_nonfinite_visible']} NaN/inf outputs where float64 is finite")
    if rec["grad_nan"] or rec["grad_inf"]:
        problems.append(f"NaN/inf gradients ({rec['grad_nan']} NaN, {rec['grad_inf']} inf)")
    if rec["within_budget"] is False:
        problems.append(f"outside the error budget (err_ratio {rec['err_ratio']})")
    for grad in ("dq", "dk", "dv", "dsinks"):
        if rec.get(f"{grad}_within_budget") is False:
            problems.append(f"{grad} outside its gradient budget ({grad}_err_ratio {rec[f'{grad}_err_ratio']})")
    for verdict, ratio in (("lse_within_budget", "lse_err_ratio"), ("merge_within_budget", "merge_err_ratio"),
                           ("lse_grads_within_budget", "lse_dq_err_ratio")):
        if rec.get(verdict) is False:
            problems.append(f"{verdict} is false ({ratio} {rec.get(ratio)})")
    if rec.get("lse_masked_rows") not in (None, "-inf", "+inf"):
        problems.append(f"the lse on fully masked rows is {rec['lse_masked_rows']}")
    if rec["leak_max_change"]:
        problems.append(f"output changes by {rec['leak_max_change']:.3g} when masked keys change")
    if rec["masked_rows"] not in (None, "zero", "nan"):
        problems.append(f"fully masked rows return {rec['masked_rows']}")
    for check in failed_checks(rec):                     # the referee: did every call do the work?
        problems.append(f"referee {check}: {(rec.get('referee_detail') or {}).get(check, '')}")
    return problems


def test_cell(audited_run, cell_id, request):
    _, by_id, _ = audited_run
    rec = by_id[cell_id]
    if rec["status"] == "skipped":
        pytest.skip(rec["reason"])
    assert rec["status"] == "ok", f"{rec['status']}: {rec['reason']}"
    reason = known_failure(rec)
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=False))
    problems = check_contract(rec)
    assert not problems, f"{cell_id}: " + "; ".join(problems)


def test_every_cell_recorded_once(audited_run, request):
    run_dir, by_id, _ = audited_run
    from audit.core import records
    lines = (run_dir / records.RECORDS_FILE).read_text().splitlines()
    assert len(lines) == len(by_id) == len(_cell_ids(request.config))


def test_negative_controls_are_flagged(audited_run):
    """Each negative control in the run gets at least one error finding (a control of a warning-level
    defect: a warning of its check, core.defects.WARNING_DEFECTS)."""
    _, by_id, findings = audited_run
    present = {r["variant"] for r in by_id.values()
               if r["variant"].startswith(BROKEN_PREFIX) and r["status"] == "ok"}
    flagged = {f["variant"] for f in findings if f["severity"] == "error" or f["check"] in WARNING_DEFECTS}
    assert present - flagged == set(), f"not flagged: {sorted(present - flagged)}"


def test_correct_variants_clean_on_normal_inputs(audited_run):
    """No error finding names a correct variant on a normal-input cell."""
    _, by_id, findings = audited_run
    wrong = [(f["variant"], f["check"]) for f in findings if f["severity"] == "error"
             and not f["variant"].startswith(BROKEN_PREFIX)
             and (f["variant"], f["check"]) not in KNOWN_FINDINGS
             and any(by_id[c]["scenario"] == "normal" for c in f["cells"] if c in by_id)]
    assert wrong == []


def test_report_renders(audited_run):
    """The report the audit wrote at the end of its run (audit run, as the suite's fixture makes it):
    its page, at least six figures, each shown on the page and in the markdown."""
    run_dir = audited_run[0]
    figures = sorted(run_dir.glob("*.png"))
    assert len(figures) >= 6
    text, page = (run_dir / "index.md").read_text(), (run_dir / "index.html").read_text()
    for fig in figures:
        assert f"]({fig.name})" in text and f'src="{fig.name}"' in page
