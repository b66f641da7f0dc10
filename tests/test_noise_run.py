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


TRIES = 2     # a pair missing for a moment of the host's own noise is measured again; a host noisy throughout (two CI runs of
              # 2026-12-06: every one of 3 pairs) skips the idle half, and a third pair cost 35 s there for nothing


def _pair(base: Path) -> tuple[dict, dict, set, set, str]:
    with burning(processes=3 * (os.cpu_count() or 1), period_s=0.05):   # three a core, on and off together
        loud = _run(base / "loud")
    quiet = _run(base / "quiet", "--no-report")
    checks = [{f["check"] for f in compute_findings(load(base / name))} for name in ("loud", "quiet")]
    return loud, quiet, checks[0], checks[1], (base / "loud" / "index.md").read_text()


def _idle_half(loud: dict, quiet: dict, quiet_checks: set) -> bool:
    """What the idle run must show beside the loud one: no cell flagged, no finding, cells narrower and a
    smaller figure."""
    return (quiet["cells_unstable"] == 0 and "timing_unstable" not in quiet_checks
            and loud["cells_rel"] > quiet["cells_rel"] and loud["noise_rel"] > quiet["noise_rel"])


def _as_the_issue_says(loud: dict, quiet: dict, loud_checks: set, quiet_checks: set, page: str) -> bool:
    return (loud["cells_unstable"] >= 1 and "timing_unstable" in loud_checks and _idle_half(loud, quiet, quiet_checks))


@pytest.mark.serial
@pytest.mark.every_core               # its neighbour burns every core
def test_a_burning_neighbour_makes_cells_unstable_and_the_noise_figure_rise(tmp_path):
    """Measured on a 2-core Xeon VM: with the burner 3 to 4 of 10 cells unstable and the noise figure
    9-11%; idle, 0 of 10 and 4.4%, in each of 2 pairs (with --noise-cap-s 0.2: 1 of 10 idle). A pair that misses is measured
    again (TRIES): code that never flags, or always does, misses every time.

    The idle half needs an idle host, which a shared CI runner is not always: in two CI runs of 2026-12-06
    on an AVX2-only EPYC the "idle" run's own canary drifted 28-32% with nothing of the test beside it,
    in all three pairs (one of its ten cells flagged, rightly). Where the idle run's canary marks a reading
    slow (noise_rules.canary_summary `slow`: the audit's own word that the machine moved), the neighbour's
    half is still asserted and the idle half is skipped, saying so; the rule's both sides on fixed
    readings are tests/test_noise.py's."""
    for attempt in range(TRIES):
        got = _pair(tmp_path / f"try{attempt}")
        if _as_the_issue_says(*got):
            break
    loud, quiet, loud_checks, quiet_checks, page = got
    assert loud["cells_judged"] == quiet["cells_judged"] > 0
    assert loud["cells_unstable"] >= 1, loud
    assert loud["noise_rel"] >= loud["cells_rel"], loud             # the figure takes the cells' widths in
    assert [r["label"] for r in loud["readings"]] == ["start", "25%", "middle", "75%", "end"]
    assert "timing_unstable" in loud_checks
    assert "### Timing noise" in page and "unstable" in page
    assert any(f" ±{n}%" in page for n in range(6, 10000))          # a speed table marks a cell's width
    if quiet["slow"] and not _idle_half(loud, quiet, quiet_checks):
        pytest.skip(f"no idle run to compare with: the host itself moved in each of {TRIES} pairs (the idle run's "
                    f"canary drifted {quiet['drift_rel']:.0%}, readings {quiet['slow']} slow)")
    assert quiet["cells_unstable"] == 0, quiet                      # the idle machine: no cell flagged
    assert "timing_unstable" not in quiet_checks
    assert loud["cells_rel"] > quiet["cells_rel"] and loud["noise_rel"] > quiet["noise_rel"], (loud, quiet)
