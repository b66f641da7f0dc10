"""Tests of the report page: contents, column alignment, severity badges, the negative-control
self-check and repro links. The layout in a real browser is tested in test_html_browser.py."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from audit.analysis.findings import compute_findings
from audit.core.records import load
from audit.render.build import build_report
from audit.render.data import prepare
from audit.render.finding_tables import findings_table, negative_control_check
from audit.render.page import (Contents, Heading, Table, numeric_columns, para, render_html, render_markdown,
                               write_page)
from audit.render.sections import findings_section, overview_section
from audit.render.masked_rows import masked_rows_summary, masked_rows_text
from audit.render.recommend import recommendations
from audit.render.verdict import determinism_text, verdict_rows, verdict_section
from audit.workload.variants import NEGATIVE_CONTROLS
from tests.helpers import cpu_run
from tests.test_report import _cell, _section, _write, _write_run

FINDINGS = [
    {"check": "nonfinite", "severity": "error", "variant": "sdpa",
     "message": "NaN in outputs", "cells": ["b", "c"], "repro": "repro/nonfinite_sdpa.py"},
    {"check": "saturation", "severity": "info", "variant": "eager",
     "message": "attention is near one-hot", "cells": ["a"]},
    {"check": "error_budget", "severity": "warning", "variant": "compiled",
     "message": "outside the error budget", "cells": ["d"]},
    {"check": "nonfinite", "severity": "error", "variant": "broken.unscaled",
     "message": "the control's NaN", "cells": ["e"]},
]


class _Page(HTMLParser):
    """Heading ids, in-page links, and every table as (header classes, header texts, rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.heading_ids: list[tuple[str, str]] = []      # (tag, id)
        self.toc_links: list[str] = []
        self.tables: list[dict] = []
        self.badges: list[tuple[str, str]] = []           # (class, text)
        self._in_toc = False
        self._cell: list[str] | None = None
        self._badge: str | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
            if re.fullmatch(r"h[1-6]", tag):
                self.heading_ids.append((tag, attrs["id"]))
        if tag == "nav" and "toc" in attrs.get("class", ""):
            self._in_toc = True
        if tag == "a" and self._in_toc:
            self.toc_links.append(attrs["href"])
        if tag == "table":
            self.tables.append({"classes": [], "header": [], "rows": []})
        if tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        if tag in ("th", "td"):
            self._cell = []
            if tag == "th":
                self.tables[-1]["classes"].append(attrs.get("class"))
        if tag == "span" and "badge" in attrs.get("class", ""):
            self._badge = attrs["class"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "nav":
            self._in_toc = False
        if tag in ("th", "td") and self._cell is not None:
            text = "".join(self._cell)
            (self.tables[-1]["header"] if tag == "th" else self.tables[-1]["rows"][-1]).append(text)
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._badge is not None:
            self.badges.append((self._badge, data))
            self._badge = None


def _parse(page: str) -> _Page:
    parsed = _Page()
    parsed.feed(page)
    return parsed


def _table(parsed: _Page, first_header: str, has: str) -> dict:
    """The first table whose first header is `first_header` and that has column `has`."""
    return next(t for t in parsed.tables if t["header"][:1] == [first_header] and has in t["header"])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    run_dir = _write_run(tmp_path_factory.mktemp("page"), findings=FINDINGS)
    return build_report(run_dir, figures=False)      # the page's text and tables (its figures: the quick run's)


def test_html_contents_link_every_section_heading(built: dict) -> None:
    parsed = _parse(built["index_html"].read_text(encoding="utf-8"))
    assert len(set(parsed.ids)) == len(parsed.ids), "heading ids are unique"
    targets = {link.removeprefix("#") for link in parsed.toc_links}
    assert all(link.startswith("#") for link in parsed.toc_links)
    assert targets <= set(parsed.ids), targets - set(parsed.ids)
    sections = {i for tag, i in parsed.heading_ids if tag in ("h2", "h3")}
    assert sections and sections == targets
    assert {"verdict", "what-to-use", "findings", "environment", "grid", "speed-up-vs-eager", "figures"} <= targets
    page = built["index_html"].read_text(encoding="utf-8")
    assert page.index('<nav class="toc">') < page.index('<h2 id="findings">')


def test_markdown_contents_first_and_anchors_match_headings(built: dict) -> None:
    md = built["index_md"].read_text(encoding="utf-8")
    # The verdict is read first, then the contents, which list it too, then everything else.
    assert md.index("\n## ") == md.index("\n## Verdict") < md.index("**Contents**") < md.index("\n## Findings")
    anchors = re.findall(r"^\s*- \[[^\]]+\]\(#([^)]+)\)$", md, flags=re.M)
    headings = re.findall(r"^#{2,3} (.+)$", md, flags=re.M)
    assert len(anchors) == len(headings) > 5
    assert {"verdict", "what-to-use", "self-check-negative-controls", "speed-up-vs-eager"} <= set(anchors)


def test_text_columns_left_numeric_columns_right(built: dict) -> None:
    parsed = _parse(built["index_html"].read_text(encoding="utf-8"))
    findings = _table(parsed, "severity", "message")
    assert dict(zip(findings["header"], findings["classes"])) == {
        "severity": "text", "check": "text", "variant": "text", "message": "text",
        "cells": "num", "repro": "text"}
    status = _table(parsed, "status", "cells")
    assert status["classes"] == ["text", "num"]
    speedup = _table(parsed, "variant", "fwd speed-up (x)")
    assert speedup["classes"] == ["text", "num", "num", "num", "num"]
    page = built["index_html"].read_text(encoding="utf-8")
    css = page[page.index("<style>"):page.index("</style>")]
    assert re.search(r"\.num \{[^}]*text-align: right", css)
    assert re.search(r"\.text \{[^}]*text-align: left", css)
    assert re.search(r"\.table-wrap \{[^}]*overflow-x: auto", css)


def test_page_is_self_contained(built: dict, quick_run: Path) -> None:
    """One folder that opens from disk: no scripts, stylesheets or fonts from elsewhere, every figure
    (the session's quick run's: a real run's report) an <img> with a relative path to a file of the
    same folder."""
    for page in (built["index_html"].read_text(encoding="utf-8"), (quick_run / "index.html").read_text()):
        assert "<script" not in page and "<link" not in page and "@import" not in page
        assert not re.search(r"(src|href)=\"[a-z]+:", page) and "url(" not in page
    images = re.findall(r'<img src="([^"]+)"', page)
    assert len(images) == len(list(quick_run.glob("*.png"))) >= 6
    assert all("/" not in src and (quick_run / src).is_file() for src in images)


def test_numeric_columns_decided_from_the_data() -> None:
    frame = pd.DataFrame({"name": ["a", "b"], "ms": [1.0, None], "text_numbers": ["1.00", "inf"],
                          "mixed": ["2", "2.13.0+cpu"], "flag": [True, False],
                          "empty": [None, None]})
    assert numeric_columns(frame) == [False, True, True, False, False, False]


def test_severity_badges_in_findings_and_summary(built: dict) -> None:
    parsed = _parse(built["index_html"].read_text(encoding="utf-8"))
    findings = _table(parsed, "severity", "message")
    assert [row[0] for row in findings["rows"][1:]] == ["error", "warning", "info"]
    assert ("badge sev-error", "error") in parsed.badges
    assert ("badge sev-warning", "warning") in parsed.badges
    assert ("badge sev-info", "info") in parsed.badges
    # The one-line summary at the top counts findings about real code by severity.
    assert ("badge sev-error", "1 error") in parsed.badges
    assert ("badge sev-warning", "1 warning") in parsed.badges
    assert ("badge sev-info", "1 info") in parsed.badges
    md = built["index_md"].read_text(encoding="utf-8")
    top = md[:md.index("**Contents**")]
    assert "Findings about real code: **1 error** **1 warning** **1 info**" in top
    assert "self-check: 1/1 negative controls flagged" in top


def test_repro_links_only_when_findings_have_them(built: dict, tmp_path: Path) -> None:
    md = built["index_md"].read_text(encoding="utf-8")
    assert ('| <a id="finding-nonfinite-sdpa"></a>error | nonfinite | sdpa | NaN in outputs | 2 | '
            '[nonfinite_sdpa.py](repro/nonfinite_sdpa.py) |') in md
    assert '| <a id="finding-saturation-eager"></a>info | saturation | eager | attention is near one-hot | 1 | — |' in md
    assert '<a href="repro/nonfinite_sdpa.py">nonfinite_sdpa.py</a>' in built["index_html"].read_text("utf-8")
    without = [{k: v for k, v in f.items() if k != "repro"} for f in FINDINGS]
    assert "repro" not in findings_table(without).columns
    md = render_markdown(findings_section(without, pd.DataFrame({"status": [], "variant": []})))
    assert "repro" not in md and "| severity | check | variant | message | cells |" in md


def test_a_finding_without_a_script_shows_why() -> None:
    """repro_reason stands in the repro column, as text, where there is no script."""
    findings = [dict(FINDINGS[0]), {k: v for k, v in FINDINGS[1].items() if k != "repro"}]
    findings[1]["repro_reason"] = "nothing overflowed: nothing to reproduce"
    md = render_markdown(findings_section(findings, pd.DataFrame({"status": [], "variant": []})))
    assert "| nothing overflowed: nothing to reproduce |" in md
    assert "[nonfinite_sdpa.py](repro/nonfinite_sdpa.py)" in md


def test_write_page_writes_both_files_with_the_same_template(tmp_path: Path) -> None:
    blocks = [Heading(1, "compare"), Contents(), Heading(2, "Delta"), para("one table"),
              Table(pd.DataFrame({"variant": ["sdpa"], "ratio": [1.5]}))]
    paths = write_page(tmp_path / "out", blocks, "attn-audit compare")
    assert set(paths) == {"index_md", "index_html"}
    page = paths["index_html"].read_text(encoding="utf-8")
    assert "<title>attn-audit compare</title>" in page
    assert page == render_html(blocks, title="attn-audit compare")
    assert '<a href="#delta">Delta</a>' in page and '<h2 id="delta">Delta</h2>' in page
    assert paths["index_md"].read_text(encoding="utf-8").startswith("# compare\n\n**Contents**")
    assert not re.search(r"(src|href)=\"(https?:)?//", page)        # nothing from the network


# --------------------------------------------------------------------------- self-check

@pytest.fixture(scope="module")
def cpu_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, list[dict]]:
    """The stored 2-core CPU run (1508 cells, 5 negative controls) and its findings."""
    frame = load(cpu_run("cpu", tmp_path_factory.mktemp("cpu")))
    return prepare(frame), compute_findings(frame)


def _findings_md(frame: pd.DataFrame, findings: list[dict]) -> str:
    return render_markdown([*overview_section(findings, frame), *findings_section(findings, frame)])


def _table_variants(md: str) -> list[str]:
    """The variant column of the findings table (before the self-check)."""
    table = md[md.index("| severity |"):md.index("### Self-check")]
    return [line.split(" | ")[2] for line in table.splitlines()[2:] if line.startswith("| ")]


def _measured_controls(frame: pd.DataFrame) -> list[str]:
    """The negative controls with ok records: those the self-check counts (records made
    before a control existed do not hold it)."""
    ok = frame[frame["status"] == "ok"]
    measured = [c for c in NEGATIVE_CONTROLS if (ok["variant"] == c).any()]
    assert len(measured) >= 5
    return measured


def test_cpu_run_findings_table_leaves_out_negative_controls(cpu_data) -> None:
    frame, findings = cpu_data
    assert any(f["variant"].startswith("broken.") for f in findings)   # findings.json keeps them
    md = _findings_md(frame, findings)
    variants = _table_variants(md)
    assert variants and not [v for v in variants if v.startswith("broken.")]
    real = [f for f in findings if not f["variant"].startswith("broken.")]
    assert len(variants) == len(real)
    measured = _measured_controls(frame)
    line = re.search(r"^(\d+)/(\d+) negative controls flagged: (.*)$", md, flags=re.M)
    assert line and line.group(1) == line.group(2) == str(len(measured))
    for control in measured:
        assert re.search(re.escape(control) + r" \([a-z_, ]+\)", line.group(3)), control
    assert "Not flagged" not in md and "audit error" not in md


def test_a_control_that_goes_unflagged_is_an_error_of_the_audit(cpu_data) -> None:
    frame, findings = cpu_data
    missed = "broken.clamped"
    kept = [f for f in findings if not (f["variant"] == missed and f["severity"] == "error")]
    assert len(kept) < len(findings)
    md = _findings_md(frame, kept)
    total = len(_measured_controls(frame))
    assert f"{total - 1}/{total} negative controls flagged: " in md
    assert f"Not flagged by any error-severity finding, an error of the audit itself: {missed}." in md
    assert f"**1 audit error** not flagged: {missed}" in md
    page = render_html([*overview_section(kept, frame), *findings_section(kept, frame)])
    assert '<span class="badge sev-error">1 audit error</span>' in page
    assert missed not in _table_variants(md)


def test_only_controls_with_ok_records_are_checked(tmp_path: Path) -> None:
    frame = load(_write(tmp_path, [
        _cell("eager"), _cell("broken.unscaled"), _cell("broken.clamped", status="error"),
        _cell("broken.mask_after_softmax")]))
    findings = [{"check": "nonfinite", "severity": "error", "variant": "broken.unscaled"},
                {"check": "leak", "severity": "warning", "variant": "broken.mask_after_softmax"}]
    check = negative_control_check(frame, findings).set_index("control")
    assert list(check.index) == ["broken.mask_after_softmax", "broken.unscaled"]
    assert check.loc["broken.unscaled", "flagged"] and check.loc["broken.unscaled", "checks"] == "nonfinite"
    assert not check.loc["broken.mask_after_softmax", "flagged"]     # a warning does not count
    md = _findings_md(frame, findings)
    assert "1/2 negative controls flagged: broken.unscaled (nonfinite)." in md
    assert "an error of the audit itself: broken.mask_after_softmax." in md


def test_report_reads_findings_json_and_leaves_it_whole(built: dict) -> None:
    run_dir = built["index_md"].parent
    assert json.loads((run_dir / "findings.json").read_text(encoding="utf-8")) == FINDINGS
    md = built["index_md"].read_text(encoding="utf-8")
    assert "the control's NaN" not in md
    assert "1/1 negative controls flagged: broken.unscaled (nonfinite)." in _section(md, "## Findings")


# --------------------------------------------------------------------------- the verdict

def _verdict_md(md: str) -> str:
    return _section(md, "## Verdict")


def _md_rows(section: str, first_header: str) -> dict[str, list[str]]:
    """The rows of the first markdown table whose first header is `first_header`, by first cell."""
    lines = section[section.index(f"| {first_header} |"):].splitlines()
    rows = {}
    for line in lines[2:]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_verdict_is_the_first_section_and_leaves_out_controls(built: dict) -> None:
    md = built["index_md"].read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", md, flags=re.M)
    assert headings[0] == "Verdict" and headings[1] == "Findings"
    verdict = _verdict_md(md)
    rows = _md_rows(verdict, "variant")
    assert set(rows) == {"sdpa", "compiled", "eager"}                  # broken.unscaled left out
    assert "broken." not in verdict
    # The synthetic run: sdpa 2x faster than eager, compiled 1.25x; peaks 1/4 and 1/2 of eager's.
    assert rows["sdpa"][:5] == ["baseline"] * 4 + ["—"]
    assert rows["compiled"][:5] == ["1.60× slower", "1.60× slower", "2.00× more", "2.00× more", "12"]
    assert rows["eager"][:5] == ["2.00× slower", "2.00× slower", "4.00× more", "4.00× more", "12"]
    parsed = _parse(built["index_html"].read_text(encoding="utf-8"))
    h2 = [i for tag, i in parsed.heading_ids if tag == "h2"]
    assert h2[:2] == ["verdict", "findings"]
    page = built["index_html"].read_text(encoding="utf-8")
    assert page.index('<h2 id="verdict">') < page.index('<nav class="toc">') < page.index('<h2 id="findings">')


def test_the_verdict_geomean_on_matched_cells_only() -> None:
    """fast vs sdpa: 4x and 1x faster on the two matched cells (geometric mean 2x); its unmatched cell,
    its cell of another scenario and the negative control count for nothing."""
    base = {"device": "cpu", "dtype": "fp32", "d_k": 32, "batch": 1, "heads": 2, "kv_heads": 2,
            "causal": False, "scenario": "normal", "status": "ok"}
    rows = [
        {**base, "variant": "sdpa", "seq_len": 64, "fwd_ms": 4.0, "fwd_bwd_ms": 3.0, "peak_bytes": 4e6,
         "peak_fwd_bwd_bytes": 8e6},
        {**base, "variant": "fast", "seq_len": 64, "fwd_ms": 1.0, "fwd_bwd_ms": 6.0, "peak_bytes": 1e6,
         "peak_fwd_bwd_bytes": 8e6},
        {**base, "variant": "sdpa", "seq_len": 128, "fwd_ms": 8.0, "fwd_bwd_ms": 3.0, "peak_bytes": 1e6,
         "peak_fwd_bwd_bytes": 8e6},
        {**base, "variant": "fast", "seq_len": 128, "fwd_ms": 8.0, "fwd_bwd_ms": 6.0, "peak_bytes": 1e6,
         "peak_fwd_bwd_bytes": 8e6},
        {**base, "variant": "fast", "seq_len": 256, "fwd_ms": 0.001},                    # no sdpa cell
        {**base, "variant": "fast", "seq_len": 64, "scenario": "outliers", "fwd_ms": 0.001},
        {**base, "variant": "sdpa", "seq_len": 64, "scenario": "outliers", "fwd_ms": 100.0},
        {**base, "variant": "broken.unscaled", "seq_len": 64, "fwd_ms": 0.5},
    ]
    frame = prepare(pd.DataFrame(rows).assign(id=lambda f: [f"c{i}" for i in range(len(f))]))
    table = verdict_rows(frame).set_index("variant")
    assert list(table.index) == ["fast", "sdpa"]
    assert table.loc["fast", "speedup"] == pytest.approx(2.0)
    assert table.loc["fast", "fwd_cells"] == 2
    assert table.loc["fast", "fwd_bwd_speedup"] == pytest.approx(0.5)
    assert table.loc["fast", "memory"] == pytest.approx(0.5)                 # sqrt(1/4 * 1)
    assert table.loc["fast", "fwd_bwd_memory"] == pytest.approx(1.0)
    md = render_markdown(verdict_section(frame, []))
    assert _md_rows(md, "variant")["fast"][:5] == ["2.00× faster", "2.00× slower", "2.00× less", "same", "2"]


def _slice_frame() -> pd.DataFrame:
    """fastx fastest everywhere, then sdpa, then slowy; fp32 and fp16, no mask and key padding."""
    base = {"device": "cpu", "d_k": 32, "batch": 1, "heads": 2, "kv_heads": 2, "causal": False,
            "status": "ok"}
    factor = {"fastx": 1.0, "sdpa": 2.0, "slowy": 3.0}
    rows = [{**base, "variant": v, "dtype": dt, "seq_len": t, "scenario": sc, "fwd_ms": f * t / 64}
            for v, f in factor.items() for dt in ("fp32", "fp16") for t in (64, 128)
            for sc in ("normal", "padding", "fp16_range")]
    frame = pd.DataFrame(rows)
    frame["id"] = [f"{v}-{dt}-T{t}-{sc}" for v, dt, t, sc in
                   zip(frame["variant"], frame["dtype"], frame["seq_len"], frame["scenario"])]
    return prepare(frame)


def test_a_recommendation_skips_a_fastest_variant_with_an_error_finding() -> None:
    """fastx's error finding covers an fp32 cell without a mask (scenario fp16_range): fp32 without
    a mask recommends sdpa and says why; fp32 key padding and fp16 still recommend fastx."""
    frame = _slice_frame()
    finding = {"check": "nonfinite", "severity": "error", "variant": "fastx", "message": "NaN",
               "cells": ["fastx-fp32-T64-fp16_range"]}
    warning = {"check": "saturation", "severity": "warning", "variant": "sdpa", "message": "one-hot",
               "cells": ["sdpa-fp32-T64-normal"]}                        # a warning rules nothing out
    recs = {(r.dtype, r.kind): r for r in recommendations(frame, [finding, warning])}
    assert set(recs) == {("fp32", "none"), ("fp32", "padding"), ("fp16", "none"), ("fp16", "padding")}
    ruled_out = recs[("fp32", "none")]
    assert [v for v, _ in ruled_out.ranking] == ["fastx", "sdpa", "slowy"]
    assert ruled_out.recommended == "sdpa" and ruled_out.faster_but_flagged == ["fastx"]
    assert ruled_out.lead == pytest.approx(1.5) and ruled_out.shared_cells == 2
    assert recs[("fp32", "padding")].recommended == "fastx"
    assert recs[("fp32", "padding")].lead == pytest.approx(2.0)
    assert recs[("fp16", "none")].recommended == "fastx"
    md = render_markdown(verdict_section(frame, [finding, warning]))
    why = _md_rows(md, "device, dtype, mask")["cpu fp32, no mask"]
    assert why[0] == "sdpa"
    assert why[1].startswith("fastx is fastest but has an error finding: "
                             "[nonfinite (1 cell)](#finding-nonfinite-fastx), so we recommend sdpa.")
    assert "sdpa: 1.50× faster than slowy" in why[1]
    matrix = _md_rows(md, "device\u00a0dtype")
    assert matrix["cpu fp32"][0].startswith("sdpa, 1.50× faster than slowy; fastx is faster but has an "
                                            "[error finding](#finding-nonfinite-fastx)")
    assert matrix["cpu fp16"][0] == "fastx, 2.00× faster than sdpa"
    assert "fastx's error finding [nonfinite](#finding-nonfinite-fastx) covers no cell" in \
        _md_rows(md, "device, dtype, mask")["cpu fp32, key padding"][1]


def test_a_variant_with_wrong_gradients_is_not_for_training_and_not_recommended() -> None:
    """fastx's gradients are outside their budget in one fp32 cell: its forward+backward column
    says so instead of a speed, and what to use skips it there; slowy, with a warning, keeps its ratio."""
    frame = _slice_frame().assign(fwd_bwd_ms=lambda f: f["fwd_ms"] * 3)
    grads = {"check": "grad_error_budget", "severity": "error", "variant": "fastx", "message": "dq",
             "cells": ["fastx-fp32-T64-normal"], "diagnosis": "dq_zeroed", "diagnosis_title": "dq returned as zeros"}
    md = render_markdown(verdict_section(frame, [grads]))
    rows = _md_rows(md, "variant")
    assert rows["fastx"][1] == "not for training: [wrong gradients](#finding-grad_error_budget-fastx)"
    assert rows["slowy"][1] == "1.50× slower"
    recs = {(r.dtype, r.kind): r for r in recommendations(frame, [grads])}
    assert recs[("fp32", "none")].recommended == "sdpa" and recs[("fp16", "none")].recommended == "fastx"
    assert "grad error budget: dq returned as zeros (1 cell)" in _md_rows(md, "device, dtype, mask")["cpu fp32, no mask"][1]


def test_without_any_error_finding_the_fastest_is_recommended() -> None:
    recs = recommendations(_slice_frame(), [])
    assert {r.recommended for r in recs} == {"fastx"} and not any(r.flagged for r in recs)


def test_determinism_text_from_the_repeat_columns_and_their_absence() -> None:
    base = {"variant": "sdpa", "status": "ok", "dtype": "fp32", "causal": False}
    old = pd.DataFrame([base] * 3)                                          # records before the columns
    assert determinism_text(old) == "not checked"
    assert determinism_text(old.assign(repeat_differs=None)) == "not checked"
    same = pd.DataFrame([{**base, "repeat_differs": [], "repeat_max_diff": 0.0}] * 42)
    assert determinism_text(same) == "bitwise (42)"
    under_mode = same.assign(deterministic_algorithms=True)
    assert determinism_text(under_mode) == "bitwise (42, deterministic mode)"
    differing = pd.DataFrame([{**base, "repeat_differs": ["dk", "dq"], "repeat_max_diff": 2e-7}] * 2
                             + [{**base, "repeat_differs": ["dq"], "repeat_max_diff": 1e-7}]
                             + [{**base, "repeat_differs": [], "repeat_max_diff": 0.0}] * 37
                             + [{**base, "repeat_differs": None}])            # not checked: not counted
    assert determinism_text(differing) == "differs: dq, dk in 3 of 40 cells (max 2e-7)"
    refused = pd.DataFrame([{**base, "status": "skipped", "deterministic_refused": True, "repeat_differs": None}])
    assert determinism_text(refused) == "refuses deterministic mode (1 cell)"
    assert determinism_text(pd.concat([refused, same])) == "refuses deterministic mode (1 cell); bitwise (42)"


def test_masked_rows_text_pools_cells_with_fully_masked_rows() -> None:
    rows = pd.DataFrame({
        "variant": "v", "status": "ok", "causal": False,
        "dtype": ["fp16", "fp32", "fp16", "fp32", "fp32"],
        "scenario": ["fully_masked_bool", "fully_masked_bool", "fully_masked_neginf", "fully_masked_neginf",
                     "fully_masked_finfo_min"],
        "masked_rows": ["nan", "zero", "nan", "zero", "uniform"]})          # finfo.min: finite, left out
    assert masked_rows_text(rows) == "zero (fp32), NaN (fp16)"            # widest dtype first, as elsewhere
    assert masked_rows_text(rows.assign(masked_rows=None)) == "not tested"
    assert masked_rows_text(rows.drop(columns="masked_rows")) == "not tested"
    by_form = rows.assign(dtype="fp32", masked_rows=["other", "other", "zero", "zero", "uniform"])
    assert masked_rows_text(by_form) == "bool: other; -inf float: zero"
    assert masked_rows_summary(by_form) == ("bool: other; -inf float: zero", "")


def test_masked_rows_over_many_scenarios_are_counted_and_listed_in_full_once() -> None:
    """Where scenarios beyond the mask forms answer differently, the verdict counts them (one short
    phrase, whatever the grid) and names them in the detail, the link's title."""
    scenarios = ["fully_masked_bool", "fully_masked_neginf", "left_padding", "packed", "sinks", "sinks_prefill",
                 "fully_masked_finfo_min"]
    rows = pd.DataFrame({"variant": "eager", "status": "ok", "causal": True, "dtype": "fp32", "scenario": scenarios,
                         "masked_rows": ["nan", "nan", "nan", "nan", "zero", "zero", "uniform"]})
    text, detail = masked_rows_summary(rows)
    assert text == "NaN 4 · zero 2"
    assert detail == "NaN: bool, -inf float, left_padding, packed; zero: sinks, sinks_prefill"
    assert masked_rows_text(rows) == text
    assert masked_rows_summary(rows.assign(masked_rows="nan")) == ("NaN", "")    # one answer: nothing to list


def test_the_worst_finding_names_its_check_and_diagnosis_and_links_to_its_row(tmp_path: Path) -> None:
    """The check as the link's text (one line in the verdict), the mistake it matches as its title."""
    diagnosed = {"check": "error_budget", "severity": "error", "variant": "compiled", "message": "outside",
                 "cells": ["x", "y"], "diagnosis": "gqa_interleaved", "diagnosis_title": "GQA heads paired interleaved"}
    undiagnosed = {"check": "error_budget", "severity": "error", "variant": "eager", "message": "outside too",
                   "cells": ["z"], "diagnosis": "none", "diagnosis_title": None}
    info = {"check": "saturation", "severity": "info", "variant": "compiled", "message": "one-hot", "cells": ["a"] * 5}
    result = build_report(_write_run(tmp_path, findings=[info, diagnosed, undiagnosed]), figures=False)
    md = result["index_md"].read_text(encoding="utf-8")
    rows = _md_rows(_verdict_md(md), "variant")
    assert rows["compiled"][5] == ('error [error budget](#finding-error_budget-compiled '
                                   '"error budget: GQA heads paired interleaved")')
    assert rows["eager"][5] == "error [error budget](#finding-error_budget-eager)"
    assert rows["sdpa"][5] == "none"
    assert '<a id="finding-error_budget-compiled"></a>error | error_budget | compiled |' in md
    page = result["index_html"].read_text(encoding="utf-8")
    parsed = _parse(page)
    targets = set(re.findall(r'href="#([^"]+)"', page))
    assert {"finding-error_budget-compiled", "finding-error_budget-eager"} <= targets
    assert targets <= set(parsed.ids), targets - set(parsed.ids)             # every in-page link lands
    assert '<span class="badge sev-error">error</span> <a href="#finding-error_budget-eager">' in page


def test_the_verdict_of_the_stored_cpu_run(cpu_data) -> None:
    """1508 real cells: every real variant that ran has a row, the controls none; eager's NaN on fully
    masked rows and sdpa's zero; each recommendation is a variant without an error finding there."""
    frame, findings = cpu_data
    md = render_markdown(verdict_section(frame, findings))
    rows = _md_rows(md, "variant")
    ran = {v for v in frame.loc[frame["status"] == "ok", "variant"] if not v.startswith("broken.")}
    assert set(rows) == ran
    assert rows["eager"][6] == "NaN" and rows["sdpa"][6] == "zero"
    assert all(r[7] == "not checked" for r in rows.values())               # recorded before the columns
    recs = recommendations(frame, findings)
    assert {(r.dtype, r.kind) for r in recs} == {(d, k) for d in ("fp32", "fp16", "bf16")
                                                 for k in ("none", "causal", "padding")}
    assert all(r.recommended and r.recommended not in r.flagged for r in recs)
    # The NaN/inf findings cover fp16_range cells, which have no mask: eager's and compiled_unfused's
    # full and causal ones, compiled's only a causal one. So they count against fp16 without a mask
    # or causal, as the cells say, and not against bf16.
    by_slice = {(r.dtype, r.kind): set(r.flagged) for r in recs}
    assert by_slice[("fp16", "none")] == {"eager", "compiled_unfused"}
    assert by_slice[("fp16", "causal")] == {"eager", "compiled_unfused", "compiled"}
    assert by_slice[("bf16", "none")] == set()


def test_the_gradient_budget_table_counts_cells_within_and_judged() -> None:
    from audit.render.stability_tables import gradient_budget_table
    base = {"variant": "mine", "dtype": "fp32", "status": "ok"}
    rows = [{**base, "dq_within_budget": True, "dk_within_budget": True, "dv_within_budget": True,
             "dq_err_ratio": 1.2, "dk_err_ratio": 0.9, "dv_err_ratio": 1.1},
            {**base, "dq_within_budget": False, "dk_within_budget": True, "dv_within_budget": True,
             "dq_err_ratio": 40.0, "dk_err_ratio": 1.3, "dv_err_ratio": 0.7},
            {**base, "dq_within_budget": None, "dk_within_budget": None, "dv_within_budget": None}]   # not judged
    table = gradient_budget_table(pd.DataFrame(rows)).set_index("variant")
    assert (table.loc["mine", "dq"], table.loc["mine", "dk"]) == ("1/2", "2/2")
    assert table.loc["mine", "max dq_err_ratio"] == pytest.approx(40.0)
    assert gradient_budget_table(pd.DataFrame([base])).empty          # records before schema 10
