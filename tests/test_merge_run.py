"""The merge audit in a run (measure/merging/run_audit.py): its records, findings, section and cost in a
run folder, the quick preset's, `run --merge-fn` with a plug-in's declaration, and the reproduction scripts
of its findings. The judge's floating-point decisions are tests/test_merge_functions.py's (run again under
the emulated CPU kinds); these are about the run and its files, so they run once."""
from __future__ import annotations

import pytest

from audit.measure.merging.states import all_states
from tests.helpers import skip_without_torch_merger
from audit.workload.merges import builtin_merges


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


def test_each_torch_merge_finding_has_a_short_script_in_torch_s_api_that_fails_and_passes_once_fixed(tmp_path):
    skip_without_torch_merger()      # at run time: the check imports torch.distributed (0.7 s a collection)
    from audit.analysis.findings import write_findings
    from audit.measure.merging.run_audit import write_merge_audit
    from audit.repro.merge_scripts import write_merge_repro_scripts
    write_merge_audit(tmp_path, ("reference", "torch_context_parallel"))
    write_findings(tmp_path)
    findings = write_merge_repro_scripts(tmp_path)
    assert {f["check"] for f in findings} == {"merge_wrong", "merge_grad_wrong"}
    assert all(f.get("repro") for f in findings), findings
    scripts = [tmp_path / f["repro"] for f in findings]
    for script in scripts:
        text = script.read_text()
        assert len(text.splitlines()) <= 50 and "_SDPAMerger(convert_to_f32=True, seq_dim=2)" in text
    # the same scripts with torch's merger replaced by a right one (the reference merge written for torch's step API)
    fixed_api = ("class Fixed:\n"                  # the right merge, its gradient finite on empty parts too
                 "    def __init__(self): self.o = self.l = None\n"
                 "    def step(self, o, l, partial=False):\n"
                 "        o, l = o.double(), torch.where(l == math.inf, -math.inf, l.double())\n"
                 "        if self.o is None: self.o, self.l = o, l; return\n"
                 "        e1, e2 = self.l == -math.inf, l == -math.inf\n"
                 "        both = e1 & e2\n"
                 "        top = torch.where(both, 0.0, torch.maximum(self.l, l))\n"
                 "        w1 = torch.where(e1, 0.0, torch.exp(torch.where(e1, top, self.l) - top))\n"
                 "        w2 = torch.where(e2, 0.0, torch.exp(torch.where(e2, top, l) - top))\n"
                 "        total = torch.where(both, 1.0, w1 + w2)\n"
                 "        self.o = (w1[..., None] * self.o + w2[..., None] * o) / total[..., None]\n"
                 "        self.l = torch.where(both, -math.inf, top + torch.log(total))\n"
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
