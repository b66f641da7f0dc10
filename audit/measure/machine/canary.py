"""The run's canary: one small, fixed reference cell timed at the run's start, at each quarter of its
cells, and at its end.

Its readings say whether the machine kept its speed while the cells were measured (a neighbour
starting, a CPU clocking down): the same work, timed the same way, should take the same time.
analysis/noise_rules.py turns them into the run's noise figure (drift and spread), the report's
Environment section shows them, and run.json keeps their summary.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ...core.runfolder import CANARY_FILE, read_canaries
from .timing import MIN_BLOCK_S, measure, measure_device, sync_for

CANARY_N = 256             # an n×n fp32 matmul: ~0.1 ms on a 2-core CPU, microseconds on a GPU
CANARY_S = 0.15            # timed seconds per reading (blocks of 1 ms: ~150 samples)
WARM_S = 0.1               # calls before timing: a process's first reading was 50% slow with 3 (2-core Xeon)
# start: before the ceilings; "25%", "middle", "75%": as the measuring passes that share of the planned
# work (execute/runner.CanaryTimes); end: after the last cell. Five, not three: a slow reading names the
# cells measured between its neighbours, and with three, a slow start or end named every cell of the run
# (a cpu preset run: 745 of 745)
QUARTERS = ("25%", "middle", "75%")
LABELS = ("start", *QUARTERS, "end")
CANARY_WALL_S = 0.3        # one reading's wall time, warm-up included (0.25 s on a 2-core Xeon): plan/overhead.py


def readings_for(cells: int) -> int:
    """How many readings a run measuring `cells` cells takes (execute/runner.CanaryTimes): the start's,
    then one after a cell at most for each later label, none without a cell since the last. With
    more than four cells all five (a run's costs spread over its cells); fewer take fewer."""
    return min(len(LABELS), 1 + cells) if cells > 0 else 1


def time_canary(device: str = "cpu", *, seconds: float = CANARY_S) -> dict[str, Any]:
    """One reading: the median seconds of the reference matmul, how well it is known (ci_rel), the
    samples, and when. Never raises: a failure is the reading's `reason`."""
    started = time.time()
    try:
        import torch
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(CANARY_N, CANARY_N, generator=gen).to(device)            # (n, n)
        b = torch.randn(CANARY_N, CANARY_N, generator=gen).to(device)            # (n, n)
        fn = lambda: torch.mm(a, b)                                           # noqa: E731
        sync = sync_for(device)
        warm_until = time.perf_counter() + WARM_S      # allocations, kernels, the thread pool's start
        while time.perf_counter() < warm_until:
            fn()
            if sync:
                sync()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        estimate = max(time.perf_counter() - t0, 1e-6)
        if device.startswith("cuda"):
            from .cell_timing import cuda_clock
            clock = cuda_clock()
            samples = measure_device(fn, estimate_s=estimate, clock=clock, min_samples=11, min_time_s=seconds,
                                     host_clock=clock.host_clock)
        else:
            # blocks of 1 ms, not the cells' 0.2 ms: a neighbour then disturbs a good share of the
            # canary's samples, so its spread shows the neighbour that the cells' shorter blocks get under
            samples = measure(fn, estimate_s=estimate, min_samples=11, min_time_s=seconds, sync=sync,
                              min_block_s=MIN_BLOCK_S)
        return {"at_unix": started, "device": device, "median_s": samples.median_s, "ci_rel": samples.ci_rel,
                "n": samples.n, "calls_per_sample": samples.calls_per_sample, "seconds": time.time() - started,
                "threads": torch.get_num_threads()}
    except Exception as exc:  # noqa: BLE001 - a missing reading is said, never the run's end
        return {"at_unix": started, "device": device, "reason": f"{type(exc).__name__}: {exc}"[:300]}


def record_canary(run_dir: str | Path, label: str, device: str = "cpu") -> dict[str, Any] | None:
    """Time the canary and append it to DIR/canary.jsonl as reading `label` (one of LABELS),
    once per label and run folder (a resumed run keeps its start); the reading, or None if the
    folder already has one of that label."""
    if any(r.get("label") == label for r in read_canaries(run_dir)):
        return None
    reading = dict(time_canary(device), label=label)
    with open(Path(run_dir) / CANARY_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(reading) + "\n")
    return reading


def canary_device(devices: Any) -> str:
    """The device the run's canary times: CUDA where the run has CUDA cells (the GPU's speed is what
    its cells' times depend on), else the CPU."""
    return "cuda" if any(str(d).startswith("cuda") for d in devices) else "cpu"
