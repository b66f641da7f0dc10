"""The HTML report in a real browser: no sideways page scrolling at 1400 px.

Headless Chromium opens a copy of a built report folder with a probe script appended that
writes document.documentElement.scrollWidth and clientWidth into the page; the dumped DOM
carries them back. Skipped when no Chromium binary is installed (Debian: apt-get install
chromium).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from audit.findings import write_findings
from audit.report import build_report
from tests.helpers import cpu_run, h200_run

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
WINDOW = "1400,1000"
PROBE = ("<script>window.addEventListener('load', function () {"
         "var probe = document.createElement('pre'); probe.id = 'scroll-probe';"
         "probe.textContent = document.documentElement.scrollWidth + ' ' +"
         " document.documentElement.clientWidth; document.body.appendChild(probe);});</script>")


def _browser() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


pytestmark = pytest.mark.skipif(_browser() is None,
                                reason="no chromium binary found (apt-get install chromium)")


def page_widths(report_dir: Path, work: Path) -> tuple[int, int]:
    """(scrollWidth, clientWidth) of report_dir/index.html in a 1400-px-wide window, read
    from a copy of the folder (figures included) with the probe appended."""
    copy = work / report_dir.name
    shutil.copytree(report_dir, copy, ignore=shutil.ignore_patterns("records.jsonl*"))
    page = copy / "index.html"
    page.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"),
                    encoding="utf-8")
    done = subprocess.run(
        [_browser(), "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={WINDOW}",
         f"--user-data-dir={work / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    found = re.search(r'id="scroll-probe">(\d+) (\d+)<', done.stdout)
    assert found, f"probe not found in the dumped page: {done.stderr[-2000:]}"
    return int(found.group(1)), int(found.group(2))


@pytest.mark.parametrize("name, unpack", [("cpu", cpu_run), ("full", h200_run)])
def test_report_does_not_scroll_sideways_at_1400px(name, unpack, tmp_path: Path) -> None:
    run_dir = unpack(name, tmp_path / "runs")
    write_findings(run_dir)
    build_report(run_dir)
    scroll_width, client_width = page_widths(run_dir, tmp_path / "browser")
    assert client_width > 1000
    assert scroll_width <= client_width, f"page is {scroll_width} px wide in a {client_width} px window"
