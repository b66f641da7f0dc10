"""The report and the comparison's page, from records and findings alone (never measures).
May import core, workload, analysis; never torch, so a report is rebuilt anywhere.
Import each piece from its module; this package re-exports nothing.

  data.py               which cells count for what (speed cells, orders, labels)
  finding_tables.py     the findings as listed: the table, anchors, summary, the controls' self-check
  speed_tables.py,
  stability_tables.py   data tables: DataFrames computed from the records, per section
  sections.py,
  stability_sections.py the report's sections: prose and tables as blocks
  time_budget.py        the Time budget section: the budget, its cuts, coverage, where the time went
  plotting.py, figures.py  matplotlib: shared helpers, one draw function per PNG
  page.py               blocks, cell formatting, Markdown and HTML renderers, write_page
  verdict.py            the verdict at the top: each variant against sdpa
  recommend.py          what to use, per device × dtype × mask kind, and why
  build.py              build_report: all of the above for one run folder
  compare_page.py       the page of `compare A B`
"""
