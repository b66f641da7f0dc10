"""The smallest cell that still shows a finding about code the audit did not write (a variant with an
`upstream`: torch's, transformers', a plug-in's, a declared kernel's), what a maintainer asks for first.

From the finding's smallest cell, each axis in SHRINK_ORDER is tried at smaller values, smallest first,
and the first value whose cell shows the same finding (its check, of its variant, from the record of a
cell measured again) is kept; passes repeat until none moves an axis or the finding's seconds are spent.
Greedy and ordered, so a finding shrinks to the same cell every time its kernel behaves the same.

Why not hypothesis's shrinker: it shrinks the choices a test drew, from its own search; here the
failing cell is known and each try costs a measured cell (a second or more), so the few candidates
an axis has are tried in a fixed order instead (docs/numerics.md, Smallest failing cell).

Only checks a cell's own record decides (SHRUNK_CHECKS) are shrunk: not timing, memory, or what needs
several runs or cells."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..core.grid import Case
from ..core.runfolder import RUN_FILE, SHRUNK_FILE

if TYPE_CHECKING:
    from ..workload.presets import Preset

# The axes in the order they are shrunk: the length first (it sizes every other axis's work); last, the
# variant's uncompiled twin (Variant.uncompiled), where a compiled one has one.
SHRINK_ORDER = ("seq_len", "batch", "heads", "d_k", "dtype", "compiled")
MIN_SEQ_LEN = 16                # the smallest length tried: a page or a document of the layouts' scenarios
MIN_D_K = 8
SHRINK_S = 5.0                  # seconds of measured cells one finding's shrinking may take
SHRINK_MAX_FINDINGS = 6         # findings shrunk per run, most severe first
MINIMAL_TIMEOUT_S = 120.0       # a minimal script's run where it is written (a compile of flex included)
# Of a run's shrinking time, what a finding keeps after its search for its minimal script's run: paged_flex's
# compiles it in 7-22 s on a 2-core AVX2-only EPYC (loop 1.0-1.5 s), the flash op's runs in 2 s
MINIMAL_ALLOWANCE_S = 10.0
# The checks a cell's own record decides (analysis rules over its correctness columns).
SHRUNK_CHECKS = ("nonfinite", "error_budget", "grad_error_budget", "lse_error_budget", "lse_grad_budget",
                 "lse_masked_rows", "masked_leakage", "finfo_min_mask", "fully_masked_rows", "underflow",
                 "paged_reads", "cross_document", "argument_ignored", "cell_failed")


def smaller_cases(case: Case, axis: str) -> list[Case]:
    """The cells one step of `axis` smaller than `case`, smallest first (none: the axis is at its least)."""
    if axis == "seq_len":
        lengths, t = [], MIN_SEQ_LEN
        while t < case.seq_len:
            lengths.append(t)
            t *= 2
        return [dataclasses.replace(case, seq_len=t) for t in lengths]
    if axis == "batch":
        return [dataclasses.replace(case, batch=b) for b in range(1, case.batch)]
    if axis == "heads":                 # fewer kv heads with the group kept, then smaller groups
        kv, group = case.effective_kv_heads, case.heads // case.effective_kv_heads
        fewer_kv = [(group * k, k) for k in range(1, kv)]
        smaller_groups = [(g * kv, kv) for g in range(1, group)]
        return [dataclasses.replace(case, heads=h, kv_heads=k) for h, k in fewer_kv + smaller_groups]
    if axis == "d_k":
        widths, d = [], MIN_D_K
        while d < case.d_k:
            widths.append(d)
            d *= 2
        return [dataclasses.replace(case, d_k=d, d_v=None if case.d_v is None else max(1, case.d_v * d // case.d_k))
                for d in widths]
    if axis == "dtype":
        return [dataclasses.replace(case, dtype="fp32")] if case.dtype != "fp32" else []
    if axis == "compiled":
        from ..workload.variants import builtin_variants
        twin = getattr(builtin_variants().get(case.variant), "uncompiled", None)
        return [dataclasses.replace(case, variant=twin)] if twin else []
    raise ValueError(f"no such axis to shrink: {axis}")


@dataclasses.dataclass
class Shrunk:
    """Where shrinking one finding ended: the smallest cell that still showed it, how many cells it
    measured, in how many seconds, and whether it stopped for want of time."""

    cell: Case
    tried: int
    seconds: float
    complete: bool


def shrink(case: Case, shows: Callable[[Case], bool], seconds: float = SHRINK_S,
           clock: Callable[[], float] = time.monotonic) -> Shrunk:
    """The smallest cell from `case` (which shows the finding) that `shows` it, axis by axis in
    SHRINK_ORDER; stops when a pass moves no axis, or after `seconds`."""
    start, tried, moved = clock(), 0, True
    while moved:
        moved = False
        for axis in SHRINK_ORDER:
            for smaller in smaller_cases(case, axis):
                if clock() - start > seconds:
                    return Shrunk(case, tried, clock() - start, complete=False)
                tried += 1
                if shows(smaller):
                    case, moved = smaller, True
                    break
    return Shrunk(case, tried, clock() - start, complete=True)


def shrinkable(findings: Iterable[dict], upstream_of: Callable[[str], str | None]) -> list[dict]:
    """The findings to shrink: a check a cell decides, about a variant with an upstream, errors then
    warnings, within each those a minimal script can be written for first (repro/minimal.py: writable),
    at most SHRINK_MAX_FINDINGS. A run's shrinking time goes first to what ends in a script: on a 2-core
    AVX2-only EPYC, paged_flex's error_budget finding took the time its NaN finding's script needed."""
    from ..repro.minimal import writable
    chosen = [f for f in findings if f["check"] in SHRUNK_CHECKS and f["severity"] in ("error", "warning")
              and f["variant"] != "*" and upstream_of(f["variant"])]
    return sorted(chosen, key=lambda f: (f["severity"] != "error",
                                         not writable(f["variant"], f["check"], f.get("argument"))))[:SHRINK_MAX_FINDINGS]


def _hung_or_died(record: dict) -> bool:
    """A failed cell the supervisor ended: over its time limit, or its process died (runner.record_crash)."""
    return record.get("status") == "timeout" or "measuring process died" in str(record.get("reason") or "")


def _cell_size(record: dict) -> int:
    return int(record["seq_len"]) * int(record["batch"]) * int(record["heads"]) * int(record["d_k"])


def shrink_run(run_dir: Path, preset: Preset, env: dict[str, Any], seconds: float = SHRINK_S,
               progress: Callable[[str], None] | None = None, deadline: float | None = None) -> list[dict]:
    """Shrink each shrinkable finding of the run folder's records from its smallest cell; write one
    line per finding to DIR/SHRUNK_FILE (replacing what was there) and return them.

    deadline (time.time()): the run's shrinking time (--shrink) ends then: each finding gets at least
    `seconds`, or its share of what is left, and one reached after it is not shrunk, its line saying so."""
    from ..analysis.findings import compute_findings
    from ..core.records import read_records, to_frame
    from ..measure.cell.cellcache import BuildCache, InputCache
    from ..repro.minimal import writable
    from ..workload.variants import resolve
    from .runner import run_cell

    records = read_records(run_dir)
    by_id = {r["id"]: r for r in records}
    quick = dataclasses.replace(preset, min_samples=1, min_time_s=0.0)      # correctness, not timing
    cache, builds = InputCache(), BuildCache()
    # (check, variant) of each cell measured: one defect's findings (NaN, so outside the budget) try the
    # same cells, each measured and judged once
    shown: dict[str, set[tuple[str, str]]] = {}

    def found_on(case: Case) -> set[tuple[str, str]]:
        if case.id not in shown:
            record = run_cell(case, cache, quick, env, builds=builds)
            shown[case.id] = {(f["check"], f["variant"]) for f in compute_findings(to_frame([record]))}
        return shown[case.id]
    out: list[dict] = []
    path = Path(run_dir) / SHRUNK_FILE
    path.write_text("")            # each line as its finding ends: a shrinking stopped later keeps them

    def keep(line: dict) -> None:
        out.append(line)
        with open(path, "a") as fh:
            fh.write(json.dumps(line) + "\n")
    chosen = shrinkable(compute_findings(to_frame(records)), lambda v: resolve(v).upstream)
    for n, finding in enumerate(chosen):
        cells = [by_id[i] for i in finding["cells"] if i in by_id]
        if not cells:
            continue
        first = min(cells, key=_cell_size)
        left = None if deadline is None else deadline - time.time()
        unshrunk = {"check": finding["check"], "variant": finding["variant"], "from": first["id"], "id": None,
                    "cell": None, "tried": 0, "complete": False, "seconds": 0.0}
        if left is not None and left <= 0:
            keep(dict(unshrunk, reason="the run's shrinking time (--shrink) went to the findings before it"))
            continue
        if finding["check"] == "cell_failed" and all(_hung_or_died(c) for c in cells):
            keep(dict(unshrunk, complete=True, reason="its cells hung or killed their process: shrinking measures "
                                                      "in its own process, without the run's per-cell limit"))
            continue
        share = seconds if left is None else max(seconds, left / (len(chosen) - n))
        if left is not None and writable(finding["variant"], finding["check"], finding.get("argument")):
            share = max(seconds, share - MINIMAL_ALLOWANCE_S)       # its script's run comes after the search

        def shows(case: Case, check: str = finding["check"]) -> bool:
            return (check, case.variant) in found_on(case)       # the uncompiled twin's finding counts too
        start = Case.from_mapping(first)
        began = time.monotonic()
        line = {"check": finding["check"], "variant": finding["variant"], "from": first["id"]}
        # measured again first, except in the run itself (its records are of this machine, torch and plug-in,
        # and paged_flex's cell costs 11 s of the run's shrinking time on a 2-core AVX2-only EPYC)
        if deadline is None and not shows(start):     # another machine, torch or plug-in: nothing to shrink from
            line.update(id=None, cell=None, tried=1, complete=True,
                        reason="its cell, measured again here, does not show it")
        else:
            done = shrink(start, shows, share)
            line.update(id=done.cell.id, cell=done.cell.axes(), tried=done.tried + (deadline is None),
                        complete=done.complete)
            timeout = MINIMAL_TIMEOUT_S if deadline is None else max(1.0, min(MINIMAL_TIMEOUT_S, deadline - time.time()))
            line.update(write_minimal(Path(run_dir), done.cell, dict(finding, **{"from": first["id"]}), env, timeout))
        line["seconds"] = round(time.monotonic() - began, 3)
        keep(line)
        if progress:
            to = line["id"] or line["reason"]
            progress(f"{finding['check']} of {finding['variant']}: {first['id']} -> {to} "
                     f"({line['tried']} cells, {line['seconds']:.1f} s{'' if line['complete'] else ', out of time'})")
    return out


def write_minimal(run_dir: Path, case: Case, finding: dict, env: dict[str, Any],
                  timeout_s: float = MINIMAL_TIMEOUT_S) -> dict[str, Any]:
    """The shrunk cell's minimal script (repro/minimal.py) in DIR/repro, run once here: written with the
    variant's simpler calls first, then its own (repro/minimal.py: calls_to_try), the first that exits 1
    (the defect shows) kept, the others removed; {"minimal": path in DIR, "minimal_report", "minimal_s",
    "minimal_says": its last line} or {"minimal_reason": why there is none}. All within timeout_s."""
    from ..repro.minimal import calls_to_try
    deadline, why = time.monotonic() + timeout_s, None
    for call_name in calls_to_try(finding["variant"]):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        got = _write_minimal_with(run_dir, case, finding, env, call_name, left)
        if "minimal" in got:
            return got
        why = why if why and got["minimal_reason"].startswith("no call of") else got["minimal_reason"]
    return {"minimal_reason": why or f"its minimal script ran past {timeout_s:g} s here"}


def _write_minimal_with(run_dir: Path, case: Case, finding: dict, env: dict[str, Any], call_name: str,
                        timeout_s: float) -> dict[str, Any]:
    """write_minimal with one call (a CALLS entry)."""
    import subprocess
    import sys
    from ..core.runfolder import REPRO_DIR
    from ..core.version import code_version
    from ..repro.minimal import MAX_LINES, minimal_script, script_name, title, unsupported, upstream_draft
    from ..workload.inputs import SCENARIOS
    argument = finding.get("argument")
    if why := unsupported(case, finding["check"], argument, call_name):
        return {"minimal_reason": why}
    heading = title(case, finding["check"], argument, call_name)
    versions = (f"torch {env.get('torch')}, Python {env.get('python')}, {env.get('cpu_model') or 'CPU'} "
                f"({env.get('cpu_capability')})")
    text = minimal_script(case, finding["check"], title=textwrap_title(heading), versions=versions, argument=argument,
                          call_name=call_name)
    if (n := len(text.splitlines())) > MAX_LINES:
        return {"minimal_reason": f"its minimal script takes {n} lines, over {MAX_LINES}"}
    path = run_dir / REPRO_DIR / script_name(finding["check"], finding["variant"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    began = time.monotonic()
    try:
        ran = subprocess.run([sys.executable, path.name], cwd=path.parent, capture_output=True, text=True,
                             timeout=timeout_s)
    except subprocess.TimeoutExpired:
        path.unlink()
        return {"minimal_reason": f"its minimal script ran past {timeout_s:g} s here"}
    said = (ran.stdout.strip().splitlines() or ran.stderr.strip().splitlines() or [""])[-1][:300]
    if ran.returncode != 1:
        path.unlink()
        return {"minimal_reason": f"its minimal script exits {ran.returncode} here, not 1: the library's API at "
                                  f"the shrunk cell does not show it ({said})"}
    seconds = round(time.monotonic() - began, 3)
    found = (f"attn-audit {code_version()}, check `{finding['check']}`, shrunk from {finding.get('from') or '?'} "
             f"to {case.id}")
    draft = upstream_draft(text, name=path.name, title=heading, versions=versions, found=found,
                           check=finding["check"], argument=argument, actual=said,
                           elsewhere=SCENARIOS[case.scenario].reference_kernels)
    path.with_suffix(".md").write_text(draft)
    return {"minimal": f"{REPRO_DIR}/{path.name}", "minimal_report": f"{REPRO_DIR}/{path.with_suffix('.md').name}",
            "minimal_s": seconds, "minimal_says": said, "minimal_call": call_name}


def textwrap_title(title: str, width: int = 100) -> str:
    """A docstring's first lines: `title` wrapped at `width`."""
    import textwrap
    return "\n".join(textwrap.wrap(title, width))


def import_paths(run_dir: Path) -> list[str]:
    """Where the run imported plug-ins from (run.json's cwd and PYTHONPATH), to import them alike."""
    import os
    info = json.loads((Path(run_dir) / RUN_FILE).read_text()) if (Path(run_dir) / RUN_FILE).exists() else {}
    return [p for p in [info.get("cwd"), *(info.get("pythonpath") or "").split(os.pathsep)] if p]


def run_preset(run_dir: Path) -> Preset:
    """The preset a run folder's run.json names (its sampling settings do not matter here)."""
    from ..workload.presets import presets
    path = Path(run_dir) / RUN_FILE
    name = (json.loads(path.read_text()).get("preset") if path.exists() else None) or "quick"
    return presets().get(name) or presets()["quick"]
