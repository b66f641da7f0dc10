"""A CPU-burning neighbour for tests: processes that spin for `period_s`, sleep for `period_s`, and
again, until stopped (a shared CI runner's neighbour, switching on and off every 50 ms). The burners
switch together, on the wall clock's period boundaries: one neighbour, on or off, so what runs
beside it is timed in two modes (independent burners would blur into a steady slowdown, which a
median shrugs off).

    with burning():              # one process per core
        ...                      # whatever runs here shares the cores with it

Each burner is a plain `python -c` process (not multiprocessing: its spawn re-imports the caller's
main module, which a test runner's or a `python -` script's is not).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Iterator

BURN = """
import sys, time
period, stop_at = float(sys.argv[1]), float(sys.argv[2])
while time.time() < stop_at:
    now = time.time()
    boundary = (int(now / period) + 1) * period
    if int(now / period) % 2 == 0:          # on: spin until the next boundary (every burner together)
        while time.time() < boundary:
            pass
    else:                                   # off: sleep until it
        time.sleep(max(0.0, boundary - now))
"""


@contextlib.contextmanager
def burning(processes: int | None = None, period_s: float = 0.05, limit_s: float = 600.0) -> Iterator[None]:
    """`processes` burners (default: one per core) for the block, each stopping by itself after
    `limit_s` should the block never end (a killed test)."""
    stop_at = time.time() + limit_s
    procs = [subprocess.Popen([sys.executable, "-c", BURN, str(period_s), str(stop_at)])
             for _ in range(processes or os.cpu_count() or 1)]
    try:
        time.sleep(0.1)                     # running before the block starts
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(5)
