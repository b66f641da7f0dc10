"""The verdict at the top of the report: per real variant, how fast and how big it is against
`sdpa`, its worst finding, what it does on fully masked rows and whether repeated runs agree;
then, per device × dtype × mask kind, which variant to use and why.

Numbers only from matched cells (every input axis equal), never pooled medians: a ratio of two
variants on the same cells means the same whatever else the grid holds. Reads the records frame
and the findings; never measures, never imports torch.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..analysis.argument_rules import ARGUMENT_CHECK, argument_summary
from ..analysis.noise_rules import cell_noise, tie_lead
from ..core.defects import REPEATED_TENSORS
from ..core.referee import refereed
from ..workload.inputs import MASK_KIND_LABELS, PLAIN_MASK_KINDS, mask_kind
from ..workload.variants import VERDICT_BASELINE
from .data import (BASELINE_VARIANT, MATCH_AXES, NEGATIVE_CONTROL_PREFIX, NORMAL_SCENARIO, SEVERITY_ORDER,
                   describe_values, dtype_order, is_negative_control,
                   memory_ratio_vs_baseline, numeric, ok_rows, speedup_vs_baseline, variant_order)
from .argument_section import NOT_PROBED, argument_text
from .masked_rows import masked_rows_cell, masked_rows_summary
from .page import MISSING, Badge, Block, Heading, Inline, Link, Mono, Span, Table, format_value, para
from .tables import anchored_findings

VERDICT_HEADING = "Verdict"
RECOMMENDATIONS_HEADING = "What to use"
DEVICE_DTYPE = "device\u00a0dtype"        # one unbroken header: the column stays narrow
CLOSE_LEAD = 1.10                   # where no noise was measured (records without samples): a lead under 10% ties
MIN_SHARED_FRACTION = 0.5           # a variant joins a comparison if the shared cells stay >= half of the slice's
SEVERITY_RANK = {severity: rank for rank, severity in enumerate(SEVERITY_ORDER)}


# --------------------------------------------------------------------------- mask kinds

def mask_kinds(frame: pd.DataFrame) -> pd.Series:
    """Per cell: none, causal, padding, or None (another mask, a score modification, unknown):
    workload.inputs.mask_kind, the one definition the budget's coverage uses too."""
    scenario = (frame["scenario"].where(frame["scenario"].notna(), NORMAL_SCENARIO).astype(str)
                if "scenario" in frame.columns else pd.Series(NORMAL_SCENARIO, index=frame.index))
    causal = frame["causal"].astype(bool) if "causal" in frame.columns else pd.Series(False, index=frame.index)
    return pd.Series([mask_kind(s, c) for s, c in zip(scenario, causal)], index=frame.index, dtype=object)


def speed_cells_of_kind(frame: pd.DataFrame, kind: str) -> pd.Series:
    """The cells a mask kind is timed on: scenario normal with the causal flag for none and
    causal (the other mask-free scenarios are stability checks), every scenario of the kind for
    the others (key padding, packed, paged)."""
    kinds = mask_kinds(frame)
    if kind not in PLAIN_MASK_KINDS:
        return kinds == kind
    scenario = frame["scenario"].where(frame["scenario"].notna(), NORMAL_SCENARIO).astype(str)
    return (kinds == kind) & (scenario == NORMAL_SCENARIO)


# --------------------------------------------------------------------------- verdict rows

def _real_variants(frame: pd.DataFrame) -> list[str]:
    return [v for v in variant_order(frame["variant"]) if not v.startswith(NEGATIVE_CONTROL_PREFIX)] if len(frame) else []


def worst_findings(findings: list[dict] | None) -> dict[str, tuple[dict, str]]:
    """variant -> (its most severe finding, that finding's anchor): severity first, then the
    finding covering most cells. Findings about several variants ("*") belong to none."""
    worst: dict[str, tuple[dict, str]] = {}
    for finding, anchor in anchored_findings(findings):
        variant = str(finding.get("variant"))
        key = (SEVERITY_RANK.get(finding.get("severity"), 3), -len(finding.get("cells") or []))
        if variant != "*" and (variant not in worst or key < _rank(worst[variant][0])):
            worst[variant] = (finding, anchor)
    return worst


def _rank(finding: dict) -> tuple[int, int]:
    return SEVERITY_RANK.get(finding.get("severity"), 3), -len(finding.get("cells") or [])


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


# The verdict's short phrases ("1.34× slower", "not refereed") stay on one line; longer ones wrap, so
# the table fits the page's 1200 px at 1400 px (tests/test_html_browser.py) with its referee column.
VERDICT_UNBROKEN_CH = 14


def finding_part(finding: dict, anchor: str) -> Span:
    """The finding's severity badge and its words, linked to its row in the findings table."""
    words = finding_words(finding)
    return Span((Badge(str(finding.get("severity"))), " ", Link(words, "#" + anchor)),
                keep_together=len(words) <= VERDICT_UNBROKEN_CH)


def _is_tensor_list(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def determinism_text(rows: pd.DataFrame) -> str:
    """Whether three runs on identical inputs agreed bit for bit, from the records' repeat columns
    (repeat_differs: the tensors that differed, [] when none; repeat_max_diff; deterministic_algorithms;
    deterministic_refused on skipped cells). "not checked" for records without them."""
    parts: list[str] = []
    refused = rows[rows["deterministic_refused"].map(lambda v: v is True or v is np.True_)] \
        if "deterministic_refused" in rows.columns else rows.iloc[0:0]
    if not refused.empty:
        parts.append(f"refuses deterministic mode ({len(refused)} cell{'s' if len(refused) != 1 else ''})")
    ok = ok_rows(rows)
    checked = ok[ok["repeat_differs"].map(_is_tensor_list)] if "repeat_differs" in ok.columns else ok.iloc[0:0]
    if not checked.empty:
        differing = checked[checked["repeat_differs"].map(len) > 0]
        deterministic = (int(checked["deterministic_algorithms"].map(lambda v: v is True or v is np.True_).sum())
                         if "deterministic_algorithms" in checked.columns else 0)
        mode = ([] if deterministic == 0 else ["deterministic mode"] if deterministic == len(checked)
                else [f"{deterministic} in deterministic mode"])
        if differing.empty:
            parts.append(f"bitwise ({', '.join([f'{len(checked)} cells', *mode])})")
        else:
            tensors = {str(t) for value in differing["repeat_differs"] for t in value}
            named = [t for t in REPEATED_TENSORS if t in tensors] + sorted(tensors - set(REPEATED_TENSORS))
            largest = numeric(differing, "repeat_max_diff").max()
            notes = ([f"max {_short_number(largest)}"] if pd.notna(largest) else []) + mode
            parts.append(f"differs: {', '.join(named)} in {len(differing)} of {len(checked)} cells"
                         + (f" ({', '.join(notes)})" if notes else ""))
    return "; ".join(parts) if parts else "not checked"


def _short_number(value: float) -> str:
    """One significant digit, exponents unpadded: 2e-7, 0.3, inf."""
    if not math.isfinite(value):
        return "inf" if value > 0 else str(value)
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:.1g}").replace("e+", "e")


def _ratio_words(speedup: float | None, faster: str, slower: str) -> str:
    """2.08 -> '2.08× faster', 0.5 -> '2.00× slower' (with the given words), None -> —."""
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return MISSING
    if abs(math.log(speedup)) < math.log(1.005):
        return "same"
    return f"{format_value(speedup)}× {faster}" if speedup > 1 else f"{format_value(1 / speedup)}× {slower}"


def verdict_rows(frame: pd.DataFrame, baseline: str = VERDICT_BASELINE) -> pd.DataFrame:
    """The verdict's numbers, one row per real variant with an ok cell: speedup and fwd_bwd_speedup
    (baseline time / variant time, geometric mean over matched cells; above 1 is faster), memory
    and fwd_bwd_memory (variant peak / baseline peak; below 1 is smaller), the matched cells of
    each, masked_rows (text) and masked_rows_detail (the scenarios behind its counts, or ""), and
    determinism (text). The baseline itself reads 1 with its own cell count."""
    columns = ["variant", "speedup", "fwd_cells", "fwd_bwd_speedup", "fwd_bwd_cells", "memory", "memory_cells",
               "fwd_bwd_memory", "fwd_bwd_memory_cells", "masked_rows", "masked_rows_detail", "determinism",
               "refereed", "arguments"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    measured = _real_variants(ok_rows(frame))
    arguments = argument_summary(frame)

    def compare(compute: Any, metric: str) -> pd.DataFrame:
        if metric not in frame.columns:        # a frame without the column: nothing matched
            return pd.DataFrame(columns=["speedup", "ratio", "cells"])
        return compute(frame, metric, baseline).set_index("variant")

    comparisons = {
        "speedup": compare(speedup_vs_baseline, "fwd_ms"),
        "fwd_bwd_speedup": compare(speedup_vs_baseline, "fwd_bwd_ms"),
        "memory": compare(memory_ratio_vs_baseline, "peak_bytes"),
        "fwd_bwd_memory": compare(memory_ratio_vs_baseline, "peak_fwd_bwd_bytes"),
    }
    cells_column = {"speedup": "fwd_cells", "fwd_bwd_speedup": "fwd_bwd_cells", "memory": "memory_cells",
                    "fwd_bwd_memory": "fwd_bwd_memory_cells"}
    out = []
    for variant in measured:
        row: dict[str, Any] = {"variant": variant}
        for name, table in comparisons.items():
            value_column = "speedup" if "speedup" in name else "ratio"
            if variant == baseline:
                row[name], row[cells_column[name]] = 1.0, None
            elif variant in table.index:
                row[name] = float(table.loc[variant, value_column])
                row[cells_column[name]] = int(table.loc[variant, "cells"])
            else:
                row[name], row[cells_column[name]] = None, 0
        own = frame[frame["variant"] == variant]
        row["masked_rows"], row["masked_rows_detail"] = masked_rows_summary(ok_rows(own))
        row["determinism"] = determinism_text(own)
        row["refereed"] = any(refereed(r) for r in ok_rows(own).to_dict("records"))
        row["arguments"] = argument_text(arguments.get(variant, {}))
        out.append(row)
    table = pd.DataFrame(out, columns=columns)
    order = table["speedup"].map(lambda s: -s if s is not None and pd.notna(s) else math.inf)
    return table.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


def _unbroken(text: str) -> Inline:
    """A short phrase ("2.71× slower", "not checked") kept on one line in HTML, so a wide row wraps
    its long cells instead of splitting these; longer text may wrap."""
    return Span((text,), keep_together=True) if len(text) <= VERDICT_UNBROKEN_CH else text


def _cells_value(row: pd.Series) -> Inline | int:
    """Matched cells of the forward time; '8 · 0' when forward+backward matched another number."""
    fwd, both = (0 if c is None or pd.isna(c) else int(c) for c in (row["fwd_cells"], row["fwd_bwd_cells"]))
    return fwd if both == fwd else _unbroken(f"{fwd} · {both}")


GRADIENT_CHECK = "grad_error_budget"      # analysis.findings: gradients outside their budget
REFEREE_CHECK = "referee"                 # analysis.findings: a referee check failed (not doing the work)


def referee_findings(findings: list[dict] | None) -> dict[str, list[tuple[dict, str]]]:
    """variant -> its referee findings and their anchors: its speed was not measured doing the work,
    so it is shown struck through and never recommended."""
    out: dict[str, list[tuple[dict, str]]] = {}
    for f, a in anchored_findings(findings):
        if f.get("check") == REFEREE_CHECK:
            out.setdefault(str(f.get("variant")), []).append((f, a))
    return out


def referee_text(variant: str, refereed: set[str], failed: dict[str, list[tuple[dict, str]]]) -> Inline:
    """The verdict's referee column: 'passed', the failed checks linked, or 'not refereed'."""
    if variant in failed:
        parts: list[Inline] = ["failed: "]
        for i, (finding, anchor) in enumerate(failed[variant]):
            parts += ([", "] if i else []) + [Link(str(finding.get("referee_check") or "referee"), "#" + anchor)]
        return Span(tuple(parts))
    return "passed" if variant in refereed else "not refereed"


def gradient_findings(findings: list[dict] | None) -> dict[str, tuple[dict, str]]:
    """variant -> (its gradient error finding, its anchor): such a variant is not for training."""
    return {str(f.get("variant")): (f, a) for f, a in anchored_findings(findings)
            if f.get("check") == GRADIENT_CHECK and f.get("severity") == "error"}


def verdict_display(rows: pd.DataFrame, findings: list[dict] | None, baseline: str) -> pd.DataFrame:
    """verdict_rows as the page shows them: ratios as words, the worst finding linked; a variant
    whose gradients are outside their budget reads "not for training" for forward+backward."""
    worst = worst_findings(findings)
    wrong_grads = gradient_findings(findings)
    gamed = referee_findings(findings)
    checked = set(rows.loc[rows["refereed"].astype(bool), "variant"]) if "refereed" in rows else set()

    def speed(row: pd.Series, column: str) -> Inline:
        """A speed ratio; struck through where the referee found the variant not doing the work."""
        text = ratio(row, column, False)
        return Span((text,), keep_together=True, struck=True) if row["variant"] in gamed else _unbroken(text)

    def fwd_bwd_cell(row: pd.Series) -> Inline:
        if row["variant"] in wrong_grads:
            finding, anchor = wrong_grads[row["variant"]]
            return Span(("not for training: ", Link("wrong gradients", "#" + anchor)))
        return speed(row, "fwd_bwd_speedup")

    ignoring = {str(f.get("variant")): a for f, a in anchored_findings(findings) if f.get("check") == ARGUMENT_CHECK}

    def argument_cell(row: pd.Series) -> Inline:
        """What the argument probes found: linked to the finding where an argument is not honoured."""
        text = str(row["arguments"])                   # may wrap: the column stays narrow
        return Link(text, "#" + ignoring[row["variant"]]) if row["variant"] in ignoring else text

    def finding_cell(variant: str) -> Inline:
        if findings is None:
            return "not computed"
        return finding_part(*worst[variant]) if variant in worst else "none"

    def ratio(row: pd.Series, column: str, memory: bool) -> str:
        if row["variant"] == baseline:
            return "baseline"
        value = row[column]
        if memory:
            value = None if value is None or pd.isna(value) or value <= 0 else 1 / value
        return _ratio_words(value, *(("less", "more") if memory else ("faster", "slower")))

    records = [r for _, r in rows.iterrows()]
    return pd.DataFrame({           # the referee second: whether the rest can be trusted at all
        "variant": rows["variant"],
        **({"referee": [referee_text(v, checked, gamed) for v in rows["variant"]]} if checked else {}),
        f"fwd vs {baseline}": [speed(r, "speedup") for r in records],
        f"fwd+bwd vs {baseline}": [fwd_bwd_cell(r) for r in records],
        "peak fwd": [_unbroken(ratio(r, "memory", True)) for r in records],
        "peak fwd+bwd": [_unbroken(ratio(r, "fwd_bwd_memory", True)) for r in records],
        "cells": ["—" if r["variant"] == baseline else _cells_value(r) for r in records],
        "worst finding": [finding_cell(v) for v in rows["variant"]],
        **({"args": [argument_cell(r) for r in records]}                       # records before probes: none
           if "arguments" in rows and (rows["arguments"] != NOT_PROBED).any() else {}),
        "fully masked rows": [_unbroken(t) if not d else masked_rows_cell(t, d)
                              for t, d in zip(rows["masked_rows"], rows["masked_rows_detail"])],
        "3 runs": [_unbroken(t) for t in rows["determinism"]],
    })


# --------------------------------------------------------------------------- recommendations

@dataclass
class Recommendation:
    """One device × dtype × mask kind: the variants ranked by forward time on the cells they share."""

    device: str
    dtype: str
    kind: str
    ranking: list[tuple[str, float]]                # (variant, geometric-mean fwd_ms), fastest first
    shared_cells: int
    left_out: list[tuple[str, int, int]] = field(default_factory=list)   # (variant, its cells, the slice's)
    flagged: dict[str, tuple[dict, str]] = field(default_factory=dict)   # variant -> (error finding, anchor)
    elsewhere: dict[str, tuple[dict, str]] = field(default_factory=dict)  # an error finding on other cells only
    noise: dict[str, list[float]] = field(default_factory=dict)   # variant -> its pooled cells' ci_rel (cell_noise)
    run_noise: float | None = None                                # the canary's noise figure (noise_rules)

    @property
    def tie_at(self) -> float:
        """The lead under which the recommended variant and the runner-up are tied: the 95% interval of
        their ratio from their cells' measured noise and the run's (noise_rules.tie_lead); CLOSE_LEAD
        where neither was measured."""
        runner = self.runner_up
        if runner is None or self.recommended is None:
            return CLOSE_LEAD
        a, b = self.noise.get(self.recommended, []), self.noise.get(runner[0], [])
        if not any(x == x for x in a + b) and self.run_noise is None:
            return CLOSE_LEAD
        return tie_lead(a, b, self.run_noise)

    @property
    def recommended(self) -> str | None:
        return next((v for v, _ in self.ranking if v not in self.flagged), None)

    @property
    def runner_up(self) -> tuple[str, float] | None:
        """The next variant without an error finding after the recommended one: what it beats."""
        eligible = [(v, t) for v, t in self.ranking if v not in self.flagged]
        return eligible[1] if len(eligible) > 1 else None

    @property
    def lead(self) -> float | None:
        times = dict(self.ranking)
        runner = self.runner_up
        return None if runner is None or self.recommended is None else runner[1] / times[self.recommended]

    @property
    def faster_but_flagged(self) -> list[str]:
        """Variants ahead of the recommended one that an error finding rules out, fastest first."""
        ahead = []
        for variant, _ in self.ranking:
            if variant == self.recommended:
                break
            ahead.append(variant)
        return ahead


def _input_keys(rows: pd.DataFrame) -> dict[str, set[tuple]]:
    axes = [a for a in MATCH_AXES if a in rows.columns]
    return {str(v): set(g[axes].itertuples(index=False, name=None)) for v, g in rows.groupby("variant")}


def _shared(keys: dict[str, set[tuple]]) -> tuple[list[str], set[tuple], list[tuple[str, int, int]]]:
    """Variants compared and the cells they all ran: the widest-covering first, each next one joining
    while the shared cells stay at least MIN_SHARED_FRACTION of the widest coverage."""
    order = sorted(keys, key=lambda v: (-len(keys[v]), v))
    widest = len(keys[order[0]])
    needed = max(1, math.ceil(MIN_SHARED_FRACTION * widest))
    chosen, shared, left_out = [], set(keys[order[0]]), []
    for variant in order:
        trial = shared & keys[variant]
        if len(trial) >= needed:
            chosen.append(variant)
            shared = trial
        else:
            left_out.append((variant, len(keys[variant]), widest))
    return chosen, shared, left_out


def _error_cells(findings: list[dict] | None) -> list[tuple[dict, str, set[str]]]:
    return [(f, a, set(f.get("cells") or [])) for f, a in anchored_findings(findings) if f.get("severity") == "error"]


def recommendations(frame: pd.DataFrame, findings: list[dict] | None,
                    run_noise: float | None = None) -> list[Recommendation]:
    """Per device × dtype × mask kind present among the ok real cells: the variants ranked by the
    geometric mean of forward latency over the cells they share, and the error findings that cover a
    cell of that device, dtype and mask kind in any input scenario (fp16_range's NaN counts against
    the no-mask choice: the same kernel, other inputs)."""
    ok = ok_rows(frame)
    ok = ok[~is_negative_control(ok["variant"])] if len(ok) else ok
    if ok.empty:
        return []
    ok = ok.assign(_fwd=numeric(ok, "fwd_ms"))
    kinds_all = mask_kinds(frame)
    errors = _error_cells(findings)
    out = []
    for device in sorted(ok["device"].astype(str).unique()):
        for dtype in dtype_order(ok.loc[ok["device"] == device, "dtype"].unique()):
            for kind in MASK_KIND_LABELS:
                timed = ok[speed_cells_of_kind(ok, kind) & (ok["device"] == device) & (ok["dtype"] == dtype)]
                timed = timed[np.isfinite(timed["_fwd"]) & (timed["_fwd"] > 0)]
                if timed.empty:
                    continue
                chosen, shared, left_out = _shared(_input_keys(timed))
                axes = [a for a in MATCH_AXES if a in timed.columns]
                in_shared = np.array([k in shared for k in timed[axes].itertuples(index=False, name=None)], dtype=bool)
                pooled = timed[in_shared & timed["variant"].isin(chosen)]
                ranking = sorted(((str(v), float(np.exp(np.log(g["_fwd"]).mean())))
                                  for v, g in pooled.groupby("variant")), key=lambda vt: (vt[1], vt[0]))
                scope = frame[(kinds_all == kind) & (frame["device"] == device) & (frame["dtype"] == dtype)]
                scope_ids = {str(v): set(g["id"]) for v, g in scope.groupby("variant")}
                flagged: dict[str, tuple[dict, str]] = {}
                elsewhere: dict[str, tuple[dict, str]] = {}
                for finding, anchor, cells in errors:
                    variant = str(finding.get("variant"))
                    # a referee finding anywhere rules the variant out everywhere: it was not measured
                    # doing the work, so no cell of it is evidence
                    anywhere = finding.get("check") == REFEREE_CHECK
                    if variant in chosen and variant not in flagged and (anywhere or cells & scope_ids.get(variant, set())):
                        flagged[variant] = (finding, anchor)
                    elif variant in chosen:
                        elsewhere.setdefault(variant, (finding, anchor))
                elsewhere = {v: f for v, f in elsewhere.items() if v not in flagged}
                noise = {str(v): cell_noise(g).tolist() for v, g in pooled.groupby("variant")}
                out.append(Recommendation(device, dtype, kind, ranking, len(shared), left_out, flagged, elsewhere,
                                          noise, run_noise))
    return out


def _flagged_parts(rec: Recommendation) -> list[Inline]:
    """'eager is fastest but has an error finding: nonfinite (14 cells), so we recommend sdpa.'"""
    ahead = rec.faster_but_flagged
    if not ahead:
        return []
    parts: list[Inline] = []
    for i, variant in enumerate(ahead):
        finding, anchor = rec.flagged[variant]
        parts += [("" if i == 0 else "; "), f"{variant} is {'fastest' if i == 0 else 'faster'} but has an "
                  "error finding: ", Link(finding_words(finding, with_cells=True), "#" + anchor)]
    parts.append(f", so we recommend {rec.recommended}." if rec.recommended
                 else "; every variant here has one, so none is recommended.")
    return parts


def _lead_words(rec: Recommendation) -> str:
    """'1.35× faster than sdpa_flash', 'tied with sdpa (1.05×)' under the lead the measured noise
    allows (Recommendation.tie_at), or why there is no lead."""
    if rec.recommended is None:
        return ""
    if rec.lead is None:
        return "the only variant without an error finding here"
    if rec.lead < rec.tie_at:
        return f"tied with {rec.runner_up[0]} ({format_value(rec.lead)}×)"
    return f"{format_value(rec.lead)}× faster than {rec.runner_up[0]}"


def _why(rec: Recommendation) -> Span:
    """The reason in full: what an error finding ruled out, the lead over the next one and on
    which cells, who was not compared."""
    parts: list[Inline] = _flagged_parts(rec)
    lead = _lead_words(rec)
    if lead:
        parts.append((" " if parts else "") + f"{rec.recommended}: {lead}")
        if rec.lead is not None and rec.lead < rec.tie_at:
            parts.append(f", a lead under the {format_value((rec.tie_at - 1) * 100)}% this run's measured noise allows")
        if rec.lead is not None:
            parts.append(f" (geometric mean of forward latency over the {rec.shared_cells} "
                         f"cell{'s' if rec.shared_cells != 1 else ''} the {len(rec.ranking)} variants compared share)")
        parts.append(".")
    elsewhere = rec.elsewhere.get(rec.recommended or "")
    if elsewhere:
        parts += [f" {rec.recommended}'s error finding ", Link(finding_words(elsewhere[0]), "#" + elsewhere[1]),
                  " covers no cell of this device, dtype and mask."]
    if rec.left_out:
        parts.append(" Not compared (ran too few of these cells): "
                     + ", ".join(f"{v} ({n} of {total})" for v, n, total in rec.left_out) + ".")
    return Span(tuple(p for p in parts if p != ""))


def recommendation_matrix(recs: list[Recommendation]) -> pd.DataFrame:
    """What to use, at a glance: one row per device and dtype, one column per mask kind present;
    each entry the variant and its lead, with a link when a faster variant has an error finding."""
    kinds = [k for k in MASK_KIND_LABELS if any(r.kind == k for r in recs)]
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in recs:
        row = rows.setdefault((rec.device, rec.dtype), {DEVICE_DTYPE: f"{rec.device} {rec.dtype}"})
        parts: list[Inline] = [rec.recommended or "none"]
        lead = _lead_words(rec)
        if lead and rec.lead is not None:
            parts.append(f", {lead}")
        if rec.faster_but_flagged:
            fastest = rec.faster_but_flagged[0]
            finding, anchor = rec.flagged[fastest]
            parts += [f"; {fastest} is faster but has an ", Link("error finding", "#" + anchor)]
        row[MASK_KIND_LABELS[rec.kind]] = Span(tuple(parts))
    columns = [DEVICE_DTYPE, *[MASK_KIND_LABELS[k] for k in kinds]]
    return pd.DataFrame(list(rows.values()), columns=columns).astype(object).where(lambda f: f.notna(), None)


def recommendation_table(recs: Iterable[Recommendation]) -> pd.DataFrame:
    """The reasons in full, one row per device × dtype × mask kind."""
    rows = [{"device, dtype, mask": f"{r.device} {r.dtype}, {MASK_KIND_LABELS[r.kind]}",
             "use": r.recommended or "none", "why": _why(r)} for r in recs]
    return pd.DataFrame(rows, columns=["device, dtype, mask", "use", "why"])


# --------------------------------------------------------------------------- section

def verdict_section(frame: pd.DataFrame, findings: list[dict] | None, run_noise: float | None = None) -> list[Block]:
    """The page's first section: the verdict table, then what to use per device × dtype × mask; ties
    by the measured noise (`run_noise`: the canary's canary_rel, noise_rules.canary_summary)."""
    blocks: list[Block] = [Heading(2, VERDICT_HEADING)]
    ok = ok_rows(frame)
    real = _real_variants(ok)
    if not real:
        return blocks + [para("No ok cell of a real variant: nothing to compare.")]
    baseline = VERDICT_BASELINE if VERDICT_BASELINE in real else (
        BASELINE_VARIANT if BASELINE_VARIANT in real else real[0])
    rows = verdict_rows(frame, baseline)
    instead = "" if baseline == VERDICT_BASELINE else f" (no {VERDICT_BASELINE} cell is ok)"
    blocks += [
        para(f"Against {baseline}{instead}: geometric means over matched cells (scenario ", Mono(NORMAL_SCENARIO),
             "). 3 runs: out, dq, dk, dv bitwise identical on the same inputs. Forward+backward is judged by "
             "the gradient budget too: a variant whose gradients are outside it is not for training. Referee: "
             "did every call do the work it was timed for; a variant failing it is struck through, never recommended."),
        Table(verdict_display(rows, findings, baseline)),
    ]
    unrun = [v for v in _real_variants(frame) if v not in real]
    unrun_note = ([para(f"No ok cell, so not in the verdict: {', '.join(unrun)} (see Grid for why).")]
                  if unrun else [])
    recs = recommendations(frame, findings, run_noise)
    if not recs:
        return blocks + unrun_note
    ignored = "" if findings is not None else " No findings.json: error findings were not taken into account."
    return blocks + [
        Heading(3, RECOMMENDATIONS_HEADING),
        para("The fastest variant with no error finding on a cell of that device, dtype and mask (any "
             "scenario; wrong gradients count: what is recommended is for training too); tied: a lead "
             "inside the 95% interval of the two variants' ratio, from their cells' measured noise and the "
             "run's canary drift (Environment: timing noise)." + ignored),
        Table(recommendation_matrix(recs)),
        Table(recommendation_table(recs), caption="Why, per device, dtype and mask"),
        *unrun_note,
    ]
