"""Tests of audit.workload.variants (built-ins, SDPA backends, plug-ins) and audit.workload.inputs."""
from __future__ import annotations

from functools import partial

import dataclasses
import importlib
import sys
import uuid
from pathlib import Path

import pytest
import torch
from tests.helpers import out_only, random_qkv

from audit.core import grid
from audit.core.errors import Unsupported
from audit.core.errors import UsageError
from audit.core.grid import Case
from audit.measure.golden.numerics import error_vs_reference
from audit.measure.golden.reference import golden_attention
from audit.workload import variants
from audit.workload.draws import torch_dtype
from audit.workload.inputs import make_inputs, seed_for
from audit.workload.variants import (ARGUMENT_CONTROL_NAMES, BUILTIN_NAMES, NEGATIVE_CONTROLS, REFEREE_CONTROL_NAMES,
                                    resolve)
from audit.workload.layout_controls import LAYOUT_CONTROLS
from audit.workload.variant_contract import BROKEN_PREFIX

# the controls of a numerics defect (their weights exposed, their defect in the output or gradients)
# the layouts' controls (packed, paged, latent, invariance): tests/test_layouts.py; the arguments':
# tests/test_arguments.py
LAYOUT_CONTROL_NAMES = [c for c in NEGATIVE_CONTROLS if c.removeprefix("broken.") in LAYOUT_CONTROLS]
NUMERICS_CONTROLS = [c for c in NEGATIVE_CONTROLS
                     if c not in REFEREE_CONTROL_NAMES + tuple(LAYOUT_CONTROL_NAMES) + ARGUMENT_CONTROL_NAMES]

PLUGINS = Path(__file__).resolve().parent / "plugins"
AGREEING = ("eager", "eager_fp32", "sdpa", "sdpa_math", "sdpa_flash")


qkv = partial(random_qkv, tq=16, tk=16)


def padding_like_mask(tq, tk, seed=1):
    """(Tq, Tk) bool with every row keeping at least one key."""
    m = torch.rand(tq, tk, generator=torch.Generator().manual_seed(seed)) > 0.5
    m[:, 0] = True
    return m


@pytest.fixture
def plugins_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    return PLUGINS


# --------------------------------------------------------------------------- registry

def test_builtin_registry_matches_names():
    table = variants.builtin_variants()
    assert tuple(table) == BUILTIN_NAMES + NEGATIVE_CONTROLS
    for name in BUILTIN_NAMES + NEGATIVE_CONTROLS:
        v = resolve(name)
        assert v.name == name
        assert v.description.strip()
        assert callable(v.build)
    assert resolve("compiled").compiled and not resolve("eager").compiled


def test_negative_controls_are_a_separate_name_space():
    assert len(NEGATIVE_CONTROLS) == 34
    assert set(NEGATIVE_CONTROLS) == {"broken.unscaled", "broken.mask_after_softmax", "broken.clamped",
                                      "broken.no_max_subtraction", "broken.softmax_wrong_dim",
                                      "broken.zero_keys_as_padding",
                                      "broken.gqa_wrong_head", "broken.backward_rowsum_d_missing",
                                      "broken.backward_dq_scale_missing", "broken.sink_ignored",
                                      "broken.lse_base2", "broken.lse_no_grad",
                                      # the referee's (tests/test_referee.py): SDPA's values, one trick each
                                      "broken.writes_input", "broken.pointer_cache", "broken.background_thread",
                                      "broken.tensor_subclass", "broken.finds_reference",
                                      "broken.skips_after_warmup", "broken.patches_timer", "broken.value_cache",
                                      # the layouts' (tests/test_layouts.py)
                                      "broken.document_boundary_ignored", "broken.cu_seqlens_off_by_one",
                                      "broken.paged_extra_page", "broken.paged_wrong_sequence",
                                      "broken.v_read_at_k_stride", "broken.window_left_inclusive",
                                      "broken.strides_ignored",
                                      "broken.batch_dependent_splits",
                                      # the argument probes' (tests/test_arguments.py): one argument ignored each
                                      "broken.scale_ignored", "broken.softcap_fixed", "broken.causal_ignored",
                                      "broken.mask_ignored", "broken.window_ignored", "broken.block_table_stale"}
    assert set(variants.GQA_CONTROLS) <= set(NEGATIVE_CONTROLS)
    assert not set(NEGATIVE_CONTROLS) & set(BUILTIN_NAMES)
    for name in NEGATIVE_CONTROLS:
        v = resolve(name)
        assert name.startswith(BROKEN_PREFIX)
        assert v.family == "broken" and v.negative_control
        assert v.description.startswith("NEGATIVE CONTROL")
        assert (v.probs is not None) == (name in NUMERICS_CONTROLS) and not v.compiled
    for name in BUILTIN_NAMES:
        v = resolve(name)
        assert v.family != "broken" and not v.negative_control
        assert not name.startswith(BROKEN_PREFIX)


def test_probs_is_exposed_by_hand_written_variants_only():
    table = variants.builtin_variants()
    with_probs = {name for name, v in table.items() if v.probs is not None}
    assert with_probs == {"eager", "eager_fp32"} | set(NUMERICS_CONTROLS)


@pytest.mark.parametrize("name", ["eager", "eager_fp32", *NUMERICS_CONTROLS])
def test_probs_times_v_is_the_variant_output(name):
    v_ = resolve(name)
    q, k, v = qkv()
    mask = padding_like_mask(16, 16)
    for causal in (False, True):
        probs = v_.probs(q, k, mask=mask, causal=causal)
        assert probs.shape == (1, 2, 16, 16)                       # (B, H, Tq, Tk)
        out = out_only(v_)(q, k, v, mask=mask, causal=causal)
        torch.testing.assert_close(out, probs @ v, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", ["eager", "eager_fp32"])
def test_correct_probs_are_rows_summing_to_one_with_masked_keys_at_zero(name):
    q, k, _ = qkv()
    mask = padding_like_mask(16, 16)
    probs = resolve(name).probs(q, k, mask=mask, causal=True)
    keep = mask & torch.ones(16, 16, dtype=torch.bool).tril()
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2, 16), rtol=1e-6, atol=1e-6)
    assert torch.count_nonzero(probs.masked_fill(keep, 0.0)) == 0
    assert bool((probs[keep.expand_as(probs)] > 0).all())


def test_resolve_unknown_lists_allowed_names():
    for bad in ("nope", "nocolon", "Eager", ""):
        with pytest.raises(UsageError) as info:
            resolve(bad)
        msg = str(info.value)
        assert repr(bad) in msg
        for name in BUILTIN_NAMES:
            assert name in msg
        assert "package.module:function" in msg


def test_check_name():
    assert variants.check_name("eager") is None
    with pytest.raises(UsageError, match="nope"):
        variants.check_name("nope")


# --------------------------------------------------------------------------- agreement with golden

@pytest.mark.parametrize("name", AGREEING)
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_variants_agree_with_golden(name, causal):
    fn = out_only(resolve(name))
    q, k, v = qkv()
    out = fn(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    golden = golden_attention(q, k, v, causal=causal)
    assert error_vs_reference(out, golden.out)["rel_err"] <= 1e-5


@pytest.mark.parametrize("name", AGREEING)
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_variants_agree_with_golden_under_a_bool_mask(name, causal):
    fn = out_only(resolve(name))
    q, k, v = qkv()
    mask = padding_like_mask(16, 16)
    out = fn(q, k, v, mask=mask, causal=causal)
    golden = golden_attention(q, k, v, visible=mask, causal=causal)
    assert error_vs_reference(out, golden.out)["rel_err"] <= 1e-5


@pytest.mark.parametrize("name", AGREEING)
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_variants_agree_with_golden_float_mask_and_scale(name, causal):
    # an additive -inf float mask: the golden gets the equivalent bool visibility
    fn = out_only(resolve(name))
    q, k, v = qkv()
    visible = padding_like_mask(16, 16, seed=5)
    mask = torch.zeros(16, 16).masked_fill(~visible, float("-inf"))
    out = fn(q, k, v, mask=mask, causal=causal, scale=0.2)
    golden = golden_attention(q, k, v, visible=visible, causal=causal, scale=0.2)
    assert error_vs_reference(out, golden.out)["rel_err"] <= 1e-5
    # the scale is honoured: the default scale is a different attention
    default = golden_attention(q, k, v, visible=visible, causal=causal)
    assert error_vs_reference(out, default.out)["rel_err"] > 1e-3


@pytest.mark.parametrize("name", ["eager", "eager_fp32", "sdpa", "sdpa_math"])
def test_neg_inf_float_mask_matches_golden_on_rows_that_see_a_key(name):
    q, k, v = qkv()
    visible = padding_like_mask(16, 16, seed=7)
    visible[[2, 9]] = False                                       # two fully masked rows
    mask = torch.zeros(16, 16).masked_fill(~visible, float("-inf"))
    out = out_only(resolve(name))(q, k, v, mask=mask)
    golden = golden_attention(q, k, v, visible=visible)
    assert golden.row_visible[..., [2, 9]].logical_not().all()
    err = error_vs_reference(out, golden.out, golden.row_visible)
    assert err["rel_err"] <= 1e-5
    assert err["max_abs_err"] <= 1e-5


@pytest.mark.parametrize("name", ["eager", "sdpa"])
def test_finfo_min_float_mask_gives_a_uniform_fully_masked_row(name):
    # finfo.min is finite: a row masked with it entirely gets equal weight on every key
    q, k, v = qkv()
    visible = torch.ones(16, 16, dtype=torch.bool)
    visible[4] = False
    visible[7, 10:] = False                                       # a partly masked row
    mask = torch.zeros(16, 16).masked_fill(~visible, torch.finfo(torch.float32).min)
    out = out_only(resolve(name))(q, k, v, mask=mask)
    torch.testing.assert_close(out[..., 4, :], v.mean(-2), rtol=1e-5, atol=1e-5)
    golden = golden_attention(q, k, v, visible=visible)
    assert torch.count_nonzero(golden.out[..., 4, :]) == 0        # the golden says: masked
    err = error_vs_reference(out, golden.out, golden.row_visible)
    assert err["rel_err"] <= 1e-5                                  # the other rows are right


@pytest.mark.parametrize("name", AGREEING)
@pytest.mark.parametrize("tq,tk", [(5, 9), (1, 9)])
def test_variants_use_top_left_causal_alignment(name, tq, tk):
    fn = out_only(resolve(name))
    q, k, v = qkv(tq=tq, tk=tk)
    out = fn(q, k, v, causal=True)
    golden = golden_attention(q, k, v, causal=True)
    assert error_vs_reference(out, golden.out)["rel_err"] <= 1e-5


def test_agreement_check_can_fail():
    # an unscaled attention is the textbook bug: the same check must reject it
    q, k, v = qkv(d=32)
    wrong = out_only(resolve("eager"))(q, k, v, scale=1.0)
    assert error_vs_reference(wrong, golden_attention(q, k, v).out)["rel_err"] > 1e-3


@pytest.mark.parametrize("name", ["eager", "eager_fp32", "sdpa", "sdpa_math"])
def test_low_precision_output_keeps_the_input_dtype(name):
    q, k, v = qkv(dtype=torch.bfloat16)
    out = out_only(resolve(name))(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert error_vs_reference(out, golden_attention(q, k, v, causal=True).out)["rel_err"] < 0.05


def test_fully_masked_rows_eager_nan_sdpa_zero():
    q, k, v = qkv(tq=6, tk=6)
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[2] = False
    eager = out_only(resolve("eager"))(q, k, v, mask=mask)
    assert torch.isnan(eager[..., 2, :]).all()
    assert not torch.isnan(eager[..., [0, 1, 3, 4, 5], :]).any()
    for name in ("sdpa", "sdpa_math"):
        out = out_only(resolve(name))(q, k, v, mask=mask)
        assert torch.isfinite(out).all()
        assert torch.count_nonzero(out[..., 2, :]) == 0


# --------------------------------------------------------------------------- SDPA backends on CPU

@pytest.mark.parametrize("name", ["sdpa_efficient", "sdpa_cudnn"])
def test_sdpa_backends_without_a_cpu_kernel_raise_unsupported(name):
    fn = resolve(name).build()  # building is fine; calling is not
    q, k, v = qkv()
    with pytest.raises(Unsupported) as info:
        fn(q, k, v)
    msg = str(info.value)
    assert name.split("_")[1].upper() in msg
    assert "cpu" in msg


def test_sdpa_flash_runs_on_cpu():
    q, k, v = qkv()
    out = out_only(resolve("sdpa_flash"))(q, k, v, causal=True)
    assert torch.isfinite(out).all()


def test_sdpa_real_errors_are_not_hidden_as_unsupported():
    q, k, v = qkv()
    with pytest.raises(RuntimeError) as info:
        out_only(resolve("sdpa_math"))(q, k[..., :4], v)  # d mismatch between q and k
    assert not isinstance(info.value, Unsupported)


@pytest.mark.parametrize("message, limit", [
    ("No available kernel. Aborting execution.", True),
    ("No viable backend for scaled_dot_product_attention was found.", True),
    ("cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph: "
     "operation not supported on this device", False),
    ("CUDA driver error: operation not supported", False),
])
def test_only_torchs_own_refusals_of_a_forced_backend_are_a_backend_limit(monkeypatch, message, limit):
    """A forced backend's error is `skipped` (Unsupported) only when it is torch's refusal; a
    cuDNN or driver failure that happens to say "not supported" stays an error."""
    import torch.nn.functional as F

    def failing(*args, **kwargs):
        raise RuntimeError(message)
    fn = resolve("sdpa_math").build()
    monkeypatch.setattr(F, "scaled_dot_product_attention", failing)
    q, k, v = qkv()
    with pytest.raises((RuntimeError, Unsupported)) as info:
        fn(q, k, v)
    assert isinstance(info.value, Unsupported) is limit
    assert ("SDPA backend MATH cannot run this cell" in str(info.value)) is limit


# --------------------------------------------------------------------------- plug-ins

def test_plugin_loads_function_and_first_docstring_line(plugins_on_path):
    v = resolve("example_plugin:my_attention")
    example_plugin = importlib.import_module("example_plugin")
    assert v.name == "example_plugin:my_attention"
    assert v.family == "plugin"
    assert v.build() is example_plugin.my_attention
    assert v.description == "Plain softmax attention written as a user plug-in."


def test_plugin_computes_attention(plugins_on_path):
    fn = resolve("example_plugin:my_attention").build()
    q, k, v = qkv()
    mask = padding_like_mask(16, 16)
    for causal in (False, True):
        out = fn(q, k, v, mask=mask, causal=causal)
        golden = golden_attention(q, k, v, visible=mask, causal=causal)
        assert error_vs_reference(out, golden.out)["rel_err"] <= 1e-5


def test_plugin_without_docstring_and_nested_attribute(plugins_on_path):
    plain = resolve("example_plugin:undocumented_attention")
    assert plain.description == "user plug-in example_plugin:undocumented_attention"
    nested = resolve("example_plugin:Holder.attention")
    assert nested.description == "Nested attribute form: example_plugin:Holder.attention."
    assert callable(nested.build())


def test_plugin_passes_grid_validation(plugins_on_path):
    axes = grid.validate_axes(
        dict(variant=("eager", "example_plugin:my_attention"), device=("cpu",), dtype=("fp32",),
             d_k=(8,), seq_len=(8,), batch=(1,), heads=(1,), causal=(False,), scenario=("normal",)),
        known_variant=variants.check_name)
    assert axes["variant"] == ("eager", "example_plugin:my_attention")


def test_plugin_missing_module():
    spec = f"no_such_module_{uuid.uuid4().hex}:fn"
    with pytest.raises(UsageError) as info:
        resolve(spec)
    msg = str(info.value)
    assert spec.split(":")[0] in msg
    assert "ModuleNotFoundError" in msg


def test_plugin_missing_attribute(plugins_on_path):
    with pytest.raises(UsageError) as info:
        resolve("example_plugin:nope")
    msg = str(info.value)
    assert "'nope'" in msg and "example_plugin" in msg
    with pytest.raises(UsageError, match="Holder.nope"):
        resolve("example_plugin:Holder.nope")


def test_plugin_not_callable(plugins_on_path):
    with pytest.raises(UsageError) as info:
        resolve("example_plugin:NOT_CALLABLE")
    msg = str(info.value)
    assert "example_plugin:NOT_CALLABLE" in msg
    assert "not a callable" in msg


@pytest.mark.parametrize("spec", ["mod:", ":fn", ":"])
def test_plugin_bad_spec_form(spec):
    with pytest.raises(UsageError) as info:
        resolve(spec)
    msg = str(info.value)
    assert repr(spec) in msg
    assert "package.module:function" in msg


def test_plugin_raising_at_import(tmp_path, monkeypatch):
    name = f"exploding_plugin_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text('raise RuntimeError("plugin exploded at import")\n'
                                         "def fn(q, k, v, **kw):\n    return q\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError) as info:
        resolve(f"{name}:fn")
    msg = str(info.value)
    assert name in msg
    assert "RuntimeError" in msg
    assert "plugin exploded at import" in msg
    assert name not in sys.modules


def test_plugin_with_syntax_error(tmp_path, monkeypatch):
    name = f"broken_syntax_plugin_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("def fn(q, k, v:\n    return q\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError) as info:
        resolve(f"{name}:fn")
    assert "SyntaxError" in str(info.value)


# --------------------------------------------------------------------------- inputs

CASE = Case("eager", "cpu", "bf16", 8, 16, 2, 3, True)


def test_make_inputs_shapes_dtype_and_flags():
    for dtype in ("fp32", "fp16", "bf16"):
        case = dataclasses.replace(CASE, dtype=dtype)
        inp = make_inputs(case)
        for t in (inp.q, inp.k, inp.v, inp.grad_out):
            assert t.shape == (2, 3, 16, 8)                  # (B, H, T, d)
            assert t.dtype == torch_dtype(dtype)
            assert t.device.type == "cpu"
            assert t.is_leaf and not t.requires_grad
        assert inp.mask is None
        assert inp.causal is True


def test_make_inputs_is_deterministic():
    a, b = make_inputs(CASE), make_inputs(CASE)
    for name in ("q", "k", "v", "grad_out"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.q, a.k) and not torch.equal(a.k, a.v)


def test_same_input_key_different_variant_same_inputs():
    a = make_inputs(CASE)
    b = make_inputs(dataclasses.replace(CASE, variant="example_plugin:my_attention"))
    assert seed_for(CASE) == seed_for(dataclasses.replace(CASE, variant="sdpa"))
    for name in ("q", "k", "v", "grad_out"):
        assert torch.equal(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("change", [dict(causal=False), dict(dtype="fp32")])
def test_inputs_differ_across_input_keys(change):
    other = dataclasses.replace(CASE, **change)
    assert other.input_key != CASE.input_key
    assert seed_for(other) != seed_for(CASE)
    a, b = make_inputs(CASE), make_inputs(other)
    assert not torch.equal(a.q.float(), b.q.float())


def test_inputs_are_standard_normal():
    inp = make_inputs(Case("eager", "cpu", "fp32", 32, 64, 1, 2, False))   # 4096 values each
    for t in (inp.q, inp.k, inp.v):
        assert abs(float(t.mean())) < 0.1
        assert abs(float(t.std()) - 1.0) < 0.1


def test_seed_is_a_31_bit_int():
    seed = seed_for(CASE)
    assert isinstance(seed, int) and 0 <= seed < 2 ** 31


def test_unknown_scenario_is_rejected():
    with pytest.raises(ValueError, match="weird"):
        make_inputs(dataclasses.replace(CASE, scenario="weird"))


def test_sdpa_backend_recorded_forced_or_dispatched():
    """Forced backends report themselves; `sdpa` reports the dispatcher's pick (CPU: flash, design.md §5)."""
    from audit.workload.torch_kernels import sdpa_dispatch_choice
    from audit.workload.variants import builtin_variants

    q = torch.randn(1, 2, 16, 8)
    table = builtin_variants()
    assert table["sdpa_math"].backend(q, q, q) == "MATH"
    assert table["sdpa_flash"].backend(q, q, q) == "FLASH_ATTENTION"
    assert table["eager"].backend is None
    assert table["sdpa"].backend is sdpa_dispatch_choice
    if not torch.cuda.is_available():
        assert sdpa_dispatch_choice(q, q, q, causal=True) == "FLASH_ATTENTION"


def test_a_plugin_declines_a_cell_with_notimplementederror_or_audit_unsupported(monkeypatch):
    """Declined cells are `skipped` with the plug-in's message, and no finding is made of them;
    another exception stays an `error` (and a cell_failed finding)."""
    from audit.analysis.findings import compute_findings
    from audit.core import records
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets

    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delitem(sys.modules, "declines", raising=False)
    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
    cache = cellcache.InputCache()
    got = {}
    for name in ("bool_masks_only", "no_causal", "float_mask_value_error"):
        for causal, scenario in ((False, "fully_masked_neginf"), (False, "fully_masked_bool"), (True, "normal")):
            case = Case(f"declines:{name}", "cpu", "fp32", 16, 64, 1, 2, causal, scenario)
            got[name, scenario] = runner.run_cell(case, cache, preset, {})
    declined = got["bool_masks_only", "fully_masked_neginf"]
    assert declined["status"] == "skipped"
    assert declined["reason"] == ("the plug-in declined this cell (NotImplementedError): additive float masks "
                                  "are not supported; pass a bool mask")
    assert got["bool_masks_only", "fully_masked_bool"]["status"] == "ok"
    assert got["bool_masks_only", "normal"]["status"] == "ok"
    assert (got["no_causal", "normal"]["status"], got["no_causal", "normal"]["reason"]) == (
        "skipped", "this kernel has no causal mode")
    assert got["no_causal", "fully_masked_bool"]["status"] == "ok"
    assert got["float_mask_value_error", "fully_masked_neginf"]["status"] == "error"
    found = compute_findings(records.to_frame(list(got.values())))
    about = {f["variant"] for f in found}
    assert "declines:bool_masks_only" not in about and "declines:no_causal" not in about
    assert any(f["check"] == "cell_failed" and f["variant"] == "declines:float_mask_value_error" for f in found)


def test_a_builtin_variants_notimplementederror_stays_an_error(monkeypatch):
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets

    def not_implemented(q, k, v, *, mask=None, causal=False, scale=None):
        raise NotImplementedError("missing kernel")

    builtin = runner.resolve("eager")
    monkeypatch.setattr(runner, "resolve", lambda name: dataclasses.replace(builtin, build=lambda: not_implemented))
    rec = runner.run_cell(Case("eager", "cpu", "fp32", 16, 64, 1, 2, False, "normal"), cellcache.InputCache(),
                          presets.presets()["quick"], {})
    assert rec["status"] == "error" and "NotImplementedError: missing kernel" in rec["reason"]


@pytest.mark.parametrize("name", ["reentrant_checkpoint", "autograd_function"])
def test_reentrant_checkpointing_and_a_custom_autograd_function_get_their_gradients_audited(monkeypatch, name):
    """torch.autograd.grad(out, (q, k, v)) refused reentrant checkpointing; the audit's backward
    (out.backward, .grad) takes both, and their gradients match the float64 golden's."""
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets

    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delitem(sys.modules, "autograd_kinds", raising=False)
    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
    cache = cellcache.InputCache()
    for scenario in ("normal", "padding"):
        rec = runner.run_cell(Case(f"autograd_kinds:{name}", "cpu", "fp32", 16, 64, 2, 2, False, scenario),
                              cache, preset, {})
        assert rec["status"] == "ok", rec["reason"]
        assert rec["fwd_bwd_ms"] > 0 and rec["grad_nan"] == 0
        assert max(rec["dq_err"], rec["dk_err"], rec["dv_err"]) < 1e-5, rec


def _control_cases(control: str, scenarios):
    spec = variants.builtin_variants()[control]
    heads, kv = (4, 2) if "gqa" in spec.requires else (2, None)
    return [Case(control, "cpu", dtype, 32, 64, 1, heads, causal, scenario, kv)
            for scenario in scenarios for dtype in ("fp32", "fp16") for causal in (False, True)]


@pytest.mark.parametrize("control", NUMERICS_CONTROLS)
def test_every_cell_of_a_scenario_a_control_declares_shows_its_defect(control):
    """Variant.reveals is what the time budget gives a control's self-check (plan.budget): each
    declared scenario must show the defect in every cell, in fp32 and fp16, causal or not: an
    error finding covers each such cell. (The referee's controls on the preset's cells, each by its
    own check alone: tests/test_referee.py.) A scenario it does not declare may not (broken.no_max_
    subtraction is right on normal inputs), which is why the budget needs the declaration."""
    from audit.analysis.findings import compute_findings
    from audit.core.records import to_frame
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets
    preset = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0,
                            max_cell_s=None, energy_window_s=0.0)
    declared = variants.builtin_variants()[control].reveals or ("normal",)
    cases = _control_cases(control, declared)
    cache = cellcache.InputCache()
    recs = [runner.run_cell(c, cache, preset, {}) for c in cases]
    assert all(r["status"] == "ok" for r in recs), [r["reason"] for r in recs]
    flagged = set()
    for f in compute_findings(to_frame(recs)):
        if f["severity"] == "error" and f["variant"] == control:
            flagged |= set(f["cells"])
    assert {c.id for c in cases} <= flagged, sorted({c.id for c in cases} - flagged)
    # the budget's self-check cells (fp32, the first declared scenario) are diagnosed too: the
    # output, or (a control with a wrong backward) the gradients
    first = [r for r in recs if r["dtype"] == "fp32" and r["scenario"] == declared[0]]
    column = {"broken.lse_base2": "lse_diagnosis", "broken.lse_no_grad": "lse_grad_diagnosis"}.get(
        control, "grad_diagnosis" if control.startswith("broken.backward_") else "diagnosis")
    assert first and all(r[column] not in (None, "none") for r in first), [(r["id"], r[column]) for r in first]


def test_the_docs_list_the_scenarios_each_control_shows_its_defect_in():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "numerics.md").read_text()
    for control in NEGATIVE_CONTROLS:
        row = next(line for line in docs.splitlines() if line.startswith(f"| `{control}` |"))
        listed = row.rstrip(" |").rsplit("|", 1)[1]
        reveals = variants.builtin_variants()[control].reveals
        assert [s.strip(" `") for s in listed.split(",")] == list(reveals) if reveals else "any" in listed, row


def test_no_max_subtraction_is_right_on_normal_inputs_so_its_self_check_needs_large_logits():
    """The must-not side of the declaration: a normal cell does not show it (so a budget giving it
    its cheapest cell whatever the scenario would prove nothing)."""
    from audit.analysis.findings import compute_findings
    from audit.core.records import to_frame
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets
    preset = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0,
                            max_cell_s=None, energy_window_s=0.0)
    cases = _control_cases("broken.no_max_subtraction", ("normal",))
    recs = [runner.run_cell(c, cellcache.InputCache(), preset, {}) for c in cases]
    errors = [f for f in compute_findings(to_frame(recs)) if f["severity"] == "error"]
    assert "normal" not in variants.builtin_variants()["broken.no_max_subtraction"].reveals
    assert errors == [], errors
