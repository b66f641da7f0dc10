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
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

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


def start_cell(cells: Sequence[dict]) -> dict:
    """The record a finding's search starts from: of a failure, a cell that failed alone (one that failed after
    others may need them first); then one whose scenario a minimal script draws (repro/minimal.py: INPUTS;
    the search makes it small: sdpa's gradient finding on equal cells of fp16_range, low_lse and scaled_x64
    started from fp16_range, which no script draws); then the smallest."""
    from ..repro.minimal import INPUTS
    return min(cells, key=lambda r: (bool(r.get("failed_after")), r.get("scenario") not in INPUTS, _cell_size(r)))


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
    failed: dict[str, str] = {}                 # cell id -> failure_kind of a cell measured here that failed

    def found_on(case: Case) -> set[tuple[str, str]]:
        if case.id not in shown:
            record = run_cell(case, cache, quick, env, builds=builds)
            shown[case.id] = {(f["check"], f["variant"]) for f in compute_findings(to_frame([record]))}
            failed[case.id] = failure_kind(record.get("reason"))
        return shown[case.id]
    out: list[dict] = []
    path = Path(run_dir) / SHRUNK_FILE
    path.write_text("")            # each line as its finding ends: a shrinking stopped later keeps them

    def keep(line: dict) -> None:
        out.append(line)
        with open(path, "a") as fh:
            fh.write(json.dumps(line) + "\n")
    chosen = [part for finding in shrinkable(compute_findings(to_frame(records)), lambda v: resolve(v).upstream)
              for part in failure_parts(finding, by_id)]
    for n, finding in enumerate(chosen):
        cells = [by_id[i] for i in finding["cells"] if i in by_id]
        if not cells:
            continue
        first = start_cell(cells)
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

        def shows(case: Case, check: str = finding["check"], failure: str | None = finding.get("failure")) -> bool:
            return ((check, case.variant) in found_on(case)      # the uncompiled twin's finding counts too
                    and (failure is None or failed.get(case.id) == failure))      # a failure: the same one
        start = Case.from_mapping(first)
        began = time.monotonic()
        line = {"check": finding["check"], "variant": finding["variant"], "from": first["id"],
                **{k: finding[k] for k in ("failure", "part") if finding.get(k)}}
        # a failure seen only after other cells ran (a recompile) is not shown by its cell alone: its script
        # calls the same function at another length first (replays)
        after_others = finding["check"] == "cell_failed" and bool(first.get("failed_after"))

        def timeout() -> float:
            """Seconds left for the minimal script's runs: its own limit, within the run's deadline."""
            return MINIMAL_TIMEOUT_S if deadline is None else max(1.0, min(MINIMAL_TIMEOUT_S, deadline - time.time()))
        # measured again first, except in the run itself (its records are of this machine, torch and plug-in,
        # and paged_flex's cell costs 11 s of the run's shrinking time on a 2-core AVX2-only EPYC)
        if after_others:    # what a cell alone shows depends on what ran before it here: not shrunk alone
            line.update(id=None, cell=None, tried=0, complete=True,
                        reason="it failed after other cells of its variant had run (a recompile): its script "
                               "calls the same function at another length first")
            line.update(write_minimal(Path(run_dir), start, dict(finding, **{"from": first["id"]}), env, timeout(),
                                      replayed=replays(first, by_id)))
        elif deadline is None and not shows(start):     # another machine, torch or plug-in: nothing to shrink from
            line.update(id=None, cell=None, tried=1, complete=True,
                        reason="its cell, measured again here, does not show it")
        else:
            done = shrink(start, shows, share)
            line.update(id=done.cell.id, cell=done.cell.axes(), tried=done.tried + (deadline is None),
                        complete=done.complete)
            line.update(write_minimal(Path(run_dir), done.cell, dict(finding, **{"from": first["id"]}), env, timeout()))
        line["seconds"] = round(time.monotonic() - began, 3)
        keep(line)
        if progress:
            to = line["id"] or line["reason"]
            progress(f"{finding['check']} of {finding['variant']}: {first['id']} -> {to} "
                     f"({line['tried']} cells, {line['seconds']:.1f} s{'' if line['complete'] else ', out of time'})")
    return out


def failure_kind(reason: Any) -> str:
    """How a cell failed, as a line two cells failing the same way share: the exception's name and the
    compiler's last `error:` line (else the reason), digits dropped (line numbers, hashes, a generated
    variable's index: cur_qSplitSize0 and cur_qSplitSize7 are one failure)."""
    import re
    text = (str(reason or "").strip().splitlines() or [""])[0]
    name = text.split(":", 1)[0]
    said = text.rsplit("error:", 1)[1] if "error:" in text else text[len(name) + 1:]
    return f"{name}: {re.sub(r'[0-9]+', '', said).strip()[:120]}"


def failure_parts(finding: dict, by_id: dict[str, dict]) -> list[dict]:
    """A cell_failed finding's cells by how they failed (failure_kind), each a finding of its own to shrink,
    with its `failure` and, where there are several, its `part` (1, 2, ...): one that failed alone first. Any
    other finding as it is. (transformers' flex path on the CPU: a mask Inductor cannot compile, alone; and
    a recompile that fails, only after another length.)"""
    if finding["check"] != "cell_failed":
        return [finding]
    groups: dict[str, list[str]] = {}
    for cell in finding["cells"]:
        if cell in by_id:
            groups.setdefault(failure_kind(by_id[cell].get("reason")), []).append(cell)
    alone_first = sorted(groups.items(), key=lambda kv: all(by_id[c].get("failed_after") for c in kv[1]))
    if len(alone_first) <= 1:
        return [dict(finding, failure=next(iter(groups), None))]
    return [dict(finding, cells=cells, failure=kind, part=n) for n, (kind, cells) in enumerate(alone_first, 1)]


def replays(record: dict, by_id: dict[str, dict], most: int = 3) -> list[tuple[tuple[Case, ...], Case]]:
    """(cells called first, the cell then called) to try where a failed cell's call runs alone: a failure on
    a recompile. The same call at another length the run measured (every other axis the same), the shorter
    first (as a generation loop grows), then the cell its measuring process ran last before it of its own
    scenario (failed_after); at most `most`."""
    cell = Case.from_mapping(record)
    axes = {k: v for k, v in cell.axes().items() if k != "seq_len"}
    twins = sorted({int(r["seq_len"]) for r in by_id.values()
                    if {k: r.get(k) for k in axes} == axes and r.get("seq_len") != record.get("seq_len")})
    out = [((dataclasses.replace(cell, seq_len=min(t, cell.seq_len)),), dataclasses.replace(cell, seq_len=max(t, cell.seq_len)))
           for t in twins]
    earlier = [by_id[i] for i in (record.get("failed_after") or []) if i in by_id and by_id[i].get("scenario") == cell.scenario]
    out += [((Case.from_mapping(earlier[-1]),), cell)] if earlier else []
    return list(dict.fromkeys(out))[:most]


def write_minimal(run_dir: Path, case: Case, finding: dict, env: dict[str, Any],
                  timeout_s: float = MINIMAL_TIMEOUT_S,
                  replayed: Sequence[tuple[tuple[Case, ...], Case]] = ()) -> dict[str, Any]:
    """The shrunk cell's minimal script (repro/minimal.py) in DIR/repro, run once here: written with the
    variant's simpler calls first, then its own (repro/minimal.py: calls_to_try), the first that exits 1
    (the defect shows) kept, the others removed; {"minimal": path in DIR, "minimal_report", "minimal_s",
    "minimal_says": its last line} or {"minimal_reason": why there is none}. All within timeout_s.
    `replayed` (a failed cell's, replays()): where the call alone runs, each (cells called first, cell) is
    tried after it (a failure on a recompile); the line's `minimal_cell` is the cell the script fails on."""
    from ..repro.minimal import calls_to_try
    deadline, why = time.monotonic() + timeout_s, None
    for call_name in calls_to_try(finding["variant"]):
        for before, then in ((), case), *replayed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            got = _write_minimal_with(run_dir, then, finding, env, call_name, left, before)
            if "minimal" in got:
                return dict(got, minimal_cell=then.id, **({"minimal_after": [b.id for b in before]} if before else {}))
            why = why if why and got["minimal_reason"].startswith("no call of") else got["minimal_reason"]
            if " exits 0 here" not in got["minimal_reason"]:
                break                   # it did not run clean alone: a call before it would not explain it
    return {"minimal_reason": why or f"its minimal script ran past {timeout_s:g} s here"}


def _write_minimal_with(run_dir: Path, case: Case, finding: dict, env: dict[str, Any], call_name: str,
                        timeout_s: float, before: tuple[Case, ...] = ()) -> dict[str, Any]:
    """write_minimal with one call (a CALLS entry), after calls as the cells `before`."""
    import subprocess
    import sys
    from ..core.runfolder import REPRO_DIR
    from ..core.version import code_version
    from ..repro.minimal import MAX_LINES, minimal_script, script_name, title, unsupported, upstream_draft
    from ..workload.inputs import SCENARIOS
    argument = finding.get("argument")
    if why := unsupported(case, finding["check"], argument, call_name):
        return {"minimal_reason": why}
    heading = title(case, finding["check"], argument, call_name, again=bool(before))
    versions = (f"torch {env.get('torch')}, Python {env.get('python')}, {env.get('cpu_model') or 'CPU'} "
                f"({env.get('cpu_capability')})")
    text = minimal_script(case, finding["check"], title=textwrap_title(heading), versions=versions, argument=argument,
                          call_name=call_name, before=before, part=finding.get("part"))
    if (n := len(text.splitlines())) > MAX_LINES:
        return {"minimal_reason": f"its minimal script takes {n} lines, over {MAX_LINES}"}
    path = run_dir / REPRO_DIR / script_name(finding["check"], finding["variant"], finding.get("part"))
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
