"""Tests of the report: built from synthetic records whose aggregates are known."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from audit.core.grid import Case
from audit.core.records import RecordWriter, load, new_record
from audit.render.build import build_report
from audit.render.data import describe_values, memory_ratio_vs_baseline, scenario_alpha, speedup_vs_baseline
from audit.render.finding_tables import findings_summary
from audit.render.masked_rows import masked_rows_table
from audit.render.page import format_value, html_table, markdown_table
from audit.render.speed_tables import shape_table, stated_shape
from audit.render.stability_tables import (alignment_table, budget_table, fp16_overflow_table, gradient_table,
                                           leakage_table, saturation_sweep_table, saturation_table, scenario_table,
                                           seed_claims_table)

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


def test_a_report_without_figures_is_the_same_page_less_its_pngs(built: tuple[Path, dict], tmp_path: Path) -> None:
    """build_report(figures=False), for a caller that reads only the text: no PNG is written, the
    Figures section says none were drawn, and every other section is the page drawn with them."""
    run_dir, with_figures = built
    same = tmp_path / run_dir.name                     # the page names its folder
    same.mkdir()
    result = build_report(_write_run(same), figures=False)
    assert result["figures"] == [] and not list(same.glob("*.png"))
    md, drawn_md = result["index_md"].read_text(encoding="utf-8"), with_figures["index_md"].read_text(encoding="utf-8")
    assert "Not drawn for this page." in _section(md, "## Figures")
    assert md.replace(_section(md, "## Figures"), "") == drawn_md.replace(_section(drawn_md, "## Figures"), "")
    assert "<img" not in result["index_html"].read_text(encoding="utf-8")


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
        {"check": "nonfinite", "severity": "error", "variant": "sdpa",
         "message": "NaN in outputs", "cells": ["b", "c", "d"]},
        {"check": "nonfinite", "severity": "error", "variant": "broken.unscaled",
         "message": "NaN in the control's outputs", "cells": ["e"]},
    ]
    result = build_report(_write_run(tmp_path, findings=findings), figures=False)
    md = result["index_md"].read_text(encoding="utf-8")
    assert md.index("## Findings") < md.index("## Environment")
    findings_md = _section(md, "## Findings")
    error_row = findings_md.index('| <a id="finding-nonfinite-sdpa"></a>error | nonfinite | sdpa | NaN in outputs | 3 |')
    info_row = findings_md.index('| <a id="finding-saturation-eager"></a>info | saturation | eager |')
    assert error_row < info_row
    assert "2 findings about real code: 1 error, 1 info." in findings_md
    assert "NaN in the control's outputs" not in md        # negative controls: self-check only
    assert "1/1 negative controls flagged: broken.unscaled (nonfinite)." in findings_md
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
    md = build_report(tmp_path, figures=False)["index_md"].read_text(encoding="utf-8")
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
        "| name | ms |", "|---|---:|", "| a\\|b | 1.00 |", "| c | — |"]   # ms right-aligned
    table_html = html_table(pd.DataFrame({"name": ["<x>"], "ms": [1.0]}))
    assert '<td class="text">&lt;x&gt;</td>' in table_html
    assert '<td class="num">1.00</td>' in table_html


# --------------------------------------------------------------------------- stability sections

def _cell(variant: str, *, dtype: str = "fp32", scenario: str = "normal", causal: bool = False,
          d_k: int = 32, seq_len: int = 64, status: str = "ok", **fields: object) -> dict:
    """One synthetic ok record of the given axes, with `fields` as its measurements."""
    case = Case(variant=variant, device="cpu", dtype=dtype, d_k=d_k, seq_len=seq_len, batch=1,
                heads=2, causal=causal, scenario=scenario)
    rec = new_record(case.axes(), case.id)
    rec.update(status=status, env=ENV, started_at="2025-01-01T00:00:00+00:00", **fields)
    return rec


def _write(run_dir: Path, records: list[dict]) -> Path:
    with RecordWriter(run_dir) as writer:
        for rec in records:
            writer.write(rec)
    return run_dir


MASK_CELLS = [
    # variant, dtype, scenario, masked_rows
    ("eager", "fp32", "fully_masked_bool", "nan"),
    ("eager", "fp16", "fully_masked_bool", "nan"),
    ("eager", "fp32", "fully_masked_neginf", "nan"),
    ("eager", "fp32", "fully_masked_finfo_min", "uniform"),
    ("sdpa", "fp32", "fully_masked_bool", "zero"),
    ("sdpa", "fp16", "fully_masked_bool", "zero"),
    ("sdpa", "fp32", "fully_masked_neginf", "zero"),
    ("sdpa", "fp32", "fully_masked_finfo_min", "uniform"),
    ("sdpa", "fp16", "fully_masked_finfo_min", "other"),
]


def test_masked_rows_table_shows_what_each_variant_returns(tmp_path: Path) -> None:
    records = [_cell(v, dtype=dt, scenario=sc, masked_rows=m) for v, dt, sc, m in MASK_CELLS]
    records.append(_cell("sdpa", scenario="normal"))  # masked_rows null: not a column
    frame = load(_write(tmp_path, records))
    table = masked_rows_table(frame).set_index("variant")
    assert list(table.columns) == ["bool", "-inf float", "finfo.min float"]
    assert table.loc["eager", "bool"] == "nan"
    assert table.loc["eager", "-inf float"] == "nan"
    assert table.loc["sdpa", "bool"] == "zero"
    assert table.loc["sdpa", "-inf float"] == "zero"
    assert table.loc["eager", "finfo.min float"] == "uniform"
    assert table.loc["sdpa", "finfo.min float"] == "uniform (fp32), other (fp16)"
    md = build_report(tmp_path, figures=False)["index_md"].read_text(encoding="utf-8")
    section = _section(md, "## Fully masked rows")
    assert "Hand-written softmax gives NaN" in section
    assert "| eager | nan | nan | uniform |" in section
    assert "| sdpa | zero | zero | uniform (fp32), other (fp16) |" in section


def test_masked_rows_section_absent_without_masked_rows(built: tuple[Path, dict]) -> None:
    _, result = built
    md = result["index_md"].read_text(encoding="utf-8")
    assert "## Fully masked rows" not in md
    assert "## fp16 overflow" not in md


def test_describe_values_splits_by_the_axis_that_explains() -> None:
    rows = pd.DataFrame({"dtype": ["fp32", "fp16", "fp32", "fp16"],
                         "causal": [False, False, True, True],
                         "masked_rows": ["nan", "other", "nan", "other"]})
    assert describe_values(rows, "masked_rows") == "nan (fp32), other (fp16)"
    by_causal = rows.assign(masked_rows=["uniform", "uniform", "other", "other"])
    assert describe_values(by_causal, "masked_rows") == "uniform (full), other (causal)"
    one_cell = rows.assign(masked_rows=["uniform", "uniform", "uniform", "other"])
    assert describe_values(one_cell, "masked_rows") == (
        "uniform (fp32 full, fp32 causal, fp16 full), other (fp16 causal)")
    assert describe_values(rows.assign(masked_rows=None), "masked_rows") is None


def test_fp16_overflow_table_marks_nonfinite_variants(tmp_path: Path) -> None:
    records = [
        _cell("eager", dtype="fp16", scenario="fp16_range", out_nonfinite_visible=8192,
              max_qk=2.2e5),
        _cell("eager", dtype="fp16", scenario="fp16_range", causal=True, out_nonfinite_visible=0,
              max_qk=2.1e5),
        _cell("eager", dtype="fp32", scenario="fp16_range", out_nonfinite_visible=0, max_qk=2.2e5),
        _cell("sdpa", dtype="fp16", scenario="fp16_range", out_nonfinite_visible=0, max_qk=2.2e5),
        _cell("sdpa", dtype="fp32", scenario="fp16_range", out_nonfinite_visible=0, max_qk=2.2e5),
        _cell("sdpa", dtype="fp16", scenario="normal", out_nonfinite_visible=99),  # not counted
    ]
    table = fp16_overflow_table(load(_write(tmp_path, records))).set_index(["variant", "dtype"])
    assert table.loc[("eager", "fp16"), "finite"] == False  # noqa: E712 (numpy bool)
    assert table.loc[("eager", "fp16"), "nonfinite"] == 8192
    assert table.loc[("eager", "fp16"), "nonfinite_cells"] == 1
    assert table.loc[("eager", "fp16"), "cells"] == 2
    assert table.loc[("eager", "fp16"), "max_qk"] == pytest.approx(2.2e5)
    assert table.loc[("eager", "fp32"), "finite"] == True  # noqa: E712
    assert table.loc[("sdpa", "fp16"), "finite"] == True  # noqa: E712
    assert table.loc[("sdpa", "fp16"), "nonfinite"] == 0
    md = build_report(tmp_path, figures=False)["index_md"].read_text(encoding="utf-8")
    section = _section(md, "## fp16 overflow")
    assert "Stay finite in fp16: sdpa." in section
    assert "Produce inf/NaN in rows that see a key: eager." in section
    assert "| eager | finite (1 cells) | not finite: 8192 NaN/inf in 1/2 cells |" in section


def test_budget_table_counts_judged_cells_only(tmp_path: Path) -> None:
    records = [
        _cell("sdpa", within_budget=True, err_ratio=1.0),
        _cell("sdpa", causal=True, within_budget=False, err_ratio=5.0),
        _cell("sdpa", d_k=64, within_budget=None, err_ratio=3.0),   # not judged
        _cell("eager", within_budget=True, err_ratio=1.0),
        _cell("eager", scenario="outliers", within_budget=True, err_ratio=1.0),
        _cell("sdpa", scenario="outliers", within_budget=False, err_ratio=9.0),
        _cell("sdpa", scenario="outliers", d_k=64, status="error"),  # not ok: left out
    ]
    frame = load(_write(tmp_path, records))
    table = budget_table(frame).set_index(["variant", "scenario"])
    assert table.loc[("sdpa", "normal"), "within"] == 1
    assert table.loc[("sdpa", "normal"), "judged"] == 2
    assert table.loc[("sdpa", "normal"), "frac_within"] == pytest.approx(0.5)
    assert table.loc[("sdpa", "normal"), "median_err_ratio"] == pytest.approx(3.0)
    assert table.loc[("sdpa", "normal"), "cells"] == 3
    assert table.loc[("sdpa", "outliers"), "frac_within"] == pytest.approx(0.0)
    assert table.loc[("sdpa", "outliers"), "cells"] == 1
    assert table.loc[("eager", "normal"), "frac_within"] == pytest.approx(1.0)
    by_dtype = budget_table(frame, by="dtype").set_index(["variant", "dtype"])
    assert by_dtype.loc[("sdpa", "fp32"), "judged"] == 3
    md = build_report(tmp_path, figures=False)["index_md"].read_text(encoding="utf-8")
    section = _section(md, "## Error budget")
    assert "2 × the RMSE of `eager`" in section
    assert "| sdpa | 1/2 | 0/1 |" in section
    assert "| eager | 1/1 | 1/1 |" in section


def test_budget_table_uses_dtype_with_one_scenario(tmp_path: Path) -> None:
    records = [_cell("sdpa", dtype=dt, d_k=d, within_budget=wb)
               for dt, d, wb in (("fp32", 32, True), ("fp16", 32, True), ("fp16", 64, False))]
    table = budget_table(load(_write(tmp_path, records)))
    assert "dtype" in table.columns and "scenario" not in table.columns
    assert table.set_index("dtype").loc["fp16", "frac_within"] == pytest.approx(0.5)


def test_gradient_table_medians_on_normal_cells(tmp_path: Path) -> None:
    records = [_cell("sdpa", d_k=d, dq_err=e, dk_err=2 * e, dv_err=3 * e)
               for d, e in ((32, 1e-4), (64, 3e-4), (128, 2e-4))]
    records.append(_cell("sdpa", scenario="scaled_x64", dq_err=1.0, dk_err=1.0, dv_err=1.0))
    table = gradient_table(load(_write(tmp_path, records))).set_index(["variant", "dtype"])
    assert table.loc[("sdpa", "fp32"), "dq_err"] == pytest.approx(2e-4)
    assert table.loc[("sdpa", "fp32"), "dv_err"] == pytest.approx(6e-4)
    assert table.loc[("sdpa", "fp32"), "cells"] == 3


def test_leakage_and_alignment_tables(tmp_path: Path) -> None:
    records = [
        _cell("eager", scenario="padding", leak_max_change=0.0, leak_mass=0.0),
        _cell("eager", scenario="padding", causal=True, leak_max_change=0.0, leak_mass=0.0),
        _cell("broken.mask_after_softmax", scenario="padding", leak_max_change=0.25,
              leak_mass=0.1),
        _cell("broken.mask_after_softmax", scenario="padding", d_k=64, leak_max_change=0.5,
              leak_mass=0.05),
        _cell("sdpa", scenario="padding", leak_max_change=0.0),
        _cell("sdpa", scenario="cross_causal", causal=True, causal_alignment="top-left"),
        _cell("sdpa", scenario="decode", causal=True, causal_alignment="top-left"),
        _cell("custom", scenario="decode", causal=True, causal_alignment="bottom-right"),
        _cell("custom", scenario="decode", causal=True, dtype="fp16",
              causal_alignment="neither"),
    ]
    frame = load(_write(tmp_path, records))
    leaks = leakage_table(frame).set_index(["variant", "scenario"])
    assert leaks.loc[("broken.mask_after_softmax", "padding"), "leak_max_change"] == 0.5
    assert leaks.loc[("broken.mask_after_softmax", "padding"), "leak_mass"] == 0.1
    assert leaks.loc[("eager", "padding"), "leak_max_change"] == 0.0
    assert math.isnan(leaks.loc[("sdpa", "padding"), "leak_mass"])
    align = alignment_table(frame).set_index("variant")
    assert list(align.columns) == ["cross_causal", "decode"]
    assert align.loc["sdpa", "decode"] == "top-left"
    assert align.loc["custom", "decode"] == "bottom-right (fp32), neither (fp16)"
    assert pd.isna(align.loc["custom", "cross_causal"])
    md = build_report(tmp_path, figures=False)["index_md"].read_text(encoding="utf-8")
    section = _section(md, "## Masking and leakage")
    assert "| broken.mask_after_softmax | 0.500 |" in section
    assert "| custom | — | bottom-right (fp32), neither (fp16) |" in section


def _write_claims(run_dir: Path) -> None:
    (run_dir / "seed_claims.csv").write_text(
        "claim,d_k,seed_value,measured_value,holds\n"
        "scaled scores: std,64,1.00,1.0032,True\n"
        "fully masked row gives NaN (F.scaled_dot_product_attention),,NaN,0 (zeros),False\n",
        encoding="utf-8")


def test_seed_claims_table_and_section(tmp_path: Path) -> None:
    run_dir = _write(tmp_path, [_cell("eager")])
    assert seed_claims_table(run_dir) is None
    assert "## The seed's claims" not in build_report(run_dir, figures=False)["index_md"].read_text("utf-8")
    _write_claims(run_dir)
    claims = seed_claims_table(run_dir)
    assert list(claims["holds"]) == [True, False]
    assert claims["d_k"].iloc[0] == 64 and pd.isna(claims["d_k"].iloc[1])
    assert list(claims["seed_value"]) == ["1.00", "NaN"]  # as printed, not re-rounded
    md = build_report(run_dir, figures=False)["index_md"].read_text(encoding="utf-8")
    section = _section(md, "## The seed's claims, measured")
    assert "1 of 2 printed claims hold." in section
    assert "| scaled scores: std | 64 | 1.00 | 1.00 | ✓ |" in section
    assert ("| fully masked row gives NaN (F.scaled_dot_product_attention) | — | NaN | "
            "0 (zeros) | ✗ |") in section
    assert "illustrative" in section


def _at_shape(frame: pd.DataFrame, dtype: str, metric: str = "fwd_ms") -> pd.DataFrame:
    rows, _ = stated_shape(frame, "cpu", dtype)
    return shape_table(rows, metric).set_index("variant")


def test_speed_tables_ignore_other_scenarios(tmp_path: Path) -> None:
    """A 1000x slower cell of another scenario must change neither the stated-shape tables nor speed-ups."""
    normal = [_measured(case) for case in _cases()]
    frame_normal = load(_write(tmp_path / "normal", normal))
    slow = []
    for variant in ("eager", "sdpa", "broken.unscaled"):
        rec = _measured(Case(variant=variant, device="cpu", dtype="fp32", d_k=64, seq_len=64,
                             batch=1, heads=2, causal=False, scenario="scaled_x4"))
        rec.update(fwd_ms=rec["fwd_ms"] * (1000 if variant == "sdpa" else 1),
                   peak_bytes=rec["peak_bytes"] * 1000)
        slow.append(rec)
    run_dir = _write(tmp_path / "mixed", normal + slow)
    frame = load(run_dir)
    before, after = _at_shape(frame_normal, "fp32"), _at_shape(frame, "fp32")
    # d_k 32 and 64 are equally common: the larger is stated; one cell per entry, nothing pooled.
    assert after.loc["sdpa", "T=64"] == pytest.approx(before.loc["sdpa", "T=64"])
    assert after.loc["sdpa", "T=64"] == pytest.approx(0.01 * 64 ** 2 * 64 / 4096 * 0.5)
    assert "broken.unscaled" not in after.index
    mem, mem_before = _at_shape(frame, "fp32", "peak_bytes"), _at_shape(frame_normal, "fp32", "peak_bytes")
    assert mem.loc["eager", "T=64"] == pytest.approx(mem_before.loc["eager", "T=64"])
    fwd = speedup_vs_baseline(frame).set_index("variant")
    assert fwd.loc["sdpa", "speedup"] == pytest.approx(2.0, rel=1e-12)
    assert fwd.loc["sdpa", "cells"] == 12
    assert memory_ratio_vs_baseline(frame).set_index("variant").loc["sdpa", "cells"] == 11
    md = build_report(run_dir)["index_md"].read_text(encoding="utf-8")
    speed = _section(md, "## Speed")
    assert "scenario `normal` only" in speed
    assert "scaled_x4" not in speed
    assert "pooled" not in speed.replace("no other axis pooled", "")
    assert "*cpu fp32, B=1, H=2, kv_heads=2, d_k=64, scenario normal: median forward latency (ms)" in speed
    assert ("python -m audit run --variant V --device cpu --dtype fp32 --d-k 64 --seq-len T --batch 1 "
            "--heads 2 --kv-heads 2 --causal C --scenario normal") in speed
    assert "scenario normal only" in md  # the error figure's caption


def test_stated_shape_tables_split_full_and_causal_and_state_a_varying_batch() -> None:
    """Causal and full cells are separate columns; a sweep at fixed B·T names B per column."""
    base = {"device": "cuda", "dtype": "bf16", "d_k": 128, "heads": 16, "kv_heads": 16,
            "scenario": "normal", "status": "ok"}
    rows = [{**base, "variant": v, "seq_len": t, "batch": 16384 // t, "causal": c,
             "fwd_ms": t / 512 * (2 if c else 1) * (1 if v == "sdpa" else 3)}
            for v in ("sdpa", "eager") for t in (512, 2048, 8192) for c in (False, True)]
    frame = pd.DataFrame(rows)
    chosen, shape = stated_shape(frame, "cuda", "bf16")
    assert shape["batch"] is None and shape["tokens"] == 16384
    table = shape_table(chosen, "fwd_ms").set_index("variant")
    assert list(table.columns) == ["full T=512 B=32", "full T=2048 B=8", "full T=8192 B=2",
                                   "causal T=512 B=32", "causal T=2048 B=8", "causal T=8192 B=2"]
    assert table.loc["eager", "causal T=2048 B=8"] == pytest.approx(2048 / 512 * 2 * 3)


def test_saturation_sweep_figure_and_table(tmp_path: Path) -> None:
    records = []
    for scenario, onehot, entropy in (("normal", 0.0, 0.9), ("scaled_x4", 0.1, 0.5),
                                      ("scaled_x16", 0.5, 0.1)):
        for variant, source, shift in (("sdpa", "golden", 0.0), ("compiled", "golden", 0.0),
                                       ("eager", "variant", 0.0),
                                       ("broken.unscaled", "variant", 0.4)):
            for causal in (False, True):
                records.append(_cell(
                    variant, scenario=scenario, causal=causal, saturation_source=source,
                    onehot_frac=min(1.0, onehot + shift) if not causal else 1.0,
                    entropy=max(0.0, entropy - shift), min_entropy=entropy / 2,
                    max_logit=5.0 * (scenario_alpha(scenario) or 1), max_prob=0.5,
                    golden_onehot_frac=onehot))
    records.append(_cell("sdpa", scenario="fp16_range", saturation_source="golden",
                         onehot_frac=0.9, entropy=0.0))
    run_dir = _write(tmp_path, records)
    sweep = saturation_sweep_table(load(run_dir))
    assert set(sweep["line"]) == {"float64 golden (via sdpa)", "eager", "broken.unscaled"}
    golden = sweep[sweep["source"] == "golden"].set_index("alpha")
    assert list(golden.index) == [1.0, 4.0, 16.0]
    assert golden.loc[16.0, "onehot_frac"] == pytest.approx(0.5)  # causal cells left out
    assert golden.loc[1.0, "entropy"] == pytest.approx(0.9)
    broken = sweep[sweep["line"] == "broken.unscaled"].set_index("alpha")
    assert broken.loc[4.0, "onehot_frac"] == pytest.approx(0.5)
    sat = saturation_table(load(run_dir)).set_index(["scenario", "variant"])
    assert sat.loc[("scaled_x16", "eager"), "max_logit"] == pytest.approx(80.0)
    assert sat.loc[("scaled_x16", "eager"), "onehot_frac"] == pytest.approx(0.75)
    assert sat.loc[("normal", "sdpa"), "source"] == "golden"
    assert ("fp16_range", "sdpa") not in sat.index
    result = build_report(run_dir)
    png = run_dir / "saturation_sweep.png"
    assert png in result["figures"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = result["index_md"].read_text(encoding="utf-8")
    assert "](saturation_sweep.png)" in md
    assert "### Saturation by scenario" in md


def test_no_sweep_without_scaled_scenarios(built: tuple[Path, dict]) -> None:
    run_dir, result = built
    assert saturation_sweep_table(load(run_dir)).empty
    assert not (run_dir / "saturation_sweep.png").exists()


def test_scenario_table_counts(tmp_path: Path) -> None:
    records = [_cell("eager"), _cell("sdpa"), _cell("eager", scenario="decode"),
               _cell("sdpa", scenario="decode", status="error")]
    table = scenario_table(load(_write(tmp_path, records))).set_index("scenario")
    assert list(table.index) == ["normal", "decode"]
    assert table.loc["decode", "cells"] == 2 and table.loc["decode", "ok"] == 1
    assert table.loc["normal", "cells"] == 2
    md = build_report(tmp_path, figures=False)["index_md"].read_text(encoding="utf-8")
    assert "## Input scenarios" in md


def test_findings_summary_counts_by_severity() -> None:
    findings = [{"severity": s} for s in ("info", "error", "warning", "error")]
    assert findings_summary(findings) == "4 findings: 2 error, 1 warning, 1 info."


def test_report_module_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, audit.render.build, audit.render.compare_page; "
            "from audit.render.data import scenario_descriptions; scenario_descriptions(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True)
    assert out.stdout.strip() == "False"


def test_a_report_with_scripts_of_torch_and_merge_findings_imports_no_torch(tmp_path: Path) -> None:
    """The report writes every finding's script (sdpa's factory copied, not built; a merge finding's smallest
    case from its record, measure/merging/smallest.py) without importing torch: the report's process imported it
    for those two alone, 2.3 s of a cold quick run's 11.6 s report, and torch.distributed 0.9 s more."""
    import json
    import subprocess
    import sys

    from audit.measure.merging.run_audit import write_merge_audit
    from tests.helpers import cpu_run, skip_without_torch_merger
    skip_without_torch_merger()
    run = cpu_run("2026-12-05/quick-cold", tmp_path)
    write_merge_audit(run, ("reference", "torch_context_parallel"))
    code = ("import sys; from audit.cli import main; code = main(['report', sys.argv[1]]); "
            "print('torch' in sys.modules); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
    findings = json.loads((run / "findings.json").read_text())
    scripts = [f for f in findings if str(f.get("variant", "")).startswith("sdpa") and f.get("repro")]
    assert scripts, [(f.get("variant"), f.get("repro_reason")) for f in findings][:10]
    merged = json.loads((run / "merge_findings.json").read_text())
    assert {f["check"] for f in merged} == {"merge_wrong", "merge_grad_wrong"} and all(f.get("repro") for f in merged)


def test_roofline_figure_and_ceilings_table(tmp_path: Path) -> None:
    """Cells with roofline columns give roofline.png; run.json's ceilings become a table."""
    from audit.render.speed_tables import ceilings_table

    cells = [_cell(v, seq_len=t, fwd_ms=1.0, flops=4e9 * t / 64, bytes=1e6 * t / 64,
                   gflops_per_s=40.0 * t / 64, peak_flops_per_s=2e11, peak_bytes_per_s=4e10)
             for v in ("eager", "sdpa") for t in (64, 128)]
    _write(tmp_path, cells)
    run_info = {"ceilings": {"cpu": {"matmul_flops_per_s": {"fp32": 2.0e11, "fp16": None},
                                     "matmul_n": {"fp32": 1536, "fp16": 512}, "copy_bytes_per_s": 4.4e10}}}
    (tmp_path / "run.json").write_text(json.dumps(run_info))
    paths = build_report(tmp_path)
    assert (tmp_path / "roofline.png").stat().st_size > 0
    assert "roofline.png" in paths["index_md"].read_text()
    table = ceilings_table(run_info).set_index("what")["measured"]
    assert table["fp32 matmul (n=1536)"] == "0.2 TFLOP/s"
    assert table["fp16 matmul (n=512)"] == "null"
    assert table["device-to-device copy (read + write)"] == "44 GB/s"
    assert ceilings_table(None).empty
    stuck = {"ceilings": {"cuda": {"matmul_flops_per_s": {"bf16": 1.05e12, "fp16": 7.6e14},
                                   "matmul_n": {"bf16": 128, "fp16": 8192},
                                   "matmul_believable": {"bf16": False, "fp16": True},
                                   "matmul_believable_why": {"bf16": "bf16: stopped growing at n=128", "fp16": "x"}}}}
    table = ceilings_table(stuck).set_index("what")["measured"]
    assert table["bf16 matmul (n=128)"].startswith("1.05 TFLOP/s — not believable")
    assert "stopped growing at n=128" in table["bf16 matmul (n=128)"]
    assert table["fp16 matmul (n=8192)"] == "760 TFLOP/s"


def test_host_bound_table_counts_measured_cells_only() -> None:
    from audit.render.speed_tables import host_bound_table
    rows = pd.DataFrame({"variant": ["sdpa", "sdpa_cudnn", "sdpa_cudnn", "eager"],
                         "host_bound": [False, True, None, None],
                         "fwd_ms": [0.04, 0.04, 0.5, 1.0], "fwd_host_ms": [0.03, 0.09, 0.1, None]})
    table = host_bound_table(rows).set_index("variant")
    assert table.loc["sdpa_cudnn", "host_bound"] == 1 and table.loc["sdpa_cudnn", "measured"] == 1
    assert table.loc["sdpa", "host_bound"] == 0
    assert "eager" not in table.index                       # CPU cells: not measured
    assert host_bound_table(rows.drop(columns="host_bound")).empty
