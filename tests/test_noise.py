"""Timing noise: the median's interval (core/noise.py), sampling until it is narrow enough
(timing.measure with a SamplingRule), the unstable-cell finding, the canary's noise figure and slow
period, and ties in the verdict and in compare that follow the measured noise. Fake clocks and
hand-made records: no test here reads a real clock."""
from __future__ import annotations

import math
import random
from datetime import datetime, timezone

import pandas as pd
import pytest

from audit.analysis import compare_stats
from audit.analysis.findings import compute_findings
from audit.analysis.noise_rules import (canary_summary, check_timing_noise, rerun_rel, slow_period_cells,
                                        tie_lead, unstable_mask)
from audit.core.noise import SamplingRule, ci_rel, median_ci, _coverage
from audit.measure.machine.timing import measure
from pathlib import Path


# --------------------------------------------------------------------------- the median's interval

def test_the_order_statistics_cover_the_median_at_95_percent():
    """n = 5: even the extremes cover only 93.75% (no 95% interval); n = 6: the extremes, 96.9%;
    n = 50: x_(18)..x_(33) (the textbook's)."""
    assert median_ci([1.0, 2, 3, 4, 5]) is None
    assert median_ci([6.0, 1, 2, 5, 3, 4]) == (1.0, 6.0)
    assert _coverage(6, 1) == pytest.approx(1 - 2 / 64)
    values = [float(i) for i in range(1, 51)]
    assert median_ci(values) == (18.0, 33.0)
    assert _coverage(50, 18) >= 0.95 > _coverage(50, 19)


def test_the_interval_holds_its_coverage_on_a_skewed_bimodal_machine():
    """A shared machine's samples: 70% fast, 30% twice as slow. Over 400 draws of 30 samples, the
    interval holds the true median at least 94% of the time (a normal approximation does not have to)."""
    rng = random.Random(7)
    hits = 0
    for _ in range(400):
        draws = [1.0 + 0.02 * rng.random() if rng.random() < 0.7 else 2.0 + 0.2 * rng.random() for _ in range(30)]
        low, high = median_ci(draws)
        true_median = 1.0 + 0.02 * (0.5 / 0.7)     # the 50th percentile lies in the fast mode
        hits += low <= true_median <= high
    assert hits / 400 >= 0.94


def test_ci_rel_reads_the_issues_five_samples_as_known_to_plus_minus_48_percent():
    """The issue's cell: 179, 292, 392, 181, 223 ms: 5 samples, so the range stands in."""
    assert ci_rel([0.179, 0.292, 0.392, 0.181, 0.223]) == pytest.approx((0.392 - 0.179) / 2 / 0.223)
    assert ci_rel([0.1]) is None


# --------------------------------------------------------------------------- sampling until known

class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _work(clock: Clock, times):
    it = iter(times)

    def fn():
        clock.now += next(it)
    return fn


def test_a_steady_call_stops_at_its_first_95_percent_interval_and_a_noisy_one_samples_until_its_cap():
    """A steady call samples on only to the 6 samples a 95% interval takes (3 or 5 agreeing samples'
    range covers the median 75% or 94% of the time); a noisy one until its cap."""
    for minimum in (3, 5, 8):
        clock = Clock()
        steady = measure(_work(clock, [0.01] * 1000), estimate_s=0.01, min_samples=minimum, min_time_s=0.0,
                         clock=clock, rule=SamplingRule(0.03, 1.0))
        assert steady.n == max(minimum, 6) and steady.ci_rel == pytest.approx(0.0, abs=1e-12)
        assert steady.extra_s == pytest.approx(0.01 * max(0, 6 - minimum))
    rng = random.Random(1)
    noisy_times = [0.01 * (1 + 3 * (rng.random() < 0.5)) for _ in range(1000)]    # 10 or 40 ms, at random
    clock = Clock()
    noisy = measure(_work(clock, noisy_times), estimate_s=0.01, min_samples=5, min_time_s=0.0, clock=clock,
                    rule=SamplingRule(0.03, 0.5))
    assert noisy.n > 5 and 0.5 <= noisy.extra_s < 0.5 + 0.04      # it stopped at its cap (one sample over, at most)
    assert noisy.ci_rel > 0.03                                     # and is still not known: unstable
    clock = Clock()
    fixed = measure(_work(clock, noisy_times), estimate_s=0.01, min_samples=5, min_time_s=0.0, clock=clock)
    assert fixed.n == 5 and fixed.extra_s == 0.0                   # no rule: the fixed minimum, as before


def test_a_call_with_rare_outliers_samples_on_until_its_median_is_known():
    """Every 7th call twice as slow: 5 samples leave the median at ±50%; a few more pin it to ±0."""
    clock = Clock()
    times = [0.02 if i % 7 == 3 else 0.01 for i in range(1000)]
    out = measure(_work(clock, times), estimate_s=0.01, min_samples=5, min_time_s=0.0, clock=clock,
                  rule=SamplingRule(0.03, 1.0))
    assert ci_rel(out.per_call_s[:5]) > 0.03
    assert out.ci_rel <= 0.03 and 5 < out.n < 30 and out.extra_s < 0.3


# --------------------------------------------------------------------------- the finding

def _cell(**values):
    base = dict(id="x", variant="sdpa", device="cpu", dtype="fp32", d_k=64, seq_len=512, batch=1, heads=8,
                causal=False, scenario="normal", status="ok", reason=None, fwd_ms=1.0, fwd_bwd_ms=3.0,
                fwd_ci_rel=0.01, fwd_bwd_ci_rel=0.01, noise_target=0.03, started_at="2026-12-04T12:00:00+00:00")
    base.update(values)
    return base


def test_unstable_cells_give_one_warning_saying_how_many_and_how_bad():
    frame = pd.DataFrame([_cell(id="a"), _cell(id="b", fwd_ci_rel=0.40), _cell(id="c", fwd_bwd_ci_rel=0.09),
                          _cell(id="d", noise_target=None, fwd_ci_rel=0.5),        # an older run: not judged
                          _cell(id="e", status="error", fwd_ci_rel=0.5)])
    assert unstable_mask(frame).tolist() == [False, True, True, False, False]
    (finding,) = check_timing_noise(frame)
    assert finding["check"] == "timing_unstable" and finding["severity"] == "warning"
    assert list(finding["cells"]) == ["b", "c"]
    assert "2 of 3 timed cells are unstable" in finding["message"] and "worst ±40%, b" in finding["message"]
    assert any(f["check"] == "timing_unstable" for f in compute_findings(frame))
    assert check_timing_noise(pd.DataFrame([_cell(id="a"), _cell(id="b", fwd_ci_rel=0.029)])) == []


# --------------------------------------------------------------------------- the canary

T0 = datetime(2026, 12, 4, 12, tzinfo=timezone.utc).timestamp()


def _readings(*medians, ci=0.01, labels=("start", "middle", "end")):
    return [{"label": label, "at_unix": T0 + 100 * i, "median_s": m, "ci_rel": ci}
            for i, (label, m) in enumerate(zip(labels, medians))]


def test_a_steady_canary_gives_a_small_noise_figure_and_no_slow_period():
    summary = canary_summary(_readings(1.00e-4, 1.01e-4, 0.99e-4))
    assert summary["drift_rel"] == pytest.approx(1.01 / 0.99 - 1)
    assert summary["noise_rel"] == pytest.approx(1.01 / 0.99 - 1) and summary["slow"] == []
    frame = pd.DataFrame([_cell(id="a")])
    assert slow_period_cells(summary, frame).empty


def test_the_rerun_interval_adds_the_machines_drift_to_each_cells_own():
    """A cell's samples never see the machine's speed move between measurements: the interval a rerun
    lands in is the cell's own and the canary's drift combined; with a steady canary, the cell's own."""
    assert rerun_rel(0.03, 0.04) == pytest.approx(0.05)
    assert rerun_rel(0.03, None) == pytest.approx(0.03)
    frame = pd.DataFrame([_cell(id="a", fwd_ci_rel=0.03), _cell(id="b", fwd_ci_rel=0.02, fwd_bwd_ci_rel=0.03),
                          _cell(id="c", fwd_ci_rel=0.09), _cell(id="d", status="error", fwd_ci_rel=0.9)])
    drifting = canary_summary(_readings(1.00e-4, 1.04e-4, 1.02e-4), frame)
    assert drifting["canary_rel"] == pytest.approx(0.04)
    assert drifting["rerun_rel"] == pytest.approx(0.05)           # median of 0.05, 0.05, hypot(0.09, 0.04)
    steady = canary_summary(_readings(1.00e-4, 1.00e-4, 1.00e-4, ci=0.0), frame)
    assert steady["rerun_rel"] == pytest.approx(0.03)
    assert canary_summary(_readings(1.00e-4, 1.04e-4))["rerun_rel"] is None     # no cells: nothing to say
    from audit.render.noise_section import noise_blocks
    from audit.render.page import render_markdown
    text = render_markdown(noise_blocks(_readings(1.00e-4, 1.04e-4, 1.02e-4), frame, None))
    assert "A rerun on this machine should land within" in text and "±5.0%" in text
    assert "A rerun" not in render_markdown(noise_blocks(_readings(1.0e-4), pd.DataFrame(), None))


def test_a_canary_that_slowed_names_the_cells_measured_around_it():
    """The end reading 40% slower: the cells that started after the middle reading ran slow."""
    summary = canary_summary(_readings(1.0e-4, 1.02e-4, 1.4e-4))
    assert summary["slow"] == ["end"] and summary["slow_by_rel"]["end"] == pytest.approx(0.4)
    assert summary["noise_rel"] == pytest.approx(0.4)

    def at(seconds):
        return datetime.fromtimestamp(T0 + seconds, timezone.utc).isoformat()
    frame = pd.DataFrame([_cell(id="early", started_at=at(50)), _cell(id="late", started_at=at(150)),
                          _cell(id="later", started_at=at(199))])
    assert slow_period_cells(summary, frame)["id"].tolist() == ["late", "later"]
    assert canary_summary([])["noise_rel"] is None


def test_each_slow_reading_names_only_the_cells_between_its_neighbours():
    """Five readings (a run's start, quarters and end), the start and the end slow: each names the
    cells of its own period, not the run's every cell (three readings named 745 of 745)."""
    from audit.measure.machine.canary import LABELS
    from audit.render.noise_section import noise_blocks
    from audit.render.page import render_markdown
    summary = canary_summary(_readings(1.3e-4, 1.0e-4, 1.0e-4, 1.01e-4, 1.2e-4, labels=LABELS))
    assert summary["slow"] == ["start", "end"]

    def at(seconds):
        return datetime.fromtimestamp(T0 + seconds, timezone.utc).isoformat()
    frame = pd.DataFrame([_cell(id=f"c{t}", started_at=at(t)) for t in (10, 90, 150, 250, 350, 390)])
    assert slow_period_cells(summary, frame, "start")["id"].tolist() == ["c10", "c90"]
    assert slow_period_cells(summary, frame, "end")["id"].tolist() == ["c350", "c390"]
    assert slow_period_cells(summary, frame)["id"].tolist() == ["c10", "c90", "c350", "c390"]
    page = render_markdown(noise_blocks(summary["readings"], frame, None))
    assert "30.0% slower at the start reading: 2 ok cell(s)" in page and "c10, c90." in page
    assert "20.0% slower at the end reading: 2 ok cell(s)" in page


# --------------------------------------------------------------------------- ties

def test_the_tie_lead_follows_the_measured_noise():
    """Two variants over 4 cells: ±1% cells tie only under a ~0.7% lead; ±20% cells under ~14% (the
    geometric mean of 4 cells halves each cell's width); the run's canary drift adds on top."""
    quiet = tie_lead([0.01] * 4, [0.01] * 4, None)
    loud = tie_lead([0.20] * 4, [0.20] * 4, None)
    assert 1.003 < quiet < 1.02 and 1.10 < loud < 1.20
    assert tie_lead([0.01] * 4, [0.01] * 4, 0.10) == pytest.approx(quiet * 1.10)


def test_the_verdict_ties_by_measured_noise_not_a_fixed_10_percent():
    """sdpa 6% faster than eager on 3 shared cells: with cells known to ±1% that is a lead; with cells
    known to ±25% (a shared runner) it is a tie. The old fixed rule called both a tie."""
    from audit.render.recommend import recommendations

    def frame(noise):
        rows = []
        for t in (256, 512, 1024):
            rows += [_cell(id=f"sdpa-{t}", variant="sdpa", seq_len=t, fwd_ms=1.0, fwd_ci_rel=noise, fwd_bwd_ci_rel=noise),
                     _cell(id=f"eager-{t}", variant="eager", seq_len=t, fwd_ms=1.06, fwd_ci_rel=noise,
                           fwd_bwd_ci_rel=noise)]
        return pd.DataFrame(rows)
    (quiet,) = [r for r in recommendations(frame(0.01), []) if r.kind == "no mask"] or recommendations(frame(0.01), [])
    (loud,) = [r for r in recommendations(frame(0.25), []) if r.kind == "no mask"] or recommendations(frame(0.25), [])
    assert quiet.recommended == loud.recommended == "sdpa" and quiet.lead == pytest.approx(1.06)
    assert quiet.lead >= quiet.tie_at                   # measured to ±1%: sdpa leads
    assert loud.lead < loud.tie_at                      # measured to ±25%: tied
    assert recommendations(frame(0.01), [], run_noise=0.08)[0].tie_at > 1.08   # a canary drift of 8%: tied


def test_compare_floors_its_run_to_run_noise_at_the_runs_measured_canaries():
    """Two runs whose canaries drifted 20%: a cell 10% slower in B is 'the same' (its interval holds
    1); two quiet runs (1% each): the same 10% is a change. Without canaries: the fixed floor."""
    assert compare_stats.canary_floor_sd(None, 0.01) == compare_stats.NOISE_FLOOR_SD
    loud = compare_stats.canary_floor_sd(0.20, 0.20)
    quiet = compare_stats.canary_floor_sd(0.01, 0.01)
    assert loud == pytest.approx(math.hypot(math.log(1.2), math.log(1.2)) / compare_stats.Z)
    ci = compare_stats.RatioCI(1.10, 1.09, 1.11, "bootstrap")
    assert compare_stats.widen(ci, loud).low < 1.0                 # the same
    assert compare_stats.widen(ci, quiet).low > 1.0                # slower
    used, measured = compare_stats.run_noise_sd([1.1] * 10, ["sdpa"] * 10, loud)
    assert used == loud and measured == pytest.approx(0.0)


# --------------------------------------------------------------------------- the cost of noise

def test_a_noisy_machines_runs_fit_a_larger_share_and_its_budget_buys_fewer_cells():
    """_fit_noise: the mean share of the cap the recorded measurements used; with it the cost model
    predicts more time per cell, and the same budget keeps fewer cells."""
    from types import SimpleNamespace

    from audit.core.grid import Case
    from audit.plan.budget import choose
    from audit.plan.costfit import _fit_noise
    from audit.plan.costmodel import CostModel
    from audit.plan.priors import Params, load_priors
    from audit.plan.settings import Settings
    runs = [SimpleNamespace(settings=Settings(noise_cap_s=0.1), frame=pd.DataFrame(
        [_cell(id="a", fwd_extra_s=0.1, fwd_bwd_extra_s=0.1), _cell(id="b", fwd_extra_s=0.05, fwd_bwd_extra_s=0.0),
         _cell(id="c", status="error", fwd_extra_s=None, fwd_bwd_extra_s=None)])),
            SimpleNamespace(settings=Settings(noise_cap_s=0.0), frame=pd.DataFrame([_cell(id="d", fwd_extra_s=9.0)]))]
    fitted = Params()
    _fit_noise(runs, fitted)
    assert fitted.noise_share == {"cpu": pytest.approx((1 + 1 + 0.5 + 0) / 4)}
    cases = [Case(v, "cpu", "fp32", 32, t, 1, 2, False, "normal") for v in ("sdpa", "eager") for t in (64, 128, 256)]
    settings = Settings(arguments=False, noise_cap_s=0.2)

    def plan(share):
        params = load_priors().merged(Params(noise_share={"cpu": share}))
        model = CostModel(params)
        pred = model.predict(cases, settings, {}, {})
        return pred, model.noise_s(pred, settings)
    quiet, (quiet_s, quiet_share) = plan(0.0)
    noisy, (noisy_s, noisy_share) = plan(1.0)
    assert quiet_s == 0.0 and noisy_s == pytest.approx(len(cases) * 2 * 0.2) and noisy_share == {"cpu": 1.0}
    assert (noisy["timed"] - quiet["timed"]).tolist() == pytest.approx([0.4] * len(cases))
    budget = float(quiet["total_s"].sum()) + 1.0 + 0.1     # the reserve, and slack for the sums' rounding
    kept = {name: len(pred) - len(choose(pred, budget_s=budget, reserve_s=1.0, max_cell_s=None).skip)
            for name, pred in (("quiet", quiet), ("noisy", noisy))}
    assert kept["quiet"] == len(cases) and kept["noisy"] < len(cases)


def test_the_run_noise_figure_takes_the_cells_widths_when_the_canary_shrugs_the_neighbour_off():
    """A 1-thread canary may read steady beside a burning neighbour while cells stay unknown: the
    figure is the larger of the canary's and the cells' mean width (each at most ±100%)."""
    readings = _readings(1.0e-4, 1.005e-4, 1.0e-4)
    quiet = pd.DataFrame([_cell(id="a", fwd_ci_rel=0.01), _cell(id="b", fwd_ci_rel=0.02)])
    loud = pd.DataFrame([_cell(id="a", fwd_ci_rel=0.20), _cell(id="b", fwd_ci_rel=0.40)])
    assert canary_summary(readings, quiet)["noise_rel"] == pytest.approx(0.015)
    assert canary_summary(readings, loud)["noise_rel"] == pytest.approx(0.30)
    wild = pd.DataFrame([_cell(id="a", fwd_ci_rel=0.02), _cell(id="b", fwd_ci_rel=34.0)])      # one cell ±3400%
    assert canary_summary(readings, wild)["cells_rel"] == pytest.approx(0.51)
    assert canary_summary(readings, loud)["canary_rel"] == pytest.approx(0.01)     # compare floors on this one


def test_the_default_target_comes_from_the_environment_or_refuses_it(monkeypatch):
    from audit.core.errors import UsageError
    from audit.core.noise import NOISE_TARGET, NOISE_TARGET_ENV
    from audit.workload import presets
    monkeypatch.delenv(NOISE_TARGET_ENV, raising=False)
    assert presets.presets()["quick"].noise_target == NOISE_TARGET == 0.05
    monkeypatch.setenv(NOISE_TARGET_ENV, "2.5")
    assert presets.presets()["cpu"].noise_target == pytest.approx(0.025)
    monkeypatch.setenv(NOISE_TARGET_ENV, "lots")
    with pytest.raises(UsageError, match="ATTN_AUDIT_NOISE_TARGET: 'lots' is not a percentage"):
        presets.presets()


def test_the_quarter_readings_follow_the_planned_work_measured_not_the_records(monkeypatch):
    """The plan's skipped cells are recorded last: quarters of every record all fell at the run's end
    (a quick run's 25%, middle and 75% readings came 0.5 s apart, 25 s in). Readings follow the share
    of the planned work measured (Keeper.progress, by predicted seconds; a cell cut at run time leaves
    the whole), each once."""
    from audit.core.grid import Case
    from audit.execute.runner import CanaryTimes
    from audit.measure.machine import canary
    from audit.plan.budget import Plan
    from audit.plan.keeper import Keeper
    taken = []
    ids = [f"c{i}" for i in range(8)]
    plan = Plan(skip={"c7": "over the budget"}, tier={}, predicted={i: 1.0 for i in ids}, deadline_unix=None,
                budget_s=None)
    keeper = Keeper(plan, ids)
    monkeypatch.setattr(canary, "record_canary",
                        lambda run_dir, label, device: taken.append((label, keeper.done_cells)))
    times = CanaryTimes(Path("."), [Case("sdpa", "cpu", "fp32", 32, 64, 1, 2, False, "normal")])
    for cell in ids[:7]:
        keeper.done(cell, 1.0)
        times.after_cell(keeper.progress())
    assert taken == [("25%", 2), ("middle", 4), ("75%", 6)]              # of the 7 kept cells' 7 s
    off = CanaryTimes(Path("."), [], on=False)
    off.after_cell(1.0)
    assert len(taken) == 3                                              # --noise-target 0: no canary
    unplanned = Keeper(None, ids)                                       # nothing predicted: by count
    for cell in ids[:2]:
        unplanned.done(cell, 1.0)
    assert unplanned.progress() == pytest.approx(2 / 8)


@pytest.mark.parametrize("cells", range(1, 9))
def test_no_reading_is_taken_without_a_cell_since_the_last_and_the_plan_counts_the_readings(monkeypatch, cells):
    """A reading says how fast the machine was over the cells since the one before; back to back
    they say nothing new. A one-cell run took five readings, four after its cell (1 s of its 3.8 s);
    it takes the start's and one more. The plan counts what is taken (canary.readings_for)."""
    from audit.execute.runner import CanaryTimes
    from audit.measure.machine import canary
    taken = []
    monkeypatch.setattr(canary, "record_canary", lambda run_dir, label, device: taken.append(label))
    times = CanaryTimes(Path("."), [])
    for done in range(1, cells + 1):                    # equal cells: the share of the work done
        times.after_cell(done / cells)
    times.at_end()
    assert len(taken) == len(set(taken)) and 1 + len(taken) == canary.readings_for(cells)   # with the start's
    assert set(taken) <= set(canary.LABELS[1:]) and (cells < 5 or taken == list(canary.LABELS[1:]))
    if cells == 1:
        assert taken == ["75%"]                         # one reading after the cell, no end right after it


def test_advice_comes_where_the_run_was_noisy_and_names_fewer_threads_only_where_all_cores_were_used():
    from audit.analysis.noise_rules import advice
    quiet = canary_summary(_readings(1.0e-4, 1.01e-4, 1.0e-4))
    cells = [_cell(id=f"c{i}") for i in range(200)]
    one_bad = pd.DataFrame(cells + [_cell(id="bad", fwd_ci_rel=0.5)])           # 1 of 201: a control's own noise
    assert advice(quiet, one_bad, {"cpu_count": 2}) == []
    many_bad = pd.DataFrame(cells[:20] + [_cell(id=f"bad{i}", fwd_ci_rel=0.5) for i in range(3)])
    threads = dict(quiet, readings=[dict(r, threads=2) for r in quiet["readings"]])
    tips = advice(threads, many_bad, {"cpu_count": 2})
    assert len(tips) == 2 and "OMP_NUM_THREADS=1" in tips[0] and "idle machine" in tips[1]
    assert [t for t in advice(threads, many_bad, {"cpu_count": 4}) if "threads" in t] == []   # 2 of 4: spare cores
    drifting = canary_summary(_readings(1.0e-4, 1.3e-4, 1.0e-4))                 # a 30% drift alone
    assert any("idle machine" in t for t in advice(drifting, pd.DataFrame(cells[:3]), None))
    assert advice(quiet, pd.DataFrame(), None) == []


def test_a_negative_controls_own_noise_is_marked_but_not_the_runs_warning():
    """broken.background_thread leaves a thread running after it returns: its times are its own
    noise, not the machine's (12 of 13 unstable cells of six idle quick runs)."""
    frame = pd.DataFrame([_cell(id="a"), _cell(id="ctl", variant="broken.background_thread", fwd_ci_rel=0.4)])
    assert unstable_mask(frame).tolist() == [False, True]
    assert check_timing_noise(frame) == []
    frame = pd.concat([frame, pd.DataFrame([_cell(id="b", fwd_ci_rel=0.4)])], ignore_index=True)
    (finding,) = check_timing_noise(frame)
    assert list(finding["cells"]) == ["b"] and "1 of 2 timed cells" in finding["message"]
