"""What a cell asks of the plan beyond its calls: whether a built-in variant refuses it (skipped in
milliseconds), the extra forwards of its leak probes and masked rows, a paged call (forward only), and
the invariance checks' compiles. Pure functions of the Case and its shape (cell_shape.CellShape)."""
from __future__ import annotations

from typing import Any

from ..core.dtypes import dtype_spec, fused_kernel_dtypes, listed
from ..core.grid import Case
from ..workload.inputs import SCENARIOS, invariance_applies


def device_type(device: str) -> str:
    return "cuda" if str(device).startswith("cuda") else "cpu"


def declared_refusal(case: Case) -> str | None:
    """Why a built-in variant declares it cannot run this cell (variant_contract.Variant.refusal), or None:
    the runner skips such a cell before drawing its inputs (no golden); the other refusals of
    predicted_unsupported come from the variant's call, after them."""
    from ..workload.inputs import cell_needs
    from ..workload.variants import builtin_variants
    builtin = builtin_variants().get(case.variant)
    return builtin.refusal(cell_needs(case)) if builtin is not None else None


def predicted_unsupported(case: Case, shape: Any) -> str | None:
    """Cells a forced SDPA backend refuses (design.md §5, §5b), those a built-in variant
    declares it cannot run (variant_contract.Variant.refusal: soft-capping on SDPA, the GQA control on
    multi-head cells), and those torch refuses on this machine (platform_limits: compiled flex on a
    CPU Inductor's flex lowering refuses): skipped in milliseconds."""
    from ..workload.inputs import cell_needs
    from ..workload.platform_limits import predicted_refusal
    from ..workload.variants import builtin_variants
    builtin = builtin_variants().get(case.variant)
    refusal = builtin.refusal(cell_needs(case)) if builtin is not None else None
    if refusal or (refusal := predicted_refusal(case.variant, case.device)):
        return refusal
    v, dev = case.variant, device_type(case.device)
    form = SCENARIOS[case.scenario].form            # the layout this cell hands a variant taking it
    if builtin is not None and "paged" in builtin.forms and form != "paged":
        return "it takes a paged KV cache: only the paged scenario has one"
    if builtin is not None and not builtin.masks and shape.mask is not None and form not in builtin.forms:
        return "it takes documents (cu_seqlens), not a mask tensor"
    if v == "varlen_attn" and dev == "cpu":
        return "varlen_attn runs on CUDA only"
    if v == "nested_sdpa" and dev == "cpu" and case.causal:
        return "nested-tensor SDPA on the CPU has no backend for is_causal"
    if v in ("sdpa_flash", "flash_op") and case.latent:
        return "the flash kernel needs d_v == d_k"
    if dev == "cpu" and v in ("sdpa_efficient", "sdpa_cudnn", "efficient_op", "cudnn_op"):
        return "no such backend on the CPU"
    if dev == "cuda" and v in ("flash_op", "efficient_op", "cudnn_op") and (shape.mask is not None or case.gqa):
        return "the raw op is called without a mask and takes no GQA"
    fused = dtype_spec(case.dtype).fused_kernels       # the dtypes flash and cuDNN take (core/dtypes.py)
    if dev == "cuda" and v == "sdpa_flash":
        if shape.mask is not None:
            return "FLASH_ATTENTION takes no attn_mask"
        if not fused:
            return f"FLASH_ATTENTION needs {listed(fused_kernel_dtypes())}"
        if case.causal and shape.q_len != case.seq_len:
            return "FLASH_ATTENTION: is_causal with q_len != kv_len"
    if dev == "cuda" and v == "sdpa_cudnn" and not fused:
        return f"CUDNN_ATTENTION needs {listed(fused_kernel_dtypes())}"
    return None


def masked_rows_checked(shape: Any) -> float:
    """Fully masked query rows the masked-row check looks at: every 8th row × B × H."""
    if not shape.case.scenario.startswith("fully_masked"):
        return 0.0
    from ..workload.draws import fully_masked_rows
    return float(len(fully_masked_rows(shape.q_len)) * shape.case.batch * shape.case.heads)


def invariance_compile_keys(key: tuple, case: Case) -> list[tuple]:
    """The compile keys of the invariance checks' calls in a cell (workload.inputs.invariance_applies):
    batch row 0 alone, the chunks of the queries (one shape: the compiled variants align causal masking
    top-left, so both chunks take every key and a mask); a compiled variant builds code for each once."""
    batch, chunk = invariance_applies(case)
    return ([("batch row", key)] if batch else []) + ([("chunks", key)] if chunk else [])


def compiled_variant(name: str) -> bool:
    """A built-in variant compiled per shape (Variant.compiled)."""
    from ..workload.variants import builtin_variants
    spec = builtin_variants().get(name)
    return spec is not None and spec.compiled


def paged_call(case: Case) -> bool:
    """A built-in paged variant in a paged cell (a scenario of the paged form): forward only (varlen.PagedCall)."""
    from ..workload.inputs import SCENARIOS
    from ..workload.variants import builtin_variants
    spec = builtin_variants().get(case.variant)
    return spec is not None and "paged" in spec.forms and SCENARIOS[case.scenario].form == "paged"


def leak_probe_count(case: Case) -> int:
    """Extra forwards of the leak check: one per kind of hidden key (masked or future keys,
    fully masked rows)."""
    from ..workload.inputs import SCENARIOS
    mask = SCENARIOS[case.scenario].mask
    n = int(case.causal or mask is not None)
    return n + int(case.scenario.startswith("fully_masked"))


def argument_probes(case: Case) -> list[str]:
    """The argument probes a cell makes (measure/checks/arguments.py), one forward each, known by its Case
    alone: the cell's probed_arguments (a built-in's compiling from the registry; a plug-in's taken as
    uncompiled), those handed in a call form (cu_seqlens, window) for a built-in declaring it, and then
    in place of the mask they stand for; for a plug-in, of the mask and such an argument one."""
    from ..workload.arguments import ARGUMENTS, probed_arguments
    from ..workload.variants import builtin_variants
    spec = builtin_variants().get(case.variant)
    names = list(probed_arguments(case, spec is not None and spec.compiled))
    in_form = [n for n in names if ARGUMENTS[n].form is not None]
    if spec is None:
        return [n for n in names if not ("mask" in names and n in in_form)]
    takes = [n for n in in_form if ARGUMENTS[n].form in spec.forms]
    return [n for n in names if (n not in in_form or n in takes) and not (n == "mask" and takes)]


# A probe of what a kernel must refuse (workload.arguments: Argument.refuse) raises before any work:
# the host's time for an exception (a kernel that computes it anyway costs a forward more, the defect)
REFUSAL_S = 1e-4


def refusal_probes(names: list[str]) -> int:
    """How many of these argument probes are of what a kernel must refuse."""
    from ..workload.arguments import ARGUMENTS
    return sum(ARGUMENTS[n].refuse is not None for n in names)


# An argument probe's recompile by "variant|argument" (else "*|argument", else "*"), measured on 2 cores
# of a Xeon with AMX, Inductor's cache cold, T 64: flex's scale 2.9 s, cap 2.8 s, no mask 0.5 s (its
# sinks are applied outside the compiled code: none; its cu_seqlens moved, T 256: 7 ms, the documents' mask
# rebuilt and the code reused; paged_flex's pages moved: 10 ms, the same); compiled's and compiled_unfused's
# 0.4-1.2 s
ARGUMENT_COMPILE_DEFAULT_S = {"flex|scale": 3.0, "flex|softcap": 3.0, "flex|mask": 0.5, "flex|sinks": 0.0,
                              "flex|cu_seqlens": 0.0, "paged_flex|block_table": 0.0, "*|mask": 0.3, "*": 1.0}


def argument_compile_default_s(variant: str, argument: str) -> float:
    """ARGUMENT_COMPILE_DEFAULT_S's seconds for a variant's probe of an argument."""
    table = ARGUMENT_COMPILE_DEFAULT_S
    return table.get(f"{variant}|{argument}", table.get(f"*|{argument}", table["*"]))


def argument_compile_keys(case: Case) -> list[tuple]:
    """A compiled variant's argument probes: each builds code of its own, once per (variant, device,
    argument) in a run (its later cells share the first's: measure/checks/arguments.py)."""
    return [("argument", case.variant, case.device, name) for name in argument_probes(case)]


REFEREE_CALLS = 2        # the values_follow check's forwards (new values in place; old values in new tensors)


def returns_lse(variant: str, device: str) -> bool:
    """Whether a built-in variant's cells on `device` return the log-sum-exp (its lse checks cost a
    forward on the two halves of the keys and a forward+backward through the lse); a plug-in's or
    an hf: variant's declaration is not read here (it would import the user's module)."""
    from ..workload.variants import builtin_variants
    spec = builtin_variants().get(variant)
    return spec is not None and spec.returns_lse(device)


# The context-parallel check's seconds per shard count beyond its forwards (the float64 merge in ring
# order, the comparison; the same-dtype baseline's split once per input set): 6.5 ms more a T-64 cell
# returning an lse for 4 and 8 shards, its forwards 0.4 ms of it (2-core Xeon). CUDA: not measured
# (no GPU lent since the check was written): an estimate of N merges' launches, about 0.1 ms each.
SHARD_CHECK_S = {"cpu": 0.003, "cuda": 0.001}


def shards_seconds(case: Case, settings: Any, t_f: float, host: float = 1.0) -> float:
    """A cell's seconds in the lse_shards check (measure.checks.lse): per shard count N its N calls on
    1/N of the keys (one forward's work, t_f) and SHARD_CHECK_S (times the host's factor); 0 where the
    variant returns no lse, the cell has more than SHARD_MAX_KEYS keys, or the run's records predate
    the check (Settings.lse_shards)."""
    from ..workload.merge_functions import SHARD_COUNTS, SHARD_MAX_KEYS
    dev = device_type(case.device)
    if not (settings.lse_checks and getattr(settings, "lse_shards", False) and case.seq_len <= SHARD_MAX_KEYS
            and returns_lse(case.variant, dev)):
        return 0.0
    return len(SHARD_COUNTS) * (t_f + SHARD_CHECK_S[dev] * host)


def checks_calls(case: Case, settings: Any, shape: Any = None) -> tuple[float, float]:
    """(forwards, forward+backwards) a cell's checks make beyond its warm-up and timed calls: the
    numerics call of each pass, the leak probes, a returned lse's halves and gradient, the referee's
    values_follow calls, the batch and chunk invariance calls (a batch row: 1/B of a forward), the
    argument probes of an uncompiled variant (a compiled one's are compiles: argument_compile_keys)."""
    dev = device_type(case.device)
    lse = 1.0 if settings.lse_checks and returns_lse(case.variant, dev) else 0.0
    n_f = 1.0 + leak_probe_count(case) + lse + (REFEREE_CALLS if settings.referee else 0)
    if getattr(settings, "arguments", False) and not compiled_variant(case.variant):
        n_f += len(argument_probes(case))
    if settings.invariance:
        batch, chunk = invariance_applies(case)
        n_f += (1.0 / case.batch if batch else 0.0) + (1.0 if chunk else 0.0)
    return n_f, 1.0 + lse


def tensor_elems(shape: Any) -> float:
    """Elements of a cell's q, k, v and output (what its comparisons, copies and bitwise checks read)."""
    case = shape.case
    d, dv = case.d_k, case.effective_d_v
    return float(case.batch * (case.heads * shape.q_len * (d + dv) + case.effective_kv_heads * case.seq_len * (d + dv)))


def call_variant(shape: Any) -> str:
    """The name per-call factors are fitted under: `compiled` splits in two, because Inductor
    rewrites it into fused SDPA without a mask or with an additive float mask (not causal,
    not a bool mask) and leaves the hand-written math otherwise."""
    case = shape.case
    if case.variant == "compiled" and not case.causal and (shape.mask is None or shape.mask[0] == "float"):
        return "compiled[fused]"
    return case.variant


def start_state(cache: str | None, headers: str | None) -> str | None:
    """The state of a run's first compile as the compiler's start (compile_start_s) is keyed by: "hit" (its
    kernels in Inductor's cache), "miss|headers" (built, Inductor's precompiled headers built already:
    run.json's compile_headers), "miss" (built, the headers too or not known); None where not known."""
    return "miss|headers" if cache == "miss" and headers == "built" else cache


def compile_key(shape: Any, variant: str | None = None) -> tuple:
    """What a compiled variant's code is built for (cellcache.BuildCache's key, without torch):
    one compile per key in a run."""
    case = shape.case
    return (variant or case.variant, case.device, case.dtype, shape.q_len, case.seq_len, case.batch,
            case.heads, case.kv_heads, case.d_k, case.d_v, case.causal, shape.mask, score_mod_of(case))


def kernel_key(shape: Any) -> tuple:
    """What Inductor's on-disk cache holds a compile's kernels under: compile_key, with
    `compiled` where Inductor leaves the hand-written math (call_variant) the same as
    `compiled_unfused`, whose kernels it builds (seen: the second of the two is a cache hit)."""
    variant = call_variant(shape)
    return compile_key(shape, "compiled_unfused" if variant == "compiled" else variant)


def score_mod_of(case: Case) -> str:
    """The cell's score modification by name ("None" without one): compiled code is built per
    score modification too (cellcache.BuildCache)."""
    from ..workload.inputs import SCENARIOS
    return str(SCENARIOS[case.scenario].score_mod)
