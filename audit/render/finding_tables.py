"""The findings as the report lists them: the findings table, each finding's page anchor, the
findings most severe first, the summary line, a finding in a few words, and the audit's self-check
(was every negative control caught). From findings.json's dicts; no rendering, no torch.
"""
from __future__ import annotations

import pandas as pd

from ..analysis.findings import SEVERITY_ORDER
from ..core.defects import WARNING_DEFECTS
from .data import NEGATIVE_CONTROL_PREFIX, is_negative_control, ok_rows, variant_order
from .page import slugify


def findings_table(findings: list[dict]) -> pd.DataFrame:
    """Columns severity, check, variant, message (in full), cells (count), and repro (the
    path of its reproduction script relative to the run folder, else why there is none:
    `repro_reason`) when any finding has one, and failure (a failed cell's failures/ file) when any
    has one; most severe first."""
    table = pd.DataFrame({
        "severity": [f.get("severity") for f in findings],
        "check": [f.get("check") for f in findings],
        "variant": [f.get("variant") for f in findings],
        "message": [f.get("message") for f in findings],
        "cells": [len(f.get("cells") or []) for f in findings],
    })
    if any(f.get("repro") or f.get("repro_reason") for f in findings):
        table["repro"] = [f.get("repro") or f.get("repro_reason") or None for f in findings]
    if any(f.get("failure_file") for f in findings):          # a failed cell's whole failure (failures/)
        table["failure"] = [f.get("failure_file") for f in findings]
    rank = (table["severity"].map({s: i for i, s in enumerate(SEVERITY_ORDER)})
            .fillna(len(SEVERITY_ORDER)))
    return (table.assign(rank=rank).sort_values("rank", kind="stable").drop(columns="rank")
            .reset_index(drop=True))


def finding_anchors(findings: list[dict]) -> list[str]:
    """One page anchor per finding, in list order: `finding-<check>-<variant>` ("all" for a finding
    about several, "*"), -1, -2 for a repeat. The verdict links to the findings table through these."""
    seen: dict[str, int] = {}
    anchors = []
    for f in findings:
        variant = str(f.get("variant"))
        slug = slugify(f"finding {f.get('check')} {'all' if variant == '*' else variant}")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.append(slug if count == 0 else f"{slug}-{count}")
    return anchors


def by_severity(findings: list[dict]) -> list[dict]:
    """Most severe first, the list's order kept within a severity (as findings_table sorts)."""
    rank = {s: i for i, s in enumerate(SEVERITY_ORDER)}
    return sorted(findings, key=lambda f: rank.get(f.get("severity"), len(SEVERITY_ORDER)))


def anchored_findings(findings: list[dict] | None) -> list[tuple[dict, str]]:
    """The findings about real code, most severe first, each with its page anchor: what the
    findings table shows and what the verdict links to (one function, so the two agree)."""
    real = by_severity([f for f in findings or [] if not is_control_finding(f)])
    return list(zip(real, finding_anchors(real)))


def findings_summary(findings: list[dict], about: str = "") -> str:
    """'41 findings: 15 error, 14 warning, 12 info.' (severities in order, others after);
    with about="about real code": '41 findings about real code: ...'."""
    counts: dict[str, int] = {}
    for f in findings:
        severity = str(f.get("severity"))
        counts[severity] = counts.get(severity, 0) + 1
    order = [s for s in SEVERITY_ORDER if s in counts] + sorted(set(counts) - set(SEVERITY_ORDER))
    parts = ", ".join(f"{counts[s]} {s}" for s in order)
    what = f" {about}" if about else ""
    return f"{len(findings)} finding{'s' if len(findings) != 1 else ''}{what}: {parts}."


def is_control_finding(finding: dict) -> bool:
    """A finding about a negative control (broken.*): expected, so not about real code."""
    return str(finding.get("variant") or "").startswith(NEGATIVE_CONTROL_PREFIX)


def negative_control_check(frame: pd.DataFrame, findings: list[dict]) -> pd.DataFrame:
    """The audit's self-check: was every measured negative control caught?

    One row per negative control with at least one ok record (a control that never ran
    cannot be caught). Columns control, flagged (some error-severity finding names it, or a warning
    of a check whose warnings are defects: core.defects.WARNING_DEFECTS),
    checks (the checks of those findings, comma-separated; "" when none), diagnosed (the
    known mistakes those findings' diagnoses name, most cells first; "" when none).
    """
    columns = ["control", "flagged", "checks", "diagnosed"]
    ok = ok_rows(frame) if "status" in frame.columns else frame.iloc[0:0]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    controls = variant_order(ok.loc[is_negative_control(ok["variant"]), "variant"])
    rows = []
    for control in controls:
        errors = [f for f in findings if f.get("variant") == control
                  and (f.get("severity") == "error" or f.get("check") in WARNING_DEFECTS)]
        checks = sorted({str(f.get("check")) + (f": {f['referee_check']}" if f.get("referee_check") else "")
                         for f in errors})                     # a referee finding names its check
        named = sorted((f for f in errors if f.get("diagnosis") not in (None, "none")),
                       key=lambda f: -int(f.get("diagnosis_cells") or 0))
        diagnosed = list(dict.fromkeys(str(f.get("diagnosis_title") or f["diagnosis"]) for f in named))
        rows.append({"control": control, "flagged": bool(checks), "checks": ", ".join(checks),
                     "diagnosed": ", ".join(diagnosed)})
    return pd.DataFrame(rows, columns=columns)


def finding_words(finding: dict, with_cells: bool = False) -> str:
    """A finding in a few words: its check and the mistake it matches when the numerics diagnosis
    names one ("error budget: GQA heads paired interleaved"); the cells it covers if asked."""
    words = str(finding.get("check") or "finding").replace("_", " ")
    diagnosis, title = finding.get("diagnosis"), finding.get("diagnosis_title")
    if diagnosis and str(diagnosis) != "none" and title:
        words += f": {title}"
    if not with_cells:
        return words
    cells = len(finding.get("cells") or [])
    return f"{words} ({cells} cell{'s' if cells != 1 else ''})"
