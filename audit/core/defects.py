"""Which cells show a numerics defect: one definition for the measuring side (the cells that get
a diagnosis, measure/diagnosis/diagnosis.py) and for the findings (the cells an error finding covers)."""
from __future__ import annotations

import math
from typing import Any, Mapping

# The tensors the determinism check compares between runs (measure/cell/repeats.py), in this order in
# repeat_differs.
REPEATED_TENSORS = ("out", "dq", "dk", "dv")
# The checks whose findings are warnings (a property a user may accept, as nondeterminism) and yet a
# defect: a negative control built to show one of them is caught by its warning.
WARNING_DEFECTS = ("nondeterministic", "batch_invariance", "chunk_invariance")
LEAK_OVER_NOISE = 10.0   # a leak changes the output by more than this × the variant's run-to-run difference


def _number(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if math.isnan(out) else out


def leaks(rec: Mapping[str, Any]) -> bool:
    """Masked keys reach the output: it changes with them by more than the variant's own
    run-to-run noise (a nondeterministic kernel differs between any two calls), or its own
    weights put probability on them."""
    return (_number(rec.get("leak_max_change")) > LEAK_OVER_NOISE * _number(rec.get("repeat_max_diff"))
            or _number(rec.get("leak_mass")) > 0)


def crosses_documents(rec: Mapping[str, Any]) -> bool:
    """Packed documents see each other: a document's output changes with the others' keys and
    values by more than the variant's run-to-run difference."""
    return _number(rec.get("cross_doc_max_change")) > LEAK_OVER_NOISE * _number(rec.get("repeat_max_diff"))


def reads_unused_slots(rec: Mapping[str, Any]) -> bool:
    """A paged kernel's output depends on slots of its cache it must not read."""
    return _number(rec.get("paged_unread_max_change")) > LEAK_OVER_NOISE * _number(rec.get("repeat_max_diff"))


def nonfinite(rec: Mapping[str, Any]) -> bool:
    """NaN/inf in output rows that see a key, or in the gradients (the golden is finite there)."""
    return (_number(rec.get("out_nonfinite_visible")) > 0
            or _number(rec.get("grad_nan")) + _number(rec.get("grad_inf")) > 0)


# The gradients the gradient budget judges: dq, dk, dv and, in a sinks cell, the sinks'.
BUDGETED_GRADIENTS = (*REPEATED_TENSORS[1:], "dsinks")
# The verdicts on a returned log-sum-exp (measure.checks.lse: lse_error, lse_merge, lse_shards, lse_grads).
LSE_VERDICTS = ("lse_within_budget", "merge_within_budget", "shards_within_budget", "lse_grads_within_budget")


def grad_outside_budget(rec: Mapping[str, Any]) -> list[str]:
    """The gradients (of dq, dk, dv, dsinks) outside their budget: the cells the error finding
    grad_error_budget is made of."""
    return [g for g in BUDGETED_GRADIENTS if rec.get(f"{g}_within_budget") is False]


def lse_outside_budget(rec: Mapping[str, Any]) -> list[str]:
    """The lse verdicts that failed (LSE_VERDICTS): the cells the error finding lse_error_budget is
    made of, whose lse gets a diagnosis."""
    return [v for v in LSE_VERDICTS if rec.get(v) is False]


def numerics_defect(rec: Mapping[str, Any]) -> bool:
    """Output outside the error budget, leaking, or non-finite where the golden is finite: the
    cells the error findings nonfinite, error_budget and masked_leakage are made of, whose output
    gets a diagnosis (gradients outside their budget get one of their own: grad_outside_budget)."""
    return rec.get("within_budget") is False or leaks(rec) or nonfinite(rec)
