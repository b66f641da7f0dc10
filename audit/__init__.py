"""attn-audit: benchmark and numerically audit attention implementations in PyTorch.

Importing this package imports neither torch nor pandas; `load` does so on call.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from pathlib import Path

__all__ = ["code_version", "load"]
from .core.version import __version__


def load(run_dir: "str | Path") -> "pd.DataFrame":
    """A run folder's records as a tidy pandas DataFrame (one row per cell)."""
    from .core.records import load as _load
    return _load(run_dir)


def code_version() -> str:
    """The package version, plus the git commit when run from a checkout (core.version)."""
    from .core.version import code_version as _code_version
    return _code_version()
