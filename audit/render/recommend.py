"""What to use, below the verdict: per device × dtype × mask kind, the variants ranked by forward
latency on the cells they all ran, the fastest one without an error finding recommended, and why.

Numbers only from matched cells (every input axis equal), never pooled medians. A lead inside the two
variants' measured noise is a tie (noise_rules.tie_lead). Reads the records frame and the findings;
never measures, never imports torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..analysis.noise_rules import cell_noise, tie_lead
from ..analysis.run_rules import REFEREE_CHECK
from ..workload.inputs import MASK_KIND_LABELS, PLAIN_MASK_KINDS, mask_kind
from .data import MATCH_AXES, NORMAL_SCENARIO, dtype_order, is_negative_control, numeric, ok_rows
from .finding_tables import anchored_findings, finding_words
from .page import Block, Heading, Inline, Link, Span, Table, format_value, para

RECOMMENDATIONS_HEADING = "What to use"
REASONS_HEADING = "Why, per device, dtype and mask"
DEVICE_DTYPE = "device\u00a0dtype"        # one unbroken header: the column stays narrow
CLOSE_LEAD = 1.10                   # where no noise was measured (records without samples): a lead under 10% ties
MIN_SHARED_FRACTION = 0.5           # a variant joins a comparison if the shared cells stay >= half of the slice's


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
                    here = cells & scope_ids.get(variant, set())      # its error cells in this slice
                    if variant in chosen and variant not in flagged and (anywhere or here):
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


# --------------------------------------------------------------------------- the section's part

def recommendation_blocks(frame: pd.DataFrame, findings: list[dict] | None,
                          run_noise: float | None = None) -> tuple[list[Block], list[Block]]:
    """The verdict's "What to use" (the matrix, first on the page: the answer) and its reasons in full (after
    the table per variant, the evidence); nothing when no device, dtype and mask kind has a timed ok cell
    of a real variant."""
    recs = recommendations(frame, findings, run_noise)
    if not recs:
        return [], []
    ignored = "" if findings is not None else " No findings.json: error findings were not taken into account."
    return [
        Heading(3, RECOMMENDATIONS_HEADING),
        para("The fastest variant with no error finding on a cell of that device, dtype and mask (any "
             "scenario; wrong gradients count: what is recommended is for training too); tied: a lead "
             "inside the 95% interval of the two variants' ratio, from their cells' measured noise and the "
             "run's canary drift (Environment: timing noise); why, below the table per variant." + ignored),
        Table(recommendation_matrix(recs)),
    ], [
        Heading(3, REASONS_HEADING),
        Table(recommendation_table(recs)),
    ]
