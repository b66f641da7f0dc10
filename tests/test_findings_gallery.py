"""docs/findings.md: every defect listed has a script that reproduces it alone, and on the pinned torch
each still does (exit 1): when an upgrade fixes one, this test names it.

The audit's own minimal scripts (docs/findings/*-minimal.py) run in every `make test`, but those about a
compile failure (cell_failed-*: Inductor's C++ compiles, 10-40 s each on 2 cores); these and the
hand-written transformers ones run where ATTN_AUDIT_SLOW_FINDINGS=1 (`make test-findings`)."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from audit.commands.deps import REQUIREMENTS
from audit.repro.minimal import MAX_LINES

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = DOCS / "findings.md"
PINNED_TORCH = REQUIREMENTS["torch"].split("==")[1]
SLOW = os.environ.get("ATTN_AUDIT_SLOW_FINDINGS") == "1"
COMPILES_FLEX = ("torch.compile(flex_attention", "flex_attention_forward")   # a script that compiles flex


def _rows() -> list[str]:
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| defect |"))
    return [line for line in lines[start + 2:] if line.startswith("|")]


def _links(row: str) -> list[tuple[str, str]]:
    """(path under docs/, argument) of each script a row's script cell links: its link text may end in the
    case to run."""
    found = re.findall(r"\[([^\]]+)\]\(([^)]+\.py)\)", row.split(" | ")[3])
    return [(path, text.split()[1] if " " in text else "") for text, path in found]


def _scripts() -> list[tuple[str, str]]:
    """Each row's first script."""
    return [_links(row)[0] for row in _rows()]


def test_the_page_lists_at_least_the_five_torch_defects_each_with_a_script_and_a_date():
    rows = _rows()
    assert len(rows) >= 5
    for row in rows:
        cells = row.strip("|").split(" | ")
        assert len(cells) == 6 and re.fullmatch(r"\d{4}-\d\d-\d\d", cells[5].strip()), row
        assert "torch 2." in cells[1]
    for path, _ in _scripts():
        assert (DOCS / path).is_file(), path


def _imports(text: str) -> set[str]:
    tree = ast.parse(text)
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}


def _is_compile_failure(path: str) -> bool:
    """A script about a call failing to compile (cell_failed): seconds of Inductor's C++ compiles each."""
    return Path(path).name.startswith("cell_failed-")


MINIMAL = [(p, a) for p, a in _scripts() if p.endswith("-minimal.py")]
BY_HAND = [(p, a) for row in _rows() for p, a in _links(row) if not p.endswith("-minimal.py")]
SLOW_REASON = ("a compile failure's script, and the hand-written transformers ones, compile for 10-60 s each: "
               "ATTN_AUDIT_SLOW_FINDINGS=1 (make test-findings) runs them")


@pytest.mark.parametrize("path,case", MINIMAL, ids=[p for p, _ in MINIMAL])
def test_each_minimal_script_is_short_in_torch_alone_and_still_shows_its_defect(path, case):
    script = DOCS / path
    text = script.read_text()
    assert len(text.splitlines()) <= MAX_LINES and _imports(text) <= {"os", "sys", "torch"}
    assert (DOCS / path).with_suffix(".md").is_file()                  # its report draft beside it
    if _is_compile_failure(path) and not SLOW:
        pytest.skip(SLOW_REASON)
    _expect_defect(script, case)


@pytest.mark.skipif(not SLOW, reason=SLOW_REASON)
@pytest.mark.parametrize("path,case", BY_HAND, ids=[f"{p}-{a}" for p, a in BY_HAND])
def test_each_hand_written_script_still_shows_its_defect(path, case):
    pytest.importorskip("transformers")
    _expect_defect(DOCS / path, case)


def _expected_exit(text: str) -> int:
    """1 (the defect shows), or for a hand-written script about a crash, the signal its docstring says the
    process dies of ("dies of SIGFPE": -8)."""
    import signal
    crash = re.search(r"dies of (SIG[A-Z]+)", text.split('"""')[1] if text.startswith('"""') else "")
    return -getattr(signal, crash.group(1)) if crash else 1


def _expect_defect(script: Path, case: str) -> None:
    import torch
    from audit.workload.platform_limits import compiled_flex_refusal
    if torch.__version__.split("+")[0] != PINNED_TORCH:
        pytest.skip(f"the gallery's defects are of torch {PINNED_TORCH}; this is {torch.__version__}")
    # a script compiling flex_attention cannot check where Inductor refuses it (ATEN_CPU_CAPABILITY=default:
    # it exits 2), as the audit skips such cells
    text = script.read_text()
    if any(m in text for m in COMPILES_FLEX) and (why := compiled_flex_refusal("cpu")):
        pytest.skip(why)
    ran = subprocess.run([sys.executable, str(script), *([case] if case else [])], capture_output=True, text=True,
                         timeout=600, cwd=script.parent)
    expected = _expected_exit(text)
    assert ran.returncode == expected, \
        f"{script.name} {case}: exit {ran.returncode}, not {expected}\n{ran.stdout[-2000:]}{ran.stderr[-2000:]}"
