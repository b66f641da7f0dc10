"""`audit deps`: what is missing is installed, torch alone first (so nothing resolves a CUDA
build, and by pip, which knows where the CPU build lies), the rest by uv where it can be had
(else pip), without byte-compiling."""
from __future__ import annotations

from audit.commands import deps


def _record_calls(monkeypatch, codes=None):
    """subprocess.call recorded (argv, env); everything counts as installed after the last
    install call; `codes` gives the exit code of the calls whose argv contains a key."""
    class Calls(list):
        children: list
    calls = Calls()
    state = {"installed": False}
    monkeypatch.setattr(deps, "install_browser", lambda: None)
    monkeypatch.setattr(deps, "missing", lambda table: [] if state["installed"] else list(table.values()))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")

    def call(argv, **kwargs):
        calls.append((argv, kwargs.get("env")))
        code = next((c for key, c in (codes or {}).items() if key in argv), 0)
        if "-c" not in argv and "torch==2.13.0" not in argv and code == 0:
            state["installed"] = True
        return code
    monkeypatch.setattr(deps.subprocess, "call", call)

    class Child:                                    # a warm-up import: waited for before install returns
        def __init__(self, argv, **kwargs):
            calls.append((argv, kwargs.get("env")))
            self.waited = False
            children.append(self)

        def wait(self):
            self.waited = True
    children = []
    monkeypatch.setattr(deps.subprocess, "Popen", Child)
    calls.children = children
    return calls


def _installs(argv):
    return argv[argv.index("install") + 1:]


def test_torch_alone_first_by_pip_then_the_rest_by_uv_then_what_is_imported_compiled(monkeypatch):
    calls = _record_calls(monkeypatch)
    monkeypatch.setattr(deps, "_get_uv", lambda: True)
    assert deps.install(test=True) == 0
    (torch, torch_env), (warm_torch, _), (rest, _), (warm, warm_env) = calls
    assert torch[1:3] == ["-m", "pip"] and _installs(torch) == ["--quiet", "--no-compile", "torch==2.13.0"]
    assert rest[1:4] == ["-m", "uv", "pip"]
    rest = _installs(rest)
    assert rest[:3] == ["--quiet", "--python", deps.sys.executable] and "torch==2.13.0" not in rest
    assert "pandas>=2.0" in rest and "pytest-xdist>=3.5" in rest
    assert deps.TEST_REQUIREMENTS["ray"] in rest and deps.TEST_REQUIREMENTS["transformers"] in rest
    # torch's modules are compiled while the rest installs, without numpy (being installed);
    # then one process imports what the audit and its tests use; both with bytecode writing on
    assert warm_torch[1] == "-c" and "'torch._dynamo'" in warm_torch[2] and "'pandas'" not in warm_torch[2]
    assert "sys.modules[m] = None" in warm_torch[2] and "('numpy',)" in warm_torch[2]
    assert warm[1] == "-c" and "'torch'" in warm[2] and "'transformers.modeling_utils'" in warm[2]
    assert "PYTHONDONTWRITEBYTECODE" not in warm_env and torch_env is None
    assert len(calls.children) == 2 and all(c.waited for c in calls.children)


def test_without_uv_or_when_uv_fails_pip_installs_the_rest(monkeypatch, capsys):
    calls = _record_calls(monkeypatch)
    monkeypatch.setattr(deps, "_get_uv", lambda: False)                # uv cannot be had here
    assert deps.install() == 0
    assert [c[0][1:3] for c in calls] == [["-m", "pip"], ["-c", calls[1][0][2]], ["-m", "pip"],
                                         ["-c", calls[3][0][2]]]
    assert "pandas>=2.0" in _installs(calls[2][0]) and _installs(calls[2][0])[:2] == ["--quiet", "--no-compile"]

    calls = _record_calls(monkeypatch, codes={"uv": 2})                # uv there, but it fails
    monkeypatch.setattr(deps, "_get_uv", lambda: True)
    assert deps.install() == 0
    assert [c[0][1:3] for c in calls[:4]] == [["-m", "pip"], ["-c", calls[1][0][2]], ["-m", "uv"], ["-m", "pip"]]
    assert "uv could not install" in capsys.readouterr().out and "pandas>=2.0" in _installs(calls[3][0])


def test_a_failed_install_stops_with_exit_1_saying_pips_code(monkeypatch, capsys):
    calls = _record_calls(monkeypatch, codes={"torch==2.13.0": 3})
    assert deps.install() == 1 and len(calls) == 1             # a documented code (core.errors), not pip's
    assert "pip install torch==2.13.0 failed (exit 3)" in capsys.readouterr().err


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
