"""Shared test inputs."""
from __future__ import annotations

import os
from pathlib import Path

import torch

# What `make test`'s EMULATED_CPUS set to make this machine behave like another CPU kind.
EMULATION_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def emulated_cpu_kind() -> str | None:
    """The other CPU kind this process emulates ("ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"),
    or None when it runs as this machine is."""
    return " ".join(f"{name}={os.environ[name]}" for name in EMULATION_ENV if os.environ.get(name)) or None


def random_qkv(b: int = 1, h: int = 2, tq: int = 16, tk: int = 16, d: int = 8,
               dtype: torch.dtype = torch.float32, seed: int = 0, grad_out: bool = False):
    """Seeded N(0,1) q (B,H,Tq,d), k, v (B,H,Tk,d) and, if asked, an upstream gradient (B,H,Tq,d)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(b, h, tq, d), (b, h, tk, d), (b, h, tk, d)] + ([(b, h, tq, d)] if grad_out else [])
    return tuple(torch.randn(shape, generator=gen).to(dtype) for shape in shapes)


DATA = __import__("pathlib").Path(__file__).resolve().parent / "data"
H200_RUNS = DATA / "h200-2026-11-30"
CPU_RUNS = DATA / "cpu-2026-11-30"
CPU_COMPILE_RUNS = DATA / "cpu-2026-12-01"      # the quick preset with Inductor's cache cold, then warm


def unpack_run(src, dest):
    """A stored run folder (run.json, records.jsonl.gz) unpacked under `dest`; its path."""
    import gzip
    import shutil
    from pathlib import Path

    src = Path(src)
    out = Path(dest) / src.name
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "run.json", out / "run.json")
    with gzip.open(src / "records.jsonl.gz", "rb") as fin, open(out / "records.jsonl", "wb") as fout:
        shutil.copyfileobj(fin, fout)
    return out


def h200_run(name: str, dest):
    """Unpack the shared H200 run folder `name` (full, gc, stab, comp) under `dest`; its path."""
    return unpack_run(H200_RUNS / name, dest)


def cpu_run(name: str, dest):
    """Unpack the stored CPU run folder `name` (cpu, quick; quick-cold, quick-warm; and of 2026-12-04 or
    2026-12-05, "<day>/cpu", "<day>/quick-cold", "<day>/quick-warm", and "2026-12-05/cpu-avx2") under
    `dest`; its path."""
    day, _, folder = name.partition("/")
    if folder:
        return unpack_run(DATA / f"cpu-{day}" / folder, Path(dest) / day)
    return unpack_run((CPU_COMPILE_RUNS if name.startswith("quick-") else CPU_RUNS) / name, dest)


def out_only(variant):
    """A variant's built callable returning out alone: a variant that returns its log-sum-exp
    ((out, lse), Variant.lse_on) gives its out."""
    fn = variant.build()

    def call(*args, **kwargs):
        result = fn(*args, **kwargs)
        return result[0] if isinstance(result, tuple) else result
    return call


def platform_skipped(rec) -> bool:
    """A cell torch refuses on this machine (core.errors.PLATFORM_REFUSALS: compiled flex under
    ATEN_CPU_CAPABILITY=default, CPU flash attention's bf16 packing without the AVX-512 capability):
    skipped with torch's words, as such a cell must be."""
    from audit.core.errors import refused_by_platform
    return rec["status"] == "skipped" and refused_by_platform(rec["reason"])


PLUGINS = Path(__file__).resolve().parent / "plugins"


def run_cells(cases, preset) -> dict:
    """{id: record} of `cases` measured one after another in this process (runner.run_cell, one input
    cache), the test plug-ins (tests/plugins) importable by their module names meanwhile."""
    import sys

    from audit.execute import runner
    from audit.measure.cell import cellcache
    sys.path.insert(0, str(PLUGINS))
    try:
        cache = cellcache.InputCache()
        return {c.id: runner.run_cell(c, cache, preset, {}) for c in cases}
    finally:
        sys.path.remove(str(PLUGINS))


def skip_without_torch_merger() -> None:
    """Skip the calling test, saying why, where this torch has no context-parallel merger. Called in
    the test, not as a skipif mark: the check imports torch.distributed, 0.7 s in every process that
    collects the module (each pytest-xdist worker, each emulated CPU kind)."""
    import pytest
    from audit.workload.merge_functions import torch_merger_available
    why = torch_merger_available()
    if why is not None:
        pytest.skip(why)
