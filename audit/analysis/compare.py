"""`compare A B`: what changed from run A (before) to run B (after), cell by cell.

Reads two run folders (or pytest-benchmark JSON files, converted first), matches cells by
id, and computes per cell the latency ratio B/A with a confidence interval, the peak-memory
and error ratios, and the changes in status and NaN/inf counts; findings present in only
one run; the two environments side by side. Never measures. compare_page renders it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import UsageError
from ..core.records import read_records, to_frame
from ..core.runfolder import RECORDS_FILE, RUN_FILE, read_canaries
from . import compare_stats as stats
from .findings import compute_findings
from .noise_rules import canary_summary

PHASES = (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd"))          # (column prefix, label)
MEMORY_COLUMNS = (("peak_bytes", "fwd"), ("peak_fwd_bwd_bytes", "fwd+bwd"))
ERROR_COLUMN = "rel_err"
NONFINITE_COLUMNS = ("out_nan", "out_inf", "grad_nan", "grad_inf")
ENERGY_COLUMN = "energy_per_call_j"


@dataclass
class Side:
    """One run as compare reads it."""

    label: str                   # "A" or "B"
    given: Path                  # what the user named (folder or JSON file)
    run_dir: Path                # the run folder read (the converted one for JSON)
    run_info: dict | None
    frame: pd.DataFrame          # records.to_frame: one row per cell
    findings: list[dict]
    env: dict
    noise_rel: float | None = None   # the run's canary figure (noise_rules.canary_summary canary_rel); None: no canary


def load_side(path: str | Path, label: str, out_dir: Path) -> Side:
    """A run folder, or a pytest-benchmark JSON file converted into out_dir/<label>/."""
    given = Path(path)
    run_dir = given
    if given.is_file():
        from .benchjson import convert
        try:
            run_dir, n_records, _ignored = convert(given, out_dir / label)
        except ValueError as exc:
            raise UsageError(f"compare: {exc}") from None
        if n_records == 0:
            raise UsageError(f"compare: {str(given)!r} has no benchmarks from suites/test_performance.py")
    elif not (given / RECORDS_FILE).is_file():
        raise UsageError(f"compare: {str(given)!r} is neither a run folder holding {RECORDS_FILE} "
                         "nor a pytest-benchmark JSON file")
    records = read_records(run_dir)
    info_path = run_dir / RUN_FILE
    run_info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else None
    env = (run_info or {}).get("env") or next((r["env"] for r in records if r.get("env")), {}) or {}
    frame = to_frame(records)
    # Findings are recomputed with this code's rules on both sides, so a difference comes
    # from the records, never from a change of the rules between the two runs.
    noise_rel = canary_summary(read_canaries(run_dir))["canary_rel"]
    return Side(label, given, run_dir, run_info, frame, compute_findings(frame), env, noise_rel)


# --------------------------------------------------------------------------- cells

def _value(row: pd.Series | None, column: str) -> Any:
    if row is None or column not in row.index:
        return None
    value = row[column]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _samples(row: pd.Series, phase: str) -> list[float] | None:
    value = _value(row, f"{phase}_samples_s")
    return list(value) if isinstance(value, (list, tuple, np.ndarray)) and len(value) else None


def latency_ratio(cell_id: str, phase: str, a: pd.Series, b: pd.Series) -> stats.RatioCI:
    """B/A of one phase: bootstrap from raw samples, else the normal approximation from
    median, IQR and count (pytest-benchmark JSON without data)."""
    if _value(a, "status") != "ok" or _value(b, "status") != "ok":
        return stats.NO_RATIO
    sa, sb = _samples(a, phase), _samples(b, phase)
    if sa and sb:
        return stats.bootstrap_ratio(sa, sb, seed=stats.cell_seed(f"{cell_id}/{phase}"))
    ma, mb = _value(a, f"{phase}_ms"), _value(b, f"{phase}_ms")
    if ma is None or mb is None:
        return stats.NO_RATIO
    return stats.normal_ratio(ma, _value(a, f"{phase}_iqr_ms"), _value(a, f"{phase}_n"),
                              mb, _value(b, f"{phase}_iqr_ms"), _value(b, f"{phase}_n"))


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


def _nonfinite_change(a: pd.Series, b: pd.Series) -> str:
    """'out_nan 0→64, grad_nan 0→128', or '' when every count is the same."""
    parts = []
    for col in NONFINITE_COLUMNS:
        va, vb = _count(_value(a, col)), _count(_value(b, col))
        if va != vb:
            parts.append(f"{col} {'—' if va is None else va}→{'—' if vb is None else vb}")
    return ", ".join(parts)


def compare_cells(a: pd.DataFrame, b: pd.DataFrame, noise_sd: float | None = None,
                  floor_sd: float = stats.NOISE_FLOOR_SD) -> tuple[pd.DataFrame, dict[str, dict]]:
    """One row per matched cell (both runs have its id), in A's order, and per phase the
    run-to-run noise {phase: {"used": the run's part (the spread measured or `floor_sd`, the
    larger; `noise_sd` where given), "measured": the spread or None, "cells": n, "floor": floor_sd,
    "per_cell": the median over the cells of that part with each cell's own intervals added}}.

    Latency columns: {phase}_ratio, {phase}_low, {phase}_high (the interval widened by the
    cell's run-to-run noise, compare_stats.cell_noise_sd), {phase}_noise_sd (that noise),
    {phase}_method. memory_peak_bytes, memory_peak_fwd_bwd_bytes and error: floored ratios
    (compare_stats.floored_ratio); energy; status_a, status_b; nonfinite (what changed)."""
    a_rows = a.set_index("id", drop=False)
    b_rows = b.set_index("id", drop=False)
    matched = [i for i in a["id"] if i in b_rows.index]
    rows = []
    for cell_id in matched:
        ra, rb = a_rows.loc[cell_id], b_rows.loc[cell_id]
        row: dict[str, Any] = {"id": cell_id, "variant": ra["variant"], "dtype": ra.get("dtype"),
                               "status_a": ra["status"], "status_b": rb["status"]}
        for phase, _ in PHASES:
            ci = latency_ratio(cell_id, phase, ra, rb)
            row.update({f"{phase}_ratio": ci.ratio, f"{phase}_low": ci.low, f"{phase}_high": ci.high,
                        f"{phase}_method": ci.method,
                        f"{phase}_ci_rel": (_value(ra, f"{phase}_ci_rel"), _value(rb, f"{phase}_ci_rel"))})
        both_ok = ra["status"] == "ok" and rb["status"] == "ok"
        for column, _label in MEMORY_COLUMNS:
            row[f"memory_{column}"] = (stats.floored_ratio(_value(ra, column), _value(rb, column),
                                                           stats.MEMORY_FLOOR_BYTES) if both_ok else math.nan)
        row["error"] = (stats.floored_ratio(_value(ra, ERROR_COLUMN), _value(rb, ERROR_COLUMN),
                                            stats.error_floor(ra.get("dtype"))) if both_ok else math.nan)
        row["error_a"], row["error_b"] = _value(ra, ERROR_COLUMN), _value(rb, ERROR_COLUMN)
        ea, eb = _value(ra, ENERGY_COLUMN), _value(rb, ENERGY_COLUMN)
        row["energy"] = eb / ea if both_ok and ea and eb is not None else math.nan
        row["nonfinite"] = _nonfinite_change(ra, rb)
        rows.append(row)
    cells = pd.DataFrame(rows)
    noise: dict[str, dict] = {}
    for phase, _ in PHASES:
        ratios = cells[f"{phase}_ratio"].tolist() if not cells.empty else []
        used, measured = stats.run_noise_sd(ratios, cells["variant"].tolist() if not cells.empty else [], floor_sd)
        if noise_sd is not None:
            used = noise_sd
        intervals = cells.pop(f"{phase}_ci_rel").tolist() if not cells.empty else []   # (A's, B's) ci_rel
        sds = [stats.cell_noise_sd(used, *pair) for pair in intervals]
        judged = [sd for sd, r in zip(sds, ratios) if math.isfinite(r)]
        noise[phase] = {"used": used, "measured": measured, "cells": len(judged), "floor": floor_sd,
                        "per_cell": float(np.median(judged)) if judged else None}
        if cells.empty:
            continue
        widened = [stats.widen(stats.RatioCI(r, lo, hi, m), sd) for r, lo, hi, m, sd in
                   zip(cells[f"{phase}_ratio"], cells[f"{phase}_low"], cells[f"{phase}_high"],
                       cells[f"{phase}_method"], sds)]
        cells[f"{phase}_low"] = [w.low for w in widened]
        cells[f"{phase}_high"] = [w.high for w in widened]
        cells[f"{phase}_noise_sd"] = sds
        cells[f"{phase}_method"] = [w.method for w in widened]
    return cells, noise


def only_in(x: pd.DataFrame, y: pd.DataFrame) -> pd.DataFrame:
    """Cells of x whose id y lacks: id, variant, status."""
    rows = x[~x["id"].isin(set(y["id"]))]
    return rows[["id", "variant", "status"]].reset_index(drop=True)


# --------------------------------------------------------------------------- gate

def failures(cells: pd.DataFrame, thresholds: list[stats.Threshold]) -> pd.DataFrame:
    """Cells over a --fail-on threshold: latency when its whole widened interval lies above
    1 + threshold (either phase); memory (either phase) and error when the floored ratio is
    above it. Columns: id, rule, metric, ratio, low, high."""
    out = []
    if cells.empty:
        return pd.DataFrame(columns=["id", "rule", "metric", "ratio", "low", "high"])
    for rule in thresholds:
        for cell in cells.itertuples(index=False):
            row = cell._asdict()
            if rule.kind == "latency":
                for phase, label in PHASES:
                    ci = stats.RatioCI(row[f"{phase}_ratio"], row[f"{phase}_low"], row[f"{phase}_high"], "")
                    if ci.excludes_above(rule.limit):
                        out.append((row["id"], str(rule), f"latency {label}", ci.ratio, ci.low, ci.high))
            elif rule.kind == "memory":
                for column, label in MEMORY_COLUMNS:
                    ratio = row[f"memory_{column}"]
                    if ratio > rule.limit:
                        out.append((row["id"], str(rule), f"peak memory {label}", ratio, math.nan, math.nan))
            elif row["error"] > rule.limit:
                out.append((row["id"], str(rule), f"error ({ERROR_COLUMN})", row["error"], math.nan, math.nan))
    return pd.DataFrame(out, columns=["id", "rule", "metric", "ratio", "low", "high"])


# --------------------------------------------------------------------------- findings

def _finding_key(finding: dict) -> tuple[str, str]:
    return (str(finding.get("check")), str(finding.get("variant")))


def findings_diff(a: list[dict], b: list[dict]) -> tuple[list[dict], list[dict], pd.DataFrame]:
    """(only in A, only in B, changed): a finding is the same in both runs when its check and
    variant are; `changed` lists those whose severity or number of cells differ."""
    by_a = {_finding_key(f): f for f in a}
    by_b = {_finding_key(f): f for f in b}
    changed = []
    for key in by_a.keys() & by_b.keys():
        fa, fb = by_a[key], by_b[key]
        if fa.get("severity") != fb.get("severity") or len(fa.get("cells") or []) != len(fb.get("cells") or []):
            changed.append({"check": key[0], "variant": key[1],
                            "severity A → B": f"{fa.get('severity')} → {fb.get('severity')}",
                            "cells A → B": f"{len(fa.get('cells') or [])} → {len(fb.get('cells') or [])}"})
    table = pd.DataFrame(changed, columns=["check", "variant", "severity A → B", "cells A → B"])
    return ([f for k, f in by_a.items() if k not in by_b], [f for k, f in by_b.items() if k not in by_a],
            table.sort_values(["check", "variant"]).reset_index(drop=True))


# --------------------------------------------------------------------------- environments

# (label, where in the run's env or run.json, group). The rule: a comparison changes one
# group (machine, torch or code); more than one changing at once cannot be told apart in
# the ratios. `settings` (how it was measured) should never differ. `None`: shown only.
ENV_FIELDS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("device", ("env.device_name",), "machine"),
    ("GPUs", ("env.nvml.gpus",), "machine"),
    ("GPU driver", ("env.nvml.driver", "env.nvidia_driver"), "machine"),
    ("CPU model", ("env.cpu_model",), "machine"),
    ("CPU capability", ("env.cpu_capability",), "machine"),
    ("CPU count", ("env.cpu_count",), "machine"),
    ("torch threads", ("env.threads",), "machine"),
    ("torch", ("env.torch",), "torch"),
    ("CUDA (torch build)", ("env.cuda",), "torch"),
    ("python", ("env.python",), "torch"),
    ("audit code (git commit)", ("env.git_commit",), "code"),
    ("audit version", ("env.audit_version", "code_version", "env.code_version"), "code"),
    ("measured by", ("env.source",), "settings"),
    ("float32 matmul precision", ("env.float32_matmul_precision",), "settings"),
    ("min samples per measurement", ("timing.min_samples",), "settings"),
    ("min timed seconds per measurement", ("timing.min_time_s",), "settings"),
    ("preset", ("preset",), None),
    ("platform", ("env.platform",), None),
    ("started", ("started_at",), None),
)
CHANGE_GROUPS = ("machine", "torch", "code")


def _lookup(side: Side, path: str) -> Any:
    node: Any = {"env": side.env, **(side.run_info or {})}
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    if path == "env.nvml.gpus" and isinstance(node, list):
        return ", ".join(str(g.get("name")) for g in node if isinstance(g, dict))
    return node


def _field(side: Side, paths: tuple[str, ...]) -> Any:
    found = (_lookup(side, p) for p in paths)
    value = next((v for v in found if v is not None), None)
    if paths == ("env.source",) and value is None:
        return "attn-audit run"
    return value


@dataclass
class EnvComparison:
    table: pd.DataFrame                          # field, A, B, differs, group
    changed: dict[str, list[str]] = field(default_factory=dict)   # group -> fields that differ
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def compare_environments(a: Side, b: Side) -> EnvComparison:
    rows, changed = [], {}
    for label, paths, group in ENV_FIELDS:
        va, vb = _field(a, paths), _field(b, paths)
        if va is None and vb is None:
            continue
        differs = va != vb
        rows.append({"field": label, "A": va, "B": vb, "differs": "yes" if differs else "",
                     "group": group or "shown only"})
        if differs and group is not None:
            changed.setdefault(group, []).append(label)
    result = EnvComparison(pd.DataFrame(rows, columns=["field", "A", "B", "differs", "group"]), changed)
    kinds = [g for g in CHANGE_GROUPS if g in changed]
    if len(kinds) > 1:
        what = "; ".join(f"{g}: {', '.join(changed[g])}" for g in kinds)
        result.warnings.append(
            f"A and B differ in more than one of machine, torch and code ({what}). A comparison should "
            f"change one of them: otherwise a ratio cannot be attributed to either change. Rerun one "
            f"side so that only the change under study differs.")
    if "settings" in changed:
        result.warnings.append(
            f"A and B were measured differently ({', '.join(changed['settings'])}): their latencies "
            f"are not directly comparable whatever else changed.")
    commit_a, commit_b = _field(a, ("env.git_commit",)), _field(b, ("env.git_commit",))
    if commit_a and commit_a == commit_b and str(commit_a).endswith("-dirty"):
        result.notes.append("Both runs are from the same commit with uncommitted changes (-dirty): the "
                            "code may differ even though the commit is the same.")
    return result


# --------------------------------------------------------------------------- all of it

@dataclass
class Comparison:
    a: Side
    b: Side
    cells: pd.DataFrame
    noise: dict[str, dict]
    noise_given: bool
    only_a: pd.DataFrame
    only_b: pd.DataFrame
    findings_only_a: list[dict]
    findings_only_b: list[dict]
    findings_changed: pd.DataFrame
    env: EnvComparison
    thresholds: list[stats.Threshold]
    failed: pd.DataFrame
    paths: dict[str, Path] = field(default_factory=dict)   # the files the comparison's page wrote

    @property
    def warnings(self) -> list[str]:
        """The environment's warnings, and a run-to-run noise measured from too few cells to trust."""
        out = list(self.env.warnings)
        few = [f"{label} {self.noise[phase]['cells']}" for phase, label in PHASES
               if not self.noise_given and 0 < self.noise[phase]["cells"] < stats.MIN_CELLS_FOR_NOISE]
        if few:
            out.append(f"Too few matched cells to measure run-to-run noise well ({', '.join(few)}; "
                       f"{stats.MIN_CELLS_FOR_NOISE} or more read it): the spread of so few is their largest "
                       f"moves, or nothing under {stats.MIN_CELLS_FOR_SPREAD}, and with the canaries and the "
                       f"cells' own intervals it may understate a busy machine's; pass --noise SD measured "
                       f"on this machine (docs/compare.md).")
        return out


def compare_runs(a_path: str | Path, b_path: str | Path, out_dir: Path,
                 thresholds: list[stats.Threshold], noise_sd: float | None = None) -> Comparison:
    a = load_side(a_path, "A", out_dir)
    b = load_side(b_path, "B", out_dir)
    cells, noise = compare_cells(a.frame, b.frame, noise_sd, stats.canary_floor_sd(a.noise_rel, b.noise_rel))
    only_a_findings, only_b_findings, changed = findings_diff(a.findings, b.findings)
    return Comparison(a, b, cells, noise, noise_sd is not None, only_in(a.frame, b.frame),
                      only_in(b.frame, a.frame), only_a_findings, only_b_findings, changed,
                      compare_environments(a, b), thresholds, failures(cells, thresholds))
