"""The report and the comparison's page, from records and findings alone (never measures).
May import core, workload, analysis; never torch, so a report is rebuilt anywhere.

  data.py               which cells count for what (speed cells, orders, labels)
  tables.py             data tables: DataFrames computed from the records and findings
  sections.py,
  stability_sections.py the report's sections: prose and tables as blocks
  plotting.py, figures.py  matplotlib: shared helpers, one draw function per PNG
  page.py               blocks, cell formatting, Markdown and HTML renderers, write_page
  verdict.py            the verdict at the top: each variant against sdpa, what to use and why
  build.py              build_report: all of the above for one run folder
  compare_page.py       the page of `compare A B`
"""
from .build import build_report
from .data import (BASELINE_VARIANT, NEGATIVE_CONTROL_PREFIX, NORMAL_SCENARIO, SEVERITY_ORDER,
                   describe_values, is_negative_control, memory_ratio_vs_baseline,
                   representative_slice, scenario_alpha, scenario_descriptions, speedup_vs_baseline)
from .figures import FIGURES, draw_figures
from .page import (MISSING, Badge, Block, Code, Contents, Figure, Heading, Link, Mono, Paragraph, Table,
                   format_value, html_table, markdown_table, numeric_columns, para, render_html,
                   render_markdown, severity_badges, write_page)
from .plotting import legend_below, overflowing_artists, save_figure, suptitle, variant_colors
from .tables import (alignment_table, budget_cuts_table, budget_table, ceilings_table, findings_summary,
                     findings_table, fp16_overflow_table, gradient_table, host_bound_table,
                     is_control_finding, leakage_table, negative_control_check,
                     saturation_sweep_table, saturation_table, scenario_table, seed_claims_table, shape_table,
                     stated_shape)
from .masked_rows import masked_rows_table, masked_rows_text
from .verdict import Recommendation, determinism_text, recommendations, verdict_rows, verdict_section

# Old private names that tests still use.
_save = save_figure
_representative_slice = representative_slice
_scenario_descriptions = scenario_descriptions

__all__ = [
    "build_report", "write_page", "draw_figures", "FIGURES",
    # blocks and rendering
    "Block", "Heading", "Paragraph", "Code", "Table", "Figure", "Contents", "Mono", "Link",
    "Badge", "para", "MISSING", "format_value", "markdown_table", "html_table", "numeric_columns",
    "render_markdown", "render_html", "severity_badges",
    # figures
    "save_figure", "legend_below", "suptitle", "variant_colors",
    "overflowing_artists",
    # data and tables
    "BASELINE_VARIANT", "NEGATIVE_CONTROL_PREFIX", "NORMAL_SCENARIO", "SEVERITY_ORDER",
    "is_negative_control", "is_control_finding", "describe_values",
    "memory_ratio_vs_baseline", "speedup_vs_baseline", "representative_slice",
    "scenario_alpha", "scenario_descriptions", "alignment_table", "budget_cuts_table",
    "budget_table", "ceilings_table", "findings_summary", "findings_table",
    "fp16_overflow_table", "gradient_table", "host_bound_table", "leakage_table",
    "masked_rows_table", "negative_control_check", "saturation_sweep_table",
    "saturation_table", "scenario_table", "seed_claims_table", "shape_table", "stated_shape",
    # the verdict
    "Recommendation", "determinism_text", "masked_rows_text", "recommendations",
    "verdict_rows", "verdict_section",
]
