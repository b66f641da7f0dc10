"""The merge audit's records judged (measure/merging): a merge function that returns NaN, an infinity or a
wrong result on a partial state is an error finding, one per outcome and diagnosis (merge_wrong), and so
is a gradient through it that is NaN or wrong (merge_grad_wrong), each naming the states, what it returned
and the known mistake that gives it; a negative control right on every state is a self-check failure
(nothing would catch that mistake); a merge function that raised or could not run says so.

Each column of a merge record has this rule: `outcome` (from the errors, the NaN and inf counts and the
empty rows, by measure/merging/judge.py's rule) is what merge_wrong reads, `diagnosis` names it;
`grad_outcome` (from grad_nan, grad_max_err and grad_tol: gradients.py) is what merge_grad_wrong reads,
`grad_diagnosis` names it.

On the parts an attention kernel made (`parts_from`, run --merge-parts), `reference_outcome` (the reference
merge's outcome on the same parts) decides whose fault a miss is: where the reference merge is right, a merge
function that misses is at fault (merge_wrong, naming the parts' `parts_defects`, what they hold on rows that
see no key); where it is not, the parts cannot be merged right and the kernel is (merge_parts_wrong, an error
about the variant, its diagnosis the parts' defects); a kernel that could not make its parts, merge_parts_failed."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping

from ..core.diagnosis_names import members
from ..workload.merge_mistakes import GOLDEN_PARTS, GRAD_BAD, MERGE_MISTAKES, PART_DEFECTS, parts_label
from .finding_rows import _finding

MERGE_CHECKS: tuple[str, ...] = ("merge_wrong", "merge_grad_wrong", "merge_control_uncaught", "merge_failed",
                                  "merge_parts_wrong", "merge_parts_failed")
OUTCOME_WORDS = {"nan": "NaN", "inf": "an infinity", "wrong": "a wrong result"}


def state_label(r: Mapping[str, Any]) -> str:
    """A record's state, and @variant where a kernel made its parts: 'ring_4@eager'."""
    return parts_label(str(r["state"]), r.get("parts_from"))


def _states_text(recs: list[Mapping[str, Any]]) -> str:
    """'both_empty (fp32, bf16), first_empty@eager (fp32)'."""
    by_state: dict[str, list[str]] = defaultdict(list)
    for r in recs:
        by_state[state_label(r)].append(str(r["dtype"]))
    return ", ".join(f"{state} ({', '.join(dtypes)})" for state, dtypes in by_state.items())


def _defects_text(recs: list[Mapping[str, Any]]) -> str:
    """What kernel-made parts among `recs` hold on rows that see no key: '; on eager's parts: out NaN on ...'."""
    said = []
    for made in dict.fromkeys(r.get("parts_from") for r in recs if r.get("parts_from") not in (None, GOLDEN_PARTS)):
        names = _defect_names([r for r in recs if r.get("parts_from") == made])
        if names:
            said.append(f"on {made}'s parts: " + "; ".join(PART_DEFECTS.get(n, n) for n in names))
    return "".join(f" ({s})" for s in said)


def _defect_names(recs: list[Mapping[str, Any]]) -> list[str]:
    """The parts' defects (PART_DEFECTS names) the records say, each once, in order."""
    return list(dict.fromkeys(n.strip() for r in recs for n in str(r.get("parts_defects") or "none").split(",")
                              if n.strip() not in ("", "none")))


def _mergeable(r: Mapping[str, Any]) -> bool:
    """Whether a record's parts merge right by the reference merge (the golden's always; older records say nothing)."""
    return r.get("reference_outcome") in (None, "right")


def _parts_findings(records: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """merge_parts_wrong and merge_parts_failed, one per attention variant whose parts were audited."""
    found = []
    for made in dict.fromkeys(r.get("parts_from") for r in records if r.get("parts_from") not in (None, GOLDEN_PARTS)):
        mine = [r for r in records if r.get("parts_from") == made]
        failed = [r for r in mine if r.get("merge") is None]
        if failed:
            found.append(_finding("merge_parts_failed", "warning", made, str(failed[0].get("reason")),
                                  [r["id"] for r in failed]))
            continue
        bad = list({(r["state"], r["dtype"]): r for r in mine
                    if r.get("status") == "ok" and not _mergeable(r)}.values())          # once per state
        if not bad:
            continue
        outcomes = ", ".join(OUTCOME_WORDS.get(str(o), str(o))
                             for o in dict.fromkeys(r["reference_outcome"] for r in bad))
        finding = _finding("merge_parts_wrong", "error", made,
                           f"{made}'s (out, lse) over part of the keys cannot be merged right: the reference merge "
                           f"of them gives {outcomes} on {_states_text(bad)}{_defects_text(bad)}",
                           [r["id"] for r in bad])
        finding["diagnosis"] = ", ".join(_defect_names(bad)) or "none"
        found.append(finding)
    return found


def _named(recs: Iterable[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(m for r in recs for m in members(r.get("diagnosis"))))


def check_merges(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The findings of a run's merge records (runfolder.read_merge_records), most severe first."""
    records = [r for r in records if isinstance(r, Mapping)]
    found: list[dict[str, Any]] = _parts_findings(records)
    for merge in dict.fromkeys(str(r["merge"]) for r in records if r.get("merge") is not None):
        mine = [r for r in records if str(r.get("merge")) == merge]
        control = next((r.get("control") for r in mine if r.get("control")), None)
        failed = [r for r in mine if r.get("status") == "error"]
        if failed:
            found.append(_finding("merge_failed", "error" if not control else "warning", merge,
                                  f"{merge} could not be audited: {failed[0].get('reason')}",
                                  [r["id"] for r in failed]))
            continue
        judged = [r for r in mine if r.get("status") == "ok" and _mergeable(r)]   # the parts' fault otherwise
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
                                  f"{merge} returns {word} merging partial attention on {_states_text(these)}{cause}"
                                  f"{_defects_text(these)}",
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


UNMERGEABLE = "parts"      # merge_summary's outcome where the reference merge misses too: the parts' fault


def merge_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """{merge: {state label: the worst outcome over its dtypes}} (right < parts < wrong < inf < nan; skipped
    and error as they are; `parts` where the kernel's parts cannot be merged right, whatever the function
    gave), for the report's table and the verdict."""
    order = {"right": 0, UNMERGEABLE: 1, "wrong": 2, "inf": 3, "nan": 4, "skipped": 5, "error": 6}
    table: dict[str, dict[str, str]] = {}
    for r in records:
        if not isinstance(r, Mapping) or (r.get("merge") is None and r.get("parts_from")):
            continue                                   # a kernel that made no parts: merge_parts_failed says so
        row = table.setdefault(str(r.get("merge")), {})
        state = state_label(r) if r.get("state") else "all"
        outcome = str(r.get("outcome")) if _mergeable(r) or r.get("status") != "ok" else UNMERGEABLE
        if order.get(outcome, 6) >= order.get(row.get(state, "right"), 0):
            row[state] = outcome
    return table
