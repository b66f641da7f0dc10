"""Tests of audit.measure.machine.roofline: byte counts and fractions on hand-computed numbers, and a
tiny real ceiling measurement on CPU. No test asserts on wall-clock time."""
from __future__ import annotations

import json
import math

import pytest

from audit.measure.golden.numerics import BACKWARD_FLOP_FACTOR, attention_flops
from audit.measure.machine.roofline import (ROOFLINE_COLUMNS, attention_bytes, cell_roofline, measure_ceilings,
                                            pct_of_limit)


# -- attention_bytes ---------------------------------------------------------------------------

def test_attention_bytes_forward_hand_computed():
    # B2 H3 Tq5 Tk7 d4 fp32: Q = O = 2*3*5*4*4 = 480 B, K = V = 2*3*7*4*4 = 672 B
    assert attention_bytes(2, 3, 5, 7, 4, "fp32") == 480 + 672 + 672 + 480
    # half precision halves every tensor
    assert attention_bytes(2, 3, 5, 7, 4, "bf16") == (480 + 672 + 672 + 480) // 2
    assert attention_bytes(2, 3, 5, 7, 4, "fp16") == (480 + 672 + 672 + 480) // 2


def test_attention_bytes_mask_is_read():
    assert attention_bytes(1, 1, 4, 4, 2, "fp32", mask_bytes=64) == \
        attention_bytes(1, 1, 4, 4, 2, "fp32") + 64


def test_attention_bytes_backward_hand_computed():
    # Q-sized q = 480, K-sized k = 672 (fp32, as above)
    q, k = 480, 672
    fwd = 2 * q + 2 * k                       # read Q, K, V; write O
    bwd = (q + 2 * k + q + q) + (q + 2 * k)   # read Q, K, V, O, dO; write dQ, dK, dV
    assert attention_bytes(2, 3, 5, 7, 4, "fp32", backward=True) == fwd + bwd
    # the mask is read once in each pass
    assert attention_bytes(2, 3, 5, 7, 4, "fp32", mask_bytes=10, backward=True) == fwd + bwd + 20


# -- pct_of_limit ------------------------------------------------------------------------------

def test_pct_of_limit_compute_bound():
    # 1e12 FLOP at 1e12 FLOP/s = 1 s; 1e9 B at 1e11 B/s = 0.01 s; measured 4 s
    frac, bound = pct_of_limit(1e12, 1e9, 4.0, 1e12, 1e11)
    assert bound == "compute"
    assert frac == pytest.approx(0.25)


def test_pct_of_limit_memory_bound():
    # 1e9 FLOP at 1e12 = 1 ms; 1e10 B at 1e10 B/s = 1 s; measured 2 s
    frac, bound = pct_of_limit(1e9, 1e10, 2.0, 1e12, 1e10)
    assert bound == "memory"
    assert frac == pytest.approx(0.5)


@pytest.mark.parametrize("args", [
    (1e9, 1e9, 1.0, None, 1e10),
    (1e9, 1e9, 1.0, 1e12, None),
    (1e9, 1e9, 0.0, 1e12, 1e10),
    (1e9, 1e9, -1.0, 1e12, 1e10),
    (1e9, 1e9, 1.0, 0.0, 1e10),
])
def test_pct_of_limit_missing_peak_or_time(args):
    assert pct_of_limit(*args) == (None, None)


# -- cell_roofline -----------------------------------------------------------------------------

CEILINGS = {"matmul_flops_per_s": {"fp32": 1e11, "bf16": 4e11, "fp16": None},
            "copy_bytes_per_s": 2e10}


def _case(**kw):
    case = dict(batch=2, heads=4, seq_len=256, d_k=64, dtype="fp32", causal=False)
    case.update(kw)
    return case


def test_cell_roofline_matches_numerics_flops():
    case = _case()
    flops = attention_flops(2, 4, 256, 256, 64, False)
    nbytes = attention_bytes(2, 4, 256, 256, 64, "fp32")
    fb_bytes = attention_bytes(2, 4, 256, 256, 64, "fp32", backward=True)
    out = cell_roofline(case, 1e-3, 4e-3, CEILINGS)
    assert set(out) == set(ROOFLINE_COLUMNS)
    want = max(flops / 1e11, nbytes / 2e10) / 1e-3
    assert out["pct_of_limit"] == pytest.approx(want)
    want_fb = max(flops * (1 + BACKWARD_FLOP_FACTOR) / 1e11, fb_bytes / 2e10) / 4e-3
    assert out["fwd_bwd_pct_of_limit"] == pytest.approx(want_fb)
    assert out["bytes"] == nbytes and out["fwd_bwd_bytes"] == fb_bytes
    assert out["peak_flops_per_s"] == 1e11 and out["peak_bytes_per_s"] == 2e10
    # 4*2*4*256*256*64 = 134 MFLOP -> 1.34 ms at 1e11; bytes 1 MiB -> 52 us: compute-bound
    assert out["bound"] == "compute"
    json.dumps(out)


def test_cell_roofline_causal_halves_flops():
    full = cell_roofline(_case(), 1e-3, 1e-3, CEILINGS)
    causal = cell_roofline(_case(causal=True), 1e-3, 1e-3, CEILINGS)
    # visible pairs: T(T+1)/2 of T^2, i.e. (T+1)/(2T) of the full count
    assert causal["pct_of_limit"] / full["pct_of_limit"] == pytest.approx(257 / 512)
    assert causal["bytes"] == full["bytes"]   # the same tensors move either way


def test_cell_roofline_memory_bound_and_q_len():
    # decode-like: one query against 4096 keys is memory-bound
    case = _case(q_len=1, seq_len=4096, dtype="bf16")
    out = cell_roofline(case, 1e-3, None, CEILINGS)
    assert out["bound"] == "memory"
    assert out["bytes"] == attention_bytes(2, 4, 1, 4096, 64, "bf16")
    assert out["pct_of_limit"] == pytest.approx(out["bytes"] / 2e10 / 1e-3)
    assert out["fwd_bwd_pct_of_limit"] is None and out["fwd_bwd_bound"] is None


def test_cell_roofline_missing_ceiling_is_null():
    no_rates = {**CEILINGS, "matmul_flops_per_s": {"fp16": None}}   # neither fp16's nor fp32's rate
    out = cell_roofline(_case(dtype="fp16"), 1e-3, 1e-3, no_rates)
    assert out["pct_of_limit"] is None and out["bound"] is None
    assert out["peak_flops_per_s"] is None
    assert out["bytes"] > 0     # the byte count does not depend on a ceiling
    out = cell_roofline(_case(), 1e-3, 1e-3, {})
    assert out["pct_of_limit"] is None and out["fwd_bwd_pct_of_limit"] is None


# -- measure_ceilings (real, tiny) -------------------------------------------------------------

TINY = dict(budget_s=0.02, matmul_n=64, copy_bytes=1 << 20)


def test_measure_ceilings_cpu_tiny():
    out = measure_ceilings("cpu", ("fp32", "bf16"), **TINY)
    json.dumps(out)   # plain JSON-serializable
    for key in ("device", "matmul_flops_per_s", "matmul_n", "matmul_reason", "copy_bytes_per_s",
                "statistic", "threads"):
        assert key in out
    assert out["device"] == "cpu"
    assert "max" in out["statistic"]
    for dt in ("fp32", "bf16"):
        rate = out["matmul_flops_per_s"][dt]
        assert isinstance(rate, float) and math.isfinite(rate) and rate > 0
        assert out["matmul_n"][dt] == 64
        assert out["matmul_reason"][dt] is None
    assert "fp16" not in out["matmul_flops_per_s"]
    assert math.isfinite(out["copy_bytes_per_s"]) and out["copy_bytes_per_s"] > 0
    assert out["copy_tensor_bytes"] == 1 << 20
    assert out["threads"] >= 1
    assert 0 < out["host_probe_s"] < 1.0          # the host's speed at the audit's own Python work


def test_the_host_probe_is_the_median_of_its_repeats(monkeypatch):
    """Each repeat timed on its own; one disturbed repeat (a neighbour's burst) does not move it."""
    from audit.measure.machine import roofline
    readings = iter([0.0, 1.0, 10.0, 15.0, 20.0, 22.0, 30.0, 33.0, 40.0, 44.0])   # repeats of 1, 5, 2, 3, 4 s
    monkeypatch.setattr(roofline.time, "perf_counter", lambda: next(readings))
    assert roofline.host_probe_s(repeats=5) == 3.0


def test_measure_ceilings_dtype_failure_is_null_with_reason(monkeypatch):
    import torch

    real = torch.matmul

    def matmul(a, b, *args, **kwargs):
        if a.dtype == torch.bfloat16:
            raise RuntimeError("bf16 matmul not implemented here")
        return real(a, b, *args, **kwargs)

    monkeypatch.setattr(torch, "matmul", matmul)
    out = measure_ceilings("cpu", ("fp32", "bf16"), **TINY)
    assert out["matmul_flops_per_s"]["bf16"] is None
    assert out["matmul_n"]["bf16"] is None
    assert "bf16 matmul not implemented here" in out["matmul_reason"]["bf16"]
    # the failure does not leak into the other dtype
    assert out["matmul_flops_per_s"]["fp32"] > 0 and out["matmul_reason"]["fp32"] is None
    json.dumps(out)


def _fake_hardware(monkeypatch, flops_per_s: float, bytes_per_s: float = 1e10, *, setup_s: float = 0.0,
                   launch_s: float = 0.0):
    """Matmul and copy calls that take the time a machine of these rates would need, on a
    fake clock: returns the clock, which also counts every timed second. `setup_s` is added to
    the process's first call (cuBLAS setup, workspace, lazy kernel loading), `launch_s` to
    every call (launch and sync)."""
    from audit.measure.machine import roofline

    clock = {"now": 0.0, "calls": 0}

    def fake_timed(fn, sync):                      # never runs fn: its time is the fake machine's
        nbytes = getattr(fn, "nbytes", None)
        seconds = 2.0 * nbytes / bytes_per_s if nbytes else 2.0 * fake_timed.n ** 3 / flops_per_s
        seconds += launch_s + (setup_s if clock["calls"] == 0 else 0.0)
        clock["calls"] += 1
        clock["now"] += seconds
        return seconds

    real_matmul = roofline._matmul_rate.__globals__["_grow"]

    def grow(make, size, max_size, factor, cost_growth, budget_s, sync):
        def sized(n):
            fake_timed.n = n
            return make(n)
        return real_matmul(sized, size, max_size, factor, cost_growth, budget_s, sync)

    def best(fn, work, *, budget_s, sync, warm_s, **kw):
        clock["now"] += max(budget_s, warm_s)
        return work / warm_s

    monkeypatch.setattr(roofline, "_timed_call", fake_timed)
    monkeypatch.setattr(roofline, "_grow", grow)
    monkeypatch.setattr(roofline, "_best_rate", best)
    monkeypatch.setattr(roofline.time, "perf_counter", lambda: clock["now"])   # the shares follow the fake clock
    return clock


@pytest.mark.parametrize("flops_per_s, expected_n", [(1.9e9, 256), (4e11, 2048)])
def test_measure_ceilings_grows_each_probe_to_its_share_of_the_budget(monkeypatch, flops_per_s, expected_n):
    """An AVX2 CPU's bf16 (0.0019 TFLOP/s) stays small; an AMX CPU's grows to the largest n;
    either way the device's ceilings take about the budget, not minutes."""
    from audit.measure.machine import roofline
    clock = _fake_hardware(monkeypatch, flops_per_s)
    out = measure_ceilings("cpu", ("fp32", "fp16", "bf16"), budget_s=2.5, copy_bytes=1 << 20)
    assert out["matmul_n"]["bf16"] == expected_n
    assert out["matmul_flops_per_s"]["bf16"] == pytest.approx(flops_per_s)
    assert clock["now"] <= 2.5 * 1.1
    assert roofline.CEILINGS_BUDGET_S <= 3.0


def test_a_slow_first_matmul_does_not_stop_the_probe_growing(monkeypatch):
    """The H200 case: bf16 is the first CUDA work of the process, so its first 128x128 matmul
    carries ~0.4 s of cuBLAS setup. Counted as growth it stopped the probe at n=128, a
    launch-bound 1 TFLOP/s against the hardware's 790 (pct_of_limit inflated ~700x)."""
    clock = _fake_hardware(monkeypatch, 790e12, 4.3e12, setup_s=0.4, launch_s=4e-6)
    out = measure_ceilings("cpu", ("bf16", "fp16", "fp32"), budget_s=2.5, copy_bytes=1 << 20,
                           matmul_n=1024)            # (the probes' matrices are real: kept small)
    assert out["matmul_n"]["bf16"] == 1024
    assert out["matmul_flops_per_s"]["bf16"] > 100e12
    assert out["matmul_setup_s"]["bf16"] == pytest.approx(0.4, rel=0.01)
    assert out["matmul_setup_s"]["fp16"] < 1e-3 and out["matmul_n_max"]["bf16"] == 1024
    assert clock["now"] <= 2.5 * 1.1 + 0.4


def test_matmul_plausibility_needs_growth_or_the_devices_floor():
    from audit.measure.machine.roofline import matmul_plausibility

    h200 = {"device": "cuda", "multiprocessors": 132, "copy_bytes_per_s": 4.3e12,
            "matmul_n_max": {"bf16": 8192, "fp32": 8192}}
    stuck = dict(h200, matmul_flops_per_s={"bf16": 1.05e12}, matmul_n={"bf16": 128})
    ok, why = matmul_plausibility(stuck, "bf16")
    assert ok is False and "n=128 of 8192" in why and "overhead" in why
    grown = dict(h200, matmul_flops_per_s={"bf16": 7.9e14}, matmul_n={"bf16": 8192})
    assert matmul_plausibility(grown, "bf16")[0] is True
    # stopped short of the cap by the budget, but at a rate no overhead-bound probe reaches
    short = dict(h200, matmul_flops_per_s={"fp32": 5.1e13}, matmul_n={"fp32": 4096})
    assert matmul_plausibility(short, "fp32")[0] is True
    assert matmul_plausibility(dict(short, matmul_flops_per_s={"fp32": 9e12}), "fp32")[0] is False
    # not judged: ceilings of an older attn-audit, or a CPU
    assert matmul_plausibility({"device": "cuda", "matmul_flops_per_s": {"bf16": 7.8e14},
                                "matmul_n": {"bf16": 4096}}, "bf16")[0] is None
    assert matmul_plausibility(dict(stuck, device="cpu"), "bf16")[0] is None


def test_best_rate_takes_the_fastest_block():
    """The statistic is the max rate over blocks; the budget bounds the repeats (fake clock)."""
    from audit.measure.machine.roofline import _best_rate

    durations = iter([0.5, 0.25, 1.0, 0.5])   # seconds per block, as the clock sees them
    now = [0.0]

    def fn():
        now[0] += next(durations)

    rate = _best_rate(fn, 100.0, budget_s=2.0, sync=None, warm_s=1.0, clock=lambda: now[0])
    assert rate == pytest.approx(100.0 / 0.25)
    with pytest.raises(StopIteration):     # stopped at 2.25 s >= budget: all 4 blocks ran
        fn()


def test_compute_ceiling_is_the_better_of_dtype_and_fp32():
    """fp16 on a CPU without fp16 units: a kernel that upcasts beats the fp16 matmul, so fp32 bounds it."""
    from audit.measure.machine.roofline import cell_roofline, compute_ceiling

    cpu = {"matmul_flops_per_s": {"fp32": 2e11, "fp16": 3e9, "bf16": 9e11}, "copy_bytes_per_s": 4e10}
    assert compute_ceiling(cpu, "fp16") == 2e11
    assert compute_ceiling(cpu, "bf16") == 9e11
    assert compute_ceiling({"matmul_flops_per_s": {"fp16": 5e14}}, "fp16") == 5e14
    assert compute_ceiling({}, "fp16") is None
    case = dict(batch=1, heads=2, seq_len=256, d_k=64, dtype="fp16", causal=False)
    assert cell_roofline(case, 1e-3, None, cpu)["peak_flops_per_s"] == 2e11


def test_each_ceiling_probe_shares_what_is_left_so_overruns_do_not_add_up(monkeypatch):
    """Found on an H200: fixed shares of 0.9 × 2.5 s plus each probe's setup call and allocation
    took 3.01 s. Each probe now gets an equal share of the time left: with every probe overrunning
    its share by 0.15 s (a setup call), the measurement still ends inside its budget."""
    from audit.measure.machine import roofline
    now = [0.0]
    monkeypatch.setattr(roofline.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(roofline, "host_probe_s", lambda: 0.01)
    shares: list[float] = []

    def probe(share: float) -> None:
        shares.append(share)
        now[0] += share + 0.15                                  # its share, and a setup call on top

    monkeypatch.setattr(roofline, "_matmul_rate", lambda device, dt, n, share, sync, spread: (probe(share), 1e12, n, 0.15)[1:])
    monkeypatch.setattr(roofline, "_attention_rate", lambda device, dt, t, share, sync: (probe(share), 1e11, t)[1:])
    monkeypatch.setattr(roofline, "_copy_rate", lambda device, nbytes, share, sync, spread: (probe(share), 1e11, nbytes)[1:])
    out = roofline.measure_ceilings("cpu", ("fp32", "fp16", "bf16"), budget_s=2.5)
    matmuls, attention = shares[:3], shares[3:6]          # (the order measure_ceilings takes them; the copy last)
    assert len(shares) == 7 and matmuls == sorted(matmuls, reverse=True)    # later probes absorb the overruns
    assert max(attention) < min(matmuls)          # the attention probes' smaller share
    assert out["attention_flops_per_s"] == {"fp32": 1e11, "fp16": 1e11, "bf16": 1e11}
    assert out["elapsed_s"] <= 2.5, (shares, out["elapsed_s"])
    assert out["matmul_flops_per_s"] == {"fp32": 1e12, "fp16": 1e12, "bf16": 1e12}
