"""The value-shortcut scenarios (audit.workload.inputs: uniform, heavy_tailed, constant_rows, sparse):
each one's defining property on the inputs it draws, against `normal` where that is the point; and
the negative control of a value shortcut, broken.zero_keys_as_padding: wrong on sparse, right on
normal inputs, diagnosed as its own mistake."""
from __future__ import annotations

import pytest
import torch

from audit.core.grid import Case
from audit.execute import runner
from audit.measure.cell import cellcache
from audit.workload import inputs, presets
from audit.workload.draws import SPARSE_DENSITY, UNIFORM_BOUND, constant_key_heads, zero_key_positions, zero_query_rows
from audit.workload.inputs import make_inputs, mask_kind, scenario_mask_kind
from audit.workload.variants import (ARGUMENT_CONTROL_NAMES, BUILTIN_NAMES, GQA_CONTROLS, NEGATIVE_CONTROLS,
                                    REFEREE_CONTROL_NAMES, builtin_variants)

VALUE_SCENARIOS = ("uniform", "heavy_tailed", "constant_rows", "sparse")
# B 2, H 4, T 128, d 32: 32768 entries in each of q, k and v
CELL = dict(variant="eager", device="cpu", dtype="fp32", d_k=32, seq_len=128, batch=2, heads=4, causal=False)
PRESET = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0, max_cell_s=None,
                        energy_window_s=0.0)


def drawn(scenario: str, **fields) -> inputs.Inputs:
    return make_inputs(Case(**{**CELL, "scenario": scenario, **fields}))


def entries(x: inputs.Inputs) -> torch.Tensor:
    """Every entry of q, k and v, flat (float64)."""
    return torch.cat([t.double().flatten() for t in (x.q, x.k, x.v)])


def test_the_value_scenarios_are_plain_scenarios_with_a_description():
    for name in VALUE_SCENARIOS:
        scenario = inputs.SCENARIOS[name]
        assert "N(0, 1)" in scenario.description, name          # what each catches
        assert scenario_mask_kind(name) == "plain"
        assert mask_kind(name, False) == "none" and mask_kind(name, True) == "causal"
        x = drawn(name)
        assert x.mask is None and x.visible is None and x.score_mod is None and x.sinks is None
        assert x.q.shape == (2, 4, 128, 32) and x.k.shape == x.v.shape == (2, 4, 128, 32)
        assert all(t.dtype == torch.float32 and t.is_contiguous() for t in (x.q, x.k, x.v))
        again = drawn(name)                                       # seeded by the cell: the same tensors
        assert torch.equal(x.q, again.q) and torch.equal(x.k, again.k) and torch.equal(x.v, again.v), name


def test_uniform_is_bounded_by_sqrt3_with_unit_variance_where_normal_is_not_bounded():
    x = entries(drawn("uniform"))
    assert float(x.abs().max()) <= UNIFORM_BOUND                     # the fp32 draw: |x| <= sqrt(3)
    assert float(x.abs().max()) > 0.99 * UNIFORM_BOUND               # and it fills the interval
    assert abs(float(x.var()) - 1.0) < 0.05
    assert abs(float(x.mean())) < 0.02
    normal = entries(drawn("normal"))
    assert float((normal.abs() > UNIFORM_BOUND).double().mean()) > 0.05   # N(0, 1): 8% beyond sqrt(3)


def test_heavy_tailed_has_entries_beyond_six_standard_deviations_where_normal_has_none():
    x = entries(drawn("heavy_tailed"))                               # 98304 entries
    beyond = int((x.abs() > 6.0).sum())                              # Student-t(3), unit variance: 1 in 530
    assert beyond > 50, beyond
    assert int((entries(drawn("normal")).abs() > 6.0).sum()) <= 1    # N(0, 1): 2e-9 each
    # unit variance from a few large entries: the bulk is narrower than N(0, 1)'s (median |x| 0.44, not 0.67)
    assert 0.40 < float(x.abs().median()) < 0.48
    assert float(entries(drawn("normal")).abs().median()) > 0.6
    assert torch.isfinite(x).all()


def test_constant_rows_have_zero_queries_and_heads_of_one_repeated_key():
    x = drawn("constant_rows")
    zero_rows = zero_query_rows(128)
    assert zero_rows[:3] == [1, 5, 9] and len(zero_rows) == 32
    assert bool((x.q[:, :, zero_rows] == 0).all())
    other = [i for i in range(128) if i not in zero_rows]
    assert bool((x.q[:, :, other] != 0).any(-1).all())               # the other query rows are not zero
    assert constant_key_heads(4) == [1, 3] and constant_key_heads(1) == []
    for h in range(4):
        same = bool((x.k[:, h] == x.k[:, h, :1]).all())
        assert same == (h in constant_key_heads(4)), h                 # every key one vector, in odd heads only


def test_constant_rows_attend_uniformly_on_those_rows_only():
    """The golden's output on a row of constant scores is the mean of v; elsewhere it is not."""
    case = Case(**{**CELL, "scenario": "constant_rows"})
    x = make_inputs(case)
    ref = cellcache.build_reference(case, x)
    assert ref.slices is None                                       # every (batch, head) slice
    out = ref.golden.out                                              # (B, H, Tq, d) float64
    mean_v = x.v.double().mean(-2, keepdim=True)                      # (B, H, 1, d): H = Hkv here
    uniform = (out - mean_v).abs().amax(-1) < 1e-9                    # (B, H, Tq)
    expected = torch.zeros(2, 4, 128, dtype=torch.bool)
    expected[:, :, zero_query_rows(128)] = True
    expected[:, constant_key_heads(4)] = True
    assert torch.equal(uniform, expected)


def test_sparse_is_mostly_exact_zeros_with_all_zero_key_rows():
    x = drawn("sparse")
    for name, t in (("q", x.q), ("v", x.v)):
        zeros = float((t == 0).double().mean())
        assert abs(zeros - (1 - SPARSE_DENSITY)) < 0.02, (name, zeros)
    positions = zero_key_positions(128)
    assert positions[:3] == [3, 11, 19] and len(positions) == 16
    zero_keys = (x.k == 0).all(-1)                                    # (B, Hkv, Tk)
    assert bool(zero_keys[:, :, positions].all())                     # every head, every batch
    others = [j for j in range(128) if j not in positions]
    assert float(zero_keys[:, :, others].double().mean()) < 0.1       # by chance: 0.9 ** 32 = 3.4%
    assert float((x.k[:, :, others] == 0).double().mean()) == pytest.approx(0.9, abs=0.02)
    # the rest N(0, 1) · sqrt(10): each entry of unit variance, as normal's
    nonzero = entries(x)[entries(x) != 0]
    assert 9.0 < float(nonzero.var()) < 11.0
    assert abs(float(entries(x).var()) - 1.0) < 0.1
    assert not bool((entries(drawn("normal")) == 0).any())            # normal has no exact zero


# --------------------------------------------------------------------------- the control

def measured(variant: str, scenario: str, *, dtype: str = "fp32", causal: bool = False) -> dict:
    """One cell's record, as the runner measures it (quick preset's control shape: d 32, T 64)."""
    case = Case(variant, "cpu", dtype, 32, 64, 1, 2, causal, scenario)
    rec = runner.run_cell(case, cellcache.InputCache(), PRESET, {})
    assert rec["status"] == "ok", rec["reason"]
    return rec


def test_the_control_masks_exactly_the_all_zero_keys():
    probs_fn = builtin_variants()["broken.zero_keys_as_padding"].probs
    x = drawn("sparse")
    probs = probs_fn(x.q, x.k)                                        # (B, H, Tq, Tk)
    zero_keys = (x.k == 0).all(-1)[:, :, None, :].expand_as(probs)
    assert bool((probs[zero_keys] == 0).all())                        # no weight on an all-zero key
    assert bool((probs[~zero_keys] > 0).all())                        # every other key keeps some
    dense = drawn("normal")
    assert not bool((dense.k == 0).all(-1).any())                     # dense inputs: nothing to mask
    right = builtin_variants()["eager"].probs(dense.q, dense.k)
    torch.testing.assert_close(probs_fn(dense.q, dense.k), right)


@pytest.mark.parametrize("causal", [False, True])
def test_the_control_is_wrong_on_sparse_inputs_and_named_by_its_mistake(causal):
    eager = measured("eager", "sparse", causal=causal)
    bad = measured("broken.zero_keys_as_padding", "sparse", causal=causal)
    assert eager["within_budget"] is True
    assert bad["within_budget"] is False
    assert bad["rmse"] > 1000 * eager["rmse"] and bad["rmse"] > 1e-2  # its error is the masked keys', not rounding
    assert bad["diagnosis"] == "zero_keys_as_padding"


@pytest.mark.parametrize("scenario", ["normal", "uniform", "heavy_tailed", "constant_rows"])
def test_the_control_is_right_on_inputs_without_all_zero_keys(scenario):
    rec = measured("broken.zero_keys_as_padding", scenario)
    assert rec["within_budget"] is True, rec["err_ratio"]
    assert rec["err_ratio"] <= 2.0                                   # within eager's own error
    assert rec["diagnosis"] in (None, "none")


@pytest.mark.parametrize("scenario", VALUE_SCENARIOS)
def test_correct_variants_are_within_budget_on_every_value_scenario(scenario):
    """The scenarios themselves do not fail correct code (the must-not side)."""
    for variant in ("eager_fp32", "sdpa", "sdpa_math"):
        rec = measured(variant, scenario)
        assert rec["within_budget"] is True, (variant, rec["err_ratio"])


def test_the_quick_and_cpu_presets_run_the_value_scenarios_for_every_variant_and_control():
    """Every variant in both; every control in cpu, and in quick the ones whose defect shows there."""
    from audit.workload.layout_controls import LAYOUT_CONTROLS
    table = presets.presets()
    # every built-in but flex and the LSE-only ops (their own sub-grids), compiled ones included; every
    # control but the GQA ones (on GQA cells only) and the referee's (right values: their own cells)
    own = ("flex",) + presets.LSE_VARIANTS + presets.CUDA_LSE_OPS + presets.LAYOUT_VARIANTS
    layout_controls = {"broken." + c for c in LAYOUT_CONTROLS}          # the layouts' own cells
    expected = ({v for v in BUILTIN_NAMES if v not in own} | set(NEGATIVE_CONTROLS)) - set(GQA_CONTROLS) \
        - set(REFEREE_CONTROL_NAMES) - layout_controls - set(ARGUMENT_CONTROL_NAMES)   # the arguments': their own
    assert {"compiled", "sdpa", "broken.zero_keys_as_padding"} <= expected
    value_controls = {c for c in NEGATIVE_CONTROLS if set(builtin_variants()[c].reveals or ()) <= set(VALUE_SCENARIOS)
                      and builtin_variants()[c].reveals}
    for name in ("quick", "cpu"):
        cells = presets.preset_cases(table[name])
        for scenario in VALUE_SCENARIOS:
            want = expected if name == "cpu" else {v for v in expected if not v.startswith("broken.")} | value_controls
            assert want == {c.variant for c in cells if c.scenario == scenario}, (name, scenario)
    gpu = presets.preset_cases(table["gpu"])
    assert {c.scenario for c in gpu if c.variant == "broken.zero_keys_as_padding"} == {"sparse"}


def test_compiled_variants_reuse_their_normal_cells_code_on_the_value_scenarios():
    """The presets' value sub-grid runs compiled variants at a shape they compile for normal inputs:
    the scenarios differ in values only, so the build cache's key is the same (no compile of their own)."""
    from audit.workload.variants import resolve
    key = cellcache.BuildCache.key
    for name in ("compiled", "compiled_unfused"):
        base = key(resolve(name), drawn("normal", variant=name))
        for scenario in VALUE_SCENARIOS:
            assert key(resolve(name), drawn(scenario, variant=name)) == base, (name, scenario)
        assert key(resolve(name), drawn("normal", variant=name, seq_len=64)) != base     # it can differ
