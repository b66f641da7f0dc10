"""The record schema, the JSONL store and the DataFrame view.

A record is a plain dict: the cell's axes, a status with a reason, the
measurements and the environment. Failure is a status, never a fake number:
a measurement that was not taken is None (null), while NaN counts are data.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from .referee import REFEREE_CHECKS, column as referee_column
from .runfolder import QUARANTINE_FILE, RECORDS_FILE

SCHEMA_VERSION = 16
STATUSES = ("ok", "skipped", "error", "oom", "timeout")

# Every column a user can rely on, with its meaning. docs/output.md's column table is
# checked against this dict by a test, so adding a metric means: one function
# that computes it, one entry here.
COLUMNS: dict[str, str] = {
    "schema": "record schema version (integer)",
    "id": "cell id: variant-device-dtype-d{d_k}-T{seq_len}-B{batch}-H{heads}-{causal|full}-{scenario}; a GQA/MQA cell adds -KV{kv_heads} after H, a cell with d_v != d_k adds v{d_v} after d{d_k} (d192v128)",
    "variant": "attention implementation (`python -m audit list`), broken.* for negative controls, or the plug-in spec",
    "device": "cpu or cuda",
    "dtype": "input dtype: fp32, fp16 or bf16",
    "d_k": "head dimension of queries and keys",
    "d_v": "head dimension of values and of the output: d_k unless the cell is latent attention (DeepSeek's MLA: d_k 192, d_v 128); v is (B, kv_heads, T, d_v)",
    "seq_len": "key length T (also the query length, except in the decode and cross_causal scenarios)",
    "batch": "batch size B",
    "heads": "number of heads H (query heads)",
    "kv_heads": "number of key/value heads: heads for multi-head attention, fewer for GQA (heads a multiple of it), 1 for MQA; k and v are (B, kv_heads, T, d_k)",
    "causal": "true: causal (top-left aligned) masking",
    "scenario": "input scenario (docs/scenarios.md); normal: q, k, v ~ N(0, 1)",
    "status": "ok, skipped, error, oom (out of memory, or predicted not to fit in the free memory: then not run) or timeout (over the per-cell time limit: its worker was killed)",
    "reason": "why a cell is not ok; for an ok cell, what was not measured (e.g. forward only: no backward), else null",
    "fwd_ms": "median forward latency in ms (inputs require grad, as in training)",
    "fwd_iqr_ms": "interquartile range of the forward samples in ms",
    "fwd_n": "number of forward samples",
    "fwd_bwd_ms": "median forward+backward latency in ms",
    "fwd_bwd_iqr_ms": "interquartile range of the forward+backward samples in ms",
    "fwd_bwd_n": "number of forward+backward samples",
    "fwd_samples_s": "raw forward samples, seconds per call",
    "fwd_bwd_samples_s": "raw forward+backward samples, seconds per call",
    "fwd_ci_rel": "how well fwd_ms is known: the half-width of its median's 95% confidence interval (order statistics of fwd_samples_s; under 6 samples, their range) over the median; 0.03 = ±3% (docs/measurement.md, Timing noise)",
    "fwd_bwd_ci_rel": "the same for fwd_bwd_ms",
    "fwd_extra_s": "seconds the forward measurement sampled beyond its fixed minimum, to bring fwd_ci_rel under noise_target (at most --noise-cap-s)",
    "fwd_bwd_extra_s": "the same for forward+backward",
    "noise_target": "the run's --noise-target as a fraction (0.03: ±3%): a cell whose fwd_ci_rel or fwd_bwd_ci_rel stays above it is unstable (the timing_unstable warning); null: not judged",
    "timer": "how time was measured (cpu: perf_counter around blocks of calls; cuda: CUDA events around blocks of calls queued behind a spin kernel, the device's own time)",
    "fwd_host_ms": "CUDA: median host time to issue one forward call (Python, dispatch, launches), ms",
    "fwd_bwd_host_ms": "CUDA: median host time to issue one forward+backward call, ms",
    "fwd_fenced_ms": "CUDA: per-call time of a block of the timed forward calls between two device-wide synchronizes (every stream, host issue time included); the referee compares it with fwd_ms (docs/generated-kernels.md)",
    "fwd_bwd_fenced_ms": "CUDA: the same for forward+backward",
    "host_bound": "CUDA: true when issuing the calls takes the host longer than the device takes to run them (forward or forward+backward): in a plain loop the GPU would wait for Python; fwd_ms is the device's time either way",
    "l2_flush": "CUDA: true when the L2 was flushed (a 256 MiB buffer overwritten) before every timed sample (--l2-flush)",
    "cuda_graph": "true when CUDA-graph replays were timed (--cuda-graph); never compare timings across these methods",
    "compile_s": "compiled variants: first-call time minus steady-state time, forward plus forward+backward, in the cell that compiled (null for eager variants and reused code)",
    "compile_reused": "compiled variants: true when the cell reused code compiled by an earlier cell of the same shapes, dtype, causal flag and mask kind (no compile here)",
    "compile_cache": "compiled variants, in the cell that compiled: hit (every kernel was already built in Inductor's on-disk cache, TORCHINDUCTOR_CACHE_DIR) or miss (the compile built some: it wrote new files there); null without a compile here, or before schema 5",
    "graph_breaks": "compiled variants: graph breaks Dynamo met compiling and running this cell's code (kept across the cells that reuse it; 0 = one graph each time); the code between the pieces ran eagerly. flex compiles with fullgraph=True, so a break is its error instead. Plug-ins that compile inside: set when they broke",
    "fused_sdpa": "compiled variants: true when Inductor rewrote the code into fused SDPA (its numerics are then SDPA's)",
    "sdpa_backend": "SDPA variants: the backend that ran (the forced one, or the dispatcher's choice for `sdpa`)",
    "peak_bytes": "peak memory of one forward call above the baseline, bytes (cpu: VmHWM; cuda: allocator peak)",
    "peak_fwd_bwd_bytes": "peak memory of one forward+backward call above the baseline, bytes",
    "leaked_bytes": "memory the variant kept across its timed calls (held after them minus held after the warm-up; CUDA: allocator, CPU: resident set after trimming), when over 64 MiB; else null",
    "flops": "forward FLOPs, 4*B*H*Tq*Tk*d_k, causal counting visible pairs only",
    "gflops_per_s": "achieved forward GFLOP/s (flops / fwd_ms)",
    "fwd_bwd_gflops_per_s": "achieved forward+backward GFLOP/s (3.5 * flops / fwd_bwd_ms)",
    "q_len": "query length Tq (seq_len is the key length; they differ in decode and cross_causal)",
    "out_nan": "NaN count in the output",
    "out_inf": "inf count in the output",
    "out_nonfinite_visible": "NaN+inf count in output rows that see at least one key (the float64 golden is finite there)",
    "grad_nan": "NaN count in the gradients of q, k and v together",
    "grad_inf": "inf count in the gradients of q, k and v together",
    "failure_file": "an error or oom cell: the run folder's file holding its whole failure (failures/<id>.txt: the exception chain with its stacks and full messages, a compiler's output included); null otherwise",
    "failed_after": "an error or oom cell: the cells of the same variant its measuring process ran before it, in order (a compile failure that shows only on a recompile needs them: its reproduction script replays them); null when it was the variant's first",
    "golden_source": "how the cell got its input set's float64 reference: built, or read from the golden store (a reference an earlier cell or run built, kept on disk: docs/planning.md, The golden store); null where an earlier cell of the same set had it in memory",
    "golden_subset": "null when the float64 golden covers every (batch, head) slice; else the [b, h] slices it covers (evenly spaced, fixed by the shapes: docs/numerics.md, Golden reference). Error, gradient-error and saturation columns are over these slices; NaN/inf counts, masked_rows and leak_max_change over the whole output",
    "max_abs_err": "max |out - golden| against the float64 reference, over rows that see a key",
    "rmse": "root-mean-square of out - golden over rows that see a key",
    "rel_err": "relative Frobenius error ||out - golden|| / ||golden|| over rows that see a key",
    "err_ratio": "rmse / rmse of the same-dtype baseline (`eager` in the input dtype, same inputs)",
    "within_budget": "rmse <= 2 * baseline rmse + atol(dtype) (FlashAttention's rule); null when the baseline is not finite",
    "dq_err": "relative Frobenius error of dL/dq against float64 gradients",
    "dk_err": "relative Frobenius error of dL/dk against float64 gradients",
    "dv_err": "relative Frobenius error of dL/dv against float64 gradients",
    "dq_err_ratio": "RMSE of dq against the float64 golden's over that of the same-dtype baseline's dq (hand-written attention in the input dtype, rows that see no key 0, same inputs and upstream gradient); null when not judged",
    "dk_err_ratio": "the same for dk",
    "dv_err_ratio": "the same for dv",
    "dq_within_budget": "dq's RMSE <= 2 * the baseline's + atol(dtype) (the gradient budget: docs/numerics.md); null when the gradients are not finite (the nonfinite check's) or the baseline's are not, or the cell ran forward only",
    "dk_within_budget": "the same for dk",
    "dv_within_budget": "the same for dv",
    "grad_diagnosis": "cells whose gradients are outside their budget: the known backward mistake (docs/numerics.md, Diagnosis) whose float64 gradients the variant's match within their budgets, or none; several the cell cannot tell apart are named together, `a or b`; null where nothing was diagnosed",
    "grad_diagnosis_err": "the largest RMSE of a gradient against the matched backward mistake's, over the gradients compared (null when none matched)",
    "grad_diagnosis_golden_err": "the largest RMSE of a gradient against the float64 golden's, over the gradients compared",
    "dsinks_err": "sinks cells: relative error of the sinks' gradient (H,) against the float64 golden's; null where the golden covers a subset of (batch, head) slices or the gradients are not finite",
    "dsinks_err_ratio": "RMSE of the sinks' gradient over that of the same-dtype baseline's; null when not judged",
    "dsinks_within_budget": "the sinks' gradient RMSE <= 2 * s(H) * the baseline's + atol(dtype), s(H) the chance spread of an RMSE of H values (docs/numerics.md); null when not judged",
    "lse_err": "variants returning the log-sum-exp: RMSE (absolute) of their lse against the float64 golden's on the rows that see a key, in the keys-only convention (a variant declaring lse_includes_sink has the sink taken out)",
    "lse_err_ratio": "lse_err over the same-dtype baseline's (hand-written logsumexp of the scores in the input dtype)",
    "lse_within_budget": "lse_err <= 2 * the baseline's + atol(dtype) (docs/numerics.md, The log-sum-exp); null when the baseline's is not finite",
    "lse_masked_rows": "what the returned lse is on rows that see no key: -inf, +inf, zero, nan, finite or mixed; null when no row is fully masked (a merge reads only -inf and +inf as empty)",
    "merge_err": "RMSE against the float64 golden of the variant's (out, lse) on the keys split in two, merged as split-KV and ring attention merge them (sinks applied once, after); null where the variant cannot take a half's mask (reason says) or the keys cannot be split",
    "merge_err_ratio": "merge_err over that of the same-dtype baseline's merge",
    "merge_within_budget": "merge_err <= 2 * the baseline's + atol(dtype); null when not judged",
    "lse_differentiable": "whether the returned lse carries a gradient (requires_grad in a forward+backward cell)",
    "lse_dq_err_ratio": "RMSE of the gradient through the lse alone (dq of <lse, grad_lse>, grad_lse random) against the golden's, over the same-dtype baseline's",
    "lse_dk_err_ratio": "the same for dk (the lse does not depend on v)",
    "lse_grads_within_budget": "dq and dk through the lse both within 2 * the baseline's + atol(dtype); null when one is not judged, the cell's gradients are not finite (the nonfinite check's) or it ran forward only",
    "lse_diagnosis": "cells whose lse or merge is outside its budget: the known lse mistake (docs/numerics.md, The log-sum-exp) they match, or none (`a or b` where two match or the cell cannot tell them apart); null where nothing was diagnosed",
    "lse_diagnosis_err": "RMSE of the variant's lse (or merged output) against the matched mistake's (null when none matched)",
    "lse_diagnosis_golden_err": "the same against the float64 golden's",
    "lse_grad_diagnosis": "cells whose gradient through the lse is outside its budget: the known lse gradient mistake it matches (lse_no_grad), or none (`a or b` as lse_diagnosis)",
    "lse_grad_diagnosis_err": "the larger RMSE of dq, dk through the lse against the matched mistake's (null when none matched)",
    "lse_grad_diagnosis_golden_err": "the same against the float64 golden's",
    **{referee_column(name): f"referee: true when {meaning}; false when not (referee_detail says what was seen); null where it could not run (docs/generated-kernels.md)"
       for name, meaning in REFEREE_CHECKS.items()},
    "referee_detail": "per failed referee check: the call and the numbers seen ({check: text}); null when every check that ran passed",
    "max_logit": "max |q·k·scale| over visible pairs (float64); compare with the dtype's max",
    "max_qk": "max |q·k| before scaling over visible pairs (what an unscaled-first matmul must hold)",
    "max_prob": "mean over query rows of the largest attention probability",
    "entropy": "mean normalized row entropy H(p) / log(visible keys)",
    "min_entropy": "minimum normalized row entropy",
    "onehot_frac": "fraction of query rows whose largest probability exceeds 0.99",
    "golden_onehot_frac": "onehot_frac of the float64 golden on the same inputs (what the inputs alone cause)",
    "saturation_source": "variant: the four saturation columns come from the variant's own weights; golden: from the float64 golden (variants that hide their weights)",
    "underflow_frac": "fraction of probabilities that are exactly 0 where the golden is > 0 (variants exposing weights)",
    "leak_mass": "largest probability mass a row puts on masked or future keys (variants exposing weights)",
    "leak_max_change": "largest output change, on rows that must not see them, when masked-out keys and values change (0 = no leak; null when nothing is masked)",
    "arguments": "cells where arguments are probed (docs/numerics.md, Arguments): each probed argument (scale, causal, mask, softcap, sinks, cu_seqlens, window, block_table, kv_heads; lse on the scale probe of a variant returning one) -> honoured, ignored, misapplied, accepted (kv_heads: computed where it must refuse), unjudged, uninformative, refused or failed; null where none is probed",
    "argument_evidence": "the same arguments -> {moved: RMSE of the output's change, golden_moved: RMSE of the float64 golden's, err: RMSE of their difference, budget: the most err may be} (refused: {reason}; kv_heads: {heads, kv_heads, raised or returned}); null where none is probed",
    "cross_doc_max_change": "packed cells: largest change of the even-numbered documents' output when the other documents' keys and values (and the padding's) change (0 = no cross-document attention; null outside packed cells)",
    "page_size": "paged cells of a paged variant: slots per page of the cache it was given (the preset's, or the size the kernel declares)",
    "paged_unread_max_change": "paged cells, paged variants: largest output change between two calls whose pools differ only in the slots a correct kernel must not read (finite values there instead of NaN; 0 = it reads none; null otherwise)",
    "paged_diagnosis": "paged cells where paged_unread_max_change > 0: the paged mistake (docs/numerics.md) the output on the first pool matches in float64, or none (`a or b` where two match or the cell cannot tell them apart)",
    "paged_diagnosis_err": "RMSE of that output against the matched paged mistake",
    "batch_invariant": "true when batch row 0 computed alone (B = 1) equals, bit for bit, the same row in the full batch (cells with B >= 2 and no mask tensor; null elsewhere)",
    "batch_max_diff": "largest |difference| between row 0 alone and in the batch",
    "chunk_invariant": "true when the queries in two chunks (chunked prefill: the first half against the first half of the keys, the second against all keys, bottom-right aligned) equal the single-shot output bit for bit (the batch check's cells)",
    "chunk_max_diff": "largest |difference| between the two-chunk and the single-shot output",
    "chunk_within_budget": "the two-chunk output within the cell's error budget against the float64 golden",
    "invariance_reason": "why a batch or chunk invariance column is null where the check applies (the variant's call on a batch row alone or on a chunk failed)",
    "masked_rows": "what the variant returns on fully masked rows: nan, zero, uniform, other or mixed (null when none)",
    "causal_alignment": "causal with q_len != seq_len: which alignment the output follows (top-left, bottom-right, neither)",
    "golden_alignment": "causal with q_len != seq_len: the alignment the golden, the error columns, the leak check and the masked-row check follow: the variant's declared one (top-left unless a plug-in declares bottom-right; docs/variants.md)",
    "diagnosis": "cells with a numerics defect (outside the error budget, a leak, NaN/inf where the golden is finite): the known mistake (docs/numerics.md, Diagnosis) whose float64 output the variant's output matches within the dtype's budget, or none; where two match, or the cell cannot tell a match from another, every one: `a or b` (core/diagnosis_names.py); null where nothing was diagnosed",
    "diagnosis_err": "RMSE of the output against the matched mistake's float64 output, on the diagnosis slices (of several named, the smallest; null when none matched)",
    "diagnosis_golden_err": "RMSE of the output against the correct float64 golden on the same slices",
    "diagnosis_slices": "the [b, h] slices the diagnosis compared (within golden_subset, capped by a float64 FLOP budget)",
    "repeat_runs": "how many runs of each of out, dq, dk and dv on identical inputs were compared: 3 (out: the warm-up call, the numerics call and the warm-up forward+backward's forward; the gradients: the warm-up call, the numerics call and the last timed call)",
    "repeat_differs": "which of out, dq, dk, dv were not bitwise identical across those runs ([] = deterministic; null when not checked)",
    "repeat_max_diff": "largest |difference| between runs over the tensors that differed (0 when bitwise identical; inf when NaN appeared in one run only)",
    "deterministic_algorithms": "true when the cell ran under torch.use_deterministic_algorithms(True) (--deterministic)",
    "deterministic_refused": "with --deterministic: true on the skipped cell of a variant that raised because an operation has no deterministic implementation (false when it ran)",
    "pct_of_limit": "forward: max(FLOPs / measured matmul FLOP/s, bytes / measured copy bandwidth) / fwd time (1 = at the machine's measured limit)",
    "fwd_bwd_pct_of_limit": "the same for forward+backward (FLOPs 3.5x forward; bytes of both passes)",
    "bound": "which limit binds the forward: compute or memory",
    "fwd_bwd_bound": "which limit binds forward+backward",
    "bytes": "fewest bytes a forward must move: read Q, K, V (and mask), write O",
    "fwd_bwd_bytes": "fewest bytes of forward+backward (backward reads Q, K, V, O, dO, writes dQ, dK, dV)",
    "peak_flops_per_s": "the run's measured matmul FLOP/s for this device: the better of the dtype's and fp32's, since a kernel may upcast (run.json: ceilings)",
    "peak_bytes_per_s": "the run's measured device-to-device copy bandwidth, bytes read + written per second",
    "energy_per_call_j": "CUDA: joules per forward call: mean power over the energy window × device time per call (docs/measurement.md)",
    "energy_method": "counter (NVML energy counter, window between two of its updates), counter (unaligned), or power×time (no counter), then 'over' the calls: CUDA-graph replays or eager calls",
    "mean_power_w": "CUDA: mean board power during the energy window from the energy counter, W",
    "sampled_power_w": "CUDA: mean of instantaneous power readings during the window, W (an independent check of mean_power_w)",
    "sampled_power_source": "CUDA: where sampled_power_w came from: instant (NVML_FI_DEV_POWER_INSTANT), average (nvmlDeviceGetPowerUsage, a lagging 1 s average on Ampere and newer), null when no power was read",
    "energy_idle_frac": "CUDA: fraction of the window the GPU waited between calls: the larger of the gaps between the window's units (CUDA events) and 1 - calls × per-call time / device time (with --l2-flush the per-call time is timed hot, without the flush; null when it cannot be); above 0.05 the reason says the energy includes idle power",
    "sm_clock_mhz": "CUDA: median SM clock during the window, MHz",
    "temperature_c": "CUDA: highest GPU temperature during the window, °C",
    "throttle_reasons": "CUDA: clock throttle reasons seen during the window (names)",
    "energy_calls": "forward calls run while measuring energy",
    "energy_window_s": "length of the energy window (between two updates of the energy counter), s",
    "energy_cost_s": "CUDA: wall time the energy measurement added to the cell (graph capture and window), s",
    "energy_read_s": "CUDA: median host time one read of NVML's energy counter took in the cell, s (the GPU's queued work must outlast it; an edge of the window is timed to about one read)",
    "telemetry_reason": "why telemetry columns are null or partial (no GPU, no driver, ...)",
    "elapsed_s": "wall time spent on the cell, seconds",
    "phase_s": "where the cell's elapsed_s went: seconds per phase (setup, golden, compile, warmup, numerics, leak, determinism, diagnosis, saturation, referee, timed, energy: core/timesplit.py CELL_PHASES), only the phases the cell went through; the report's Time budget section sums them",
    "predicted_s": "the cost model's prediction of the cell's wall time when the run was planned, seconds (docs/planning.md)",
    "started_at": "UTC time the cell started (ISO 8601)",
    "env": "environment: torch version, device name, CPU model, threads, git commit, cpu_allocator (pinned malloc thresholds), NVML info",
}


def new_record(case_axes: dict[str, Any], case_id: str) -> dict[str, Any]:
    """A record with every column present; measurements start as None."""
    rec: dict[str, Any] = {col: None for col in COLUMNS}
    rec.update(case_axes)
    rec["schema"] = SCHEMA_VERSION
    rec["id"] = case_id
    return rec


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: store them as the strings "NaN", "Infinity", "-Infinity"."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_V1_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # schema 1's spelling


def _restore(value: Any, table: dict[str, float] = _NONFINITE) -> Any:
    """Non-finite floats back from their string form, through nested dicts and lists."""
    if isinstance(value, str) and value in table:
        return table[value]
    if isinstance(value, dict):
        return {k: _restore(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v, table) for v in value]
    return value


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(_clean(record), default=_json_default, allow_nan=False, sort_keys=False)


class RecordWriter:
    """Appends one record per line and makes it durable before returning (durable=False: at
    the next durable write or close, for records a rerun would write the same, such as cells
    the budget skipped: an fsync each cost a planned cut as much as its bookkeeping).

    A run killed mid-write (kill -9) can leave a partial last line; opening the
    store truncates it, so a resumed run never writes after garbage.
    """

    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / RECORDS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _truncate_partial_line(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any], *, durable: bool = True) -> None:
        self._fh.write(dumps(record) + "\n")
        self._fh.flush()               # other processes (the supervisor, a merge) see it now
        if durable:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _truncate_partial_line(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1  # 0 when the only line is partial
    with open(path, "r+b") as fh:
        fh.truncate(keep)


def _v1_to_v2(record: dict[str, Any]) -> dict[str, Any]:
    """v2 added the numerics-audit columns; v1 cells had q_len == seq_len and golden saturation."""
    record = _restore(record, _V1_NONFINITE)
    out = {col: record.get(col) for col in COLUMNS}
    out.update({k: v for k, v in record.items() if k not in out})
    out["q_len"] = record.get("seq_len")
    if record.get("max_prob") is not None:
        out["saturation_source"] = "golden"
    out["schema"] = 2
    return out


def _with_columns(record: dict[str, Any], schema: int) -> dict[str, Any]:
    """The record with every current column (those it lacks null) and its other keys kept."""
    out = {col: record.get(col) for col in COLUMNS}
    out.update({k: v for k, v in record.items() if k not in out})
    out["schema"] = schema
    return out


def _v2_to_v3(record: dict[str, Any]) -> dict[str, Any]:
    """v3 added golden_subset (v2 goldens covered every slice), host-side timing, compile reuse
    and the energy window's idle fraction and sampled power (absent before: null)."""
    return _with_columns(record, 3)


def _v3_to_v4(record: dict[str, Any]) -> dict[str, Any]:
    """v4 added kv_heads (GQA/MQA); every earlier cell was multi-head: kv_heads = heads."""
    out = _with_columns(record, 4)
    if out.get("kv_heads") is None:          # absent, or null from an earlier step's column list
        out["kv_heads"] = record.get("heads")
    return out


def _v4_to_v5(record: dict[str, Any]) -> dict[str, Any]:
    """v5 added compile_cache (whether a compile came from Inductor's cache: unknown before, null)."""
    return _with_columns(record, 5)


def _v5_to_v6(record: dict[str, Any]) -> dict[str, Any]:
    """v6 added golden_alignment; every earlier golden was top-left (where an alignment applied)."""
    out = _with_columns(record, 6)
    if out.get("causal_alignment") is not None:
        out["golden_alignment"] = "top-left"
    return out


def _v6_to_v7(record: dict[str, Any]) -> dict[str, Any]:
    """v7 added the diagnosis and determinism columns (not measured before: null)."""
    return _with_columns(record, 7)


def _v7_to_v8(record: dict[str, Any]) -> dict[str, Any]:
    """v8 added graph_breaks, sampled_power_source and energy_read_s (not recorded before: null)."""
    return _with_columns(record, 8)


def _v8_to_v9(record: dict[str, Any]) -> dict[str, Any]:
    """v9 added phase_s (where a cell's time went; not recorded before: null)."""
    return _with_columns(record, 9)


def _v9_to_v10(record: dict[str, Any]) -> dict[str, Any]:
    """v10 added the gradient budget (dq/dk/dv_err_ratio, dq/dk/dv_within_budget) and the backward
    diagnosis (grad_diagnosis*); not judged before: null."""
    return _with_columns(record, 10)


def _v10_to_v11(record: dict[str, Any]) -> dict[str, Any]:
    """v11 added the log-sum-exp checks (lse_*, merge_*, lse_differentiable, lse_diagnosis*,
    lse_grad_diagnosis*) and the
    sinks' gradient (dsinks_*); not measured before: null."""
    return _with_columns(record, 11)


def _v11_to_v12(record: dict[str, Any]) -> dict[str, Any]:
    """v12 added the referee (referee_<check>, referee_detail) and CUDA's device-wide fenced times
    (fwd_fenced_ms, fwd_bwd_fenced_ms); not checked before: null."""
    return _with_columns(record, 12)


def _v12_to_v13(record: dict[str, Any]) -> dict[str, Any]:
    """v13 added d_v (latent heads) and the packed, paged and invariance columns; every earlier cell had
    d_v = d_k, and the new columns read null."""
    out = _with_columns(record, 13)
    if out.get("d_v") is None:
        out["d_v"] = record.get("d_k")
    return out


def _v13_to_v14(record: dict[str, Any]) -> dict[str, Any]:
    """v14 added golden_source (whether a cell's float64 reference was built or read back from the
    golden store), and a failed cell's failure_file and failed_after; not recorded before: null."""
    return _with_columns(record, 14)


def _v14_to_v15(record: dict[str, Any]) -> dict[str, Any]:
    """v15 added the argument probes (arguments, argument_evidence); not probed before: null."""
    return _with_columns(record, 15)


def _v15_to_v16(record: dict[str, Any]) -> dict[str, Any]:
    """v16 added how well each median is known (fwd_ci_rel, fwd_bwd_ci_rel: computed here from the
    raw samples), the extra sampling (fwd_extra_s, fwd_bwd_extra_s) and noise_target (null: an older
    run had no target, so its cells are not judged unstable)."""
    from .noise import ci_rel
    out = _with_columns(record, 16)
    for prefix in ("fwd", "fwd_bwd"):
        samples = record.get(f"{prefix}_samples_s")
        if out.get(f"{prefix}_ci_rel") is None and isinstance(samples, list) and samples:
            out[f"{prefix}_ci_rel"] = ci_rel([float(x) for x in samples])
    return out


MIGRATIONS = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6, 6: _v6_to_v7, 7: _v7_to_v8,
              8: _v8_to_v9, 9: _v9_to_v10, 10: _v10_to_v11, 11: _v11_to_v12, 12: _v12_to_v13,
              13: _v13_to_v14, 14: _v14_to_v15, 15: _v15_to_v16}


class NewerSchema(ValueError):
    """Records written by a newer attn-audit: reading them would misread them."""


def migrate(record: dict[str, Any]) -> dict[str, Any]:
    """Bring a record of any known schema version to the current one, step by step."""
    version = record.get("schema")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise NewerSchema(f"record schema {version} is newer than this attn-audit's schema {SCHEMA_VERSION}: "
                          "update attn-audit to read it")
    while version != SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise ValueError(f"record schema {version!r} is not supported (this is schema {SCHEMA_VERSION})")
        record = MIGRATIONS[version](record)
        version = record["schema"]
    return record


def parse_line(line: str) -> dict[str, Any]:
    """One JSONL line as a current record. Raises NewerSchema, or ValueError for a line that is
    not a record (not JSON, not an object, no cell id, an unknown status or schema)."""
    raw = json.loads(line)
    if not isinstance(raw, dict):
        raise ValueError(f"not a JSON object but {type(raw).__name__}")
    record = migrate(_restore(raw))
    if not isinstance(record.get("id"), str):
        raise ValueError("no cell id")
    if record.get("status") is not None and record["status"] not in STATUSES:
        raise ValueError(f"unknown status {record['status']!r}")
    return record


def iter_records(path: Path | str) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file; a partial last line (interrupted write) is ignored, and so is a
    damaged line (quarantine_damaged moves those aside). Raises NewerSchema."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # interrupted write
            line = line.strip()
            if line:
                try:
                    yield parse_line(line)
                except NewerSchema:
                    raise
                except ValueError:
                    continue


def quarantine_damaged(run_dir: Path | str) -> list[tuple[int, str]]:
    """Move every damaged line of DIR/records.jsonl (not JSON, not a record of a known schema)
    to DIR/records.quarantine.jsonl, each with its line number and why; the cell is then
    missing and a rerun measures it again. Returns [(line number, why)]. Raises NewerSchema
    (a newer attn-audit's records are not damaged: they must not be moved)."""
    path = Path(run_dir) / RECORDS_FILE
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    keep, moved = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            parse_line(line)
            keep.append(line)
        except NewerSchema:
            raise
        except ValueError as exc:
            moved.append((number, line, f"{type(exc).__name__}: {str(exc)[:200]}"))
    if not moved:
        return []
    last_partial = not lines[-1] == ""
    with open(Path(run_dir) / QUARANTINE_FILE, "a", encoding="utf-8") as fh:
        for number, line, why in moved:
            if last_partial and number == len(lines):
                continue                                   # an interrupted last write: just dropped
            fh.write(json.dumps({"line": number, "why": why, "text": line}) + "\n")
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
    os.replace(tmp, path)
    return [(number, why) for number, _, why in moved if not (last_partial and number == len(lines))]


def read_records(run_dir: Path | str) -> list[dict[str, Any]]:
    path = Path(run_dir) / RECORDS_FILE
    return list(iter_records(path)) if path.exists() else []


def completed_ids(run_dir: Path | str) -> set[str]:
    """Ids already recorded: a resumed run does not redo them."""
    return {r["id"] for r in read_records(run_dir)}


ENV_COLUMNS = ("torch", "device_name", "cpu_model", "threads", "git_commit")


def to_frame(records: Iterable[dict[str, Any]]):
    """Tidy DataFrame: one row per cell, the COLUMNS plus env_* columns."""
    import pandas as pd

    rows = []
    for rec in records:
        row = {k: v for k, v in rec.items() if k != "env"}
        env = rec.get("env") or {}
        for key in ENV_COLUMNS:
            row[f"env_{key}"] = env.get(key)
        rows.append(row)
    every = [c for c in COLUMNS if c != "env"] + [f"env_{k}" for k in ENV_COLUMNS]
    if not rows:
        return pd.DataFrame(columns=every)
    # The last record of an id wins (a cell measured twice keeps the newer one). Every column is
    # there (null where no record has it: a hand-edited file, a plug-in's extra keys aside), so a
    # rule, table or figure never meets a frame without one.
    frame = pd.DataFrame(rows).drop_duplicates(subset="id", keep="last").reset_index(drop=True)
    missing = [c for c in every if c not in frame.columns]
    if missing:
        frame = pd.concat([frame, pd.DataFrame({c: [None] * len(frame) for c in missing}, index=frame.index)], axis=1)
    return frame


def load(run_dir: Path | str):
    """The run's records as a tidy pandas DataFrame."""
    return to_frame(read_records(run_dir))
