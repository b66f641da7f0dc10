"""README and docs/ stay true to the code: every column, option, scenario and variant is
documented on its page, README stays short and leads to every page, every link between
the pages resolves, and the plug-in example file in docs/variants.md works as written."""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import pytest

from audit import cli
from audit.core import columns, grid, records
from audit.workload import inputs, presets, variants

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = {path.name: path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md"))}
DOCS = "\n".join([README, *PAGES.values()])
README_MAX_BYTES = 10_000


def test_readme_is_short_and_leads_to_every_page():
    """What a newcomer reads first: at most 10 KB, the two set-up commands, and a link to
    every page of docs/."""
    assert len(README.encode("utf-8")) <= README_MAX_BYTES
    assert "make audit" in README and "make test" in README
    assert len(PAGES) >= 8
    missing = [name for name in PAGES if f"](docs/{name})" not in README]
    assert not missing, f"README links no docs page {missing}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    body = re.sub(r"```.*?```", "", text, flags=re.S)          # a `# comment` in code is no heading
    return {_anchor(h) for h in re.findall(r"(?m)^#{1,6} (.*)$", body)}


def broken_links(pages: dict[str, str], readme: str) -> list[str]:
    """"page: target" for every relative Markdown link whose file or heading is missing."""
    texts = {f"docs/{name}": text for name, text in pages.items()}
    texts["README.md"] = readme
    found = []
    for page, text in texts.items():
        folder = Path(page).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", text, flags=re.S)):
            if re.match(r"[a-z]+:", target):
                continue                                          # http(s):, mailto:
            path, _, anchor = target.partition("#")
            file = (folder / path).as_posix() if path else page
            file = str(Path(file)).replace("docs/../", "")
            if file not in texts and not (ROOT / file).exists():
                found.append(f"{page}: {target}")
            elif anchor and file in texts and anchor not in _anchors(texts[file]):
                found.append(f"{page}: {target}")
    return found


def test_every_link_between_the_pages_resolves():
    assert not broken_links(PAGES, README)


def test_every_docs_page_the_code_names_exists():
    """--help texts, messages and comments send the reader to docs/PAGE.md: each page exists."""
    named = set()
    for path in [*ROOT.glob("audit/**/*.py"), ROOT / "Makefile", ROOT / "pyproject.toml"]:
        named |= set(re.findall(r"docs/([a-z-]+\.md)", path.read_text(encoding="utf-8")))
    assert named, "no docs page named in the code: the pattern is broken"
    assert sorted(named - set(PAGES)) == []


def test_a_broken_link_is_found():
    pages = {"a.md": "# A\n\n## Two words\n\n[ok](b.md#b) [ok](#two-words) [bad](b.md#nowhere) [bad](c.md)\n",
             "b.md": "# B\n"}
    assert broken_links(pages, "[ok](docs/a.md) [bad](docs/z.md)") == [
        "docs/a.md: b.md#nowhere", "docs/a.md: c.md", "README.md: docs/z.md"]


def test_the_schema_history_has_every_version():
    history = PAGES["output.md"].split("## Schema history", 1)[1]
    assert f"now {records.SCHEMA_VERSION}" in PAGES["output.md"]
    for version in range(1, records.SCHEMA_VERSION + 1):
        assert f"\n| {version} |" in history, version


@pytest.mark.parametrize("column", list(columns.COLUMNS))
def test_every_record_column_documented(column):
    assert f"| `{column}` |" in PAGES["output.md"]


def _options() -> list[tuple[str, str]]:
    """(command, option) for every option of every subcommand."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return [(command, opt) for command, sub_parser in sub.choices.items() for action in sub_parser._actions
            for opt in action.option_strings
            if opt.startswith("--") and opt != "--help" and action.help != argparse.SUPPRESS]


@pytest.mark.parametrize("command, option", _options())
def test_every_option_documented(command, option):
    assert f"`{option}" in DOCS


@pytest.mark.parametrize("option", [opt for command, opt in _options() if command == "compare"])
def test_every_compare_option_documented(option):
    """In the options table of docs/compare.md."""
    assert f"| `{option}" in PAGES["compare.md"]


@pytest.mark.parametrize("scenario", list(inputs.SCENARIOS))
def test_every_scenario_documented(scenario):
    assert f"`{scenario}`" in PAGES["scenarios.md"]


@pytest.mark.parametrize("name", list(variants.builtin_variants()))
def test_every_variant_documented(name):
    assert f"`{name}`" in PAGES["variants.md"]


def test_readme_plugin_example_runs(tmp_path, monkeypatch):
    """The complete plug-in file in docs/variants.md, saved as written, audits a cell correctly."""
    from audit.execute import runner
    from audit.measure.cell import cellcache

    code = re.search(r"```python\n(\"\"\"My attention kernels.\"\"\".*?)```", PAGES["variants.md"], re.S).group(1)
    pkg = tmp_path / "mykernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "attn.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mykernels", raising=False)
    name = "mykernels.attn:chunked_attention"
    assert f"--variant {name}" in PAGES["variants.md"]
    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
    cache = cellcache.InputCache()
    for causal, scenario, heads, kv in ((False, "normal", 2, 2), (True, "padding", 2, 2),
                                        (True, "softcap", 4, 2)):           # declared: GQA and score_mod
        case = grid.Case(name, "cpu", "fp32", 16, 160, 2, heads, causal, scenario, kv)  # 160 > one 128-row block
        rec = runner.run_cell(case, cache, preset, {})
        assert rec["status"] == "ok", rec["reason"]
        assert rec["within_budget"] is True and rec["rel_err"] < 1e-5
        assert rec["leak_max_change"] == (None if scenario == "normal" else 0.0)  # None: nothing is masked


def test_every_known_mistake_documented():
    from audit.workload.backward_mistakes import BACKWARD_MISTAKES
    from audit.workload.lse_mistakes import all_lse_mistakes
    from audit.workload.merge_mistakes import MERGE_MISTAKES
    from audit.workload.mistakes import MISTAKES
    from audit.workload.paged_mistakes import PAGED_MISTAKES
    missing = [name for name in [*MISTAKES, *BACKWARD_MISTAKES, *all_lse_mistakes(), *PAGED_MISTAKES,
                                                 *MERGE_MISTAKES]
               if f"| `{name}` |" not in PAGES["numerics.md"]]
    assert not missing, f"docs/numerics.md's Diagnosis tables lack {missing}"
