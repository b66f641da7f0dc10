"""Property-based tests of the command line (hypothesis): whatever small grid a user asks for, `run`
ends with a documented exit code and leaves a report or one clear line, and never a traceback.

Each example is a real `python -m audit run` in a subprocess (the supervising process, a measuring
process, the report): presets, variants (built-ins, negative controls, a plug-in that raises, one that
declines every causal cell, one that takes no float mask, a name that does not exist), dtypes,
scenarios (one that does not exist), causal flags, budgets from 1 s to none (and a bad one),
--dry-run, shards (and a bad one); the sizes are the smallest the grid takes, so a run is seconds.

Settings (docs/testing.md): the `ci` profile draws CI_EXAMPLES runs per session, new ones each time
(hypothesis's database, `.hypothesis/`, is kept out of git); ATTN_AUDIT_HYPOTHESIS=thorough draws
THOROUGH_EXAMPLES.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from audit.core.errors import EXIT_CODES, EXIT_INTERNAL, EXIT_USAGE

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"
CI_EXAMPLES = 6       # new draws each session; 10 took 17-26 s of the 6-minute CI (docs/testing.md)
THOROUGH_EXAMPLES = 200
PROFILE = os.environ.get("ATTN_AUDIT_HYPOTHESIS", "ci")
settings.register_profile("ci", max_examples=CI_EXAMPLES, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("thorough", max_examples=THOROUGH_EXAMPLES, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

VARIANTS = ("eager", "sdpa", "sdpa_math", "flex_eager", "broken.clamped", "broken.unscaled",
            "faults:raises", "declines:no_causal", "declines:bool_masks_only", "no_such_variant")
SCENARIOS = ("normal", "padding", "fully_masked_bool", "decode", "sinks", "packed", "softcap", "no_such_scenario")
BUDGETS = (None, "1s", "3s", "10s", "none", "-5s")
SHARDS = (None, "1/2", "2/2", "3/2")
RUN_TIMEOUT_S = 300

run_arguments = st.fixed_dictionaries({
    "preset": st.sampled_from(("quick", "cpu")),
    "variant": st.lists(st.sampled_from(VARIANTS), min_size=1, max_size=3, unique=True),
    "dtype": st.sampled_from(("fp32", "bf16", "fp16")),
    "scenario": st.lists(st.sampled_from(SCENARIOS), min_size=1, max_size=2, unique=True),
    "causal": st.sampled_from((("true",), ("false",), ("true", "false"))),
    "budget": st.sampled_from(BUDGETS),
    "dry_run": st.booleans(),
    "shard": st.sampled_from(SHARDS),
})


def _argv(drawn: dict, out: Path) -> list[str]:
    argv = ["run", "--preset", drawn["preset"], "--variant", *drawn["variant"], "--dtype", drawn["dtype"],
            "--scenario", *drawn["scenario"], "--causal", *drawn["causal"], "--d-k", "16", "--seq-len", "32",
            "--batch", "1", "--heads", "2", "--kv-heads", "2", "--no-progress", "--out", str(out)]
    if drawn["budget"] is not None:
        argv += ["--budget", drawn["budget"]]
    if drawn["dry_run"]:
        argv.append("--dry-run")
    if drawn["shard"] is not None:
        argv += ["--shard", drawn["shard"]]
    return argv


def _files_with_a_traceback(folder: Path) -> list[str]:
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and b"Traceback" in p.read_bytes()]


@settings(settings.get_profile(PROFILE))
@given(drawn=run_arguments)
def test_every_drawn_run_exits_with_a_documented_code_and_never_a_traceback(tmp_path_factory, drawn):
    out = tmp_path_factory.mktemp("drawn") / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
    done = subprocess.run([sys.executable, "-m", "audit", *_argv(drawn, out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    said = done.stdout + done.stderr
    assert done.returncode in EXIT_CODES, (done.returncode, said[-3000:])
    assert done.returncode != EXIT_INTERNAL, said[-3000:]                    # a bug of the audit's
    assert "Traceback" not in said, said[-3000:]
    if done.returncode == EXIT_USAGE:
        errors = [line for line in done.stderr.splitlines() if line.startswith("attn-audit: error:")]
        assert len(errors) == 1 and errors[0] == done.stderr.strip().splitlines()[-1], done.stderr
        return
    assert done.returncode == 0, said[-3000:]
    if drawn["dry_run"]:
        assert "plan: " in done.stdout, said[-3000:]
        return
    assert (out / "index.md").exists() and (out / "index.html").exists(), said[-3000:]
    assert _files_with_a_traceback(out) == []


def test_a_run_that_measures_nothing_exits_0_and_its_report_says_why(tmp_path):
    """The cpu preset with a 1 s budget: start-up and the report alone take longer, on any machine."""
    budget = "1s"
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "audit", "run", "--preset", "cpu", "--budget", budget, "--no-progress",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert "plan: nothing fits" in done.stderr
    assert "model audit (llama-small, gpt-oss-small): left out: over the budget" in done.stderr
    page = (out / "index.md").read_text()
    assert "Nothing of a real variant was measured" in page and "--budget" in page
    # nor the model audit after the cells: left out by the plan, the report says why
    assert "No model audit of llama-small, gpt-oss-small: over the budget" in page
    assert _files_with_a_traceback(out) == []
