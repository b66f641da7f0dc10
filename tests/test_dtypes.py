"""A dtype is one record (audit/core/dtypes.py): a dtype registered for the length of a test is taken by
everything that depends on a dtype (the grid, both commands' --dtype, the error budget, the cost model and
its kernel-support rule, the compare statistics, the model audit's rules and dtype check, the figures'
styles, torch's dtype, the roofline's bytes), and a name nobody registered raises a clear error everywhere
instead of being read as fp32."""
from __future__ import annotations

import math

import pytest

from audit import cli
from audit.analysis import compare_stats, model_rules
from audit.commands import model as model_command
from audit.core.dtypes import (Dtype, by_torch_name, dtype_names, dtype_spec, fused_kernel_dtypes, model_dtypes,
                               register, unregister, widest_dtype)
from audit.core.errors import UsageError
from audit.core.grid import Case, expand, validate_axes
from audit.measure.golden import numerics
from audit.measure.machine import roofline
from audit.plan import cell_shape, cell_work
from audit.plan.costmodel import CostModel
from audit.plan.priors import load_priors
from audit.plan.settings import Settings
from audit.render import data, plotting
from audit.workload import draws

NEW = "fp64x"        # a made-up name for a dtype torch has (float64): nothing but its record knows it


def _record(name: str = NEW, **changes) -> Dtype:
    fields = dict(name=name, torch_name="float64", bytes=8, unit_roundoff=2.0 ** -53, budget_factor=3.0,
                  atol=1e-9, baseline=name, upcast=name, fused_kernels=False, model_audit=True,
                  color="tab:red", marker="D", line="-.")
    return Dtype(**{**fields, **changes})


@pytest.fixture
def new_dtype():
    """NEW registered (at the narrow end) for one test, removed after it."""
    spec = register(_record())
    yield spec
    unregister(NEW)


@pytest.fixture
def fused_dtype():
    """A made-up half-precision dtype the fused kernels take, registered for one test."""
    spec = register(_record("fp16x", torch_name="float16", bytes=2, unit_roundoff=2.0 ** -11, atol=1e-4,
                            upcast="fp32", fused_kernels=True, model_audit=False))
    yield spec
    unregister("fp16x")


def _case(dtype: str, variant: str = "sdpa", device: str = "cpu") -> Case:
    return Case(variant, device, dtype, 64, 256, 1, 2, True)


def test_the_registry_holds_todays_dtypes_widest_first():
    assert dtype_names() == ("fp32", "fp16", "bf16") and widest_dtype() == "fp32"
    assert model_dtypes() == ("fp32", "bf16") and fused_kernel_dtypes() == ("fp16", "bf16")
    assert [dtype_spec(d).epsilon for d in dtype_names()] == [2.0 ** -23, 2.0 ** -10, 2.0 ** -7]
    assert by_torch_name("bfloat16").name == "bf16" and by_torch_name("float64") is None


def test_a_registered_dtype_is_in_the_registry_then_gone(new_dtype):
    assert dtype_names()[-1] == NEW and NEW in model_dtypes() and dtype_spec(NEW) is new_dtype
    unregister(NEW)
    assert NEW not in dtype_names()
    register(new_dtype)                   # back, for the fixture to remove


def test_the_grid_takes_a_registered_dtype(new_dtype):
    axes = validate_axes(dict(variant=("sdpa",), device=("cpu",), dtype=(NEW, "fp32"), d_k=(64,), seq_len=(256,),
                              batch=(1,), heads=(2,), causal=(True,), scenario=("normal",)))
    cases = expand(axes)
    assert [c.dtype for c in cases] == [NEW, "fp32"] and f"-{NEW}-" in cases[0].id


def test_both_commands_take_a_registered_dtype_and_list_it(new_dtype):
    parser = cli.build_parser()
    assert parser.parse_args(["run", "--dtype", NEW]).dtype == [NEW]
    model_args = parser.parse_args(["model"])
    assert NEW in model_args.dtype                         # model_audit=True: a default of `audit model`
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    for command in ("run", "model"):
        option = next(a for a in subparsers[command]._actions if a.dest == "dtype")
        assert NEW in option.help, (command, option.help)


def test_the_model_audit_checks_dtypes_against_the_registry(new_dtype):
    with pytest.raises(UsageError, match="--device"):      # its dtype passed: the next check is the device's
        model_command.model(["llama-tiny"], ["sdpa"], [NEW], device="tpu")
    with pytest.raises(UsageError, match=f"--dtype: unknown dtype 'fp99'; allowed: .*{NEW}"):
        model_command.model(["llama-tiny"], ["sdpa"], ["fp99"], device="tpu")


def test_the_budget_reads_the_record(new_dtype):
    assert numerics.budget_bound(1.0, NEW) == 3.0 + 1e-9                    # its factor and atol
    assert numerics.budget_bound(1.0, NEW, factor=2.0) == 2.0 + 1e-9        # a gradient's factor
    assert numerics.within_budget(3.0, 1.0, NEW) is True
    assert numerics.within_budget(3.1, 1.0, NEW) is False


def test_the_cost_model_predicts_a_cell_of_a_registered_dtype(new_dtype):
    cases = [_case(NEW), _case(NEW, "eager")]
    params = load_priors()
    ceilings = {"cpu": params.reference["cpu"]["ceilings"]}
    pred = CostModel(params).predict(cases, Settings(), ceilings)
    assert list(pred["status"]) == ["ok", "ok"]
    assert all(math.isfinite(s) and s > 0 for s in pred["total_s"])
    features = cell_shape.call_features(cell_shape.CellShape.of(cases[0]), ceilings["cpu"])
    fp32 = cell_shape.call_features(cell_shape.CellShape.of(_case("fp32")), ceilings["cpu"])
    assert features[3] == pytest.approx(2 * fp32[3])                        # 8 bytes an element against 4


def test_the_fused_kernels_take_a_dtype_by_its_flag(new_dtype, fused_dtype):
    for variant in ("sdpa_flash", "sdpa_cudnn"):
        refused = cell_work.predicted_unsupported(_case(NEW, variant, "cuda"),
                                                  cell_shape.CellShape.of(_case(NEW, variant, "cuda")))
        taken = cell_work.predicted_unsupported(_case("fp16x", variant, "cuda"),
                                                cell_shape.CellShape.of(_case("fp16x", variant, "cuda")))
        assert refused is not None and refused.endswith("needs fp16, bf16 or fp16x"), refused
        assert taken is None, taken
    assert cell_shape.cudnn_config(cell_shape.CellShape.of(_case("fp16x", "sdpa", "cuda"))) is not None
    assert cell_shape.cudnn_config(cell_shape.CellShape.of(_case(NEW, "sdpa", "cuda"))) is None


def test_the_compare_statistics_and_the_model_rules_read_the_record(new_dtype):
    assert compare_stats.error_floor(NEW) == 2.0 ** -53
    assert model_rules.error_floor(NEW) == model_rules.FLOOR_EPS * 2.0 ** -52


def test_the_roofline_and_torch_read_the_record(new_dtype):
    import torch
    assert draws.torch_dtype(NEW) is torch.float64
    assert roofline.attention_bytes(1, 1, 4, 4, 8, NEW) == 2 * roofline.attention_bytes(1, 1, 4, 4, 8, "fp32")
    ceilings = {"matmul_flops_per_s": {"fp32": 1e12, NEW: 2e11}}
    assert roofline.compute_ceiling(ceilings, NEW) == 2e11                  # its upcast is itself, not fp32


def test_the_figures_style_a_registered_dtype(new_dtype):
    assert plotting.dtype_color(NEW) == "tab:red" and plotting.dtype_style(NEW) == ("D", "-.")
    assert data.dtype_order([NEW, "bf16", "fp32"]) == ["fp32", "bf16", NEW]


@pytest.mark.parametrize("lookup", [
    lambda d: dtype_spec(d),
    lambda d: validate_axes(dict(variant=("sdpa",), device=("cpu",), dtype=(d,), d_k=(64,), seq_len=(256,),
                                 batch=(1,), heads=(2,), causal=(True,), scenario=("normal",))),
    lambda d: numerics.budget_bound(1.0, d),
    lambda d: compare_stats.error_floor(d),
    lambda d: model_rules.error_floor(d),
    lambda d: cell_shape.call_features(cell_shape.CellShape.of(_case(d)), None),
    lambda d: cell_work.predicted_unsupported(_case(d, "sdpa_flash", "cuda"),
                                              cell_shape.CellShape.of(_case("fp32", "sdpa_flash", "cuda"))),
    lambda d: roofline.attention_bytes(1, 1, 4, 4, 8, d),
    lambda d: roofline.compute_ceiling({"matmul_flops_per_s": {"fp32": 1e12}}, d),
    lambda d: draws.torch_dtype(d),
    lambda d: plotting.dtype_color(d),
    lambda d: plotting.dtype_style(d),
], ids=["lookup", "grid", "budget", "compare", "model_rules", "cost_model", "cell_work", "roofline_bytes",
        "compute_ceiling", "torch", "color", "style"])
def test_an_unknown_dtype_raises_naming_it_and_the_registered_ones(lookup):
    with pytest.raises(UsageError) as info:
        lookup("fp99")
    message = str(info.value)
    assert "'fp99'" in message and "fp32, fp16, bf16" in message, message


def test_a_record_the_measurement_cannot_honour_is_refused():
    with pytest.raises(UsageError, match="registered already"):
        register(_record("bf16"))
    with pytest.raises(UsageError, match="upcast dtype 'fp99' is not registered"):
        register(_record(upcast="fp99"))
    with pytest.raises(UsageError, match="scaled"):
        register(_record(scaled=True))
    with pytest.raises(UsageError, match="baseline"):
        register(_record(baseline="fp32"))
    assert NEW not in dtype_names()
