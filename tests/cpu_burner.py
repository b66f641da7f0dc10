"""A CPU-burning neighbour for tests: processes that spin for `period_s`, sleep for `period_s`, and
again, until stopped (a shared CI runner's neighbour, switching on and off every 50 ms).

    with burning():              # one process per core
        ...                      # whatever runs here shares the cores with it
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from typing import Iterator


def _burn(period_s: float, stop_at: float) -> None:
    while time.time() < stop_at:
        began = time.perf_counter()
        while time.perf_counter() - began < period_s:
            pass
        time.sleep(period_s)


@contextlib.contextmanager
def burning(processes: int | None = None, period_s: float = 0.05, limit_s: float = 600.0) -> Iterator[None]:
    """`processes` burners (default: one per core) for the block, each stopping by itself after
    `limit_s` should the block never end (a killed test)."""
    ctx = multiprocessing.get_context("spawn")
    stop_at = time.time() + limit_s
    procs = [ctx.Process(target=_burn, args=(period_s, stop_at), daemon=True)
             for _ in range(processes or os.cpu_count() or 1)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(5)
