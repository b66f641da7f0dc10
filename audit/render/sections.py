"""The report's sections about the run, speed and memory: each returns a list of blocks
(prose and tables) built from the tidy frame, run.json and findings. Never measures.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.findings import SEVERITY_ORDER
from ..core.grid import AXES
from ..core.runfolder import FINDINGS_FILE, RUN_FILE
from .data import (BASELINE_VARIANT, MIB, NEGATIVE_CONTROL_PREFIX, NONFINITE_COLUMNS, NORMAL_SCENARIO,
                   REASON_WIDTH, dtype_order, is_negative_control,
                   memory_ratio_vs_baseline, normal_rows, ok_rows, sorted_values, speed_rows)
from .page import Anchor, Badge, Block, Code, Heading, Link, Mono, Span, Table, format_value, para, slugify
from .finding_tables import (anchored_findings, findings_summary, findings_table, is_control_finding,
                             negative_control_check)
from .speed_tables import (ceilings_table, describe_shape, host_bound_table, rerun_command, shape_table,
                           speedup_table, stated_shape)
from .time_budget import budget_kind


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _flatten(mapping: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            items.extend(_flatten(value, f"{prefix}{key}."))
        else:
            items.append((f"{prefix}{key}", value))
    return items


def title_section(run_dir: Path, run_info: dict | None, frame: pd.DataFrame) -> list[Block]:
    info = run_info or {}
    started = info.get("started_at")
    if started is None and frame["started_at"].notna().any():
        started = str(frame["started_at"].dropna().min())
    blocks: list[Block] = [
        Heading(1, "attn-audit report"),
        para("Run folder: ", Mono(run_dir.name), f". Started: {started or 'unknown'}. "
             f"Preset: {info.get('preset') or 'unknown'}."),
    ]
    if info.get("argv"):
        blocks.append(para("Command line: ", Mono(shlex.join(str(a) for a in info["argv"]))))
    if run_info is None:
        blocks.append(para("No ", Mono(RUN_FILE), ": environment from the first record, "
                           "axes from the data."))
    return blocks


SELF_CHECK_HEADING = "Self-check: negative controls"


def _findings_display(table: pd.DataFrame, anchors: list[str]) -> pd.DataFrame:
    """findings_table for reading: severity as a badge carrying the finding's anchor (the
    verdict links there), repro as a link."""
    shown = table.assign(severity=[Span((Anchor(a), Badge(str(s)))) for a, s in zip(anchors, table["severity"])])
    if "repro" in shown.columns:
        shown["repro"] = [Link(Path(p).name, p) if isinstance(p, str) and p.endswith(".py") else p
                          for p in shown["repro"]]
    if "failure" in shown.columns:
        shown["failure"] = [Link(Path(p).name, p) if isinstance(p, str) else None for p in shown["failure"]]
    return shown


def overview_section(findings: list[dict] | None, frame: pd.DataFrame) -> list[Block]:
    """One line at the top: findings about real code by severity, and the self-check."""
    if findings is None:
        return []
    real = [f for f in findings if not is_control_finding(f)]
    parts: list[Any] = ["Findings about real code: "]
    for severity in SEVERITY_ORDER:
        count = sum(f.get("severity") == severity for f in real)
        parts += [Badge(f"{count} {severity}", severity), " "]
    check = negative_control_check(frame, findings)
    missed = check[~check["flagged"].astype(bool)]
    parts.append(f"— self-check: {int(check['flagged'].sum())}/{len(check)} negative controls "
                 "flagged" if len(check) else "— self-check: no negative control measured")
    if not missed.empty:
        parts += [" ", Badge(f"{len(missed)} audit error", "error"),
                  f" not flagged: {', '.join(missed['control'])}"]
    parts += [" (", Link("details", "#" + slugify(SELF_CHECK_HEADING)), ")."]
    return [para(*parts)]


def findings_section(findings: list[dict] | None, frame: pd.DataFrame) -> list[Block]:
    """Findings about real code (negative controls left out), then the self-check."""
    if findings is None:
        return []
    real = [f for f in findings if not is_control_finding(f)]
    controls = len(findings) - len(real)
    blocks: list[Block] = [Heading(2, "Findings")]
    left_out = (f" The {controls} findings about negative controls ({NEGATIVE_CONTROL_PREFIX}*) "
                "are expected and left out here; see the self-check below. "
                if controls else " ")
    if real:
        anchored = anchored_findings(findings)
        real = [f for f, _ in anchored]
        blocks += [
            para(findings_summary(real, about="about real code"),
                 " Most severe first; ", Mono("cells"), " is the number of cells a finding "
                 "covers.", left_out, "Every finding, with its cell ids, is in ",
                 Mono(FINDINGS_FILE), "."),
            Table(_findings_display(findings_table(real), [a for _, a in anchored])),
        ]
    else:
        blocks.append(para("No findings about real code.", left_out))
    return blocks + self_check_blocks(frame, findings)


def self_check_blocks(frame: pd.DataFrame, findings: list[dict]) -> list[Block]:
    """Was every measured negative control caught by an error-severity finding? A control
    that was not is an error of the audit itself, shown as one."""
    check = negative_control_check(frame, findings)
    blocks: list[Block] = [Heading(3, SELF_CHECK_HEADING), para(
        "The negative controls (", Mono(NEGATIVE_CONTROL_PREFIX + "*"), ") are deliberately "
        "wrong variants; each one measured must be caught by at least one error-severity "
        "finding, or the audit's checks have a hole.")]
    if check.empty:
        return blocks + [para("No negative control has an ok record in this run, so the "
                              "audit did not check itself.")]
    flagged = check[check["flagged"].astype(bool)]
    missed = check[~check["flagged"].astype(bool)]
    listed = ", ".join(f"{c} ({checks}{'; diagnosed: ' + named if named else ''})"
                       for c, checks, named in zip(flagged["control"], flagged["checks"], flagged["diagnosed"]))
    blocks.append(para(f"{len(flagged)}/{len(check)} negative controls flagged"
                       + (f": {listed}." if listed else ".")))
    if not missed.empty:
        blocks.append(para(Badge("error"), " Not flagged by any error-severity finding, an error "
                           f"of the audit itself: {', '.join(missed['control'])}."))
    return blocks


def environment_section(run_info: dict | None, records: list[dict]) -> list[Block]:
    env = (run_info or {}).get("env")
    if env is None and records:
        env = records[0].get("env")
    if not env:
        return [Heading(2, "Environment"), para("No environment recorded.")]
    table = pd.DataFrame(_flatten(env), columns=["key", "value"])
    table["value"] = table["value"].map(lambda v: "null" if v is None else format_value(v))
    return [Heading(2, "Environment"), Table(table), *_ceilings_blocks(run_info)]


def _ceilings_blocks(run_info: dict | None) -> list[Block]:
    table = ceilings_table(run_info)
    if table.empty:
        return []
    return [para("Measured ceilings (best of repeated blocks, at the start of the run); ",
                 Mono("pct_of_limit"), " is relative to these."), Table(table)]


def grid_section(run_info: dict | None, frame: pd.DataFrame) -> list[Block]:
    axes = (run_info or {}).get("axes") or {
        axis: sorted_values(frame[axis].dropna().unique().tolist()) for axis in AXES}
    axes_table = pd.DataFrame({
        "axis": list(axes),
        "values": [", ".join(format_value(v) for v in values) for values in axes.values()],
        "count": [len(values) for values in axes.values()],
    })
    expected = (run_info or {}).get("n_cells")
    status = frame["status"].value_counts().rename_axis("status").reset_index(name="cells")
    blocks: list[Block] = [
        Heading(2, "Grid"), Table(axes_table),
        para(f"Cells expected: {expected if expected is not None else 'unknown'}; "
             f"records present: {len(frame)}."),
        Table(status, caption="Cells by status"),
    ]
    not_ok = frame[frame["status"] != "ok"]
    if not_ok.empty:
        return blocks + [para("Every recorded cell is ok.")]
    reasons = not_ok["reason"].fillna("(no reason given)").astype(str).map(
        lambda r: budget_kind(r) or (r if len(r) <= REASON_WIDTH else r[:REASON_WIDTH - 1] + "…"))
    grouped = (not_ok.assign(reason=reasons).groupby(["variant", "status", "reason"])
               .size().reset_index(name="cells")
               .sort_values(["status", "cells"], ascending=[True, False], kind="stable"))
    return blocks + [Table(grouped, caption="Cells that are not ok, by variant, status and reason")]


def speed_section(frame: pd.DataFrame) -> list[Block]:
    rows = speed_rows(frame)
    blocks: list[Block] = [Heading(2, "Speed"), para(
        "Speed, memory and their figures use cells of scenario ", Mono(NORMAL_SCENARIO),
        " only; the other scenarios are stability checks. Negative controls (",
        Mono(NEGATIVE_CONTROL_PREFIX + "*"),
        ") are left out of speed and memory; they appear under Numerics.")]
    if rows.empty:
        return blocks + [para(f"No ok cells of scenario {NORMAL_SCENARIO} to compare.")]
    blocks += _stated_shape_blocks(frame, rows, "fwd_ms", 1.0, "median forward latency (ms)", show_commands=True)
    blocks += _host_bound_blocks(rows)
    blocks.append(Heading(3, f"Speed-up vs {BASELINE_VARIANT}"))
    if BASELINE_VARIANT not in set(rows["variant"]):
        return blocks + [para(f"No ok cells of the {BASELINE_VARIANT} variant: "
                              "no speed-up table.")]
    return blocks + [
        para(f"Geometric mean over matched cells (same axes except variant, both ok) of "
             f"{BASELINE_VARIANT} latency / variant latency; above 1 is faster."),
        Table(speedup_table(frame)),
    ]


def _stated_shape_blocks(frame: pd.DataFrame, rows: pd.DataFrame, metric: str, scale: float,
                         what: str, show_commands: bool = False) -> list[Block]:
    """One table per device and dtype at one stated shape: every entry is one cell's own number
    (no pooling over other axes), with the shape in the caption and the command that remeasures it."""
    blocks: list[Block] = []
    commands: list[str] = []
    for device in sorted(rows["device"].astype(str).unique()):
        for dtype in dtype_order(rows.loc[rows["device"] == device, "dtype"].unique()):
            shape_rows, shape = stated_shape(frame, device, dtype)
            table = shape_table(shape_rows, metric, scale)
            if len(table.columns) < 2:
                continue
            blocks.append(Table(table, caption=f"{describe_shape(shape)}: {what} of one cell per entry"))
            commands.append(rerun_command(shape))
    if not blocks:
        return []
    if not show_commands:
        return [para("Each entry is one cell's own number (nothing pooled), at the shapes of the Speed "
                     "tables; the commands there measure them again."), *blocks]
    intro = para("Each entry is one cell's median (no other axis pooled), at the shape its caption "
                 "states; the figures draw the same shapes. An entry is measured again by "
                 "(V, T, C: its variant, sequence length and causal flag; the cell's id is in ",
                 Mono("records.jsonl"), "):")
    return [intro, Code("\n".join(dict.fromkeys(commands))), *blocks]


def _host_bound_blocks(rows: pd.DataFrame) -> list[Block]:
    table = host_bound_table(rows)
    if table.empty:
        return []
    return [para("CUDA latencies are the device's own time (CUDA events around calls queued behind "
                 "a spin kernel). A cell is ", Mono("host_bound"), " when issuing a call (",
                 Mono("fwd_host_ms"), ": Python, dispatch, launches) takes longer than running it: "
                 "in a plain Python loop that GPU would wait for the host, so capture such calls in "
                 "a CUDA graph or batch more work per call."),
            Table(table, caption="host-bound cells per variant (forward or forward+backward)")]


def memory_section(frame: pd.DataFrame) -> list[Block]:
    rows = speed_rows(frame)
    blocks: list[Block] = [Heading(2, "Memory")]
    if rows.empty or not rows["peak_bytes"].notna().any():
        return blocks + [para("No peak memory measured.")]
    if BASELINE_VARIANT in set(rows["variant"]):
        ratios = memory_ratio_vs_baseline(frame).rename(
            columns={"ratio": f"peak / {BASELINE_VARIANT} peak"})
        blocks += [
            para(f"Geometric mean over matched cells of variant peak / {BASELINE_VARIANT} peak "
                 f"(forward); cells where either peak is 0 or null are skipped. "
                 f"{int(ratios['cells'].sum())} cell pairs used."),
            Table(ratios),
        ]
    else:
        blocks.append(para(f"No ok cells of the {BASELINE_VARIANT} variant: no memory ratio."))
    return blocks + _stated_shape_blocks(frame, rows, "peak_bytes", MIB, "forward peak memory (MiB)")


def compile_section(frame: pd.DataFrame) -> list[Block]:
    ok = ok_rows(frame)
    ok = ok[~is_negative_control(ok["variant"])]
    compiled = ok[ok["compile_s"].notna() | ok["fused_sdpa"].notna()]
    blocks: list[Block] = [Heading(2, "Compiled variants")]
    if compiled.empty:
        return blocks + [para("No compiled variants in this run.")]
    fused = compiled["fused_sdpa"]
    normal = compiled.index.isin(normal_rows(compiled).index)
    table = (compiled.assign(fused_true=fused.eq(True).astype(int),
                             fused_false=fused.eq(False).astype(int),
                             compile_normal=compiled["compile_s"].where(normal),
                             normal=normal.astype(int))
             .groupby("variant")
             .agg(median_compile=("compile_normal", "median"), normal_cells=("normal", "sum"),
                  cells=("fused_true", "size"),
                  fused_true=("fused_true", "sum"), fused_false=("fused_false", "sum"))
             .reset_index()
             .rename(columns={"median_compile": "median compile (s), normal",
                              "normal_cells": "normal cells", "cells": "all cells",
                              "fused_true": "fused_sdpa true", "fused_false": "fused_sdpa false"}))
    reused = int(compiled["compile_reused"].eq(True).sum()) if "compile_reused" in compiled.columns else 0
    return blocks + [
        Table(table),
        para("Compile time is taken over cells of scenario ", Mono(NORMAL_SCENARIO),
             " that compiled; the fused_sdpa counts over every scenario. ", Mono("fused_sdpa=true"),
             " means Inductor rewrote the hand-written code into fused "
             "SDPA, so its numerics and speed are SDPA's. "
             f"{reused} of {len(compiled)} cells reused code compiled by an earlier cell of the same "
             "shapes, dtype, causal flag and mask kind (", Mono("compile_reused"), ")."),
    ]


def numerics_section(frame: pd.DataFrame) -> list[Block]:
    rows = ok_rows(frame)
    blocks: list[Block] = [Heading(2, "Numerics")]
    if rows.empty:
        return blocks + [para("No ok cells.")]
    table = rows.groupby(["variant", "dtype"]).agg(
        max_abs_err=("max_abs_err", "max"), median_rel_err=("rel_err", "median"),
        out_nan=("out_nan", "sum"), out_inf=("out_inf", "sum"),
        grad_nan=("grad_nan", "sum"), grad_inf=("grad_inf", "sum"), cells=("id", "size"),
    ).reset_index()
    table = table.astype({c: "Int64" for c in NONFINITE_COLUMNS})
    table = table.rename(columns={"max_abs_err": "max max_abs_err",
                                  "median_rel_err": "median rel_err"})
    subset = rows[rows["golden_subset"].notna()] if "golden_subset" in rows.columns else rows.iloc[0:0]
    note = []
    if not subset.empty:
        note = [para(f"{len(subset)} cells were judged on a subset of (batch, head) slices: the float64 "
                     "golden of a large input set covers evenly spaced slices within a FLOP budget (",
                     Mono("golden_subset"), "); their error columns are over those slices, their NaN/inf "
                     "counts over the whole output.")]
    return blocks + [
        para("Errors against the float64 golden reference; NaN/inf counts summed over ok "
             "cells of every scenario (negative controls included). NaN on fully masked rows "
             "is counted here too; see Fully masked rows for what it means."),
        Table(table),
    ] + note
