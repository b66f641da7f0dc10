"""Install what is missing, and only that: `python -m audit.bootstrap` (add `--test` for what the
tests need too: the optional extras they exercise, Ray).

Each dependency is checked by importing it; importable ones are never touched,
so the project runs unchanged where everything is preinstalled and nothing can
be downloaded (a GPU box without network). Standard library only.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys

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


# what the tests need besides: the optional extras they exercise (`python -m audit.bootstrap --test`,
# called by `make test`). Ray: `pip install attn-audit[ray]`, for `run --executor ray`.
TEST_REQUIREMENTS: dict[str, str] = {
    "ray": "ray>=2.9",
}


def missing(table: dict[str, str] = REQUIREMENTS) -> list[str]:
    return [req for mod, req in table.items() if importlib.util.find_spec(mod) is None]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    table = {**REQUIREMENTS, **TEST_REQUIREMENTS} if "--test" in args else REQUIREMENTS
    todo = missing(table)
    if not todo:
        print("attn-audit: all dependencies importable; nothing to install")
        return 0
    print(f"attn-audit: installing {' '.join(todo)}", flush=True)
    # torch first and alone, so no other package's dependency resolution picks a CUDA build.
    torch_req = [r for r in todo if r.startswith("torch")]
    rest = [r for r in todo if not r.startswith("torch")]
    for group in (torch_req, rest):
        if group:
            code = subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *group])
            if code != 0:
                print(f"attn-audit: pip install {' '.join(group)} failed (exit {code})", file=sys.stderr)
                return code
    still = missing(table)
    if still:
        print(f"attn-audit: still missing after install: {' '.join(still)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
