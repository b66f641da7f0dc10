"""README stays true to the code: every column, option, scenario and variant is
documented, and the plug-in example file in README works as written."""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import pytest

from audit import cli
from audit.core import grid, records
from audit.workload import inputs, presets, variants

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("column", list(records.COLUMNS))
def test_every_record_column_documented(column):
    assert f"| `{column}` |" in README


def _options() -> list[tuple[str, str]]:
    """(command, option) for every option of every subcommand."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return [(command, opt) for command, sub_parser in sub.choices.items() for action in sub_parser._actions
            for opt in action.option_strings
            if opt.startswith("--") and opt != "--help" and action.help != argparse.SUPPRESS]


@pytest.mark.parametrize("command, option", _options())
def test_every_option_documented(command, option):
    assert f"`{option}" in README


@pytest.mark.parametrize("option", [opt for command, opt in _options() if command == "compare"])
def test_every_compare_option_documented(option):
    """In the compare options table of README's Compare two runs."""
    section = README.split("## Compare two runs", 1)[1].split("\n## ", 1)[0]
    assert f"| `{option}" in section


@pytest.mark.parametrize("scenario", list(inputs.SCENARIOS))
def test_every_scenario_documented(scenario):
    assert f"`{scenario}`" in README


@pytest.mark.parametrize("name", list(variants.builtin_variants()))
def test_every_variant_documented(name):
    assert f"`{name}`" in README


def test_readme_plugin_example_runs(tmp_path, monkeypatch):
    """The complete plug-in file in README, saved as written, audits a cell correctly."""
    from audit.measure import cellcache
    from audit.execute import runner

    code = re.search(r"```python\n(\"\"\"My attention kernels.\"\"\".*?)```", README, re.S).group(1)
    pkg = tmp_path / "mykernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "attn.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mykernels", raising=False)
    name = "mykernels.attn:chunked_attention"
    assert f"--variant {name}" in README
    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
    cache = cellcache.InputCache()
    for causal, scenario, heads, kv in ((False, "normal", 2, 2), (True, "padding", 2, 2),
                                        (True, "softcap", 4, 2)):           # declared: GQA and score_mod
        case = grid.Case(name, "cpu", "fp32", 16, 160, 2, heads, causal, scenario, kv)  # 160 > one 128-row block
        rec = runner.run_cell(case, cache, preset, {})
        assert rec["status"] == "ok", rec["reason"]
        assert rec["within_budget"] is True and rec["rel_err"] < 1e-5
        assert rec["leak_max_change"] == (None if scenario == "normal" else 0.0)  # None: nothing is masked
