"""`audit shrink`: a finding about code the audit did not write, shrunk to its smallest failing cell
(audit/execute/shrink.py), the same cell every time, within its seconds, and named in the finding."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from audit import cli
from audit.analysis.argument_rules import ARGUMENT_CHECK
from audit.analysis.findings import write_findings
from audit.core.errors import EXIT_USAGE
from audit.core.grid import Case
from audit.core.runfolder import SHRUNK_FILE
from audit.execute import runner
from audit.execute.shrink import SHRINK_ORDER, Shrunk, shrink, shrinkable, smaller_cases
from audit.workload import presets
from audit.workload.variants import resolve

PLUGINS = Path(__file__).resolve().parent / "plugins"
BIG = Case("x", "cpu", "bf16", 64, 512, 4, 8, True, "normal", kv_heads=4)


def test_each_axis_steps_down_smallest_first_and_stops_at_its_least():
    assert [c.seq_len for c in smaller_cases(BIG, "seq_len")] == [16, 32, 64, 128, 256]
    assert [c.batch for c in smaller_cases(BIG, "batch")] == [1, 2, 3]
    # fewer kv heads with the group of 2 kept, then smaller groups with the 4 kv heads
    assert [(c.heads, c.effective_kv_heads) for c in smaller_cases(BIG, "heads")] == [(2, 1), (4, 2), (6, 3), (4, 4)]
    assert [c.d_k for c in smaller_cases(BIG, "d_k")] == [8, 16, 32]
    assert [c.dtype for c in smaller_cases(BIG, "dtype")] == ["fp32"]
    least = Case("x", "cpu", "fp32", 8, 16, 1, 1, True, "normal")
    assert all(smaller_cases(least, axis) == [] for axis in SHRINK_ORDER)


def test_a_finding_from_some_size_on_shrinks_to_that_size_on_every_axis_and_the_same_twice():
    def shows(case: Case) -> bool:                   # wrong from 64 keys and 2 query heads a group on
        return case.seq_len >= 64 and case.heads // case.effective_kv_heads >= 2
    first, again = shrink(BIG, shows), shrink(BIG, shows)
    assert (first.cell, first.tried) == (again.cell, again.tried) and first.complete
    small = first.cell
    assert (small.seq_len, small.batch, small.heads, small.effective_kv_heads, small.d_k, small.dtype) == (
        64, 1, 2, 1, 8, "fp32")
    assert shows(small) and not any(shows(c) for axis in SHRINK_ORDER for c in smaller_cases(small, axis))


def test_shrinking_stops_when_its_seconds_are_spent():
    ticks = iter(range(1000))
    done = shrink(BIG, lambda case: True, seconds=3, clock=lambda: float(next(ticks)))
    assert isinstance(done, Shrunk) and not done.complete and done.tried <= 3
    assert done.cell.seq_len == 16                   # what it reached: kept, with "out of time"


def test_only_findings_about_code_the_audit_did_not_write_of_a_check_a_cell_decides_are_shrunk():
    def finding(check, variant, severity="error"):
        return {"check": check, "variant": variant, "severity": severity, "cells": []}
    found = [finding("nonfinite", "eager"), finding("nonfinite", "broken.clamped"), finding("memory_leak", "sdpa"),
             finding("causal_alignment", "*", "info"), finding("error_budget", "flash_op", "warning"),
             finding("nonfinite", "sdpa"), finding("lse_error_budget", "shrinkable:right"),
             dict(finding(ARGUMENT_CHECK, "flash_op"), argument="kv_heads")]   # the kv_heads probe's: shrunk
    # under its own name; before the plug-in's, as a minimal script can be written for it (repro/minimal.py)
    sys.path.insert(0, str(PLUGINS))
    try:
        chosen = shrinkable(found, lambda name: resolve(name).upstream)
        assert resolve("shrinkable:right").upstream == "shrinkable"          # a plug-in's: its module's
    finally:
        sys.path.remove(str(PLUGINS))
    assert [(f["check"], f["variant"]) for f in chosen] == [
        ("nonfinite", "sdpa"), (ARGUMENT_CHECK, "flash_op"), ("lse_error_budget", "shrinkable:right"),
        ("error_budget", "flash_op")]
    assert resolve("eager").upstream is None and resolve("compiled").upstream is None and resolve("sdpa").upstream


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run of two plug-ins on one cell of 128 keys: one NaN from 64 keys on, one right."""
    sys.path.insert(0, str(PLUGINS))
    out = tmp_path_factory.mktemp("shrink") / "run"
    out.mkdir()
    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
    cases = [Case(v, "cpu", "bf16", 32, 128, 2, 4, False, "normal", kv_heads=2)
             for v in ("shrinkable:nan_from_64_keys", "shrinkable:right")]
    runner.write_run_file(out, preset, {}, [], {}, len(cases))
    runner.run_grid(cases, out, preset, {}, progress=False)
    yield out
    sys.path.remove(str(PLUGINS))


def test_the_command_shrinks_a_plug_ins_finding_and_its_message_names_the_smallest_cell(run_dir, capsys):
    assert cli.main(["shrink", str(run_dir), "--seconds", "60s", "--no-report"]) == 0
    lines = [json.loads(line) for line in (run_dir / SHRUNK_FILE).read_text().splitlines()]
    assert {line["variant"] for line in lines} == {"shrinkable:nan_from_64_keys"}     # the right one has none
    nonfinite = next(line for line in lines if line["check"] == "nonfinite")
    cell = nonfinite["cell"]
    assert (cell["seq_len"], cell["batch"], cell["heads"], cell["d_k"], cell["dtype"]) == (64, 1, 2, 8, "fp32")
    assert nonfinite["complete"] and nonfinite["tried"] > 0
    found = {(f["check"], f["variant"]): f for f in write_findings(run_dir)}
    message = found["nonfinite", "shrinkable:nan_from_64_keys"]["message"]
    assert f"Smallest failing cell: {nonfinite['id']} (shrunk from {nonfinite['from']};" in message
    assert found["nonfinite", "shrinkable:nan_from_64_keys"]["smallest"] == nonfinite
    again = json.loads((run_dir / SHRUNK_FILE).read_text().splitlines()[0])
    assert cli.main(["shrink", str(run_dir), "--no-report"]) == 0          # the same cell the second time
    assert json.loads((run_dir / SHRUNK_FILE).read_text().splitlines()[0])["id"] == again["id"]


@pytest.mark.parametrize("argv, said", [
    (["shrink", "/nonexistent"], "has no records.jsonl"),
    (["shrink", ".", "--seconds", "soon"], "--seconds: 'soon' is not a positive duration"),
])
def test_bad_input_exits_2_with_one_line_naming_it(argv, said, tmp_path, capsys):
    if argv[1] == ".":
        (tmp_path / "records.jsonl").write_text("")
        argv = [argv[0], str(tmp_path), *argv[2:]]
    assert cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_a_finding_its_cell_no_longer_shows_here_is_said_not_shrunk(run_dir):
    """A record that says NaN where the variant, measured again here, gives none (another machine,
    torch or plug-in): no smallest cell is claimed, and the finding says why."""
    import shutil
    copy = run_dir.parent / "stale"
    shutil.copytree(run_dir, copy)
    lines = [json.loads(line) for line in (copy / "records.jsonl").read_text().splitlines()]
    for rec in lines:
        if rec["variant"] == "shrinkable:right":
            rec.update(out_nan=3, out_nonfinite_visible=3)
    (copy / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    from audit.execute.shrink import run_preset, shrink_run
    got = {(line["check"], line["variant"]): line for line in shrink_run(copy, run_preset(copy), {})}
    stale = got["nonfinite", "shrinkable:right"]
    assert stale["id"] is None and stale["tried"] == 1 and "does not show it" in stale["reason"]
    assert got["nonfinite", "shrinkable:nan_from_64_keys"]["cell"]["seq_len"] == 64
    found = {(f["check"], f["variant"]): f for f in write_findings(copy)}
    assert "Not shrunk: its cell, measured again here, does not show it" in found["nonfinite", "shrinkable:right"][
        "message"]


def test_plug_ins_are_imported_from_where_the_run_imported_them(tmp_path):
    from audit.execute.shrink import import_paths
    (tmp_path / "run.json").write_text(json.dumps({"cwd": "/work", "pythonpath": f"{PLUGINS}:/opt/x"}))
    assert import_paths(tmp_path) == ["/work", str(PLUGINS), "/opt/x"]
    assert import_paths(tmp_path / "none") == []


def test_shrinking_past_the_runs_deadline_says_so_for_each_finding_left(run_dir):
    """A run's shrinking (--shrink) ends at its deadline: a finding reached after it is not shrunk, and
    its line (and so its finding) says why, instead of a smaller cell or nothing."""
    import shutil
    import time
    copy = run_dir.parent / "late"
    shutil.copytree(run_dir, copy)
    from audit.execute.shrink import run_preset, shrink_run
    lines = shrink_run(copy, run_preset(copy), {}, deadline=time.time() - 1.0)
    assert lines and all(line["id"] is None and line["tried"] == 0 for line in lines)
    assert all("went to the findings before it" in line["reason"] for line in lines)


def test_the_plan_keeps_the_shrinking_time_only_for_a_grid_with_third_party_code():
    from audit.plan.overhead import SHRINK_START_S, shrink_seconds
    from audit.workload.variants import has_upstream
    assert shrink_seconds(40.0, True, host=2.0) == 40.0 + 2 * SHRINK_START_S
    assert shrink_seconds(40.0, False) == 0.0 and shrink_seconds(0.0, True) == 0.0
    assert has_upstream("sdpa") and has_upstream("hf:sdpa") and has_upstream("some_module:kernel")
    assert not has_upstream("eager") and not has_upstream("broken.clamped")


@pytest.mark.parametrize("argv, shrinking", [
    (["--variant", "sdpa", "--shrink", "15s"], True),
    (["--variant", "eager", "--shrink", "15s"], False),           # the audit's own code: nothing to shrink
    (["--variant", "sdpa"], False),                               # the quick preset shrinks nothing by itself
    (["--variant", "sdpa", "--preset", "cpu", "--budget", "30s"], False),    # 7% of 30 s: under 10 s, none
    (["--variant", "sdpa", "--preset", "cpu", "--budget", "10m"], True),
])
def test_the_dry_run_says_when_the_run_will_shrink(argv, shrinking, capsys):
    args = ["run", "--preset", "quick", "--dtype", "fp32", "--seq-len", "128", "--scenario", "normal",
            "--d-k", "64", "--dry-run", *argv]
    assert cli.main(args) == 0
    out = capsys.readouterr()
    line = next(x for x in (out.out + out.err).splitlines() if x.startswith("plan:"))
    assert ("shrinking and report" in line) == shrinking, line


def test_a_bad_shrink_duration_exits_2_naming_it(capsys):
    assert cli.main(["run", "--preset", "quick", "--shrink", "soon", "--dry-run"]) == EXIT_USAGE
    assert "--shrink: 'soon' is not a duration" in capsys.readouterr().err


def test_a_compiled_variant_shrinks_to_its_uncompiled_twin_last():
    flex = Case("flex", "cpu", "fp32", 8, 16, 1, 1, False, "normal")
    assert [c.variant for c in smaller_cases(flex, "compiled")] == ["flex_eager"]
    assert smaller_cases(dataclasses.replace(flex, variant="flex_eager"), "compiled") == []
    assert smaller_cases(dataclasses.replace(flex, variant="sdpa"), "compiled") == []
    assert SHRINK_ORDER[-1] == "compiled"
    # a defect the uncompiled op has too ends there; one only the compiled code has stays compiled
    assert shrink(flex, lambda case: True).cell.variant == "flex_eager"
    assert shrink(flex, lambda case: case.variant == "flex").cell.variant == "flex"


def _failed(t: int, scenario: str, after=None, reason: str = "", d_k: int = 32) -> dict:
    case = Case("hf:flex_attention", "cpu", "fp32", d_k, t, 1, 2, True, scenario)
    return dict(case.axes(), id=case.id, failed_after=after, status="error", reason=reason)


def test_a_cell_that_failed_only_after_others_is_replayed_after_the_same_call_at_another_length():
    """A failure on a recompile shows only after another call: its script calls first the same cell at each
    other length the run measured, the shorter first (every other axis the same), then the cell the process
    ran last before it of its own scenario (failed_after); none where the run has neither."""
    from audit.execute.shrink import replays
    short, mid, other_d = _failed(64, "packed"), _failed(128, "packed"), _failed(256, "packed", d_k=64)
    normal = _failed(128, "normal")
    failing = _failed(512, "packed", [short["id"], normal["id"]])
    got = [([b.id for b in before], then.id)
           for before, then in replays(failing, {r["id"]: r for r in (short, mid, other_d, normal, failing)})]
    assert got == [([short["id"]], failing["id"]), ([mid["id"]], failing["id"])]   # 64 then 512, 128 then 512; the
    # recorded predecessor (64, packed) is the first of them already
    middle = _failed(128, "packed", [normal["id"]])
    longer = [([b.id for b in before], then.id)
              for before, then in replays(middle, {r["id"]: r for r in (middle, failing, normal)})]
    assert longer == [([middle["id"]], failing["id"])]                              # 128 first, then 512
    alone = _failed(512, "packed", ["gone"])
    assert replays(alone, {alone["id"]: alone}) == []


def test_a_failed_findings_cells_are_shrunk_by_how_they_failed_one_that_failed_alone_first():
    """transformers' flex path on the CPU failed two ways in one run: a mask Inductor cannot compile (alone), a
    recompile (after others). Each is a part of its own, numbered, the one that failed alone first; cells whose
    compiler lines differ only in numbers (a generated variable's index, a line) are one failure."""
    from audit.execute.shrink import failure_kind, failure_parts
    vec = "InductorError: CppCompileError: C++ compile error; cause: c{}.main.cpp:{}:55: error: operands to '?:' differ"
    rec = "InductorError: CppCompileError: C++ compile error; cause: c{}.main.cpp:{}:45: error: 'cur_qSplitSize{}' not declared"
    assert failure_kind(rec.format("ab12", 1089, 0)) == failure_kind(rec.format("cd34", 1097, 7))
    assert failure_kind(vec.format("ab", 83)) != failure_kind(rec.format("ab", 83, 0))
    assert failure_kind("RuntimeError: boom") == "RuntimeError: boom" and failure_kind(None) == ": "
    late = _failed(128, "packed", ["x"], rec.format("a", 1, 0))
    alone = _failed(512, "paged", None, vec.format("b", 2))
    also = _failed(512, "packed", ["y"], vec.format("c", 3))
    finding = {"check": "cell_failed", "variant": "hf:flex_attention", "cells": [late["id"], alone["id"], also["id"]]}
    parts = failure_parts(finding, {r["id"]: r for r in (late, alone, also)})
    assert [(p["part"], p["cells"]) for p in parts] == [(1, [alone["id"], also["id"]]), (2, [late["id"]])]
    assert parts[0]["failure"] == failure_kind(alone["reason"])
    one = failure_parts(dict(finding, cells=[alone["id"]]), {alone["id"]: alone})
    assert len(one) == 1 and "part" not in one[0]
    other = {"check": "nonfinite", "variant": "sdpa", "cells": ["z"]}
    assert failure_parts(other, {}) == [other]


def test_a_finding_with_two_failures_names_each_and_its_script():
    from audit.analysis.findings import with_smallest_cells
    finding = {"check": "cell_failed", "variant": "v", "cells": ["a", "b"], "message": "v failed."}
    lines = [{"check": "cell_failed", "variant": "v", "from": "a", "part": 1, "failure": "E: one", "id": "a-small",
              "tried": 3, "seconds": 2.0, "complete": True, "minimal": "repro/x-minimal.py", "minimal_says": "fails"},
             {"check": "cell_failed", "variant": "v", "from": "b", "part": 2, "failure": "E: two", "id": None,
              "reason": "it failed after other cells", "minimal": "repro/x-2-minimal.py", "minimal_after": ["b-short"],
              "minimal_says": "fails too"},
             {"check": "cell_failed", "variant": "v", "from": "gone", "id": None, "reason": "stale"}]
    [got] = with_smallest_cells([dict(finding)], {("cell_failed", "v"): lines})
    said = got["message"]
    assert said.index("Failure 1 (E: one): Smallest failing cell: a-small") < said.index("Failure 2 (E: two): Not shrunk")
    assert "repro/x-2-minimal.py (called after b-short)" in said and "stale" not in said
    assert got["minimal"] == "repro/x-minimal.py" and got["smallest"]["part"] == 1
    [alone] = with_smallest_cells([dict(finding)], {("cell_failed", "v"): lines[:1]})
    assert "Failure 1" not in alone["message"] and "Smallest failing cell: a-small" in alone["message"]


def test_the_search_starts_from_a_cell_a_minimal_script_can_draw():
    """Of a finding's cells alike, one whose scenario a minimal script draws (fp16_range has no plain-torch
    draw, scaled_x64 has); a larger drawable cell before a smaller one that is not (the search makes it
    small); of a failure, a cell that failed alone before one that failed after others."""
    from audit.execute.shrink import start_cell
    cell = dict(seq_len=64, batch=1, heads=2, d_k=32)
    assert start_cell([dict(cell, scenario="fp16_range"), dict(cell, scenario="scaled_x64")])["scenario"] == "scaled_x64"
    assert start_cell([dict(cell, scenario="fp16_range", seq_len=16), dict(cell, scenario="normal")])["scenario"] == "normal"
    assert start_cell([dict(cell, scenario="normal", seq_len=16), dict(cell, scenario="normal")])["seq_len"] == 16
    assert start_cell([dict(cell, scenario="normal", failed_after=["x"]), dict(cell, scenario="fp16_range")])[
        "scenario"] == "fp16_range"
