"""build_report: a run folder's records -> figures, index.md and index.html (never measures)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..core.records import read_records, to_frame
from ..analysis.noise_rules import canary_summary
from ..core.runfolder import FINDINGS_FILE, PLAN_FILE, RUN_FILE, read_canaries
from .data import prepare
from .figures import draw_figures
from .argument_section import arguments_section
from .model_section import FIGURE_FILE as MODEL_FIGURE_FILE, HEADING as MODEL_HEADING, draw_model_error, model_section
from .noise_section import noise_blocks
from .nothing_measured import nothing_measured_section
from .page import Block, Contents, Heading, para, write_page
from .sections import (compile_section, environment_section, findings_section, grid_section, memory_section,
                       numerics_section, overview_section, read_json, speed_section, title_section)
from .masked_rows import masked_rows_section
from .merge_section import MERGE_HEADING, merge_section, merge_verdict
from .stability_sections import (budget_section, figures_section, fp16_section, leakage_section, lse_section,
                                 saturation_section, scenarios_section, seed_section)
from .time_budget import time_budget_section
from .verdict import VERDICT_HEADING, verdict_section

PAGE_TITLE = "attn-audit report"


def build_report(run_dir: str | Path, before_page: Callable[[], None] | None = None,
                 records: list[dict] | None = None, figures: bool = True) -> dict[str, Path | list[Path]]:
    """Read DIR's records (and run.json/findings.json), write figures (PNG) into DIR,
    DIR/index.md and DIR/index.html. Return {"index_md": ..., "index_html": ...,
    "figures": [paths...]}. Never measures anything.

    before_page: called once the figures are drawn, before the page is made, and run.json read
    again after it (a run writes its time split there then, so the page shows the report's own
    time up to its last step). records: DIR's, where already read. figures: False draws no PNG (the
    page and its tables alone, its Figures section saying so): for a caller that reads only the text,
    as drawing is most of a report's time (about 0.5 s a figure on one core: matplotlib's layout and
    rendering).
    """
    run_dir = Path(run_dir)
    records = read_records(run_dir) if records is None else records
    frame = prepare(to_frame(records))
    findings = read_json(run_dir / FINDINGS_FILE)
    drawn = draw_figures(frame, run_dir) if figures else None
    if before_page is not None:
        before_page()
    run_info = read_json(run_dir / RUN_FILE)

    plan = read_json(run_dir / PLAN_FILE)
    canaries = read_canaries(run_dir)
    run_noise = canary_summary(canaries)["canary_rel"]   # the machine's speed change between variants' cells
    sections: list[tuple[str, Callable[[], list[Block]]]] = [
        ("Title", lambda: title_section(run_dir, run_info, frame)),
        ("Overview", lambda: overview_section(findings, frame)),
        (VERDICT_HEADING, lambda: verdict_section(frame, findings, run_noise) + _merge_verdict(run_dir)),
        ("Nothing measured", lambda: nothing_measured_section(frame, plan)),
        ("Contents", lambda: [Contents()]),
        ("Findings", lambda: findings_section(findings, frame)),
        ("Environment", lambda: environment_section(run_info, records)
         + noise_blocks(canaries, frame, (run_info or {}).get("env"))),
        ("Grid", lambda: grid_section(run_info, frame)),
        ("Time budget", lambda: time_budget_section(run_info, frame)),
        ("Input scenarios", lambda: scenarios_section(frame)),
        ("Speed", lambda: speed_section(frame)),
        ("Memory", lambda: memory_section(frame)),
        ("Compiled variants", lambda: compile_section(frame)),
        ("Numerics", lambda: numerics_section(frame)),
        ("Error budget", lambda: budget_section(frame)),
        ("Arguments", lambda: arguments_section(frame)),
        ("Log-sum-exp", lambda: lse_section(frame)),
        (MERGE_HEADING, lambda: _merge_section(run_dir)),
        ("fp16", lambda: fp16_section(frame)),
        ("Masked rows", lambda: masked_rows_section(frame)),
        ("Leakage", lambda: leakage_section(frame)),
        ("Saturation", lambda: saturation_section(frame)),
        ("The seed's claims", lambda: seed_section(run_dir)),
        (MODEL_HEADING, lambda: _model_section(run_dir, figures)),
        ("Figures", lambda: figures_section(drawn)),
    ]
    blocks: list[Block] = [block for title, make in sections for block in _guarded(title, make)]
    pages = write_page(run_dir, blocks, PAGE_TITLE)
    return {**pages, "figures": [run_dir / f.filename for f in drawn or ()]}


def _model_section(run_dir: Path, figures: bool = True) -> list[Block]:
    """The model audit's section from DIR/model.jsonl (none where the run made no model audit)."""
    from ..core.runfolder import read_model_records
    from ..analysis.model_rules import check_model
    records = read_model_records(run_dir)
    if not records:
        return []
    figure = draw_model_error(records, run_dir / MODEL_FIGURE_FILE) if figures else None
    return model_section(records, check_model(records), figure)


def _merge_records_and_findings(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """DIR/merges.jsonl and their findings (computed again where merge_findings.json is missing)."""
    from ..analysis.merge_rules import check_merges
    from ..core.runfolder import MERGE_FINDINGS_FILE, read_merge_records
    records = read_merge_records(run_dir)
    stored = read_json(run_dir / MERGE_FINDINGS_FILE) if records else None
    return records, stored if isinstance(stored, list) else check_merges(records)


def _merge_section(run_dir: Path) -> list[Block]:
    return merge_section(*_merge_records_and_findings(run_dir))


def _merge_verdict(run_dir: Path) -> list[Block]:
    return merge_verdict(*_merge_records_and_findings(run_dir))


def _guarded(title: str, make: Callable[[], list[Block]]) -> list[Block]:
    """A section's blocks; a section that raises on these records (a bug of the audit's, or records
    edited by hand) says so in its place, in one line, and the rest of the page is still written."""
    try:
        return list(make())
    except Exception as exc:  # noqa: BLE001 - the page is never lost to one section, and shows no traceback
        text = str(exc).strip().splitlines()
        return [Heading(2, title),
                para(f"This section could not be built from these records ({type(exc).__name__}: "
                     f"{text[0] if text else ''}): a bug of attn-audit, or records edited by hand. "
                     "Please report it with the run folder.")]
