"""The time budget: durations, which cells a plan keeps, and keeping to it while running."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from audit.core.errors import UsageError
from audit.core.grid import Case
from audit.core.records import read_records
from audit.core.units import parse_duration
from audit.execute import runner
from audit.plan.budget import Plan, choose
from audit.plan.keeper import Keeper
from audit.plan.plan_text import describe as budget_describe
from audit.workload import presets


@pytest.fixture(autouse=True)
def _flex_compiles_here(monkeypatch):
    """These tests take flex as the variant whose every cell carries a compile; where torch refuses to
    compile it (ATEN_CPU_CAPABILITY=default) the plan predicts its cells skipped in milliseconds
    instead (workload.platform_limits), so the plans here are made for a CPU it compiles on."""
    from audit.workload import platform_limits
    monkeypatch.setattr(platform_limits, "flex_cpu_supported", lambda: True)


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("10m", 600), ("1h", 3600), ("1m30s", 90),
                                           ("45", 45), ("2.5min", 150), ("none", None), ("0", None)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["ten minutes", "-5s", "5x", "", "s", "1m30x"])
def test_bad_durations_are_usage_errors(text):
    with pytest.raises(UsageError, match="--budget"):
        parse_duration(text)


def _pred(rows, variant="v"):
    """A prediction frame: (id, input set, status, total_s, shared_s), every cell of one variant
    and kind (so the coverage tier is one cell, the first of the cheapest)."""
    out = []
    for cell_id, key, status, total, shared in rows:
        out.append({"id": cell_id, "variant": variant, "device": "cpu", "dtype": "fp32", "d_k": 8,
                    "seq_len": key, "batch": 1, "heads": 2, "kv_heads": 2, "causal": False,
                    "scenario": "normal", "status": status, "total_s": total, "shared_s": shared})
    return pd.DataFrame(out)


def test_the_cheapest_cells_are_kept_within_the_budget():
    pred = _pred([("a", 1, "ok", 5.0, 1.0), ("b", 1, "ok", 2.0, 0.0), ("c", 2, "ok", 30.0, 1.0),
                  ("d", 2, "ok", 1.0, 0.0), ("e", 3, "ok", 8.0, 0.0)])
    skip = choose(pred, budget_s=20.0, reserve_s=10.0, max_cell_s=100.0).skip
    assert set(skip) == {"c", "e"}                                    # 5 + 2 + 1 = 8 <= 10
    assert all("over the budget" in r and "predicted" in r for r in skip.values())
    assert choose(pred, budget_s=None, reserve_s=10.0, max_cell_s=100.0).skip == {}


def test_cells_over_the_per_cell_limit_are_skipped_with_or_without_budget():
    pred = _pred([("a", 1, "ok", 5.0, 0.0), ("b", 1, "ok", 12.0, 4.0)])
    skip = choose(pred, budget_s=None, reserve_s=0.0, max_cell_s=6.0).skip
    assert list(skip) == ["b"] and "per-cell limit 6 s" in skip["b"] and "predicted 8.0 s" in skip["b"]


def test_the_per_cell_limit_weighs_a_cell_without_the_compile_it_pays_for():
    """A compile is paid once whichever cell pays it: a cell whose amortized cost (the budget's
    weight) is all compile is not too slow for the per-cell limit; one whose own seconds are is."""
    pred = _pred([("compiles", 1, "ok", 6.5, 6.0), ("slow", 2, "ok", 8.0, 1.0)])
    pred["amortized_s"] = [6.5, 8.0]                 # nobody else uses the compile: it carries all of it
    skip = choose(pred, budget_s=None, reserve_s=0.0, max_cell_s=5.0).skip
    assert list(skip) == ["slow"] and "predicted 7.0 s" in skip["slow"]


def test_a_cell_left_alone_in_its_input_set_goes_with_the_set():
    """An unsupported backend's cell still builds its set's inputs and golden: once every
    measured cell of the set is cut, it is cut too."""
    pred = _pred([("a", 1, "ok", 50.0, 0.0), ("a-unsupported", 1, "skipped", 0.5, 0.5),
                  ("b", 2, "ok", 1.0, 0.0), ("b-unsupported", 2, "skipped", 0.1, 0.0)])
    skip = choose(pred, budget_s=10.0, reserve_s=5.0, max_cell_s=100.0).skip
    assert set(skip) == {"a", "a-unsupported"}
    assert "input set" in skip["a-unsupported"]


def test_repredicting_moves_shared_costs_to_the_next_cell():
    """Without the expensive first cell, the next cell of its set pays the golden: the plan
    predicts again and skips more until it really fits."""
    base = [("a", 1, "ok", 10.0, 6.0), ("b", 1, "ok", 3.0, 0.0), ("c", 1, "ok", 2.5, 0.0)]

    def repredict(ids):
        rows = [r for r in base if r[0] in ids]
        first = rows[0]
        rows[0] = (first[0], first[1], first[2], first[3] - first[4] + 6.0, 6.0)   # the golden moves
        return _pred(rows)
    skip = choose(_pred(base), budget_s=10.0, reserve_s=0.0, max_cell_s=100.0, repredict=repredict).skip
    kept = repredict([i for i in "abc" if i not in skip])
    assert kept["total_s"].sum() <= 10.0
    assert "a" in skip and "b" in skip and "c" not in skip


# --------------------------------------------------------------------------- keeping to it

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_keeper_skips_what_the_plan_skips_and_the_most_expensive_when_late():
    clock = Clock()
    plan = Plan(budget_s=100.0, deadline_unix=clock.now + 20.0,
                predicted={"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 1.0, "big": 8.0, "f": 1.0, "g": 1.0},
                skip={"planned": "over the budget: ..."})
    order = ["planned", "a", "b", "c", "d", "e", "big", "f", "g"]
    keeper = Keeper(plan, order, clock=clock)
    assert keeper.reason("planned").startswith("over the budget")
    for cell in "abcde":                      # every cell takes twice its prediction
        assert keeper.reason(cell) is None
        clock.now += 2.0
        keeper.done(cell, 2.0)
    assert keeper.factor() == pytest.approx(2.0)
    # 10 s left; big (8) + f + g (1 each) at 2x = 20 s: big goes, f and g stay
    assert keeper.reason("big").startswith("over the budget at run time")
    assert keeper.reason("f") is None and keeper.reason("g") is None


def test_keeper_never_cuts_a_cell_that_costs_nothing():
    """Past the deadline, a cell the runner refuses in milliseconds (predicted 0.4 ms: a backend
    the device lacks) is still handed to the runner, whose record says why it cannot run; a real
    cell is cut."""
    clock = Clock()
    plan = Plan(budget_s=60.0, deadline_unix=clock.now - 1.0,
                predicted={"refused": 0.0004, "real": 0.05, "big": 3.0})
    keeper = Keeper(plan, ["big", "refused", "real"], clock=clock)
    assert keeper.reason("big").startswith("over the budget at run time")
    assert keeper.reason("refused") is None
    assert keeper.reason("real").startswith("over the budget at run time")
    assert keeper.cut == ["big", "real"]


def test_one_slow_first_cell_does_not_condemn_the_rest():
    clock = Clock()
    predicted = {f"c{i}": 1.0 for i in range(10)}
    keeper = Keeper(Plan(budget_s=60.0, deadline_unix=clock.now + 40.0, predicted=predicted),
                    list(predicted), clock=clock)
    keeper.done("c0", 6.0)                    # the run's first compile: 6x
    clock.now += 6.0
    for i in range(1, 6):
        keeper.done(f"c{i}", 1.0)
        clock.now += 1.0
    assert keeper.factor() == pytest.approx(1.0)
    assert all(keeper.reason(f"c{i}") is None for i in range(6, 10))


def test_without_a_plan_nothing_is_skipped():
    keeper = Keeper(None, ["a"])
    assert keeper.reason("a") is None


def test_run_grid_records_planned_skips_with_their_prediction(tmp_path):
    preset = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0,
                            max_cell_s=60.0, energy_window_s=0.0)
    cases = [Case(v, "cpu", "fp32", 8, 16, 1, 2, False, "normal") for v in ("eager", "sdpa")]
    plan = Plan(budget_s=30.0, deadline_unix=None, predicted={cases[0].id: 0.2, cases[1].id: 9.0},
                skip={cases[1].id: "over the budget: the 30 s budget (--budget) ... predicted 9.0 s"})
    plan.write(tmp_path)
    runner.run_grid(cases, tmp_path, preset, {}, progress=False, plan=Plan.read(tmp_path))
    recs = {r["variant"]: r for r in read_records(tmp_path)}
    assert recs["eager"]["status"] == "ok" and recs["eager"]["predicted_s"] == 0.2
    assert recs["sdpa"]["status"] == "skipped" and recs["sdpa"]["predicted_s"] == 9.0
    assert recs["sdpa"]["reason"].startswith("over the budget") and recs["sdpa"]["fwd_ms"] is None

    from audit.render.build import build_report
    from audit.render.time_budget import budget_cuts_table
    cuts = budget_cuts_table(pd.DataFrame(list(recs.values())))
    assert list(cuts["id"]) == [cases[1].id] and cuts["predicted_s"].iloc[0] == 9.0
    (tmp_path / "run.json").write_text('{"timing": {"budget_s": 30.0}}')
    text = build_report(tmp_path)["index_md"].read_text()
    assert "## Time budget" in text and cases[1].id in text


def test_a_cell_limit_skips_only_where_it_applies(tmp_path):
    """max_cell_s None (what --budget none gives without --max-cell-s) measures the cell; a
    limit below its warm-up's prediction skips it as too slow."""
    case = Case("eager", "cpu", "fp32", 8, 16, 1, 2, False, "normal")
    for limit, status in ((None, "ok"), (1e-9, "skipped")):
        preset = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0,
                                max_cell_s=limit, energy_window_s=0.0)
        out = tmp_path / str(limit)
        out.mkdir()
        runner.run_grid([case], out, preset, {}, progress=False)
        (rec,) = read_records(out)
        assert rec["status"] == status, rec["reason"]
        if status == "skipped":
            assert rec["reason"].startswith("too slow for this device") and "--max-cell-s" in rec["reason"]


def test_a_cell_alone_with_its_compile_is_cut_before_cheap_cells():
    """Ranked by amortized cost: past the coverage tier (compiled_unfused's first cell), a
    compiled cell whose compile (2 s, cold) no other cell shares goes first, not the ten cheap
    cells whose costs it would otherwise outrank."""
    from audit.plan.costmodel import CostModel
    from audit.plan.priors import load_priors
    from audit.plan.settings import Settings
    cheap = [Case("eager", "cpu", "fp32", 32, 256, 1, 2, False, s)
             for s in ("normal", "scaled_x4", "scaled_x16", "outliers", "padding")]
    cheap += [Case("sdpa", "cpu", "fp32", 32, 256, 1, 2, False, c.scenario) for c in cheap]
    covering = Case("compiled_unfused", "cpu", "fp32", 8, 16, 1, 2, False, "normal")
    compiled = Case("compiled_unfused", "cpu", "fp32", 8, 32, 1, 2, False, "normal")
    # (no argument probes: their recompile, once per kind, would be a second cost the two cells share)
    pred = CostModel(load_priors()).predict([*cheap, covering, compiled], Settings(arguments=False), {}, {})
    own = pred["total_s"] - pred["shared_s"]
    assert own.iloc[-1] < own.iloc[:-2].min()           # by own seconds the compiled cell is the cheapest
    room = float(pred["total_s"].sum() - pred["total_s"].iloc[-1]) + 0.01
    chosen = choose(pred, budget_s=room, reserve_s=0.0, max_cell_s=None)
    assert set(chosen.skip) == {compiled.id} and chosen.tier[covering.id] == 0
    by_own = choose(pred.drop(columns="amortized_s"), budget_s=room, reserve_s=0.0, max_cell_s=None).skip
    assert compiled.id not in by_own and len(by_own) > 1  # ranked by own seconds, cheap cells went instead


def test_a_dry_run_and_the_run_make_one_plan(tmp_path):
    """The plan a dry-run prints is the plan the run then makes and keeps (plan.json), with a
    budget that cuts: the same ceilings (this machine's, kept in the cache) and reserve. The
    budget is set from this machine's own prediction (half the cells' time), so it cuts on any
    CPU. The run is stopped once it has planned (Ctrl-C), which keeps its plan."""
    import os
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    grid = [sys.executable, "-m", "audit", "run", "--preset", "quick", "--variant", "eager", "sdpa", "--dtype",
            "fp32", "--seq-len", "64", "128", "--heads", "2", "--kv-heads", "2", "--no-report", "--no-progress",
            "--out", str(tmp_path / "run")]
    # a cache of its own: another test measuring this machine's ceilings meanwhile (pytest-xdist) must not
    # change the host factor between the dry-run and the run
    env = dict(os.environ, PYTHONPATH=str(root), ATTN_AUDIT_CACHE=str(tmp_path / "cache"))

    def dry_run(budget: str) -> subprocess.CompletedProcess:
        done = subprocess.run([*grid, "--budget", budget, "--dry-run"], cwd=root, capture_output=True, text=True,
                              timeout=300, env=env)
        assert done.returncode == 0, done.stderr
        return done

    def seconds(text: str) -> float:
        value, unit = re.fullmatch(r"([\d.]+) (s|min)", text).groups()
        return float(value) * (60 if unit == "min" else 1)
    unlimited = dry_run("none").stdout.strip().splitlines()[-1]
    cells, reserve = re.search(r"predicted (.+?) \(\+ (.+?) start-up", unlimited).groups()
    budget = f"{seconds(reserve) + seconds(cells) / 2:.1f}s"
    dry = dry_run(budget)
    planned = dry.stdout.strip().splitlines()[-1]
    assert planned.startswith("plan: ") and "cells skipped" in planned, (budget, planned)
    args = [*grid, "--budget", budget]
    run = subprocess.Popen(args, cwd=root, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    said = []
    try:
        for line in run.stderr:
            said.append(line.rstrip("\n"))
            if line.startswith("attn-audit: plan: "):
                os.killpg(run.pid, signal.SIGINT)                 # planned: stop it (Ctrl-C)
                break
        run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert f"attn-audit: {planned}" in said, (planned, said)
    cut = {line.split()[0] for line in dry.stdout.splitlines()
           if "  skipped: over the budget" in line or "  skipped: not tried" in line}
    assert cut and cut == set(Plan.read(tmp_path / "run").skip)


# --------------------------------------------------------------------------- coverage first

def _predict(cases):
    """The cost model's rows without the argument probes: their recompiles, shared by a compiled
    variant's cells up to T 256, would blur the compile costs these tests set against each other."""
    from audit.plan.costmodel import CostModel
    from audit.plan.priors import load_priors
    from audit.plan.settings import Settings
    return CostModel(load_priors()).predict(cases, Settings(arguments=False), {}, {})


def _repredict(cases):
    by_id = {c.id: c for c in cases}
    return lambda ids: _predict([by_id[i] for i in ids])


def _speed_grid(variant, dtypes=("fp32",), seq_lens=(64, 128, 256, 512), batches=(1,)):
    return [Case(variant, "cpu", dtype, 32, t, b, 2, causal, "normal")
            for dtype in dtypes for t in seq_lens for b in batches for causal in (False, True)]


def test_every_variant_gets_a_cell_per_dtype_and_mask_kind_before_a_second_cell():
    """flex's cells each carry a compile, so cheapest-first alone gives it none (what issue 28
    saw: 0 of 24 flex cells); coverage first gives it its cheapest cell of each kind."""
    cases = [c for v in ("eager", "sdpa") for c in _speed_grid(v, ("fp32", "bf16"), batches=(1, 2, 4, 8))]
    cases += _speed_grid("flex")
    cases += [Case(v, "cpu", "fp32", 32, 128, 2, 2, False, "padding") for v in ("eager", "sdpa", "flex")]
    pred = _predict(cases)
    flex_cost = pred[pred["variant"] == "flex"]["amortized_s"]
    cheap = pred[pred["variant"] != "flex"]["amortized_s"]
    assert flex_cost.min() > cheap.max()                      # every flex cell costs more than any other
    others = float(_predict([c for c in cases if c.variant != "flex"])["total_s"].sum())
    room = 0.6 * others + 3 * float(flex_cost.min())
    # the other variants alone overflow the room and every flex cell costs more than any of them:
    # cheapest first (the rule before coverage) would give flex no cell
    assert others > room
    chosen = choose(pred, budget_s=room, reserve_s=0.0, max_cell_s=None, repredict=_repredict(cases))
    kept = pred[~pred["id"].isin(list(chosen.skip))]
    assert _predict([c for c in cases if c.id in set(kept["id"])])["total_s"].sum() <= room
    kinds = {(r.variant, r.dtype, r.causal, r.scenario) for r in kept.itertuples()}
    for variant in ("eager", "sdpa", "flex"):
        assert (variant, "fp32", False, "normal") in kinds and (variant, "fp32", True, "normal") in kinds
        assert (variant, "fp32", False, "padding") in kinds
    for variant in ("eager", "sdpa"):
        assert (variant, "bf16", False, "normal") in kinds and (variant, "bf16", True, "normal") in kinds
    flex_kept = kept[kept["variant"] == "flex"]
    assert len(flex_kept) == 3 and set(flex_kept[flex_kept["scenario"] == "normal"]["seq_len"]) == {64}
    assert chosen.uncovered == [] and all(chosen.tier[i] == 0 for i in flex_kept["id"])
    for cell in flex_kept["id"]:               # each with sdpa on the same inputs, so the verdict compares them
        assert chosen.tier[cell.replace("flex-", "sdpa-", 1)] == 0
    assert any("first cell per dtype and mask kind" in r for r in chosen.skip.values())


def test_a_negative_control_gets_the_cell_its_defect_shows_in_and_its_other_cells_come_last():
    real = _speed_grid("eager") + _speed_grid("sdpa")
    controls = [Case(c, "cpu", dtype, 32, 64, 1, 2, causal, s) for c in ("broken.no_max_subtraction", "broken.clamped")
                for s in ("normal", "scaled_x64", "padding", "fully_masked_bool") for dtype in ("fp16", "fp32")
                for causal in (False, True)]
    cases = real + controls
    pred = _predict(cases)
    self_checks = [c.id for c in controls if c.dtype == "fp32" and (c.variant, c.scenario) in
                   {("broken.no_max_subtraction", "scaled_x64"), ("broken.clamped", "padding")}]
    costs = pred.set_index("id")["total_s"]
    others = [c.id for c in controls if c.id not in self_checks]
    # every real cell, the four self-check cells, and half of the cheapest other control cell
    room = float(_predict(real)["total_s"].sum() + costs[self_checks].sum() + 0.5 * costs[others].min())
    chosen = choose(pred, budget_s=room, reserve_s=0.0, max_cell_s=None, repredict=_repredict(cases))
    kept = set(pred["id"]) - set(chosen.skip)
    assert {c.id for c in real} <= kept                        # the real variants' cells first
    no_max = {c.scenario for c in controls if c.id in kept and c.variant == "broken.no_max_subtraction"}
    clamped = {c.scenario for c in controls if c.id in kept and c.variant == "broken.clamped"}
    assert no_max == {"scaled_x64"} and clamped == {"padding"}     # the first scenario each declares
    for control in ("broken.no_max_subtraction", "broken.clamped"):     # fp32, causal and not
        assert {(c.dtype, c.causal) for c in controls if c.id in kept and c.variant == control} == \
            {("fp32", False), ("fp32", True)}
    extra = [c.id for c in controls if c.id in chosen.skip]
    assert extra and all("negative control's cells beyond its self-check" in chosen.skip[i] for i in extra)
    assert {chosen.tier[c.id] for c in controls if c.id in kept} <= {0, 2}


def test_the_controls_extra_cells_get_a_small_share_even_when_all_would_fit():
    """Room for every cell: the real ones all run, the controls' self-checks too, and their other
    cells only within CONTROL_EXTRA_SHARE of the time of the cells bought before them (eight
    controls took 9.7% of a cold quick run)."""
    from audit.plan.budget import CONTROL_EXTRA_SHARE
    from audit.plan.tiers import cell_cost
    real = _speed_grid("eager", dtypes=("fp32", "bf16"), seq_lens=(256, 512, 1024, 2048), batches=(1, 2))
    controls = [Case(c, "cpu", dtype, 32, 64, 1, 2, causal, s) for c in ("broken.unscaled", "broken.clamped")
                for s in ("normal", "scaled_x4", "padding", "outliers") for dtype in ("fp16", "fp32")
                for causal in (False, True)]
    cases = real + controls
    pred = _predict(cases)
    room = float(pred["total_s"].sum()) * 1.5                  # everything fits, with room to spare
    chosen = choose(pred, budget_s=room, reserve_s=0.0, max_cell_s=None, repredict=_repredict(cases))
    assert {c.id for c in real}.isdisjoint(chosen.skip)
    extra = [c.id for c in controls if chosen.tier.get(c.id, 2) == 2]
    kept_extra = [i for i in extra if i not in chosen.skip]
    costs = {r["id"]: cell_cost(r) for r in pred.to_dict("records")}
    others = sum(costs[i] for i in costs if i not in chosen.skip and i not in extra)
    assert kept_extra and sum(costs[i] for i in kept_extra) <= CONTROL_EXTRA_SHARE * others
    assert any(f"at most {CONTROL_EXTRA_SHARE:.0%}" in chosen.skip[i] for i in extra if i in chosen.skip)
    from audit.workload.variants import builtin_variants
    first = {c: builtin_variants()[c].reveals[0] for c in ("broken.unscaled", "broken.clamped")}
    self_check = [c for c in controls if c.scenario == first[c.variant] and c.dtype == "fp32"]
    assert all(chosen.tier.get(c.id) == 0 and c.id not in chosen.skip for c in self_check)


def test_too_small_a_budget_names_the_kinds_left_without_a_cell():
    cases = _speed_grid("eager") + _speed_grid("flex") + _speed_grid("compiled_unfused")
    pred = _predict(cases)
    room = float(_predict(_speed_grid("eager", seq_lens=(64,)))["total_s"].sum()) + 0.05
    chosen = choose(pred, budget_s=room, reserve_s=0.0, max_cell_s=None, repredict=_repredict(cases))
    assert chosen.uncovered and all(k.split()[0] in ("flex", "compiled_unfused") for k in chosen.uncovered)
    assert "flex cpu fp32 causal" in chosen.uncovered or "compiled_unfused cpu fp32 causal" in chosen.uncovered
    flex = pred[pred["variant"] == "flex"]["id"]
    assert set(flex) <= set(chosen.skip) and any("did not all fit" in chosen.skip[i] for i in flex)
    plan = Plan(budget_s=room, deadline_unix=None, predicted={}, skip=chosen.skip, uncovered=chosen.uncovered)
    line = budget_describe(plan, len(cases))
    assert "no cell for" in line and chosen.uncovered[0] in line
    full = choose(pred, budget_s=1e6, reserve_s=0.0, max_cell_s=None, repredict=_repredict(cases))
    assert full.uncovered == [] and full.skip == {} and "no cell for" not in budget_describe(
        Plan(budget_s=1e6, deadline_unix=None), len(cases))


def test_keeper_cuts_the_controls_extra_cells_then_other_cells_then_coverage_and_never_the_smallest_plan():
    clock = Clock()
    predicted = {"cover": 3.0, "real": 1.0, "extra": 2.0, "after": 1.0}
    plan = Plan(budget_s=100.0, deadline_unix=clock.now + 5.5, predicted=predicted,
                tier={"cover": 0, "real": 1, "extra": 2, "after": 1})
    keeper = Keeper(plan, list(predicted), clock=clock)
    assert keeper.reason("cover") is None                     # 7 s predicted, 5.5 s left: the control's extra goes
    assert keeper.skip.get("extra", "").startswith("over the budget at run time")
    assert "real" not in keeper.skip and "after" not in keeper.skip
    keeper.done("cover", 4.0)
    clock.now += 4.0                                          # 1.5 s left for real + after (2 s): one of them goes
    assert keeper.reason("real") is None and "after" in keeper.skip
    assert keeper.remaining_s() == pytest.approx(1.0)
    late = Keeper(Plan(budget_s=100.0, deadline_unix=clock.now + 0.5, predicted=predicted,
                       tier={"cover": 0, "real": 1, "extra": 2, "after": 1}), ["real", "cover"], clock=clock)
    assert late.reason("cover") is not None and late.reason("real") is not None   # coverage too, when nothing fits
    assert list(late.skip) == ["real", "cover"]                                     # ... but last
    smallest = Keeper(Plan(budget_s=100.0, deadline_unix=clock.now + 0.5, predicted=predicted, smallest=["cover"],
                           tier={"cover": 0, "real": 1, "extra": 2, "after": 1}), ["real", "cover"], clock=clock)
    assert smallest.reason("real") is not None                 # the smallest useful plan's cells: never
    assert smallest.reason("cover") is None and list(smallest.skip) == ["real"]


def test_tier_0_runs_and_is_cut_by_priority_level():
    """Tier 0 runs level by level (sdpa and eager, the controls' self-checks, every other real variant per dtype,
    the rest), each in grid order, the other tiers after it in grid order; behind its deadline the keeper cuts
    the lowest level first, the dearest first within it: a cold quick run on a 2-core EPYC ran its compiles first
    in grid order, they took twice their predictions, and 24 of its 34 controls' self-checks were cut."""
    from audit.plan.tiers import ESSENTIAL, PER_DTYPE, REST, SELF_CHECKS, run_order
    tier = {"compile": 0, "control": 0, "sdpa": 0, "mask": 0, "other": 1}
    level = {"compile": PER_DTYPE, "control": SELF_CHECKS, "sdpa": ESSENTIAL, "mask": REST}
    grid = ["other", "compile", "mask", "control", "sdpa"]
    assert run_order(grid, tier, level) == ["sdpa", "control", "compile", "mask", "other"]
    assert run_order(grid, tier) == ["compile", "mask", "control", "sdpa", "other"]       # no levels: grid order
    clock = Clock()
    predicted = {"sdpa": 1.0, "control": 0.2, "compile": 4.0, "mask": 0.5, "other": 1.0}
    plan = Plan(budget_s=100.0, deadline_unix=clock.now + 1.5, predicted=predicted, tier=tier, level=level,
                smallest=["sdpa"])
    keeper = Keeper(plan, run_order(grid, tier, level), clock=clock)
    assert keeper.reason("sdpa") is None
    assert keeper.cut == ["other", "mask", "compile"]           # the control's self-check (0.2 s) still fits
    assert keeper.reason("control") is None


def test_a_cell_cut_at_run_time_hands_its_shared_costs_to_the_next_cell_needing_them():
    """The first compiled cell carries the compiler's start (Plan.groups); cut, the next compiled cell pays
    it: its prediction says so, and so does what is left (an emulated slow CPU measured the next compiled
    cell at 14 s against 3.3 s predicted without it)."""
    clock = Clock()
    predicted = {"first": 13.0, "eager": 1.0, "second": 3.0, "third": 3.0}      # first: 3 own + 10 start
    work = {"first": [3.0, [0, 1]], "eager": [1.0, []], "second": [3.0, [0, 2]], "third": [3.0, [0, 3]]}
    groups = [["compiler start", 10.0], ["compile first", 0.0], ["compile second", 0.0], ["compile third", 0.0]]
    plan = Plan(budget_s=100.0, deadline_unix=clock.now + 18.0, predicted=predicted, work=work, groups=groups,
                tier={"first": 1, "eager": 1, "second": 1, "third": 1})
    keeper = Keeper(plan, list(predicted), clock=clock)
    assert keeper.reason("first") is not None                  # 20 s predicted, 18 s left: the dearest goes
    assert keeper.predicted["second"] == pytest.approx(13.0) and keeper.predicted["third"] == pytest.approx(3.0)
    assert keeper.remaining_s() == pytest.approx(17.0)         # eager 1 + second 13 + third 3
    keeper.done("eager", 1.0)
    keeper.done("second", 13.0)                                # as predicted now: the run is on time
    assert keeper.ratios == [1.0, 1.0]
    bought = Keeper(plan, list(predicted), clock=clock)        # a start already paid is not handed on
    bought.bought.add(0)
    bought._cut("first", 1.0, 18.0)
    assert bought.predicted["second"] == pytest.approx(3.0)


def test_the_progress_bar_moves_by_predicted_seconds_and_its_time_left_is_the_plans():
    import io

    from audit.execute.progress import Progress
    clock = Clock()
    predicted = {"compile": 30.0, "a": 1.0, "b": 1.0, "cut": 5.0}
    plan = Plan(budget_s=None, deadline_unix=None, predicted=predicted, skip={"cut": "over the budget: ..."},
                started_unix=clock.now - 10.0, report_s=6.0)
    keeper = Keeper(plan, list(predicted), clock=clock)
    bar = Progress(list(predicted), 0, keeper, plan, clock=clock, file=io.StringIO())
    assert bar.bar.total == pytest.approx(32.0)                 # the planned skip weighs nothing
    bar.start_cell("compile")
    assert "0:10 elapsed" in bar.text(None) and "about 0:38 left" in bar.text(None)   # 32 s of cells + 6 s report
    clock.now += 45.0
    keeper.done("compile", 45.0)
    bar.end_cell("compile")
    assert bar.bar.n == pytest.approx(30.0)                     # by its prediction, not by one cell of four
    assert "1/4 cells" in bar.text(None) and "0:15 behind the plan" in bar.text(None)
    assert "about 0:08 left" in bar.text(None)                  # 2 s of cells + 6 s report (one cell: no factor yet)
    bar.close()


def test_a_cell_that_would_take_most_of_the_time_left_is_skipped_even_when_it_fits_as_predicted():
    """A single cell misses its prediction by more than the median of cells does (the cpu preset
    with a 90 s budget ran 4 s past it on its last compile): it runs only if 1.5x fits."""
    clock = Clock()
    predicted = {"small": 1.0, "compile": 4.0}
    keeper = Keeper(Plan(budget_s=100.0, deadline_unix=clock.now + 6.0, predicted=predicted), list(predicted),
                    clock=clock)
    assert keeper.reason("small") is None             # 5 s predicted, 6 s left
    keeper.done("small", 1.0)
    clock.now += 1.0
    assert keeper.reason("compile") is not None and "5 s left" in keeper.skip["compile"]   # 4 x 1.5 > 5
    roomy = Keeper(Plan(budget_s=100.0, deadline_unix=clock.now + 6.5, predicted={"compile": 4.0}), ["compile"],
                   clock=clock)
    assert roomy.reason("compile") is None             # 4 x 1.5 <= 6.5


# --------------------------------------------------------------------------- outside the cells

def test_the_host_factor_is_the_probe_against_the_reference_host_within_its_range():
    from audit.plan.overhead import HOST_FACTOR_RANGE, REFERENCE_HOST_PROBE_S, host_factor
    assert host_factor(None) == 1.0 and host_factor({"cpu": {"matmul_flops_per_s": {}}}) == 1.0   # no probe
    assert host_factor({"cpu": {"host_probe_s": 3 * REFERENCE_HOST_PROBE_S}}) == pytest.approx(3.0)
    both = {"cpu": {"host_probe_s": 2 * REFERENCE_HOST_PROBE_S}, "cuda": {"host_probe_s": 4 * REFERENCE_HOST_PROBE_S}}
    assert host_factor(both) == pytest.approx(3.0)                                 # the median of the devices'
    assert host_factor({"cpu": {"host_probe_s": 1e3}}) == HOST_FACTOR_RANGE[1]      # a disturbed probe, kept in range
    assert host_factor({"cpu": {"host_probe_s": 1e-9}}) == HOST_FACTOR_RANGE[0]


def test_the_host_factor_is_the_median_with_this_machines_earlier_runs():
    """One probe is 0.3 s of one moment (on a shared 2-core EPYC, minutes apart: 1.4x, 2.0x, 2.8x): with earlier
    runs of this machine, the plan takes the median of theirs and this one's, so one disturbed reading moves
    it little; a machine really slower now moves it as far as the median goes."""
    from audit.plan.overhead import REFERENCE_HOST_PROBE_S, host_factor
    ran = [{"cpu": {"host_probe_s": f * REFERENCE_HOST_PROBE_S}} for f in (2.0, 2.1, 1.9)]
    disturbed = {"cpu": {"host_probe_s": 2.8 * REFERENCE_HOST_PROBE_S}}
    assert host_factor(disturbed) == pytest.approx(2.8)
    assert host_factor(disturbed, ran) == pytest.approx(2.05)                       # median of 2.8, 2.0, 2.1, 1.9
    assert host_factor(disturbed, ran + [None, {"cpu": {"matmul_flops_per_s": {}}}]) == pytest.approx(2.05)
    assert host_factor(None, ran) == pytest.approx(2.0)


def test_a_forecast_plans_with_the_median_host_factor_of_this_machines_runs(tmp_path, monkeypatch):
    from audit.core.runfolder import RECORDS_FILE, RUN_FILE
    from audit.plan import forecast
    from audit.plan.overhead import REFERENCE_HOST_PROBE_S
    from audit.workload import presets
    monkeypatch.setattr(forecast, "this_machine", lambda device: "Test CPU")
    for i, factor in enumerate((2.0, 2.2)):
        folder = tmp_path / f"run{i}"
        folder.mkdir()
        (folder / RUN_FILE).write_text(json.dumps({"env": {"cpu_model": "Test CPU"},
                                                   "ceilings": {"cpu": {"host_probe_s": factor * REFERENCE_HOST_PROBE_S}}}))
        (folder / RECORDS_FILE).write_text("")
    other = tmp_path / "elsewhere"                  # another machine's run: not this one's speed
    other.mkdir()
    (other / RUN_FILE).write_text(json.dumps({"env": {"cpu_model": "Other CPU"},
                                              "ceilings": {"cpu": {"host_probe_s": 9 * REFERENCE_HOST_PROBE_S}}}))
    (other / RECORDS_FILE).write_text("")
    quick = presets.presets()["quick"]
    cases = presets.preset_cases(quick)[:5]
    planned = forecast.plan(cases, quick, measure=False, root=tmp_path)
    assert planned.host == pytest.approx(2.1)
    assert any("the median with 2 earlier runs'" in note for note in planned.notes)


def test_the_time_outside_the_cells_scales_with_the_host_but_the_ceilings_and_canary_take_their_time():
    from audit.plan.overhead import DEFAULTS, overhead_s
    pred = _pred([("a", 1, "ok", 1.0, 0.0), ("b", 2, "ok", 1.0, 0.0), ("c", 3, "skipped", 0.0, 0.0)])
    ref_before, ref_after = overhead_s(pred, ceilings_measured=True, ceilings_s=2.0)
    slow_before, slow_after = overhead_s(pred, ceilings_measured=True, ceilings_s=2.0, host=3.0)
    from audit.measure.machine.canary import CANARY_WALL_S, readings_for
    ceilings = DEFAULTS["ceilings_factor"] * 2.0 + CANARY_WALL_S * readings_for(3)   # time-boxed: ceilings, canary
    assert ref_after == pytest.approx(DEFAULTS["report_s"] + 2 * DEFAULTS["report_per_cell_s"])   # 2 measured
    assert slow_after == pytest.approx(3.0 * ref_after)
    assert slow_before - ceilings == pytest.approx(3.0 * (ref_before - ceilings))


def test_a_run_planning_itself_counts_its_start_up_and_ceilings_as_measured():
    """A cold first start (torch's libraries read from disk, the ceilings measured) takes what it takes:
    the seconds it has spent replace start_s and the ceilings in the reserve where they are well over
    them, the rest is predicted; a start quicker, or a little slower, keeps the prediction (the
    dry-run's plan)."""
    from audit.measure.machine.canary import CANARY_WALL_S, readings_for
    from audit.plan.overhead import DEFAULTS, overhead_s
    pred = _pred([("a", 1, "ok", 1.0, 0.0), ("b", 2, "ok", 1.0, 0.0), ("c", 3, "skipped", 0.0, 0.0)])
    predicted, _ = overhead_s(pred, ceilings_measured=True, ceilings_s=2.0)
    rest = (DEFAULTS["plan_per_cell_s"] * 3 + DEFAULTS["between_cell_s"] * 3)
    assert predicted == pytest.approx(DEFAULTS["start_s"] + DEFAULTS["ceilings_factor"] * 2.0
                                      + CANARY_WALL_S * readings_for(3) + rest)
    cold, _ = overhead_s(pred, ceilings_measured=True, ceilings_s=2.0, spent_s=14.0)
    assert cold == pytest.approx(14.0 + CANARY_WALL_S * (readings_for(3) - 1) + rest)   # the start reading is taken
    warm, _ = overhead_s(pred, ceilings_measured=True, ceilings_s=2.0, spent_s=0.5)
    busy, _ = overhead_s(pred, ceilings_measured=True, ceilings_s=2.0, spent_s=predicted - rest + 1.0)
    assert warm == pytest.approx(predicted) and busy == pytest.approx(predicted)   # a start a little slow: the plan


def test_fitted_overheads_are_kept_in_the_reference_hosts_seconds():
    """A run made on a host twice as slow (its probe says so) took twice the reference seconds;
    fitted, its constants are the reference host's, and planned again there, its own."""
    from types import SimpleNamespace

    from audit.plan.overhead import REFERENCE_HOST_PROBE_S, constant, fit_overheads
    frame = pd.DataFrame({"device": ["cpu"] * 4, "status": ["ok", "ok", "ok", "skipped"]})
    split = {"parts_s": {"start-up": 2.0, "worker start-up": 2.0, "plan": 0.1, "between cells": 0.04,
                         "report": 9.0, "seed claims": 0.0, "ceilings": 2.2}}

    def run(probe_factor):
        return SimpleNamespace(time_split=split, frame=frame, ceilings_s=2.0,
                               ceilings={"cpu": {"host_probe_s": probe_factor * REFERENCE_HOST_PROBE_S}})
    slow, fast = fit_overheads([run(2.0)]), fit_overheads([run(1.0)])
    for name in ("start_s", "between_cell_s", "report_s"):
        assert slow[f"cpu|{name}"] < fast[f"cpu|{name}"] and slow[f"cpu|{name}"] > 0, name
    assert slow["cpu|between_cell_s"] == pytest.approx(0.04 / 4 / 2.0)
    assert slow["cpu|ceilings_factor"] == fast["cpu|ceilings_factor"] == pytest.approx(1.1)  # time-boxed
    fitted = SimpleNamespace(overhead=slow)
    assert constant(fitted, "cpu", "between_cell_s", host=2.0) == pytest.approx(0.04 / 4)   # its own again


def _priority_pred():
    """Five real variants and a control in two dtypes, each variant's cells cheaper than sdpa's and
    eager's but sdpa_flash's (a compile's worth): a greedy cheapest-first tier 0 would buy them and the
    control first."""
    rows = []
    costs = {"sdpa": 3.0, "eager": 3.0, "flash_op": 1.0, "sdpa_math": 1.0, "sdpa_flash": 5.0, "broken.unscaled": 0.5}
    for variant, cost in costs.items():
        for dtype in ("fp32", "bf16"):
            for causal in (False, True):
                rows.append({"id": f"{variant}-{dtype}-{causal}", "variant": variant, "device": "cpu", "dtype": dtype,
                             "d_k": 8, "seq_len": 64, "batch": 1, "heads": 2, "kv_heads": 2, "causal": causal,
                             "scenario": "normal", "status": "ok", "total_s": cost, "shared_s": 0.0})
    return pd.DataFrame(rows)


def test_a_budget_too_small_for_coverage_buys_sdpa_and_eager_in_every_dtype_first():
    pred = _priority_pred()
    chosen = choose(pred, budget_s=12.2, reserve_s=0.0, max_cell_s=100.0)
    kept = set(pred["id"]) - set(chosen.skip)
    assert {(i.split("-")[0], i.split("-")[1]) for i in kept} == {(v, d) for v in ("sdpa", "eager")
                                                                  for d in ("fp32", "bf16")}
    assert chosen.smallest_s == pytest.approx(12.0) and set(chosen.smallest) == kept
    # more room: the control's self-checks next (causal and not; the causal one with sdpa on its inputs, the
    # verdict's yardstick), before any other real variant
    checked = choose(pred, budget_s=16.2, reserve_s=0.0, max_cell_s=100.0)
    assert set(pred["id"]) - set(checked.skip) - kept == {"broken.unscaled-fp32-False", "broken.unscaled-fp32-True",
                                                          "sdpa-fp32-True"}
    # then every real variant per dtype, the cheapest first
    wider = choose(pred, budget_s=20.2, reserve_s=0.0, max_cell_s=100.0)
    kept = set(pred["id"]) - set(wider.skip)
    assert {i.split("-")[0] for i in kept} == {"sdpa", "eager", "broken.unscaled", "flash_op", "sdpa_math"}
    assert chosen.coverage_s == wider.coverage_s > 20.2
    # what the prefix leaves is filled with the later cells that fit: sdpa_flash's 5 s cell does not fit
    # after the 20 s prefix, a cheaper want of the last level (a variant's causal cell) does
    filled = choose(pred, budget_s=21.2, reserve_s=0.0, max_cell_s=100.0)
    extra = set(pred["id"]) - set(filled.skip) - kept
    assert len(extra) == 1 and not extra.pop().startswith("sdpa_flash")


def test_nothing_fitting_says_what_budget_would_and_the_smallest_plan_is_printed():
    from audit.plan.plan_text import budget_arg, smallest_plan_line
    plan = Plan(budget_s=5.0, deadline_unix=None, reserve_s=8.0, skip={"a": "over the budget"}, measured=0,
                smallest_s=9.2, coverage_s=130.0)
    line = budget_describe(plan, 1)
    assert line.startswith("plan: nothing fits the 5.0 s budget") and "--budget 10s measures that" in line
    assert "--budget 3m" in line
    assert "smallest useful plan (sdpa and eager, a cell per dtype): 9.2 s (--budget 10s)" in smallest_plan_line(plan)
    assert budget_arg(119.2) == "120s" and budget_arg(121) == "3m" and budget_arg(None) == "none"


def test_a_cell_predicted_too_slow_is_not_started_and_cells_alone_in_a_set_are_not_tried():
    """A cell the cost model predicts the runner will find too slow (its warm-up over --max-cell-s)
    would still draw its inputs, build its golden and run its warm-up: a budget does not start it.
    A cell predicted not to run alone in its input set (a backend the CPU lacks, in a set whose other
    cells are too slow) is not tried either: trying it builds the set's golden first (4 s at T 2048 on
    2 cores; a cold --budget 30s cpu run spent 48 s of its 30 on such cells, the plan counting their
    goldens against the smallest useful plan, so that nothing fit), to learn what the plan knows."""
    from audit.plan.costmodel import TOO_SLOW
    pred = _pred([("fast", 1, "ok", 2.0, 0.0), ("slow", 2, "skipped", 9.0, 4.0), ("refused", 2, "skipped", 3.0, 3.0),
                  ("beside", 1, "skipped", 0.001, 0.0)])
    pred.loc[pred["id"] == "slow", "reason"] = TOO_SLOW
    pred.loc[pred["id"].isin(["refused", "beside"]), "reason"] = "no such backend on the CPU"
    chosen = choose(pred, budget_s=3.0, reserve_s=0.0, max_cell_s=6.0)
    assert "slow" in chosen.skip and "not started" in chosen.skip["slow"]
    assert chosen.skip["refused"].startswith("not tried") and "no such backend on the CPU" in chosen.skip["refused"]
    assert "fast" not in chosen.skip and "beside" not in chosen.skip       # 2 fits in 3; beside: in fast's set
    tight = choose(pred, budget_s=1.0, reserve_s=0.0, max_cell_s=6.0)
    assert "fast" in tight.skip and tight.skip["beside"].startswith("not tried: predicted not to run here (no such")
    assert "cut for the budget" in tight.skip["beside"] and "no cell of its input set" in tight.skip["refused"]
    assert "slow" not in choose(pred, budget_s=None, reserve_s=0.0, max_cell_s=6.0).skip


# --------------------------------------------------------------------------- time given back

def _reclaiming_plan(clock, **fields):
    """Two planned cells (cover, tier 0; real, tier 1) and three cut for the budget: a tier-0 cell, a
    cheap and a dear tier-1 cell; the cheap one shares its golden (group 0) with `real`."""
    base = dict(budget_s=100.0, deadline_unix=clock.now + 10.0,
                predicted={"cover": 2.0, "real": 2.0, "cover_cut": 1.0, "cheap": 3.0, "dear": 6.0},
                tier={"cover": 0, "real": 1},
                skip={i: "over the budget: ..." for i in ("cover_cut", "cheap", "dear")},
                standby=["cover_cut", "cheap", "dear"], standby_tier={"cover_cut": 0, "cheap": 1, "dear": 1},
                work={"cover": [2.0, []], "real": [1.0, [0]], "cover_cut": [1.0, []], "cheap": [1.0, [0]],
                      "dear": [6.0, []]},
                groups=[["('inputs', 'set')", 2.0]])
    return Plan(**{**base, **fields})


def test_time_the_cells_leave_goes_to_the_cells_cut_for_it_tier_0_first_then_the_cheapest():
    clock = Clock()
    keeper = Keeper(_reclaiming_plan(clock), ["cover", "real", "cover_cut", "cheap", "dear"], clock=clock)
    for cell in ("cover", "real"):                        # each takes half its prediction: 8 s of 10 left
        assert keeper.reason(cell) is None
        clock.now += 1.0
        keeper.done(cell, 1.0)
    order = keeper.reclaim_order(["dear", "cheap", "cover_cut"])
    assert order == ["cover_cut", "cheap", "dear"]        # tier 0, then tier 1 cheapest first
    assert keeper.added_s("cheap") == pytest.approx(1.0)  # its golden was paid by `real`
    assert keeper.admit("cover_cut") and "cover_cut" not in keeper.skip
    clock.now += 1.0
    keeper.done("cover_cut", 1.0)
    assert keeper.admit("cheap")                          # 1.5 x 1 s fits the 7 s left
    clock.now += 1.0
    keeper.done("cheap", 1.0)
    assert not keeper.admit("dear") and keeper.skip["dear"].startswith("over the budget")   # 1.5 x 6 > 6 s left
    assert keeper.admitted == ["cover_cut", "cheap"]
    assert keeper.time_left_s() == pytest.approx(6.0)     # dear's 6 s could still be bought: up to the deadline
    clock.now += 5.0
    assert keeper.time_left_s() == pytest.approx(1.0)
    assert keeper.reclaimed_line().startswith("2 cells skipped for time measured after all")


def test_nothing_is_reclaimed_when_the_cells_took_their_time():
    clock = Clock()
    keeper = Keeper(_reclaiming_plan(clock, deadline_unix=clock.now + 5.0), ["cover", "real", "cheap"], clock=clock)
    for cell in ("cover", "real"):
        assert keeper.reason(cell) is None
        clock.now += 2.0
        keeper.done(cell, 2.0)
    assert not keeper.admit("cover_cut") and not keeper.admit("cheap")    # 1 s left: 1.5 x 1 s does not fit
    assert keeper.reclaimed_line() is None
    assert keeper.time_left_s() == pytest.approx(1.0)      # the time to the deadline, no more
    assert Keeper(_reclaiming_plan(clock, standby=[]), ["cover"], clock=clock).time_left_s() == pytest.approx(2.0)


def test_run_grid_measures_a_cell_cut_for_time_when_the_planned_ones_leave_time(tmp_path):
    """The plan cut sdpa for the budget; eager, measured first, leaves the time: sdpa is measured after
    all, its record last, and a cell the plan cut for another reason (too slow) stays skipped."""
    import time
    preset = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0,
                            max_cell_s=60.0, energy_window_s=0.0, noise_target=0.0)
    cases = [Case(v, "cpu", "fp32", 8, 16, 1, 2, False, "normal") for v in ("sdpa", "eager", "sdpa_math")]
    plan = Plan(budget_s=600.0, deadline_unix=time.time() + 300.0, tier={cases[1].id: 0},
                predicted={c.id: 0.5 for c in cases},
                skip={cases[0].id: "over the budget: ...", cases[2].id: "predicted too slow for this device: ..."},
                standby=[cases[0].id], standby_tier={cases[0].id: 1},
                work={cases[0].id: [0.5, []], cases[1].id: [0.5, []]})
    plan.write(tmp_path)
    runner.run_grid(cases, tmp_path, preset, {}, progress=False, plan=Plan.read(tmp_path))
    recs = read_records(tmp_path)
    assert [r["variant"] for r in recs] == ["eager", "sdpa", "sdpa_math"]
    assert [r["status"] for r in recs] == ["ok", "ok", "skipped"]
    assert recs[2]["reason"].startswith("predicted too slow")


def test_what_a_tier_0_cell_too_dear_for_the_budget_leaves_goes_to_the_other_tiers():
    """A cold compile that cannot fit (flex here) must not leave the budget idle: the real variants'
    other cells buy what tier 0 leaves (a cold quick run on an AVX2-only EPYC planned 33 s of its 60,
    then took 54 reclaiming the rest, so its dry-run was 40% off)."""
    rows = []
    for variant, cost in (("sdpa", 1.0), ("eager", 1.0), ("flex", 100.0)):
        for seq_len in (64, 128, 256):
            for causal in (False, True):
                rows.append({"id": f"{variant}-{seq_len}-{causal}", "variant": variant, "device": "cpu",
                             "dtype": "fp32", "d_k": 8, "seq_len": seq_len, "batch": 1, "heads": 2, "kv_heads": 2,
                             "causal": causal, "scenario": "normal", "status": "ok",
                             "total_s": cost * seq_len / 64, "shared_s": 0.0})
    pred = pd.DataFrame(rows)
    chosen = choose(pred, budget_s=12.5, reserve_s=0.0, max_cell_s=None)      # tier 0 (4 s) and T 128's 8 s
    kept = set(pred["id"]) - set(chosen.skip)
    assert not any(i.startswith("flex") for i in kept) and chosen.uncovered     # flex: no cell, and said so
    assert {"sdpa-64-False", "sdpa-64-True", "eager-64-False", "eager-64-True"} <= kept
    later = kept - {i for i, t in chosen.tier.items() if t == 0}
    assert later and all(i.split("-")[0] in ("sdpa", "eager") for i in later)   # the rest went to other cells
    assert float(pred[pred["id"].isin(list(kept))]["total_s"].sum()) <= 12.5
    assert sorted(chosen.standby)[:1] and chosen.standby[0].startswith("flex")    # reclaimed time: flex first
