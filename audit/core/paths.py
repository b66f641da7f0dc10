"""Where attn-audit keeps things on this machine, each defined once.

- The reports folder: new run folders (`reports/<timestamp>/`), `reports/latest`, and the
  earlier runs whose records the cost model refits itself on. `ATTN_AUDIT_REPORTS` moves it
  (default `reports`, relative to the working directory).
- The cache: this machine's measured ceilings, which dry-runs and runs plan with (kept a day).
  `ATTN_AUDIT_CACHE` moves it
  (default `$XDG_CACHE_HOME/attn-audit`, else `~/.cache/attn-audit`).

The tests point both, and Inductor's cache, at a folder of their own (conftest.py), so what
they check never depends on what earlier runs left on the machine.
"""
from __future__ import annotations

import os
from pathlib import Path

REPORTS_ENV = "ATTN_AUDIT_REPORTS"
CACHE_ENV = "ATTN_AUDIT_CACHE"


def reports_root() -> Path:
    return Path(os.environ.get(REPORTS_ENV) or "reports")


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attn-audit"
