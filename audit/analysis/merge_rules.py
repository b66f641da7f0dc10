"""The merge audit's records judged (measure/merging): a merge function that returns NaN, an infinity or a
wrong result on a partial state is an error finding, one per outcome and diagnosis (merge_wrong), and so
is a gradient through it that is NaN or wrong (merge_grad_wrong), each naming the states, what it returned
and the known mistake that gives it; a negative control right on every state is a self-check failure
(nothing would catch that mistake); a merge function that raised or could not run says so.

Each column of a merge record has this rule: `outcome` (from the errors, the NaN and inf counts and the
empty rows, by measure/merging/judge.py's rule) is what merge_wrong reads, `diagnosis` names it;
`grad_outcome` (from grad_nan, grad_max_err and grad_tol: gradients.py) is what merge_grad_wrong reads,
`grad_diagnosis` names it."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping

from ..core.diagnosis_names import members
from ..workload.merge_mistakes import MERGE_MISTAKES
from .finding_rows import _finding

MERGE_CHECKS: tuple[str, ...] = ("merge_wrong", "merge_grad_wrong", "merge_control_uncaught", "merge_failed")
GRAD_BAD = ("nan", "wrong")
OUTCOME_WORDS = {"nan": "NaN", "inf": "an infinity", "wrong": "a wrong result"}


def _states_text(recs: list[Mapping[str, Any]]) -> str:
    """'both_empty (fp32, bf16), first_empty (fp32)'."""
    by_state: dict[str, list[str]] = defaultdict(list)
    for r in recs:
        by_state[str(r["state"])].append(str(r["dtype"]))
    return ", ".join(f"{state} ({', '.join(dtypes)})" for state, dtypes in by_state.items())


def _named(recs: Iterable[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(m for r in recs for m in members(r.get("diagnosis"))))


def check_merges(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The findings of a run's merge records (runfolder.read_merge_records), most severe first."""
    records = [r for r in records if isinstance(r, Mapping)]
    found: list[dict[str, Any]] = []
    for merge in dict.fromkeys(str(r.get("merge")) for r in records):
        mine = [r for r in records if str(r.get("merge")) == merge]
        control = next((r.get("control") for r in mine if r.get("control")), None)
        failed = [r for r in mine if r.get("status") == "error"]
        if failed:
            found.append(_finding("merge_failed", "error" if not control else "warning", merge,
                                  f"{merge} could not be audited: {failed[0].get('reason')}",
                                  [r["id"] for r in failed]))
            continue
        judged = [r for r in mine if r.get("status") == "ok"]
        bad = [r for r in judged if r.get("outcome") in OUTCOME_WORDS]
        bad_grads = [r for r in judged if r.get("grad_outcome") in GRAD_BAD]
        if control:
            if judged and not bad and not bad_grads:
                title = MERGE_MISTAKES[control].title if control in MERGE_MISTAKES else control
                found.append(_finding("merge_control_uncaught", "error", merge,
                                      f"negative control {merge} ({title}) "
                                      "is right on every partial state, values and gradients: the merge audit would "
                                      "not catch its mistake",
                                      [r["id"] for r in judged]))
            continue
        groups = dict.fromkeys((r.get("outcome"), r.get("diagnosis")) for r in bad)   # a finding per outcome and cause
        for outcome, diagnosis in sorted(groups, key=lambda g: list(OUTCOME_WORDS).index(g[0])):
            word = OUTCOME_WORDS[outcome]
            these = [r for r in bad if r.get("outcome") == outcome and r.get("diagnosis") == diagnosis]
            names = _named(these)
            cause = (f"; the mistake that gives it: {' or '.join(names)} "
                     f"({'; '.join(MERGE_MISTAKES[n].what for n in names if n in MERGE_MISTAKES)})") if names else \
                "; no known mistake gives it"
            found.append(_finding("merge_wrong", "error", merge,
                                  f"{merge} returns {word} merging partial attention on {_states_text(these)}{cause}",
                                  [r["id"] for r in these]))
        for outcome in GRAD_BAD:
            these = [r for r in bad_grads if r.get("grad_outcome") == outcome]
            if not these:
                continue
            names = list(dict.fromkeys(m for r in these for m in members(r.get("grad_diagnosis"))))
            cause = f"; as the mistake {' or '.join(names)} gives it" if names else "; no known mistake gives it"
            word = "NaN or infinite" if outcome == "nan" else "wrong"
            found.append(_finding("merge_grad_wrong", "error", merge,
                                  f"{merge}'s gradient through the merge is {word} against float64 autograd on "
                                  f"{_states_text(these)}{cause}: ring attention's backward gets it",
                                  [r["id"] for r in these]))
    return found


def merge_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """{merge: {state: the worst outcome over its dtypes}} (right < wrong < inf < nan; skipped and error as
    they are), for the report's table and the verdict."""
    order = {"right": 0, "wrong": 1, "inf": 2, "nan": 3, "skipped": 4, "error": 5}
    table: dict[str, dict[str, str]] = {}
    for r in records:
        if not isinstance(r, Mapping):
            continue
        row = table.setdefault(str(r.get("merge")), {})
        state = str(r.get("state", "all"))
        outcome = str(r.get("outcome"))
        if order.get(outcome, 5) >= order.get(row.get(state, "right"), 0):
            row[state] = outcome
    return table
