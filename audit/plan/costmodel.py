"""Predict each cell's wall time, phase by phase, before measuring anything.

A cell's time is made of phases the runner goes through (measurement.measure_cell):

- setup:    per-cell overhead (build, record, bookkeeping); the first cell of a run
            also pays for starting the device, and a variant's first cell for its
            backend's initialization;
- golden:   once per input set: the float64 golden (chunks of query rows over the
            golden's slices), the same-dtype baseline; plus, for variants that expose
            their weights, the float64 probabilities their saturation is checked against;
- compile:  compiled variants, once per shapes, dtype, causal flag and mask kind; a cache
            hit (Inductor's on-disk cache holds the code) costs a fraction of a miss;
- warmup:   two forward and two forward+backward calls;
- numerics: one call of each for memory and numerics, and the leak-probe forwards;
- timed:    the timed samples, as timing.measure / measure_device take them;
- energy:   CUDA speed cells: the NVML energy window.

Per-call times come from the cell's FLOPs and bytes over the machine's measured
ceilings (run.json: ceilings), with per-variant factors fitted from records:
t = c0 + a·F/P_dtype + b·F/P_fp32 + m·S·size/BW, F the forward FLOPs, S the score
elements B·H·Tq·Tk, P the measured matmul FLOP/s, BW the copy bandwidth. Because the
factors multiply this machine's own ceilings, a model fitted on one machine predicts
another from its ceilings. The other constants (per-cell overhead, golden cost per
chunk and per FLOP, compile and initialization times) are fitted from records' elapsed_s.

The fitted constants and the shipped priors (cost_priors.json, fitted on the shared H200 records
and CPU runs): priors.py; costfit.fit refits them from any run folders, and forecast.plan predicts
a grid on this machine with them.
Pure Python + numpy + pandas: nothing here imports torch.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from ..core.grid import AXES, Case
from ..measure.golden.numerics import BACKWARD_FLOP_FACTOR, attention_flops
from ..measure.machine.energy import MAX_WALL_S as ENERGY_MAX_WALL_S, MIN_QUEUED_S as ENERGY_QUEUED_S
from ..measure.machine.timing import (HOLD_EXTRA_S, HOLD_MARGIN, MAX_DEVICE_BLOCK, MAX_SAMPLES, MIN_BLOCK_S,
                                      min_block_for)
from ..workload.inputs import invariance_applies
from ..workload.variant_contract import BROKEN_PREFIX
from ..workload.variants import builtin_variants
from .cell_shape import (CellShape, call_features, cudnn_config, exposes_weights, golden_cost_inputs,
                         N_CALL_FEATURES)
from .cell_work import (REFEREE_CALLS, REFUSAL_S, argument_compile_default_s, argument_compile_keys, argument_probes,
                        refusal_probes, call_variant, compile_key, kernel_key, shards_seconds, start_state,
                        checks_calls, declared_refusal, device_type, invariance_compile_keys, leak_probe_count,
                        masked_rows_checked, paged_call, predicted_unsupported, returns_lse, tensor_elems)
from .priors import (BACKWARD_DEFAULT_FACTOR, DIAGNOSIS_DEFAULT_S, DIAGNOSIS_FLOPS_PER_S, FAMILY_DEFAULTS, HEADERS_BUILD_S,
                     HOST_BOUND, HOST_BOUND_RATES, HOST_CALL_DEFAULT_S, NOISE_SHARE_DEFAULT, REFEREE_DEFAULT_S, Params, load_priors)
from .settings import Settings

PHASES: tuple[str, ...] = ("setup", "golden", "compile", "warmup", "numerics", "timed", "energy")
# The variants whose code is compiled per shape: the built-ins declaring it (Variant.compiled), and
# transformers' flex_attention (a plug-in's or an hf: name's compiling is not known before it runs).
COMPILED_VARIANTS: tuple[str, ...] = tuple(n for n, v in builtin_variants().items() if v.compiled) + (
    "hf:flex_attention",)
NO_CPU_BACKWARD = ("flex", "hf:flex_attention")   # FlexAttention: forward only on the CPU
ENERGY_EDGE_WAIT_S = 0.1     # waiting for two energy-counter updates (20-100 ms apart)
TOO_SLOW = "too slow for this device (--max-cell-s)"   # a predicted status's reason: the runner's rule, predicted


# --------------------------------------------------------------------------- a cell's parts

def diagnosis_flops(shape: "CellShape") -> float:
    """Float64 FLOPs of one cell's diagnosis: every registered mistake's forward over the
    diagnosis slices (the cell's (batch, head) slices, capped by the FLOP budget, at least one)."""
    from ..measure.diagnosis.diagnosis import DIAGNOSIS_FLOP_BUDGET
    from ..workload.mistakes import MISTAKES
    case = shape.case
    per_slice = attention_flops(1, 1, shape.q_len, case.seq_len, case.d_k, causal=False, d_v=case.effective_d_v)
    budget = DIAGNOSIS_FLOP_BUDGET[device_type(case.device)]
    slices = max(1, min(case.batch * case.heads, int(budget // max(1, per_slice))))
    return float(len(MISTAKES) * slices * per_slice)


def _family(variant: str) -> str:
    variant = {"hf:sdpa": "sdpa", "hf:flex_attention": "flex"}.get(variant, variant)
    if variant.startswith("sdpa") or variant in ("flex", "compiled[fused]"):
        return "eager" if variant == "sdpa_math" else "fused"
    if variant.startswith("compiled"):
        return "compiled"
    return "eager"


def timed_wall_s(t: float, settings: Settings, *, device_timing: bool, host_call_s: float,
                 synced: bool = False) -> float:
    """Wall time of one measurement (timing.measure / measure_device) of a call taking t seconds
    (`synced`: host-timed with a device sync per block, CUDA without device timing)."""
    if t <= 0:
        return 0.0
    if device_timing:
        block = min(MAX_DEVICE_BLOCK, max(1, math.ceil(MIN_BLOCK_S / t)))
        per_sample = HOLD_MARGIN * block * host_call_s + HOLD_EXTRA_S + block * t   # the spin, then the block
    else:
        block = max(1, math.ceil(min_block_for(synced) / t))
        per_sample = block * t
    n = min(MAX_SAMPLES, max(settings.min_samples, math.ceil(settings.min_time_s / per_sample)))
    return n * per_sample


def energy_wall_s(t_fwd: float, settings: Settings) -> float:
    """The energy window's wall time (machine.cell_energy.telemetry, EnergyMeter.measure)."""
    w = settings.energy_window_s
    if w <= 0:
        return 0.0
    if settings.energy == "window":          # schema 2: a fixed window of repeated calls
        return max(w, t_fwd) * 1.03
    if t_fwd < 2e-3:       # graph capture, then replays between two counter updates, then the queue draining
        return min(ENERGY_MAX_WALL_S, w + ENERGY_EDGE_WAIT_S) + 3 * t_fwd + 2e-3 + ENERGY_QUEUED_S
    return ENERGY_EDGE_WAIT_S + max(w, t_fwd) + 2 * t_fwd


# --------------------------------------------------------------------------- prediction

def _amortize(rows: list[dict], memberships: list[list[tuple]], paid: dict[tuple, float]) -> None:
    """Each row's amortized_s (its own seconds plus its share of every shared cost it takes part
    in, split over the ok cells sharing it) and shares (what it would pay alone: each shared cost
    by what shares it)."""
    members: dict[tuple, int] = {}
    for row, groups in zip(rows, memberships):
        for group in groups:
            members[group] = members.get(group, 0) + (row["status"] == "ok")
    for row, groups in zip(rows, memberships):
        row["amortized_s"] = row["total_s"] - row["shared_s"] + sum(
            paid.get(g, 0.0) / max(1, members[g]) for g in groups)
        row["shares"] = tuple((g, paid[g]) for g in groups if paid.get(g))


@dataclass
class _Walk:
    """What predict() carries from one cell to the next, in run order: what the run has done so far
    (devices started, variants initialized, references built, compiles) and the shared costs paid."""

    stored: set[tuple]      # input keys whose reference the golden store holds (read back, not built)
    kernels: set[tuple]     # kernel_key()s in Inductor's cache, growing as the run compiles
    built: set[tuple] = field(default_factory=set)    # input sets this walk built a reference for (stored if worth it)
    previous_key: tuple | None = None                 # the input set of the last reference built or read
    started: set[str] = field(default_factory=set)    # device types whose start-up is paid
    seen_variants: set[tuple[str, str]] = field(default_factory=set)   # (device type, variant) initialized
    compiled_keys: set[tuple] = field(default_factory=set)             # compile_key()s compiled, probes' too
    compiling_started: set[str] = field(default_factory=set)           # device types whose compiler started
    headers_built: bool = False     # Inductor's precompiled C++ headers built already (compile_cache.headers_built)
    cudnn_configs: set[tuple] = field(default_factory=set)             # cudnn_config()s met
    paid: dict[tuple, float] = field(default_factory=dict)    # shared costs by what shares them (for amortized_s)
    memberships: list[list[tuple]] = field(default_factory=list)   # per row: the groups it shares costs with
    rows: list[dict] = field(default_factory=list)


@dataclass
class _CellParts:
    """A cell's prediction that the cells before it do not change (CostModel._cell_parts)."""

    shape: CellShape
    axes: dict[str, Any]
    unsupported: str | None            # why the cell is predicted not to run, or None
    golden_s: float                    # its input set's golden, if built
    oom: str | None                    # why it cannot fit in the device's free memory, or None
    t_f: float = 0.0                   # one forward call
    t_fb: float = 0.0                  # one forward and backward (0: none)
    too_slow: bool = False             # over the per-cell limit
    phases: dict[str, float] = field(default_factory=dict)   # warmup, numerics, timed, energy (ok cells)


class CostModel:
    """Per-call times and per-phase constants; predict() walks a grid in run order.

    host: this host's factor (plan.overhead.host_factor: how many times slower than the reference
    host it does the audit's own work): the HOST_BOUND constants are multiplied by it."""

    def __init__(self, params: Params | None = None, host: float = 1.0) -> None:
        self.params = params or load_priors()
        self.host = host
        self._parts: dict[tuple, tuple[Any, _CellParts]] = {}   # _cell_parts' memo: (key, (its ceilings, parts))

    def _call_factors(self, dev: str, variant: str, dtype: str, pass_: str) -> np.ndarray:
        """Fitted for this dtype, else for the variant's other dtypes, else the family default."""
        p = self.params.call
        for key in (f"{dev}|{variant}|{dtype}|{pass_}", f"{dev}|{variant}|*|{pass_}"):
            if key in p:      # (factors fitted before the attention feature: 0 on it)
                return np.pad(np.array(p[key], dtype=float), (0, N_CALL_FEATURES - len(p[key])))
        base = np.array(FAMILY_DEFAULTS[dev][_family(variant)])
        return base * BACKWARD_DEFAULT_FACTOR if pass_ == "fwd_bwd" else base

    def call_s(self, shape: CellShape, pass_: str, ceilings: Mapping[str, Any] | None) -> float:
        dev = device_type(shape.case.device)
        factors = self._call_factors(dev, call_variant(shape), shape.case.dtype, pass_)
        return float(max(1e-6, factors @ call_features(shape, ceilings)))

    def _scaled(self, table: str, value: float) -> float:
        """A constant of `table` in this host's seconds (HOST_BOUND: times its factor; a rate: divided)."""
        if table in HOST_BOUND:
            return value * self.host
        if table in HOST_BOUND_RATES:
            return value / self.host
        return value

    def _const(self, table: str, key: str, default: float) -> float:
        """The fitted constant (else `default`, in the reference host's units) on this host."""
        return self._scaled(table, float(getattr(self.params, table).get(key, default)))

    def _by_cache(self, table: str, key: str, cache: str, default: float) -> float:
        """A compile constant fitted for this cache outcome ("key|hit", "key|miss"), else for
        compiles of unknown outcome (records before schema 5), else the default."""
        fitted = getattr(self.params, table)
        return self._scaled(table, float(fitted.get(f"{key}|{cache}", fitted.get(key, default))))

    def _compile_start(self, dev: str, cache: str, headers_built: bool) -> float:
        """The compiler's start on this host, for a first compile of this cache outcome (cell_work.start_state):
        fitted for its state; a build with the precompiled headers built already, where no run fitted that,
        as one with them to build less HEADERS_BUILD_S (at least a hit's start)."""
        state = start_state(cache, "built" if headers_built and dev == "cpu" else None)
        fitted = self.params.compile_start_s
        if state in ("hit", "miss") or f"{dev}|{state}" in fitted:
            return self._by_cache("compile_start_s", dev, state, 2.0)
        building = float(fitted.get(f"{dev}|miss", fitted.get(dev, 2.0)))
        return self._scaled("compile_start_s", max(float(fitted.get(f"{dev}|hit", 0.0)), building - HEADERS_BUILD_S))

    def predict(self, cases: Sequence[Case], settings: Settings,
                ceilings: Mapping[str, Any] | None = None,
                free_bytes: Mapping[str, int | None] | None = None,
                warm_compiles: Collection[tuple] = (), stored_goldens: Collection[tuple] = (),
                headers_built: bool = False) -> "Any":
        """One row per cell, in the given (run) order: predicted status and seconds per phase.

        ceilings: {device: measure_ceilings(...)} (run.json), used for per-call times;
        free_bytes: {device: bytes free}, for the cells memory_model predicts cannot fit;
        warm_compiles: kernel_key()s whose kernels Inductor's on-disk cache holds (a compile
        there is a cache hit, much cheaper than building them: audit.measure.machine.compile_cache);
        stored_goldens: the input keys (Case.input_key) whose reference the golden store holds
        (audit.measure.golden.golden_store: read back, not built);
        headers_built: Inductor's precompiled C++ headers are built already (compile_cache.headers_built: the
        run's first CPU compile does not build them).
        """
        import pandas as pd

        walk = _Walk(stored=set(stored_goldens), kernels=set(warm_compiles), headers_built=headers_built)
        for case in cases:
            ceil = (ceilings or {}).get(case.device) or (ceilings or {}).get(device_type(case.device))
            walk.rows.append(self._cell_row(case, settings, ceil, (free_bytes or {}).get(case.device), walk))
        columns = ["id", *AXES, "status", "reason", "fwd_s", "fwd_bwd_s", *PHASES, "total_s",
                   "shared_s", "amortized_s", "shares"]
        _amortize(walk.rows, walk.memberships, walk.paid)
        return pd.DataFrame(walk.rows, columns=columns)

    def _cell_parts(self, case: Case, settings: Settings, ceil: Mapping[str, Any] | None,
                    free: int | None) -> "_CellParts":
        """What a cell costs whatever ran before it: its shape, its calls' times, its own phases, its
        golden if built, whether it fits in `free` bytes. Kept per model (case, settings, free bytes and
        the ceilings' object: they and the model's params and host factor decide it): the budget's
        bisection predicts the same cells some thirty times (a cpu-preset dry run spent 8.6 of its 11 s
        walking them again)."""
        from .memory_model import too_big

        key = (case, settings, id(ceil), free)
        hit = self._parts.get(key)
        if hit is not None and hit[0] is ceil:
            return hit[1]
        shape = CellShape.of(case)
        dev = device_type(case.device)
        unsupported = predicted_unsupported(case, shape)
        parts = _CellParts(shape=shape, axes=case.axes(), unsupported=unsupported,
                           golden_s=self._golden_s(shape, settings), oom=too_big(case, shape.q_len, free))
        if not unsupported:
            t_f = self.call_s(shape, "fwd", ceil)
            backward = not (case.variant in NO_CPU_BACKWARD and dev == "cpu") and not paged_call(case)
            t_fb = self.call_s(shape, "fwd_bwd", ceil) if backward else 0.0
            n_timed = settings.min_samples + 1
            limit_s = math.inf if settings.max_cell_s is None else settings.max_cell_s
            too_slow = t_f * (1 + BACKWARD_FLOP_FACTOR) * n_timed > limit_s or (t_f + t_fb) * n_timed > limit_s
            parts = dataclasses.replace(parts, t_f=t_f, t_fb=t_fb, too_slow=too_slow)
            if too_slow:
                parts.phases["warmup"] = 2 * t_f + (2 * t_fb if t_f * 3.5 * n_timed <= limit_s else 0)
            else:
                parts.phases["warmup"] = self._warmup_s(dev, settings, t_f, t_fb)
                parts.phases["numerics"] = self._numerics_s(shape, settings, t_f, t_fb)
                if settings.invariance and not self.params.checks_call.get(dev):   # (fitted: in checks_calls)
                    batch, chunk = invariance_applies(case)
                    parts.phases["numerics"] += (t_f / case.batch if batch else 0.0) + (t_f if chunk else 0.0)
                parts.phases["timed"], parts.phases["energy"] = self._timed_and_energy_s(case, settings, t_f, t_fb)
        self._parts[key] = (ceil, parts)
        return parts

    def _cell_row(self, case: Case, settings: Settings, ceil: Mapping[str, Any] | None, free: int | None,
                  walk: "_Walk") -> dict[str, Any]:
        """One cell's row, after the cells before it in `walk`: the shared costs it is the first to
        need (the device's start-up, the variant's initialization, its input set's golden, compiles,
        a cuDNN configuration) are its own, and paid into the walk. ceil: its device's ceilings;
        free: its device's free bytes (None: unknown)."""
        parts = self._cell_parts(case, settings, ceil, free)
        shape = parts.shape
        dev = device_type(case.device)
        phases = dict.fromkeys(PHASES, 0.0)
        phases["setup"] = self._const("cell_s", dev, 0.05)
        shared = 0.0    # paid once for many cells, by whichever comes first (start-up, golden, compile)
        groups = [("device", dev), ("variant", dev, case.variant), ("inputs", case.input_key)]
        walk.memberships.append(groups)
        if dev not in walk.started:
            walk.started.add(dev)
            shared += walk.paid.setdefault(groups[0], self._const("run_start_s", dev, 0.0))
        oom = parts.oom
        if oom:
            phases["setup"] += shared
            return self._row(parts, "oom", oom, phases, shared_s=shared)
        if (dev, case.variant) not in walk.seen_variants:
            walk.seen_variants.add((dev, case.variant))
            shared += walk.paid.setdefault(groups[1], self._const("init_s", f"{dev}|{case.variant}", 0.0))
        if case.input_key != walk.previous_key and not declared_refusal(case):   # (refused first: no inputs drawn)
            walk.previous_key = case.input_key
            phases["golden"] += self._golden_or_read_s(shape, settings, walk, parts.golden_s)
            walk.paid[groups[2]] = walk.paid.get(groups[2], 0.0) + phases["golden"]
        if parts.unsupported:
            phases["setup"] = self._const("skip_s", dev, 0.002) + shared
            return self._row(parts, "skipped", parts.unsupported, phases, shared_s=shared + phases["golden"])
        t_f, t_fb = parts.t_f, parts.t_fb
        if case.variant in COMPILED_VARIANTS:
            phases["compile"] = self._compiles(shape, settings, groups, walk)
            shared += phases["compile"]
        if parts.too_slow:
            phases["warmup"] = parts.phases["warmup"]
            phases["setup"] += shared - phases["compile"]
            return self._row(parts, "skipped", TOO_SLOW, phases, t_f, t_fb, shared_s=shared + phases["golden"])
        config = cudnn_config(shape)
        if config is not None:
            groups.append(("cudnn", config))
        if config is not None and config not in walk.cudnn_configs:
            walk.cudnn_configs.add(config)
            shared += walk.paid.setdefault(groups[-1], self._const("cudnn_config_s", dev, 0.0))
        phases["setup"] += shared - phases["compile"]
        phases.update(parts.phases)
        return self._row(parts, "ok", None, phases, t_f, t_fb, shared_s=shared + phases["golden"])

    def _warm_ratio(self, dev: str, variant: str) -> float:
        """A compile read from Inductor's cache over one built anew: a warm cell's argument probes (cached
        with it) cost their default times this."""
        return (self._by_cache("compile_s", f"{dev}|{variant}", "hit", 3.0)
                / max(1e-9, self._by_cache("compile_s", f"{dev}|{variant}", "miss", 3.0)))

    def _compiles(self, shape: CellShape, settings: Settings, groups: list[tuple], walk: "_Walk") -> float:
        """A compiled variant's cell: the seconds of the compiles it is the first to need (its shape's, the
        compiler's start, the invariance and argument probes'), each a shared cost of its group; the groups
        it shares go into `groups`, the run's compiles into the walk."""
        case, dev, variant = shape.case, device_type(shape.case.device), call_variant(shape)
        key = compile_key(shape)
        groups += [("compiler", dev), ("compile", key)]
        seconds = 0.0
        warm = self._warm_ratio(dev, variant) if kernel_key(shape) in walk.kernels else None   # its probes' too
        if key not in walk.compiled_keys:
            walk.compiled_keys.add(key)
            cache = "hit" if kernel_key(shape) in walk.kernels else "miss"
            walk.kernels.add(kernel_key(shape))
            seconds = walk.paid.setdefault(groups[-1], self._by_cache("compile_s", f"{dev}|{variant}", cache, 3.0))
            if dev not in walk.compiling_started:              # the run's first compile also starts the compiler
                walk.compiling_started.add(dev)
                seconds += walk.paid.setdefault(groups[-2], self._compile_start(dev, cache, walk.headers_built))
        extras = [(k, "compile_s", variant, "miss", 3.0)      # once per run each: the invariance calls' shapes
                  for k in (invariance_compile_keys(key, case) if settings.invariance else ())]
        extras += [(k, "argument_compile_s", f"{case.variant}|{k[-1]}", "miss" if warm is None else "hit",
                    argument_compile_default_s(case.variant, k[-1]) * (1.0 if warm is None else warm))
                   for k in (argument_compile_keys(case) if settings.arguments else ())]   # the probes' recompiles
        for extra, table, name, cache_state, default in extras:
            groups.append(("compile", extra))              # shared by every cell needing it, paid by the first
            if extra not in walk.compiled_keys:
                walk.compiled_keys.add(extra)
                seconds += walk.paid.setdefault(groups[-1],
                                                self._by_cache(table, f"{dev}|{name}", cache_state, default))
        return seconds

    def _timed_and_energy_s(self, case: Case, settings: Settings, t_f: float, t_fb: float) -> tuple[float, float]:
        """The timed samples of both passes (CUDA events or the host clock, with the host's own cost
        per call), and on CUDA speed cells (scenario normal) the energy window."""
        dev = device_type(case.device)
        device_timing = dev == "cuda" and settings.timing == "device"
        host = self._const("host_call_s", f"{dev}|{case.variant}", HOST_CALL_DEFAULT_S[dev])
        synced = dev == "cuda"
        timed = (timed_wall_s(t_f, settings, device_timing=device_timing, host_call_s=host, synced=synced)
                 + timed_wall_s(t_fb, settings, device_timing=device_timing, host_call_s=2.5 * host, synced=synced))
        if settings.noise_cap_s:     # sampling on until the median is known: this machine's usual share of the cap
            passes = (t_f > 0) + (t_fb > 0)
            timed += passes * settings.noise_cap_s * self._const("noise_share", dev, NOISE_SHARE_DEFAULT[dev])
        energy = energy_wall_s(t_f, settings) if dev == "cuda" and case.scenario == "normal" else 0.0
        return timed, energy

    def noise_s(self, pred: Any, settings: Settings) -> tuple[float, dict[str, float]]:
        """(seconds of sampling beyond the minimum over these predicted cells' ok rows, {device kind:
        the share of the cap one measurement uses; "cpu (default)" where no run of this machine fitted
        it}): what this machine's noise costs a run (in `timed`), for the plan's line."""
        if not settings.noise_cap_s or pred is None or not len(pred):
            return 0.0, {}
        ok = pred[pred["status"] == "ok"]
        share = {dev: self._const("noise_share", dev, NOISE_SHARE_DEFAULT[dev])
                 for dev in set(map(device_type, ok["device"]))}
        passes = (ok["fwd_s"] > 0).astype(int) + (ok["fwd_bwd_s"] > 0).astype(int)
        total = sum(p * settings.noise_cap_s * share[device_type(d)] for p, d in zip(passes, ok["device"]))
        labels = {dev if dev in self.params.noise_share else f"{dev} (default)": v for dev, v in share.items()}
        return float(total), labels

    def _warmup_s(self, dev: str, settings: Settings, t_f: float, t_fb: float) -> float:
        """The warm-up calls: their steady-state seconds, times a fitted factor and plus a constant
        where records with phase_s were fitted (phasefit: a first call allocates and plans)."""
        calls = settings.warmup_fwd_calls * t_f + settings.warmup_fwd_bwd_calls * t_fb
        fitted = self.params.warmup_call.get(dev)
        return calls if not fitted else fitted[0] * self.host + fitted[1] * calls

    def _numerics_s(self, shape: CellShape, settings: Settings, t_f: float, t_fb: float) -> float:
        """The numerics phase: one call of each pass, the leak probes' forwards, the lse checks of a
        variant returning one, the masked-row loop (schema 2), a control's diagnosis and the
        float64 probabilities a variant's exposed weights are checked against. Where records with
        phase_s were fitted (phasefit), their constants, call factors and per-element seconds."""
        case, dev = shape.case, device_type(shape.case.device)
        fitted = self.params.checks_call.get(dev)
        if fitted:
            n_f, n_fb = checks_calls(case, settings, shape)
            _n, wflops, wchunks = golden_cost_inputs(shape, settings)
            weights = exposes_weights(case.variant)
            c0, c_f, c_fb, c_e, c_wc, c_wf, c_leak = (list(fitted) + [0.0] * 7)[:7]
            seconds = (c0 * self.host + c_f * n_f * t_f + c_fb * n_fb * t_fb + c_e * tensor_elems(shape) * self.host
                       + (c_wc * wchunks + c_wf * wflops) * weights * self.host
                       + c_leak * leak_probe_count(case) * self.host)
            if case.variant.startswith(BROKEN_PREFIX):
                return seconds + self._const("diagnosis_s", dev, DIAGNOSIS_DEFAULT_S[dev])
            return seconds + self._const("real_diagnosis_s", f"{dev}|{case.scenario}",
                                         self.params.real_diagnosis_s.get(dev, 0.0))
        seconds = t_f * (1 + leak_probe_count(case)) + t_fb
        if settings.arguments and case.variant not in COMPILED_VARIANTS:   # a compiled one's: _compiles
            probes = argument_probes(case)
            refusals = refusal_probes(probes)
            seconds += t_f * (len(probes) - refusals) + REFUSAL_S * refusals
        if settings.lse_checks and returns_lse(case.variant, dev):   # the merge's halves, the lse's gradient
            seconds += t_f + t_fb
        seconds += shards_seconds(case, settings, t_f, self.host)      # context parallel's shards
        if settings.referee:             # its forwards and the rest (its float64 forward: _golden_s)
            seconds += REFEREE_CALLS * t_f + REFEREE_DEFAULT_S[dev] * self.host
        if settings.masked_rows_loop:
            seconds += masked_rows_checked(shape) * self._const("masked_row_s", dev, 0.0)
        if case.variant.startswith(BROKEN_PREFIX):     # made to fail: its cells get a diagnosis
            seconds += (self._const("diagnosis_s", dev, DIAGNOSIS_DEFAULT_S[dev])
                        + diagnosis_flops(shape) / DIAGNOSIS_FLOPS_PER_S[dev] * self.host)
        if exposes_weights(case.variant):
            _n, flops, chunks = golden_cost_inputs(shape, settings)
            seconds += (chunks * self._const("weights_chunk_s", dev, 1e-3)
                        + flops / BACKWARD_FLOP_FACTOR / self._const("golden_flops_per_s", dev, 1e10))
        return seconds

    def _golden_or_read_s(self, shape: CellShape, settings: Settings, walk: "_Walk", build: float) -> float:
        """An input set's reference: read back from the golden store where it holds it (an earlier run
        stored it, or this run did when it first built it and it was worth keeping), else built in
        `build` seconds (_golden_s)."""
        case = shape.case
        if settings.golden_store:
            from ..measure.golden.golden_store import read_s, reference_bytes, worth_storing
            n, _flops, _chunks = golden_cost_inputs(shape, settings)
            nbytes = reference_bytes(n, shape.q_len, case.seq_len, case.d_k, case.effective_d_v)
            if case.input_key in walk.stored or (case.input_key in walk.built and worth_storing(build, nbytes)):
                return self._scaled("golden_read_s", self.params.golden_read_s.get(device_type(case.device), 0.0)) \
                    + read_s(nbytes) * self.host
        walk.built.add(case.input_key)
        return build

    def _golden_s(self, shape: CellShape, settings: Settings) -> float:
        """An input set's float64 golden (with gradients), and with the referee the forward of its
        shifted values (once per set, shared by its variants)."""
        dev = device_type(shape.case.device)
        n, flops, chunks = golden_cost_inputs(shape, settings)
        if settings.referee and settings.referee_golden_forward:
            flops *= 1 + 1 / (1 + BACKWARD_FLOP_FACTOR)
        return (self._const("golden_set_s", dev, 0.0) + chunks * self._const("golden_chunk_s", dev, 5e-3)
                + n * shape.q_len * shape.case.seq_len * self._const("golden_score_s", dev, 0.0)
                + flops / self._const("golden_flops_per_s", dev, 1e10))

    @staticmethod
    def _row(parts: "_CellParts", status: str, reason: str | None, phases: dict[str, float],
             t_f: float | None = None, t_fb: float | None = None, shared_s: float = 0.0) -> dict[str, Any]:
        """shared_s: the part of total_s that the cell pays for others too (start-up, a
        backend's first use, its input set's golden, compiled code it shares); amortized_s,
        set after the walk: its own seconds plus its share of every shared cost it takes part
        in (what the budget ranks cells by: a cell alone with its compile carries it all);
        shares, set after the walk: ((group, seconds), ...) of those shared costs, whole (what
        the budget's coverage adds up, each group once)."""
        return {"id": parts.shape.case.id, **parts.axes, "status": status, "reason": reason,
                "fwd_s": t_f, "fwd_bwd_s": t_fb, **phases, "total_s": sum(phases.values()),
                "shared_s": shared_s}
