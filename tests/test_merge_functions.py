"""Functions that merge partial attention, audited on real splits and edge states (measure/merging):
the reference is right on every state, each negative control is caught and named by its own mistake,
merges declared in FlashInfer's and vLLM's call forms are judged as written, and torch's
context-parallel merge is audited as it ships."""
from __future__ import annotations

import math

import pytest
import torch

from audit.core.diagnosis_names import members
from audit.core.errors import UsageError
from audit.measure.merging.judge import audit_merge, audit_merges, outcome_of
from audit.measure.merging.states import EDGES, SPLITS, all_states, build_state
from audit.workload.merge_functions import declare_merge, merge_partials, torch_merger_available
from audit.workload.merges import CONTROL_PREFIX, builtin_merges
from tests.plugins.merge_standins import merge_attn_states, merge_state, merge_state_nan_on_empty
from audit.workload.merge_mistakes import MERGE_MISTAKES

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds


@pytest.fixture(scope="module")
def states():
    return all_states()


def _by_state(records):
    return {(r["state"], r["dtype"]): r for r in records}


def test_every_state_has_its_parts_and_a_golden_with_empty_rows_where_it_says(states):
    names = {s.name for s in states}
    assert names == {s.name for s in SPLITS + EDGES}
    both = next(s for s in states if s.name == "both_empty" and s.dtype == "fp32")
    assert (both.golden[1] == -math.inf).sum() == 8 and both.golden[0][both.golden[1] == -math.inf].abs().max() == 0
    posinf = next(s for s in states if s.name == "posinf_empty")
    assert (posinf.parts[0][1] == math.inf).any() and not (posinf.parts[0][1] == -math.inf).any()
    far = next(s for s in states if s.name == "far_apart")
    assert float(far.parts[1][1].min() - far.parts[0][1].max()) > 88.7          # past float32's exp
    assert all(p[1].dtype == torch.float32 for s in states for p in s.parts)
    assert {str(s.parts[0][0].dtype) for s in states} == {"torch.float32", "torch.bfloat16", "torch.float16"}


def test_the_reference_merge_is_right_on_every_state_values_and_gradients(states):
    records = audit_merges({"reference": builtin_merges()["reference"]}, states)
    assert [(r["state"], r["dtype"], r["outcome"]) for r in records if r["outcome"] != "right"] == []
    assert [(r["state"], r["dtype"], r["grad_outcome"]) for r in records if r["grad_outcome"] != "right"] == []
    assert all(r["diagnosis"] == "none" and r["grad_diagnosis"] == "none" for r in records)


def test_a_merge_with_detached_weights_is_right_in_value_and_caught_by_its_gradient_alone(states):
    records = audit_merges({"d": builtin_merges()[CONTROL_PREFIX + "weights_detached"]}, states)
    assert all(r["outcome"] == "right" for r in records)
    assert all(r["grad_outcome"] == "wrong" for r in records if r["state"] in ("two_shards", "ring_4"))


def test_a_merge_written_into_a_tensor_is_not_differentiable_and_not_judged(states):
    rec = audit_merge(declare_merge(merge_attn_states, form="vllm"), states[0])
    assert rec["outcome"] == "right" and rec["grad_outcome"] == "not_differentiable" and rec["grad_max_err"] is None


@pytest.mark.parametrize("mistake", list(MERGE_MISTAKES))
def test_each_control_is_caught_and_named_by_its_own_mistake_wherever_it_is_wrong(states, mistake):
    records = audit_merges({mistake: builtin_merges()[CONTROL_PREFIX + mistake]}, states)
    wrong = [r for r in records if r["outcome"] != "right"]
    wrong_grads = [r for r in records if r["grad_outcome"] in ("nan", "wrong")]
    assert wrong or wrong_grads, f"{mistake}: right on every state, values and gradients, so nothing tests it"
    unnamed = [(r["state"], r["dtype"], r["diagnosis"]) for r in wrong if mistake not in members(r["diagnosis"])]
    unnamed += [(r["state"], r["dtype"], r["grad_diagnosis"]) for r in wrong_grads
                if mistake not in members(r["grad_diagnosis"])]
    assert unnamed == []


def test_a_chain_shows_the_lse_left_unupdated_in_the_output(states):
    """Right out for one merge, wrong in a chain: the next merge weighs the parts by the stale lse."""
    control = builtin_merges()[CONTROL_PREFIX + "lse_not_updated"]
    two = audit_merge(control, build_state(SPLITS[0], "fp32"))
    ring = audit_merge(control, build_state(SPLITS[1], "fp32"))
    assert two["max_abs_err"] <= two["out_tol"] and two["lse_max_err"] > two["lse_tol"]
    assert ring["max_abs_err"] > 100 * ring["out_tol"]


def test_the_rule_judges_nan_inf_wrong_and_right():
    base = {"out_nan_rows": 0, "lse_nan_rows": 0, "out_inf_rows": 0, "lse_inf_rows": 0, "max_abs_err": 0.0,
            "lse_max_err": 0.0, "empty_out_max": 0.0, "empty_lse_right": True}
    assert outcome_of(base, 1e-6, 1e-6) == "right"
    assert outcome_of({**base, "lse_nan_rows": 1}, 1e-6, 1e-6) == "nan"
    assert outcome_of({**base, "lse_inf_rows": 2}, 1e-6, 1e-6) == "inf"
    assert outcome_of({**base, "max_abs_err": 1e-3}, 1e-6, 1e-6) == "wrong"
    assert outcome_of({**base, "empty_lse_right": False}, 1e-6, 1e-6) == "wrong"    # (0, 0) for an empty row


# --------------------------------------------------------------------------- declared call forms

def test_amerge_state_declared_as_its_docs_say_is_right_and_its_mistake_is_named(states):
    right = declare_merge(merge_state, form="flashinfer", name="merge_state")
    assert right.lse_base == "2"
    assert [r["state"] for r in audit_merges({"m": right}, states) if r["outcome"] != "right"] == []
    wrong = audit_merges({"m": declare_merge(merge_state_nan_on_empty, form="flashinfer")}, states)
    bad = {(r["state"], r["outcome"]) for r in wrong if r["outcome"] != "right"}
    assert ("both_empty", "nan") in bad and all(s in ("both_empty", "causal_fully_masked") for s, _ in bad)
    assert all("nan_on_empty" in members(r["diagnosis"]) for r in wrong if r["outcome"] != "right")


def test_a_merge_declared_in_the_wrong_base_is_caught():
    """The same right function declared with a natural-log lse: every merge of unequal lses is wrong."""
    wrong = declare_merge(merge_state, form="flashinfer", lse_base="e")
    assert audit_merge(wrong, build_state(SPLITS[0], "fp32"))["outcome"] == "wrong"


def test_amerge_attn_states_is_right_on_every_state_with_fa_s_plus_inf_too(states):
    merge = declare_merge(merge_attn_states, form="vllm")
    assert [r["state"] for r in audit_merges({"v": merge}, states) if r["outcome"] != "right"] == []


def test_declaring_an_unknown_form_or_base_says_what_is_allowed():
    with pytest.raises(UsageError, match="one of pairs, flashinfer, vllm, stateful"):
        declare_merge(merge_state, form="triton")
    with pytest.raises(UsageError, match="lse_base '10'"):
        declare_merge(merge_state, lse_base="10")


def test_a_merge_that_raises_is_an_error_with_its_reason_not_numbers():
    def broken(out_a, lse_a, out_b, lse_b):
        raise RuntimeError("no kernel for this head size")
    rec = audit_merge(declare_merge(broken), build_state(SPLITS[0], "fp32"))
    assert rec["status"] == "error" and rec["reason"] == "RuntimeError: no kernel for this head size"
    assert "max_abs_err" not in rec


# --------------------------------------------------------------------------- torch's own

@pytest.mark.skipif(torch_merger_available() is not None, reason=str(torch_merger_available()))
def test_torch_context_parallel_merge_is_audited_as_it_ships(states):
    """Whatever torch's _SDPAMerger returns, the audit's outcome is what calling it by hand shows, and
    a NaN or a +inf that wins is named by the mistake that gives it. (torch 2.13: NaN on two empty
    parts and on an empty first part; an empty part's +inf lse wins.)"""
    from torch.distributed.tensor.experimental._context_parallel._attention import _SDPAMerger
    records = _by_state(audit_merges({"t": builtin_merges()["torch_context_parallel"]}, states))
    for state in states:
        merger = _SDPAMerger(convert_to_f32=True, seq_dim=2)
        for out, lse in state.parts:
            merger.step(out, lse, partial=False)
        out, lse = merger.results()
        rec = records[state.name, state.dtype]
        assert (rec["out_nan_rows"] + rec["lse_nan_rows"] > 0) == bool(out.isnan().any() or lse.isnan().any())
        if rec["outcome"] == "nan" and state.name == "both_empty":
            assert "nan_on_empty" in members(rec["diagnosis"])
        if rec["outcome"] == "inf" and state.name == "posinf_empty":
            assert "posinf_wins" in members(rec["diagnosis"])
        if rec["outcome"] != "right":
            assert rec["diagnosis"] != "none", (state.name, rec)


def test_the_reference_merge_is_the_lse_checks_merge():
    """One definition: the merge the lse checks use is the audited reference."""
    from audit.measure.golden import lse as golden_lse
    assert golden_lse.merge_partials is merge_partials


# --------------------------------------------------------------------------- in a run

def test_a_run_folder_gets_the_merge_records_findings_and_section(tmp_path):
    from audit.analysis.findings import merge_findings
    from audit.core.runfolder import read_merge_records
    from audit.measure.merging.run_audit import write_merge_audit
    from audit.render.merge_section import MERGE_HEADING, merge_section, merge_verdict
    from audit.workload.merges import merge_names
    write_merge_audit(tmp_path, merge_names() + ("no_such_merge",))
    records = read_merge_records(tmp_path)
    assert len(records) == (len(builtin_merges())) * len(all_states()) + 1
    assert {r["id"] for r in records if r["merge"] == "no_such_merge"} == {"no_such_merge"}
    found = merge_findings(tmp_path)
    checks = {(f["check"], f["variant"]) for f in found}
    assert ("merge_failed", "no_such_merge") in checks
    assert not any(f["check"] == "merge_control_uncaught" for f in found)          # every control caught
    assert not any(f["variant"] == "reference" for f in found)
    blocks = merge_section(records, found)
    assert blocks[0].text == MERGE_HEADING and any("Negative controls caught: 7/7" in str(b) for b in blocks)
    assert merge_section([], []) == [] and merge_verdict([], []) == []
    only_failed = [r for r in records if r["merge"] == "no_such_merge"]
    assert merge_section(only_failed, found)                                        # a partial audit renders


def test_a_control_right_everywhere_is_a_self_check_finding():
    from audit.analysis.merge_rules import check_merges
    recs = [{"merge": "broken_merge.x", "control": "x", "status": "ok", "outcome": "right", "state": "s",
             "dtype": "fp32", "id": "broken_merge.x-s-fp32"}]
    assert [f["check"] for f in check_merges(recs)] == ["merge_control_uncaught"]
    recs[0]["outcome"] = "nan"
    assert check_merges(recs) == []


def test_the_plan_predicts_the_merge_audit_after_the_cells():
    import pandas as pd
    from audit.plan.overhead import DEFAULTS, overhead_s
    pred = pd.DataFrame({"device": ["cpu"], "status": ["ok"]})
    assert overhead_s(pred, host=2.0, merge_audit=True)[1] - overhead_s(pred, host=2.0)[1] == pytest.approx(
        2.0 * DEFAULTS["merge_audit_s"])


def test_the_quick_preset_audits_every_builtin_merge_and_reports_it(quick_run):
    from audit.core.runfolder import MERGE_FINDINGS_FILE, read_merge_records
    from audit.workload.merges import merge_names
    records = read_merge_records(quick_run)
    assert {r["merge"] for r in records} == set(merge_names())
    assert all(r["outcome"] == "right" for r in records if r["merge"] == "reference")
    assert (quick_run / MERGE_FINDINGS_FILE).exists()
    page = (quick_run / "index.md").read_text()
    assert "## Merging partial attention" in page and "Negative controls caught: 7/7" in page
    import json
    findings = json.loads((quick_run / MERGE_FINDINGS_FILE).read_text())
    assert all((quick_run / f["repro"]).exists() for f in findings if f["check"] == "merge_wrong")


# --------------------------------------------------------------------------- reproduction scripts

SCRIPT_HARNESS = r'''
import contextlib, io, json, runpy, sys
for path in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(path, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code
    print(json.dumps({"path": path, "rc": code, "out": out.getvalue(), "audit": "audit" in sys.modules}))
'''


def _run_scripts(paths, cwd):
    import json
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", SCRIPT_HARNESS, *map(str, paths)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.skipif(torch_merger_available() is not None, reason=str(torch_merger_available()))
def test_each_torch_merge_finding_has_a_short_script_in_torch_s_api_that_fails_and_passes_once_fixed(tmp_path):
    from audit.analysis.findings import write_findings
    from audit.measure.merging.run_audit import write_merge_audit
    from audit.repro.merge_scripts import write_merge_repro_scripts
    write_merge_audit(tmp_path, ("reference", "torch_context_parallel"))
    write_findings(tmp_path)
    findings = write_merge_repro_scripts(tmp_path)
    values = [f for f in findings if f["check"] == "merge_wrong"]
    assert values and all(f.get("repro") for f in values), findings
    assert all(f.get("repro_reason") for f in findings if f["check"] == "merge_grad_wrong")
    scripts = [tmp_path / f["repro"] for f in values]
    for script in scripts:
        text = script.read_text()
        assert len(text.splitlines()) <= 40 and "_SDPAMerger(convert_to_f32=True, seq_dim=2)" in text
    # the same scripts with torch's merger replaced by a right one (the reference merge written for torch's step API)
    fixed_api = ("class Fixed:\n"
                 "    def __init__(self): self.o = self.l = None\n"
                 "    def step(self, o, l, partial=False):\n"
                 "        o, l = o.double(), torch.where(l == math.inf, -math.inf, l.double())\n"
                 "        if self.o is None: self.o, self.l = o, l; return\n"
                 "        m = torch.logaddexp(self.l, l)\n"
                 "        w = lambda x: torch.where(x == -math.inf, 0.0, torch.exp(x - m))[..., None]\n"
                 "        self.o, self.l = w(self.l) * self.o + w(l) * o, m\n"
                 "    def results(self): return self.o, self.l\n"
                 "merge_fn = Fixed\n")
    fixed = []
    for script in scripts:
        text = script.read_text().replace("merge_fn = lambda: _SDPAMerger(convert_to_f32=True, seq_dim=2)\n", fixed_api)
        fixed.append(tmp_path / f"fixed-{script.name}")
        fixed[-1].write_text(text)
    results = {r["path"]: r for r in _run_scripts(scripts + fixed, tmp_path)}
    for script in scripts:
        got = results[str(script)]
        assert got["rc"] == 1 and "REPRODUCED: the finding holds" in got["out"] and not got["audit"], got
    for script in fixed:
        got = results[str(script)]
        assert got["rc"] == 0 and "NOT REPRODUCED" in got["out"], got


def test_the_smallest_failing_case_is_one_row_of_two_features_and_none_for_a_right_merge():
    from audit.repro.merge_scripts import FEATURES, smallest_failing
    state = build_state(EDGES[2], "fp32")                                   # both_empty
    row = smallest_failing(builtin_merges()[CONTROL_PREFIX + "nan_on_empty"], state)
    assert row is not None and row.parts[0][0].shape == (1, 1, 1, FEATURES) and row.golden[1].item() == -math.inf
    assert smallest_failing(builtin_merges()["reference"], state) is None


def test_a_run_audits_a_merge_declared_in_a_plug_in_and_writes_its_script_in_the_library_s_api(tmp_path):
    """`run --merge-fn module:attr`: the stand-in of FlashInfer's merge_state declared as a user declares it is
    right on every state; the one with vllm #27491's mistake is found, named, and its script calls it as
    FlashInfer is called (importing the stand-in's module, never the audit)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root, plugins = Path(__file__).resolve().parents[1], Path(__file__).resolve().parent / "plugins"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), str(root)])}
    names = ["merge_plugins:flashinfer_merge_state", "merge_plugins:flashinfer_nan_on_empty"]
    grid = ["--preset", "quick", "--variant", "eager", "--dtype", "fp32", "--seq-len", "64", "--scenario", "normal",
            "--causal", "false", "--budget", "none", "--no-progress"]
    argv = [sys.executable, "-m", "audit", "run", *grid, "--merge-fn", *names, "--out", str(tmp_path / "run")]
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "merges.jsonl").read_text().splitlines()]
    assert {r["merge"] for r in records} == set(names) and all(r["form"] == "flashinfer" for r in records)
    findings = json.loads((run / "merge_findings.json").read_text())
    assert {f["variant"] for f in findings} == {names[1]}
    assert all("nan_on_empty" in f["message"] for f in findings)
    script = run / findings[0]["repro"]
    assert "from merge_standins import merge_state_nan_on_empty" in script.read_text()
    alone_env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(plugins)}
    alone = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           env=alone_env)
    assert alone.returncode == 1 and "REPRODUCED" in alone.stdout, alone.stdout + alone.stderr


def test_a_wrong_merge_name_exits_2_saying_what_is_allowed():
    import subprocess
    import sys
    from pathlib import Path
    done = subprocess.run([sys.executable, "-m", "audit", "run", "--preset", "quick", "--variant", "eager",
                           "--merge-fn", "nope", "--dry-run"], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--merge-fn 'nope': no such merge function; one of all, none, reference" in done.stderr
