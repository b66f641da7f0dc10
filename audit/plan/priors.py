"""What the cost model knows before it predicts a cell: its fitted constants (Params: their format,
JSON, and how a newer fit is merged over them), the priors it ships with (cost_priors.json), which
of them are the host's own seconds (HOST_BOUND), and the defaults where nothing was fitted.

The shipped priors are fitted on the shared H200 records (tests/data/h200-2026-11-30) and CPU
runs (tests/data/cpu-*); costfit.fit refits them from any run folders (`audit fit-costs`), and
costmodel.CostModel predicts with them. Pure Python.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PRIORS_FILE = Path(__file__).with_name("cost_priors.json")


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
    golden_read_s: dict[str, float] = field(default_factory=dict)   # "cpu" -> s per reference read back, beyond read_s
    # phasefit (records with phase_s): "cpu" -> [constant, factor on the warm-up calls' seconds] ...
    warmup_call: dict[str, list[float]] = field(default_factory=dict)
    # ... [constant, factor on the checks' forwards, on their forward+backwards, s per tensor element,
    # per exposed-weights chunk, per its float64 FLOP, per leak probe] (checks_calls, tensor_elems)
    checks_call: dict[str, list[float]] = field(default_factory=dict)
    real_diagnosis_s: dict[str, float] = field(default_factory=dict)   # "cpu" -> mean s a real variant's cell diagnoses
    golden_set_s: dict[str, float] = field(default_factory=dict)     # phasefit: s per golden built, and ...
    golden_score_s: dict[str, float] = field(default_factory=dict)   # ... per float64 score element (slices·Tq·Tk)
    diagnosis_s: dict[str, float] = field(default_factory=dict)   # "cpu" -> s per diagnosed cell (schema 7)
    # s per compile: "cpu|flex|hit" / "cpu|flex|miss" by Inductor's cache, "cpu|flex" outcome unknown
    compile_s: dict[str, float] = field(default_factory=dict)
    argument_compile_s: dict[str, float] = field(default_factory=dict)   # "cpu|flex": an argument probe's recompile
    init_s: dict[str, float] = field(default_factory=dict)        # "cuda|sdpa" -> first cell of a run
    run_start_s: dict[str, float] = field(default_factory=dict)
    compile_start_s: dict[str, float] = field(default_factory=dict)  # the run's first compiled cell ("cpu|miss")
    skip_s: dict[str, float] = field(default_factory=dict)
    # "cpu" -> the share of --noise-cap-s a measurement samples beyond its minimum on average (a noisy
    # machine's near 1, an idle one's near 0): costfit._fit_noise, from records' fwd_extra_s
    noise_share: dict[str, float] = field(default_factory=dict)
    # outside the cells (plan.overhead): "cpu|start_s", "cpu|report_s", "cpu|between_cell_s", ...
    overhead: dict[str, float] = field(default_factory=dict)
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


# The constants that are the host's own work (Python, the C++ compiler, bookkeeping, float64 goldens
# on the host), fitted in the reference host's seconds (costfit divides each run's by its host factor,
# plan.overhead.host_factor) and predicted times this host's factor: a machine whose first plan has
# no history of its own is predicted from its host probe, not from the machines the priors were fitted
# on. Per-call times scale with the measured ceilings instead. Rates (a table of "per second") divide.
HOST_BOUND: tuple[str, ...] = ("cell_s", "golden_chunk_s", "weights_chunk_s", "diagnosis_s", "compile_s",
                               "argument_compile_s",
                               "compile_start_s", "init_s", "run_start_s", "skip_s", "masked_row_s",
                               "host_call_s", "golden_read_s", "real_diagnosis_s", "golden_set_s", "golden_score_s")
HOST_BOUND_RATES: tuple[str, ...] = ("golden_flops_per_s",)

# Where nothing was fitted: how a family of variants spends its time, per device type.
# (c0 seconds, a, b, m, e) on call_features: hand-written code runs its matmuls in the input dtype and
# passes over the score matrix a few times; fused kernels run near the attention probe's rate (on a GPU,
# where none is measured, the dtype's matmul's).
FAMILY_DEFAULTS: dict[str, dict[str, tuple[float, float, float, float, float]]] = {
    "cpu": {"eager": (2e-5, 1.5, 0.0, 6.0, 0.0), "fused": (2e-5, 0.0, 0.0, 0.5, 1.5),
            "compiled": (5e-5, 1.0, 0.0, 4.0, 0.0)},
    "cuda": {"eager": (5e-5, 3.0, 0.0, 6.0, 0.0), "fused": (3e-5, 0.0, 0.0, 0.2, 1.5),
             "compiled": (5e-5, 2.0, 0.0, 3.0, 0.0)},
}
BACKWARD_DEFAULT_FACTOR = 3.0
# A run's first CPU compile builds Inductor's precompiled headers where they are not built (compile_cache.
# headers_built): what that takes beyond the compiler's start without it, in the reference host's seconds,
# where no run of this machine fitted the start with the headers built ("cpu|miss|headers"). Measured on a
# 2-core AVX2-only EPYC (host factor about 2): the first compiled cell's compile 14.3 s with them to build,
# 6.7 s with them built.
HEADERS_BUILD_S = 3.8
HOST_CALL_DEFAULT_S = {"cpu": 0.0, "cuda": 60e-6}
# The share of --noise-cap-s a measurement samples beyond its minimum where no run fitted it (costfit.
# _fit_noise); cpu: 3 idle quick runs (2-core Xeon VM, 0.2 ms blocks) used 1.9-2.4% of a 0.2 s cap;
# cuda: an H200's device-timed samples, 1 of 146 wider than ±3% (docs/measurement.md)
NOISE_SHARE_DEFAULT = {"cpu": 0.03, "cuda": 1 / 146}
# A diagnosed cell (measure/diagnosis/diagnosis.py), where nothing was fitted: a fixed part, plus every known
# mistake's float64 forward over the diagnosis slices at this rate. Measured on 2 cores of an AMD
# EPYC: 11 ms at T=64 (H=4, d=64), 47 ms at T=256 with GQA, 180 ms at T=1024 (one slice).
DIAGNOSIS_DEFAULT_S = {"cpu": 0.005, "cuda": 0.002}   # cuda: ~10 launches per mistake, unmeasured
# The referee's own time in a cell besides its calls (the wait for work a call left running, copies,
# bitwise comparisons, sealing): 6.6 ms a cell on quick's CPU cells (2-core Intel Xeon); not fitted.
REFEREE_DEFAULT_S = {"cpu": 0.007, "cuda": 0.002}
DIAGNOSIS_FLOPS_PER_S = {"cpu": 3e10, "cuda": 2e13}   # cuda: an H200 at a third of its float64 peak, unmeasured
