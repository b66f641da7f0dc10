"""`compare A B`: the statistics on synthetic samples, the page's contents on synthetic run
folders, pytest-benchmark JSON input, usage errors, and the gate on real runs of a plug-in
made 3x slower (subprocesses, as in CI)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest

from audit import cli
from audit.analysis import compare
from audit.analysis import compare_stats as stats
from audit.core import noise, records, runfolder
from audit.core.grid import Case
from audit.render import compare_page
from audit.render.plotting import overflowing_artists
from audit.workload import presets

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"
ENV = {"torch": "2.13.0+cpu", "python": "3.11.7", "cpu_model": "AMD EPYC", "cpu_count": 2, "threads": 2,
       "cpu_capability": "AVX512", "device_name": "AMD EPYC", "git_commit": "abc123", "cuda": None,
       "platform": "Linux", "float32_matmul_precision": "highest"}


# --------------------------------------------------------------------------- synthetic runs

def lognormal(n: int, median_s: float, sd: float, seed: int) -> list[float]:
    return list(median_s * np.exp(np.random.default_rng(seed).normal(0.0, sd, n)))


def cell(variant: str, seq_len: int = 64, causal: bool = False, dtype: str = "fp32", scenario: str = "normal",
         *, latency_s: float = 1e-3, seed: int = 0, n: int = 30, sd: float = 0.05, **columns) -> dict:
    """A record with raw samples (lognormal around latency_s) and the given columns."""
    case = Case(variant, "cpu", dtype, 32, seq_len, 1, 2, causal, scenario)
    rec = records.new_record(case.axes(), case.id)
    rec.update(status="ok", env=ENV, peak_bytes=100_000, peak_fwd_bwd_bytes=200_000, rel_err=2e-7,
               out_nan=0, out_inf=0, grad_nan=0, grad_inf=0)
    for phase, factor in (("fwd", 1.0), ("fwd_bwd", 3.0)):
        samples = lognormal(n, latency_s * factor, sd, seed + (0 if phase == "fwd" else 10_000))
        rec.update({f"{phase}_samples_s": samples, f"{phase}_ms": float(np.median(samples)) * 1e3,
                    f"{phase}_n": n})
    rec.update(columns)
    return rec


def grid_cells(variants=("eager", "sdpa", "plug"), seed: int = 0, slow: dict | None = None) -> list[dict]:
    """Every variant × T 64/128 × causal both × 2 scenarios (8 cells a variant); `slow` multiplies
    a variant's samples, e.g. {"plug": 3.0}."""
    out = []
    k = seed * 1000
    for seq_len in (64, 128):
        for causal in (False, True):
            for scenario in ("normal", "padding"):
                for variant in variants:
                    k += 1
                    rec = cell(variant, seq_len, causal, scenario=scenario, latency_s=1e-4 * seq_len / 64, seed=k)
                    factor = (slow or {}).get(variant, 1.0)
                    for phase in ("fwd", "fwd_bwd"):
                        rec[f"{phase}_samples_s"] = [s * factor for s in rec[f"{phase}_samples_s"]]
                    out.append(rec)
    return out


def write_run(path: Path, recs: list[dict], env: dict | None = None, **info) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with records.RecordWriter(path) as writer:
        for rec in recs:
            writer.write(rec)
    run_info = {"schema": records.SCHEMA_VERSION, "preset": "quick", "env": env or ENV,
                "started_at": "2026-11-30T00:00:00+00:00",
                "timing": {"min_samples": 3, "min_time_s": 0.02}, **info}
    (path / "run.json").write_text(json.dumps(run_info))
    return path


def run_main(*args: str, capsys) -> tuple[int, str, str]:
    code = cli.main(["compare", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------- statistics

def test_identical_distributions_give_an_interval_containing_one():
    a, b = lognormal(30, 1e-3, 0.1, seed=1), lognormal(30, 1e-3, 0.1, seed=2)
    ci = stats.bootstrap_ratio(a, b, seed=stats.cell_seed("x/fwd"))
    assert ci.low < 1.0 < ci.high
    assert 0.8 < ci.low and ci.high < 1.25     # not vacuously wide
    assert not ci.excludes_above(1.0)


@pytest.mark.parametrize("n", [1, 2, 3, 28, 57, 188])
def test_the_bootstrap_medians_are_numpys_medians_of_the_same_resamples(n):
    """The rank shortcut gives exactly what taking each resample's median gives, ties included
    (samples are timer ticks: equal values are common), from the same draws of the generator."""
    gen = np.random.default_rng(n)
    values = np.round(gen.lognormal(-7, 0.3, n), 6)                    # rounded: ties
    values[: n // 3] = values[0]
    gen.shuffle(values)
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    expected = np.median(values[rng_a.integers(0, n, (500, n))], axis=1)
    assert np.array_equal(stats.bootstrap_medians(values, rng_b, 500), expected)
    assert rng_a.integers(0, 2**31) == rng_b.integers(0, 2**31)             # the generators moved alike
    values[n // 2] = np.nan                                                  # NaN: numpy's way, the same
    expected = np.median(values[np.random.default_rng(6).integers(0, n, (500, n))], axis=1)
    assert np.array_equal(stats.bootstrap_medians(values, np.random.default_rng(6), 500), expected, equal_nan=True)


def test_a_3x_shift_excludes_the_threshold_even_with_run_to_run_noise():
    a, b = lognormal(30, 1e-3, 0.1, seed=1), lognormal(30, 3e-3, 0.1, seed=2)
    ci = stats.bootstrap_ratio(a, b)
    assert 2.5 < ci.ratio < 3.5
    widened = stats.widen(ci, 0.15)
    assert widened.low < ci.low and widened.high > ci.high
    assert widened.excludes_above(1.2)


def test_a_1_1x_shift_does_not_fail_a_20_percent_threshold():
    """Significantly slower (the interval excludes 1) but not beyond 1.2: no failure."""
    a_frame = records.to_frame(grid_cells(seed=0))
    b_frame = records.to_frame(grid_cells(seed=1, slow={"plug": 1.1}))
    cells, _noise = compare.compare_cells(a_frame, b_frame)
    assert compare.failures(cells, stats.parse_fail_on(["latency:+20%"])).empty
    plug = cells[cells["variant"] == "plug"]
    assert ((plug["fwd_ratio"] > 1.05) & (plug["fwd_ratio"] < 1.16)).all()


def test_a_regression_inside_the_noise_does_not_fail():
    """1.4x slower reads above 1.2, but with noisy samples its interval reaches below 1.2: no
    failure; with quiet samples the same 1.4x fails."""
    rule = stats.parse_fail_on(["latency:+20%"])
    for sd, should_fail in ((0.6, False), (0.02, True)):
        a = records.to_frame([cell("v", seed=1, sd=sd, n=10)])
        b = records.to_frame([cell("v", seed=2, sd=sd, n=10, latency_s=1.4e-3)])
        for phase in ("fwd", "fwd_bwd"):   # B's median exactly 1.4x A's
            factor = 1.4 * a[f"{phase}_ms"].item() / b[f"{phase}_ms"].item()
            b[f"{phase}_samples_s"] = [[x * factor for x in b[f"{phase}_samples_s"].item()]]
        cells, _ = compare.compare_cells(a, b, noise_sd=0.03)
        assert cells["fwd_ratio"].item() == pytest.approx(1.4)
        assert (not compare.failures(cells, rule).empty) is should_fail, (sd, cells.iloc[0].to_dict())


def test_a_3x_slower_variant_fails_and_only_its_cells_are_named():
    a_frame = records.to_frame(grid_cells(seed=0))
    b_frame = records.to_frame(grid_cells(seed=1, slow={"plug": 3.0}))
    cells, noise = compare.compare_cells(a_frame, b_frame)
    failed = compare.failures(cells, stats.parse_fail_on(["latency:+20%"]))
    plug_ids = set(cells.loc[cells["variant"] == "plug", "id"])
    assert set(failed["id"]) == plug_ids
    assert set(failed["metric"]) == {"latency fwd", "latency fwd+bwd"}
    # A whole variant moving is not noise: the spread is measured around each variant's median.
    unchanged, _ = compare.compare_cells(a_frame, records.to_frame(grid_cells(seed=1)))
    assert noise["fwd"]["measured"] == pytest.approx(
        stats.run_noise_sd(unchanged["fwd_ratio"], unchanged["variant"])[1], rel=0.25)


# Seven samples of one measurement: resampling knows their median to ~1% (a resampled median reaches the
# late 1.4 only when four of seven draws do), while its order-statistic interval, the record's ci_rel
# (core.noise.ci_rel), spans them all: ±21%. A busy neighbour leaves measurements like this.
WIDE = (0.98, 0.99, 1.0, 1.0, 1.0, 1.01, 1.4)
TIGHT = (0.995, 0.998, 1.0, 1.0, 1.0, 1.002, 1.005)


def patterned(variant: str, k: int, factor: float, pattern: tuple = WIDE) -> dict:
    """Cell k of `variant` (T 64·(k+1)) timed `factor` x its base time, its samples `pattern`,
    with the ci_rel columns a run records for them."""
    rec = cell(variant, 64 * (k + 1), latency_s=1e-3 * (k + 1))
    for phase, base in (("fwd", 1e-3 * (k + 1)), ("fwd_bwd", 3e-3 * (k + 1))):
        samples = [base * factor * x for x in pattern]
        rec.update({f"{phase}_samples_s": samples, f"{phase}_ms": float(np.median(samples)) * 1e3,
                    f"{phase}_n": len(samples), f"{phase}_ci_rel": noise.ci_rel(samples)})
    return rec


def noisy_unchanged_pair(slowdown: float = 1.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One plug-in's ten cells measured twice, its code unchanged: B's cells moved as a block (1.1x) and
    spread ±10% around it, one of them caught by a burst (1.45x, measured steadily through it), and
    every cell's own interval wide (WIDE). `slowdown`: the plug-in made that much slower in B too."""
    moves = [1.1 * m for m in (0.9, 0.93, 0.96, 0.98, 1.0, 1.01, 1.04, 1.07, 1.1)] + [1.45]
    a = [patterned("plug", k, 1.0) for k in range(len(moves))]
    b = [patterned("plug", k, move * slowdown) for k, move in enumerate(moves)]
    return records.to_frame(a), records.to_frame(b)


def test_unchanged_but_noisy_cells_pass_the_gate_and_a_2x_slowdown_with_the_same_noise_fails():
    """The floor takes what the cells show: their spread read from its tail as ten cells allow (the
    90th percentile of ten by the linear rule is 90% the 9th largest, and read the burst cell as a
    regression: 1.45 [1.24, 1.70]), and each cell's own intervals in both runs. A 2x slowdown under the
    same noise still fails, every cell of it."""
    rule = stats.parse_fail_on(["latency:+20%"])
    cells, noise_by_phase = compare.compare_cells(*noisy_unchanged_pair())
    assert compare.failures(cells, rule).empty, cells[["id", "fwd_ratio", "fwd_low", "fwd_high"]]
    fwd = noise_by_phase["fwd"]
    assert fwd["measured"] > 0.1 and fwd["per_cell"] > fwd["used"]          # the tail, and the cells' own intervals
    assert cells["fwd_noise_sd"].min() > fwd["used"]
    slowed, _ = compare.compare_cells(*noisy_unchanged_pair(slowdown=2.0))
    failed = compare.failures(slowed, rule)
    assert set(failed["id"]) == set(slowed["id"]) and set(failed["metric"]) == {"latency fwd", "latency fwd+bwd"}


def test_a_variant_measured_through_a_burst_is_as_unsure_as_its_own_intervals_say():
    """Twenty quiet cells of sdpa, and a plug-in whose two cells B measured while a neighbour was busy
    (each median's order-statistic interval ±21%, resampling's ±1%) 1.4x slower: the plug-in moved
    as a whole, so the spread does not cover it; its own intervals do, and it does not fail +20%.
    The same plug-in 2x slower fails."""
    rule = stats.parse_fail_on(["latency:+20%"])
    quiet = [patterned("sdpa", k, 1.0 + 0.002 * (k % 5 - 2), TIGHT) for k in range(20)]
    a = records.to_frame([patterned("sdpa", k, 1.0, TIGHT) for k in range(20)]
                         + [patterned("plug", k, 1.0, TIGHT) for k in range(2)])
    for move, should_fail in ((1.4, False), (2.0, True)):
        b = records.to_frame(quiet + [patterned("plug", k, move, WIDE) for k in range(2)])
        cells, _ = compare.compare_cells(a, b)
        failed = compare.failures(cells, rule)
        assert (not failed.empty) is should_fail, cells.loc[cells["variant"] == "plug", ["fwd_ratio", "fwd_low"]]
        assert set(failed["id"]) <= set(cells.loc[cells["variant"] == "plug", "id"])


def test_cell_noise_sd_adds_each_runs_own_interval_in_quadrature():
    assert stats.cell_sd(None, None) == 0.0 == stats.cell_sd(float("nan"), 0.0)
    assert stats.cell_sd(0.2, None) == pytest.approx(math.log(1.2) / stats.Z)
    assert stats.cell_sd(0.2, 0.2) == pytest.approx(math.hypot(math.log(1.2), math.log(1.2)) / stats.Z)
    assert stats.cell_noise_sd(0.05, None, None) == 0.05
    assert stats.cell_noise_sd(0.05, 0.2, 0.2) == pytest.approx(math.hypot(0.05, stats.cell_sd(0.2, 0.2)))


def test_bootstrap_is_deterministic_and_seeded_per_cell():
    a, b = lognormal(15, 1e-3, 0.2, seed=3), lognormal(15, 1.1e-3, 0.2, seed=4)
    first = stats.bootstrap_ratio(a, b, seed=stats.cell_seed("c1/fwd"))
    assert stats.bootstrap_ratio(a, b, seed=stats.cell_seed("c1/fwd")) == first
    assert stats.bootstrap_ratio(a, b, seed=stats.cell_seed("c2/fwd")) != first


def test_run_noise_sd_reads_the_spread_and_has_a_floor():
    rng = np.random.default_rng(0)
    variants = ["a", "b", "c", "d"] * 10
    quiet = np.exp(rng.normal(0, 0.02, 40))
    noisy = np.exp(rng.normal(0, 0.3, 40))
    used, measured = stats.run_noise_sd(quiet, variants)
    assert used == stats.NOISE_FLOOR_SD and measured < stats.NOISE_FLOOR_SD
    used, measured = stats.run_noise_sd(noisy, variants)
    assert 0.2 < measured < 0.45 and used == measured
    assert stats.run_noise_sd(noisy[:5], variants[:5]) == (stats.NOISE_FLOOR_SD, None)


def test_widen_adds_the_noise_in_log_space():
    ci = stats.RatioCI(2.0, 1.8, 2.5, "bootstrap")
    assert stats.widen(ci, 0.0) == stats.RatioCI(2.0, 1.8, 2.5, "bootstrap + run-to-run")
    wide = stats.widen(ci, 0.1)
    down = math.sqrt(math.log(2.0 / 1.8) ** 2 + (stats.Z * 0.1) ** 2)
    assert wide.low == pytest.approx(2.0 * math.exp(-down))


def test_error_and_memory_ratios_are_floored():
    fp32 = stats.error_floor("fp32")
    assert stats.floored_ratio(1e-9, 3e-9, fp32) == 1.0        # both below fp32's roundoff
    assert stats.floored_ratio(1e-3, 3e-3, fp32) == pytest.approx(3.0)
    assert stats.floored_ratio(1e-3, 3e-3, stats.error_floor("bf16")) == 1.0
    assert stats.floored_ratio(1e-3, float("nan"), fp32) == math.inf   # a finite error became NaN
    assert math.isnan(stats.floored_ratio(float("nan"), float("nan"), fp32))
    assert stats.floored_ratio(100_000, 300_000, stats.MEMORY_FLOOR_BYTES) == 1.0
    assert stats.floored_ratio(4 * 2 ** 20, 8 * 2 ** 20, stats.MEMORY_FLOOR_BYTES) == 2.0


def test_normal_ratio_from_median_iqr_and_count():
    ci = stats.normal_ratio(1.0, 0.1349, 100, 2.0, 0.2698, 100)
    half = stats.Z * math.sqrt(2) * 1.253 * 0.01
    assert ci.ratio == 2.0 and ci.low == pytest.approx(2.0 * math.exp(-half))
    assert stats.normal_ratio(1.0, None, 10, 2.0, 0.1, 10).method == "medians only"


@pytest.mark.parametrize("specs,expected", [
    (["latency:+20%"], ["latency:+20%"]),
    (["latency:+20%,memory:+10%", "error:+50%"], ["latency:+20%", "memory:+10%", "error:+50%"]),
    (["LATENCY:5.5%"], ["latency:+5.5%"]),
])
def test_fail_on_forms(specs, expected):
    assert [str(t) for t in stats.parse_fail_on(specs)] == expected


@pytest.mark.parametrize("bad", ["latency:20", "speed:+20%", "latency:+x%", "latency", "latency:-20%", ""])
def test_bad_fail_on_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError) as err:
        stats.parse_fail_on([bad])
    assert repr(bad) in str(err.value) and "KIND:+N%" in str(err.value)


# --------------------------------------------------------------------------- the page

def test_cells_status_nonfinite_and_findings_in_only_one_run(tmp_path, capsys):
    a_recs = grid_cells(seed=0)
    b_recs = grid_cells(seed=1)
    gone = a_recs[0]["id"]
    b_recs = [r for r in b_recs if r["id"] != gone]                                     # only in A
    b_recs.append(cell("newvar", seed=99))                                               # only in B
    broken = b_recs[1]
    broken.update(status="error", reason="RuntimeError: boom", fwd_samples_s=None, fwd_ms=None,
                  fwd_bwd_samples_s=None, fwd_bwd_ms=None)                               # ok -> error
    nan_cell = b_recs[2]
    nan_cell.update(out_nan=128, out_nonfinite_visible=128)                              # NaN appears
    a = write_run(tmp_path / "a", a_recs)
    b = write_run(tmp_path / "b", b_recs)
    code, out, err = run_main(str(a), str(b), "--out", str(tmp_path / "cmp"), capsys=capsys)
    assert code == 0, err
    result = compare.compare_runs(a, b, tmp_path / "cmp2", [])
    assert list(result.only_a["id"]) == [gone]
    assert list(result.only_b["id"]) == [b_recs[-1]["id"]]
    changed = result.cells[result.cells["status_a"] != result.cells["status_b"]]
    assert list(changed["id"]) == [broken["id"]] and changed["status_b"].item() == "error"
    assert result.cells.set_index("id").loc[nan_cell["id"], "nonfinite"] == "out_nan 0→128"
    new_checks = {(f["check"], f["variant"]) for f in result.findings_only_b}
    assert ("cell_failed", broken["variant"]) in new_checks and ("nonfinite", nan_cell["variant"]) in new_checks
    assert result.findings_only_a == []
    page = (tmp_path / "cmp" / "index.md").read_text()
    for text in (gone, b_recs[-1]["id"], f"| {broken['id']} | ok | error |", "out_nan 0→128", "cell_failed",
                 "Only in A: 1", "Only in B: 1", "1 cells changed status"):
        assert text in page, text
    assert (tmp_path / "cmp" / "index.html").read_text().count("<table") >= 5
    assert "1 cells changed status" in out


def test_identical_findings_are_not_listed_as_new(tmp_path):
    recs = grid_cells(seed=0)
    recs[0].update(status="error", reason="RuntimeError: boom")
    a = write_run(tmp_path / "a", recs)
    b = write_run(tmp_path / "b", [dict(r) for r in recs])
    result = compare.compare_runs(a, b, tmp_path / "cmp", [])
    assert result.a.findings and result.findings_only_a == [] and result.findings_only_b == []


def test_memory_and_error_gates(tmp_path, capsys):
    a_recs = [cell("big", peak_bytes=4 * 2 ** 20, seed=1), cell("tiny", seq_len=128, peak_bytes=100_000, seed=2),
              cell("bf16err", dtype="bf16", rel_err=1e-2, seed=3), cell("fp32tiny", seq_len=256, rel_err=1e-9, seed=4)]
    b_recs = [dict(r) for r in a_recs]
    b_recs[0] = dict(a_recs[0], peak_bytes=8 * 2 ** 20)     # 2x, above the 1 MiB floor: fails
    b_recs[1] = dict(a_recs[1], peak_bytes=300_000)         # 3x, under the floor: does not
    b_recs[2] = dict(a_recs[2], rel_err=3e-2)               # 3x above bf16's roundoff: fails
    b_recs[3] = dict(a_recs[3], rel_err=3e-9)               # 3x under fp32's roundoff: does not
    a, b = write_run(tmp_path / "a", a_recs), write_run(tmp_path / "b", b_recs)
    code, out, _ = run_main(str(a), str(b), "--out", str(tmp_path / "c"), "--fail-on", "memory:+10%,error:+50%",
                            "--noise", "0.05", capsys=capsys)
    assert code == 1
    failing = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert sorted(failing) == sorted([a_recs[0]["id"], a_recs[2]["id"]])


def test_environment_rule(tmp_path):
    recs = grid_cells(seed=0)
    a = write_run(tmp_path / "a", recs)
    code_only = write_run(tmp_path / "code", recs, dict(ENV, git_commit="def456"))
    result = compare.compare_runs(a, code_only, tmp_path / "c1", [])
    assert result.env.warnings == [] and result.env.changed == {"code": ["audit code (git commit)"]}
    both = write_run(tmp_path / "both", recs, dict(ENV, git_commit="def456", cpu_model="Intel Xeon",
                                                   device_name="Intel Xeon"))
    result = compare.compare_runs(a, both, tmp_path / "c2", [])
    assert len(result.env.warnings) == 1
    assert "machine: device, CPU model" in result.env.warnings[0] and "code:" in result.env.warnings[0]
    settings = write_run(tmp_path / "settings", recs, timing={"min_samples": 20, "min_time_s": 0.02})
    result = compare.compare_runs(a, settings, tmp_path / "c3", [])
    assert any("measured differently (min samples per measurement)" in w for w in result.env.warnings)
    page = compare_page.write(result, tmp_path / "c3")["index_md"].read_text()
    assert "| CPU model | AMD EPYC | AMD EPYC |" in page and "Warning: A and B were measured differently" in page


def test_a_whole_run_shift_gets_a_note(tmp_path):
    """Every variant 1.5x slower (a busier machine, or torch): said, not hidden."""
    a = write_run(tmp_path / "a", grid_cells(seed=0))
    b = write_run(tmp_path / "b", grid_cells(seed=1, slow={"eager": 1.5, "sdpa": 1.5, "plug": 1.5}))
    same = write_run(tmp_path / "same", grid_cells(seed=1))
    shifted = compare_page.summary_lines(compare.compare_runs(a, b, tmp_path / "c1", []))
    assert any(line.startswith("Note: the cells moved together, median B/A 1.5") for line in shifted)
    unchanged = compare_page.summary_lines(compare.compare_runs(a, same, tmp_path / "c2", []))
    assert not any("moved together" in line for line in unchanged)


def test_too_few_cells_warns_and_uses_the_floor(tmp_path):
    recs = grid_cells(variants=("eager",))[:3]
    result = compare.compare_runs(write_run(tmp_path / "a", recs), write_run(tmp_path / "b", recs),
                                  tmp_path / "c", [])
    assert result.noise["fwd"]["used"] == stats.NOISE_FLOOR_SD
    assert any("Too few matched cells" in w for w in result.warnings)


def test_figure_fits_its_canvas(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = write_run(tmp_path / "a", grid_cells(variants=("eager", "sdpa", "a_rather_long.plugin:name"), seed=0))
    b = write_run(tmp_path / "b", grid_cells(variants=("eager", "sdpa", "a_rather_long.plugin:name"), seed=1,
                                             slow={"sdpa": 3.0}))
    result = compare.compare_runs(a, b, tmp_path / "c", stats.parse_fail_on(["latency:+20%"]))
    fig = compare_page.ratio_figure(result)
    assert overflowing_artists(fig) == []
    plt.close(fig)


# --------------------------------------------------------------------------- pytest-benchmark JSON

def benchmark_json(path: Path, slow: dict | None = None) -> Path:
    """A pytest-benchmark file as suites/test_performance.py writes it (no raw data saved)."""
    benches = []
    for rec in grid_cells(seed=0):
        factor = (slow or {}).get(rec["variant"], 1.0)
        for phase in ("fwd", "fwd_bwd"):
            info = {a: rec[a] for a in Case.__dataclass_fields__}
            info.update(id=rec["id"], phase=phase, flops=1e6, peak_bytes=1000, rel_err=2e-7, rmse=1e-7)
            median = rec[f"{phase}_ms"] / 1e3 * factor
            benches.append({"name": f"test[{rec['id']}-{phase}]", "extra_info": info,
                            "options": {"timer": "perf_counter"},
                            "stats": {"median": median, "iqr": 0.02 * median, "rounds": 30}})
    data = {"machine_info": {"cpu": {"brand_raw": "AMD EPYC"}, "python_version": "3.11.7", "torch": "2.13.0"},
            "commit_info": {"id": "abc123"}, "datetime": "2026-11-30T00:00:00", "benchmarks": benches}
    path.write_text(json.dumps(data))
    return path


def test_compare_pytest_benchmark_json(tmp_path, capsys):
    a = benchmark_json(tmp_path / "a.json")
    b_same = benchmark_json(tmp_path / "b.json")
    b_slow = benchmark_json(tmp_path / "slow.json", slow={"plug": 3.0})
    code, out, err = run_main(str(a), str(b_same), "--out", str(tmp_path / "same"), "--fail-on", "latency:+20%",
                              capsys=capsys)
    assert code == 0, out + err
    assert (tmp_path / "same" / "A" / "records.jsonl").is_file()      # converted inside --out
    code, out, err = run_main(str(a), str(b_slow), "--out", str(tmp_path / "slow"), "--fail-on", "latency:+20%",
                              capsys=capsys)
    assert code == 1, out + err
    failing = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    assert failing and all(i.startswith("plug-") for i in failing)
    cells = (tmp_path / "slow" / runfolder.COMPARE_CELLS_FILE).read_text()
    assert "normal (IQR, n)" in cells


# --------------------------------------------------------------------------- usage errors

def test_bad_fail_on_exits_2_with_one_line(tmp_path):
    run = write_run(tmp_path / "a", grid_cells(seed=0))
    proc = subprocess.run([sys.executable, "-m", "audit", "compare", str(run), str(run), "--out",
                           str(tmp_path / "c"), "--fail-on", "latency:+20%", "--fail-on", "latncy:+20%"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "'latncy:+20%'" in lines[0] and "KIND:+N%" in lines[0] and "latency, memory or error" in lines[0]
    assert not (tmp_path / "c").exists()


def test_missing_run_is_a_usage_error(tmp_path, capsys):
    code, _, err = run_main(str(tmp_path / "nope"), str(tmp_path / "nope"), capsys=capsys)
    assert code == 2 and "nope" in err and "records.jsonl" in err and len(err.splitlines()) == 1


# --------------------------------------------------------------------------- real runs

GRID = ["--preset", "quick", "--variant", "eager", "sdpa", "gate_plugin:attention", "--seq-len", "64",
        "--dtype", "fp32", "--heads", "2", "--kv-heads", "2", "--min-samples", "20", "--no-report", "--no-progress"]
THRESHOLD = "latency:+50%"   # the pytest-benchmark gate's BENCH_FAIL (docs/testing.md)


PAIRS = {"unchanged": (("a", 1), ("same", 1)), "slower": (("a2", 1), ("slow", 3))}   # (run, plug-in slowdown)


def measure_pair(base: Path, pair: tuple) -> dict[str, Path]:
    """The pair's two runs AT THE SAME TIME, each pinned to a core of its own with one torch
    thread. On this shared 2-core machine, runs made minutes apart differed as a whole by up
    to 1.7x (every cell together), runs made together by at most 5% (docs/compare.md), but
    about one try in five still reads one sub-millisecond cell of the 48 1.8-2x slower in
    one run (2026-12-01; three runs at once once read 1.87x): `compared` measures again then.
    Two OpenMP threads stall each other whenever one is descheduled (10-400x cells), hence
    one thread."""
    cores = sorted(os.sched_getaffinity(0))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]), OMP_NUM_THREADS="1")
    procs = {}
    for index, (name, slowdown) in enumerate(pair):
        core = {cores[index % len(cores)]}
        procs[name] = subprocess.Popen([sys.executable, "-m", "audit", "run", *GRID, "--out", str(base / name)],
                                       cwd=ROOT, env=dict(env, ATTN_AUDIT_SLOWDOWN=str(slowdown)),
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                       preexec_fn=lambda core=core: os.sched_setaffinity(0, core))
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name}: {err[-3000:]}"
    return {name: base / name for name in procs}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A with an unchanged rerun, then A again with a run of the plug-in 3x slower."""
    base = tmp_path_factory.mktemp("compare-runs")
    return {name: folder for pair in PAIRS.values() for name, folder in measure_pair(base, pair).items()}


def _compare(a: Path, b: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "audit", "compare", str(a), str(b), "--out", str(out),
                           "--fail-on", THRESHOLD], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _named(proc: subprocess.CompletedProcess) -> set[str]:
    """The cells compare names as regressed."""
    return {line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")}


TRIES = 3      # one measured pair and up to two more: a burst every try would be 1 in ~100


def compared(runs: dict, which: str, tmp_path: Path, right: Callable[[subprocess.CompletedProcess], bool]
             ) -> tuple[subprocess.CompletedProcess, Path]:
    """compare on the pair `which`; when its verdict is not `right`, the pair is measured again
    and compared, up to TRIES in all: a burst on this shared machine reads one cell off in
    about one try in five (measure_pair), while a compare that names noise is wrong every try."""
    (a, _), (b, _) = PAIRS[which]
    folders = {a: runs[a], b: runs[b]}
    for attempt in range(TRIES - 1):
        proc = _compare(folders[a], folders[b], tmp_path / f"c{attempt}")
        if right(proc):
            return proc, tmp_path / f"c{attempt}"
        folders = measure_pair(tmp_path / f"again{attempt}", PAIRS[which])
    out = tmp_path / f"c{TRIES - 1}"
    return _compare(folders[a], folders[b], out), out


@pytest.mark.serial
@pytest.mark.every_core               # measure_pair: a run on each core at once
def test_unchanged_rerun_exits_0(runs, tmp_path):
    proc, out = compared(runs, "unchanged", tmp_path, lambda p: p.returncode == 0)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    cells = presets.preset_cases(presets.presets()["quick"], dict(
        variant=("eager", "sdpa", "gate_plugin:attention"), seq_len=(64,), dtype=("fp32",), heads=(2,),
        kv_heads=(2,)))                                                  # GRID's cells
    assert f"{len(cells)} matched cells, 0 only in A, 0 only in B." in proc.stdout
    assert (out / runfolder.COMPARE_FIGURE_FILE).is_file()


def _only_the_slowed_plugin(proc: subprocess.CompletedProcess) -> bool:
    """Exit 1, naming at least 3 of the plug-in's 12 cells (6-12 seen in four tries) and no other."""
    named = _named(proc)
    return (proc.returncode == 1 and len(named) >= 3
            and all(i.startswith("gate_plugin:attention-") for i in named))


@pytest.mark.serial
@pytest.mark.every_core               # measure_pair: a run on each core at once
def test_a_3x_slower_plugin_exits_1_and_names_its_cells(runs, tmp_path):
    proc, out = compared(runs, "slower", tmp_path, _only_the_slowed_plugin)
    assert _only_the_slowed_plugin(proc), proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "FAILED" in proc.stdout
    assert "gate_plugin:attention-cpu-fp32-d32-T64" in (out / "index.md").read_text()


def test_the_quick_run_compared_with_itself_matches_every_cell(quick_run, tmp_path, capsys):
    """The session's quick run (every cell, findings, a real environment) against itself: every
    cell matched, nothing only in one run, no regression, the figure drawn."""
    code, out, _ = run_main(str(quick_run), str(quick_run), "--out", str(tmp_path / "c"), "--fail-on",
                            THRESHOLD, capsys=capsys)
    assert code == 0, out
    n = len(records.read_records(quick_run))
    assert f"{n} matched cells, 0 only in A, 0 only in B." in out
    assert (tmp_path / "c" / runfolder.COMPARE_FIGURE_FILE).is_file()
