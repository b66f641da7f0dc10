"""A run's merge audit: the preset's merge functions (Preset.merges: built-in names) on every partial
state, after the cells, one record each in DIR/merges.jsonl. Cheap (192 records in 0.15 s on 2 cores,
0.4 s more to import torch's context-parallel merge), so made whole each time a run reaches it: an
interrupted run that resumes writes the file again."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ...core.records import dumps
from ...core.runfolder import MERGE_FILE
from ...workload.merge_functions import torch_merger_available
from ...core.errors import UsageError
from ...workload.merges import TORCH_MERGE, builtin_merges, resolve_merge
from .judge import MERGE_RECORD_VERSION, audit_merge
from .states import all_states



def merge_records(names: Sequence[str]) -> list[dict[str, Any]]:
    """Each named merge function (a built-in's name or module:attr, workload/merges.resolve_merge) on each
    state; a name this machine cannot run (torch's merge where this torch lacks it) one record `skipped`
    with the reason, a name that does not resolve one `error`."""
    merges, states = builtin_merges(), all_states()
    records: list[dict[str, Any]] = []
    for name in dict.fromkeys(names):
        missing = torch_merger_available() if name == TORCH_MERGE and name not in merges else None
        try:
            merge = None if missing else resolve_merge(name, merges)
        except UsageError as exc:
            missing = None
            merge, reason = None, str(exc)
        if merge is None:
            status = "skipped" if missing else "error"
            reason = missing or reason
            records.append({"merge_version": MERGE_RECORD_VERSION, "merge": name, "status": status,
                            "outcome": status, "reason": reason, "id": name})
            continue
        records += [{**audit_merge(merge, state), "id": f"{name}-{state.name}-{state.dtype}"} for state in states]
    return records


def write_merge_audit(run_dir: str | Path, names: Sequence[str]) -> list[dict[str, Any]]:
    """merge_records(names) written to DIR/MERGE_FILE (replacing what an interrupted run left)."""
    records = merge_records(names)
    path = Path(run_dir) / MERGE_FILE
    tmp = path.with_suffix(".part")
    tmp.write_text("".join(dumps(r) + "\n" for r in records))   # infinities as the cell records keep them
    tmp.replace(path)
    return records

