"""Timing noise end to end: the same small grid measured with a CPU-burning neighbour switching on and
off every 50 ms (tests/cpu_burner.py: two burners a core, switching together), and on the idle machine. Serial: it times things,
and an idle machine means no other test beside it. Calls of 0.6 to 9 ms (T=512): with 0.2 ms
blocks, the shorter calls of T=128-256 kept their medians to ±5% beside this neighbour (right ones:
within a few % of the idle run's), so nothing was there to flag. Each measurement may sample 0.5 s
beyond its minimum (--noise-cap-s): room for the idle machine's cells to reach their target, where the
neighbour's stay two-moded however long they are sampled."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from audit.analysis.findings import compute_findings
from audit.core.records import load
from tests.cpu_burner import burning

ROOT = Path(__file__).resolve().parents[1]
GRID = ["--preset", "quick", "--variant", "sdpa", "eager", "--dtype", "fp32", "--scenario", "normal",
        "--seq-len", "512", "--causal", "false", "--budget", "none", "--noise-target", "5", "--noise-cap-s", "0.5",
        "--no-progress"]


def _run(out: Path, *extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "audit", "run", *GRID, "--out", str(out), *extra], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "run.json").read_text())["noise"]


TRIES = 3     # this VM's own speed swings (an idle canary drifted 17% once, 12.5% in a CI run of 2026-12-06): more pairs, as test_compare


def _pair(base: Path) -> tuple[dict, dict, set, set, str]:
    with burning(processes=3 * (os.cpu_count() or 1), period_s=0.05):   # three a core, on and off together
        loud = _run(base / "loud")
    quiet = _run(base / "quiet", "--no-report")
    checks = [{f["check"] for f in compute_findings(load(base / name))} for name in ("loud", "quiet")]
    return loud, quiet, checks[0], checks[1], (base / "loud" / "index.md").read_text()


def _figure_rises_with_the_neighbour(loud: dict, quiet: dict) -> bool:
    """The part of the noise figure the neighbour moves: the cells' widths (cells_rel), and the figure taking
    them in. The figure's other part, the canary, reads the host itself: a CI run of 2026-12-06 had the
    "idle" run's canary drift 32% (the host's own neighbours), its figure 0.32 over the burner's 0.25, while
    its cells stayed 4% wide against the burner's 25%. The figures themselves are compared only where the
    idle run's canary stayed under the burner's cells."""
    rises = loud["noise_rel"] >= loud["cells_rel"] > quiet["cells_rel"]
    host_quiet = (quiet["canary_rel"] or 0.0) < loud["cells_rel"]
    return rises and (loud["noise_rel"] > quiet["noise_rel"] if host_quiet else True)


def _as_the_issue_says(loud: dict, quiet: dict, loud_checks: set, quiet_checks: set, page: str) -> bool:
    return (quiet["cells_unstable"] == 0 and loud["cells_unstable"] >= 1 and _figure_rises_with_the_neighbour(loud, quiet)
            and "timing_unstable" in loud_checks and "timing_unstable" not in quiet_checks)


@pytest.mark.serial
@pytest.mark.every_core               # its neighbour burns every core
def test_a_burning_neighbour_makes_cells_unstable_and_the_noise_figure_rise(tmp_path):
    """Measured on a 2-core Xeon VM: with the burner 3 to 4 of 10 cells unstable and the noise figure
    9-11%; idle, 0 of 10 and 4.4%, in each of 2 pairs (with --noise-cap-s 0.2: 1 of 10 idle). A pair that misses is measured
    again (TRIES): code that never flags, or always does, misses every time."""
    for attempt in range(TRIES):
        got = _pair(tmp_path / f"try{attempt}")
        if _as_the_issue_says(*got):
            break
    loud, quiet, loud_checks, quiet_checks, page = got
    assert loud["cells_judged"] == quiet["cells_judged"] > 0
    assert quiet["cells_unstable"] == 0, quiet                      # the idle machine: no cell flagged
    assert loud["cells_unstable"] >= 1, loud
    assert _figure_rises_with_the_neighbour(loud, quiet), (loud, quiet)
    assert [r["label"] for r in loud["readings"]] == ["start", "25%", "middle", "75%", "end"]
    assert "timing_unstable" in loud_checks and "timing_unstable" not in quiet_checks
    assert "### Timing noise" in page and "unstable" in page
    assert any(f" ±{n}%" in page for n in range(6, 10000))          # a speed table marks a cell's width
