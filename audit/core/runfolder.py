"""The names of the files in a run folder (and in a compare folder), defined once.

Every module that reads or writes one of these files takes its name from here, so no module
imports another only to learn a file name. docs/output.md describes each file.
"""
from __future__ import annotations

# A run folder (`run --out DIR`): written while measuring ...
RECORDS_FILE = "records.jsonl"                 # one JSON record per cell, appended as measured
QUARANTINE_FILE = "records.quarantine.jsonl"   # damaged record lines, moved aside
RUN_FILE = "run.json"                          # the run: argv, preset, axes, environment, ceilings
PLAN_FILE = "plan.json"                        # the budget's plan: predicted seconds, skipped cells
INFLIGHT_FILE = "inflight"                     # the cell being measured now, and since when
WORKERS_FILE = "workers.jsonl"                 # each measuring process's start-up (for the time split)
CANARY_FILE = "canary.jsonl"                   # the reference cell timed at the run's start, quarters and end
LOCK_FILE = ".lock"                            # held by the process writing the folder
SHARD_LOG_FILE = "console.log"                 # a Ray shard's console
FAILURES_DIR = "failures"                      # a failed cell's whole failure, one file a cell
# ... and by the report (from the records alone)
FINDINGS_FILE = "findings.json"
SEED_CLAIMS_FILE = "seed_claims.csv"           # the seed tutorial's printed claims, measured again
MODEL_FILE = "model.jsonl"                     # the model audit's records (docs/model.md)
MODEL_FINDINGS_FILE = "model_findings.json"    # its findings (no reproduction script: `audit model` repeats them)
MERGE_FILE = "merges.jsonl"                    # the merge functions' records (measure/merging; docs/numerics.md)
MERGE_FINDINGS_FILE = "merge_findings.json"    # their findings
SHRUNK_FILE = "shrunk.jsonl"                   # `shrink`: each third-party finding's smallest failing cell
REPRO_DIR = "repro"                            # one reproduction script per finding
MINIMAL_SUFFIX = "-minimal.py"                 # ... and beside it a shrunk finding's minimal script (repro/minimal.py)
INDEX_MD = "index.md"                          # the report page, also of a compare folder
INDEX_HTML = "index.html"
LATEST_LINK = "latest"                         # reports/latest -> the newest run folder

# A compare folder (`compare A B --out DIR`): index.md, index.html and
COMPARE_FIGURE_FILE = "latency_ratios.png"
COMPARE_CELLS_FILE = "cells.csv"


def failure_file_name(cell_id: str) -> str:
    """A failed cell's file in FAILURES_DIR: its id with every character a file name may not hold
    (a plug-in's "module:fn", a path) replaced by "_"."""
    import re
    return re.sub(r"[^A-Za-z0-9._-]", "_", cell_id) + ".txt"


def read_jsonl(path: "str | object") -> list[dict]:
    """The JSON objects of a JSONL file appended to line by line ([] where there is none): a line a
    crash cut short, or anything but an object, is left out."""
    import json
    from pathlib import Path
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def read_canaries(run_dir: "str | object") -> list[dict]:
    """DIR/CANARY_FILE's readings (measure/machine/canary.py), in the order taken ([] where none)."""
    from pathlib import Path
    return read_jsonl(Path(run_dir) / CANARY_FILE)


def read_merge_records(run_dir: "str | object") -> list[dict]:
    """DIR/MERGE_FILE's records (each merge function on each partial state), [] where the run made none."""
    from pathlib import Path
    return read_jsonl(Path(run_dir) / MERGE_FILE)


def read_shrunk(run_dir: "str | object") -> dict[tuple[str, str], list[dict]]:
    """DIR/SHRUNK_FILE's lines (execute/shrink.py) by (check, variant), in order: one per finding, or one
    per part (a cell_failed finding's cells failing in different ways); empty where nothing was shrunk."""
    from pathlib import Path
    out: dict[tuple[str, str], list[dict]] = {}
    for line in read_jsonl(Path(run_dir) / SHRUNK_FILE):
        out.setdefault((line["check"], line["variant"]), []).append(line)
    return out


def read_model_records(run_dir: "str | object") -> list[dict]:
    """DIR/MODEL_FILE's records (the model audit's, appended one by one as made), [] where the run made
    none; a line a crash cut short is left out (its step is made again, or recorded as the crash)."""
    from pathlib import Path
    return read_jsonl(Path(run_dir) / MODEL_FILE)


def file_safe(variant: str) -> str:
    """A variant's name in a script's file name (`*` -> all; `hf:sdpa` -> hf_sdpa)."""
    import re
    return "all" if variant == "*" else re.sub(r"[^A-Za-z0-9_-]+", "_", variant).strip("_")
