"""gpu-check's table, energy plausibility and flagship fraction, from synthetic records."""
from __future__ import annotations

import pandas as pd
import pytest

from audit import gpucheck


def _frame():
    rows = [
        dict(id="a", variant="sdpa_flash", dtype="bf16", d_k=128, seq_len=8192, causal=False, status="ok",
             fwd_ms=2.0, gflops_per_s=400_000.0, pct_of_limit=0.5, energy_per_call_j=1.4,
             energy_method="counter", mean_power_w=600.0, out_nan=0),
        dict(id="b", variant="eager", dtype="bf16", d_k=128, seq_len=8192, causal=False, status="ok",
             fwd_ms=10.0, gflops_per_s=80_000.0, pct_of_limit=0.1, energy_per_call_j=None,
             energy_method=None, mean_power_w=None, out_nan=3),
        dict(id="c", variant="sdpa_cudnn", dtype="bf16", d_k=128, seq_len=8192, causal=False, status="skipped",
             fwd_ms=None, gflops_per_s=None, pct_of_limit=None, energy_per_call_j=None,
             energy_method=None, mean_power_w=None, out_nan=None),
    ]
    return pd.DataFrame(rows)


def test_compact_table_has_ok_cells_in_tflops():
    table = gpucheck.compact_table(_frame())
    assert list(table.columns) == ["variant", "dtype", "seq_len", "causal", "ms", "TFLOP/s", "pct_of_limit",
                                   "J/call", "NaN"]
    assert set(table["variant"]) == {"sdpa_flash", "eager"}                  # skipped cell left out
    assert table.set_index("variant").loc["sdpa_flash", "TFLOP/s"] == pytest.approx(400.0)


def test_energy_check_ratio_of_counter_to_power_times_time():
    check = gpucheck.energy_check(_frame())
    assert list(check["id"]) == ["a"]                                         # cells with energy only
    assert check["power_x_time_j"].iloc[0] == pytest.approx(1.2)              # 600 W x 2 ms
    assert check["ratio"].iloc[0] == pytest.approx(1.4 / 1.2)


def test_flagship_fraction_against_measured_ceiling():
    text = gpucheck.flagship_fraction(_frame(), {"cuda": {"matmul_flops_per_s": {"bf16": 800e12}}})
    assert "50.0% of the measured bf16 matmul ceiling" in text
    assert "not measured" in gpucheck.flagship_fraction(_frame(), None)


def test_gpu_check_refuses_without_cuda(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert gpucheck.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err
