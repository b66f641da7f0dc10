"""What decides a run's cost besides its cells: the preset's sampling rules and the measuring
methods of the code that made (or will make) the records (costmodel predicts with them; costfit
reads a recorded run's from its run.json). Pure Python."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..workload.presets import Preset


@dataclass(frozen=True)
class Settings:
    """What decides a run's cost besides its cells: the preset's sampling rules and the
    measuring methods of the code that made (or will make) the records."""

    min_samples: int = 5
    min_time_s: float = 0.2
    max_cell_s: float | None = 30.0   # None: no per-cell limit (--budget none)
    energy_window_s: float = 0.1
    timing: str = "device"        # CUDA: "device" (events behind a spin) or "host" (schema 2)
    energy: str = "edges"         # "edges": between counter updates; "window": schema 2's fixed window
    golden: str = "subset"        # "subset": budgeted slices; "full": schema 2
    masked_rows_loop: bool = False  # schema 2 classified fully masked rows one by one (a sync each)
    warmup_fwd_calls: int = 1       # forward warm-up calls besides the numerics call (schema 8 and before: 2) ...
    warmup_fwd_bwd_calls: int = 1   # ... and forward+backward ones (schema 8 and before: 2)
    lse_checks: bool = True         # the lse checks of variants returning one (schema 10 and before: none)
    lse_shards: bool = True         # their context-parallel shards (schema 16 and before: none)
    referee: bool = True            # the referee's calls and float64 forward (schema 11 and before: none)
    invariance: bool = True         # the batch and chunk invariance calls (schema 12 and before: none)
    golden_store: bool = True       # references read back from the golden store (schema 13 and before: none)
    arguments: bool = True          # the argument probes' calls (schema 14 and before: none)
    referee_golden_forward: bool = False   # the referee's shifted values had a float64 forward of their own (11-13)
    # seconds a measurement may sample beyond its minimum (0: none; schema 15 and before)
    noise_cap_s: float = 0.0
    cpu_chunk_bytes: int = 32 * 2**20
    cuda_chunk_bytes: int = 256 * 2**20

    @classmethod
    def of_preset(cls, preset: Preset) -> "Settings":
        return cls(min_samples=preset.min_samples, min_time_s=preset.min_time_s,
                   max_cell_s=preset.max_cell_s, energy_window_s=preset.energy_window_s,
                   noise_cap_s=preset.noise_cap_s if preset.noise_target else 0.0)

    @classmethod
    def of_run(cls, run_info: Mapping[str, Any]) -> "Settings":
        """The settings a run folder's records were made with (run.json)."""
        timing = run_info.get("timing") or {}
        max_cell_s = timing.get("max_cell_s", 30.0)
        base = cls(min_samples=int(timing.get("min_samples", 5)),
                   min_time_s=float(timing.get("min_time_s", 0.2)),
                   max_cell_s=None if max_cell_s is None else float(max_cell_s),
                   energy_window_s=float(timing.get("energy_window_s", 0.1)),
                   noise_cap_s=float(timing.get("noise_cap_s") or 0.0) if timing.get("noise_target") else 0.0)
        argv = list(run_info.get("argv") or [])
        if "--energy-window-s" in argv:
            base = replace(base, energy_window_s=float(argv[argv.index("--energy-window-s") + 1]))
        if int(run_info.get("schema", 3)) <= 16:
            base = replace(base, lse_shards=False)
        if int(run_info.get("schema", 3)) <= 14:
            base = replace(base, arguments=False)
        if int(run_info.get("schema", 3)) <= 13:
            base = replace(base, golden_store=False, referee_golden_forward=True)
        if int(run_info.get("schema", 3)) <= 12:
            base = replace(base, invariance=False)
        if int(run_info.get("schema", 3)) <= 11:
            base = replace(base, referee=False)
        if int(run_info.get("schema", 3)) <= 10:
            base = replace(base, lse_checks=False)
        if int(run_info.get("schema", 3)) <= 8:
            base = replace(base, warmup_fwd_calls=2, warmup_fwd_bwd_calls=2)
        if int(run_info.get("schema", 3)) <= 2:
            base = replace(base, timing="host", energy="window", golden="full",
                           cuda_chunk_bytes=32 * 2**20, masked_rows_loop=True)
        return base
