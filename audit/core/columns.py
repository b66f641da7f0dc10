"""The record's columns and their meaning (COLUMNS): every column a record has, in order. The
record schema, the store and the migrations that fill a column in for older records: records.py.
"""
from __future__ import annotations

from .dtypes import dtype_names, listed
from .referee import REFEREE_CHECKS, column as referee_column

# Every column a user can rely on, with its meaning. docs/output.md's column table is
# checked against this dict by a test, so adding a metric means: one function
# that computes it, one entry here.
COLUMNS: dict[str, str] = {
    "schema": "record schema version (integer)",
    "id": "cell id: variant-device-dtype-d{d_k}-T{seq_len}-B{batch}-H{heads}-{causal|full}-{scenario}; a GQA/MQA "
          "cell adds -KV{kv_heads} after H, a cell with d_v != d_k adds v{d_v} after d{d_k} (d192v128)",
    "variant": "attention implementation (`python -m audit list`), broken.* for negative controls, or the plug-in spec",
    "device": "cpu or cuda",
    "dtype": f"input dtype: {listed(dtype_names())}",     # the registry's (core/dtypes.py)
    "d_k": "head dimension of queries and keys",
    "d_v": "head dimension of values and of the output: d_k unless the cell is latent attention (DeepSeek's MLA: d_k "
           "192, d_v 128); v is (B, kv_heads, T, d_v)",
    "seq_len": "key length T (also the query length, except in the decode and cross_causal scenarios)",
    "batch": "batch size B",
    "heads": "number of heads H (query heads)",
    "kv_heads": "number of key/value heads: heads for multi-head attention, fewer for GQA (heads a multiple of it), "
                "1 for MQA; k and v are (B, kv_heads, T, d_k)",
    "causal": "true: causal (top-left aligned) masking",
    "scenario": "input scenario (docs/scenarios.md); normal: q, k, v ~ N(0, 1)",
    "status": "ok, skipped, error, oom (out of memory, or predicted not to fit in the free memory: then not run) or "
              "timeout (over the per-cell time limit: its worker was killed)",
    "reason": "why a cell is not ok; for an ok cell, what was not measured (e.g. forward only: no backward), else null",
    "fwd_ms": "median forward latency in ms (inputs require grad, as in training)",
    "fwd_iqr_ms": "interquartile range of the forward samples in ms",
    "fwd_n": "number of forward samples",
    "fwd_bwd_ms": "median forward+backward latency in ms",
    "fwd_bwd_iqr_ms": "interquartile range of the forward+backward samples in ms",
    "fwd_bwd_n": "number of forward+backward samples",
    "fwd_samples_s": "raw forward samples, seconds per call",
    "fwd_bwd_samples_s": "raw forward+backward samples, seconds per call",
    "fwd_ci_rel": "how well fwd_ms is known: the half-width of its median's 95% confidence interval (order "
                  "statistics of fwd_samples_s; under 6 samples, their range) over the median; 0.03 = ±3% "
                  "(docs/measurement.md, Timing noise)",
    "fwd_bwd_ci_rel": "the same for fwd_bwd_ms",
    "fwd_extra_s": "seconds the forward measurement sampled beyond its fixed minimum, to bring fwd_ci_rel under "
                   "noise_target (at most --noise-cap-s)",
    "fwd_bwd_extra_s": "the same for forward+backward",
    "noise_target": "the run's --noise-target as a fraction (0.03: ±3%): a cell whose fwd_ci_rel or fwd_bwd_ci_rel "
                    "stays above it is unstable (the timing_unstable warning); null: not judged",
    "timer": "how time was measured (cpu: perf_counter around blocks of calls; cuda: CUDA events around blocks of "
             "calls queued behind a spin kernel, the device's own time)",
    "fwd_host_ms": "CUDA: median host time to issue one forward call (Python, dispatch, launches), ms",
    "fwd_bwd_host_ms": "CUDA: median host time to issue one forward+backward call, ms",
    "fwd_fenced_ms": "CUDA: per-call time of a block of the timed forward calls between two device-wide synchronizes "
                     "(every stream, host issue time included); the referee compares it with fwd_ms "
                     "(docs/generated-kernels.md)",
    "fwd_bwd_fenced_ms": "CUDA: the same for forward+backward",
    "host_bound": "CUDA: true when issuing the calls takes the host longer than the device takes to run them "
                  "(forward or forward+backward): in a plain loop the GPU would wait for Python; fwd_ms is the "
                  "device's time either way",
    "l2_flush": "CUDA: true when the L2 was flushed (a 256 MiB buffer overwritten) before every timed sample "
                "(--l2-flush)",
    "cuda_graph": "true when CUDA-graph replays were timed (--cuda-graph); never compare timings across these methods",
    "compile_s": "compiled variants: first-call time minus steady-state time, forward plus forward+backward, in the "
                 "cell that compiled (null for eager variants and reused code)",
    "compile_reused": "compiled variants: true when the cell reused code compiled by an earlier cell of the same "
                      "shapes, dtype, causal flag and mask kind (no compile here)",
    "compile_cache": "compiled variants, in the cell that compiled: hit (every kernel was already built in "
                     "Inductor's on-disk cache, TORCHINDUCTOR_CACHE_DIR) or miss (the compile built some: it wrote "
                     "new files there); null without a compile here, or before schema 5",
    "graph_breaks": "compiled variants: graph breaks Dynamo met compiling and running this cell's code (kept across "
                    "the cells that reuse it; 0 = one graph each time); the code between the pieces ran eagerly. "
                    "flex compiles with fullgraph=True, so a break is its error instead. Plug-ins that compile "
                    "inside: set when they broke",
    "fused_sdpa": "compiled variants: true when Inductor rewrote the code into fused SDPA (its numerics are then "
                  "SDPA's)",
    "sdpa_backend": "SDPA variants: the backend that ran (the forced one, or the dispatcher's choice for `sdpa`)",
    "peak_bytes": "peak memory of one forward call above the baseline, bytes (cpu: VmHWM; cuda: allocator peak)",
    "peak_fwd_bwd_bytes": "peak memory of one forward+backward call above the baseline, bytes",
    "leaked_bytes": "memory the variant kept across its timed calls (held after them minus held after the warm-up; "
                    "CUDA: allocator, CPU: resident set after trimming), when over 64 MiB; else null",
    "flops": "forward FLOPs, 4*B*H*Tq*Tk*d_k, causal counting visible pairs only",
    "gflops_per_s": "achieved forward GFLOP/s (flops / fwd_ms)",
    "fwd_bwd_gflops_per_s": "achieved forward+backward GFLOP/s (3.5 * flops / fwd_bwd_ms)",
    "q_len": "query length Tq (seq_len is the key length; they differ in decode and cross_causal)",
    "out_nan": "NaN count in the output",
    "out_inf": "inf count in the output",
    "out_nonfinite_visible": "NaN+inf count in output rows that see at least one key (the float64 golden is finite "
                             "there)",
    "grad_nan": "NaN count in the gradients of q, k and v together",
    "grad_inf": "inf count in the gradients of q, k and v together",
    "failure_file": "an error or oom cell: the run folder's file holding its whole failure (failures/<id>.txt: the "
                    "exception chain with its stacks and full messages, a compiler's output included); null otherwise",
    "failed_after": "an error or oom cell: the cells of the same variant its measuring process ran before it, in "
                    "order (a compile failure that shows only on a recompile needs them: its reproduction script "
                    "replays them); null when it was the variant's first",
    "golden_source": "how the cell got its input set's float64 reference: built, or read from the golden store (a "
                     "reference an earlier cell or run built, kept on disk: docs/planning.md, The golden store); "
                     "null where an earlier cell of the same set had it in memory",
    "golden_subset": "null when the float64 golden covers every (batch, head) slice; else the [b, h] slices it "
                     "covers (evenly spaced, fixed by the shapes: docs/numerics.md, Golden reference). Error, "
                     "gradient-error and saturation columns are over these slices; NaN/inf counts, masked_rows and "
                     "leak_max_change over the whole output",
    "max_abs_err": "max |out - golden| against the float64 reference, over rows that see a key",
    "rmse": "root-mean-square of out - golden over rows that see a key",
    "rel_err": "relative Frobenius error ||out - golden|| / ||golden|| over rows that see a key",
    "err_ratio": "rmse / rmse of the same-dtype baseline (`eager` in the input dtype, same inputs)",
    "within_budget": "rmse <= 2 * baseline rmse + atol(dtype) (FlashAttention's rule); null when the baseline is not "
                     "finite",
    "dq_err": "relative Frobenius error of dL/dq against float64 gradients",
    "dk_err": "relative Frobenius error of dL/dk against float64 gradients",
    "dv_err": "relative Frobenius error of dL/dv against float64 gradients",
    "dq_err_ratio": "RMSE of dq against the float64 golden's over that of the same-dtype baseline's dq (hand-written "
                    "attention in the input dtype, rows that see no key 0, same inputs and upstream gradient); null "
                    "when not judged",
    "dk_err_ratio": "the same for dk",
    "dv_err_ratio": "the same for dv",
    "dq_within_budget": "dq's RMSE <= 2 * the baseline's + atol(dtype) (the gradient budget: docs/numerics.md); null "
                        "when the gradients are not finite (the nonfinite check's) or the baseline's are not, or the "
                        "cell ran forward only",
    "dk_within_budget": "the same for dk",
    "dv_within_budget": "the same for dv",
    "grad_diagnosis": "cells whose gradients are outside their budget: the known backward mistake (docs/numerics.md, "
                      "Diagnosis) whose float64 gradients the variant's match within their budgets, or none; several "
                      "the cell cannot tell apart are named together, `a or b`; null where nothing was diagnosed",
    "grad_diagnosis_err": "the largest RMSE of a gradient against the matched backward mistake's, over the gradients "
                          "compared (null when none matched)",
    "grad_diagnosis_golden_err": "the largest RMSE of a gradient against the float64 golden's, over the gradients "
                                 "compared",
    "dsinks_err": "sinks cells: relative error of the sinks' gradient (H,) against the float64 golden's; null where "
                  "the golden covers a subset of (batch, head) slices or the gradients are not finite",
    "dsinks_err_ratio": "RMSE of the sinks' gradient over that of the same-dtype baseline's; null when not judged",
    "dsinks_within_budget": "the sinks' gradient RMSE <= 2 * s(H) * the baseline's + atol(dtype), s(H) the chance "
                            "spread of an RMSE of H values (docs/numerics.md); null when not judged",
    "lse_err": "variants returning the log-sum-exp: RMSE (absolute) of their lse against the float64 golden's on the "
               "rows that see a key, in the keys-only convention (a variant declaring lse_includes_sink has the sink "
               "taken out)",
    "lse_err_ratio": "lse_err over the same-dtype baseline's (hand-written logsumexp of the scores in the input dtype)",
    "lse_within_budget": "lse_err <= 2 * the baseline's + atol(dtype) (docs/numerics.md, The log-sum-exp); null when "
                         "the baseline's is not finite",
    "lse_masked_rows": "what the returned lse is on rows that see no key: -inf, +inf, zero, nan, finite or mixed; "
                       "null when no row is fully masked (a merge reads only -inf and +inf as empty)",
    "merge_err": "RMSE against the float64 golden of the variant's (out, lse) on the keys split in two, merged as "
                 "split-KV and ring attention merge them (sinks applied once, after); null where the variant cannot "
                 "take a half's mask (reason says) or the keys cannot be split",
    "merge_err_ratio": "merge_err over that of the same-dtype baseline's merge",
    "merge_within_budget": "merge_err <= 2 * the baseline's + atol(dtype); null when not judged",
    "shards_errs": "context parallel: per number of key shards N (\"4\", \"8\": SHARD_COUNTS), the RMSE against the "
                   "float64 golden of the variant's (out, lse) on the keys cut in N contiguous shards, merged in ring "
                   "order (sinks applied once, after); null where the variant cannot take a shard's mask (reason "
                   "says); an N is left out where the keys are fewer; null on cells of more than 4096 keys "
                   "(SHARD_MAX_KEYS)",
    "shards_err_ratios": "per N, shards_errs over the same-dtype baseline's on the same shards",
    "shards_err_ratio": "the largest of shards_err_ratios",
    "shards_within_budget": "every N's shards_errs <= 2 * the baseline's + atol(dtype); null when not judged",
    "lse_differentiable": "whether the returned lse carries a gradient (requires_grad in a forward+backward cell)",
    "lse_dq_err_ratio": "RMSE of the gradient through the lse alone (dq of <lse, grad_lse>, grad_lse random) against "
                        "the golden's, over the same-dtype baseline's",
    "lse_dk_err_ratio": "the same for dk (the lse does not depend on v)",
    "lse_grads_within_budget": "dq and dk through the lse both within 2 * the baseline's + atol(dtype); null when "
                               "one is not judged, the cell's gradients are not finite (the nonfinite check's) or it "
                               "ran forward only",
    "lse_diagnosis": "cells whose lse or merge is outside its budget: the known lse mistake (docs/numerics.md, The "
                     "log-sum-exp) they match, or none (`a or b` where two match or the cell cannot tell them "
                     "apart); null where nothing was diagnosed",
    "lse_diagnosis_err": "RMSE of the variant's lse (or merged output) against the matched mistake's (null when none "
                         "matched)",
    "lse_diagnosis_golden_err": "the same against the float64 golden's",
    "lse_grad_diagnosis": "cells whose gradient through the lse is outside its budget: the known lse gradient "
                          "mistake it matches (lse_no_grad), or none (`a or b` as lse_diagnosis)",
    "lse_grad_diagnosis_err": "the larger RMSE of dq, dk through the lse against the matched mistake's (null when "
                              "none matched)",
    "lse_grad_diagnosis_golden_err": "the same against the float64 golden's",
    **{referee_column(name): f"referee: true when {meaning}; false when not (referee_detail says what was seen); "
                             "null where it could not run (docs/generated-kernels.md)"
       for name, meaning in REFEREE_CHECKS.items()},
    "referee_detail": "per failed referee check: the call and the numbers seen ({check: text}); null when every "
                      "check that ran passed",
    "max_logit": "max |q·k·scale| over visible pairs (float64); compare with the dtype's max",
    "max_qk": "max |q·k| before scaling over visible pairs (what an unscaled-first matmul must hold)",
    "max_prob": "mean over query rows of the largest attention probability",
    "entropy": "mean normalized row entropy H(p) / log(visible keys)",
    "min_entropy": "minimum normalized row entropy",
    "onehot_frac": "fraction of query rows whose largest probability exceeds 0.99",
    "golden_onehot_frac": "onehot_frac of the float64 golden on the same inputs (what the inputs alone cause)",
    "saturation_source": "variant: the four saturation columns come from the variant's own weights; golden: from the "
                         "float64 golden (variants that hide their weights)",
    "underflow_frac": "fraction of probabilities that are exactly 0 where the golden is > 0 (variants exposing "
                      "weights)",
    "leak_mass": "largest probability mass a row puts on masked or future keys (variants exposing weights)",
    "leak_max_change": "largest output change, on rows that must not see them, when masked-out keys and values "
                       "change (0 = no leak; null when nothing is masked)",
    "arguments": "cells where arguments are probed (docs/numerics.md, Arguments): each probed argument (scale, "
                 "causal, mask, softcap, sinks, cu_seqlens, window, block_table, kv_heads; lse on the scale probe of "
                 "a variant returning one) -> honoured, ignored, misapplied, accepted (kv_heads: computed where it "
                 "must refuse), unjudged, uninformative, refused or failed; null where none is probed",
    "argument_evidence": "the same arguments -> {moved: RMSE of the output's change, golden_moved: RMSE of the "
                         "float64 golden's, err: RMSE of their difference, budget: the most err may be} (refused: "
                         "{reason}; kv_heads: {heads, kv_heads, raised or returned}); null where none is probed",
    "cross_doc_max_change": "packed cells: largest change of the even-numbered documents' output when the other "
                            "documents' keys and values (and the padding's) change (0 = no cross-document attention; "
                            "null outside packed cells)",
    "page_size": "paged cells of a paged variant: slots per page of the cache it was given (the preset's, or the "
                 "size the kernel declares)",
    "paged_unread_max_change": "paged cells, paged variants: largest output change between two calls whose pools "
                               "differ only in the slots a correct kernel must not read (finite values there instead "
                               "of NaN; 0 = it reads none; null otherwise)",
    "paged_diagnosis": "paged cells where paged_unread_max_change > 0: the paged mistake (docs/numerics.md) the "
                       "output on the first pool matches in float64, or none (`a or b` where two match or the cell "
                       "cannot tell them apart)",
    "paged_diagnosis_err": "RMSE of that output against the matched paged mistake",
    "batch_invariant": "true when batch row 0 computed alone (B = 1) equals, bit for bit, the same row in the full "
                       "batch (cells with B >= 2 and no mask tensor; null elsewhere)",
    "batch_max_diff": "largest |difference| between row 0 alone and in the batch",
    "chunk_invariant": "true when the queries in two chunks (chunked prefill: the first half against the first half "
                       "of the keys, the second against all keys, bottom-right aligned) equal the single-shot output "
                       "bit for bit (the batch check's cells)",
    "chunk_max_diff": "largest |difference| between the two-chunk and the single-shot output",
    "chunk_within_budget": "the two-chunk output within the cell's error budget against the float64 golden",
    "invariance_reason": "why a batch or chunk invariance column is null where the check applies (the variant's call "
                         "on a batch row alone or on a chunk failed)",
    "masked_rows": "what the variant returns on fully masked rows: nan, zero, uniform, other or mixed (null when none)",
    "causal_alignment": "causal with q_len != seq_len: which alignment the output follows (top-left, bottom-right, "
                        "neither)",
    "golden_alignment": "causal with q_len != seq_len: the alignment the golden, the error columns, the leak check "
                        "and the masked-row check follow: the variant's declared one (top-left unless a plug-in "
                        "declares bottom-right; docs/variants.md)",
    "diagnosis": "cells with a numerics defect (outside the error budget, a leak, NaN/inf where the golden is "
                 "finite): the known mistake (docs/numerics.md, Diagnosis) whose float64 output the variant's output "
                 "matches within the dtype's budget, or none; where two match, or the cell cannot tell a match from "
                 "another, every one: `a or b` (core/diagnosis_names.py); null where nothing was diagnosed",
    "diagnosis_err": "RMSE of the output against the matched mistake's float64 output, on the diagnosis slices (of "
                     "several named, the smallest; null when none matched)",
    "diagnosis_golden_err": "RMSE of the output against the correct float64 golden on the same slices",
    "diagnosis_slices": "the [b, h] slices the diagnosis compared (within golden_subset, capped by a float64 FLOP "
                        "budget)",
    "repeat_runs": "how many runs of each of out, dq, dk and dv on identical inputs were compared: 3 (out: the "
                   "warm-up call, the numerics call and the warm-up forward+backward's forward; the gradients: the "
                   "warm-up call, the numerics call and the last timed call)",
    "repeat_differs": "which of out, dq, dk, dv were not bitwise identical across those runs ([] = deterministic; "
                      "null when not checked)",
    "repeat_max_diff": "largest |difference| between runs over the tensors that differed (0 when bitwise identical; "
                       "inf when NaN appeared in one run only)",
    "deterministic_algorithms": "true when the cell ran under torch.use_deterministic_algorithms(True) "
                                "(--deterministic)",
    "deterministic_refused": "with --deterministic: true on the skipped cell of a variant that raised because an "
                             "operation has no deterministic implementation (false when it ran)",
    "pct_of_limit": "forward: max(FLOPs / measured matmul FLOP/s, bytes / measured copy bandwidth) / fwd time (1 = "
                    "at the machine's measured limit)",
    "fwd_bwd_pct_of_limit": "the same for forward+backward (FLOPs 3.5x forward; bytes of both passes)",
    "bound": "which limit binds the forward: compute or memory",
    "fwd_bwd_bound": "which limit binds forward+backward",
    "bytes": "fewest bytes a forward must move: read Q, K, V (and mask), write O",
    "fwd_bwd_bytes": "fewest bytes of forward+backward (backward reads Q, K, V, O, dO, writes dQ, dK, dV)",
    "peak_flops_per_s": "the run's measured matmul FLOP/s for this device: the better of the dtype's and fp32's, "
                        "since a kernel may upcast (run.json: ceilings)",
    "peak_bytes_per_s": "the run's measured device-to-device copy bandwidth, bytes read + written per second",
    "energy_per_call_j": "CUDA: joules per forward call: mean power over the energy window × device time per call "
                         "(docs/measurement.md)",
    "energy_method": "counter (NVML energy counter, window between two of its updates), counter (unaligned), or "
                     "power×time (no counter), then 'over' the calls: CUDA-graph replays or eager calls",
    "mean_power_w": "CUDA: mean board power during the energy window from the energy counter, W",
    "sampled_power_w": "CUDA: mean of instantaneous power readings during the window, W (an independent check of "
                       "mean_power_w)",
    "sampled_power_source": "CUDA: where sampled_power_w came from: instant (NVML_FI_DEV_POWER_INSTANT), average "
                            "(nvmlDeviceGetPowerUsage, a lagging 1 s average on Ampere and newer), null when no "
                            "power was read",
    "energy_idle_frac": "CUDA: fraction of the window the GPU waited between calls: the larger of the gaps between "
                        "the window's units (CUDA events) and 1 - calls × per-call time / device time (with "
                        "--l2-flush the per-call time is timed hot, without the flush; null when it cannot be); "
                        "above 0.05 the reason says the energy includes idle power",
    "sm_clock_mhz": "CUDA: median SM clock during the window, MHz",
    "temperature_c": "CUDA: highest GPU temperature during the window, °C",
    "throttle_reasons": "CUDA: clock throttle reasons seen during the window (names)",
    "energy_calls": "forward calls run while measuring energy",
    "energy_window_s": "length of the energy window (between two updates of the energy counter), s",
    "energy_cost_s": "CUDA: wall time the energy measurement added to the cell (graph capture and window), s",
    "energy_read_s": "CUDA: median host time one read of NVML's energy counter took in the cell, s (the GPU's queued "
                     "work must outlast it; an edge of the window is timed to about one read)",
    "telemetry_reason": "why telemetry columns are null or partial (no GPU, no driver, ...)",
    "elapsed_s": "wall time spent on the cell, seconds",
    "phase_s": "where the cell's elapsed_s went: seconds per phase (setup, golden, compile, warmup, numerics, leak, "
               "determinism, diagnosis, saturation, referee, timed, energy: core/timesplit.py CELL_PHASES), only the "
               "phases the cell went through; the report's Time budget section sums them",
    "predicted_s": "the cost model's prediction of the cell's wall time when the run was planned, seconds "
                   "(docs/planning.md)",
    "started_at": "UTC time the cell started (ISO 8601)",
    "env": "environment: torch version, device name, CPU model, threads, git commit, cpu_allocator (pinned malloc "
           "thresholds), NVML info",
}
