"""The report's Time budget section: the budget and what it cut, whether every variant got a
cell per dtype and mask kind, and where the run's wall time went (run.json's time_split).
Reads records and run.json; never measures."""
from __future__ import annotations

from typing import Any

import pandas as pd

from ..core.timesplit import GROUPS, RUN_PARTS, largest_overhead
from ..workload.inputs import coverage_kind
from .data import numeric
from .page import Block, Heading, Mono, Table, format_value, para

UNCOVERED_SHOWN = 30        # rows of the table of variant × dtype × mask kinds left without a cell


BUDGET_KINDS = (("over the budget at run time", "over the time budget while running (see Time budget)"),
                ("over the budget", "over the time budget when planned (see Time budget)"),
                ("over the per-cell limit", "predicted over the per-cell limit (see Time budget)"))


def budget_kind(reason: str) -> str | None:
    """The time-budget rule a skip reason names (its numbers differ per cell), or None."""
    for marker, kind in BUDGET_KINDS:
        if marker in reason:
            return kind
    return None


def budget_cuts_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Cells skipped by the time budget or the per-cell limit, most expensive first:
    id, variant, predicted_s, rule."""
    columns = ["id", "variant", "predicted_s", "rule"]
    if frame.empty or "reason" not in frame.columns:
        return pd.DataFrame(columns=columns)
    skipped = frame[frame["status"] == "skipped"].copy()
    skipped["rule"] = skipped["reason"].fillna("").astype(str).map(budget_kind)
    skipped = skipped[skipped["rule"].notna()]
    skipped["predicted_s"] = numeric(skipped, "predicted_s")
    return skipped.sort_values("predicted_s", ascending=False)[columns].reset_index(drop=True)


def coverage_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The variant × device × dtype × mask kinds (workload.inputs.coverage_kind) of the grid
    with no ok cell because the time budget skipped theirs: kind, cells (of that kind in the
    grid), least predicted_s among them. A kind without an ok cell for another reason (a backend
    that cannot run it, errors) is the Grid section's, not the budget's."""
    columns = ["variant device dtype mask", "cells", "cheapest predicted_s"]
    if frame.empty or not {"variant", "device", "dtype", "scenario", "causal"} <= set(frame.columns):
        return pd.DataFrame(columns=columns)
    kinds = pd.Series([coverage_kind(str(v), str(d), str(t), str(s), bool(c)) for v, d, t, s, c in
                       zip(frame["variant"], frame["device"], frame["dtype"], frame["scenario"], frame["causal"])],
                      index=frame.index, dtype=object)
    reasons = frame["reason"].fillna("").astype(str) if "reason" in frame.columns else pd.Series("", index=frame.index)
    for_time = (frame["status"] == "skipped") & reasons.map(lambda r: budget_kind(r) is not None)
    rows = []
    for kind, cells in frame.groupby(kinds, sort=False):
        if (cells["status"] == "ok").any() or not for_time[cells.index].any():
            continue
        rows.append({columns[0]: kind, "cells": len(cells),
                     columns[2]: numeric(cells, "predicted_s").min()})
    return pd.DataFrame(rows, columns=columns).sort_values(columns[2], kind="stable").reset_index(drop=True)


def split_table(split: dict[str, Any]) -> pd.DataFrame:
    """One row per part of the wall time with its group, seconds and share, largest first; parts
    under 0.05 s left out."""
    wall = float(split.get("wall_s") or 0.0)
    parts = split.get("parts_s") or {}
    rows = [{"part": part, "group": RUN_PARTS.get(part, ("?", ""))[0], "seconds": float(seconds),
             "share": float(seconds) / wall if wall else None, "what": RUN_PARTS.get(part, ("", ""))[1]}
            for part, seconds in parts.items() if abs(float(seconds)) >= 0.05]
    return pd.DataFrame(rows, columns=["part", "group", "seconds", "share", "what"]).sort_values(
        "seconds", ascending=False, kind="stable").reset_index(drop=True)


def _split_blocks(run_info: dict | None) -> list[Block]:
    split = (run_info or {}).get("time_split")
    if not split:
        return [para("Where the wall time went is not recorded for this run (", Mono("time_split"),
                     " in run.json: runs before schema 9, merged shards and Ray runs have none).")]
    wall = float(split["wall_s"])
    groups = split.get("groups_s") or {}
    measured = float(split.get("measured_s") or 0.0)
    parts = split.get("parts_s") or {}
    overhead = largest_overhead(split)
    ratio = split.get("wall_over_measured")
    by_group = ", ".join(f"{g} {format_value(float(groups[g]))} s" for g in GROUPS
                         if abs(float(groups.get(g, 0))) >= 0.05)
    text = [f"Where the {format_value(wall)} s of wall time went (this invocation, from its process's "
            f"start to the end of this page): {by_group}. Timed calls and compiling took "
            f"{format_value(measured)} s"
            + (f", so the wall time is {ratio:.2f}× the time spent measuring" if ratio else "") + "."]
    if overhead is not None:
        name, seconds = overhead
        text.append(f" The largest overhead is {name} ({RUN_PARTS.get(name, ('', ''))[1]}): "
                    f"{format_value(seconds)} s, {seconds / wall:.0%} of the wall time." if wall else "")
    missing = wall - sum(float(v) for v in parts.values())
    if abs(missing) > 0.05 * wall:
        text.append(f" {format_value(missing)} s are unaccounted for.")
    return [para(*text), Table(split_table(split), caption="The wall time by part (run.json: time_split; a "
                                                          "cell's own split is its record's phase_s)")]


def time_budget_section(run_info: dict | None, frame: pd.DataFrame) -> list[Block]:
    budget = ((run_info or {}).get("timing") or {}).get("budget_s")
    cuts = budget_cuts_table(frame)
    if budget is None and cuts.empty and not (run_info or {}).get("time_split"):
        return []
    measured = frame[frame["status"] != "skipped"] if not frame.empty else frame
    predicted = numeric(measured, "predicted_s")
    blocks: list[Block] = [Heading(2, "Time budget"), para(
        f"Budget: {'none' if budget is None else format_value(float(budget)) + ' s'} (--budget; each preset "
        "declares one). Before measuring, the cost model predicted every cell (",
        Mono("predicted_s"), "); cells over the per-cell limit were skipped, then the budget bought, in "
        "turn: one cell of every variant per dtype and mask kind (none, causal, key padding) and each "
        "negative control's self-check, the real variants' other cells, cheapest first, and last the "
        "negative controls' other cells. While running, cells were skipped when the rest would have "
        "overrun it, the last-bought first. "
        f"The {len(measured)} cells measured took {format_value(float(numeric(measured, 'elapsed_s').sum()))} s "
        f"against {format_value(float(predicted.sum()))} s predicted.")]
    uncovered = coverage_table(frame)
    if uncovered.empty:
        blocks.append(para("Every variant got at least one measured cell per dtype and mask kind that its "
                           "grid has and the time budget could have cut."))
    else:
        shown = uncovered.head(UNCOVERED_SHOWN)
        blocks += [para(f"The budget was too small for full coverage: {len(uncovered)} variant × dtype × mask "
                        "kinds got no cell (the budget skipped every cell of theirs):"),
                   Table(shown, caption="Variant × dtype × mask kinds without a measured cell, for time")]
    blocks += _split_blocks(run_info)
    if cuts.empty:
        return blocks + [para("No cell was skipped for time.")]
    by_rule = cuts.groupby("rule").agg(cells=("id", "size"), predicted_s=("predicted_s", "sum")).reset_index()
    shown = cuts.head(40)
    return blocks + [Table(by_rule, caption="Cells skipped for time, by rule (predicted seconds they would "
                                            "have taken)"),
                     Table(shown, caption=f"The {len(shown)} most expensive of the {len(cuts)} cells skipped "
                                          "for time (all are in records.jsonl with their reason)")]

