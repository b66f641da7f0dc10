"""`audit deps`: what is missing is installed, torch alone first (so nothing resolves a CUDA
build), the large test extras without byte-compiling."""
from __future__ import annotations

from audit.commands import deps


def test_torch_alone_first_then_the_rest_and_the_large_extras_uncompiled(monkeypatch):
    calls = []
    state = {"installed": False}
    monkeypatch.setattr(deps, "install_browser", lambda: None)
    monkeypatch.setattr(deps, "missing", lambda table: [] if state["installed"] else list(table.values()))

    def call(argv):
        calls.append(argv[argv.index("install") + 1:])
        if len(calls) == 3:
            state["installed"] = True
        return 0
    monkeypatch.setattr(deps.subprocess, "call", call)
    assert deps.install(test=True) == 0
    torch, rest, bare = calls
    assert torch == ["--quiet", "torch==2.13.0"]
    assert "--no-compile" not in rest and "pandas>=2.0" in rest and "pytest-xdist>=3.5" in rest
    assert bare[:2] == ["--quiet", "--no-compile"] and sorted(bare[2:]) == sorted(
        [deps.TEST_REQUIREMENTS["ray"], deps.TEST_REQUIREMENTS["transformers"]])


def test_nothing_is_installed_when_everything_imports(monkeypatch, capsys):
    monkeypatch.setattr(deps, "missing", lambda table: [])
    monkeypatch.setattr(deps.subprocess, "call", lambda argv: (_ for _ in ()).throw(AssertionError(argv)))
    assert deps.install() == 0
    assert "nothing to install" in capsys.readouterr().out
