"""Install what is missing, and only that: `audit deps` (add `--test` for what the
tests need too: the optional extras they exercise, Ray and transformers; pytest-xdist; and a Chromium for the
HTML report's browser test, Debian's package where the machine is Debian and this is root).

Each dependency is checked by importing it; importable ones are never touched,
so the project runs unchanged where everything is preinstalled and nothing can
be downloaded (a GPU box without network). torch is installed by pip, first and alone; the
rest by uv, or by pip where uv cannot be had. Standard library only.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from typing import Sequence

# import name -> pip requirement used when it is missing.
# torch is pinned: 2.13.0 is the CPU build these machines install from local disk;
# an unpinned torch would pull a multi-GB CUDA build.
REQUIREMENTS: dict[str, str] = {
    "torch": "torch==2.13.0",
    "pandas": "pandas>=2.0",
    "matplotlib": "matplotlib>=3.7",
    "pytest": "pytest>=7.0",
    "pytest_benchmark": "pytest-benchmark>=4.0",
    "pynvml": "nvidia-ml-py>=12.0",
    "tqdm": "tqdm>=4.60",
}


# what the tests need besides: the optional extras they exercise (`audit deps --test`,
# called by `make test`). Ray: `pip install attn-audit[ray]`, for `run --executor ray`;
# transformers: `pip install attn-audit[hf]`, for the hf: variants (it requires no torch, so the
# installed one stays).
TEST_REQUIREMENTS: dict[str, str] = {
    "ray": "ray>=2.9",
    "transformers": "transformers>=5.0,<6",
    "xdist": "pytest-xdist>=3.5",   # `make test` runs the tests that time nothing on every core
    "hypothesis": "hypothesis>=6.100",   # the command line's property-based tests (tests/test_cli_properties.py)
}

# pip installs without byte-compiling (torch alone has 15k .py files: 31 s with, 10.5 s without,
# on 2 cores of an AMD EPYC), then child processes import what the audit and its tests import,
# with bytecode writing on, so the modules that are ever imported (a tenth of them) get their
# .pyc once, whatever PYTHONDONTWRITEBYTECODE says later (set, every process would compile
# torch's startup modules again: 4.7 s to import it, from 2.0). torch's modules are compiled
# while the rest installs (15 s of the 27 s this takes there, on the other core).
WARM_TORCH_IMPORTS: tuple[str, ...] = (
    "torch", "torch._dynamo", "torch._inductor.compile_fx", "torch.nn.attention.flex_attention",
)
WARM_IMPORTS: tuple[str, ...] = WARM_TORCH_IMPORTS + (
    "numpy", "pandas", "matplotlib.pyplot", "pytest", "pytest_benchmark.plugin", "pynvml", "tqdm.auto",
)
WARM_TEST_IMPORTS: tuple[str, ...] = ("xdist.plugin", "ray", "transformers.modeling_utils",
                                      "transformers.masking_utils", "hypothesis")

# The browsers tests/test_html_browser.py drives, by command name; Debian's package otherwise.
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
DEBIAN_BROWSER = "chromium"


def browser() -> str | None:
    """The first browser of BROWSERS on PATH."""
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def install_browser() -> str | None:
    """Debian's chromium, where no browser is on PATH and apt-get can install it (Debian, root):
    None when a browser is there now, else why not (the browser test then skips, saying so)."""
    if browser():
        return None
    if not os.path.exists("/etc/debian_version") or not shutil.which("apt-get"):
        return "not a Debian machine with apt-get: install Chromium by hand"
    if os.geteuid() != 0:
        return "apt-get needs root: run `apt-get install chromium` as root"
    print(f"attn-audit: installing Debian's {DEBIAN_BROWSER} (for the HTML report's browser test)", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", DEBIAN_BROWSER]
    if subprocess.call(install, env=env, stdout=subprocess.DEVNULL) != 0:     # stale package lists?
        subprocess.call(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
        if subprocess.call(install, env=env, stdout=subprocess.DEVNULL) != 0:
            return f"apt-get install {DEBIAN_BROWSER} failed"
    return None if browser() else f"apt-get installed {DEBIAN_BROWSER}, but no browser is on PATH"


def missing(table: dict[str, str] = REQUIREMENTS) -> list[str]:
    return [req for mod, req in table.items() if importlib.util.find_spec(mod) is None]


HELP = "install what is missing, and only that (torch pinned to the CPU build when absent)"
DESCRIPTION = ("Import each dependency; install those that are missing: torch first and alone, by pip; "
               "the rest by uv (pip-installed first), or by pip where uv cannot be had or fails. "
               "Importable ones are never touched, so a machine without network runs unchanged. "
               "Standard library only: runs before torch or pandas are installed.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--test", action="store_true",
                        help="also what the tests use: ray, transformers, pytest-xdist, and a Chromium "
                             "(Debian's, as root)")


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    return install(test=args.test)


def install(test: bool = False) -> int:
    """Install what is missing (test=True: what the tests need too); 0 when all is importable.
    The browser (Debian's package, for the tests) installs beside pip, in a thread."""
    import threading

    table = {**REQUIREMENTS, **TEST_REQUIREMENTS} if test else REQUIREMENTS
    browser_why: list[str | None] = []
    browser_job = None
    if test:
        browser_job = threading.Thread(target=lambda: browser_why.append(install_browser()), daemon=True)
        browser_job.start()
    try:
        return _pip_install(table, test)
    finally:
        if browser_job is not None:
            browser_job.join()
            if browser_why and browser_why[0]:
                print(f"attn-audit: no browser for the HTML report's browser test ({browser_why[0]}); it will skip",
                      file=sys.stderr)


def _pip_install(table: dict[str, str], test: bool) -> int:
    todo = missing(table)
    if not todo:
        print("attn-audit: all dependencies importable; nothing to install")
        return 0
    print(f"attn-audit: installing {' '.join(todo)}", flush=True)
    # torch first and alone, by pip (which finds the CPU build on local disk through its
    # configuration), so no other package's dependency resolution picks a CUDA build.
    torch_req = [r for r in todo if r.startswith("torch")]
    rest = [r for r in todo if r not in torch_req]
    warming = []
    try:
        if torch_req:
            code = _call_pip(torch_req)
            if code != 0:
                return 1
            # numpy hidden: it may be half-written by the install beside (torch runs without it)
            warming.append(_compile_what_is_imported(WARM_TORCH_IMPORTS, hide=("numpy",)))
        if rest:
            code = _uv_install(rest)
            if code is not None and code != 0:
                print(f"attn-audit: uv could not install {' '.join(rest)} (exit {code}); trying pip", flush=True)
            if code != 0:
                code = _call_pip(rest)
                if code != 0:
                    return 1
        still = missing(table)
        if still:
            print(f"attn-audit: still missing after install: {' '.join(still)}", file=sys.stderr)
            return 1
        warming.append(_compile_what_is_imported(WARM_IMPORTS + (WARM_TEST_IMPORTS if test else ())))
    finally:
        for proc in warming:
            proc.wait()
    return 0


def _pip_argv(requirements: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", *requirements]


def _call_pip(requirements: Sequence[str]) -> int:
    code = subprocess.call(_pip_argv(requirements))
    if code != 0:
        print(f"attn-audit: pip install {' '.join(requirements)} failed (exit {code})", file=sys.stderr)
    return code


# The packages after torch go in through uv where it can be had (pip-installed into this
# environment first): it downloads and unpacks in parallel where pip goes one by one (the test
# extras on 2 cores of an AMD EPYC, PyPI's files not cached: pip 22.5 s, uv 3.9 s plus 2 s to
# install uv). torch is installed by then, so uv keeps it. uv reads no pip configuration: where
# pip's index is a local mirror uv may fail, and pip installs them (the caller's fallback).
UV_REQUIREMENT = "uv>=0.5"


def _uv_install(requirements: Sequence[str]) -> int | None:
    """Install `requirements` with uv, without byte-compiling (uv's default); None when uv
    cannot be had here, else uv's exit code."""
    if not _get_uv():
        return None
    target = ["--python", sys.executable]
    if sys.prefix == sys.base_prefix:              # not a virtual environment: uv wants it said
        target.append("--system")
    return subprocess.call([sys.executable, "-m", "uv", "pip", "install", "--quiet", *target, *requirements])


def _get_uv() -> bool:
    """Whether `python -m uv` works here, pip-installing uv first where it is missing."""
    if importlib.util.find_spec("uv") is None:
        subprocess.call(_pip_argv([UV_REQUIREMENT]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        importlib.invalidate_caches()
    return importlib.util.find_spec("uv") is not None


def _compile_what_is_imported(modules: Sequence[str], hide: Sequence[str] = ()) -> subprocess.Popen:
    """Start a child that imports `modules` once with bytecode writing on: their .pyc are
    written (pip and uv wrote none). `hide`: modules it must not import. Best effort: a module
    that fails to import here fails where it is used."""
    code = "import importlib, sys\nfor m in %r:\n    sys.modules[m] = None\nfor m in %r:\n    try:\n" \
           "        importlib.import_module(m)\n    except Exception:\n        pass\n" % (tuple(hide), tuple(modules))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
