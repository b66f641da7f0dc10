"""Predict each cell's wall time, phase by phase, before measuring anything.

A cell's time is made of phases the runner goes through (runner.measure_cell):

- setup:    per-cell overhead (build, record, bookkeeping); the first cell of a run
            also pays for starting the device, and a variant's first cell for its
            backend's initialization;
- golden:   once per input set: the float64 golden (chunks of query rows over the
            golden's slices), the same-dtype baseline; plus, for variants that expose
            their weights, the float64 probabilities their saturation is checked against;
- compile:  compiled variants, once per shapes, dtype, causal flag and mask kind;
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

The shipped priors (cost_priors.json) are fitted on the shared H200 records
(tests/data/h200-2026-11-30) and a CPU run; `fit` refits from any run folders.
Pure Python + numpy + pandas: nothing here imports torch.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .grid import AXES, Case, Preset
from .numerics import BACKWARD_FLOP_FACTOR, attention_flops
from .roofline import CEILINGS_BUDGET_S, DTYPE_BYTES
from .timing import MAX_DEVICE_BLOCK, MAX_SAMPLES, MIN_BLOCK_S

PHASES: tuple[str, ...] = ("setup", "golden", "compile", "warmup", "numerics", "timed", "energy")
PRIORS_FILE = Path(__file__).with_name("cost_priors.json")
PROBS_VARIANTS_PREFIX = "broken."
PROBS_VARIANTS = ("eager", "eager_fp32")
COMPILED_VARIANTS = ("compiled", "compiled_unfused", "flex")
ENERGY_EDGE_WAIT_S = 0.1     # waiting for two energy-counter updates (20-100 ms apart)
ENERGY_MAX_WALL_S = 0.3


def _device_type(device: str) -> str:
    return "cuda" if str(device).startswith("cuda") else "cpu"


# --------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class Settings:
    """What decides a run's cost besides its cells: the preset's sampling rules and the
    measuring methods of the code that made (or will make) the records."""

    min_samples: int = 5
    min_time_s: float = 0.2
    max_cell_s: float = 30.0
    energy_window_s: float = 0.1
    timing: str = "device"        # CUDA: "device" (events behind a spin) or "host" (schema 2)
    energy: str = "edges"         # "edges": between counter updates; "window": schema 2's fixed window
    golden: str = "subset"        # "subset": budgeted slices; "full": schema 2
    masked_rows_loop: bool = False  # schema 2 classified fully masked rows one by one (a sync each)
    cpu_chunk_bytes: int = 32 * 2**20
    cuda_chunk_bytes: int = 256 * 2**20

    @classmethod
    def of_preset(cls, preset: Preset) -> "Settings":
        return cls(min_samples=preset.min_samples, min_time_s=preset.min_time_s,
                   max_cell_s=preset.max_cell_s, energy_window_s=preset.energy_window_s)

    @classmethod
    def of_run(cls, run_info: Mapping[str, Any]) -> "Settings":
        """The settings a run folder's records were made with (run.json)."""
        timing = run_info.get("timing") or {}
        base = cls(min_samples=int(timing.get("min_samples", 5)),
                   min_time_s=float(timing.get("min_time_s", 0.2)),
                   max_cell_s=float(timing.get("max_cell_s", 30.0)),
                   energy_window_s=float(timing.get("energy_window_s", 0.1)))
        argv = list(run_info.get("argv") or [])
        if "--energy-window-s" in argv:
            base = replace(base, energy_window_s=float(argv[argv.index("--energy-window-s") + 1]))
        if int(run_info.get("schema", 3)) <= 2:
            base = replace(base, timing="host", energy="window", golden="full",
                           cuda_chunk_bytes=32 * 2**20, masked_rows_loop=True)
        return base


# --------------------------------------------------------------------------- parameters

# Where nothing was fitted: how a family of variants spends its time, per device type.
# (c0 seconds, a, b, m): hand-written code runs its matmuls in the input dtype and passes
# over the score matrix a few times; fused kernels run near the fp32-or-better rate.
FAMILY_DEFAULTS: dict[str, dict[str, tuple[float, float, float, float]]] = {
    "cpu": {"eager": (2e-5, 1.5, 0.0, 6.0), "fused": (2e-5, 0.0, 2.0, 0.5),
            "compiled": (5e-5, 1.0, 0.0, 4.0)},
    "cuda": {"eager": (5e-5, 3.0, 0.0, 6.0), "fused": (3e-5, 1.5, 0.0, 0.2),
             "compiled": (5e-5, 2.0, 0.0, 3.0)},
}
BACKWARD_DEFAULT_FACTOR = 3.0
HOST_CALL_DEFAULT_S = {"cpu": 0.0, "cuda": 60e-6}


def _family(variant: str) -> str:
    if variant.startswith("sdpa") or variant in ("flex", "compiled[fused]"):
        return "eager" if variant == "sdpa_math" else "fused"
    if variant.startswith("compiled"):
        return "compiled"
    return "eager"


@dataclass
class Params:
    """Fitted constants of the model. Keys join device type, variant, dtype and pass with '|'."""

    call: dict[str, list[float]] = field(default_factory=dict)    # "cuda|sdpa|bf16|fwd" -> 4 factors
    host_call_s: dict[str, float] = field(default_factory=dict)   # "cuda|sdpa" -> host s per call
    cell_s: dict[str, float] = field(default_factory=dict)        # "cuda" -> s per cell
    cudnn_config_s: dict[str, float] = field(default_factory=dict)  # "cuda" -> first cuDNN SDPA of a config
    masked_row_s: dict[str, float] = field(default_factory=dict)  # schema 2: per fully masked row checked
    golden_chunk_s: dict[str, float] = field(default_factory=dict)
    golden_flops_per_s: dict[str, float] = field(default_factory=dict)
    weights_chunk_s: dict[str, float] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)     # "cuda|flex" -> s per compile
    init_s: dict[str, float] = field(default_factory=dict)        # "cuda|sdpa" -> first cell of a run
    run_start_s: dict[str, float] = field(default_factory=dict)
    compile_start_s: dict[str, float] = field(default_factory=dict)  # the run's first compiled cell
    skip_s: dict[str, float] = field(default_factory=dict)
    fitted_on: list[str] = field(default_factory=list)
    # The machine the priors were fitted on, per device type: its ceilings, free memory and
    # name. A dry-run for a device this machine lacks (--device cuda on a laptop) predicts it.
    reference: dict[str, dict] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Params":
        return cls(**json.loads(text))

    def merged(self, newer: "Params") -> "Params":
        """These parameters with every constant `newer` fitted taking precedence."""
        out = Params()
        for name in asdict(self):
            old, new = getattr(self, name), getattr(newer, name)
            setattr(out, name, list(dict.fromkeys(old + new)) if isinstance(old, list) else {**old, **new})
        return out


def load_priors(path: Path = PRIORS_FILE) -> Params:
    return Params.from_json(path.read_text()) if path.exists() else Params()


# --------------------------------------------------------------------------- cells

@dataclass(frozen=True)
class CellShape:
    """What a cell's cost depends on, without torch."""

    case: Case
    q_len: int
    flops: float          # forward FLOPs (per query head: GQA does not change them)
    score_elems: float    # B·H·Tq·Tk, plus GQA's copies of k and v per query head where made
    mask: tuple | None    # (kind, shape) of the mask tensor, or None

    @classmethod
    def of(cls, case: Case) -> "CellShape":
        from .inputs import mask_shape, q_len
        from .memory_model import kv_copy_elements
        tq = q_len(case)
        return cls(case, tq, float(attention_flops(case.batch, case.heads, tq, case.seq_len, case.d_k,
                                                   case.causal)),
                   float(case.batch * case.heads * tq * case.seq_len + kv_copy_elements(case)),
                   mask_shape(case))


def call_variant(shape: CellShape) -> str:
    """The name per-call factors are fitted under: `compiled` splits in two, because Inductor
    rewrites it into fused SDPA without a mask or with an additive float mask (not causal,
    not a bool mask) and leaves the hand-written math otherwise."""
    case = shape.case
    if case.variant == "compiled" and not case.causal and (shape.mask is None or shape.mask[0] == "float"):
        return "compiled[fused]"
    return case.variant


CALL_WEIGHT_POWER = 0.25  # fit weights 1/t^p: 1 balances relative errors, 0 absolute ones (wall time)


def _features(shape: CellShape, ceilings: Mapping[str, Any] | None) -> np.ndarray:
    """[1, F/P_dtype, F/P_fp32, S·size/BW] for one forward, from the device's ceilings."""
    c = ceilings or {}
    rates = c.get("matmul_flops_per_s") or {}
    p_dt = rates.get(shape.case.dtype) or rates.get("fp32") or 1e11
    p_32 = rates.get("fp32") or p_dt
    bw = c.get("copy_bytes_per_s") or 2e10
    size = DTYPE_BYTES[shape.case.dtype]
    return np.array([1.0, shape.flops / p_dt, shape.flops / p_32, shape.score_elems * size / bw])


def golden_cost_inputs(shape: CellShape, settings: Settings) -> tuple[float, float, float]:
    """(slices covered, float64 FLOPs, chunks) of the golden of this cell's input set."""
    from .reference import golden_flops, golden_slices
    case = shape.case
    dev = _device_type(case.device)
    slices = (golden_slices(case.batch, case.heads, shape.q_len, case.seq_len, case.d_k, case.causal, dev,
                            kv_heads=case.effective_kv_heads)
              if settings.golden == "subset" else None)
    n = case.batch * case.heads if slices is None else len(slices)
    flops = n * golden_flops(shape.q_len, case.seq_len, case.d_k, case.causal)
    chunk_bytes = settings.cuda_chunk_bytes if dev == "cuda" else settings.cpu_chunk_bytes
    rows = max(1, chunk_bytes // max(1, n * case.seq_len * 8))
    return float(n), flops, float(math.ceil(shape.q_len / rows))


def score_mod_of(case: Case) -> str:
    """The cell's score modification by name ("None" without one): compiled code is built per
    score modification too (runner.BuildCache)."""
    from .inputs import SCENARIOS
    return str(SCENARIOS[case.scenario].score_mod)


def exposes_weights(variant: str) -> bool:
    return variant in PROBS_VARIANTS or variant.startswith(PROBS_VARIANTS_PREFIX)


def masked_rows_checked(shape: CellShape) -> float:
    """Fully masked query rows the masked-row check looks at: every 8th row × B × H."""
    if not shape.case.scenario.startswith("fully_masked"):
        return 0.0
    from .inputs import fully_masked_rows
    return float(len(fully_masked_rows(shape.q_len)) * shape.case.batch * shape.case.heads)


CUDNN_VARIANTS = ("sdpa", "sdpa_cudnn")


def cudnn_config(shape: CellShape) -> tuple | None:
    """The configuration cuDNN builds an execution plan for (the H200 records: a new one costs
    1-2 s in the first `sdpa` or `sdpa_cudnn` cell that uses it); None for other cells."""
    case = shape.case
    if _device_type(case.device) != "cuda" or case.variant not in CUDNN_VARIANTS or case.dtype == "fp32":
        return None
    return case.dtype, case.d_k, case.causal, shape.mask


def leak_probe_count(case: Case) -> int:
    """Extra forwards of the leak check: one per kind of hidden key (masked or future keys,
    fully masked rows)."""
    from .inputs import SCENARIOS
    mask = SCENARIOS[case.scenario].mask
    n = int(case.causal or mask is not None)
    return n + int(case.scenario.startswith("fully_masked"))


def timed_wall_s(t: float, settings: Settings, *, device_timing: bool, host_call_s: float) -> float:
    """Wall time of one measurement (timing.measure / measure_device) of a call taking t seconds."""
    if t <= 0:
        return 0.0
    if device_timing:
        block = min(MAX_DEVICE_BLOCK, max(1, math.ceil(MIN_BLOCK_S / t)))
        per_sample = 1.5 * block * host_call_s + 2e-4 + block * t
    else:
        block = max(1, math.ceil(MIN_BLOCK_S / t))
        per_sample = block * t
    n = min(MAX_SAMPLES, max(settings.min_samples, math.ceil(settings.min_time_s / per_sample)))
    return n * per_sample


def energy_wall_s(t_fwd: float, settings: Settings) -> float:
    """The energy window's wall time (runner._telemetry, EnergyMeter.measure)."""
    w = settings.energy_window_s
    if w <= 0:
        return 0.0
    if settings.energy == "window":          # schema 2: a fixed window of repeated calls
        return max(w, t_fwd) * 1.03
    if t_fwd < 2e-3:                         # graph capture, then replays between two counter updates
        return min(ENERGY_MAX_WALL_S, w + ENERGY_EDGE_WAIT_S) + 3 * t_fwd + 2e-3
    return ENERGY_EDGE_WAIT_S + max(w, t_fwd) + 2 * t_fwd


# --------------------------------------------------------------------------- prediction

def predicted_unsupported(case: Case, shape: CellShape) -> str | None:
    """Cells a forced SDPA backend refuses (design.md §5, §5b), and those a built-in variant
    declares it cannot run (variants.Variant.refusal: soft-capping on SDPA, the GQA control on
    multi-head cells): skipped in milliseconds."""
    from .inputs import cell_needs
    from .variants import builtin_variants
    builtin = builtin_variants().get(case.variant)
    refusal = builtin.refusal(cell_needs(case)) if builtin is not None else None
    if refusal:
        return refusal
    v, dev = case.variant, _device_type(case.device)
    if dev == "cpu" and v in ("sdpa_efficient", "sdpa_cudnn"):
        return "no such backend on the CPU"
    if dev == "cuda" and v == "sdpa_flash":
        if shape.mask is not None:
            return "FLASH_ATTENTION takes no attn_mask"
        if case.dtype == "fp32":
            return "FLASH_ATTENTION needs fp16 or bf16"
        if case.causal and shape.q_len != case.seq_len:
            return "FLASH_ATTENTION: is_causal with q_len != kv_len"
    if dev == "cuda" and v == "sdpa_cudnn" and case.dtype == "fp32":
        return "CUDNN_ATTENTION needs fp16 or bf16"
    return None


class CostModel:
    """Per-call times and per-phase constants; predict() walks a grid in run order."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params or load_priors()

    def _call_factors(self, dev: str, variant: str, dtype: str, pass_: str) -> np.ndarray:
        """Fitted for this dtype, else for the variant's other dtypes, else the family default."""
        p = self.params.call
        for key in (f"{dev}|{variant}|{dtype}|{pass_}", f"{dev}|{variant}|*|{pass_}"):
            if key in p:
                return np.array(p[key])
        base = np.array(FAMILY_DEFAULTS[dev][_family(variant)])
        return base * BACKWARD_DEFAULT_FACTOR if pass_ == "fwd_bwd" else base

    def call_s(self, shape: CellShape, pass_: str, ceilings: Mapping[str, Any] | None) -> float:
        dev = _device_type(shape.case.device)
        factors = self._call_factors(dev, call_variant(shape), shape.case.dtype, pass_)
        return float(max(1e-6, factors @ _features(shape, ceilings)))

    def _const(self, table: str, key: str, default: float) -> float:
        return float(getattr(self.params, table).get(key, default))

    def predict(self, cases: Sequence[Case], settings: Settings,
                ceilings: Mapping[str, Any] | None = None,
                free_bytes: Mapping[str, int | None] | None = None) -> "Any":
        """One row per cell, in the given (run) order: predicted status and seconds per phase.

        ceilings: {device: measure_ceilings(...)} (run.json), used for per-call times;
        free_bytes: {device: bytes free}, for the cells memory_model predicts cannot fit.
        """
        import pandas as pd

        from .memory_model import too_big

        rows = []
        previous_key = None
        seen_variants: set[tuple[str, str]] = set()
        compiled_keys: set[tuple] = set()
        compiling_started: set[str] = set()
        cudnn_configs: set[tuple] = set()
        started: set[str] = set()
        for case in cases:
            shape = CellShape.of(case)
            dev = _device_type(case.device)
            ceil = (ceilings or {}).get(case.device) or (ceilings or {}).get(dev)
            phases = dict.fromkeys(PHASES, 0.0)
            status, reason = "ok", None
            phases["setup"] = self._const("cell_s", dev, 0.05)
            shared = 0.0    # paid once for many cells, by whichever comes first (start-up, golden, compile)
            if dev not in started:
                started.add(dev)
                shared += self._const("run_start_s", dev, 0.0)
            oom = too_big(case, shape.q_len, (free_bytes or {}).get(case.device))
            if oom:
                phases["setup"] += shared
                rows.append(self._row(case, "oom", oom, phases, shared_s=shared))
                continue
            if (dev, case.variant) not in seen_variants:
                seen_variants.add((dev, case.variant))
                shared += self._const("init_s", f"{dev}|{case.variant}", 0.0)
            if case.input_key != previous_key:
                previous_key = case.input_key
                phases["golden"] += self._golden_s(shape, settings)
            unsupported = predicted_unsupported(case, shape)
            if unsupported:
                status, reason = "skipped", unsupported
                phases["setup"] = self._const("skip_s", dev, 0.002) + shared
                rows.append(self._row(case, status, reason, phases, shared_s=shared + phases["golden"]))
                continue
            t_f = self.call_s(shape, "fwd", ceil)
            backward = not (case.variant == "flex" and dev == "cpu")
            t_fb = self.call_s(shape, "fwd_bwd", ceil) if backward else 0.0
            if case.variant in COMPILED_VARIANTS:
                key = (case.variant, case.device, case.dtype, shape.q_len, case.seq_len, case.batch,
                       case.heads, case.kv_heads, case.d_k, case.causal, shape.mask, score_mod_of(case))
                if key not in compiled_keys:
                    compiled_keys.add(key)
                    phases["compile"] = self._const("compile_s", f"{dev}|{case.variant}", 3.0)
                    if dev not in compiling_started:
                        compiling_started.add(dev)
                        phases["compile"] += self._const("compile_start_s", dev, 2.0)
                    shared += phases["compile"]
            n_timed = settings.min_samples + 1
            if t_f * (1 + BACKWARD_FLOP_FACTOR) * n_timed > settings.max_cell_s or \
                    (t_f + t_fb) * n_timed > settings.max_cell_s:
                status, reason = "skipped", "too slow for this device (--max-cell-s)"
                phases["warmup"] = 2 * t_f + (2 * t_fb if t_f * 3.5 * n_timed <= settings.max_cell_s else 0)
                phases["setup"] += shared - phases["compile"]
                rows.append(self._row(case, status, reason, phases, t_f, t_fb,
                                      shared_s=shared + phases["golden"]))
                continue
            config = cudnn_config(shape)
            if config is not None and config not in cudnn_configs:
                cudnn_configs.add(config)
                shared += self._const("cudnn_config_s", dev, 0.0)
            phases["setup"] += shared - phases["compile"]
            phases["warmup"] = 2 * t_f + 2 * t_fb
            phases["numerics"] = t_f * (1 + leak_probe_count(case)) + t_fb
            if settings.masked_rows_loop:
                phases["numerics"] += masked_rows_checked(shape) * self._const("masked_row_s", dev, 0.0)
            if exposes_weights(case.variant):
                _n, flops, chunks = golden_cost_inputs(shape, settings)
                phases["numerics"] += (chunks * self._const("weights_chunk_s", dev, 1e-3)
                                       + flops / BACKWARD_FLOP_FACTOR
                                       / self._const("golden_flops_per_s", dev, 1e10))
            device_timing = dev == "cuda" and settings.timing == "device"
            host = self._const("host_call_s", f"{dev}|{case.variant}", HOST_CALL_DEFAULT_S[dev])
            phases["timed"] = (timed_wall_s(t_f, settings, device_timing=device_timing, host_call_s=host)
                               + timed_wall_s(t_fb, settings, device_timing=device_timing,
                                              host_call_s=2.5 * host))
            if dev == "cuda" and case.scenario == "normal":
                phases["energy"] = energy_wall_s(t_f, settings)
            rows.append(self._row(case, status, reason, phases, t_f, t_fb, shared_s=shared + phases["golden"]))
        columns = ["id", *AXES, "status", "reason", "fwd_s", "fwd_bwd_s", *PHASES, "total_s",
                   "shared_s"]
        return pd.DataFrame(rows, columns=columns)

    def _golden_s(self, shape: CellShape, settings: Settings) -> float:
        dev = _device_type(shape.case.device)
        _n, flops, chunks = golden_cost_inputs(shape, settings)
        return (chunks * self._const("golden_chunk_s", dev, 5e-3)
                + flops / self._const("golden_flops_per_s", dev, 1e10))

    @staticmethod
    def _row(case: Case, status: str, reason: str | None, phases: dict[str, float],
             t_f: float | None = None, t_fb: float | None = None, shared_s: float = 0.0) -> dict[str, Any]:
        """shared_s: the part of total_s that the cell pays for others too (start-up, a
        backend's first use, its input set's golden, compiled code it shares)."""
        axes = case.axes()
        return {"id": case.id, **axes, "status": status, "reason": reason,
                "fwd_s": t_f, "fwd_bwd_s": t_fb, **phases, "total_s": sum(phases.values()),
                "shared_s": shared_s}


# --------------------------------------------------------------------------- fitting

def _nnls(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Non-negative least squares by trying every support (few features): weighted rows."""
    best, best_err = np.zeros(X.shape[1]), math.inf
    for support in itertools.product((0, 1), repeat=X.shape[1]):
        idx = [i for i, on in enumerate(support) if on]
        if not idx:
            continue
        coef, *_ = np.linalg.lstsq(X[:, idx] * w[:, None], y * w, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(X.shape[1])
        full[idx] = coef
        err = float(np.sum(((X @ full - y) * w) ** 2))
        if err < best_err - 1e-15:
            best, best_err = full, err
    return best


@dataclass
class RunData:
    """One run folder's records with what is needed to explain their elapsed_s."""

    name: str
    frame: Any                      # records.load(run_dir), in file (= run) order
    settings: Settings
    ceilings: dict[str, Any]

    @classmethod
    def load(cls, run_dir: Path | str) -> "RunData":
        from .records import load
        run_dir = Path(run_dir)
        info = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
        return cls(run_dir.name, load(run_dir), Settings.of_run(info), info.get("ceilings") or {})


def _case_of(row: Any) -> Case:
    kv = row.get("kv_heads")
    return Case(variant=row["variant"], device=row["device"], dtype=row["dtype"], d_k=int(row["d_k"]),
                seq_len=int(row["seq_len"]), batch=int(row["batch"]), heads=int(row["heads"]),
                causal=bool(row["causal"]), scenario=row.get("scenario") or "normal",
                kv_heads=int(kv) if isinstance(kv, (int, float)) and kv == kv else None)


def _samples_wall(row: Any, prefix: str) -> float:
    """Wall time of a record's timed samples: sum of samples × calls per sample."""
    import re
    timer = str(row.get("timer") or "")
    found = re.search(r"blocks of (\d+|-)/(\d+|-) calls", timer)
    per = 1
    if found and found.group(1 if prefix == "fwd" else 2).isdigit():
        per = int(found.group(1 if prefix == "fwd" else 2))
    samples = row.get(f"{prefix}_samples_s")
    if isinstance(samples, list) and samples:
        total = float(np.nansum([s for s in samples if isinstance(s, (int, float))])) * per
    else:                            # records stored without raw samples: n × median
        n, ms = row.get(f"{prefix}_n"), row.get(f"{prefix}_ms")
        if not (isinstance(n, (int, float)) and isinstance(ms, (int, float)) and n == n and ms == ms):
            return 0.0
        total = float(n) * float(ms) / 1e3 * per
        samples = [0.0] * int(n)
    if "spin kernel" in timer:       # device timing: each sample also waited for the spin
        host = row.get(f"{prefix}_host_ms")
        if isinstance(host, (int, float)) and host == host:
            total += len(samples) * (1.5 * per * host / 1e3 + 2e-4)
    return total


def fit(runs: Iterable[RunData], priors: Params | None = None) -> Params:
    """Constants fitted on the runs' records (on top of `priors` for what they do not show)."""
    runs = list(runs)
    fitted = Params(fitted_on=[r.name for r in runs])
    _fit_calls(runs, fitted)
    _fit_host(runs, fitted)
    _fit_constants(runs, fitted)
    return (priors or Params()).merged(fitted)


def _fit_calls(runs: list[RunData], out: Params) -> None:
    groups: dict[str, list[tuple[np.ndarray, float]]] = {}
    for run in runs:
        for _, row in run.frame.iterrows():
            if row["status"] != "ok":
                continue
            case = _case_of(row)
            dev = _device_type(case.device)
            ceil = run.ceilings.get(case.device) or run.ceilings.get(dev)
            shape = CellShape.of(case)
            x = _features(shape, ceil)
            for pass_, col in (("fwd", "fwd_ms"), ("fwd_bwd", "fwd_bwd_ms")):
                t = row.get(col)
                if isinstance(t, (int, float)) and t == t and t > 0:
                    for dtype in (case.dtype, "*"):
                        groups.setdefault(f"{dev}|{call_variant(shape)}|{dtype}|{pass_}", []).append((x, t / 1e3))
    for key, items in groups.items():
        X = np.stack([x for x, _ in items])
        y = np.array([t for _, t in items])
        if len(items) < 2:
            continue
        out.call[key] = [float(c) for c in _nnls(X, y, y ** -CALL_WEIGHT_POWER)]


def _median_per_variant(runs: list[RunData], column: str, scale: float = 1.0) -> dict[str, float]:
    """{"device|variant": median of a record column over the runs' cells that have it}."""
    values: dict[str, list[float]] = {}
    for run in runs:
        frame = run.frame
        if column not in frame.columns:
            continue
        for _, row in frame[frame[column].notna()].iterrows():
            values.setdefault(f"{_device_type(row['device'])}|{row['variant']}", []).append(
                float(row[column]) * scale)
    return {k: float(np.median(v)) for k, v in values.items()}


def _fit_host(runs: list[RunData], out: Params) -> None:
    out.host_call_s.update(_median_per_variant(runs, "fwd_host_ms", 1e-3))


def _explained(row: Any, shape: CellShape) -> float:
    """The part of a record's elapsed_s its own measurements account for."""
    t_f = row.get("fwd_ms")
    t_f = t_f / 1e3 if isinstance(t_f, (int, float)) and t_f == t_f else 0.0
    t_fb = row.get("fwd_bwd_ms")
    t_fb = t_fb / 1e3 if isinstance(t_fb, (int, float)) and t_fb == t_fb else 0.0
    compile_s = row.get("compile_s")
    compile_s = compile_s if isinstance(compile_s, (int, float)) and compile_s == compile_s else 0.0
    energy = row.get("energy_window_s")
    energy = energy * 1.03 if isinstance(energy, (int, float)) and energy == energy else 0.0
    return (3 * t_f + 3 * t_fb + leak_probe_count(shape.case) * t_f + compile_s + energy
            + _samples_wall(row, "fwd") + _samples_wall(row, "fwd_bwd"))


def _fit_constants(runs: list[RunData], out: Params) -> None:
    """Per device: cell overhead, golden cost per chunk and per FLOP, weights cost per chunk,
    from the residual elapsed_s of ok cells; then first-use and run-start costs; skips."""
    by_dev: dict[str, list[tuple[np.ndarray, float, dict]]] = {}
    for run in runs:
        previous = None
        seen: set[str] = set()
        configs: set[tuple] = set()
        compiled_seen = False
        for i, (_, row) in enumerate(run.frame.iterrows()):
            case = _case_of(row)
            dev = _device_type(case.device)
            shape = CellShape.of(case)
            first_of_set = case.input_key != previous
            previous = case.input_key
            first_use = case.variant not in seen
            seen.add(case.variant)
            first_compiled = case.variant in COMPILED_VARIANTS and not compiled_seen and row["status"] == "ok"
            compiled_seen = compiled_seen or first_compiled
            config = cudnn_config(shape) if row["status"] == "ok" else None
            new_config = config is not None and config not in configs
            if config is not None:
                configs.add(config)
            if row["status"] == "skipped" and "too slow" not in str(row.get("reason")):
                by_dev.setdefault(dev + "|skip", []).append((np.zeros(1), float(row["elapsed_s"] or 0), {}))
                continue
            if row["status"] != "ok" or not isinstance(row.get("elapsed_s"), (int, float)):
                continue
            resid = float(row["elapsed_s"]) - _explained(row, shape)
            _n, gflops, gchunks = golden_cost_inputs(shape, run.settings)
            weights = exposes_weights(case.variant)
            x = np.array([1.0, gchunks * first_of_set, gflops * first_of_set,
                          gchunks * weights, gflops / BACKWARD_FLOP_FACTOR * weights, float(new_config),
                          masked_rows_checked(shape) * run.settings.masked_rows_loop])
            by_dev.setdefault(dev, []).append((x, resid, {"first_use": first_use, "first": i == 0,
                                                           "first_compiled": first_compiled,
                                                           "variant": case.variant}))
    for dev, items in by_dev.items():
        if dev.endswith("|skip"):
            out.skip_s[dev.split("|")[0]] = float(np.median([r for _, r, _ in items]))
            continue
        regular = [(x, r) for x, r, info in items if not info["first_use"] and not info["first"]]
        if len(regular) < 3:
            continue
        X = np.stack([x for x, _ in regular])
        y = np.array([r for _, r in regular])
        # Golden FLOPs enter as 1/rate: fit on seconds, weight so no cell dominates.
        coef = _nnls(X, y, 1.0 / np.maximum(np.abs(y), 0.05))
        out.cell_s[dev] = float(coef[0])
        out.golden_chunk_s[dev] = float(coef[1])
        if coef[2] > 0:
            out.golden_flops_per_s[dev] = float(1.0 / coef[2])
        out.weights_chunk_s[dev] = float(coef[3])
        out.cudnn_config_s[dev] = float(coef[5])
        out.masked_row_s[dev] = float(coef[6])
        first_use: dict[str, list[float]] = {}
        starts: list[float] = []
        compile_starts: list[float] = []
        for x, r, info in items:
            extra = r - float(x @ coef)
            if info["first"]:
                starts.append(extra)
            elif info["first_compiled"]:          # importing Inductor, Triton or a C++ toolchain
                compile_starts.append(extra)
            elif info["first_use"]:
                first_use.setdefault(info["variant"], []).append(extra)
        if starts:
            out.run_start_s[dev] = max(0.0, float(np.median(starts)))
        if compile_starts:
            out.compile_start_s[dev] = max(0.0, float(np.median(compile_starts)))
        for variant, extras in first_use.items():
            out.init_s[f"{dev}|{variant}"] = max(0.0, float(np.median(extras)))
    out.compile_s.update(_median_per_variant(runs, "compile_s"))


# --------------------------------------------------------------------------- reporting

STARTUP_S = 5.0          # the supervisor's and the worker's start (importing torch twice)
REPORT_S = 3.0           # seed claims, findings, figures and index ...
REPORT_PER_CELL_S = 0.005  # ... growing with the measured cells (1237 of them: 8.3 s)


def overhead_s(pred: Any, *, ceilings_measured: bool = True) -> tuple[float, float]:
    """(seconds before the first cell, seconds after the last) of a run of these cells."""
    devices = {_device_type(d) for d in pred["device"]} if len(pred) else set()
    before = STARTUP_S + (CEILINGS_BUDGET_S * len(devices) if ceilings_measured else 0.0)
    measured = int((pred["status"] == "ok").sum()) if len(pred) else 0
    return before, REPORT_S + REPORT_PER_CELL_S * measured


def summary(pred: Any) -> str:
    """Predicted seconds per phase and per variant, and the total, for --dry-run."""
    from .budget import format_duration
    before, after = overhead_s(pred)
    overhead = before + after
    total = float(pred["total_s"].sum()) + overhead
    lines = [f"predicted wall time: {format_duration(total)} for {len(pred)} cells "
             f"({int((pred['status'] == 'ok').sum())} measured, "
             f"{int((pred['status'] == 'skipped').sum())} skipped, "
             f"{int((pred['status'] == 'oom').sum()) if 'oom' in set(pred['status']) else 0} oom)",
             "  per phase: " + ", ".join(f"{p} {format_duration(float(pred[p].sum()))}" for p in PHASES)
             + f"; start-up, ceilings and report about {format_duration(overhead)}"]
    per_variant = pred.groupby("variant", sort=False)["total_s"].sum().sort_values(ascending=False)
    lines.append("  per variant: " + ", ".join(f"{v} {format_duration(float(s))}" for v, s in per_variant.items()))
    return "\n".join(lines)


def this_machine(device_type: str) -> str | None:
    """The name a run's env gives this machine's device (cpu model, or GPU name)."""
    if device_type == "cpu":
        from .telemetry import cpu_model
        return cpu_model()
    import torch
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def history(device_names: Mapping[str, str | None], root: Path = Path("reports"), newest: int = 5
            ) -> list[RunData]:
    """Earlier run folders under `root` made on this machine (same device name), newest first."""
    found = []
    if not root.is_dir():
        return found
    folders = sorted((p for p in root.iterdir() if p.is_dir() and not p.is_symlink()
                      and (p / "run.json").exists() and (p / "records.jsonl").exists()),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for folder in folders:
        try:
            env = json.loads((folder / "run.json").read_text()).get("env") or {}
        except (OSError, ValueError):
            continue
        names = {env.get("device_name"), env.get("cpu_model")}
        if any(name and name in names for name in device_names.values()):
            found.append(RunData.load(folder))
        if len(found) >= newest:
            break
    return found


def _cache_dir() -> Path:
    import os
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attn-audit"


CEILINGS_CACHE_S = 24 * 3600    # a dry-run measures this machine's ceilings again after a day


def machine_ceilings(device: str, dtypes: Sequence[str], name: str | None) -> tuple[dict, str]:
    """This machine's ceilings for a dry-run: measured once, then kept in ~/.cache/attn-audit
    (keyed by device name, torch version, thread count and the CPU capability torch uses) for
    the next dry-runs. A real run always measures its own (run.json)."""
    import hashlib
    import time

    import torch

    from .roofline import measure_ceilings
    import os
    key = hashlib.sha1(repr((device, name, torch.__version__, torch.get_num_threads(),
                             torch.backends.cpu.get_cpu_capability(),
                             os.environ.get("ONEDNN_MAX_CPU_ISA"))).encode()).hexdigest()[:16]
    path = _cache_dir() / f"ceilings-{key}.json"
    try:
        cached = json.loads(path.read_text())
        fresh = time.time() - path.stat().st_mtime < CEILINGS_CACHE_S
        if fresh and all((cached.get("matmul_flops_per_s") or {}).get(d) for d in dtypes):
            return cached, f"of this machine from {path} (measured {time.ctime(path.stat().st_mtime)})"
    except (OSError, ValueError):
        pass
    measured = measure_ceilings(device, tuple(dtypes))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(measured))
    except OSError:
        pass
    return measured, "measured now"


@dataclass
class Forecast:
    """A grid's prediction on this machine and what it was made from."""

    pred: Any                      # CostModel.predict's frame
    notes: list[str]               # where the parameters, ceilings and memory came from
    params: Params
    ceilings: dict[str, Any]
    free: dict[str, int | None]
    ceilings_measured: bool        # a run of these cells would still measure ceilings


def plan(cases: Sequence[Case], preset: Preset, run_dir: Path | None = None, *,
         measure: bool = True, root: Path = Path("reports")) -> Forecast:
    """Predict a grid on this machine, noting where the numbers came from.

    Parameters: the shipped priors, refitted on the records of `run_dir` (a resumed run) and
    of earlier run folders under `root` from this machine. Ceilings: run_dir's run.json, else
    measured here (measure=True) for the devices this machine has, else the priors' reference
    machine's. Free memory: this machine's, else the reference machine's.
    """
    from .memory_model import free_bytes

    notes: list[str] = []
    priors = load_priors()
    devices = list(dict.fromkeys(c.device for c in cases))
    available = {}
    for device in devices:
        dev = _device_type(device)
        try:
            available[device] = this_machine(dev)
        except Exception:  # noqa: BLE001 - no torch/CUDA: predict for the reference machine
            available[device] = None
    runs = history({d: n for d, n in available.items() if n}, root)
    if run_dir is not None and (Path(run_dir) / "records.jsonl").exists():
        runs.insert(0, RunData.load(run_dir))
    runs = list({r.name: r for r in runs}.values())
    params = fit(runs, priors) if runs else priors
    if runs:
        notes.append("parameters refitted on " + ", ".join(r.name for r in runs))
    info = {}
    if run_dir is not None and (Path(run_dir) / "run.json").exists():
        info = json.loads((Path(run_dir) / "run.json").read_text())
    ceilings: dict[str, Any] = dict(info.get("ceilings") or {})
    free: dict[str, int | None] = {}
    for device in devices:
        dev = _device_type(device)
        ref = params.reference.get(dev) or {}
        if available.get(device):
            free[device] = free_bytes(device)
            if device not in ceilings and measure:
                dtypes = tuple(dict.fromkeys(c.dtype for c in cases if c.device == device))
                ceilings[device], how = machine_ceilings(device, dtypes, available[device])
                notes.append(f"{device}: ceilings {how}")
        else:
            free[device] = ref.get("free_bytes")
            notes.append(f"{device}: not on this machine; predicted for the reference "
                         f"{ref.get('device_name', 'machine')} (its ceilings and memory)")
        if device not in ceilings and ref.get("ceilings"):
            ceilings[device] = ref["ceilings"]
    pred = CostModel(params).predict(cases, Settings.of_preset(preset), ceilings, free)
    return Forecast(pred, notes, params, ceilings, free, ceilings_measured=not info.get("ceilings"))





def compare(run: RunData, model: CostModel) -> Any:
    """Predicted against recorded elapsed_s for every cell of a run folder (its own settings,
    ceilings and order). Columns: id, status, recorded_s, predicted_s, ratio (predicted / recorded)."""
    cases = [_case_of(row) for _, row in run.frame.iterrows()]
    pred = model.predict(cases, run.settings, run.ceilings)
    out = pred[["id", "variant"]].copy()
    out["status"] = list(run.frame["status"])
    out["recorded_s"] = list(run.frame["elapsed_s"].astype(float))
    out["predicted_s"] = list(pred["total_s"])
    out["ratio"] = out["predicted_s"] / out["recorded_s"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m audit.costmodel fit DIR... [--out FILE]` | `check DIR...`."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m audit.costmodel")
    parser.add_argument("command", choices=("fit", "check"))
    parser.add_argument("runs", nargs="+", metavar="DIR")
    parser.add_argument("--out", help="fit: write the parameters here (default: print them)")
    parser.add_argument("--free-gib", nargs="*", default=[], metavar="DEVICE=GIB",
                        help="fit: the reference machine's free memory per device type, e.g. cuda=139")
    args = parser.parse_args(argv)
    runs = [RunData.load(d) for d in args.runs]
    if args.command == "fit":
        params = fit(runs)
        free = {k: float(v) * 2**30 for k, v in (item.split("=") for item in args.free_gib)}
        for folder, run in zip(args.runs, runs):
            info = json.loads((Path(folder) / "run.json").read_text())
            for device, ceil in (run.ceilings or {}).items():
                dev = _device_type(device)
                if dev not in params.reference:
                    env = info.get("env") or {}
                    params.reference[dev] = {
                        "device_name": env.get("device_name") if dev == "cuda" else env.get("cpu_model"),
                        "ceilings": ceil, "free_bytes": int(free[dev]) if dev in free else None}
        if args.out:
            Path(args.out).write_text(params.to_json())
        else:
            print(params.to_json(), end="")
        return 0
    model = CostModel()
    for run in runs:
        table = compare(run, model)
        ok = table[table["status"] == "ok"]
        print(f"{run.name}: recorded {table['recorded_s'].sum():.1f} s, predicted {table['predicted_s'].sum():.1f} s; "
              f"ok cells within 2x: {int(((ok['ratio'] <= 2) & (ok['ratio'] >= 0.5)).sum())}/{len(ok)}")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
