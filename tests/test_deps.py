"""`audit deps`: what is missing is installed, torch alone first (so nothing resolves a CUDA
build), the large test extras without byte-compiling."""
from __future__ import annotations

from audit.commands import deps


def test_torch_alone_first_then_the_rest_uncompiled_then_what_is_imported_compiled(monkeypatch):
    calls, envs = [], []
    state = {"installed": False}
    monkeypatch.setattr(deps, "install_browser", lambda: None)
    monkeypatch.setattr(deps, "missing", lambda table: [] if state["installed"] else list(table.values()))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")

    def call(argv, **kwargs):
        calls.append(argv)
        envs.append(kwargs.get("env"))
        if len(calls) == 2:
            state["installed"] = True
        return 0
    monkeypatch.setattr(deps.subprocess, "call", call)
    assert deps.install(test=True) == 0
    torch, rest, warm = calls
    assert torch[torch.index("install") + 1:] == ["--quiet", "--no-compile", "torch==2.13.0"]
    rest = rest[rest.index("install") + 1:]
    assert rest[:2] == ["--quiet", "--no-compile"] and "pandas>=2.0" in rest and "pytest-xdist>=3.5" in rest
    assert deps.TEST_REQUIREMENTS["ray"] in rest and deps.TEST_REQUIREMENTS["transformers"] in rest
    # one process imports what the audit and its tests use, with bytecode writing on
    assert warm[1] == "-c" and "'torch'" in warm[2] and "'transformers.modeling_utils'" in warm[2]
    assert "PYTHONDONTWRITEBYTECODE" not in envs[2] and envs[0] is None


def test_the_browser_installs_beside_pip_and_a_failure_is_said(monkeypatch, capsys):
    import threading
    started = threading.Event()
    monkeypatch.setattr(deps, "missing", lambda table: [])

    def browser():
        started.set()
        return "apt-get install chromium failed"
    monkeypatch.setattr(deps, "install_browser", browser)
    assert deps.install(test=True) == 0 and started.is_set()
    assert "it will skip" in capsys.readouterr().err
    started.clear()
    assert deps.install(test=False) == 0 and not started.is_set()       # the audit alone needs no browser


def test_nothing_is_installed_when_everything_imports(monkeypatch, capsys):
    monkeypatch.setattr(deps, "missing", lambda table: [])
    monkeypatch.setattr(deps.subprocess, "call", lambda argv: (_ for _ in ()).throw(AssertionError(argv)))
    assert deps.install() == 0
    assert "nothing to install" in capsys.readouterr().out
