"""Tests of audit.core.grid (Case ids, expansion order, axis validation) and audit.workload.presets."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from audit.core import grid
from audit.core.errors import UsageError
from audit.core.dtypes import dtype_names
from audit.core.grid import AXES, DEVICES, INT_AXES, Case, expand, validate_axes
from audit.workload import presets
from audit.workload.inputs import SCENARIOS, check_scenario
from audit.workload.presets import Preset, preset_cases
from audit.workload.variants import BUILTIN_NAMES, NEGATIVE_CONTROLS, check_name


def base_axes(**override):
    axes = dict(variant=("eager",), device=("cpu",), dtype=("fp32",), d_k=(16,), d_v=(16,), seq_len=(8,),
                batch=(1,), heads=(2,), kv_heads=(2,), causal=(False,), scenario=("normal",))
    axes.update(override)
    return axes


# --------------------------------------------------------------------------- Case

def test_case_id_examples():
    assert Case("sdpa", "cpu", "bf16", 64, 1024, 1, 8, True).id == "sdpa-cpu-bf16-d64-T1024-B1-H8-causal-normal"
    assert Case("eager", "cuda", "fp32", 32, 128, 2, 4, False).id == "eager-cuda-fp32-d32-T128-B2-H4-full-normal"


def test_case_id_changes_with_every_axis():
    case = Case("sdpa", "cpu", "bf16", 64, 1024, 1, 8, True)
    changed = dict(variant="eager", device="cuda", dtype="fp16", d_k=32, d_v=48, seq_len=512, batch=2,
                   heads=4, kv_heads=2, causal=False, scenario="other")
    assert set(changed) == set(AXES)
    ids = {case.id}
    for axis, value in changed.items():
        ids.add(dataclasses.replace(case, **{axis: value}).id)
    assert len(ids) == len(AXES) + 1


def test_case_is_hashable_and_input_key_ignores_variant():
    a = Case("eager", "cpu", "fp32", 16, 8, 1, 2, False)
    b = dataclasses.replace(a, variant="sdpa")
    c = dataclasses.replace(a, causal=True)
    assert len({a, b, c, dataclasses.replace(a)}) == 3
    assert a.input_key == b.input_key
    assert a.input_key != c.input_key


def test_case_axes_round_trip_and_from_mapping_ignores_extra_keys():
    case = Case("sdpa", "cpu", "bf16", 64, 1024, 1, 8, True)
    axes = case.axes()
    assert list(axes) == list(AXES)
    assert Case.from_mapping(axes) == case
    record_like = {**axes, "status": "ok", "fwd_ms": 1.0, "id": case.id}
    assert Case.from_mapping(record_like) == case


# --------------------------------------------------------------------------- expand

def _small_grid():
    return base_axes(variant=("eager", "sdpa", "sdpa_math"), dtype=("fp32", "bf16"),
                     seq_len=(8, 16), causal=(False, True), d_k=(16, 32))


def test_expand_is_the_full_cross_product():
    axes = _small_grid()
    cases = expand(axes)
    assert len(cases) == math.prod(len(axes[a]) for a in AXES) == 3 * 2 * 2 * 2 * 2
    assert len(set(cases)) == len(cases)
    expected = {tuple(combo) for combo in itertools.product(*(axes[a] for a in AXES))}
    assert {tuple(c.axes()[a] for a in AXES) for c in cases} == expected


def test_expand_varies_variants_fastest():
    axes = _small_grid()
    cases = expand(axes)
    n_var = len(axes["variant"])
    for start in range(0, len(cases), n_var):
        group = cases[start:start + n_var]
        assert [c.variant for c in group] == list(axes["variant"])
        assert len({c.input_key for c in group}) == 1
    # every input set forms exactly one contiguous run
    runs = [key for key, _ in itertools.groupby(c.input_key for c in cases)]
    assert len(runs) == len(set(runs)) == len(cases) // n_var


def test_expand_of_single_values_is_one_case():
    cases = expand(base_axes())
    assert cases == [Case("eager", "cpu", "fp32", 16, 8, 1, 2, False, "normal")]


# --------------------------------------------------------------------------- validate_axes

@pytest.mark.parametrize("bad", ["fp64", "float32", "FP32", "int8"])
def test_validate_rejects_unknown_dtype_listing_allowed(bad):
    with pytest.raises(UsageError) as info:
        validate_axes(base_axes(dtype=("fp32", bad)))
    msg = str(info.value)
    assert repr(bad) in msg
    for allowed in dtype_names():
        assert allowed in msg
    assert "--dtype" in msg


@pytest.mark.parametrize("bad", ["tpu", "gpu", "mps"])
def test_validate_rejects_unknown_device_listing_allowed(bad):
    with pytest.raises(UsageError) as info:
        validate_axes(base_axes(device=(bad,)))
    msg = str(info.value)
    assert repr(bad) in msg
    for allowed in DEVICES:
        assert allowed in msg


def test_validate_rejects_unknown_scenario_listing_allowed():
    with pytest.raises(UsageError) as info:
        validate_axes(base_axes(scenario=("weird",)), known_scenario=check_scenario)
    msg = str(info.value)
    assert msg.startswith("--scenario: ") and "'weird'" in msg
    for allowed in SCENARIOS:
        assert allowed in msg


def test_validate_checks_scenarios_with_the_injected_validator():
    seen = []
    out = validate_axes(base_axes(scenario=("padding", "normal", "padding")), known_scenario=seen.append)
    assert seen == ["padding", "normal", "padding"] and out["scenario"] == ("padding", "normal")
    check_scenario("normal")


@pytest.mark.parametrize("axis", INT_AXES)
@pytest.mark.parametrize("bad", ["0", "-3", "1.5", "abc", "", True, False, 0, -1, 2.5])
def test_validate_rejects_bad_sizes(axis, bad):
    with pytest.raises(UsageError) as info:
        validate_axes(base_axes(**{axis: (8, bad)}))
    msg = str(info.value)
    assert "--" + axis.replace("_", "-") in msg
    assert repr(bad) in msg
    assert "positive integer" in msg


@pytest.mark.parametrize("bad", ["maybe", "2", "yes please", "", None])
def test_validate_rejects_bad_causal_listing_allowed(bad):
    with pytest.raises(UsageError) as info:
        validate_axes(base_axes(causal=(bad,)))
    msg = str(info.value)
    assert "--causal" in msg
    assert repr(bad) in msg
    assert "true" in msg and "false" in msg


def test_validate_rejects_an_empty_or_missing_axis():
    with pytest.raises(UsageError, match="--seq-len"):
        validate_axes(base_axes(seq_len=()))
    axes = base_axes()
    del axes["heads"]
    with pytest.raises(UsageError, match="--heads"):
        validate_axes(axes)


def test_validate_normalises_strings_and_dedupes_in_order():
    out = validate_axes(base_axes(variant=("sdpa", "eager", "sdpa"), causal=("true", "False", True, "false"),
                                  d_k=("64", 32, 64, "32"), seq_len=("128",), dtype=("bf16", "fp32", "bf16")))
    assert out["causal"] == (True, False)
    assert all(type(v) is bool for v in out["causal"])
    assert out["d_k"] == (64, 32)
    assert all(type(v) is int for v in out["d_k"])
    assert out["seq_len"] == (128,)
    assert out["variant"] == ("sdpa", "eager")
    assert out["dtype"] == ("bf16", "fp32")
    assert set(out) == set(AXES)
    assert len(expand(out)) == 2 * 1 * 2 * 2 * 1 * 1 * 1 * 2 * 1


def test_validate_checks_variants_with_the_injected_validator():
    seen = []
    validate_axes(base_axes(variant=("eager", "sdpa")), known_variant=seen.append)
    assert seen == ["eager", "sdpa"]
    with pytest.raises(UsageError) as info:
        validate_axes(base_axes(variant=("eager", "nope")), known_variant=check_name)
    assert "'nope'" in str(info.value)
    assert "eager" in str(info.value)


# --------------------------------------------------------------------------- presets

def test_every_preset_validates():
    table = presets.presets()
    assert {"quick", "cpu", "gpu"} <= set(table)
    for name, preset in table.items():
        assert preset.name == name
        assert preset.min_samples >= 1 and preset.min_time_s > 0 and preset.max_cell_s > 0
        assert len(preset.grids) >= 1
        for sub in preset.grids:
            axes = validate_axes(sub, known_variant=check_name, known_scenario=check_scenario)
            assert set(axes) == set(AXES)
            for axis in AXES:
                assert axes[axis] == grid.sub_grid_values(sub, axis), (name, axis)
        # the union of every sub-grid's values validates too
        axes = validate_axes(preset.axes, known_variant=check_name, known_scenario=check_scenario)
        for axis in AXES:
            assert axes[axis] == tuple(preset.axes[axis]), (name, axis)
        # built-ins and negative controls only, nothing else
        assert set(axes["variant"]) <= set(BUILTIN_NAMES) | set(NEGATIVE_CONTROLS)
        assert preset_cases(preset, known_variant=check_name)


def test_every_negative_control_is_in_the_cpu_and_quick_presets():
    table = presets.presets()
    for name in ("quick", "cpu"):
        variants_in_cells = {c.variant for c in preset_cases(table[name])}
        assert set(NEGATIVE_CONTROLS) <= variants_in_cells, name
        assert set(NEGATIVE_CONTROLS).isdisjoint(BUILTIN_NAMES)


def test_quick_preset_is_smaller_than_cpu():
    table = presets.presets()
    quick = preset_cases(table["quick"])
    cpu = preset_cases(table["cpu"])
    assert 0 < len(quick) < len(cpu)
    assert set(table["quick"].axes["device"]) == {"cpu"}
    assert set(table["cpu"].axes["device"]) == {"cpu"}
    assert {c.device for c in quick} == {c.device for c in cpu} == {"cpu"}


# --------------------------------------------------------------------------- sub-grids

def _two_grid_preset():
    return Preset(
        name="t", description="two overlapping sub-grids",
        grids=(
            base_axes(variant=("eager", "sdpa"), seq_len=(8, 16)),
            base_axes(variant=("sdpa", "eager_fp32"), seq_len=(8,), scenario=("normal", "padding")),
        ),
    )


def test_preset_axes_is_the_ordered_union_of_sub_grids():
    axes = _two_grid_preset().axes
    assert list(axes) == list(AXES)
    assert axes["variant"] == ("eager", "sdpa", "eager_fp32")
    assert axes["seq_len"] == (8, 16)
    assert axes["scenario"] == ("normal", "padding")
    assert axes["dtype"] == ("fp32",)


def test_preset_cases_is_the_union_of_sub_grids_without_duplicates():
    preset = _two_grid_preset()
    cases = preset_cases(preset)
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    first = expand(validate_axes(preset.grids[0]))
    second = expand(validate_axes(preset.grids[1]))
    assert len(first) == 4 and len(second) == 4
    # sdpa-...-T8-...-normal is in both sub-grids: counted once
    shared = {c.id for c in first} & {c.id for c in second}
    assert shared == {Case("sdpa", "cpu", "fp32", 16, 8, 1, 2, False, "normal").id}
    assert set(ids) == {c.id for c in first} | {c.id for c in second}
    assert len(cases) == 4 + 4 - 1
    # first sub-grid first, in expansion order; then the new cells of the second
    assert ids[:4] == [c.id for c in first]
    assert ids[4:] == [c.id for c in second if c.id not in shared]
    # not the cross product of the union (eager_fp32 with T16 is in no sub-grid)
    assert len(cases) < len(expand(validate_axes(preset.axes)))
    assert Case("eager_fp32", "cpu", "fp32", 16, 16, 1, 2, False, "normal").id not in ids


def test_preset_cases_override_replaces_the_axis_in_every_sub_grid():
    preset = _two_grid_preset()
    cases = preset_cases(preset, {"variant": ["sdpa_math"], "seq_len": ["32"]})
    ids = {c.id for c in cases}
    assert ids == {Case("sdpa_math", "cpu", "fp32", 16, 32, 1, 2, False, s).id
                   for s in ("normal", "padding")}
    assert len(cases) == 2
    assert all(type(c.seq_len) is int for c in cases)
    # an axis without override keeps each sub-grid's own values
    cases = preset_cases(preset, {"dtype": ["bf16"]})
    assert len(cases) == 7
    assert {c.dtype for c in cases} == {"bf16"}
    assert {c.scenario for c in cases if c.variant == "eager"} == {"normal"}


def test_preset_cases_validates_values_scenarios_and_variants():
    preset = _two_grid_preset()
    with pytest.raises(UsageError, match="--dtype"):
        preset_cases(preset, {"dtype": ["fp64"]})
    with pytest.raises(UsageError, match="--scenario: unknown scenario 'weird'; allowed: normal, "):
        preset_cases(preset, {"scenario": ["weird"]})
    with pytest.raises(UsageError, match="'nope'"):
        preset_cases(preset, {"variant": ["nope"]}, known_variant=check_name)
    seen = []
    preset_cases(preset, known_variant=seen.append)
    assert set(seen) == {"eager", "sdpa", "eager_fp32"}
