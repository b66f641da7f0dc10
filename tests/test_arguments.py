"""Every argument a kernel is handed is checked to do something (audit/measure/checks/arguments.py): each
argument control is caught by the probe of its argument in every dtype it runs in and named by it;
every built-in honours what it is handed; the rule's statuses; the probes' documents stay per row;
a plug-in that declares no scale refuses the probe instead of failing it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from audit.analysis.argument_rules import argument_summary, check_arguments
from audit.core.grid import Case
from audit.core.records import to_frame
from audit.execute import runner
from audit.measure.cell import cellcache
from audit.measure.checks.arguments import INFORMATIVE, judge
from audit.workload import presets
from audit.workload.argument_controls import ARGUMENT_CONTROL_CELLS, ARGUMENT_CONTROLS
from audit.workload.arguments import ARGUMENTS, probed_arguments, shifted_documents
from tests.helpers import emulated_cpu_kind

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds

PLUGINS = Path(__file__).resolve().parent / "plugins"
PRESET = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0, max_cell_s=None,
                        energy_window_s=0.0)


def _run(cases: list[Case]) -> list[dict]:
    cache = cellcache.InputCache()
    return [runner.run_cell(c, cache, PRESET, {}) for c in cases]


@pytest.fixture(scope="module")
def controls_run():
    """Each argument control on the scenarios it is declared for, in fp32, bf16 and fp16, causal or not."""
    cases = [Case(f"broken.{name}", "cpu", dtype, 16, 32, 1, 2, causal, scenario)
             for name, (scenarios, _) in ARGUMENT_CONTROL_CELLS.items() for scenario in scenarios
             for dtype in ("fp32", "bf16", "fp16") for causal in (False, True)]
    return _run(cases)


@pytest.mark.parametrize("name", list(ARGUMENT_CONTROLS))
def test_each_argument_control_is_caught_in_every_cell_and_dtype_by_its_arguments_probe(controls_run, name):
    argument = ARGUMENT_CONTROLS[name][0]
    mine = [r for r in controls_run if r["variant"] == f"broken.{name}"]
    assert mine and all(r["status"] == "ok" for r in mine), [(r["id"], r["reason"]) for r in mine]
    assert {r["dtype"] for r in mine} == {"fp32", "bf16", "fp16"}
    for r in mine:
        assert r["arguments"][argument] == "ignored", (r["id"], r["arguments"], r["argument_evidence"])
    found = [f for f in check_arguments(to_frame(mine)) if f["variant"] == f"broken.{name}"]
    assert [(f["argument"], f["diagnosis"]) for f in found] == [(argument, f"{argument}_ignored")]
    assert set(found[0]["cells"]) == {r["id"] for r in mine}
    assert f"ignores its `{argument}` argument" in found[0]["message"] and "Diagnosis: in" in found[0]["message"]


def test_the_scale_and_softcap_controls_are_right_wherever_their_argument_has_its_usual_value(controls_run):
    """What makes them controls of this check: no other finding covers them."""
    for name in ("scale_ignored", "softcap_fixed"):
        mine = [r for r in controls_run if r["variant"] == f"broken.{name}"]
        assert all(r["within_budget"] for r in mine), [(r["id"], r["err_ratio"]) for r in mine]


@pytest.fixture(scope="module")
def builtins_run():
    """Every uncompiled built-in on each probed scenario it takes in fp32, and on normal in bf16 too;
    compiled_unfused on a causal normal and softcap cell, its scale probed on the one and its cap on the
    other (a compiled variant's probes are recompiles, 3-4 s each here: not repeated per causal flag;
    flex's probes are in the quick preset's run: tests/test_findings_stable.py).

    Causal and not where the probes meet the causal flag: normal (the causal probe flips it either way)
    and padding (the mask probe beside a causal mask or none); elsewhere a scenario's probes are the same
    either way (workload/arguments.probed_arguments), so one causal cell each. Every cell is run again
    under each emulated CPU kind but flex_eager's and compiled_unfused's, run natively only: their probes
    are Dynamo traces (0.1-0.3 s each) and recompiles, half of what an emulated kind spent here, and an
    emulated kind changes the last bits of a kernel's output, which a probe's decision stands far from
    (a probe moves the output by its whole size: test_the_rule_of_a_probe); the ATen kernels it does
    change are the uncompiled built-ins, run under every kind."""
    native = emulated_cpu_kind() is None
    real = ("eager", "eager_fp32", "sdpa", "sdpa_math", "sdpa_flash", "flash_op", "packed_loop",
            *(("flex_eager",) if native else ()))
    scenarios = ("normal", "padding", "sliding_window", "softcap", "sinks", "sinks_prefill", "sinks_decode", "packed")
    both_ways = ("normal", "padding")
    cases = [Case(v, "cpu", dtype, 16, 32, 2, 2, causal, s) for v in real for s in scenarios
             for dtype in (("fp32", "bf16") if s == "normal" else ("fp32",))
             for causal in ((False, True) if s in both_ways else (s != "sinks_decode",))]
    if native:
        cases += [Case("compiled_unfused", "cpu", "fp32", 16, 32, 1, 2, True, s) for s in ("normal", "softcap")]
    return _run(cases)


def test_every_builtin_honours_every_argument_it_is_handed(builtins_run):
    ok = [r for r in builtins_run if r["status"] == "ok"]
    probed = [r for r in ok if r["arguments"]]
    assert len(probed) > 60
    bad = [(r["id"], name, status) for r in probed for name, status in r["arguments"].items()
           if status not in ("honoured", "refused")]
    assert bad == []
    assert check_arguments(to_frame(ok)) == []
    summary = argument_summary(to_frame(ok))
    assert set(summary["eager"]) == {"scale", "lse", "causal", "mask", "softcap", "sinks"}
    assert set(summary["packed_loop"]) >= {"cu_seqlens", "scale", "causal"}
    if emulated_cpu_kind() is None:            # run natively only (builtins_run)
        assert summary["compiled_unfused"] == {"scale": "honoured", "softcap": "honoured"}   # causal: not flipped
        assert {"scale", "softcap"} <= set(summary["flex_eager"])
    assert {"scale", "causal", "mask"} <= set(summary["sdpa"])


@pytest.mark.parametrize("moved, golden_moved, err, tol, right, status", [
    (1.0, 1.0, 0.01, 0.01, True, "honoured"),
    (0.001, 1.0, 1.0, 0.01, True, "ignored"),
    (0.5, 1.0, 0.5, 0.01, True, "misapplied"),
    (0.5, 1.0, 0.5, 0.01, False, "unjudged"),
    (0.001, 1.0, 1.0, 0.01, False, "ignored"),            # ignoring is told even on a wrong cell
    (0.0, INFORMATIVE * 0.01, 0.0, 0.01, True, "uninformative"),
    (0.0, float("nan"), 0.0, 0.01, True, "uninformative"),
])
def test_the_rule_of_a_probe(moved, golden_moved, err, tol, right, status):
    assert judge(moved, golden_moved, err, tol, right) == status


def test_probed_arguments_follow_the_scenario_the_length_and_compiling():
    case = Case("eager", "cpu", "fp32", 16, 256, 1, 2, False, "normal")
    assert probed_arguments(case, compiled=False) == ("scale", "causal")
    assert probed_arguments(case, compiled=True) == ("scale",)
    assert probed_arguments(Case("eager", "cpu", "fp32", 16, 512, 1, 2, False, "normal"), False) == ()
    assert probed_arguments(Case("eager", "cuda", "fp32", 16, 1024, 1, 2, False, "normal"), False) == ("scale", "causal")
    assert probed_arguments(Case("eager", "cpu", "fp32", 16, 64, 1, 2, False, "packed"), False) == ("mask", "cu_seqlens")
    assert probed_arguments(Case("eager", "cpu", "fp32", 16, 64, 1, 2, False, "outliers"), False) == ()
    assert all(a.scenarios for a in ARGUMENTS.values())


def test_the_documents_probe_moves_boundaries_within_their_rows():
    cu = torch.tensor([0, 12, 12, 13, 23, 32, 42, 42, 43, 52, 60], dtype=torch.int32)
    moved = shifted_documents(cu, 32)
    assert moved.dtype == torch.int32 and moved[0] == 0 and moved[-1] == 60
    assert moved.tolist() == [0, 14, 14, 15, 25, 32, 44, 44, 45, 54, 60]   # 32, a row's start, stays
    assert bool((moved[1:] >= moved[:-1]).all())
    end_of_row = torch.tensor([0, 31, 64], dtype=torch.int32)
    assert shifted_documents(end_of_row, 32).tolist() == [0, 32, 64]           # never past its row's end


def test_a_plugin_that_declares_no_scale_refuses_the_probe_and_is_not_flagged():
    """audit.adapt without scale_arg: a non-default scale is Unsupported for it, so the probe is
    refused (no finding), and its other probes still run."""
    sys.path.insert(0, str(PLUGINS))
    try:
        import audit
        from standins import flash_attn_func

        no_scale = audit.adapt(flash_attn_func, layout="bthd", causal="bottom-right", causal_arg="causal",
                               scale_arg=None, gqa=True)
        from audit.measure.cell import measurement
        from audit.workload.inputs import make_inputs
        from audit.workload.variant_contract import Variant
        case = Case("p", "cpu", "fp32", 16, 32, 1, 2, False, "normal")
        inputs = make_inputs(case)
        ref = cellcache.build_reference(case, inputs)
        cols = measurement.measure_cell(case, Variant("p", "plug-in", lambda: no_scale, family="plugin"), inputs,
                                        ref, PRESET)
    finally:
        sys.path.remove(str(PLUGINS))
    assert cols["arguments"] == {"scale": "refused", "causal": "honoured"}
    assert "scale argument" in cols["argument_evidence"]["scale"]["reason"]


def test_a_plugin_without_the_scale_keyword_refuses_the_probe_and_one_that_raises_fails_it():
    """The cells hand `scale` only where it is not the default, so a plug-in may have no such keyword:
    its probe is refused, naming it. Another TypeError is the probe's failure, with its reason."""
    from audit.measure.cell import measurement
    from audit.workload.inputs import make_inputs
    from audit.workload.variant_contract import Variant

    def no_scale(q, k, v, *, mask=None, causal=False):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    def breaks(q, k, v, *, mask=None, causal=False, scale=None):
        if scale is not None:
            raise TypeError("unsupported operand type(s) for *: 'float' and 'NoneType'")
        return no_scale(q, k, v, mask=mask, causal=causal)

    case = Case("p", "cpu", "fp32", 16, 32, 1, 2, False, "normal")
    inputs = make_inputs(case)
    ref = cellcache.build_reference(case, inputs)
    got = {}
    for fn in (no_scale, breaks):
        got[fn.__name__] = measurement.measure_cell(case, Variant("p", "plug-in", lambda f=fn: f, family="plugin"),
                                                    inputs, ref, PRESET)
    assert got["no_scale"]["arguments"] == {"scale": "refused", "causal": "honoured"}
    assert "takes no `scale` argument" in got["no_scale"]["argument_evidence"]["scale"]["reason"]
    assert got["breaks"]["arguments"]["scale"] == "failed"
    assert "argument probe scale failed: TypeError" in got["breaks"]["reason"]


# --------------------------------------------------------------------------- what a kernel must refuse

@pytest.fixture(scope="module")
def heads_run():
    """Every uncompiled built-in on a normal cell of 4 query heads (2 kv heads) and a plug-in that pairs
    any head counts (query head h reads kv head h · Hkv // H): the kv_heads probe hands each 3 kv heads."""
    real = ("eager", "eager_fp32", "sdpa", "sdpa_math", "flash_op", "flex_eager", "packed_loop")
    cases = [Case(v, "cpu", "fp32", 16, 32, 1, 4, causal, "normal", 2) for v in real for causal in (False, True)]
    records = _run(cases)
    from audit.measure.cell import measurement
    from audit.workload.inputs import make_inputs
    from audit.workload.variant_contract import Variant

    def any_heads(q, k, v, *, mask=None, causal=False, scale=None):
        pairing = torch.arange(q.shape[1]) * k.shape[1] // q.shape[1]                # (H,) a kv head per query head
        return torch.nn.functional.scaled_dot_product_attention(q, k[:, pairing], v[:, pairing], attn_mask=mask,
                                                                is_causal=causal, scale=scale)
    case = Case("any_heads", "cpu", "fp32", 16, 32, 1, 4, False, "normal", 2)
    inputs = make_inputs(case)
    cols = measurement.measure_cell(case, Variant("any_heads", "plug-in", lambda: any_heads, family="plugin",
                                                  causal_alignment="top-left"), inputs,
                                    cellcache.build_reference(case, inputs), PRESET)
    records.append({"id": case.id, "variant": "any_heads", "status": "ok", "dtype": "fp32", "scenario": "normal",
                    **cols})
    return records


def test_only_a_kernel_that_computes_undividing_heads_is_flagged(heads_run):
    statuses = {(r["variant"], r["causal"] if "causal" in r else False): r["arguments"]["kv_heads"] for r in heads_run}
    refusing = {v for (v, _), s in statuses.items() if s == "honoured"}
    assert refusing == {"eager", "eager_fp32", "sdpa", "sdpa_math", "flex_eager", "packed_loop"}
    # torch 2.13's CPU flash op computes it, head 3 reading past k and v (docs/upstream/flash_op_cpu_...)
    assert {v for (v, _), s in statuses.items() if s == "accepted"} == {"flash_op", "any_heads"}
    evidence = next(r for r in heads_run if r["variant"] == "any_heads")["argument_evidence"]["kv_heads"]
    assert evidence == {"heads": 4, "kv_heads": 3, "returned": [1, 4, 32, 16]}
    found = {f["variant"]: f for f in check_arguments(to_frame(heads_run))}
    assert set(found) == {"flash_op", "any_heads"}
    assert found["any_heads"]["diagnosis"] == "kv_heads_accepted"
    assert "computes an output where it must refuse" in found["any_heads"]["message"]
    assert "4 query heads against 3 key/value heads" in found["any_heads"]["message"]


def test_the_kv_heads_probe_needs_three_query_heads_and_no_compile():
    assert "kv_heads" in probed_arguments(Case("eager", "cpu", "fp32", 16, 32, 1, 3, False, "normal"), False)
    assert "kv_heads" not in probed_arguments(Case("eager", "cpu", "fp32", 16, 32, 1, 2, False, "normal"), False)
    assert "kv_heads" not in probed_arguments(Case("compiled", "cpu", "fp32", 16, 32, 1, 4, False, "normal"), True)
