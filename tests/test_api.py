"""The Python API: audit.run, report, compare, merge call the commands the CLI calls, with
the command's options as keywords, and fail as the CLI does (UsageError for a bad value)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import audit
from audit.commands import run as run_command
from audit.core.argv import to_argv
from audit.core.errors import UsageError
from audit.core.runfolder import INDEX_HTML, INDEX_MD, PLAN_FILE, RECORDS_FILE, RUN_FILE
from audit.workload import presets, variants

ROOT = Path(__file__).resolve().parent.parent


def test_keywords_become_the_command_line_of_the_same_run():
    actions = run_command.run_parser()._actions
    argv = to_argv({"preset": "quick", "out": Path("/tmp/x"), "seq_len": [128, 256], "kv_heads": 1,
                    "causal": [True, False], "no_report": True, "budget": None, "l2_flush": False},
                   actions)
    assert argv == ["--preset", "quick", "--out", "/tmp/x", "--seq-len", "128", "256", "--kv-heads", "1",
                    "--causal", "true", "false", "--no-report"]
    args = run_command.run_parser().parse_args(argv)       # and the CLI reads them back as given
    assert (args.seq_len, args.kv_heads, args.causal, args.no_report) == (["128", "256"], ["1"],
                                                                         ["true", "false"], True)


def test_every_option_the_parser_gave_nothing_makes_no_argument():
    """A run's own arguments handed on (Ray's shards: ray_executor.task_argv) parse again: an option left
    at its default, an empty list included (`--merge-parts` with no values would be refused), adds nothing."""
    parser = run_command.run_parser()
    args = parser.parse_args(["--preset", "quick"])
    argv = to_argv({k: v for k, v in vars(args).items() if k != "command"}, parser._actions)
    assert parser.parse_args(argv).merge_parts is None
    assert to_argv({"merge_parts": []}, parser._actions) == []


def test_an_unknown_keyword_names_the_allowed_ones():
    with pytest.raises(TypeError, match="unknown option .seqlen.; allowed: .*seq_len"):
        audit.run(preset="quick", seqlen=[128])


def test_a_bad_value_raises_the_usage_error_the_cli_prints(tmp_path, capsys):
    with pytest.raises(UsageError, match="--preset: unknown preset 'nope'; allowed: quick"):
        audit.run(preset="nope", out=tmp_path / "r")
    with pytest.raises(UsageError, match="--dtype"):
        audit.run(preset="quick", out=tmp_path / "r", dtype=["fp8"])
    with pytest.raises(UsageError, match="has no records.jsonl"):
        audit.report(tmp_path)


def test_a_dry_run_from_python_measures_nothing_and_returns_none(tmp_path, capsys):
    out = tmp_path / "dry"
    got = audit.run(preset="quick", out=out, variant=["eager"], dtype=["fp32"], seq_len=[64],
                    scenario=["normal"], causal=[False], dry_run=True)
    assert got is None and not (out / RECORDS_FILE).exists()
    assert capsys.readouterr().out.startswith("eager-cpu-fp32-d32-T64-B1-H2-full-normal  ")


def test_importing_audit_imports_neither_torch_nor_pandas():
    code = "import sys, audit; print(sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_audit_run_quick_from_python_measures_every_cell_and_reports(quick_run):
    """The shared quick run is `audit.run(preset="quick", out=..., budget="none")` (conftest):
    every cell of the preset has one record, the report is written, and run.json holds the
    command line the call stands for, the one its measuring process was started with."""
    cells = presets.preset_cases(presets.presets()["quick"], known_variant=variants.check_name)
    recorded = [json.loads(line)["id"] for line in (quick_run / RECORDS_FILE).read_text().splitlines()]
    assert sorted(recorded) == sorted(c.id for c in cells)
    assert all((quick_run / name).is_file() for name in (RUN_FILE, PLAN_FILE, INDEX_MD, INDEX_HTML))
    info = json.loads((quick_run / RUN_FILE).read_text())
    assert info["argv"] == ["attn-audit", "run", "--preset", "quick", "--out", str(quick_run),
                            "--budget", "none", "--no-progress"]
    assert audit.load(quick_run)["id"].tolist() == recorded
