"""A grid's prediction on this machine, for --dry-run, the budget plan and gpu-check.

The cost model's parameters are the shipped priors refitted on this machine's earlier runs
(costfit), its ceilings are measured here (kept a day in ~/.cache/attn-audit), and its free
memory read here; a device this machine lacks is predicted for the priors' reference machine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.grid import Case
from ..core.paths import cache_dir, reports_root
from ..core.runfolder import RECORDS_FILE, RUN_FILE
from ..measure.machine.roofline import CEILINGS_BUDGET_S, CEILINGS_METHOD, matmul_plausibility
from ..workload.presets import Preset
from .costfit import RunData, fit
from .cell_work import device_type
from .costmodel import CostModel
from .priors import Params, load_priors
from .settings import Settings
from .overhead import host_factor


def this_machine(device_type: str) -> str | None:
    """The name a run's env gives this machine's device (cpu model, or GPU name)."""
    if device_type == "cpu":
        from ..measure.machine.environment import cpu_model
        return cpu_model()
    import torch
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def history(device_names: Mapping[str, str | None], root: Path | None = None, newest: int = 5
            ) -> list[RunData]:
    """Earlier run folders under `root` (default: the reports folder, audit.core.paths) made on this
    machine (same device name), newest first."""
    found = []
    root = reports_root() if root is None else root
    if not root.is_dir():
        return found
    folders = sorted((p for p in root.iterdir() if p.is_dir() and not p.is_symlink()
                      and (p / RUN_FILE).exists() and (p / RECORDS_FILE).exists()),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for folder in folders:
        try:
            env = json.loads((folder / RUN_FILE).read_text()).get("env") or {}
        except (OSError, ValueError):
            continue
        names = {env.get("device_name"), env.get("cpu_model")}
        if any(name and name in names for name in device_names.values()):
            found.append(RunData.load(folder))
        if len(found) >= newest:
            break
    return found


CEILINGS_CACHE_S = 24 * 3600    # a dry-run measures this machine's ceilings again after a day


def machine_ceilings(device: str, dtypes: Sequence[str], name: str | None,
                     measured: dict | None = None, budget_s: float = CEILINGS_BUDGET_S) -> tuple[dict, str]:
    """This machine's ceilings for planning, the same for a dry-run and a run so that both make
    one plan: kept a day in the cache (audit.core.paths; keyed by device name, the measuring method's
    version, torch version, thread count and the CPU capability torch uses), unless a matmul's
    rate is not believable (roofline.matmul_plausibility). Where the cache has none fresh: `measured` (what
    a run just measured for its records), else a measurement now; the cache keeps either.
    A real run's records always use its own measurement (run.json)."""
    import hashlib
    import os
    import time

    import torch

    from ..measure.machine.roofline import measure_ceilings
    key = hashlib.sha1(repr((device, name, CEILINGS_METHOD, torch.__version__, torch.get_num_threads(),
                             torch.backends.cpu.get_cpu_capability(),
                             os.environ.get("ONEDNN_MAX_CPU_ISA"))).encode()).hexdigest()[:16]
    path = cache_dir() / f"ceilings-{key}.json"
    try:
        cached = json.loads(path.read_text())
        fresh = time.time() - path.stat().st_mtime < CEILINGS_CACHE_S
        if fresh and all((cached.get("matmul_flops_per_s") or {}).get(d) for d in dtypes):
            return cached, f"of this machine from {path} (measured {time.ctime(path.stat().st_mtime)})"
    except (OSError, ValueError):
        pass
    if measured and all((measured.get("matmul_flops_per_s") or {}).get(d) for d in dtypes):
        how = "measured by this run"
    else:
        measured, how = measure_ceilings(device, tuple(dtypes), budget_s=budget_s), "measured now"
    doubtful = [why for ok, why in (matmul_plausibility(measured, d) for d in dtypes) if ok is False]
    if doubtful:       # plan with it once, but never keep a ceiling that timed overhead for a day
        return measured, how + " (not cached: " + "; ".join(doubtful) + ")"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(measured))
    except OSError:
        pass
    return measured, how


def warm_compiles(runs: Sequence[RunData], cases: Sequence[Case]) -> set[tuple]:
    """The kernel keys (costmodel.kernel_key) Inductor's on-disk cache holds now, as far as
    earlier runs tell: those compiled by a run with this torch and thread count (a CPU kernel is
    built for one: another count builds anew) into the cache folder this process uses, the
    same folder still (not one wiped and made again since) and holding compiled binaries."""
    from ..measure.machine import compile_cache
    from .costmodel import COMPILED_VARIANTS
    if not any(c.variant in COMPILED_VARIANTS for c in cases):
        return set()
    folder = compile_cache.cache_dir()
    if folder is None or not compile_cache.warm(folder):
        return set()
    import torch
    keys: set[tuple] = set()
    here = (folder, compile_cache.identity(folder), torch.__version__)
    for run in runs:
        if ((run.compile_cache_dir, run.compile_cache_id, run.torch) == here
                and run.threads in (None, torch.get_num_threads())):
            keys |= run.compiled_keys()
    return keys


@dataclass
class Forecast:
    """A grid's prediction on this machine and what it was made from."""

    pred: Any                      # CostModel.predict's frame
    notes: list[str]               # where the parameters, ceilings and memory came from
    params: Params
    ceilings: dict[str, Any]
    free: dict[str, int | None]
    ceilings_measured: bool        # a run of these cells would still measure ceilings
    warm_compiles: set[tuple]      # compiles predicted to hit Inductor's cache (warm_compiles)
    stored_goldens: set[tuple] = frozenset()   # input keys whose reference the golden store holds
    host: float = 1.0              # this host's factor (plan.overhead.host_factor): host-bound constants scale
    model: Any = None              # the CostModel that predicted `pred`: predicting again reuses its cells' own costs
    headers_built: bool = False    # Inductor's precompiled headers built already (compile_cache.headers_built)


def plan(cases: Sequence[Case], preset: Preset, run_dir: Path | None = None, *,
         measure: bool = True, root: Path | None = None) -> Forecast:
    """Predict a grid on this machine, noting where the numbers came from.

    Parameters: the shipped priors, refitted on the records of `run_dir` (a resumed run) and
    of earlier run folders under `root` from this machine. Ceilings, for the devices this
    machine has: machine_ceilings (the cache, else run_dir's run.json, else measured here when
    measure=True); for others run_dir's, else the priors' reference machine's. Free memory:
    this machine's, else the reference machine's. Compiles: a hit in Inductor's cache where
    an earlier run compiled the same code into it (warm_compiles), else a miss.
    """
    from .memory_model import free_bytes

    notes: list[str] = []
    priors = load_priors()
    devices = list(dict.fromkeys(c.device for c in cases))
    available = {}
    for device in devices:
        dev = device_type(device)
        try:
            available[device] = this_machine(dev)
        except Exception:  # noqa: BLE001 - no torch/CUDA: predict for the reference machine
            available[device] = None
    runs = history({d: n for d, n in available.items() if n}, root)
    if run_dir is not None and (Path(run_dir) / RECORDS_FILE).exists():
        runs.insert(0, RunData.load(run_dir))
    runs = list({r.name: r for r in runs}.values())
    params = fit(runs, priors) if runs else priors
    if runs:
        notes.append("parameters refitted on " + ", ".join(r.name for r in runs))
    info = {}
    if run_dir is not None and (Path(run_dir) / RUN_FILE).exists():
        info = json.loads((Path(run_dir) / RUN_FILE).read_text())
    recorded: dict[str, Any] = dict(info.get("ceilings") or {})
    ceilings: dict[str, Any] = {}
    free: dict[str, int | None] = {}
    for device in devices:
        dev = device_type(device)
        ref = params.reference.get(dev) or {}
        if available.get(device):
            free[device] = free_bytes(device)
            if measure or device in recorded:
                dtypes = tuple(dict.fromkeys(c.dtype for c in cases if c.device == device))
                ceilings[device], how = machine_ceilings(device, dtypes, available[device], recorded.get(device),
                                                         preset.ceilings_s)
                notes.append(f"{device}: ceilings {how}")
        else:
            free[device] = ref.get("free_bytes")
            notes.append(f"{device}: not on this machine; predicted for the reference "
                         f"{ref.get('device_name', 'machine')} (its ceilings and memory)")
        if device not in ceilings and (recorded.get(device) or ref.get("ceilings")):
            ceilings[device] = recorded.get(device) or ref["ceilings"]
    warm = warm_compiles(runs, cases)
    if warm:
        notes.append(f"{len(warm)} compiled shapes predicted from Inductor's cache (compiled there by earlier runs)")
    stored = stored_goldens(cases, [d for d in devices if available.get(d)])
    if stored:
        notes.append(f"{len(stored)} input sets' float64 references predicted read from the golden store")
    earlier = [r.ceilings for r in runs if any(isinstance(c, dict) and c.get("host_probe_s")
                                               for c in (r.ceilings or {}).values())]
    host = host_factor(ceilings, earlier)
    if host != 1.0:
        notes.append(f"this host does the audit's own work at {host:.2f}x the reference host's time (host probe"
                     + (f", the median with {len(earlier)} earlier runs')" if earlier else ")"))
    model = CostModel(params, host=host)
    headers = _headers_built(cases)
    if headers:
        notes.append("Inductor's precompiled headers are built already: the first compile does not build them")
    pred = model.predict(cases, Settings.of_preset(preset), ceilings, free, warm, stored, headers_built=headers)
    return Forecast(pred, notes, params, ceilings, free, not info.get("ceilings"), warm, stored, host, model, headers)


def _headers_built(cases: Sequence[Case]) -> bool:
    """Whether the grid compiles on this machine's CPU and Inductor's precompiled headers are built already
    (its first compile then does not build them: compile_cache.headers_built)."""
    from ..measure.machine import compile_cache
    from .costmodel import COMPILED_VARIANTS
    return (any(c.variant in COMPILED_VARIANTS and device_type(c.device) == "cpu" for c in cases)
            and compile_cache.headers_built())


def stored_goldens(cases: Sequence[Case], devices: Sequence[str]) -> set[tuple]:
    """The input keys of `cases` on this machine's `devices` whose float64 reference the golden store
    holds (measure.golden.golden_store), in the alignment their cells' golden follows."""
    from ..measure.golden import golden_store
    from ..workload.inputs import q_len
    from ..workload.variants import builtin_variants
    if golden_store.max_bytes() <= 0 or not golden_store.folder().is_dir():
        return set()
    builtins = builtin_variants()
    found: set[tuple] = set()
    for case in cases:
        if case.device not in devices or case.input_key in found:
            continue
        alignment = "top-left"
        if case.causal and q_len(case) != case.seq_len:
            alignment = getattr(builtins.get(case.variant), "causal_alignment", "top-left")
        if golden_store.has(golden_store.entry_key(case.input_key, alignment, case.device)):
            found.add(case.input_key)
    return found
