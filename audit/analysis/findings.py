"""The rules engine: every finding rule over the records, the known mistake that explains each
numerics error, findings.json.

The rules read the tidy DataFrame (records.to_frame) and return findings: dicts with `check`,
`severity` (error, warning, info), `variant`, `message` and `cells` (the ids it covers). They live
by subject (numerics_rules, run_rules, layout_rules, argument_rules, noise_rules), each marked with
its place in the order (rule_registry.rule). Pure pandas: no torch, no measuring.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.diagnosis_names import agrees, members, title_of
from ..core.runfolder import FINDINGS_FILE
from ..workload.variant_contract import BROKEN_PREFIX
from . import argument_rules, layout_rules, noise_rules, numerics_rules, run_rules
from .finding_rows import _finding, _num
from .rule_registry import Rule, registered_rules

SEVERITY_ORDER = ("error", "warning", "info")       # most severe first: the findings' order and the report's

# Importing the rules modules registers their rules (rule_registry.rule); RULES holds them in their order.
RULE_MODULES = (numerics_rules, layout_rules, run_rules, argument_rules, noise_rules)
RULES: tuple[Rule, ...] = registered_rules()


# Error findings about numerics: their cells carry a diagnosis (measure/diagnosis/diagnosis.py), of the
# output (column "diagnosis", workload.mistakes) or of the gradients ("grad_diagnosis",
# workload.backward_mistakes).
DIAGNOSED_CHECKS = {"nonfinite": "diagnosis", "error_budget": "diagnosis", "masked_leakage": "diagnosis",
                    "grad_error_budget": "grad_diagnosis", "lse_error_budget": "lse_diagnosis",
                    "lse_grad_budget": "lse_grad_diagnosis"}


def _add_diagnosis(finding: dict, frame: pd.DataFrame) -> None:
    """The known mistake most of the finding's diagnosed cells match, with its explanation, on
    the finding (diagnosis, diagnosis_title, diagnosis_cells, diagnosis_err, diagnosis_golden_err)
    and at the end of its message; "none" when no mistake matched any of them."""
    from ..workload.backward_mistakes import BACKWARD_MISTAKES
    from ..workload.lse_mistakes import all_lse_mistakes
    from ..workload.mistakes import MISTAKES

    column = DIAGNOSED_CHECKS[finding["check"]]
    # gradients are named by a backward mistake, or by the forward's mistake where they are its
    # gradients (measure/diagnosis/diagnosis.py: diagnose_grads_as_forward)
    library = {"grad_diagnosis": {**MISTAKES, **BACKWARD_MISTAKES}, "lse_diagnosis": all_lse_mistakes(),
               "lse_grad_diagnosis": all_lse_mistakes()}.get(column, MISTAKES)
    if column not in frame:
        return
    cells = frame[frame["id"].isin(finding["cells"]) & frame[column].notna()]
    if cells.empty:
        return
    what = {"grad_diagnosis": "its gradients match", "lse_diagnosis": "its lse matches",
            "lse_grad_diagnosis": "its gradient through the lse matches"}.get(column, "the output matches")
    matched = cells[cells[column] != "none"]
    if matched.empty:
        finding.update(diagnosis="none", diagnosis_cells=0)
        subject = {"grad_diagnosis": "its gradients", "lse_diagnosis": "its lse",
                   "lse_grad_diagnosis": "its gradient through the lse"}.get(column, "its output")
        finding["message"] += (f" Diagnosis: no known mistake matches {subject} "
                               f"in the {len(cells)} diagnosed cell(s) (docs/numerics.md, Diagnosis).")
        return
    counts = matched[column].value_counts()
    # a cell that could not tell a from b ("a or b") agrees with a cell named a: the name most cells
    # agree with, then the one most cells have, then the fewest names
    agreeing = {n: int(matched[column].map(lambda m, n=n: agrees(m, n)).sum()) for n in counts.index}
    name = str(sorted(counts.index, key=lambda n: (-agreeing[n], -counts[n], len(members(n)), n))[0])
    best = matched[matched[column].map(lambda m: agrees(m, name))]
    golden_err = _num(best, f"{column}_golden_err")
    example = best.loc[golden_err.idxmax()] if golden_err.notna().any() else best.iloc[0]
    known = [library[n] for n in members(name) if n in library]
    title = title_of(name, library)
    lead = f"{what} a known mistake," if len(members(name)) < 2 else \
        f"{what} known mistakes its inputs cannot tell apart,"
    if column == "grad_diagnosis" and all(n in MISTAKES and n not in BACKWARD_MISTAKES for n in members(name)):
        lead = "no backward mistake explains its gradients: they are those of the forward's mistake, differentiated,"
    finding.update(diagnosis=name, diagnosis_title=title, diagnosis_cells=int(len(best)),
                   diagnosis_err=_float(example.get(f"{column}_err")),
                   diagnosis_golden_err=_float(example.get(f"{column}_golden_err")))
    others = [f"{n} ({int(counts[n])})" for n in counts.index if not agrees(n, name)]
    text = (f" Diagnosis: in {len(best)} of {len(cells)} diagnosed cell(s) {lead} "
            f"{title} (RMSE {_fmt(finding['diagnosis_err'])} against it, {_fmt(finding['diagnosis_golden_err'])} "
            f"against the correct golden, at {example['id']}).")
    for m in known:
        text += f" {m.what} Usually {m.where}"
        if not text.endswith("."):
            text += "."
    if others:
        text += f" Other cells match: {', '.join(others)}."
    finding["message"] += text


def _float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def compute_findings(frame: pd.DataFrame) -> list[dict]:
    """Every rule over the frame, most severe first; numerics errors with their diagnosis."""
    if frame.empty:
        return []
    found = [f for rule in RULES for f in _guarded(rule, frame)]
    for finding in found:
        if finding["check"] in DIAGNOSED_CHECKS:
            try:
                _add_diagnosis(finding, frame)
            except Exception as exc:  # noqa: BLE001 - the finding stands without its diagnosis, said so
                finding["diagnosis_error"] = f"{type(exc).__name__}: {exc}"
    with_reference_kernels(found, frame)
    return sorted(found, key=lambda f: (SEVERITY_ORDER.index(f["severity"]), f["check"], f["variant"]))


# Findings about what a variant's output holds: where the reference kernels' handling of the
# scenario is known (workload.inputs.Scenario.reference_kernels), the finding says it.
REFERENCE_NOTE_CHECKS = ("nonfinite", "error_budget", "masked_leakage", "paged_reads")


def with_reference_kernels(found: list[dict[str, Any]], frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Each REFERENCE_NOTE_CHECKS finding about a real variant on a scenario whose reference kernels'
    handling is known: `reference_kernels` (those sentences) and "Elsewhere: ..." in its message."""
    from ..workload.inputs import SCENARIOS
    if "scenario" not in frame.columns:
        return found
    scenario_of = dict(zip(frame["id"], frame["scenario"]))
    for finding in found:
        if finding["check"] not in REFERENCE_NOTE_CHECKS or finding["variant"].startswith(BROKEN_PREFIX):
            continue
        notes = list(dict.fromkeys(SCENARIOS[s].reference_kernels for s in (scenario_of.get(c) for c in finding["cells"])
                                   if s in SCENARIOS and SCENARIOS[s].reference_kernels))
        if notes:
            finding["reference_kernels"] = notes
            finding["message"] += " Elsewhere: " + "; ".join(notes) + "."
    return found


RULE_FAILED = "audit_rule_failed"     # a rule that raised on these records: the audit's bug, said in a finding


def _guarded(rule: Rule, frame: pd.DataFrame) -> list[dict]:
    """A rule's findings; a rule that raises on these records (a bug of the audit's, or records
    edited by hand) gives one warning naming it and why, and the other rules still judge: a report
    is never lost to one rule, and no traceback is printed."""
    try:
        return rule(frame)
    except Exception as exc:  # noqa: BLE001 - reported as a finding, as documented
        text = str(exc).strip().splitlines()
        return [_finding(RULE_FAILED, "warning", "*",
                         f"attn-audit's rule {rule.__name__} could not judge these records ({type(exc).__name__}: "
                         f"{text[0] if text else ''}): what it checks is not reported for this run. This is a bug "
                         "of attn-audit (or records edited by hand): please report it with the run folder.", [])]


def write_findings(run_dir: str | Path, records: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Compute findings from DIR's records (`records`: those already read) and write DIR/findings.json
    (and the model audit's to DIR/model_findings.json, the merge audit's to DIR/merge_findings.json,
    where the run made them)."""
    from ..core.records import read_records, to_frame

    from ..core.runfolder import (MERGE_FINDINGS_FILE, MODEL_FINDINGS_FILE, read_merge_records,
                                  read_model_records, read_shrunk)
    found = with_smallest_cells(compute_findings(to_frame(read_records(run_dir) if records is None else records)),
                                read_shrunk(run_dir))
    path = Path(run_dir) / FINDINGS_FILE
    path.write_text(json.dumps(found, indent=1, default=_json_default) + "\n")
    if read_model_records(run_dir):       # the model audit's own, beside (its runs are not cells: no repro script)
        (Path(run_dir) / MODEL_FINDINGS_FILE).write_text(json.dumps(model_findings(run_dir), indent=1) + "\n")
    if read_merge_records(run_dir):       # the merge audit's, beside (merge functions are not cells)
        (Path(run_dir) / MERGE_FINDINGS_FILE).write_text(json.dumps(merge_findings(run_dir), indent=1) + "\n")
    return found


def with_smallest_cells(found: list[dict[str, Any]], shrunk: dict[tuple[str, str], list[dict]]) -> list[dict[str, Any]]:
    """Each finding `audit shrink` shrank (DIR/shrunk.jsonl, by check and variant, from one of the
    finding's cells) with its smallest failing cell: `smallest` (the first line) and a sentence of the
    message per line naming it (a cell_failed finding's parts, each failure of its own, one each), and
    `minimal`, the first minimal script."""
    for finding in found:
        lines = [line for line in shrunk.get((finding["check"], finding["variant"]), [])
                 if line["from"] in finding["cells"]]                # none, or shrunk from records since changed
        if lines:
            finding["smallest"] = lines[0]
        for line in lines:
            finding["message"] += _shrunk_sentence(line, len(lines) > 1)
            if line.get("minimal") and "minimal" not in finding:
                finding["minimal"] = line["minimal"]
    return found


def _shrunk_sentence(line: dict[str, Any], parts: bool) -> str:
    """What one shrunk.jsonl line adds to its finding's message (`parts`: the finding has several failures)."""
    said = f" Failure {line.get('part')} ({line.get('failure')}):" if parts else ""
    if line.get("id") is None:
        said += f" Not shrunk: {line.get('reason')} ({line['from']})."
    else:
        how = f"{line['tried']} cells tried in {line['seconds']:.1f} s" + ("" if line["complete"] else ", out of time")
        said += (f" Smallest failing cell: {line['id']} (shrunk from {line['from']}; {how})."
                 if line["id"] != line["from"] else f" No smaller cell shows it ({how}).")
    if line.get("minimal"):
        after = f" (called after {', '.join(line['minimal_after'])})" if line.get("minimal_after") else ""
        said += (f" Minimal script in the library's own API: {line['minimal']}{after} (exit 1 here: "
                 f"{line.get('minimal_says')}); a report for its tracker: {line.get('minimal_report')}.")
    elif line.get("minimal_reason"):
        said += f" No minimal script: {line['minimal_reason']}."
    return said


def merge_findings(run_dir: str | Path) -> list[dict[str, Any]]:
    """The merge audit's findings (analysis/merge_rules.py) of DIR's merges.jsonl."""
    from ..core.runfolder import read_merge_records
    from .merge_rules import check_merges
    return check_merges(read_merge_records(run_dir))


def model_findings(run_dir: str | Path) -> list[dict[str, Any]]:
    """The model audit's findings (analysis/model_rules.py) of DIR's model.jsonl."""
    from ..core.runfolder import read_model_records
    from .model_rules import check_model
    return check_model(read_model_records(run_dir))


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, float) and math.isnan(obj):
        return None
    raise TypeError(type(obj).__name__)
