"""build_report: a run folder's records -> figures, index.md and index.html (never measures)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..core.records import read_records, to_frame
from ..core.runfolder import FINDINGS_FILE, RUN_FILE
from .data import prepare
from .figures import draw_figures
from .page import Block, Contents, write_page
from .sections import (compile_section, environment_section, findings_section, grid_section, memory_section,
                       numerics_section, overview_section, read_json, speed_section, title_section)
from .stability_sections import (budget_section, figures_section, fp16_section, leakage_section, lse_section,
                                 masked_rows_section, saturation_section, scenarios_section, seed_section)
from .time_budget import time_budget_section
from .verdict import verdict_section

PAGE_TITLE = "attn-audit report"


def build_report(run_dir: str | Path, before_page: Callable[[], None] | None = None) -> dict[str, Path | list[Path]]:
    """Read DIR's records (and run.json/findings.json), write figures (PNG) into DIR,
    DIR/index.md and DIR/index.html. Return {"index_md": ..., "index_html": ...,
    "figures": [paths...]}. Never measures anything.

    before_page: called once the figures are drawn, before the page is made, and run.json read
    again after it (a run writes its time split there then, so the page shows the report's own
    time up to its last step).
    """
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    frame = prepare(to_frame(records))
    findings = read_json(run_dir / FINDINGS_FILE)
    figures = draw_figures(frame, run_dir)
    if before_page is not None:
        before_page()
    run_info = read_json(run_dir / RUN_FILE)

    blocks: list[Block] = [
        *title_section(run_dir, run_info, frame),
        *overview_section(findings, frame),
        *verdict_section(frame, findings),
        Contents(),
        *findings_section(findings, frame),
        *environment_section(run_info, records),
        *grid_section(run_info, frame),
        *time_budget_section(run_info, frame),
        *scenarios_section(frame),
        *speed_section(frame),
        *memory_section(frame),
        *compile_section(frame),
        *numerics_section(frame),
        *budget_section(frame),
        *lse_section(frame),
        *fp16_section(frame),
        *masked_rows_section(frame),
        *leakage_section(frame),
        *saturation_section(frame),
        *seed_section(run_dir),
        *figures_section(figures),
    ]
    pages = write_page(run_dir, blocks, PAGE_TITLE)
    return {**pages, "figures": [run_dir / f.filename for f in figures]}
