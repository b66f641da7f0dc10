"""Fault injection: what a user's faulty kernel, a crowded machine or a damaged file does to a
run. Every fault ends with the right status and a clear reason, the run completes, and the
correct variants in the same run are recorded as in a run without the faulty ones.

The faulty plug-ins are tests/plugins/faults.py; each run is `python -m audit run` in a
subprocess, as a user runs it.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from audit.core import records

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"
FAULTS = ("raises", "returns_nan", "segfaults", "exits", "wrong_last_dim", "returns_none", "returns_float64",
          "allocates_64_tib", "hangs", "hangs_in_backward", "leaks")
CORRECT = ("eager", "sdpa")
GRID = ["--preset", "quick", "--dtype", "fp32", "--d-k", "32", "--seq-len", "64", "--batch", "1",
        "--heads", "2", "--kv-heads", "2", "--causal", "false", "--scenario", "normal", "--budget", "none",
        "--no-progress", "--no-report"]
CELL_TIMEOUT_S = "4"
# Numerics of the correct variants that a faulty neighbour must not change.
NUMERICS = ("status", "out_nan", "out_inf", "grad_nan", "grad_inf", "rmse", "max_abs_err", "rel_err",
            "dq_err", "dk_err", "dv_err", "within_budget", "masked_rows", "leak_max_change", "max_prob")


def audit(*args: str, timeout: float = 300, **popen) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "audit", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, **popen)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    out = tmp_path_factory.mktemp("faulty") / "run"
    variants = [f"faults:{f}" for f in FAULTS] + list(CORRECT)
    # 20 samples a pass: at least 40 timed calls, so the 2 MiB a call `leaks` keeps passes the
    # 64 MiB a leak is reported at however slow the calls are (fewer, on a loaded machine)
    # --shrink: the run shrinks its findings about the plug-ins after the cells (test_the_runs_shrinking_...)
    done = audit("run", *GRID, "--variant", *variants, "--min-samples", "20", "--cell-timeout", CELL_TIMEOUT_S,
                 "--shrink", "20s", "--out", str(out))
    recs = {r["variant"]: r for r in records.read_records(out)}
    return done, recs, out


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "run"
    done = audit("run", *GRID, "--variant", *CORRECT, "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def clean(clean_run):
    return {r["variant"]: r for r in records.read_records(clean_run)}


def test_the_run_completes_without_a_traceback(faulty):
    done, recs, _ = faulty
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert set(recs) == {f"faults:{f}" for f in FAULTS} | set(CORRECT)


@pytest.mark.parametrize("fault, status, words", [
    ("raises", "error", ["ValueError: this kernel does not support d_k=32"]),
    ("segfaults", "error", ["died with signal SIGSEGV", "new process"]),
    ("exits", "error", ["died with exit code 3"]),
    ("wrong_last_dim", "error", ["returned a tensor of shape (1, 2, 64, 16)", "expected a tensor of shape "
                                 "(1, 2, 64, 32), dtype fp32, on cpu"]),
    ("returns_none", "error", ["returned NoneType", "expected a tensor of shape (1, 2, 64, 32)"]),
    ("returns_float64", "error", ["dtype float64", "expected a tensor of shape (1, 2, 64, 32), dtype fp32"]),
    ("allocates_64_tib", "oom", ["can't allocate memory"]),
    ("hangs", "timeout", [f"per-cell time limit of {CELL_TIMEOUT_S} s", "killed"]),
    ("hangs_in_backward", "timeout", [f"per-cell time limit of {CELL_TIMEOUT_S} s"]),
])
def test_each_fault_ends_with_the_right_status_and_a_clear_reason(faulty, fault, status, words):
    rec = faulty[1][f"faults:{fault}"]
    assert rec["status"] == status, rec["reason"]
    for word in words:
        assert word in rec["reason"], (word, rec["reason"])
    assert rec["fwd_ms"] is None                               # a failed cell carries no measurements


def test_nan_output_is_measured_not_failed(faulty):
    rec = faulty[1]["faults:returns_nan"]
    assert rec["status"] == "ok" and rec["out_nan"] == 1 * 2 * 64 * 32


def test_a_leak_is_measured_reported_and_isolated(faulty):
    done, recs, out = faulty
    rec = recs["faults:leaks"]
    assert rec["status"] == "ok" and rec["leaked_bytes"] > 64 * 2**20
    assert "kept" in done.stderr and "fresh process" in done.stderr   # the next cell got a new worker
    from audit.analysis.findings import compute_findings
    found = compute_findings(records.load(out))
    assert any(f["check"] == "memory_leak" and f["variant"] == "faults:leaks" for f in found)
    assert not any(f["check"] == "memory_leak" and f["variant"] in CORRECT for f in found)


def test_correct_variants_are_recorded_as_without_the_faulty_ones(faulty, clean):
    _, recs, _ = faulty
    for variant in CORRECT:
        got, want = recs[variant], clean[variant]
        for column in NUMERICS:
            assert got[column] == want[column], (variant, column, got[column], want[column])
        assert got["leaked_bytes"] is None


# --------------------------------------------------------------------------- the run folder

def test_damaged_lines_are_quarantined_and_their_cells_measured_again(tmp_path, clean_run):
    import shutil
    out = tmp_path / "run"
    shutil.copytree(clean_run, out)
    grid = [*GRID, "--variant", *CORRECT, "--out", str(out)]
    path = out / records.RECORDS_FILE                                   # the clean run's 2 records
    lines = path.read_text().splitlines()
    damaged_id = json.loads(lines[1])["id"]
    lines[1] = lines[1][: len(lines[1]) // 2] + "#garbage"             # a line cut in the middle
    lines.insert(2, json.dumps({"hello": "world"}))                     # JSON, but not a record
    path.write_text("\n".join(lines) + "\n")

    report = audit("report", str(out))
    assert report.returncode == 0, report.stderr
    assert "2 damaged line(s) of records.jsonl (line 2, 3) moved to" in report.stderr
    assert "Traceback" not in report.stderr
    quarantined = [json.loads(x) for x in (out / records.QUARANTINE_FILE).read_text().splitlines()]
    assert [q["line"] for q in quarantined] == [2, 3] and "#garbage" in quarantined[0]["text"]

    rerun = audit("run", *grid)
    assert rerun.returncode == 0, rerun.stderr
    ids = [r["id"] for r in records.read_records(out)]
    assert sorted(ids) == sorted(set(ids)) and damaged_id in ids and len(ids) == 2


def test_records_of_a_newer_schema_stop_with_both_versions(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    rec = records.new_record({}, "x")
    rec.update(schema=records.SCHEMA_VERSION + 1, status="ok")
    (out / records.RECORDS_FILE).write_text(records.dumps(rec) + "\n")
    for args in (("report", str(out)), ("run", *GRID, "--variant", "eager", "--out", str(out))):
        done = audit(*args)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert f"schema {records.SCHEMA_VERSION + 1}" in done.stderr
        assert f"schema {records.SCHEMA_VERSION}" in done.stderr
    assert not (out / records.QUARANTINE_FILE).exists()                 # not damaged: never moved


def test_a_second_writer_is_refused_and_a_stale_lock_never_blocks(tmp_path):
    out = tmp_path / "run"
    args = [*GRID, "--variant", "faults:hangs", "--cell-timeout", "60", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
    first = subprocess.Popen([sys.executable, "-m", "audit", "run", *args], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (out / "inflight").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        second = audit("run", *args, timeout=60)
        assert second.returncode == 2
        assert f"pid {first.pid}" in second.stderr and "faults:hangs" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)                                # dies holding the lock
        first.wait()
    assert (out / ".lock").exists()
    third = audit("run", *GRID, "--variant", "eager", "--out", str(out))
    assert third.returncode == 0, third.stderr                           # the stale lock is gone


def _ignore_sigint() -> None:
    """In the child before exec: SIGINT ignored, as for `cmd &` in a script (inherited by exec)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("how", ["ctrl-c", "ctrl-c, started with SIGINT ignored", "sigterm to the supervisor"])
def test_a_signal_ends_a_run_stuck_in_a_hung_cell(tmp_path, how):
    """Ctrl-C (SIGINT to the process group) ends the run with its "interrupted" line and exit 130,
    also when the run was started with SIGINT ignored (a background job of a script: before
    audit.execute.interrupt such a run ignored Ctrl-C and hung); so does SIGTERM to the supervisor alone."""
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-m", "audit", "run", *GRID, "--variant", "faults:hangs",
                             "--cell-timeout", "600", "--out", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_ignore_sigint if "ignored" in how else None)
    try:
        deadline = time.monotonic() + 120
        while not (out / "inflight").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert (out / "inflight").exists(), "the run never reached its hung cell"
        time.sleep(0.5)
        if how.startswith("sigterm"):
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)                           # Ctrl-C: the whole process group
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)                          # nothing outlives a failed test
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err


def test_a_failure_keeps_its_cause_its_text_and_what_ran_before_it(tmp_path):
    """A variant that fails only on a recompile (tests/plugins/faults.py: fails_on_recompile): the
    reason names the compiler's error line, the whole failure is in failures/, the record says what
    ran before, the finding says so, and the reproduction script, which runs the cell alone without
    the failure, replays what ran before and reproduces it: fails on a recompile."""
    import json
    import subprocess
    import sys
    out = tmp_path / "run"
    done = audit("run", "--preset", "quick", "--variant", "faults:fails_on_recompile", "--dtype", "fp32",
                 "--d-k", "32", "--seq-len", "64", "128", "--causal", "false", "--batch", "1", "--heads", "2",
                 "--kv-heads", "2", "--scenario", "normal", "--budget", "none", "--out", str(out))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    recs = {r["seq_len"]: r for r in records.read_records(out)}
    first, failed = recs[64], recs[128]
    assert first["status"] == "ok" and failed["status"] == "error"
    assert failed["reason"].startswith("RuntimeError: backend compiler failed; cause: cabc.main.cpp:65:51: error: "
                                       "operands to '?:' have different types"), failed["reason"]
    assert failed["failed_after"] == [first["id"]]
    text = (out / failed["failure_file"]).read_text()
    assert "CompileFailed" in text and "VecMask<float, 1>" in text and "Traceback" not in text
    finding = next(f for f in json.loads((out / "findings.json").read_text()) if f["check"] == "cell_failed")
    assert failed["failure_file"] in finding["message"] and "same measuring process" in finding["message"]
    script = out / finding["repro"]
    ran = subprocess.run([sys.executable, str(script)], cwd=out, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "now: the variant runs this cell (forward and backward) and returns a valid output alone" in ran.stdout
    assert f"fails on a recompile: after {first['id']}" in ran.stdout and "REPRODUCED" in ran.stdout
    assert not [p for p in out.rglob("*") if p.is_file() and b"Traceback" in p.read_bytes()]


def _raise_chained(how: str) -> BaseException:
    """An exception raised while handling a KeyError: `from None`, `from` it, or plainly (context)."""
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            if how == "from none":
                raise ValueError("outer") from None
            if how == "from":
                raise ValueError("outer") from inner
            raise ValueError("outer")               # implicit context: not its cause
    except ValueError as exc:
        return exc
    raise AssertionError("nothing raised")


@pytest.mark.parametrize("how, reason", [("from none", "ValueError: outer (at"),
                                         ("from", "ValueError: outer; cause: KeyError: 'inner' (at"),
                                         ("context", "ValueError: outer (at")])
def test_a_failure_reason_follows_raise_from_to_the_root_and_not_a_handled_exception(how, reason):
    from audit.measure.cell.failures import failure_reason
    assert failure_reason(_raise_chained(how)).startswith(reason)


def test_the_runs_shrinking_leaves_hangs_and_crashes_alone_and_shrinks_the_rest(faulty):
    """--shrink: after the cells, the run shrinks its findings about the plug-ins (code it did not write) in a
    process of its own; the cells that hung or killed their process are not measured again there (no per-cell
    limit guards it), and their lines say why."""
    import json
    from audit.core.runfolder import SHRUNK_FILE
    done, _, out = faulty
    lines = {(line["check"], line["variant"]): line
             for line in map(json.loads, (out / SHRUNK_FILE).read_text().splitlines())}
    assert lines, done.stderr[-3000:]
    left = [line for (check, variant), line in lines.items() if check == "cell_failed" and variant in
            ("faults:segfaults", "faults:exits", "faults:hangs", "faults:hangs_in_backward")]
    assert all("hung or killed their process" in line["reason"] for line in left)
    shrunk = [line for line in lines.values() if line["id"]]
    assert shrunk and all(line["cell"]["seq_len"] <= 64 for line in shrunk)
    assert all("no call of faults:" in line["minimal_reason"] for line in shrunk)      # a plug-in: no minimal script
    assert "shrinking" in done.stderr and "Traceback" not in done.stderr
