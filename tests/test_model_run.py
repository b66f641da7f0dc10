"""The model audit inside a run: planned to the budget (left out, with its reason, where a cell of every
variant per dtype and mask kind does not fit with it), resumed after an interruption or a crash without
repeating a step, its time fitted from the records, and checked on CUDA by gpu-check."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lines(run_dir: Path) -> list[dict]:
    from audit.core.runfolder import MODEL_FILE
    return [json.loads(line) for line in (run_dir / MODEL_FILE).read_text().splitlines()]


def test_an_interrupted_then_crashed_model_audit_resumes_after_its_last_record(tmp_path):
    """Ctrl-C at the third step keeps the two records made; a crash recorded for the step in flight is not
    made again; the next worker makes every other step once (the float64 run again, its record not)."""
    pytest.importorskip("transformers")
    from audit.analysis.model_rules import check_model
    from audit.measure.model_audit import record_crash, step_id, write_run_audit

    seen: list[str] = []

    def interrupt_at_third(step: str) -> None:
        seen.append(step)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_run_audit(tmp_path, ("llama-tiny",), ["sdpa"], before=interrupt_at_third)
    first = _lines(tmp_path)
    assert [r["kind"] for r in first] == ["reference", "variant"] and first[1]["variant"] == "sdpa"
    assert seen[2] == step_id("llama-tiny", "sdpa", "bf16")
    record_crash(tmp_path, seen[2], "the measuring process died with signal SIGSEGV in this model audit step")

    again: list[str] = []
    written = write_run_audit(tmp_path, ("llama-tiny",), ["sdpa"], before=again.append)
    assert again[0] == step_id("llama-tiny") and seen[1] not in again and seen[2] not in again
    records = _lines(tmp_path)
    keys = [(r["kind"], r.get("variant"), r.get("dtype")) for r in records]
    assert len(keys) == len(set(keys)) == 3 + written and sum(k[0] == "reference" for k in keys) == 1
    crashed = next(r for r in records if r.get("variant") == "sdpa" and r["dtype"] == "bf16")
    assert crashed["status"] == "error" and "SIGSEGV" in crashed["reason"]
    assert ("model_failed", "sdpa") in {(f["check"], f["variant"]) for f in check_model(records)}
    assert write_run_audit(tmp_path, ("llama-tiny",), ["sdpa"], before=again.append) == 0


def test_a_model_audit_the_plan_leaves_out_writes_why_and_the_section_says_it(tmp_path):
    from audit.measure.model_audit import write_run_audit
    from audit.render.model_section import model_section
    from audit.render.page import render_markdown
    reason = "over the budget: the 1.0 s budget (--budget) does not hold the model audit"
    assert write_run_audit(tmp_path, ("llama-small",), ["sdpa"], left_out=reason) == 1
    assert write_run_audit(tmp_path, ("llama-small",), ["sdpa"], left_out=reason) == 0
    records = _lines(tmp_path)
    assert [r["kind"] for r in records] == ["left_out"] and records[0]["reason"] == reason
    text = render_markdown(model_section(records, [], None))
    assert "No model audit of llama-small" in text and "1.0 s budget" in text


def test_a_model_audit_step_is_timed_and_recorded_by_the_supervisor(tmp_path):
    """A step in flight has its own time limit, and a crash or timeout in it is the step's record."""
    from audit.core.runfolder import INFLIGHT_FILE
    from audit.execute import runner, supervisor
    step = "model:llama-tiny:sdpa:bf16"
    assert supervisor.is_model_step(step) and not supervisor.is_model_step("sdpa-cpu-fp32-d32-T64-B1-H2-full-normal")
    assert supervisor.cell_limits(tmp_path, None)(step) == supervisor.MODEL_STEP_TIMEOUT_S
    assert supervisor.cell_limits(tmp_path, 7.0)(step) == 7.0
    runner.mark_inflight(tmp_path, step)
    assert runner.read_inflight(tmp_path) == step
    supervisor._record_crash(tmp_path, {}, step, "over the per-cell time limit of 300 s", status="timeout")
    assert not (tmp_path / INFLIGHT_FILE).exists()
    assert _lines(tmp_path) == [{"schema": 1, "model": "llama-tiny", "status": "timeout", "kind": "variant",
                                 "variant": "sdpa", "dtype": "bf16",
                                 "reason": "over the per-cell time limit of 300 s"}]
    supervisor._record_crash(tmp_path, {}, "model:gpt-oss-tiny", "died with signal SIGSEGV")
    assert _lines(tmp_path)[-1]["kind"] == "reference" and _lines(tmp_path)[-1]["status"] == "error"


def test_the_plan_keeps_the_model_audit_after_a_cell_per_variant_and_dtype_and_leaves_it_out_below():
    from audit.plan.budget import plan_run
    from audit.workload import presets, variants
    quick = presets.presets()["quick"]
    cases = presets.preset_cases(quick, known_variant=variants.check_name)
    plan, _, _ = plan_run(cases, quick, None, budget_s=quick.budget_s, started_unix=time.time(), measure=False)
    assert plan.model_audit_skip is None and plan.model_audit_s > 0 and plan.report_s > plan.model_audit_s
    small = dataclasses.replace(quick, budget_s=5.0)
    tight, _, _ = plan_run(cases, small, None, budget_s=5.0, started_unix=time.time(), measure=False)
    assert tight.model_audit_s == 0 and "does not hold the model audit" in tight.model_audit_skip
    assert tight.uncovered
    unbounded, _, _ = plan_run(cases, quick, None, budget_s=None, started_unix=time.time(), measure=False)
    assert unbounded.model_audit_skip is None and unbounded.model_audit_s > 0


@pytest.mark.parametrize("kept_with, kept_without, smallest, left_out",
                         [(5, 7, True, True), (5, 5, True, False), (7, 7, True, False), (0, 0, False, True)])
def test_the_model_audit_is_left_out_only_where_its_time_buys_a_variant_its_cell_per_dtype(
        monkeypatch, kept_with, kept_without, smallest, left_out):
    """Where the cells giving every real variant a cell per dtype miss as many without the model audit as
    with it (a cold compile that fits neither way: a cold quick run on a 2-core EPYC), leaving it out buys
    none of them, and it stays; where its time buys more of them, or where not even the smallest useful plan
    fits with it, it is left out with its reason."""
    from audit.plan import budget
    from audit.workload import hf, presets, variants
    monkeypatch.setattr(hf, "transformers_version", lambda: "5.0.0")
    quick = presets.presets()["quick"]
    cases = presets.preset_cases(quick, known_variant=variants.check_name)[:40]
    made = []

    def fake_plan(*args, model_s, **kwargs):
        made.append(model_s)
        plan = budget.Plan(budget_s=60.0, deadline_unix=None, model_audit_s=model_s)
        return plan, budget._Held(kept_with if model_s else kept_without, 7, smallest or not model_s)

    monkeypatch.setattr(budget, "_plan", fake_plan)
    plan, _, _ = budget.plan_run(cases, quick, None, budget_s=60.0, started_unix=time.time(), measure=False)
    assert made[0] > 0 and len(made) == (1 if kept_with == 7 else 2)
    assert (plan.model_audit_s == 0) == left_out
    assert (plan.model_audit_skip is not None) == left_out
    if left_out:
        assert "does not hold the model audit" in plan.model_audit_skip


def test_without_transformers_the_plan_reserves_no_model_audit_and_says_why(monkeypatch):
    """A fresh install (`audit deps`) has no transformers (an optional extra): its model audit cannot run,
    so the plan keeps no time for it. A cold cpu-preset run under ATEN_CPU_CAPABILITY=avx2 and
    ONEDNN_MAX_CPU_ISA=AVX2 kept 45 s for it, wrote "unavailable" in 2 ms, and ended at 547 s of 600."""
    from audit.plan.budget import plan_run
    from audit.plan.plan_text import model_audit_line
    from audit.workload import hf, presets, variants
    quick = presets.presets()["quick"]
    cases = presets.preset_cases(quick, known_variant=variants.check_name)
    monkeypatch.setattr(hf, "transformers_version", lambda: None)
    plan, _, _ = plan_run(cases, quick, None, budget_s=quick.budget_s, started_unix=time.time(), measure=False)
    assert plan.model_audit_s == 0 and plan.model_audit_skip is None
    assert model_audit_line(plan, tuple(quick.models)) == (
        "model audit (llama-tiny, gpt-oss-tiny): unavailable: transformers is not installed (pip install -e '.[hf]')")
    monkeypatch.setattr(hf, "transformers_version", lambda: "5.0.0")
    installed, _, _ = plan_run(cases, quick, None, budget_s=quick.budget_s, started_unix=time.time(), measure=False)
    assert installed.model_audit_s > 0 and installed.report_s > plan.report_s


def test_the_model_audit_time_is_fitted_from_a_runs_records():
    """What a run's model audit took (its time split, its records' seconds) predicts the next one: the
    same models and variants are predicted at what they took."""
    from audit.plan.overhead import fit_overheads, model_audit_seconds
    from audit.core.dtypes import model_dtypes
    from audit.workload.model import model_variants, predicted_runs, MODEL_SPECS
    runs = ["sdpa", "eager"]
    n = predicted_runs(MODEL_SPECS["llama-tiny"], model_variants(runs)) * len(model_dtypes())
    records = [{"kind": "reference", "model": "llama-tiny", "status": "ok", "seconds": 0.9}]
    records += [{"kind": "variant", "model": "llama-tiny", "status": "ok", "seconds": 0.02 + 0.01 * (i % 2)}
                for i in range(n)]
    spent = 0.9 + sum(r["seconds"] for r in records[1:])
    run = SimpleNamespace(time_split={"parts_s": {"model audit": spent + 1.5}}, ceilings={},
                          frame=pd.DataFrame({"device": ["cpu"], "status": ["ok"], "reason": [None]}),
                          model_records=records, ceilings_s=None)
    fitted = fit_overheads([run])
    assert fitted["cpu|model:llama-tiny|build_s"] == pytest.approx(0.9)
    assert fitted["cpu|model_import_s"] == pytest.approx(1.5)
    predicted = model_audit_seconds(("llama-tiny",), runs, "cpu", SimpleNamespace(overhead=fitted))
    assert predicted == pytest.approx(1.5 + 0.9 + n * fitted["cpu|model:llama-tiny|run_s"])
    assert abs(predicted - (spent + 1.5)) < 0.01 * n
    assert model_audit_seconds((), runs, "cpu") == 0.0


def test_a_slower_matmul_adds_what_the_models_flops_lose_and_the_fit_takes_it_out():
    """bf16 on a CPU whose matmul is 1000x slower (an AVX2-only machine's oneDNN): each bf16 run takes its
    prior plus the model's FLOPs at the rate lost (a cpu-preset run's model audit took 34 s where 7 were
    planned); fp32 at the reference's rate adds nothing. A run made there, fitted, gives back the prior."""
    from audit.plan.overhead import fit_overheads, model_audit_seconds
    from audit.workload.model import MODEL_SPECS, model_variants, predicted_runs
    spec = MODEL_SPECS["llama-tiny"]
    reference = {"fp32": 2e11, "bf16": 4e11}
    params = SimpleNamespace(overhead={}, reference={"cpu": {"ceilings": {"matmul_flops_per_s": reference}}})
    slow = {"matmul_flops_per_s": {"fp32": 2e11, "bf16": 4e8}}
    runs = ["sdpa", "eager"]
    per_dtype = predicted_runs(spec, model_variants(runs))
    same = model_audit_seconds(("llama-tiny",), runs, "cpu", params, ceilings={"matmul_flops_per_s": reference})
    slower = model_audit_seconds(("llama-tiny",), runs, "cpu", params, ceilings=slow)
    lost = spec.forward_flops() * (1 / 4e8 - 1 / 4e11)
    assert slower - same == pytest.approx(per_dtype * lost)
    assert model_audit_seconds(("llama-tiny",), runs, "cpu", params, ceilings=None) == pytest.approx(same)
    build_s, run_s = spec.prior("cpu")
    records = [{"kind": "reference", "model": "llama-tiny", "status": "ok", "seconds": build_s}]
    records += [{"kind": "variant", "model": "llama-tiny", "status": "ok", "dtype": dtype,
                 "seconds": run_s + (lost if dtype == "bf16" else 0.0)} for dtype in ("fp32", "bf16")] * per_dtype
    spent = sum(r["seconds"] for r in records)
    run = SimpleNamespace(time_split={"parts_s": {"model audit": spent + 1.0}}, ceilings={"cpu": slow},
                          frame=pd.DataFrame({"device": ["cpu"], "status": ["ok"], "reason": [None]}),
                          model_records=records, ceilings_s=None)
    fitted = fit_overheads([run], params)
    assert fitted["cpu|model:llama-tiny|run_s"] == pytest.approx(run_s)


def _write(run_dir: Path, records: list[dict]) -> Path:
    from audit.core.runfolder import MODEL_FILE
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / MODEL_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def _variant(variant, err, status="ok", dtype="fp32"):
    return {"kind": "variant", "model": "llama-medium", "device": "cuda", "variant": variant, "dtype": dtype,
            "status": status, "final_hidden_err": err, "growth_median": 1.2, "kl": 1e-9, "seconds": 0.2,
            "decisive_mismatches": [], "reason": None if status == "ok" else "RuntimeError: x"}


def test_gpu_check_passes_a_model_audit_on_cuda_and_fails_a_crashed_or_unflagged_one(tmp_path):
    from audit.commands.gpu_check import check_model_audit
    ref = {"kind": "reference", "model": "llama-medium", "device": "cuda", "status": "ok", "seconds": 2.0}
    good = [ref, _variant("sdpa", 1.6e-5), _variant("eager", 1.6e-5), _variant("broken.unscaled", 0.6)]
    passed, lines = check_model_audit(_write(tmp_path / "good", good))
    assert passed and any("controls flagged: 1/1" in line for line in lines)
    unflagged = good[:3] + [_variant("broken.clamped", 1.7e-5)]
    assert not check_model_audit(_write(tmp_path / "unflagged", unflagged))[0]
    crashed = good + [_variant("sdpa_flash", None, status="error", dtype="bf16")]
    assert not check_model_audit(_write(tmp_path / "crashed", crashed))[0]
    on_cpu = [dict(ref, device="cpu")] + good[1:]
    assert not check_model_audit(_write(tmp_path / "cpu", on_cpu))[0]
    assert not check_model_audit(tmp_path / "none")[0]


@pytest.mark.parametrize("device, said", [("tpu", "unknown device 'tpu'"), ("cuda", "cuda is not available")])
def test_the_model_command_names_a_bad_device(tmp_path, device, said):
    import torch
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    got = subprocess.run([sys.executable, "-m", "audit", "model", "--device", device, "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert got.returncode == 2 and said in got.stderr and "Traceback" not in got.stderr
