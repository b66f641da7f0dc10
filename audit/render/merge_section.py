"""The report's "Merging partial attention" section and the verdict's words on merge functions, from the
run's merge records (DIR/merges.jsonl; measure/merging): per merge function × partial state, what it
returns (right, NaN, inf, wrong; its worst over the state's dtypes) and the mistake that gives it. Reads
records and findings; never measures, never imports torch. Empty where the run audited no merge."""
from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from ..analysis.merge_rules import UNMERGEABLE, merge_summary, state_label
from ..core.diagnosis_names import members
from ..workload.merge_mistakes import GOLDEN_PARTS
from .page import Block, Heading, Table, para

MERGE_HEADING = "Merging partial attention"
WORDS = {"right": "right", "nan": "NaN", "inf": "inf", "wrong": "wrong", "skipped": "skipped", "error": "error",
         UNMERGEABLE: "parts unmergeable"}


def _cell(outcome: str, diagnoses: list[str]) -> str:
    word = WORDS.get(outcome, outcome)
    return f"{word}: {' or '.join(diagnoses)}" if diagnoses and outcome not in ("right", "skipped", "error",
                                                                              UNMERGEABLE) else word


def _gradient_cell(recs: list[Mapping[str, Any]]) -> str:
    """The gradient column: right, not differentiable, or what it is wrong as and on which states."""
    outcomes = {str(r.get("grad_outcome")) for r in recs if r.get("grad_outcome")}
    bad = [r for r in recs if r.get("grad_outcome") in ("nan", "wrong", "error")]
    if bad:
        words = sorted({"NaN" if r["grad_outcome"] == "nan" else str(r["grad_outcome"]) for r in bad})
        return f"{', '.join(words)} on {', '.join(dict.fromkeys(state_label(r) for r in bad))}"
    if outcomes == {"not_differentiable"}:
        return "not differentiable"
    return "right" if outcomes else ""


def merge_table(records: list[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per merge function (controls last), one column per state: the worst outcome and its mistakes."""
    summary = merge_summary(records)
    states = list(dict.fromkeys(state_label(r) for r in records if r.get("state")))
    controls = {str(r.get("merge")) for r in records if r.get("control")}
    rows = []
    for merge in sorted(summary, key=lambda m: (m in controls, list(summary).index(m))):
        by_state = summary[merge]
        row: dict[str, str] = {"merge function": merge + (" (control)" if merge in controls else "")}
        for state in states:
            outcome = by_state.get(state, by_state.get("all"))      # "all": a function that could not be run
            named = list(dict.fromkeys(m for r in records if r.get("merge") == merge and r.get("state")
                                       and state_label(r) == state
                                       and r.get("outcome") == outcome for m in members(r.get("diagnosis"))))
            row[state] = "" if outcome is None else _cell(outcome, named)
        if not states:
            row["outcome"] = _cell(next(iter(by_state.values()), ""), [])
        row["gradient"] = _gradient_cell([r for r in records if r.get("merge") == merge])
        rows.append(row)
    return pd.DataFrame(rows)


def merge_section(records: list[Mapping[str, Any]], findings: list[Mapping[str, Any]]) -> list[Block]:
    """The section: what it tests, a table per maker of the parts (the golden's, then each kernel's: run
    --merge-parts), each finding's words; nothing where no merge was audited."""
    if not records:
        return []
    real = [f for f in findings if f.get("check") in ("merge_wrong", "merge_grad_wrong", "merge_parts_wrong",
                                                      "merge_parts_failed")]
    uncaught = [f for f in findings if f.get("check") == "merge_control_uncaught"]
    controls = {str(r.get("merge")) for r in records if r.get("control")}
    blocks: list[Block] = [
        Heading(2, MERGE_HEADING),
        para("Split-KV decoding, context-parallel and ring attention and chunked prefill compute attention on "
             "parts of the keys and merge the parts' (out, lse) pairs. Each merge function merged the partial "
             "states of real splits and the edge states that break merges (an empty part, two, an empty part "
             "with FlashAttention's +inf lse, lses 100 nats apart), judged against float64 attention over all "
             "the keys, with (0, -inf) for a row that sees none (docs/numerics.md, Merging partial attention). "
             "Each cell: the worst outcome over the state's dtypes, and the known mistake that gives it; gradient: "
             "d/d(out_i, lse_i) through the merge against float64 autograd, where the merge is differentiable."),
    ]
    makers = list(dict.fromkeys(r.get("parts_from") or GOLDEN_PARTS for r in records))
    for made in makers:
        mine = [r for r in records if (r.get("parts_from") or GOLDEN_PARTS) == made and r.get("merge") is not None]
        if mine:
            blocks.append(Table(merge_table(mine), caption="Per merge function and partial state" + (
                "" if made == GOLDEN_PARTS else f", the parts made by {made} (parts unmergeable: the reference merge "
                                            "of them misses too, the kernel's fault)")))
    blocks += [para(f["message"]) for f in real]
    caught = len(controls) - len(uncaught)
    if controls:
        blocks.append(para(f"Negative controls caught: {caught}/{len(controls)}."
                           + ("" if not uncaught else " Not caught: " + ", ".join(f["variant"] for f in uncaught)
                              + ".")))
    return blocks


def merge_verdict(records: list[Mapping[str, Any]], findings: list[Mapping[str, Any]]) -> list[Block]:
    """The verdict's paragraph on merge functions: which are right on every state, which are not and where."""
    if not records:
        return []
    controls = {str(r.get("merge")) for r in records if r.get("control")}
    summary = {m: v for m, v in merge_summary(records).items() if m not in controls}
    if not summary:
        return []
    right = [m for m, states in summary.items() if set(states.values()) <= {"right", UNMERGEABLE}]
    wrong = {f["variant"]: f for f in findings if f.get("check") == "merge_wrong"}
    judged_right = ("right", UNMERGEABLE)      # a kernel's unmergeable parts are not the function's miss
    text = "Merging partial attention: " + (f"right on every partial state: {', '.join(right)}. " if right else "")
    if wrong:
        text += "Wrong: " + "; ".join(
            f"{m} ({', '.join(sorted({WORDS.get(o, o) for o in summary.get(m, {}).values() if o not in judged_right}))}"
            f" on "
            f"{', '.join(s for s, o in summary.get(m, {}).items() if o not in ('right', UNMERGEABLE))})"
            for m in wrong) + " (see " + MERGE_HEADING + ")."
    parts = [f for f in findings if f.get("check") == "merge_parts_wrong"]
    if parts:
        text += " Partial states no merge can merge right: " + "; ".join(
            f"{f['variant']}'s ({f.get('diagnosis')})" for f in parts) + "."
    return [para(text.strip())]
