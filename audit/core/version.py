"""The code's version: the package version, plus the git commit when run from a checkout.

run.json records it (`code_version`), and merge refuses shards measured by different code.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

__version__ = "0.1.0"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def git_commit(root: Path = PROJECT_ROOT) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def code_version() -> str:
    """The package version, plus the git commit when run from a checkout (run.json's
    `code_version`): the shards of one run must come from the same code (merge checks it)."""
    commit = git_commit()
    return f"{__version__}+git.{commit}" if commit else __version__
