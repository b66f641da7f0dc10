"""A run's merge audit: the preset's merge functions (Preset.merges: built-in names) on every partial
state, the golden's and those of each attention variant in Preset.merge_parts (states.py), after the
cells, one record each in DIR/merges.jsonl. Cheap (192 records in 0.15 s on 2 cores, 0.4 s more to
import torch's context-parallel merge), so made whole each time a run reaches it: an interrupted run
that resumes writes the file again."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ...core.records import dumps
from ...core.runfolder import MERGE_FILE
from ...workload.merge_functions import torch_merger_available
from ...core.errors import UsageError
from ...workload.merges import TORCH_MERGE, builtin_merges, resolve_merge
from .judge import MERGE_RECORD_VERSION, audit_merge
from .smallest import smallest_cases
from ...workload.merge_mistakes import parts_label
from .states import PartialState, PartsMaker, all_states


def parts_variant(name: str) -> Any:
    """The attention variant `name`, where it can make partial states (imports no torch: the command line
    checks --merge-parts with it). UsageError where it cannot: a variant that returns no lse on the CPU (the
    merge audit's tensors are CPU tensors), or a compiled one (every part's shape would be a compile of its own)."""
    from ...workload.variants import builtin_variants, resolve
    variant = resolve(name)
    able = [n for n, v in builtin_variants().items() if "cpu" in v.lse_on and not v.compiled]
    if "cpu" not in variant.lse_on or variant.compiled:
        raise UsageError(f"--merge-parts {name!r}: " + ("a compiled variant (each part a compile of its own)"
                         if variant.compiled else "returns no log-sum-exp on the CPU")
                         + f"; a variant that returns one: {', '.join(able)}, or a plug-in declaring lse_on cpu")
    return variant


def kernel_parts(name: str) -> tuple[str, PartsMaker]:
    """An attention variant as a maker of partial states (parts_variant): its (out, lse) on a part's keys,
    told which keys each query sees by a bool mask (causal off)."""
    from ..checks.contract import split_out_lse
    fn = parts_variant(name).build()

    def make(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any]:
        import torch
        with torch.no_grad():
            return split_out_lse(fn(q, k, v, mask=mask, causal=False), q)
    return name, make


def _states(parts_from: Sequence[str]) -> tuple[list[PartialState], list[dict[str, Any]]]:
    """The golden's states and each kernel's, and a record `error` for a kernel whose parts could not be made."""
    states, failed = all_states(), []
    for name in dict.fromkeys(parts_from):
        try:
            states += all_states(parts_from=kernel_parts(name))
        except Exception as exc:         # a kernel that refuses a part's mask, or raises: said, not fatal
            failed.append({"merge_version": MERGE_RECORD_VERSION, "merge": None, "parts_from": name,
                           "status": "error", "outcome": "error", "id": f"parts@{name}",
                           "reason": f"{name} could not make partial states: {type(exc).__name__}: {exc}"})
    return states, failed


def merge_records(names: Sequence[str], parts_from: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Each named merge function (a built-in's name or module:attr, workload/merges.resolve_merge) on each
    state (the golden's, and those each variant in parts_from makes); a name this machine cannot run
    (torch's merge where this torch lacks it) one record `skipped` with the reason, a name that does not
    resolve one `error`, a variant that could not make its states one `error` (merge null)."""
    merges = builtin_merges()
    states, records = _states(parts_from)
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
        for state in states:
            record = audit_merge(merge, state)
            if record["status"] == "ok":
                record.update(smallest_cases(merge, state, record))
            records.append({**record, "id": state_id(name, state)})
    return records


def state_id(merge: str, state: PartialState) -> str:
    """A merge record's id: merge-state-dtype, and @variant on a kernel's parts."""
    return f"{merge}-{state.name}-{state.dtype}" + parts_label("", state.parts_from)


def write_merge_audit(run_dir: str | Path, names: Sequence[str],
                      parts_from: Sequence[str] = ()) -> list[dict[str, Any]]:
    """merge_records(names, parts_from) written to DIR/MERGE_FILE (replacing what an interrupted run left)."""
    records = merge_records(names, parts_from)
    path = Path(run_dir) / MERGE_FILE
    tmp = path.with_suffix(".part")
    tmp.write_text("".join(dumps(r) + "\n" for r in records))   # infinities as the cell records keep them
    tmp.replace(path)
    return records

