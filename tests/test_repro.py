"""Reproduction scripts (audit.repro.scripts): one per finding, standalone, exit 1 while the finding holds.

Two audit runs: the session's quick run (conftest.py: quick_run, the whole quick preset
without a time budget, so that no cell is skipped for time on a busy machine), and a small
run of faulty plug-ins beside a negative control and eager, made here, which fires the checks
the quick preset does not (cell_failed, memory_leak, finfo_min_mask, saturation,
causal_alignment, nondeterministic). Every script of both runs is executed with torch alone: in one clean
process (cwd elsewhere, no PYTHONPATH, `audit` not importable), each in a fresh namespace as
`__main__`; a sample also as `python script.py`.
"""
from __future__ import annotations

import ast
import json
import math
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from audit.core.grid import Case
from audit.repro.embed import Embedder, NotSelfContained
from audit.repro.scripts import WORST, build_script, write_repro_scripts
from audit.workload.inputs import SCENARIOS, make_inputs

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"
FAULTS = ["--preset", "quick", "--variant", "faults:raises", "faults:leaks", "faults:returns_nan", "racy:racy",
          "broken.unscaled",
          "eager", "--scenario", "fully_masked_finfo_min", "cross_causal", "--dtype", "fp32", "--d-k", "64",
          "--seq-len", "64", "--batch", "1", "--heads", "2", "--kv-heads", "2", "--causal", "true", "--budget", "none", "--no-report"]
EVERY_CHECK = {"nonfinite", "error_budget", "grad_error_budget", "masked_leakage", "fully_masked_rows", "finfo_min_mask", "fp16_overflow",
               "saturation", "input_saturation", "compiled_rewritten", "causal_alignment", "underflow",
               "memory_leak", "cell_failed", "nondeterministic", "lse_error_budget", "lse_grad_budget",
               "lse_masked_rows", "referee", "cross_document", "paged_reads", "batch_invariance", "chunk_invariance",
               "argument_ignored"}

# Runs every script given on the command line in this one process, each as __main__ in a
# fresh namespace, and prints one JSON line per script: its exit status and output.
HARNESS = r'''
import contextlib, io, json, runpy, sys
for path in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [path]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path(path, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code
    assert "audit" not in sys.modules, "a script imported the audit package"
    print(json.dumps({"path": path, "rc": code, "out": out.getvalue()}), flush=True)
'''


def clean_env(pythonpath: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def audit_run(out: Path, args: list[str], pythonpath: str) -> Path:
    done = subprocess.run([sys.executable, "-m", "audit", "run", *args, "--no-progress", "--out", str(out)],
                          cwd=ROOT, env=clean_env(pythonpath), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory) -> Path:
    """Faulty plug-ins: their findings and scripts. Whether the audit sees `faults:leaks` leak
    depends on how many calls its timing makes (tests/test_faults.py tests that detection);
    here, where the record shows no leak, it is marked leaking (as the audit would record it)
    so that its script is written and must show the leak by itself."""
    from audit.analysis.findings import write_findings
    run = audit_run(tmp_path_factory.mktemp("faults") / "run", FAULTS, os.pathsep.join([str(PLUGINS), str(ROOT)]))
    lines = [json.loads(line) for line in (run / "records.jsonl").open()]
    leaks = [r for r in lines if r["variant"] == "faults:leaks" and r["scenario"] == "cross_causal"]
    if not any(r.get("leaked_bytes") for r in leaks):
        leaks[0]["leaked_bytes"] = 65 * 2**20
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    write_repro_scripts(run, write_findings(run))
    return run


def findings_of(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "findings.json").read_text())


def run_alone(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def outcomes(quick_run, fault_run, tmp_path_factory) -> dict[str, dict]:
    scripts = sorted(str(p) for run in (quick_run, fault_run) for p in (run / "repro").glob("*.py"))
    done = subprocess.run([sys.executable, "-c", HARNESS, *scripts], cwd=tmp_path_factory.mktemp("elsewhere"),
                          env=clean_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {r["path"]: r for r in results}


def _measured(out: str, prefix: str) -> dict:
    line = next(line for line in out.splitlines() if line.startswith(prefix))
    return json.loads(line[len(prefix):])


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=0)
    return a == b


def _merge_findings(run: Path) -> list[dict]:
    from audit.core.runfolder import MERGE_FINDINGS_FILE
    path = run / MERGE_FINDINGS_FILE
    return json.loads(path.read_text()) if path.exists() else []


# --------------------------------------------------------------------------- every finding, reproduced

def test_every_finding_has_a_script_and_the_two_runs_fire_every_check(quick_run, fault_run):
    checks = set()
    for run in (quick_run, fault_run):
        for finding in findings_of(run):
            checks.add(finding["check"])
            assert finding.get("repro"), finding
            assert (run / finding["repro"]).is_file()
            assert "repro_reason" not in finding, finding["repro_reason"]
        merge_scripts = [f for f in _merge_findings(run) if f.get("repro")]     # the merge audit's (test_merge_run)
        assert len(list((run / "repro").glob("*.py"))) == len(findings_of(run)) + len(merge_scripts)
    assert checks == EVERY_CHECK == set(WORST)     # every check fired, and each has a recipe


def test_each_script_reproduces_its_finding_with_the_audits_numbers(quick_run, fault_run, outcomes):
    for run in (quick_run, fault_run):
        for finding in findings_of(run):
            got = outcomes[str(run / finding["repro"])]
            assert got["rc"] == 1, (finding["repro"], got["out"][-3000:])
            assert "REPRODUCED: the finding holds" in got["out"]
            assert finding["variant"] in got["out"]
            if finding["check"] in ("memory_leak", "cell_failed"):
                continue                             # a process's memory and a crash: no record numbers to match
            recorded, measured = _measured(got["out"], "audit recorded: "), _measured(got["out"], "measured now: ")
            if finding["check"] == "nondeterministic":   # which runs differ, and by how much, is chance itself
                assert measured["repeat_differs"] and measured["repeat_max_diff"] > 0, measured
                continue
            for column, value in measured.items():
                assert _same(value, recorded[column]), (finding["repro"], column, value, recorded[column])


def test_a_script_alone_exits_1_and_with_the_control_corrected_0(quick_run, tmp_path):
    script = quick_run / "repro" / "masked_leakage-broken_clamped.py"
    done = run_alone(script, tmp_path)                  # `python script.py`, cwd elsewhere, no PYTHONPATH
    assert done.returncode == 1, done.stdout + done.stderr
    assert "changes by up to" in done.stdout and "REPRODUCED" in done.stdout
    text = script.read_text()
    defect = ("return torch.clamp(eager_probs(q, k, mask=mask, causal=causal, scale=scale, score_mod=score_mod), "
              "min=1e-6)")
    assert defect in text                            # the control's own source, copied
    fixed = tmp_path / "fixed.py"
    fixed.write_text(text.replace(defect, "return eager_probs(q, k, mask=mask, causal=causal, scale=scale, score_mod=score_mod)"))
    done = run_alone(fixed, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NOT REPRODUCED" in done.stdout and "changes by up to 0 " in done.stdout


def test_a_diagnosed_finding_checks_its_diagnosis_too(quick_run, tmp_path):
    """The script names the mistake its output matches; a diagnosis that no longer holds (here a
    record claiming another mistake) makes it exit 0."""
    finding = next(f for f in findings_of(quick_run)
                   if f["variant"] == "broken.unscaled" and f.get("diagnosis") == "scale_missing")
    done = run_alone(quick_run / finding["repro"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "diagnosis: the output matches the known mistake scale_missing" in done.stdout
    by_id = {json.loads(line)["id"]: json.loads(line) for line in (quick_run / "records.jsonl").open()}
    cell = next(by_id[c] for c in finding["cells"] if by_id[c].get("diagnosis") == "scale_missing")
    claimed = dict(cell, diagnosis="gqa_interleaved")
    script = tmp_path / "claimed.py"
    script.write_text(build_script(dict(finding, diagnosis="gqa_interleaved"), claimed,
                                   json.loads((quick_run / "run.json").read_text()), 1, "a cell"))
    done = run_alone(script, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the audit diagnosed gqa_interleaved: the diagnosis no longer holds" in done.stdout


def test_a_corrected_plugin_exits_0_and_a_crashing_one_exits_1(fault_run, tmp_path):
    text = (fault_run / "repro" / "cell_failed-faults_raises.py").read_text()
    assert f"PLUGIN_PATHS = {[str(PLUGINS)]!r}" in text    # where the run imported `faults` from
    corrected = tmp_path / "corrected"
    corrected.mkdir()
    (corrected / "faults.py").write_text(
        "import torch.nn.functional as F\n\n\n"
        "def raises(q, k, v, *, mask=None, causal=False, scale=None):\n"
        "    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,"
        " scale=scale)\n")
    fixed = tmp_path / "fixed.py"
    fixed.write_text(text.replace(f"PLUGIN_PATHS = {[str(PLUGINS)]!r}", f"PLUGIN_PATHS = {[str(corrected)]!r}"))
    done = run_alone(fixed, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "now: the variant runs this cell" in done.stdout
    crashing = tmp_path / "segfaults.py"
    crashing.write_text(text.replace("PLUGIN = 'faults:raises'", "PLUGIN = 'faults:segfaults'"))
    done = run_alone(crashing, tmp_path)
    assert done.returncode == 1 and "died with signal SIGSEGV" in done.stdout, done.stdout + done.stderr


# --------------------------------------------------------------------------- the same inputs, bit for bit

def _assert_same_inputs(namespace: dict, case: Case) -> None:
    import torch
    ns = namespace
    got = ns["draw_inputs"](ns["Case"](**ns["CELL_AXES"]), ns["scenario_draw"], ns["TQ"])
    want = make_inputs(case)
    for name in ("q", "k", "v", "grad_out", "mask", "visible"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (case.id, name)
    assert (got.causal, got.mask_form) == (want.causal, want.mask_form)


def test_the_scripts_rebuild_the_audits_inputs(quick_run):
    seen = set()
    for finding in findings_of(quick_run):
        text = (quick_run / finding["repro"]).read_text()
        axes = ast.literal_eval(re.search(r"^CELL_AXES = (.*)$", text, re.MULTILINE).group(1))
        if axes["variant"].startswith("compiled") or (axes["scenario"], axes["dtype"]) in seen:
            continue                                    # one script per input kind; none that compiles on load
        seen.add((axes["scenario"], axes["dtype"]))
        namespace = runpy.run_path(str(quick_run / finding["repro"]), run_name="repro_inputs_only")
        case = Case(**namespace["CELL_AXES"])
        assert case.id in finding["cells"]
        _assert_same_inputs(namespace, case)
    assert len(seen) >= 5


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_every_scenario_is_rebuilt_exactly(scenario, dtype, tmp_path):
    case = Case("eager", "cpu", dtype, 8, 24, 2, 3, True, scenario)
    cell = {**case.axes(), "id": case.id, "golden_onehot_frac": 0.9}
    finding = {"check": "input_saturation", "severity": "info", "variant": "*", "message": "m", "cells": [case.id]}
    path = tmp_path / "s.py"
    path.write_text(build_script(finding, cell, {}, 1, "the cell"))
    _assert_same_inputs(runpy.run_path(str(path), run_name="repro_inputs_only"), case)


# --------------------------------------------------------------------------- what cannot be copied

def test_a_piece_that_cannot_be_copied_gives_a_reason_not_a_script(quick_run, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(quick_run, run)
    from audit.workload import inputs
    from audit.workload.draws import _normal
    lambda_draw = lambda case, gen, tq, tk: _normal(case, gen, tq, tk, 64.0)  # noqa: E731
    monkeypatch.setitem(SCENARIOS, "scaled_x64", inputs.Scenario("scaled_x64", "a lambda", lambda t: t, lambda_draw))
    found = write_repro_scripts(run, findings_of(run))
    only_there = [f for f in found if all(c.endswith("-scaled_x64") for c in f["cells"])]
    assert any(f["check"] == "input_saturation" for f in only_there)
    for finding in only_there:                  # every cell has the lambda: a reason, no script
        assert "repro" not in finding
        assert re.search(r"scenario_draw: cannot copy (tests\.)?test_repro\.test_a_piece.*<lambda>",
                         finding["repro_reason"])
    rest = [f for f in found if f not in only_there]
    assert all(f.get("repro") for f in rest), [  # on another scenario, if need be, and saying so
        (f["check"], f["variant"], f.get("repro_reason")) for f in rest if not f.get("repro")]
    moved = [f for f in rest if f.get("repro_reason")]
    assert moved and all("worst cell not copied: " in f["repro_reason"] and "scaled_x64" not in
                         (run / f["repro"]).read_text().split("AXES = ")[1].splitlines()[0] for f in moved)
    on_disk = json.loads((run / "findings.json").read_text())
    assert [f.get("repro") for f in on_disk] == [f.get("repro") for f in found]


def test_embedder_copies_closures_partials_and_enums_and_refuses_the_rest():
    import functools

    from audit.workload import inputs, torch_kernels
    emb = Embedder()
    emb.bind("draw", inputs.SCENARIOS["scaled_x4"].draw)            # a closure over alpha = 4
    emb.bind("build", functools.partial(torch_kernels._compiled, None))
    emb.bind("math_backend", __import__("torch.nn.attention", fromlist=["SDPBackend"]).SDPBackend.MATH)
    text = emb.section()
    assert "alpha = 4" in text and "def _normal(" in text and "def _randn(" in text
    assert "functools.partial(_compiled, None)" in text
    assert "torch.nn.attention.SDPBackend.MATH" in text
    namespace: dict = {}
    exec("\n".join(emb.import_lines()) + "\n" + text, namespace)  # noqa: S102 - our own generated code
    assert namespace["math_backend"] == namespace["torch"].nn.attention.SDPBackend.MATH
    with pytest.raises(NotSelfContained, match="lambda"):
        Embedder().bind("f", inputs.SCENARIOS["decode"].q_len)        # an audit lambda
    with pytest.raises(NotSelfContained, match=r"cannot copy (tests\.)?test_repro\..*<lambda>"):
        Embedder().bind("f", lambda x: x)                             # not the audit's, not torch's
    with pytest.raises(NotSelfContained, match="neither torch nor the standard library"):
        Embedder().bind("pd", pytest)


def test_stale_scripts_go_when_the_findings_do(tmp_path, quick_run):
    run = tmp_path / "run"
    shutil.copytree(quick_run, run)
    assert list((run / "repro").glob("*.py"))
    assert write_repro_scripts(run, []) == [] and not list((run / "repro").glob("*.py"))


# --------------------------------------------------------------------------- the verifiers on correct code

@pytest.mark.parametrize("check, variant, scenario, dtype, recorded", [
    ("nonfinite", "eager", "normal", "fp32", {}),
    ("error_budget", "eager_fp32", "normal", "bf16", {}),
    ("masked_leakage", "eager", "padding", "fp32", {}),
    ("fully_masked_rows", "sdpa", "fully_masked_bool", "fp32", {}),
    ("finfo_min_mask", "eager", "fully_masked_bool", "fp32", {}),
    ("fp16_overflow", "eager_fp32", "fp16_range", "fp16", {}),
    ("saturation", "eager", "normal", "fp32", {}),
    ("input_saturation", "eager", "normal", "fp32", {}),
    ("causal_alignment", "eager", "cross_causal", "fp32", {"causal_alignment": "bottom-right"}),
    ("underflow", "eager", "normal", "fp32", {}),
    ("memory_leak", "eager", "normal", "fp32", {}),
    ("error_budget", "eager", "normal", "fp32", {"diagnosis": "scale_missing"}),
    ("nondeterministic", "eager", "padding", "fp32", {}),
])
def test_a_verifier_finds_nothing_on_correct_code(check, variant, scenario, dtype, recorded):
    """Each check's verifier says "gone" (exit 0) where the finding does not hold; the scripts
    above show each one says "holds" where it does."""
    from audit.repro.checks import VERIFIERS, verify_memory_leak
    from audit.workload.variants import resolve
    case = Case(variant, "cpu", dtype, 16, 32, 1, 2, True, scenario)
    spec = resolve(variant)

    def load_variant():
        return spec.build(), spec.probs
    verify = VERIFIERS[check] if check != "memory_leak" else (
        lambda *args: verify_memory_leak(*args, max_calls=32, max_s=10.0))
    defect, lines, measured = verify(case, make_inputs(case), load_variant, recorded)
    assert defect is False, lines
    assert lines and measured


def test_copied_code_cannot_take_a_name_the_script_defines():
    """A copied global named like one of the script's constants is refused, not shadowed."""
    from audit.core import grid
    from audit.repro.embed import Embedder, NotSelfContained
    emb = Embedder()
    emb.reserve("AXES")
    with pytest.raises(NotSelfContained, match="AXES"):
        emb.bind("Case", grid.Case)                 # Case.axes() reads grid.AXES
    emb = Embedder()
    emb.reserve("CELL_AXES")
    assert emb.bind("Case", grid.Case) == "Case"


def test_a_script_part_that_does_not_compile_stops_the_script():
    """Each part of a script is compiled once per report (scripts._compiles): a broken one still raises."""
    from audit.repro.scripts import _compiles
    _compiles("def ok(x: SomeLaterName) -> int:\n    return 1\n")      # annotations are not evaluated
    with pytest.raises(SyntaxError):
        _compiles("def broken(:\n    pass\n")
