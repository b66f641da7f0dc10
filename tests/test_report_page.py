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
from audit.render import Contents, Heading, Table, build_report, findings_table, negative_control_check, numeric_columns, para, render_html, render_markdown, write_page
from audit.render.data import prepare
from audit.render.sections import findings_section, overview_section
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
    return build_report(run_dir)


def test_html_contents_link_every_section_heading(built: dict) -> None:
    parsed = _parse(built["index_html"].read_text(encoding="utf-8"))
    assert len(set(parsed.ids)) == len(parsed.ids), "heading ids are unique"
    targets = {link.removeprefix("#") for link in parsed.toc_links}
    assert all(link.startswith("#") for link in parsed.toc_links)
    assert targets <= set(parsed.ids), targets - set(parsed.ids)
    sections = {i for tag, i in parsed.heading_ids if tag in ("h2", "h3")}
    assert sections and sections == targets
    assert {"findings", "environment", "grid", "speed-up-vs-eager", "figures"} <= targets
    page = built["index_html"].read_text(encoding="utf-8")
    assert page.index('<nav class="toc">') < page.index('<h2 id="findings">')


def test_markdown_contents_first_and_anchors_match_headings(built: dict) -> None:
    md = built["index_md"].read_text(encoding="utf-8")
    assert md.index("**Contents**") < md.index("\n## ")
    anchors = re.findall(r"^\s*- \[[^\]]+\]\(#([^)]+)\)$", md, flags=re.M)
    headings = re.findall(r"^#{2,3} (.+)$", md, flags=re.M)
    assert len(anchors) == len(headings) > 5
    assert "self-check-negative-controls" in anchors and "speed-up-vs-eager" in anchors


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


def test_page_is_self_contained(built: dict) -> None:
    """One folder that opens from disk: no scripts, stylesheets or fonts from elsewhere,
    every figure an <img> with a relative path to a file of the same folder."""
    page = built["index_html"].read_text(encoding="utf-8")
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r"(src|href)=\"[a-z]+:", page) and "url(" not in page
    images = re.findall(r'<img src="([^"]+)"', page)
    assert len(images) == len(built["figures"]) >= 6
    assert all("/" not in src and (built["index_html"].parent / src).is_file() for src in images)


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
    assert "| error | nonfinite | sdpa | NaN in outputs | 2 | [nonfinite_sdpa.py](repro/nonfinite_sdpa.py) |" in md
    assert "| info | saturation | eager | attention is near one-hot | 1 | — |" in md
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
