"""Presets: named grids, each the union of sub-grids plus how hard to measure each cell.

A preset names values of every axis, variants and scenarios included, so this module sits
above grid (the axes and their parsing), inputs (scenarios) and variants (variant names).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..core.errors import UsageError
from ..core.grid import AXES, OPTIONAL_AXES, Case, expand, sub_grid_values, validate_axes
from ..core.noise import default_noise_target
from .inputs import check_scenario
from .merges import merge_names
from .variant_contract import BROKEN_PREFIX


@dataclass(frozen=True)
class Preset:
    """Named grid: the union of one or more sub-grids, plus how hard to measure each cell.

    Sub-grids let a preset pair a wide speed sweep on normal inputs with a
    narrower sweep over every input scenario and the negative controls,
    without the full cross product of both.
    """

    name: str
    description: str
    grids: tuple[Mapping[str, tuple], ...]
    min_samples: int = 5          # timed samples per measurement, at least
    min_time_s: float = 0.2       # and at least this much timed time
    max_cell_s: float | None = 30.0  # estimated cell time above which the cell is skipped (None: no limit)
    energy_window_s: float = 0.1  # CUDA: least time between the two energy-counter updates that bound the window
    budget_s: float | None = None  # wall-time budget of a run (None: measure every cell)
    l2_flush: bool = False        # overwrite a cache-sized buffer before every timed sample
    cuda_graph: bool = False      # CUDA: time CUDA-graph replays of the call
    ceilings_s: float = 2.5       # seconds per device the run's ceilings (roofline limits) take to measure
    deterministic: bool = False   # measure under torch.use_deterministic_algorithms(True) (--deterministic)
    page_size: int = 16           # slots per page of the paged scenario's cache (a kernel declaring its own keeps it)
    models: tuple[str, ...] = ()  # the model audit's decoders after the cells (workload/model.py; docs/model.md)
    merges: tuple[str, ...] = ()  # merge functions audited after the cells (workload/merges.py; docs/numerics.md)
    merge_parts: tuple[str, ...] = ()  # attention variants whose own partial states the merges are audited on too
    # seconds after the cells for shrinking each finding about torch's, transformers' or a plug-in's code to its
    # smallest failing cell and minimal script (execute/shrink.py; 0: none, `audit shrink DIR` later)
    shrink_s: float = 0.0
    # sample on until each median is known to ±this (0: the fixed minimum only); $ATTN_AUDIT_NOISE_TARGET
    noise_target: float = field(default_factory=default_noise_target)
    noise_cap_s: float = 0.1      # ... for at most this many more seconds per measurement

    @property
    def axes(self) -> dict[str, tuple]:
        """Every value each axis takes in any sub-grid (for display and run.json)."""
        return {a: tuple(dict.fromkeys(v for g in self.grids for v in sub_grid_values(g, a))) for a in AXES}


def preset_cases(preset: Preset, overrides: Mapping[str, Iterable[Any]] | None = None, *,
                 known_variant=None) -> list[Case]:
    """Validated, de-duplicated cells of a preset; an override replaces that axis in every sub-grid,
    but for a sub-grid made for negative controls only (their own cells, e.g. the referee's): there
    a variant override keeps the controls it names, and none drops the sub-grid (`--variant eager`
    gets no cell the preset does not give eager). A d_k override without a d_v one makes d_v follow
    it in every sub-grid (a latent sub-grid's d_v was chosen for its own d_k)."""
    cases: dict[str, Case] = {}
    for sub in preset.grids:
        axes = {a: (overrides or {}).get(a) or sub_grid_values(sub, a) for a in AXES}
        if (overrides or {}).get("d_k") and not (overrides or {}).get("d_v"):
            axes["d_v"] = OPTIONAL_AXES["d_v"]
        own = sub_grid_values(sub, "variant")
        if (overrides or {}).get("variant") and all(str(v).startswith(BROKEN_PREFIX) for v in own):
            axes["variant"] = tuple(v for v in axes["variant"] if v in own)
            if not axes["variant"]:
                continue
        try:
            expanded = expand(validate_axes(axes, known_variant=known_variant, known_scenario=check_scenario))
        except UsageError as exc:
            if "kv_heads" in sub and not (overrides or {}).get("kv_heads") and "--kv-heads" in str(exc):
                raise UsageError(f"{exc}; preset {preset.name} has GQA cells with kv_heads "
                                 f"{', '.join(map(str, sub['kv_heads']))}: give --kv-heads with --heads") from None
            raise
        for case in expanded:
            cases.setdefault(case.id, case)
    return list(cases.values())


STABILITY_SCENARIOS: tuple[str, ...] = (
    "normal", "scaled_x4", "scaled_x16", "scaled_x64", "outliers", "fp16_range", "padding",
    "fully_masked_bool", "fully_masked_neginf", "fully_masked_finfo_min", "decode", "cross_causal",
    "left_padding", "low_lse", "shifted_bias", "sinks",
)
# Scenarios from bug reports (inputs.SCENARIOS says which report each comes from).
REPORTED_SCENARIOS: tuple[str, ...] = ("left_padding", "low_lse", "shifted_bias")
# Inputs on which a shortcut that holds only for N(0, 1) inputs is wrong (KernelBench#82).
VALUE_SCENARIOS: tuple[str, ...] = ("uniform", "heavy_tailed", "constant_rows", "sparse")
# compiled_unfused on the GPU (a compile per mask form, ~4 s each): one scenario of each kind of defect
UNFUSED_GPU_SCENARIOS: tuple[str, ...] = ("normal", "scaled_x64", "fp16_range", "padding", "fully_masked_bool",
                                          "cross_causal")
GPU_STABILITY_SCENARIOS: tuple[str, ...] = (
    "normal", "scaled_x16", "scaled_x64", "outliers", "fp16_range", "padding",
    "fully_masked_bool", "fully_masked_neginf", "cross_causal", "left_padding", "low_lse", "shifted_bias",
)
# Built-ins whose point is the log-sum-exp they return (the LSE, merge and sinks checks), not their
# speed: flash_op is sdpa_flash's kernel, flex_eager torch's dense fallback. Their own sub-grids.
LSE_VARIANTS: tuple[str, ...] = ("flash_op", "flex_eager")
CUDA_LSE_OPS: tuple[str, ...] = ("efficient_op", "cudnn_op")   # the same for the CUDA-only SDPA ops
# Built-ins made for a layout (packed documents, paged caches): their own sub-grids (presets.layout_cells).
LAYOUT_VARIANTS: tuple[str, ...] = ("packed_loop", "nested_sdpa", "varlen_attn", "paged_flex", "paged_gather")
LSE_SCENARIOS: tuple[str, ...] = ("normal", "padding", "fully_masked_bool", "cross_causal", "sinks", "sinks_prefill",
                                  "sinks_window")
ODD_HEAD_DIMS: tuple[int, ...] = (72, 96, 192)   # head sizes that are not a power of two (cpu preset)
# pytorch/pytorch#196678: cuDNN's masked kernels broke at T ≡ 64 (mod 128)
GPU_ODD_SEQ_LEN = 1088


GPU_TOKENS = 16384  # gpu preset: batch x seq_len per cell, as FlashAttention's benchmarks
GPU_SEQ_LENS = (512, 2048, 8192, 16384)
GPU_COMPILED_SEQ_LENS = (2048, 8192)   # compiled variants cost ~4 s of compiling per shape
COMPILED = ("compiled", "compiled_unfused", "flex")


# The cpu preset's shrinking after its cells: its torch findings (paged_flex's NaN, the flash op's lse and
# kv heads) shrank, each minimal script run once, in about 40 s on a 2-core AVX2-only EPYC (loop 1.0 s)
SHRINK_S_CPU = 40.0


def presets() -> dict[str, Preset]:
    """Every preset by name: quick, cpu, gpu and gpu-check, each built from the registry's variant sets."""
    sets = _VariantSets.of_registry()
    return {p.name: p for p in (_quick(sets), _cpu(sets), _gpu(sets), _gpu_check())}


@dataclass(frozen=True)
class _VariantSets:
    """The variant names the presets' grids are made of, from the registry."""

    variants: tuple[str, ...]      # every built-in but flex and the lse-only ones (their own sub-grids)
    controls: tuple[str, ...]      # the negative controls but the GQA ones (on GQA cells only)
    gqa_controls: tuple[str, ...]
    value_controls: tuple[str, ...] = ()   # the controls whose defect shows on value scenarios only
    value_reveals: tuple[str, ...] = ()    # those scenarios (their Variant.reveals)
    referee_controls: tuple[str, ...] = ()  # the referee's controls (right values, one trick each): their own cells
    layout_controls: tuple[str, ...] = ()   # the packed, paged, latent and invariance controls: their own cells
    argument_controls: tuple[str, ...] = ()  # one argument ignored each (argument_controls.py): their own cells

    @property
    def every(self) -> tuple[str, ...]:
        return self.variants + self.controls

    @property
    def uncompiled(self) -> tuple[str, ...]:
        return tuple(v for v in self.variants if not v.startswith("compiled"))

    def value_shortcuts(self, controls: bool = True) -> dict:
        """The value scenarios for every variant (and every control, or with controls=False only those
        whose defect shows there), in one shape the quick and cpu presets both compile already (fp32,
        d_k 32, T 128, batch 1, 2 heads, not causal: their normal cells'), so the compiled variants
        reuse that code (the cost model's compile_key has no scenario)."""
        return dict(variant=self.every if controls else self.variants + self.value_controls, device=("cpu",),
                    dtype=("fp32",), d_k=(32,), seq_len=(128,), batch=(1,), heads=(2,), causal=(False,),
                    scenario=VALUE_SCENARIOS)

    def referee_cells(self, dtypes: tuple[str, ...]) -> tuple[dict, ...]:
        """The referee's controls on the cells that show their tricks: normal inputs, causal or not,
        in `dtypes`; the one caught by physically_possible alone (broken.value_cache, a cache as fast
        as a copy) where 2 GFLOP of fp32 matmuls take 20x its 4 MiB of copies on any CPU, busy or not
        (d_k 64, T 2048, 2 heads: 5.8 ms at an AMX Xeon's 0.37 TFLOP/s)."""
        from .referee_controls import REFEREE_CONTROLS
        fast = tuple(c for c in self.referee_controls                      # the one physically_possible is for
                     if REFEREE_CONTROLS[c.removeprefix(BROKEN_PREFIX)][0] == "physically_possible")
        tricks = tuple(c for c in self.referee_controls if c not in fast)
        grids = (dict(variant=tricks, device=("cpu",), dtype=dtypes, d_k=(32,), seq_len=(64,), batch=(1,),
                      heads=(2,), causal=(False, True), scenario=("normal",)),)
        if fast:
            grids += (dict(variant=fast, device=("cpu",), dtype=("fp32",), d_k=(64,), seq_len=(2048,), batch=(1,),
                           heads=(2,), causal=(False,), scenario=("normal",)),)
        return grids

    @classmethod
    def of_registry(cls) -> "_VariantSets":
        # no torch import at module level
        from .variants import BUILTIN_NAMES, GQA_CONTROLS, NEGATIVE_CONTROLS, REFEREE_CONTROL_NAMES, builtin_variants
        # flex compiles for several seconds per cell (and has no CPU backward): its own, smaller sub-grids.
        from .argument_controls import ARGUMENT_CONTROLS
        from .layout_controls import LAYOUT_CONTROLS
        layout_controls = tuple(BROKEN_PREFIX + c for c in LAYOUT_CONTROLS)
        argument_controls = tuple(BROKEN_PREFIX + c for c in ARGUMENT_CONTROLS)
        variants = tuple(v for v in BUILTIN_NAMES
                         if v != "flex" and v not in LSE_VARIANTS + CUDA_LSE_OPS + LAYOUT_VARIANTS)
        controls = tuple(c for c in NEGATIVE_CONTROLS
                         if c not in GQA_CONTROLS + REFEREE_CONTROL_NAMES + layout_controls + argument_controls)
        reveals = {c: builtin_variants()[c].reveals for c in controls}
        value_controls = tuple(c for c in controls if reveals[c] and set(reveals[c]) <= set(VALUE_SCENARIOS))
        value_reveals = tuple(dict.fromkeys(s for c in value_controls for s in reveals[c]))
        return cls(variants, controls, GQA_CONTROLS, value_controls, value_reveals, REFEREE_CONTROL_NAMES,
                   layout_controls, argument_controls)

    def argument_cells(self, dtypes: tuple[str, ...]) -> tuple[dict, ...]:
        """Each argument control on the scenarios its argument is probed in (ARGUMENT_CONTROL_CELLS),
        in a small shape the probes take (T 64, within arguments.ARGUMENT_MAX_SEQ_LEN)."""
        from .argument_controls import ARGUMENT_CONTROL_CELLS
        return tuple(dict(variant=(name,), device=("cpu",), dtype=dtypes, d_k=(32,), seq_len=(64,), batch=(1,),
                          heads=(2,), causal=(False, True),
                          scenario=ARGUMENT_CONTROL_CELLS[name.removeprefix(BROKEN_PREFIX)][0])
                     for name in self.argument_controls)

    def layout_cells(self, dtypes: tuple[str, ...], d_k: int, seq_len: int, base: tuple[str, ...],
                     batch: int) -> tuple[dict, ...]:
        """Packed documents and paged caches (the layout variants, `base` variants dense, the layouts'
        controls on their own scenario), d_v != d_k (V read at K's stride), and the batch-dependent
        control on the invariance checks' cells (B 2, normal inputs). The real variants at `batch`
        (quick: 1, so an override of every other axis still gives one cell per variant); the
        controls' own sub-grids at batch 2 (a wrong table row needs a second sequence)."""
        one = dict(device=("cpu",), dtype=dtypes, d_k=(d_k,), seq_len=(seq_len,), batch=(batch,), heads=(2,),
                   causal=(False, True))
        documents = tuple(c for c in self.layout_controls if "document" in c or "cu_seqlens" in c)
        pages = tuple(c for c in self.layout_controls if "paged" in c)
        windows = tuple(c for c in self.layout_controls if "window" in c)
        strides = tuple(c for c in self.layout_controls if "strides" in c)
        layouts = ("packed_loop", "nested_sdpa")
        return (dict(one, variant=base + layouts, scenario=("packed",)),
                dict(one, variant=layouts, scenario=("normal",)),
                dict(one, variant=base + ("paged_gather",), scenario=("paged", "paged_edges")),
                dict(one, variant=documents, batch=(2,), scenario=("packed",)),
                dict(one, variant=pages, batch=(2,), scenario=("paged", "paged_edges")),
                dict(one, variant=windows, scenario=("sliding_window",)),
                dict(one, variant=base + strides, scenario=("strided_qkv",)),
                dict(one, variant=("eager", "sdpa"), d_v=(d_k // 2,), scenario=("normal",)),
                dict(one, variant=("broken.v_read_at_k_stride",), d_v=(d_k // 2,), scenario=("normal",)),
                dict(one, variant=("broken.batch_dependent_splits",), dtype=dtypes[:1], batch=(2,),
                     scenario=("normal",)))


def _quick(sets: _VariantSets) -> Preset:
    variants, controls, uncompiled, gqa_controls = sets.variants, sets.controls, sets.uncompiled, sets.gqa_controls
    return Preset(
        name="quick",
        description="tiny grid for CI and tests: speed on normal inputs plus a few scenarios "
                    "and the negative controls (well under 90 s on 2 cores)",
        grids=(
            dict(variant=uncompiled, device=("cpu",), dtype=("fp32", "bf16"), d_k=(32,),
                 seq_len=(64, 128), batch=(1,), heads=(2,), causal=(False, True),
                 scenario=("normal",)),
            # compiled code is built per shape (about 3.5 s a compile on 2 cores, Inductor's
            # cache cold): one length
            dict(variant=tuple(v for v in variants if v not in uncompiled), device=("cpu",),
                 dtype=("fp32", "bf16"), d_k=(32,), seq_len=(128,), batch=(1,), heads=(2,),
                 causal=(False, True), scenario=("normal",)),
            # flex: its block mask (causal) and its score modification (softcap), a compile each and one
            # argument probe each (scale, softcap: a recompile), not every pairing of them (two compiles more)
            dict(variant=("flex",), device=("cpu",), dtype=("fp32",), d_k=(32,), seq_len=(64,),
                 batch=(1,), heads=(2,), causal=(True,), scenario=("normal",)),
            dict(variant=("flex",), device=("cpu",), dtype=("fp32",), d_k=(32,), seq_len=(64,),
                 batch=(1,), heads=(2,), causal=(False,), scenario=("softcap",)),
            dict(variant=("eager", "eager_fp32", "sdpa", "sdpa_math") + controls,
                 device=("cpu",), dtype=("fp32", "fp16"), d_k=(32,), seq_len=(64,), batch=(1,),
                 heads=(2,), causal=(False, True),
                 scenario=("scaled_x64", "fp16_range", "padding", "fully_masked_bool",
                           "fully_masked_neginf", "sliding_window", "softcap", "sinks")),
            dict(variant=("eager",) + LSE_VARIANTS, device=("cpu",), dtype=("fp32", "bf16"), d_k=(32,), seq_len=(64,),
                 batch=(1,), heads=(2,), causal=(False, True),
                 scenario=("normal", "padding", "fully_masked_bool", "sinks", "sinks_prefill")),
            dict(variant=("eager", "sdpa", "sdpa_math", "sdpa_flash") + gqa_controls, device=("cpu",),
                 dtype=("fp32",), d_k=(32,), seq_len=(64,), batch=(1,), heads=(4,), kv_heads=(4, 2, 1),
                 causal=(True,), scenario=("normal", "sliding_window", "softcap")),
            dict(variant=("eager", "eager_fp32", "sdpa", "sdpa_math"), device=("cpu",),
                 dtype=("fp32", "fp16"), d_k=(32,), seq_len=(64,), batch=(1,), heads=(2,),
                 causal=(False, True), scenario=REPORTED_SCENARIOS),
            sets.value_shortcuts(controls=False),     # the other controls: in the cpu preset's
            *sets.referee_cells(("fp32",)),
            *sets.layout_cells(("fp32",), 32, 64, ("eager", "sdpa", "flex_eager"), batch=1),
            *sets.argument_cells(("fp32", "bf16")),
        ),
        # tiny, host-bound cells: no roofline fraction to speak of, so a quicker ceilings measurement
        min_samples=3, min_time_s=0.01, max_cell_s=5.0, budget_s=60.0, ceilings_s=0.5, noise_cap_s=0.2,
        models=("llama-tiny", "gpt-oss-tiny"), merges=merge_names(),
    )


def _cpu(sets: _VariantSets) -> Preset:
    variants, every, gqa_controls = sets.variants, sets.every, sets.gqa_controls
    dtypes = ("fp32", "fp16", "bf16")      # the preset's choice: every dtype core/dtypes.py defines today
    return Preset(
        name="cpu",
        shrink_s=SHRINK_S_CPU,
        description="default without CUDA: every built-in variant, 3 dtypes, d_k 32-128 (and 72, 96, 192), "
                    "seq_len 128-2048, plus every scenario and negative control at T=256",
        grids=(
            dict(variant=variants, device=("cpu",), dtype=dtypes, d_k=(32, 64, 128),
                 seq_len=(128, 512, 2048), batch=(1,), heads=(2,), causal=(False, True),
                 scenario=("normal",)),
            dict(variant=("flex",), device=("cpu",), dtype=("fp32", "bf16"), d_k=(64,),
                 seq_len=(512, 2048), batch=(1,), heads=(2,), causal=(False, True),
                 scenario=("normal",)),
            dict(variant=every, device=("cpu",), dtype=dtypes, d_k=(64,), seq_len=(256,),
                 batch=(2,), heads=(2,), causal=(False, True), scenario=STABILITY_SCENARIOS),
            dict(variant=("flex",), device=("cpu",), dtype=("fp32",), d_k=(64,), seq_len=(256,),
                 batch=(2,), heads=(2,), causal=(False, True),
                 scenario=("padding", "cross_causal", "decode", "sliding_window", "softcap")),
            dict(variant=("flash_op",), device=("cpu",), dtype=dtypes, d_k=(64,), seq_len=(256,),
                 batch=(2,), heads=(2,), causal=(False, True), scenario=STABILITY_SCENARIOS),
            dict(variant=("flex_eager",), device=("cpu",), dtype=("fp32", "bf16"), d_k=(64,), seq_len=(256,),
                 batch=(2,), heads=(2,), causal=(False, True), scenario=LSE_SCENARIOS),
            dict(variant=("eager", "eager_fp32", "sdpa", "sdpa_math", "sdpa_flash", "flash_op") + gqa_controls,
                 device=("cpu",), dtype=("fp32", "bf16"), d_k=(64,), seq_len=(256,), batch=(2,), heads=(4,),
                 kv_heads=(4, 2, 1), causal=(False, True),
                 scenario=("normal", "padding", "decode", "sliding_window", "softcap", "sinks")),
            dict(variant=("compiled", "sdpa", "sdpa_flash", "flex"), device=("cpu",), dtype=("fp32",), d_k=(64,),
                 seq_len=(1024,), batch=(1,), heads=(4,), kv_heads=(4, 2, 1), causal=(False, True),
                 scenario=("normal",)),
            sets.value_shortcuts(),
            *sets.referee_cells(("fp32", "bf16", "fp16")),
            *sets.layout_cells(("fp32", "bf16"), 64, 256, ("eager", "sdpa", "flex_eager"), batch=2),
            *sets.argument_cells(("fp32", "bf16", "fp16")),
            dict(variant=("flex",), device=("cpu",), dtype=("fp32",), d_k=(64,), seq_len=(256,), batch=(2,),
                 heads=(2,), causal=(False, True), scenario=("normal", "packed", "strided_qkv")),
            dict(variant=("paged_flex",), device=("cpu",), dtype=("fp32",), d_k=(64,), seq_len=(256,), batch=(2,),
                 heads=(2,), causal=(False, True), scenario=("paged", "paged_edges")),
            # head sizes that are not a power of two (kernels tile by powers of two: 72, 96, 192 pad or
            # branch), on the kernels that tile, forward and backward
            dict(variant=("eager", "sdpa", "sdpa_flash", "flash_op"), device=("cpu",), dtype=("fp32", "bf16"),
                 d_k=ODD_HEAD_DIMS, seq_len=(128,), batch=(1,), heads=(2,), causal=(False, True), scenario=("normal",)),
        ),
        # 0.03 s of samples at least, then on until each median is known (--noise-target): 0.05 s fixed
        # kept 845 cells of a 4-minute run where the code before the sampling rule kept 962; 0.03 s, 918
        min_samples=5, min_time_s=0.03, max_cell_s=6.0, budget_s=600.0, models=("llama-small", "gpt-oss-small"),
        noise_cap_s=0.2, merges=merge_names(),
    )


def _gpu(sets: _VariantSets) -> Preset:
    every, uncompiled, gqa_controls = sets.every, sets.uncompiled, sets.gqa_controls
    gqa_gpu = ("eager", "sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")   # GQA speed cells on CUDA
    return Preset(
        name="gpu",
        description=f"default with CUDA: seq_len 512-16384 at {GPU_TOKENS} tokens per cell, 16 heads, "
                    "bf16 at d_k 64-256, fp16/fp32 at d_k 128, plus scenarios at T=1024 and masked "
                    f"cells at T={GPU_ODD_SEQ_LEN} (≡ 64 mod 128)",
        grids=(
            # the math backend (0.1 s a call at T 16384, its 16384² scores) up to T 8192, which shows the same;
            # d_k 64 up to T 8192
            *(dict(variant=tuple(v for v in uncompiled if t < 16384 or v != "sdpa_math"), device=("cuda",),
                   dtype=("bf16",), d_k=(64, 128, 256) if t < 16384 else (128, 256), seq_len=(t,),
                   batch=(GPU_TOKENS // t,), heads=(16,), causal=(False, True), scenario=("normal",))
              for t in GPU_SEQ_LENS),
            *(dict(variant=tuple(v for v in uncompiled if t < 16384 or v != "sdpa_math"), device=("cuda",),
                   dtype=("fp16",), d_k=(128,), seq_len=(t,), batch=(GPU_TOKENS // t,), heads=(16,),
                   causal=(False, True), scenario=("normal",)) for t in GPU_SEQ_LENS),
            # fp32 up to T 8192; the math backend (5 s a cell there, its 8192² fp32 scores) only
            # up to T 2048, which shows the same
            *(dict(variant=tuple(v for v in uncompiled if t < 8192 or v != "sdpa_math"), device=("cuda",),
                   dtype=("fp32",), d_k=(128,), seq_len=(t,), batch=(GPU_TOKENS // t,), heads=(16,),
                   causal=(False, True), scenario=("normal",)) for t in GPU_SEQ_LENS[:-1]),
            *(dict(variant=COMPILED, device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(t,),
                   batch=(GPU_TOKENS // t,), heads=(16,), causal=(False, True),
                   scenario=("normal",)) for t in GPU_COMPILED_SEQ_LENS),
            dict(variant=tuple(v for v in every if v not in COMPILED + sets.value_controls), device=("cuda",),
                 dtype=("fp16", "bf16"), d_k=(128,), seq_len=(1024,), batch=(2,), heads=(16,),
                 causal=(False, True), scenario=GPU_STABILITY_SCENARIOS),
            # a control whose defect shows on a value scenario only (broken.zero_keys_as_padding: sparse)
            # is right on every scenario above: on the GPU (the preset fills its budget) where it shows alone
            dict(variant=sets.value_controls, device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(1024,),
                 batch=(2,), heads=(16,), causal=(False, True), scenario=sets.value_reveals),
            # the CUDA backends that return their lse (eager, the flash op, compiled flex), with sinks
            # (flash_op takes no mask on CUDA: its masked cells are skipped with that reason); flex
            # compiles per kind of cell (~4 s each): its sinks cells only, in the stability grid's dtype
            dict(variant=("eager", "flash_op", "broken.sink_ignored"),
                 device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(1024,), batch=(2,), heads=(16,),
                 causal=(False, True),
                 scenario=tuple(s for s in LSE_SCENARIOS if s != "sinks_window") + ("sinks_decode",)),
            # views of a fused QKV buffer, on the CUDA kernels with stride rules of their own (cuDNN's, the
            # flash op's) and the control reading its inputs as contiguous memory
            dict(variant=("sdpa", "sdpa_cudnn", "flash_op", "broken.strides_ignored"), device=("cuda",),
                 dtype=("bf16",), d_k=(128,), seq_len=(1024,), batch=(2,), heads=(16,), causal=(True,),
                 scenario=("strided_qkv",)),
            dict(variant=("flex",), device=("cuda",), dtype=("fp16",), d_k=(128,), seq_len=(1024,), batch=(2,),
                 heads=(16,), causal=(True,), scenario=("sinks", "sinks_prefill")),
            dict(variant=CUDA_LSE_OPS, device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(1024,), batch=(2,),
                 heads=(16,), causal=(False, True), scenario=("normal",)),
            # Compiled code is built once per shape, dtype and mask kind (~4 s each on an H200):
            # fp16 only (where fp16_range overflows), and the unfused compile of the hand-written
            # math non-causal only (causal changes its mask, not its arithmetic).
            dict(variant=("compiled", "flex"), device=("cuda",), dtype=("fp16",), d_k=(128,),
                 seq_len=(1024,), batch=(2,), heads=(16,), causal=(True,),
                 scenario=GPU_STABILITY_SCENARIOS),
            dict(variant=("compiled_unfused",), device=("cuda",), dtype=("fp16",), d_k=(128,),
                 seq_len=(1024,), batch=(2,), heads=(16,), causal=(False,),
                 scenario=UNFUSED_GPU_SCENARIOS),
            # GQA/MQA (the H16 KV16 cells above are their multi-head baseline), the serving case
            # (one query against a KV cache of up to 128k), and flex on the new scenarios.
            dict(variant=gqa_gpu, device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(8192,),
                 batch=(GPU_TOKENS // 8192,), heads=(16,), kv_heads=(4, 1), causal=(False, True),
                 scenario=("normal",)),
            dict(variant=gqa_gpu, device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(8192, 32768, 131072),
                 batch=(1,), heads=(16,), kv_heads=(16, 4, 1), causal=(False,), scenario=("decode",)),
            dict(variant=("eager", "sdpa", "sdpa_efficient", "sdpa_cudnn"), device=("cuda",),
                 dtype=("bf16",), d_k=(128,), seq_len=(GPU_ODD_SEQ_LEN,), batch=(2,), heads=(16,),
                 causal=(False, True), scenario=("padding", "left_padding")),
            dict(variant=gqa_gpu + ("flex",) + gqa_controls,
                 device=("cuda",), dtype=("fp16",), d_k=(128,), seq_len=(1024,), batch=(2,), heads=(16,),
                 kv_heads=(16, 4), causal=(True,), scenario=("normal", "padding", "sliding_window", "softcap")),
            # DeepSeek's latent attention (MLA): d_k 192 with d_v 128 in prefill, and its absorbed decode
            # form, MQA with d_k 576 and d_v 512 (FLASH_ATTENTION needs d_v == d_k: skipped with the reason)
            dict(variant=gqa_gpu + ("broken.v_read_at_k_stride",), device=("cuda",), dtype=("bf16",), d_k=(192,),
                 d_v=(128,), seq_len=(4096,), batch=(GPU_TOKENS // 4096,), heads=(16,), causal=(False, True),
                 scenario=("normal",)),
            dict(variant=gqa_gpu, device=("cuda",), dtype=("bf16",), d_k=(576,), d_v=(512,),
                 seq_len=(8192, 32768), batch=(4,), heads=(16,), kv_heads=(1,), causal=(False,),
                 scenario=("decode",)),
            # packed documents (varlen_attn: flash-attn's varlen kernel in torch) and paged decoding
            dict(variant=("eager", "sdpa", "sdpa_efficient", "sdpa_cudnn", "packed_loop", "nested_sdpa",
                          "varlen_attn", "broken.document_boundary_ignored", "broken.cu_seqlens_off_by_one"),
                 device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(1024,), batch=(4,), heads=(16,),
                 causal=(False, True), scenario=("packed",)),
            dict(variant=("flex",), device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(1024,), batch=(4,),
                 heads=(16,), causal=(True,), scenario=("packed",)),
            dict(variant=("eager", "sdpa", "sdpa_efficient", "sdpa_cudnn", "paged_gather", "paged_flex",
                          "broken.paged_extra_page", "broken.paged_wrong_sequence"),
                 device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(8192,), batch=(4,), heads=(16,),
                 kv_heads=(4,), causal=(False,), scenario=("paged",)),
            dict(variant=("broken.batch_dependent_splits",), device=("cuda",), dtype=("bf16",), d_k=(128,),
                 seq_len=(1024,), batch=(2,), heads=(16,), causal=(False, True), scenario=("normal",)),
        ),
        min_samples=5, min_time_s=0.03, max_cell_s=20.0, energy_window_s=0.05, budget_s=480.0, noise_cap_s=0.05,
        models=("llama-medium", "gpt-oss-medium"),
    )


def _gpu_check() -> Preset:
    return Preset(
        name="gpu-check",
        description="the GPU acceptance checks (make gpu-check): small and large speed cells of "
                    "every SDPA backend, masked causal cells, compiled-code reuse, a golden subset, "
                    "a cell too big for the device",
        grids=(
            # First: the cells predicted not to fit (recorded as oom in milliseconds), so a main
            # step cut short by its time limit still has them for check_oom.
            dict(variant=("eager", "eager_fp32"), device=("cuda",), dtype=("fp32",), d_k=(128,),
                 seq_len=(65536,), batch=(1,), heads=(16,), causal=(False,), scenario=("normal",)),
            *(dict(variant=("eager", "sdpa", "sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"),
                   device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(t,), batch=(b,), heads=(16,),
                   causal=(False, True), scenario=("normal",))
              for t, b in ((512, 32), (1024, 2), (8192, 2))),
            dict(variant=("eager", "sdpa"), device=("cuda",), dtype=("bf16",), d_k=(128,),
                 seq_len=(16384,), batch=(1,), heads=(16,), causal=(False,), scenario=("normal",)),
            dict(variant=("eager", "eager_fp32", "broken.clamped", "sdpa", "sdpa_cudnn"),
                 device=("cuda",), dtype=("fp16",), d_k=(128,), seq_len=(1024,), batch=(2,),
                 heads=(16,), causal=(True,),
                 scenario=("padding", "fully_masked_bool", "fully_masked_neginf", "cross_causal")),
            dict(variant=("compiled", "flex"), device=("cuda",), dtype=("fp16",), d_k=(128,),
                 seq_len=(1024,), batch=(2,), heads=(16,), causal=(False,),
                 scenario=("normal", "scaled_x16", "padding")),
            # q, k, v as views of a fused QKV buffer: every backend's stride rules on real inputs
            dict(variant=("eager", "sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flash_op",
                          "broken.strides_ignored"), device=("cuda",), dtype=("bf16",), d_k=(128,), seq_len=(1024,),
                 batch=(2,), heads=(16,), causal=(False, True), scenario=("strided_qkv",)),
        ),
        min_samples=5, min_time_s=0.03, max_cell_s=20.0, energy_window_s=0.05, budget_s=180.0, noise_cap_s=0.05,
        models=("llama-medium", "gpt-oss-medium"),
    )


def default_preset_name() -> str:
    import torch
    return "gpu" if torch.cuda.is_available() else "cpu"
