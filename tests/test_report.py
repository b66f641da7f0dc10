"""Tests of the report: built from synthetic records whose aggregates are known."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from audit.grid import Case
from audit.records import RecordWriter, load, new_record
from audit.report import (
    build_report,
    format_value,
    html_table,
    markdown_table,
    memory_ratio_vs_baseline,
    speedup_vs_baseline,
)

VARIANTS = ("eager", "sdpa", "compiled", "broken.unscaled")
# Latency of each variant relative to eager: sdpa exactly 2x faster, compiled 1.25x faster,
# the negative control faster still (it must not be ranked anyway).
LATENCY_FACTOR = {"eager": 1.0, "sdpa": 0.5, "compiled": 0.8, "broken.unscaled": 0.25}
MEMORY_FACTOR = {"eager": 1.0, "sdpa": 0.25, "compiled": 0.5, "broken.unscaled": 1.0}
ENV = {"torch": "2.13.0+cpu", "device_name": "cpu", "cpu_model": "Test CPU", "threads": 2,
       "git_commit": "abc1234", "python": "3.11.9", "platform": "linux",
       "nvml": None, "nvml_reason": "NVMLError_LibraryNotFound"}
ERROR_REASON = "RuntimeError: synthetic failure for the report test"
SKIP_REASON = "estimated 40 s > max_cell_s 5 s"
ZERO_PEAK_CELL = ("sdpa", "fp32", 32, 64)   # a cell whose peak memory reads 0 bytes


def _cases() -> list[Case]:
    return [Case(variant=v, device="cpu", dtype=dt, d_k=dk, seq_len=t, batch=1, heads=2,
                 causal=False)
            for dt in ("fp32", "bf16") for dk in (32, 64) for t in (64, 128, 256) for v in VARIANTS]


def _measured(case: Case) -> dict:
    rec = new_record(case.axes(), case.id)
    eager_ms = 0.01 * case.seq_len ** 2 * case.d_k / 4096 * (3.0 if case.dtype == "bf16" else 1.0)
    fwd_ms = eager_ms * LATENCY_FACTOR[case.variant]
    flops = 4 * case.batch * case.heads * case.seq_len ** 2 * case.d_k
    peak = 4 * case.seq_len ** 2 * case.heads * 2 ** 4 * MEMORY_FACTOR[case.variant]
    if (case.variant, case.dtype, case.d_k, case.seq_len) == ZERO_PEAK_CELL:
        peak = 0
    broken = case.variant.startswith("broken.")
    unit = 2 ** -8 if case.dtype == "bf16" else 2 ** -24
    rec.update(
        status="ok", fwd_ms=fwd_ms, fwd_iqr_ms=0.1 * fwd_ms, fwd_n=5,
        fwd_bwd_ms=3 * fwd_ms, fwd_bwd_iqr_ms=0.3 * fwd_ms, fwd_bwd_n=5,
        fwd_samples_s=[fwd_ms / 1e3] * 5, fwd_bwd_samples_s=[3 * fwd_ms / 1e3] * 5,
        timer="cpu", peak_bytes=int(peak), peak_fwd_bwd_bytes=int(3 * peak), flops=flops,
        gflops_per_s=flops / (fwd_ms * 1e-3) / 1e9,
        fwd_bwd_gflops_per_s=3.5 * flops / (3 * fwd_ms * 1e-3) / 1e9,
        out_nan=7 if broken and case.dtype == "bf16" else 0, out_inf=0,
        grad_nan=3 if broken and case.dtype == "bf16" else 0, grad_inf=0,
        max_abs_err=0.5 if broken else 4 * unit,
        rel_err=(0.0 if (case.variant, case.dtype) == ("eager", "fp32")  # exact 0 on a log axis
                 else 0.3 if broken else unit),
        max_prob=0.2 + case.d_k / 1000, entropy=0.8 - case.d_k / 1000, onehot_frac=0.0,
        elapsed_s=0.1, started_at="2025-01-01T00:00:00+00:00", env=ENV,
    )
    if case.variant == "compiled":
        rec.update(compile_s=1.5 + case.seq_len / 1000, fused_sdpa=True)
    return rec


def _failed(status: str, reason: str) -> dict:
    case = Case(variant="eager", device="cpu", dtype="fp32", d_k=32, seq_len=512, batch=1,
                heads=2, causal=False)
    if status == "error":
        case = Case(**{**case.axes(), "variant": "sdpa"})
    rec = new_record(case.axes(), case.id)
    rec.update(status=status, reason=reason, env=ENV, started_at="2025-01-01T00:00:01+00:00")
    return rec


def _write_run(run_dir: Path, *, with_run_json: bool = True,
               findings: list[dict] | None = None) -> Path:
    cases = _cases()
    with RecordWriter(run_dir) as writer:
        for case in cases:
            writer.write(_measured(case))
        writer.write(_failed("skipped", SKIP_REASON))
        writer.write(_failed("error", ERROR_REASON))
    if with_run_json:
        axes = {"variant": list(VARIANTS), "device": ["cpu"], "dtype": ["fp32", "bf16"],
                "d_k": [32, 64], "seq_len": [64, 128, 256, 512], "batch": [1], "heads": [2],
                "causal": [False], "scenario": ["normal"]}
        run_info = {"schema": 1, "preset": "synthetic", "axes": axes,
                    "argv": ["python", "-m", "audit", "run", "--preset", "synthetic"],
                    "started_at": "2025-01-01T00:00:00+00:00", "env": ENV,
                    "n_cells": len(cases) + 2}
        (run_dir / "run.json").write_text(json.dumps(run_info), encoding="utf-8")
    if findings is not None:
        (run_dir / "findings.json").write_text(json.dumps(findings), encoding="utf-8")
    return run_dir


def _section(text: str, heading: str) -> str:
    """The markdown between `heading` and the next heading of level 2."""
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    run_dir = _write_run(tmp_path_factory.mktemp("run"))
    return run_dir, build_report(run_dir)


def test_figures_written_and_referenced(built: tuple[Path, dict]) -> None:
    run_dir, result = built
    pngs = sorted(run_dir.glob("*.png"))
    assert len(pngs) >= 6
    assert {p.name for p in pngs} == {p.name for p in result["figures"]}
    assert {p.name for p in pngs} >= {
        "latency_fwd.png", "latency_fwd_bwd.png", "memory.png", "throughput.png", "error.png",
        "nonfinite.png", "saturation.png", "compile.png"}
    md = result["index_md"].read_text(encoding="utf-8")
    page = result["index_html"].read_text(encoding="utf-8")
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size > 1000
        assert f"]({png.name})" in md
        assert f'src="{png.name}"' in page


def test_markdown_sections_in_order(built: tuple[Path, dict]) -> None:
    _, result = built
    md = result["index_md"].read_text(encoding="utf-8")
    assert md.startswith("# attn-audit report")
    headings = ["## Environment", "## Grid", "## Speed", "## Memory", "## Compiled variants",
                "## Numerics", "## Saturation", "## Figures"]
    positions = [md.index(h) for h in headings]
    assert positions == sorted(positions)
    assert "## Findings" not in md
    assert "python -m audit run --preset synthetic" in md
    assert "NVMLError_LibraryNotFound" in _section(md, "## Environment")


def test_speedup_is_geometric_mean_of_matched_cells(built: tuple[Path, dict]) -> None:
    run_dir, _ = built
    frame = load(run_dir)
    fwd = speedup_vs_baseline(frame, metric="fwd_ms").set_index("variant")
    assert fwd.loc["sdpa", "speedup"] == pytest.approx(2.0, rel=1e-12)
    assert fwd.loc["compiled", "speedup"] == pytest.approx(1.25, rel=1e-12)
    # 12 ok cells per variant share axes with an ok eager cell; sdpa's error cell does not count.
    assert fwd.loc["sdpa", "cells"] == 12
    assert "broken.unscaled" not in fwd.index
    assert "eager" not in fwd.index
    both = speedup_vs_baseline(frame, metric="fwd_bwd_ms").set_index("variant")
    assert both.loc["sdpa", "speedup"] == pytest.approx(2.0, rel=1e-12)


def test_speedup_ignores_unmatched_and_non_ok_cells() -> None:
    base = {"device": "cpu", "dtype": "fp32", "d_k": 32, "batch": 1, "heads": 2,
            "causal": False, "scenario": "normal"}
    frame = pd.DataFrame([
        {**base, "variant": "eager", "seq_len": 64, "status": "ok", "fwd_ms": 4.0},
        {**base, "variant": "fast", "seq_len": 64, "status": "ok", "fwd_ms": 1.0},
        {**base, "variant": "eager", "seq_len": 128, "status": "ok", "fwd_ms": 8.0},
        {**base, "variant": "fast", "seq_len": 128, "status": "ok", "fwd_ms": 8.0},
        {**base, "variant": "eager", "seq_len": 256, "status": "ok", "fwd_ms": 9.0},
        {**base, "variant": "fast", "seq_len": 256, "status": "error", "fwd_ms": None},
        {**base, "variant": "fast", "seq_len": 512, "status": "ok", "fwd_ms": 0.1},
    ])
    result = speedup_vs_baseline(frame).set_index("variant")
    assert result.loc["fast", "speedup"] == pytest.approx(2.0)  # sqrt(4 * 1)
    assert result.loc["fast", "cells"] == 2


def test_speedup_table_in_report_excludes_negative_controls(built: tuple[Path, dict]) -> None:
    _, result = built
    speedup = _section(result["index_md"].read_text(encoding="utf-8"), "### Speed-up vs eager")
    assert "| sdpa | 2.00 | 12 | 2.00 | 12 |" in speedup
    assert "broken.unscaled" not in _section(result["index_md"].read_text(encoding="utf-8"),
                                             "## Speed")


def test_memory_ratio_skips_zero_peaks(built: tuple[Path, dict]) -> None:
    run_dir, _ = built
    ratios = memory_ratio_vs_baseline(load(run_dir)).set_index("variant")
    assert ratios.loc["sdpa", "ratio"] == pytest.approx(0.25)
    assert ratios.loc["sdpa", "cells"] == 11  # the 0-byte cell is skipped
    assert ratios.loc["compiled", "cells"] == 12
    assert "broken.unscaled" not in ratios.index


def test_negative_controls_stay_in_numerics(built: tuple[Path, dict]) -> None:
    _, result = built
    numerics = _section(result["index_md"].read_text(encoding="utf-8"), "## Numerics")
    rows = [line for line in numerics.splitlines() if line.startswith("| broken.unscaled | bf16")]
    assert len(rows) == 1
    # max max_abs_err, median rel_err, out_nan, out_inf, grad_nan, grad_inf, cells
    assert rows[0].split(" | ")[2:] == ["0.500", "0.300", "42", "0", "18", "0", "6 |"]


def test_non_ok_cells_listed_with_reason(built: tuple[Path, dict]) -> None:
    _, result = built
    grid = _section(result["index_md"].read_text(encoding="utf-8"), "## Grid")
    assert f"| sdpa | error | {ERROR_REASON} | 1 |" in grid
    assert f"| eager | skipped | {SKIP_REASON} | 1 |" in grid
    assert "| ok | 48 |" in grid
    assert "Cells expected: 50; records present: 50." in grid


def test_findings_open_the_report_most_severe_first(tmp_path: Path) -> None:
    findings = [
        {"check": "saturation", "severity": "info", "variant": "eager",
         "message": "attention is near one-hot at d_k=64", "cells": ["a"]},
        {"check": "nonfinite", "severity": "error", "variant": "broken.unscaled",
         "message": "NaN in outputs", "cells": ["b", "c", "d"]},
    ]
    result = build_report(_write_run(tmp_path, findings=findings))
    md = result["index_md"].read_text(encoding="utf-8")
    assert md.index("## Findings") < md.index("## Environment")
    findings_md = _section(md, "## Findings")
    error_row = findings_md.index("| error | nonfinite | broken.unscaled | NaN in outputs | 3 |")
    info_row = findings_md.index("| info | saturation | eager |")
    assert error_row < info_row
    page = result["index_html"].read_text(encoding="utf-8")
    assert page.index("Findings") < page.index("Environment")
    assert page.index("NaN in outputs") < page.index("near one-hot")


def test_run_without_run_json(tmp_path: Path) -> None:
    result = build_report(_write_run(tmp_path, with_run_json=False))
    md = result["index_md"].read_text(encoding="utf-8")
    assert "| torch | 2.13.0+cpu |" in _section(md, "## Environment")
    grid = _section(md, "## Grid")
    assert "| seq_len | 64, 128, 256, 512 | 4 |" in grid
    assert "Cells expected: unknown" in grid
    assert len(result["figures"]) >= 6


def test_report_without_baseline_says_so(tmp_path: Path) -> None:
    with RecordWriter(tmp_path) as writer:
        for case in _cases():
            if case.variant != "eager":
                writer.write(_measured(case))
    md = build_report(tmp_path)["index_md"].read_text(encoding="utf-8")
    assert "No ok cells of the eager variant: no speed-up table." in md


def test_empty_run_still_renders(tmp_path: Path) -> None:
    result = build_report(tmp_path)
    assert result["figures"] == []
    assert "records present: 0" in result["index_md"].read_text(encoding="utf-8")


def test_all_finite_nonfinite_figure_title(tmp_path: Path) -> None:
    with RecordWriter(tmp_path) as writer:
        for case in _cases():
            if not case.variant.startswith("broken."):
                writer.write(_measured(case))
    md = build_report(tmp_path)["index_md"].read_text(encoding="utf-8")
    assert "(none found)" in md


@pytest.mark.parametrize("value, text", [
    (2.0, "2.00"), (0.0123456, "0.0123"), (123.4, "123"), (1234.5, "1234"),
    (1.5e-9, "1.50e-09"), (0.0, "0"), (7, "7"), (True, "true"), (None, "—"),
    (math.nan, "—"), (math.inf, "inf"),
])
def test_format_value(value: object, text: str) -> None:
    assert format_value(value) == text


def test_tables_escape_and_agree() -> None:
    frame = pd.DataFrame({"name": ["a|b", "c"], "ms": [1.0, None]})
    assert markdown_table(frame).splitlines() == [
        "| name | ms |", "|---|---|", "| a\\|b | 1.00 |", "| c | — |"]
    table_html = html_table(pd.DataFrame({"name": ["<x>"], "ms": [1.0]}))
    assert "&lt;x&gt;" in table_html and "<td>1.00</td>" in table_html
