"""gpu-check's checks: each fails on what the H200 run (schema 2, commit bf8bec4) recorded and
passes on records of the fixed behaviour; plus its table and flagship fraction."""
from __future__ import annotations

import pandas as pd
import pytest

from audit.commands import gpu_check
from audit.core.records import load
from tests.helpers import h200_run


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    root = tmp_path_factory.mktemp("h200")
    return {name: load(h200_run(name, root)) for name in ("gc", "stab", "full")}


def _cell(**values):
    base = dict(id="x", variant="sdpa", device="cuda", dtype="bf16", d_k=128, seq_len=1024, batch=2,
                heads=16, causal=False, scenario="normal", status="ok", reason=None, fwd_ms=0.04,
                fwd_host_ms=0.03, host_bound=False, sdpa_backend="CUDNN_ATTENTION", gflops_per_s=4e5,
                pct_of_limit=0.5, energy_per_call_j=0.04e-3 * 500, energy_method="counter over CUDA-graph replays",
                mean_power_w=500.0, sampled_power_w=495.0, sampled_power_source="instant", energy_idle_frac=0.0,
                energy_cost_s=0.16,
                out_nan=0, elapsed_s=0.3, golden_subset=None, rel_err=1e-3, compile_s=None,
                compile_reused=None)
    base.update(values)
    base["id"] = values.get("id") or f"{base['variant']}-{base['scenario']}-{base['seq_len']}-{base['causal']}"
    return base


# --------------------------------------------------------------------------- energy

def test_energy_check_fails_on_the_h200_windows(h200):
    """The unaligned 0.5 s windows of bf8bec4: 2.67 for sdpa T512 B32, 0.57-0.60 for cuDNN/flash."""
    passed, lines = gpu_check.check_energy(h200["gc"])
    assert not passed
    table = gpu_check.energy_check(h200["gc"])
    assert table["busy_ratio"].max() > 1.5 and table["busy_ratio"].min() < 0.7
    assert "busy ratio within 15%" in lines[0]
    # schema 2 recorded no sampled power, and its run had no steady check of the counter
    assert lines[1].endswith("not measured (no energy_counter_check in run.json's cuda ceilings)")
    assert "60 without instantaneous power" in lines[2]


def _steady(counter_w: float = 500.0, sampled_w: float | None = 495.0, reason: str | None = None) -> dict:
    """run.json's ceilings with the energy counter's steady check (EnergyMeter.counter_check)."""
    ratio = None if sampled_w is None else counter_w / sampled_w
    agrees = None if ratio is None else abs(ratio - 1) <= 0.15
    return {"cuda": {"energy_counter_check": dict(counter_w=counter_w, sampled_w=sampled_w, samples=20, ratio=ratio,
                                                  agrees=agrees, window_s=1.0, method="counter", reason=reason)}}


def test_energy_check_passes_gap_free_windows():
    frame = pd.DataFrame([_cell(fwd_ms=t, energy_per_call_j=500 * t / 1e3 * 1.03, seq_len=s)
                          for t, s in ((0.03, 512), (2.0, 8192))])
    passed, lines = gpu_check.check_energy(frame, _steady())
    assert passed, lines
    slow = pd.DataFrame([_cell(energy_cost_s=0.9)])
    assert not gpu_check.check_energy(slow, _steady())[0]           # energy cost over 0.3 s per cell


def _counter_cells(mean_power_w: float, sampled_power_w: float | None, source: str | None) -> pd.DataFrame:
    """Gap-free windows whose energy per call follows the counter's mean power (as
    EnergyMeter computes it): the busy ratio is 1 whatever the counter says."""
    return pd.DataFrame([_cell(fwd_ms=t, seq_len=s, mean_power_w=mean_power_w, sampled_power_w=sampled_power_w,
                               sampled_power_source=source, energy_per_call_j=mean_power_w * t / 1e3)
                         for t, s in ((0.03, 512), (2.0, 8192))])


@pytest.mark.parametrize("counter_w, sampled_w, passes", [
    (500.0, 495.0, True),    # the counter agrees with instantaneous power on a steady load
    (5000.0, 495.0, False),  # mis-scaled (a unit off by 10)
    (60.0, 495.0, False),    # stuck: the counter barely advanced, mean power near nothing
    (500.0, None, False),    # no instantaneous power: the counter is not cross-checked
])
def test_energy_check_gates_the_counter_on_the_runs_steady_check(counter_w, sampled_w, passes):
    """The busy ratio alone passes any counter: energy/(mean power × time) is two timings. The
    per-cell windows' counter ÷ sampled power (here 2.5, as on the H200's short cells, whose
    instant field lagged) is shown, not judged; the steady check in run.json's ceilings is."""
    frame = _counter_cells(counter_w, counter_w / 2.5, "instant")
    busy = gpu_check.energy_check(frame)["busy_ratio"]
    assert busy.to_list() == pytest.approx([1.0, 1.0])
    passed, lines = gpu_check.check_energy(frame, _steady(counter_w, sampled_w,
                                                          None if sampled_w else "no instantaneous power"))
    assert passed is passes, lines
    assert lines[1].startswith("energy counter on a steady load: "
                               + ("within 15%" if passes else "NOT within" if sampled_w else "not judged"))
    assert "median 2.500" in lines[2]
    assert not gpu_check.check_energy(frame, None)[0]                    # a run without the check: not passed


def test_energy_check_does_not_judge_the_busy_ratio_of_l2_flushed_cells():
    """With --l2-flush the median is a cold-cache time while the window runs hot."""
    frame = pd.DataFrame([_cell(fwd_ms=0.05, energy_per_call_j=500 * 0.03e-3, l2_flush=True),
                          _cell(fwd_ms=2.0, seq_len=8192, energy_per_call_j=500 * 2e-3, l2_flush=False)])
    passed, lines = gpu_check.check_energy(frame, _steady())
    assert passed, lines
    assert "1/1 cells" in lines[0] and "1 L2-flushed cell(s) not judged" in lines[0]
    assert not gpu_check.check_energy(frame.assign(l2_flush=False), _steady())[0]


# --------------------------------------------------------------------------- host overhead

def test_host_overhead_check_fails_on_the_h200_forced_backend(h200):
    """sdpa_cudnn T1024 B2 read 0.087 ms where sdpa (the same cuDNN kernel) read 0.037 ms."""
    passed, lines = gpu_check.check_host_overhead(h200["gc"])
    assert not passed
    assert any(line.startswith("OFF T1024 B2") for line in lines)


def test_host_overhead_check_passes_device_times():
    frame = pd.DataFrame([_cell(variant="sdpa", fwd_ms=0.0370, fwd_host_ms=0.03),
                          _cell(variant="sdpa_cudnn", fwd_ms=0.0372, fwd_host_ms=0.087, host_bound=True)])
    passed, lines = gpu_check.check_host_overhead(frame)
    assert passed, lines
    assert "host-bound cells: 1/2" in lines[-1]


# --------------------------------------------------------------------------- device bug, oom, golden, compile

def test_masked_causal_check_fails_on_the_h200_device_bug(h200):
    passed, lines = gpu_check.check_masked_causal(h200["stab"])
    assert not passed
    assert any("same device" in line for line in lines)


def test_masked_causal_check_passes_when_they_run():
    frame = pd.DataFrame([_cell(variant=v, causal=True, scenario=s, dtype="fp16")
                          for v in ("eager", "broken.clamped") for s in ("padding", "cross_causal")])
    assert gpu_check.check_masked_causal(frame)[0]


def test_oom_check():
    main = pd.DataFrame([_cell(variant="eager", seq_len=65536, status="oom", elapsed_s=0.002,
                               reason="predicted peak 1024.0 GiB for one forward+backward ... not run")])
    real = pd.DataFrame([_cell(variant="oom_plugin:allocate_too_much", status="oom",
                               reason="OutOfMemoryError: CUDA out of memory"),
                         _cell(variant="sdpa")])
    passed, lines = gpu_check.check_oom(main, real)
    assert passed, lines
    broken_next = real.assign(status=["oom", "error"])
    assert not gpu_check.check_oom(main, broken_next)[0]
    assert not gpu_check.check_oom(main, None)[0]


def test_golden_subset_and_compile_reuse_checks():
    frame = pd.DataFrame([
        _cell(variant="eager", seq_len=16384, batch=1, golden_subset=[[0, 0], [0, 2]], elapsed_s=1.2),
        _cell(variant="compiled", scenario="normal", compile_s=3.1, compile_reused=False),
        _cell(variant="compiled", scenario="scaled_x16", compile_reused=True),
    ])
    assert gpu_check.check_golden_subset(frame)[0]
    passed, lines = gpu_check.check_compile_reuse(frame)
    assert passed and "compiled in 3.10 s" in lines[0] and "reused" in lines[1]
    recompiled = frame.assign(compile_reused=[None, False, False], compile_s=[None, 3.1, 3.0])
    assert not gpu_check.check_compile_reuse(recompiled)[0]
    broken = frame.assign(graph_breaks=[None, 2, 2])
    passed, lines = gpu_check.check_compile_reuse(broken)
    assert not passed and "2 graph break(s)" in lines[0]
    assert gpu_check.check_compile_reuse(frame.assign(graph_breaks=[None, 0, 0]))[0]
    assert not gpu_check.check_golden_subset(frame.assign(golden_subset=None))[0]


def test_prediction_check_compares_totals():
    frame = pd.DataFrame([_cell(id="a", elapsed_s=1.0), _cell(id="b", elapsed_s=3.0)])
    good = pd.DataFrame({"id": ["a", "b"], "total_s": [1.2, 3.3]})
    assert gpu_check.check_prediction(good, frame, 5.0)[0]
    bad = pd.DataFrame({"id": ["a", "b"], "total_s": [0.5, 1.0]})
    assert not gpu_check.check_prediction(bad, frame, 5.0)[0]


def test_prediction_check_leaves_out_the_cells_the_budget_skipped():
    """A skipped cell took nothing: its prediction is not held against the model."""
    frame = pd.DataFrame([_cell(id="a", elapsed_s=1.0), _cell(id="b", elapsed_s=3.0),
                          _cell(id="c", status="skipped", elapsed_s=0.0, reason="over the budget at run time")])
    pred = pd.DataFrame({"id": ["a", "b", "c"], "total_s": [1.1, 3.2, 30.0]})
    passed, lines = gpu_check.check_prediction(pred, frame, 5.0)
    assert passed, lines
    assert "predicted 4.3 s, recorded 4.0 s" in lines[0]


H200_CEILINGS = {"device": "cuda", "matmul_flops_per_s": {"bf16": 7.9e14}, "matmul_n": {"bf16": 8192},
                 "matmul_n_max": {"bf16": 8192}, "matmul_setup_s": {"bf16": 0.41}, "multiprocessors": 132,
                 "copy_bytes_per_s": 4.3e12, "elapsed_s": 2.6}


def test_ceilings_check_wants_them_within_three_seconds(h200):
    assert not gpu_check.check_ceilings(None)[0]
    passed, lines = gpu_check.check_ceilings({"cuda": H200_CEILINGS})
    assert passed and "790 TFLOP/s" in lines[0] and "2.60 s" in lines[0] and "0.410 s" in lines[0]
    assert not gpu_check.check_ceilings({"cuda": dict(H200_CEILINGS, elapsed_s=9.0)})[0]


def test_ceilings_check_fails_a_probe_that_stopped_at_its_smallest_size(h200):
    """Fast enough (1.1 s) but stuck at n=128: 1 TFLOP/s is launch overhead, not the H200's matmul."""
    stuck = dict(H200_CEILINGS, matmul_flops_per_s={"bf16": 1.05e12}, matmul_n={"bf16": 128}, elapsed_s=1.1)
    passed, lines = gpu_check.check_ceilings({"cuda": stuck})
    assert not passed and any(line.startswith("BAD bf16: stopped growing at n=128") for line in lines)
    # the stored H200 run's ceilings (an older attn-audit) recorded neither the cap nor the SM count
    import json
    from tests.helpers import H200_RUNS
    stored = json.loads((H200_RUNS / "full" / "run.json").read_text())["ceilings"]
    passed, lines = gpu_check.check_ceilings(stored)
    assert not passed and "not recorded" in "\n".join(lines)


def test_no_errors_check(h200):
    assert not gpu_check.check_no_errors(h200["stab"])[0]        # 6 device-bug errors
    assert gpu_check.check_no_errors(h200["gc"])[0]


# --------------------------------------------------------------------------- table, flagship

def test_compact_table_has_ok_cells_in_tflops():
    frame = pd.DataFrame([_cell(variant="sdpa_flash", gflops_per_s=400_000.0),
                          _cell(variant="sdpa_cudnn", status="skipped")])
    table = gpu_check.compact_table(frame)
    assert "host_ms" in table.columns and "TFLOP/s" in table.columns
    assert set(table["variant"]) == {"sdpa_flash"}
    assert table["TFLOP/s"].iloc[0] == pytest.approx(400.0)


def test_flagship_fraction_against_measured_ceiling():
    frame = pd.DataFrame([_cell(variant="sdpa_flash", seq_len=8192, gflops_per_s=400_000.0)])
    text = gpu_check.flagship_fraction(frame, {"cuda": {"matmul_flops_per_s": {"bf16": 800e12}}})
    assert "50.0% of the measured bf16 matmul ceiling" in text
    assert "not measured" in gpu_check.flagship_fraction(frame, None)


def test_main_step_limit_follows_the_runs_budget():
    predicted = pd.DataFrame({"total_s": [30.0, 31.0]})
    assert gpu_check.main_step_limit_s(["--budget", "5m", "--dtype", "bf16"], predicted) == 45 + 300 + 20 + 30
    assert gpu_check.main_step_limit_s(["--budget", "none", "--max-cell-s", "5"], predicted) == 45 + 122 + 5 + 30


def test_oom_cells_come_first_in_the_gpu_check_grid():
    """A main step stopped by its limit still recorded the predicted-oom cells check_oom needs."""
    from audit.workload import presets, variants
    cases = presets.preset_cases(presets.presets()["gpu-check"], known_variant=variants.check_name)
    assert [c.seq_len for c in cases[:2]] == [65536, 65536]
    assert all(c.seq_len < 65536 for c in cases[2:])


def test_gpu_check_refuses_without_cuda(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert gpu_check.check([]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_main_runs_every_step_prints_every_check_and_copies_to_out(tmp_path, monkeypatch, capsys):
    """The driver on a machine without a GPU: CUDA faked, each step writing prepared records."""
    import json

    import torch

    from audit.core.records import RecordWriter, new_record

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cells = {
        "main": [_cell(variant="sdpa", fwd_ms=0.037), _cell(variant="sdpa_cudnn", fwd_ms=0.038),
                 _cell(variant="eager", causal=True, scenario="padding", dtype="fp16", energy_per_call_j=None),
                 _cell(variant="eager", seq_len=16384, batch=1, golden_subset=[[0, 0]], energy_per_call_j=None),
                 _cell(variant="compiled", scenario="scaled_x16", compile_reused=True, energy_per_call_j=None),
                 _cell(variant="eager", seq_len=65536, status="oom", elapsed_s=0.001, reason="predicted peak ...")],
        "oom": [_cell(variant="oom_plugin:allocate_too_much", status="oom", reason="CUDA out of memory"),
                _cell(variant="sdpa")],
    }
    steps = []

    def fake_step(name, args, root, log, timeout_s, env=None):
        steps.append((name, list(args), timeout_s))
        out = root / name
        with RecordWriter(out) as writer:
            for values in cells[name]:
                rec = new_record({}, values["id"])
                rec.update(values)
                writer.write(rec)
        (out / "run.json").write_text(json.dumps({"ceilings": {"cuda": dict(H200_CEILINGS, **_steady()["cuda"])}}))
        if name == "main":                 # the run's model audit on CUDA: a control flagged, the yardsticks ok
            from audit.core.runfolder import MODEL_FILE
            run = dict(kind="variant", model="llama-medium", device="cuda", dtype="bf16", status="ok",
                       growth_median=1.15, kl=1.4, seconds=0.2, decisive_mismatches=[])
            model = [dict(kind="reference", model="llama-medium", device="cuda", status="ok", seconds=2.0),
                     dict(run, variant="sdpa", final_hidden_err=0.36), dict(run, variant="eager", final_hidden_err=0.37),
                     dict(run, variant="broken.unscaled", final_hidden_err=0.95)]
            (out / MODEL_FILE).write_text("".join(json.dumps(r) + "\n" for r in model))
        return out, 10.0, 0

    import pandas as pd
    monkeypatch.setattr(gpu_check, "_run_step", fake_step)
    monkeypatch.setattr(gpu_check, "_predict", lambda name, run_dir=None: pd.DataFrame(
        {"id": [c["id"] for c in cells["main"]], "variant": "x", "device": "cuda", "status": "ok",
         "total_s": 0.3, **{p: 0.0 for p in ("setup", "golden", "compile", "warmup", "numerics", "timed",
                                              "energy")}}))
    code = gpu_check.check([])
    text = capsys.readouterr().out
    assert [s[0] for s in steps] == ["main", "oom"]
    # the main step's limit is its plan's: start, the 180 s budget, the cell in flight, the report
    assert steps[0][2] == gpu_check.main_step_limit_s([], None) == 45 + 180 + 20 + 30
    assert sum(s[2] for s in steps) < 600                          # inside one 10-minute device command
    for name in ("no error cells", "masked causal cells on CUDA", "energy per call", "kernel time, not host time",
                 "out of memory", "golden subset", "compiled-code reuse", "cost model", "ceilings",
                 "model audit on CUDA"):
        assert f"PASS {name}" in text, (name, text)
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "gpu-check-main.tar.gz", "gpu-check-oom.tar.gz", "summary.txt", "table.txt"]
