"""A platform refusal is a skip with its reason, not an error (issue 54): torch's own refusals of the
machine (core.errors.PLATFORM_REFUSALS: Inductor's CPU flex lowering without AVX2 or under
ATEN_CPU_CAPABILITY=default, ATen's bf16 flash packing without the AVX-512 capability) are recognised by
their words wherever they come from, a built-in, a plug-in or transformers; anything else stays what it
was (a plug-in's own NotImplementedError declines a cell, a built-in's is an error, other failures are
errors). The plan predicts the refusals it can know before a call."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest
import torch

from audit.core.errors import (PLATFORM_REASON, PlatformRefusal, Unsupported, platform_reason, platform_refusal,
                               refused_by_platform, skip_platform_refusals)
from audit.core.grid import Case
from audit.workload import platform_limits
from tests.helpers import platform_skipped

FLEX_WORDS = "torch.compile on current platform is not supported for CPU."


def _run_cell(monkeypatch, fn, family="plugin", name="p"):
    """One cell of `fn` as a variant of `family` through the runner (the record a run would write)."""
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets
    from audit.workload.variant_contract import Variant
    monkeypatch.setattr(runner, "resolve", lambda _: Variant(name, "test", lambda: fn, family=family))
    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
    return runner.run_cell(Case("eager", "cpu", "fp32", 16, 32, 1, 2, False, "normal"), cellcache.InputCache(),
                           preset, {})


def _inductor_chain() -> Exception:
    """The exceptions Inductor raises for a refused lowering, chained as torch 2.13 chains them: a
    NotImplementedError in the lowering, a LoweringException and an InductorError each `from None`
    of it (the context kept, suppressed) and each repeating its message."""
    try:
        try:
            try:
                raise NotImplementedError(FLEX_WORDS)
            except NotImplementedError as inner:
                raise RuntimeError(f"NotImplementedError: {inner}\n  target: flex_attention") from None
        except RuntimeError as lowering:
            raise RuntimeError(f"LoweringException: {lowering}") from None
    except RuntimeError as outer:
        return outer


# --------------------------------------------------------------------------- recognising the words


def test_torch_s_refusals_are_recognised_with_torch_s_sentence_and_why():
    reason = platform_refusal(_inductor_chain())
    assert reason == platform_reason(FLEX_WORDS)
    assert reason.startswith(f"{PLATFORM_REASON}: {FLEX_WORDS} (") and "AVX2" in reason and refused_by_platform(reason)
    vnni = platform_refusal(RuntimeError("pack_vnni2 is only supported when avx512 is supported"))
    assert vnni.startswith(f"{PLATFORM_REASON}: pack_vnni2 is only supported") and "AVX-512" in vnni
    brgemm = RuntimeError("BFloat16 Brgemm VNNI format is only supported on X64 when oneDNN ukernel is enabled "
                          "and `amx` is supported")
    assert "AMX" in platform_refusal(brgemm)
    try:                                                            # through `raise ... from`
        raise ValueError("the plug-in's wrapper") from RuntimeError("pack_vnni2 is only supported when avx512 "
                                                                    "is supported")
    except ValueError as wrapped:
        assert platform_refusal(wrapped) == vnni


@pytest.mark.parametrize("exc", [
    NotImplementedError("missing kernel"),                                     # a plug-in's own refusal
    RuntimeError("cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph: "
                 "not supported"),                                              # "not supported" alone
    ValueError("Mixed query, key, and value dtype is not supported on this platform, got query.dtype: "
               "torch.float16, key.dtype: torch.float32"),                     # the caller's inputs, not the machine
    RuntimeError("platform"),
], ids=["own_notimplemented", "cudnn_not_supported", "mixed_dtypes", "platform_word"])
def test_other_failures_are_no_platform_refusal(exc):
    assert platform_refusal(exc) is None
    with pytest.raises(type(exc)), skip_platform_refusals():
        raise exc


def test_a_failure_while_handling_a_refusal_is_not_one():
    """A plug-in that falls back after torch's refusal and fails in its fallback: its bug, an error."""
    def fallback():
        try:
            raise _inductor_chain()
        except RuntimeError:
            raise IndexError("the fallback's own bug")
    with pytest.raises(IndexError), skip_platform_refusals():
        fallback()


def test_skip_platform_refusals_raises_an_unsupported_from_the_refusal():
    with pytest.raises(PlatformRefusal) as got, skip_platform_refusals():
        raise _inductor_chain()
    assert isinstance(got.value, Unsupported) and str(got.value) == platform_reason(FLEX_WORDS)
    assert got.value.__cause__ is not None


# --------------------------------------------------------------------------- cells


def test_a_plugin_meeting_inductor_s_refusal_in_its_compiled_call_is_skipped_with_torch_s_words(monkeypatch):
    """The real thing: a plug-in's torch.compile'd flex_attention, Inductor's flex lowering told this CPU
    is not supported (what ATEN_CPU_CAPABILITY=default or a CPU without AVX2 makes it say)."""
    from torch._inductor.kernel.flex import flex_cpu
    from torch.nn.attention.flex_attention import flex_attention
    monkeypatch.setattr(flex_cpu, "check_cpu_supported", lambda: False)
    compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)

    def compiles_flex(q, k, v, *, mask=None, causal=False, scale=None):
        return compiled(q.detach(), k.detach(), v.detach(), scale=scale)     # no flex backward on the CPU

    rec = _run_cell(monkeypatch, compiles_flex)
    assert (rec["status"], rec["reason"]) == ("skipped", platform_reason(FLEX_WORDS)), rec["reason"]
    assert platform_skipped(rec) and rec["rmse"] is None


@pytest.mark.parametrize("family", ["plugin", "sdpa"])
def test_a_refusal_from_any_variant_is_a_skip_and_its_other_failures_stay_errors(monkeypatch, family):
    def refused(q, k, v, *, mask=None, causal=False, scale=None):
        raise RuntimeError("pack_vnni2 is only supported when avx512 is supported")

    def own_notimplemented(q, k, v, *, mask=None, causal=False, scale=None):
        raise NotImplementedError("missing kernel")

    def broken(q, k, v, *, mask=None, causal=False, scale=None):
        raise RuntimeError("this kernel is not supported here")

    rec = _run_cell(monkeypatch, refused, family)
    assert rec["status"] == "skipped" and rec["reason"].startswith(f"{PLATFORM_REASON}: pack_vnni2"), rec["reason"]
    rec = _run_cell(monkeypatch, own_notimplemented, family)       # the contract: a plug-in declines, a built-in errs
    assert (rec["status"], platform_skipped(rec)) == ("skipped" if family == "plugin" else "error", False)
    assert "missing kernel" in rec["reason"]
    rec = _run_cell(monkeypatch, broken, family)
    assert rec["status"] == "error" and "this kernel is not supported here" in rec["reason"]


def test_built_in_compiled_flex_refuses_such_a_cpu_before_compiling_and_the_plan_predicts_it(monkeypatch):
    """Where Inductor's flex lowering refuses this CPU, flex and paged_flex say so before a compile that
    takes a second or more to fail, in torch's words; the plan predicts those cells (hf:flex_attention's
    too) as skipped, so a budget buys nothing of them; the other variants run as before."""
    from audit.plan.costmodel import CostModel
    from audit.plan.priors import load_priors
    from audit.plan.settings import Settings
    from audit.workload.compiling import compiled_graph_count
    monkeypatch.setattr(platform_limits, "flex_cpu_supported", lambda: False)
    words = platform_reason(FLEX_WORDS)
    graphs = compiled_graph_count()
    rec = _run_flex(monkeypatch)
    assert (rec["status"], rec["reason"]) == ("skipped", words) and compiled_graph_count() == graphs
    refused = ("flex", "paged_flex", "hf:flex_attention")
    cases = [Case(v, "cpu", "fp32", 16, 256, 1, 2, False, "paged" if v == "paged_flex" else "normal")
             for v in (*refused, "sdpa", "flex_eager", "compiled")]
    plan = CostModel(load_priors()).predict(cases, Settings(arguments=False), {}, {}).set_index("variant")
    for variant in refused:
        assert (plan.loc[variant, "status"], plan.loc[variant, "reason"]) == ("skipped", words), variant
        assert plan.loc[variant, "compile"] == 0, variant
    assert (plan.loc[["sdpa", "flex_eager", "compiled"], "status"] == "ok").all()
    assert plan.loc["compiled", "compile"] > 0
    assert platform_limits.predicted_refusal("flex", "cuda:0") is None


def _run_flex(monkeypatch):
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets, variants
    monkeypatch.setattr(runner, "resolve", variants.resolve)
    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
    return runner.run_cell(Case("flex", "cpu", "fp32", 16, 32, 1, 2, True, "normal"), cellcache.InputCache(),
                           preset, {})


def test_the_plan_predicts_nothing_of_a_cpu_inductor_compiles_flex_for(monkeypatch):
    monkeypatch.setattr(platform_limits, "flex_cpu_supported", lambda: True)
    assert platform_limits.predicted_refusal("flex", "cpu") is None


# --------------------------------------------------------------------------- torch's own check


def test_the_cheap_check_agrees_with_torch_s_own_here_and_under_the_default_capability():
    """platform_limits.flex_cpu_supported mirrors torch's check_cpu_supported (which costs an import of
    Inductor): the same answer in this process and in one under ATEN_CPU_CAPABILITY=default (False)."""
    from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported
    assert platform_limits.flex_cpu_supported() == check_cpu_supported()
    code = ("import torch; from audit.workload.platform_limits import flex_cpu_supported; "
            "from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported; "
            "print(torch.backends.cpu.get_cpu_capability(), flex_cpu_supported(), check_cpu_supported())")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["DEFAULT", "False", "False"], out.stdout


def test_a_cell_that_patches_the_clock_and_is_refused_leaves_the_next_cell_a_true_clock(monkeypatch):
    """A variant that replaces time.perf_counter and then meets a refusal (ATEN_CPU_CAPABILITY=default's
    pack_vnni2 on bf16 SDPA did this to the patches_timer control): the patch is put back when the cell
    ends, so the next cell's times are the audit's and its timers_untouched check passes."""
    from audit.measure.referee import timers
    timers.pin_timers()
    real = time.perf_counter

    def patches_then_refused(q, k, v, *, mask=None, causal=False, scale=None):
        time.perf_counter = lambda: real() / 2
        raise RuntimeError("pack_vnni2 is only supported when avx512 is supported")

    def honest(q, k, v, *, mask=None, causal=False, scale=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    try:
        rec = _run_cell(monkeypatch, patches_then_refused)
        assert rec["status"] == "skipped" and platform_skipped(rec), rec["reason"]
        assert time.perf_counter is real
        rec = _run_cell(monkeypatch, honest, name="q")
        assert rec["status"] == "ok" and rec["referee_detail"] is None, rec["referee_detail"]
    finally:
        time.perf_counter = real
