"""The golden's cost is bounded: past a FLOP budget it covers a deterministic subset of
(batch, head) slices, and the metrics say which."""
from __future__ import annotations

import pytest
import torch

from audit.core.grid import Case
from audit.execute import runner
from audit.measure.cell import cellcache
from audit.measure.golden import reference
from audit.measure.golden.numerics import error_vs_reference
from audit.measure.golden.reference import golden_attention, golden_flops, golden_slices, take_slices
from audit.workload import presets
from audit.workload.variant_contract import Variant

PRESET = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0,
                        max_cell_s=60.0, energy_window_s=0.0)


def test_slices_are_all_within_the_budget_and_evenly_spaced_past_it():
    one = golden_flops(4096, 4096, 128, False)
    assert golden_slices(2, 2, 4096, 4096, 128, False, "cuda") is None          # 4 slices fit 4e12
    many = golden_slices(1, 16, 16384, 16384, 128, False, "cuda")
    assert len(many) == 8 and many[0] == (0, 0)
    assert many == [(0, 2 * i) for i in range(8)]
    assert golden_slices(4, 16, 65536, 65536, 128, False, "cuda") == [(0, 0)]   # at least one
    assert golden_slices(1, 2, 2048, 2048, 128, False, "cpu") is None            # the cpu preset's largest
    assert one > 0


def test_take_slices_reads_broadcast_dims_at_zero():
    t = torch.arange(2 * 3 * 4).reshape(2, 3, 4, 1)                              # (B, H, T, 1)
    picked = take_slices(t, [(0, 1), (1, 2)])
    assert picked.shape == (1, 2, 4, 1)
    assert torch.equal(picked[0, 0], t[0, 1]) and torch.equal(picked[0, 1], t[1, 2])
    mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)                               # (B, 1, 1, Tk)
    assert take_slices(mask, [(1, 2)]).shape == (1, 1, 1, 4)
    assert take_slices(t, None) is t


def _nan_in_slice_0_1(q, k, v, *, mask=None, causal=False, scale=None):
    """Correct attention, except every output of (batch 0, head 1) is NaN."""
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    keep = torch.ones_like(out)
    keep[0, 1] = float("nan")
    return out * keep


def test_a_cell_past_the_budget_judges_errors_on_the_subset_and_counts_nan_everywhere(monkeypatch):
    case = Case("sdpa", "cpu", "fp32", 8, 32, 2, 3, False, "normal")
    per_slice = golden_flops(32, 32, 8, False)
    monkeypatch.setitem(reference.GOLDEN_FLOP_BUDGET, "cpu", 2.5 * per_slice)   # 2 of 6 slices
    cache = cellcache.InputCache()
    rec = runner.run_cell(case, cache, PRESET, {})
    assert rec["status"] == "ok"
    assert rec["golden_subset"] == [[0, 0], [1, 0]]
    inputs, ref = cache.get(case)
    out = torch.nn.functional.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v)
    whole = golden_attention(inputs.q, inputs.k, inputs.v)
    expected = error_vs_reference(out[[0, 1], [0, 0]][None], whole.out[[0, 1], [0, 0]][None])
    assert rec["rmse"] == pytest.approx(expected["rmse"], rel=1e-9)
    assert ref.golden.out.shape == (1, 2, 32, 8)

    monkeypatch.setattr(runner, "resolve", lambda name: Variant("nan01", "", lambda: _nan_in_slice_0_1))
    rec = runner.run_cell(case, cache, PRESET, {})
    assert rec["out_nan"] == 32 * 8                    # counted on the whole output
    assert rec["rmse"] == pytest.approx(expected["rmse"], rel=1e-9)   # (0, 1) is not in the subset


def test_within_the_budget_there_is_no_subset():
    rec = runner.run_cell(Case("sdpa", "cpu", "fp32", 8, 32, 2, 3, False, "normal"), cellcache.InputCache(),
                          PRESET, {})
    assert rec["golden_subset"] is None


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scenario", ["normal", "padding", "fully_masked_bool", "decode", "cross_causal"])
def test_row_visibility_of_the_whole_output_matches_the_golden(scenario, causal):
    from audit.measure.golden.reference import row_visibility
    from audit.workload.inputs import make_inputs
    inputs = make_inputs(Case("sdpa", "cpu", "fp32", 8, 24, 2, 2, causal, scenario))
    tq, tk = inputs.q.shape[-2], inputs.k.shape[-2]
    rows = row_visibility(tq, tk, causal=causal, device=inputs.q.device, visible=inputs.visible)
    golden = golden_attention(inputs.q, inputs.k, inputs.v, causal=causal, visible=inputs.visible)
    assert torch.equal(rows.expand_as(golden.row_visible), golden.row_visible)
