"""`make gpu-check` / `audit gpu-check`: every GPU acceptance check in one call.

Steps (each a run folder under reports/gpu-check-<stamp>/):

1. predict: the cost model's prediction of this check and of the whole gpu preset;
2. main:    `audit run --preset gpu-check` (docs/command-line.md): small and large speed cells
            of every SDPA backend with energy, masked causal cells of the hand-written
            variants, compiled-code reuse, a golden subset, cells predicted not to fit;
3. oom:     a plug-in that allocates 64 TiB, then `sdpa`: a real out-of-memory.

The main step's run ends with the model audit on CUDA (llama-medium and gpt-oss-medium, docs/model.md).

Then it prints what each check measured, PASS or FAIL: no error cells; masked causal
cells run on CUDA; energy: the GPU kept busy in the window and the counter's power against
sampled instantaneous power; a forced backend's time against the dispatcher's choice of the
same kernel; oom cells; the golden subset; compiled-code reuse without graph breaks; the
prediction against the wall time; believable ceilings; the model audit on CUDA (its float64 runs
and yardsticks ok, its controls flagged). The main step's time limit follows its
plan (main_step_limit_s). With $OUT set, summary.txt, table.txt and a tarball per step are
copied there.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tarfile
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..core.grid import INPUT_AXES
from ..core.paths import reports_root
from ..core.runfolder import RECORDS_FILE, RUN_FILE
from ..measure.machine.energy import MAX_WALL_S as ENERGY_MAX_WALL_S
from ..measure.machine.energy_window import COUNTER_VS_SAMPLED_TOL

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

FLAGSHIP = dict(variant="sdpa_flash", dtype="bf16", d_k=128, seq_len=8192)
OOM_ARGS = ("--preset", "gpu-check", "--variant", "oom_plugin:allocate_too_much", "sdpa",
            "--scenario", "normal", "--dtype", "bf16", "--seq-len", "1024", "--batch", "2",
            "--causal", "false", "--no-report")
PLUGINS = Path(__file__).resolve().parents[2] / "tests" / "plugins"
ENERGY_TOLERANCE = 0.15          # busy ratio: the window's device time per call over the kernel time
COUNTER_TOLERANCE = COUNTER_VS_SAMPLED_TOL   # the counter's power vs instantaneous power on a steady load
ENERGY_MIN_CALL_MS = 0.02        # cells of 20 us and more
ENERGY_MAX_COST_S = ENERGY_MAX_WALL_S   # per cell, for calls short enough to fit it
HOST_TOLERANCE = 0.10            # forced backend vs the dispatcher's choice of the same kernel
HAND_WRITTEN = ("eager", "eager_fp32", "broken.clamped")
# Time limits per step. The main step's follows its plan (main_step_limit_s): the run keeps to
# its budget by itself, so the limit adds only what the budget does not hold.
STEP_START_S = 45        # process starts (supervisor and worker), imports, CUDA init, ceilings (<= 3 s)
STEP_REPORT_S = 30       # findings, figures and the report after the last cell
OOM_TIMEOUT_S = 60       # two cells: the plug-in's real out-of-memory, then sdpa
MASK_SCENARIOS = ("padding", "fully_masked_bool", "fully_masked_neginf", "cross_causal")


def _ok(frame: "pd.DataFrame") -> "pd.DataFrame":
    return frame[frame["status"] == "ok"]


def _num(frame: "pd.DataFrame", col: str) -> "pd.Series":
    import pandas as pd
    return pd.to_numeric(frame[col], errors="coerce") if col in frame.columns else pd.Series(dtype=float)


def compact_table(frame: "pd.DataFrame") -> "pd.DataFrame":
    """variant, dtype, seq_len, causal, ms, host ms, TFLOP/s, pct_of_limit, J/call, NaN for ok cells."""
    import pandas as pd

    ok = _ok(frame).copy()
    table = pd.DataFrame({
        "variant": ok["variant"], "dtype": ok["dtype"], "scenario": ok["scenario"], "seq_len": ok["seq_len"],
        "batch": ok["batch"], "causal": ok["causal"], "ms": ok["fwd_ms"], "host_ms": _num(ok, "fwd_host_ms"),
        "TFLOP/s": _num(ok, "gflops_per_s") / 1e3, "pct_of_limit": ok["pct_of_limit"],
        "J/call": ok["energy_per_call_j"], "NaN": ok["out_nan"],
    })
    return table.sort_values(["scenario", "dtype", "seq_len", "causal", "variant"]).reset_index(drop=True)


def energy_check(frame: "pd.DataFrame") -> "pd.DataFrame":
    """Per cell with energy, the two things the energy check judges, and what it cost:

    - busy_ratio: counter J/call ÷ (mean power × median forward time). energy_per_call_j is
      mean power × the window's device time per call, so this is that time over the timed
      kernel time: 1 when the GPU ran the calls back to back, above 1 when it idled between
      them. It says nothing about the counter itself;
    - counter_vs_sampled: the counter's mean power ÷ the mean of instantaneous power readings in
      the same window: shown, not judged (the instant field lags a GPU that just left idle: on an
      H200, 8 of 38 cells within 15%); the counter's check is the run's steady one
      (check_energy's counter_check). Null unless those readings were instantaneous
      (sampled_power_source "instant": NVML's 1 s average lags a cell behind).
    """
    ok = _ok(frame)
    ok = ok[ok["energy_per_call_j"].notna()].copy()
    ok["power_x_time_j"] = _num(ok, "mean_power_w") * _num(ok, "fwd_ms") / 1e3
    ok["busy_ratio"] = _num(ok, "energy_per_call_j") / ok["power_x_time_j"]
    ok["counter_vs_sampled"] = _num(ok, "mean_power_w") / _num(ok, "sampled_power_w")
    if "sampled_power_source" in ok.columns:     # the lagging 1 s average checks nothing
        ok.loc[ok["sampled_power_source"] != "instant", "counter_vs_sampled"] = float("nan")
    cols = ["id", "fwd_ms", "energy_method", "energy_per_call_j", "power_x_time_j", "busy_ratio",
            "energy_idle_frac", "mean_power_w", "sampled_power_w", "sampled_power_source", "counter_vs_sampled",
            "energy_cost_s", "energy_read_s", "l2_flush"]
    return ok[[c for c in cols if c in ok.columns]]


def flagship_fraction(frame: "pd.DataFrame", ceilings: dict | None) -> str:
    """sdpa_flash bf16 d128 T8192: achieved FLOP/s over the measured bf16 matmul ceiling."""
    ok = _ok(frame)
    rows = ok[(ok[list(FLAGSHIP)] == list(FLAGSHIP.values())).all(axis=1)]
    peak = ((ceilings or {}).get("cuda") or {}).get("matmul_flops_per_s", {}).get(FLAGSHIP["dtype"])
    if rows.empty or not peak:
        return "sdpa_flash bf16 d128 T8192: not measured"
    parts = []
    for _, r in rows.iterrows():
        parts.append(f"{'causal' if r['causal'] else 'full'}: {r['gflops_per_s'] / 1e3:.1f} TFLOP/s = "
                     f"{r['gflops_per_s'] * 1e9 / peak:.1%} of the measured bf16 matmul ceiling "
                     f"({peak / 1e12:.0f} TFLOP/s)")
    return "sdpa_flash bf16 d128 T8192: " + "; ".join(parts)


# --------------------------------------------------------------------------- checks
# Each returns (passed, lines): what was measured, in words and numbers.

Check = tuple[bool, list[str]]


def check_no_errors(frame: "pd.DataFrame") -> Check:
    bad = frame[frame["status"] == "error"]
    counts = frame["status"].value_counts().to_dict()
    lines = [f"{len(frame)} cells: " + ", ".join(f"{k} {v}" for k, v in counts.items())]
    lines += [f"  error {r['id']}: {r['reason']}" for _, r in bad.iterrows()]
    return bad.empty, lines


def check_masked_causal(frame: "pd.DataFrame") -> Check:
    """Hand-written variants on causal cells with a mask (the H200 run's device bug)."""
    rows = frame[frame["variant"].isin(HAND_WRITTEN) & frame["causal"].astype(bool)
                 & frame["scenario"].isin(MASK_SCENARIOS)]
    bad = rows[rows["status"] != "ok"]
    lines = [f"{len(rows) - len(bad)}/{len(rows)} masked causal cells of {', '.join(HAND_WRITTEN)} ok"]
    lines += [f"  {r['id']}: {r['status']} {r['reason']}" for _, r in bad.iterrows()]
    return len(rows) > 0 and bad.empty, lines


def _within(values: "pd.Series", tolerance: float) -> "pd.Series":
    """True where a ratio is measured and within `tolerance` of 1 (NaN: not measured, False)."""
    return (values - 1).abs() <= tolerance


def check_energy(frame: "pd.DataFrame", ceilings: dict | None = None) -> Check:
    """Every cell of 20 us and more: the GPU kept busy in the window (busy_ratio within 15%, not
    judged on L2-flushed cells, whose median is a cold-cache time), and at most 0.3 s of energy
    cost per cell for calls up to 50 ms; and the run's energy counter against the instantaneous
    power on a steady load (run.json's ceilings: cuda energy_counter_check, within 15%), the
    counter's one independent check. The per-cell counter ÷ sampled power is printed, not judged."""
    table = energy_check(frame)
    judged = table[_num(table, "fwd_ms") >= ENERGY_MIN_CALL_MS]
    if judged.empty:
        return False, ["no cell with energy measured"]
    flushed = judged["l2_flush"].map(lambda v: v is True) if "l2_flush" in judged.columns else False
    busy_judged = judged[~flushed] if "l2_flush" in judged.columns else judged
    idle = busy_judged[~_within(busy_judged["busy_ratio"], ENERGY_TOLERANCE)]
    counter = _num(judged, "counter_vs_sampled")
    short = judged[_num(judged, "fwd_ms") <= 50]
    cost = _num(short, "energy_cost_s")
    reads = _num(judged, "energy_read_s")
    steady = ((ceilings or {}).get("cuda") or {}).get("energy_counter_check") or {}
    agrees = steady.get("agrees") is True
    lines = [f"GPU kept busy: {len(busy_judged) - len(idle)}/{len(busy_judged)} cells of >= "
             f"{ENERGY_MIN_CALL_MS * 1e3:.0f} us with busy ratio within {ENERGY_TOLERANCE:.0%} "
             f"(min {busy_judged['busy_ratio'].min():.3f}, median {busy_judged['busy_ratio'].median():.3f}, "
             f"max {busy_judged['busy_ratio'].max():.3f})"
             + (f"; {len(judged) - len(busy_judged)} L2-flushed cell(s) not judged" if len(busy_judged) < len(judged)
                else ""),
             "energy counter on a steady load: " + _steady_line(steady, agrees),
             f"counter vs sampled power per cell (not judged: the instant field lags): median {counter.median():.3f}, "
             f"range {counter.min():.3f}-{counter.max():.3f}, {int(counter.isna().sum())} without instantaneous power",
             f"energy cost per cell (calls <= 50 ms): median {cost.median():.3f} s, max {cost.max():.3f} s"
             + (f"; one energy-counter read: median {reads.median() * 1e3:.2f} ms, max {reads.max() * 1e3:.2f} ms"
                if reads.notna().any() else ""),
             f"idle fraction: max {_num(judged, 'energy_idle_frac').max():.3f}; methods: "
             + ", ".join(sorted(set(map(str, judged["energy_method"]))))]
    lines += [f"  idle: {r['id']} busy ratio {r['busy_ratio']:.3f} idle {r.get('energy_idle_frac')}"
              for _, r in idle.iterrows()]
    passed = idle.empty and agrees and bool((cost <= ENERGY_MAX_COST_S).all())
    return passed, lines


def _steady_line(steady: dict, agrees: bool) -> str:
    if not steady:
        return "not measured (no energy_counter_check in run.json's cuda ceilings)"
    if steady.get("ratio") is None:
        return f"not judged: {steady.get('reason')}"
    return (f"{'within' if agrees else 'NOT within'} {COUNTER_TOLERANCE:.0%}: counter {steady['counter_w']:.0f} W, "
            f"instantaneous {steady['sampled_w']:.0f} W (median of {steady['samples']} readings), ratio "
            f"{steady['ratio']:.3f} over {steady['window_s']:.2f} s")


def _ms(value: Any) -> str:
    return f"{value:.4f} ms" if isinstance(value, (int, float)) and value == value else "n/a"


def check_host_overhead(frame: "pd.DataFrame") -> Check:
    """A forced backend times within 10% of the dispatcher's choice of the same kernel."""
    ok = _ok(frame)
    ok = ok[ok["scenario"] == "normal"]
    keys = [a for a in INPUT_AXES if a in ok.columns]     # the same cell but for the variant
    lines, passed, pairs = [], True, 0
    dispatcher = ok[ok["variant"] == "sdpa"]
    for _, d in dispatcher.iterrows():
        forced_name = {"CUDNN_ATTENTION": "sdpa_cudnn", "FLASH_ATTENTION": "sdpa_flash",
                       "EFFICIENT_ATTENTION": "sdpa_efficient", "MATH": "sdpa_math"}.get(str(d["sdpa_backend"]))
        known = [k for k in keys if d[k] == d[k] and d[k] is not None]    # a null axis: not recorded
        match = ok[(ok["variant"] == forced_name) & (ok[known] == d[known]).all(axis=1)]
        if match.empty:
            continue
        f = match.iloc[0]
        ratio = f["fwd_ms"] / d["fwd_ms"]
        pairs += 1
        within = abs(ratio - 1) <= HOST_TOLERANCE
        passed &= within
        lines.append(f"{'ok ' if within else 'OFF'} T{d['seq_len']} B{d['batch']} "
                     f"{'causal' if d['causal'] else 'full'}: {forced_name} {f['fwd_ms']:.4f} ms vs sdpa "
                     f"({d['sdpa_backend']}) {d['fwd_ms']:.4f} ms, ratio {ratio:.3f}; host issue "
                     f"{_ms(f.get('fwd_host_ms'))} vs {_ms(d.get('fwd_host_ms'))}, "
                     f"host_bound {f.get('host_bound')} / {d.get('host_bound')}")
    bound = ok[ok["host_bound"].map(lambda v: v is True)] if "host_bound" in ok.columns else ok.iloc[0:0]
    lines.append(f"host-bound cells: {len(bound)}/{len(ok)}"
                 + (": " + ", ".join(bound["id"].head(8)) if len(bound) else ""))
    return pairs > 0 and passed, lines


def check_oom(main: "pd.DataFrame", oom: "pd.DataFrame | None") -> Check:
    predicted = main[main["status"] == "oom"]
    lines = [f"predicted oom: {r['id']} in {r['elapsed_s'] * 1e3:.1f} ms ({r['reason'][:90]}...)"
             for _, r in predicted.iterrows()]
    passed = len(predicted) > 0 and bool((_num(predicted, "elapsed_s") < 5).all())
    if oom is None or oom.empty:
        return False, lines + ["real oom step: no records"]
    for _, r in oom.iterrows():
        lines.append(f"real: {r['id']}: {r['status']}" + (f" ({str(r['reason'])[:100]})" if r["reason"] else "")
                     + (f", {r['fwd_ms']:.4f} ms" if r["status"] == "ok" else ""))
    plugin = oom[oom["variant"].str.contains("allocate_too_much")]
    after = oom[oom["variant"] == "sdpa"]
    passed &= bool((plugin["status"] == "oom").all()) and bool((after["status"] == "ok").all()) \
        and len(plugin) > 0 and len(after) > 0
    return passed, lines


def check_golden_subset(frame: "pd.DataFrame") -> Check:
    ok = _ok(frame)
    rows = ok[ok["golden_subset"].notna()] if "golden_subset" in ok.columns else ok.iloc[0:0]
    lines = [f"{r['id']}: golden over {len(r['golden_subset'])} of {r['batch'] * r['heads']} slices, "
             f"cell {r['elapsed_s']:.2f} s, rel_err {r['rel_err']:.3g}" for _, r in rows.iterrows()]
    return len(rows) > 0, lines or ["no cell with a golden subset"]


def check_compile_reuse(frame: "pd.DataFrame") -> Check:
    """Compiled cells of one shape reuse the code compiled first (scaled_x16 compiles nothing),
    and no compiled variant's code was split by a graph break (it would partly run eagerly)."""
    ok = _ok(frame)
    rows = ok[ok["variant"].isin(("compiled", "compiled_unfused", "flex"))]
    lines, passed = [], len(rows) > 0
    for _, r in rows.iterrows():
        breaks = r.get("graph_breaks")
        lines.append(f"{r['id']}: " + ("reused compiled code" if r.get("compile_reused")
                                       else f"compiled in {r['compile_s']:.2f} s")
                     + (f", {int(breaks)} graph break(s)" if isinstance(breaks, (int, float)) and breaks == breaks
                        and breaks > 0 else ""))
    stab = rows[rows["scenario"] == "scaled_x16"]
    passed &= len(stab) > 0 and bool(stab["compile_reused"].astype(bool).all())
    passed &= not bool((_num(rows, "graph_breaks") > 0).any())
    return passed, lines


def check_prediction(pred: "pd.DataFrame", frame: "pd.DataFrame", wall_s: float) -> Check:
    """The cells' predicted seconds against what they took, summed over the cells that ran: a cell
    the budget skipped took nothing, and its prediction on one side only (the H200's skipped 32 s
    flex cell) made the totals disagree whatever the model."""
    merged = pred[["id", "total_s"]].merge(frame[["id", "elapsed_s", "status"]], on="id")
    ran = merged[merged["status"] != "skipped"]
    ok = merged[merged["status"] == "ok"]
    ratio = ok["total_s"] / ok["elapsed_s"]
    within = int(((ratio >= 0.5) & (ratio <= 2)).sum())
    total_pred = float(ran["total_s"].sum())
    total_rec = float(ran["elapsed_s"].sum())
    lines = [f"cells that ran: predicted {total_pred:.1f} s, recorded {total_rec:.1f} s "
             f"(ratio {total_pred / total_rec:.2f}); {within}/{len(ok)} ok cells within 2x; "
             f"the step's wall time {wall_s:.1f} s"]
    worst = ok.assign(ratio=ratio).sort_values("ratio").iloc[[0, -1]] if len(ok) > 1 else ok
    lines += [f"  {r['id']}: predicted {r['total_s']:.2f} s, recorded {r['elapsed_s']:.2f} s"
              for _, r in worst.iterrows()]
    return abs(total_pred / total_rec - 1) <= 0.25, lines


def check_ceilings(ceilings: dict | None) -> Check:
    """The device's ceilings: measured within the time budget (at most 3 s per device), and each
    matmul believable (roofline.matmul_plausibility: grown to its largest size, or at a rate the
    device's SM count and bandwidth allow), since every pct_of_limit divides by it."""
    from ..measure.machine.roofline import matmul_plausibility

    cuda = (ceilings or {}).get("cuda") or {}
    if not cuda:
        return False, ["no CUDA ceilings in run.json"]
    rates = ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s (n={cuda.get('matmul_n', {}).get(k)})"
                      for k, v in (cuda.get("matmul_flops_per_s") or {}).items() if v)
    took = cuda.get("elapsed_s")
    setup = {k: v for k, v in (cuda.get("matmul_setup_s") or {}).items() if v is not None}
    line = (f"{rates}; copy {(cuda.get('copy_bytes_per_s') or 0) / 1e12:.2f} TB/s; measured in "
            + (f"{took:.2f} s" if isinstance(took, (int, float)) else "an unrecorded time")
            + (f"; first call (setup, not growth) {max(setup.values()):.3f} s" if setup else ""))
    verdicts = [matmul_plausibility(cuda, dt) for dt, v in (cuda.get("matmul_flops_per_s") or {}).items() if v]
    lines = [line] + [f"{'ok ' if ok else 'BAD'} {why}" for ok, why in verdicts]
    believable = bool(verdicts) and all(ok is True for ok, _ in verdicts)
    return isinstance(took, (int, float)) and took <= 3.0 and believable, lines


def check_model_audit(run_dir: Path) -> Check:
    """The model audit on CUDA (DIR/model.jsonl): every float64 run and yardstick run ok on cuda, no run
    crashed or failed, and every control run there flagged (analysis.model_rules)."""
    from ..analysis.model_rules import FAILED_STATUSES, MODEL_BASELINES, check_model
    from ..core.runfolder import read_model_records
    from ..workload.model import MODEL_CONTROLS
    records = read_model_records(run_dir)
    refs = [r for r in records if r.get("kind") == "reference"]
    runs = [r for r in records if r.get("kind") == "variant"]
    if not refs:
        why = "; ".join(str(r.get("reason")) for r in records) or "no model.jsonl"
        return False, [f"no model audit: {why}"]
    flagged = {f["variant"] for f in check_model(records)}
    lines = [f"{r['model']} float64 on {r.get('device')}: {r.get('status')}, {float(r.get('seconds') or 0):.1f} s"
             + (f" ({r.get('reason')})" if r.get("status") != "ok" else "") for r in refs]
    for r in runs:
        if r["variant"] in MODEL_BASELINES and r.get("status") == "ok":
            lines.append(f"{r['variant']} {r['model']} {r['dtype']}: error after the last layer "
                         f"{float(r['final_hidden_err']):.3g}, growth {float(r['growth_median']):.3f}×/layer, "
                         f"KL {float(r['kl']):.3g}, {float(r['seconds']):.2f} s")
    bad = [r for r in runs if r.get("status") in FAILED_STATUSES]
    lines += [f"  {r['status']} {r['variant']} {r['model']} {r['dtype']}: {r.get('reason')}" for r in bad]
    controls = {r["variant"] for r in runs if r["variant"] in MODEL_CONTROLS and r.get("status") == "ok"}
    missed = sorted(controls - flagged)
    lines.append(f"controls flagged: {len(controls) - len(missed)}/{len(controls)}"
                 + (f"; not flagged: {', '.join(missed)}" if missed else ""))
    yardsticks_ok = all(any(r["variant"] in MODEL_BASELINES and r["model"] == ref["model"] and r.get("status") == "ok"
                            for r in runs) for ref in refs)
    return (all(r.get("status") == "ok" and r.get("device") == "cuda" for r in refs) and yardsticks_ok
            and not bad and bool(controls) and not missed), lines


# --------------------------------------------------------------------------- driver

def main_step_limit_s(run_options: Sequence[str], predicted: "pd.DataFrame") -> int:
    """Seconds the main step may take: process start and ceilings, the run's budget (the
    preset's, or --budget among `run_options`; twice the predicted cells under --budget none),
    the cell in flight when the budget ends (--max-cell-s), and the report."""
    from ..core.units import parse_duration
    from ..workload import presets

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--budget")
    parser.add_argument("--max-cell-s", type=float)
    given, _ = parser.parse_known_args(list(run_options))
    preset = presets.presets()["gpu-check"]
    budget = preset.budget_s if given.budget is None else parse_duration(given.budget)
    if budget is None:
        budget = 2 * float(predicted["total_s"].sum())
    cell = given.max_cell_s if given.max_cell_s is not None else (preset.max_cell_s or 0.0)
    return int(math.ceil(STEP_START_S + budget + cell + STEP_REPORT_S))


def _run_step(name: str, args: Sequence[str], root: Path, log: list[str], timeout_s: int,
              env: dict | None = None) -> tuple[Path, float, int]:
    out = root / name
    cmd = [sys.executable, "-m", "audit", "run", *args, "--out", str(out), "--no-progress"]
    log.append(f"== step {name}: {' '.join(cmd[2:])}")
    print(log[-1], flush=True)
    start = time.perf_counter()
    try:
        code = subprocess.call(cmd, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = 124
    return out, time.perf_counter() - start, code


def _predict(preset_name: str, run_dir: Path | None = None) -> "pd.DataFrame":
    from ..plan.forecast import plan
    from ..workload import presets, variants
    preset = presets.presets()[preset_name]
    cases = presets.preset_cases(preset, known_variant=variants.check_name)
    return plan(cases, preset, run_dir).pred


HELP = "every GPU acceptance check in one call (make gpu-check; needs CUDA)"
DESCRIPTION = ("Run the gpu-check preset, a real out-of-memory and the cost model's prediction, then "
               "print PASS or FAIL for each GPU acceptance check (docs/gpu.md). With $OUT set, "
               "summary.txt, table.txt and a tarball per step are copied there.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_options", nargs=argparse.REMAINDER, metavar="RUN_OPTION",
                        help="more `run` options for the main step, e.g. --dtype bf16 --variant sdpa")


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    return check(args.run_options)


def check(run_options: Sequence[str] = ()) -> int:
    """Every GPU acceptance check: 0 when all pass, 1 when one fails, 2 without CUDA."""
    import json

    import pandas as pd
    import torch

    from ..core.records import load
    from ..plan.plan_text import summary

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); "
              "run it on a GPU machine", file=sys.stderr)
        return 2
    root = reports_root() / f"gpu-check-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    root.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    predicted_main = _predict("gpu-check")
    log += ["== predict", "gpu-check preset: " + summary(predicted_main),
            "gpu preset: " + summary(_predict("gpu"))]
    print("\n".join(log), flush=True)

    main_limit = main_step_limit_s(run_options, predicted_main)
    log.append(f"main step limit: {main_limit} s (its budget, the cell in flight, start and report)")
    main_dir, main_wall, code = _run_step("main", ["--preset", "gpu-check", *run_options], root, log, main_limit)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    oom_dir, _oom_wall, oom_code = _run_step("oom", OOM_ARGS, root, log, OOM_TIMEOUT_S, env)
    log.append(f"exit codes: main {code}, oom {oom_code}"
               + "".join(f"; the {name} step hit its {limit} s limit and was stopped" for name, c, limit in
                         (("main", code, main_limit), ("oom", oom_code, OOM_TIMEOUT_S)) if c == 124))

    main = load(main_dir) if (main_dir / RECORDS_FILE).exists() else pd.DataFrame()
    oom = load(oom_dir) if (oom_dir / RECORDS_FILE).exists() else None
    checks: list[tuple[str, Any]] = []
    if not main.empty:
        ceilings = json.loads((main_dir / RUN_FILE).read_text()).get("ceilings")
        checks = [("no error cells", check_no_errors(main)),
                  ("masked causal cells on CUDA", check_masked_causal(main)),
                  ("energy per call", check_energy(main, ceilings)),
                  ("kernel time, not host time", check_host_overhead(main)),
                  ("out of memory", check_oom(main, oom)),
                  ("golden subset", check_golden_subset(main)),
                  ("compiled-code reuse", check_compile_reuse(main)),
                  ("cost model", check_prediction(predicted_main, main, main_wall)),
                  ("model audit on CUDA", check_model_audit(main_dir)),
                  ("ceilings", check_ceilings(ceilings))]
        with pd.option_context("display.width", 220, "display.max_rows", 500, "display.max_colwidth", 70,
                               "display.float_format", "{:.4g}".format):
            table = "\n".join([compact_table(main).to_string(index=False), "",
                               "energy: counter J/call vs mean power x time", energy_check(main).to_string(index=False),
                               "", flagship_fraction(main, ceilings)])
        (root / "table.txt").write_text(table + "\n")
    lines = list(log)
    for name, (passed, found) in checks:
        lines.append(f"{'PASS' if passed else 'FAIL'} {name}")
        lines += [f"    {line}" for line in found]
    if not checks:
        lines.append("FAIL main step wrote no records")
    text = "\n".join(lines) + "\n"
    (root / "summary.txt").write_text(text)
    out = os.environ.get("OUT")
    if out:
        dest = Path(out)
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("summary.txt", "table.txt"):
            if (root / name).exists():
                shutil.copy2(root / name, dest / name)
        for step in (main_dir, oom_dir):
            if step.exists():
                with tarfile.open(dest / f"gpu-check-{step.name}.tar.gz", "w:gz") as tar:
                    tar.add(step, arcname=step.name)
        print(f"gpu-check: summary, table and one tarball per step copied to {dest}")
    print(text)
    return 0 if checks and all(p for _, (p, _) in checks) else 1

