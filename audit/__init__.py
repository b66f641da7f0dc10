"""attn-audit: benchmark and numerically audit attention implementations in PyTorch.

The Python API is the command line's: run, report, compare, merge (audit/commands/), and
load for a run folder's records as a DataFrame. Importing this package imports neither torch
nor pandas; each function does so on call.

Layers, each a subpackage that imports only those listed before it (tests/test_structure.py):
  core      cells and their axes, records, run-folder file names, errors, units, version
  workload  what is measured: presets, input scenarios, variants and plug-ins
  measure   measuring one cell: timing, memory, numerics, float64 golden, ceilings, energy
  plan      predicting cells: cost model and its fit, budget, memory model, shards
  analysis  reading records: findings (with the diagnosis of known mistakes), compare statistics, pytest-benchmark JSON
  render    the report and compare pages (records only: no torch)
  repro     a reproduction script per finding, checked by running it; a shrunk finding's minimal script
  execute   running a grid: runner, supervisor and worker, lock, merge, Ray; shrinking findings
  commands  one module per subcommand: the Python API and what cli.py dispatches to
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from .core.errors import Unsupported
from .core.version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    import pandas as pd

__all__ = ["Unsupported", "__version__", "adapt", "code_version", "compare", "load", "merge", "model", "report",
           "run", "verdict"]


def run(preset: str | None = None, out: "str | Path | None" = None, **options: Any) -> "Path | None":
    """Measure a grid and write its run folder (records, plan, findings, report); returns it.
    options: any `run` option by its flag's name, e.g. seq_len=[128, 256], no_report=True
    (audit.commands.run.run says more)."""
    from .commands.run import run as _run
    return _run(preset, out, **options)


def model(models: "Sequence[str] | None" = None, variants: "Sequence[str] | None" = None,
          dtypes: "Sequence[str] | None" = None, out: "str | Path | None" = None, device: str = "cpu") -> list:
    """Does swapping the attention change the model? Small decoders (transformers, no download) run with
    each variant as their attention in each dtype against float64, layer by layer, on `device` (cpu or
    cuda); returns the records (and writes them, their findings, page and figure to `out`). docs/model.md."""
    from .commands import model as _model
    return _model.model(models or _model.DEFAULT_MODELS, variants or _model.DEFAULT_VARIANTS,
                        dtypes or None, out, device)


def report(run_dir: "str | Path", out: "str | Path | None" = None) -> dict:
    """Rebuild a run folder's findings, figures and index.md/index.html; returns their paths."""
    from .commands.report import report as _report
    return _report(run_dir, out)


def verdict(run_dir: "str | Path", variants: "Sequence[str] | None" = None, *,
            min_speedup: float | None = None) -> dict:
    """Pass or fail per variant of a run folder, with the reasons: {"passed": bool, "variants":
    {name: {"passed", "reasons", ...}}}. A variant fails on an error finding (numerics, gradients,
    the referee's checks) or, with min_speedup, when slower than that against sdpa: the gate of a
    kernel-generation loop (docs/generated-kernels.md; `attn-audit verdict` exits 1 on a failure)."""
    from .commands.verdict import verdict as _verdict
    return _verdict(run_dir, variants, min_speedup=min_speedup)


def compare(a: "str | Path", b: "str | Path", out: "str | Path | None" = None, *,
            fail_on: Sequence[str] = (), noise: float | None = None) -> Any:
    """Compare run A (before) with run B (after) cell by cell and write the comparison's page;
    returns the comparison (its `failed` cells regress beyond a `fail_on` threshold)."""
    from .commands.compare import compare as _compare
    return _compare(a, b, out, fail_on=fail_on, noise=noise)


def merge(out: "str | Path", shard_dirs: "Sequence[str | Path]", *, force: bool = False,
          report: bool = True) -> dict:
    """Combine the run folders of a grid's shards into the run folder `out`; returns its run.json."""
    from .commands.merge import merge as _merge
    return _merge(out, shard_dirs, force=force, report=report)


def adapt(fn: Any, **declaration: Any) -> Any:
    """A plug-in calling a library's attention function `fn` the way it is declared to be called:
    layout, causal alignment, mask forms, argument names (audit.workload.adapt.adapt says which;
    docs/variants.md shows flash-attn's and xFormers')."""
    from .workload.adapt import adapt as _adapt
    return _adapt(fn, **declaration)


def load(run_dir: "str | Path") -> "pd.DataFrame":
    """A run folder's records as a tidy pandas DataFrame (one row per cell)."""
    from .core.records import load as _load
    return _load(run_dir)


def code_version() -> str:
    """The package version, plus the git commit when run from a checkout (run.json's
    `code_version`): the shards of one run must come from the same code (merge checks it)."""
    from .core.version import code_version as _code_version
    return _code_version()
