"""The log-sum-exp a variant returns and attention sinks (measure.checks.lse: lse_error, lse_merge,
lse_grads, sink_grad; measure.diagnosis.lse_diagnosis; workload.lse_mistakes): each check on a kernel that
must trigger it and on one that must not, each lse mistake named on a kernel making it
(tests/plugins/lse_kernels.py) and on no correct one, the merge's arithmetic, the sinks'
golden, the declarations (plug-in attributes, audit.adapt, hf:), the negative controls."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import audit
from audit.analysis.findings import compute_findings
from audit.core.errors import UsageError
from audit.core.grid import Case
from audit.core.records import to_frame
from audit.execute import runner
from audit.measure.cell import cellcache
from audit.measure.golden.lse import classify_lse_rows, keys_only_lse, merge_partials
from audit.measure.golden.reference import golden_attention
from audit.workload import presets, variants
from audit.workload.inputs import make_inputs
from audit.workload.plugins import declared_returns
from audit.workload.lse_mistakes import LSE_GRAD_MISTAKES, LSE_MISTAKES
from tests.helpers import run_cells

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds

PLUGINS = Path(__file__).resolve().parent / "plugins"
PRESET = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0, max_cell_s=None,
                        energy_window_s=0.0)


def run(cases):
    return run_cells(cases, PRESET)


def cell(variant, scenario="normal", dtype="fp32", causal=False, heads=4, kv=None, t=32):
    return Case(variant, "cpu", dtype, 16, t, 2, heads, causal, scenario, kv)


# --------------------------------------------------------------------------- the merge's arithmetic

def test_merging_two_halves_gives_the_whole_and_an_empty_half_weighs_nothing():
    torch.manual_seed(0)
    s = torch.randn(1, 2, 5, 8, dtype=torch.float64)                            # scores (B, H, Tq, Tk)
    v = torch.randn(1, 2, 8, 3, dtype=torch.float64)
    s[0, 0, 1, 4:] = -math.inf                                                  # row 1 sees no key of half 2

    def part(cols):
        p = torch.softmax(s[..., cols], -1)
        return torch.nan_to_num(p) @ v[:, :, cols], torch.logsumexp(s[..., cols], -1)
    whole = torch.softmax(s, -1) @ v
    out, lse = merge_partials(part(slice(0, 4)), part(slice(4, 8)))
    torch.testing.assert_close(out, whole)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))
    # FlashAttention-2's +inf for an empty part is read as empty too; a 0 is not
    o2, l2 = part(slice(4, 8))
    l2 = l2.clone()
    l2[0, 0, 1] = math.inf
    torch.testing.assert_close(merge_partials(part(slice(0, 4)), (o2, l2))[0], whole)
    l2[0, 0, 1] = 0.0
    assert not torch.allclose(merge_partials(part(slice(0, 4)), (o2, l2))[0], whole)


def test_the_lse_on_rows_that_see_no_key_is_classified():
    empty = torch.tensor([[[True, False, True]]])                                # (1, 1, Tq)
    assert classify_lse_rows(torch.tensor([[[-math.inf, 2.0, -math.inf]]]), empty) == "-inf"
    assert classify_lse_rows(torch.tensor([[[0.0, 2.0, 0.0]]]), empty) == "zero"
    assert classify_lse_rows(torch.tensor([[[0.0, 2.0, math.nan]]]), empty) == "mixed"
    assert classify_lse_rows(torch.tensor([[[0.0, 2.0, 0.0]]]), torch.zeros_like(empty)) is None


def test_an_lse_that_counts_the_sink_is_taken_back_to_the_keys_alone():
    lse, sinks = torch.tensor([[[1.0, 3.0]]], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64)
    with_sink = torch.logaddexp(lse, sinks.view(1, -1, 1))
    torch.testing.assert_close(keys_only_lse(with_sink, sinks, True), lse)
    torch.testing.assert_close(keys_only_lse(with_sink, sinks, False), with_sink)


# --------------------------------------------------------------------------- the sinks' golden

def test_a_sink_takes_a_share_of_every_row_and_all_of_a_row_that_sees_no_key():
    inputs = make_inputs(cell("eager", "sinks", heads=4))
    g = golden_attention(inputs.q, inputs.k, inputs.v, grad_out=inputs.grad_out, visible=inputs.visible,
                         sinks=inputs.sinks)
    plain = golden_attention(inputs.q, inputs.k, inputs.v, visible=inputs.visible)
    empty = ~g.row_visible[0, 0]                                                # (Tq,)
    assert bool(empty.any()) and bool((g.out[:, :, empty] == 0).all())          # all weight on the sink
    # per head: the sink above every score changes out the most, the -30 one not at all
    change = (g.out - plain.out)[:, :, ~empty].abs().amax(dim=(0, 2, 3))       # (H,)
    assert change[0] > 0.5 and change[2] < 1e-9 and change[1] > 1e-2
    # its gradient is the float64 autograd of the sinks' softmax column: nonzero where it weighs
    assert g.dsinks is not None and g.dsinks.shape == (4,) and abs(float(g.dsinks[2])) < 1e-9
    assert abs(float(g.dsinks[0])) > 1e-3


# --------------------------------------------------------------------------- the checks, both ways

@pytest.fixture(scope="module")
def lse_run():
    """Each plug-in of tests/plugins/lse_kernels.py, eager, flash_op and the controls on fp32 cells
    (GQA 4/2, causal and not, normal, padding and sinks)."""
    names = ["lse_kernels:" + n for n in ("correct", "lse_base2", "lse_unscaled_max", "lse_first_head_of_group",
                                          "lse_empty_rows_zero", "lse_no_grad", "lse_includes_sink")]
    cases = [cell(v, scenario, causal=causal, kv=2) for v in names + ["eager", "flash_op", "broken.lse_base2",
                                                                      "broken.lse_no_grad", "broken.sink_ignored"]
             for scenario in ("normal", "padding", "sinks") for causal in (False, True)]
    recs = run(cases)
    return recs, compute_findings(to_frame(list(recs.values())))


def _records(lse_run, variant):
    return [r for r in lse_run[0].values() if r["variant"] == variant and r["status"] == "ok"]


@pytest.mark.parametrize("variant", ["lse_kernels:correct", "lse_kernels:lse_includes_sink", "eager"])
def test_a_right_lse_is_within_every_budget_and_gets_no_finding(lse_run, variant):
    recs = _records(lse_run, variant)
    assert recs
    for r in recs:
        assert r["lse_within_budget"] is True and r["merge_within_budget"] is True, r["id"]
        assert r["lse_grads_within_budget"] is True and r["lse_differentiable"] is True, r["id"]
        assert r["lse_err_ratio"] < 3 and r["merge_err_ratio"] < 3
    assert not [f for f in lse_run[1] if f["variant"] == variant and f["severity"] != "info"]


@pytest.mark.parametrize("variant, mistake, check", [
    ("lse_kernels:lse_base2", "lse_base2", "lse_error_budget"),
    ("lse_kernels:lse_unscaled_max", "lse_unscaled_max", "lse_error_budget"),
    ("lse_kernels:lse_first_head_of_group", "lse_first_head_of_group", "lse_error_budget"),
    ("lse_kernels:lse_empty_rows_zero", "lse_empty_rows_zero", "lse_error_budget"),
    ("lse_kernels:lse_no_grad", "lse_no_grad", "lse_grad_budget"),
    ("broken.lse_base2", "lse_base2", "lse_error_budget"),
    ("broken.lse_no_grad", "lse_no_grad", "lse_grad_budget"),
    ("flash_op", "lse_empty_rows_zero", "lse_error_budget"),
])
def test_a_wrong_lse_is_an_error_finding_naming_its_mistake(lse_run, variant, mistake, check):
    found = [f for f in lse_run[1] if f["variant"] == variant and f["check"] == check]
    assert len(found) == 1 and found[0]["severity"] == "error", [f["check"] for f in lse_run[1]
                                                                  if f["variant"] == variant]
    assert found[0]["diagnosis"] == mistake, found[0]["message"]
    assert all(r["within_budget"] is True for r in _records(lse_run, variant) if r["scenario"] != "sinks"
               or variant != "broken.sink_ignored")                             # out itself is right


def test_an_lse_with_no_gradient_is_named_by_the_gradient_check_alone(lse_run):
    for r in _records(lse_run, "lse_kernels:lse_no_grad"):
        assert r["lse_differentiable"] is False and r["lse_grads_within_budget"] is False
        assert r["lse_within_budget"] is True and r["merge_within_budget"] is True
    assert all(r["lse_differentiable"] is False for r in _records(lse_run, "flash_op")
               if r["lse_differentiable"] is not None)                          # torch marks its lse so


def test_the_merge_catches_an_lse_whose_value_is_right_where_it_is_compared(lse_run):
    """lse 0 on a row that sees no key: the lse check compares rows that see a key, and a causal
    cell has none empty; its halves do, and the merge shows it."""
    recs = {(r["scenario"], r["causal"]): r for r in _records(lse_run, "lse_kernels:lse_empty_rows_zero")}
    assert recs[("normal", True)]["lse_within_budget"] is True
    assert recs[("normal", True)]["merge_within_budget"] is False
    assert recs[("normal", False)]["merge_within_budget"] is True             # no empty row in a half


def test_sinks_ignored_are_flagged_with_their_gradient_and_named(lse_run):
    recs = _records(lse_run, "broken.sink_ignored")
    assert recs and all(r["scenario"] == "sinks" for r in recs)                 # requires sinks: nothing else
    # without its sink a row that sees no key is NaN (softmax of nothing): its gradients are the
    # nonfinite check's; sinks_decode (below) has no such row, and the sinks' gradient is judged
    assert all(r["within_budget"] is False and r["grad_nan"] > 0 for r in recs)
    decode = run([cell("broken.sink_ignored", "sinks_decode", kv=2)])
    assert all(r["dsinks_within_budget"] is False and r["within_budget"] is False for r in decode.values())
    named = {f["diagnosis"] for f in lse_run[1] if f["variant"] == "broken.sink_ignored" and f.get("diagnosis")}
    assert "sink_ignored" in named
    for r in _records(lse_run, "eager"):
        if r["scenario"] == "sinks":
            assert r["dsinks_within_budget"] is True and r["dsinks_err"] < 1e-5


def test_a_variant_without_sinks_is_skipped_with_the_reason():
    recs = run([cell("sdpa", "sinks"), cell("flash_op", "sinks"), cell("flex", "sinks")])
    for r in recs.values():
        assert r["status"] == "skipped", r
    assert "no sink argument" in recs[cell("sdpa", "sinks").id]["reason"]
    assert "cannot return the log-sum-exp" in recs[cell("flex", "sinks").id]["reason"]


def test_a_variant_declaring_out_lse_that_returns_out_alone_is_a_contract_error():
    rec = run([cell("lse_kernels:not_a_pair")])[cell("lse_kernels:not_a_pair").id]
    assert rec["status"] == "error" and "declares it returns (out, lse)" in rec["reason"], rec["reason"]


def test_every_lse_mistake_has_a_kernel_making_it_here():
    names = set(LSE_MISTAKES) | set(LSE_GRAD_MISTAKES)
    sys.path.insert(0, str(PLUGINS))
    try:
        import importlib
        module = importlib.import_module("lse_kernels")
    finally:
        sys.path.remove(str(PLUGINS))
    assert all(callable(getattr(module, n, None)) for n in names), names


# --------------------------------------------------------------------------- declarations

def test_a_plugin_declaring_an_unknown_return_is_a_usage_error(monkeypatch):
    def fn(q, k, v, **kw):
        return q
    fn.audit_returns = "lse"
    with pytest.raises(UsageError, match="audit_returns is 'lse'; allowed: out, out_lse"):
        declared_returns("--variant: x", fn)


def test_adapt_converts_a_base_2_lse_and_its_layout():
    def kernel(q, k, v, scale=None):                                            # (B, T, H, d), lse (B, T, H) base 2
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)
        return out.transpose(1, 2), lse.transpose(1, 2) / math.log(2.0)
    adapted = audit.adapt(kernel, layout="bthd", causal=None, causal_arg=None, returns="out_lse",
                          lse_layout="bth", lse_base=2)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    out, lse = adapted(q, k, v)
    torch.testing.assert_close(lse, torch.logsumexp((q @ k.transpose(-2, -1)) * 0.5, -1), rtol=1e-5, atol=1e-5)
    assert adapted.audit_returns == "out_lse"
    with pytest.raises(UsageError, match="lse_base"):
        audit.adapt(kernel, lse_base=2)                                        # a base without returns="out_lse"


def test_adapt_folds_causal_into_the_mask_for_a_kernel_that_refuses_both():
    """SDPA's math rule, as diffusers' _native_math keeps it: causal_with_mask=False runs the
    causal + padding cells; the default passes both and the kernel raises."""
    math_sdpa = torch.ops.aten._scaled_dot_product_attention_math   # (out, weights); its masks: additive
    refuses = audit.adapt(math_sdpa, causal_arg="is_causal", masks=("additive",), returns="first",
                          causal_with_mask=False)
    passes_both = audit.adapt(math_sdpa, causal_arg="is_causal", masks=("additive",), returns="first")
    inputs = make_inputs(cell("x", "padding", causal=True))
    with torch.no_grad():
        out = refuses(inputs.q, inputs.k, inputs.v, mask=inputs.mask, causal=True)
        want = variants.resolve("eager").build()(inputs.q, inputs.k, inputs.v, mask=inputs.mask, causal=True)[0]
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        with pytest.raises(RuntimeError):
            passes_both(inputs.q, inputs.k, inputs.v, mask=inputs.mask, causal=True)


def test_adapt_passes_sinks_to_the_declared_argument():
    seen = {}

    def kernel(q, k, v, learnable_sink=None, causal=False, scale=None):
        seen["sink"] = learnable_sink
        return q
    adapted = audit.adapt(kernel, sink_arg="learnable_sink")
    sinks = torch.tensor([1.0, 2.0])
    adapted(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), sinks=sinks)
    assert seen["sink"] is sinks and "sinks" in adapted.audit_supports
    assert "sinks" not in audit.adapt(kernel).audit_supports


hf = pytest.importorskip("transformers")


def test_gpt_oss_eager_takes_sinks_and_llama_eager_is_skipped():
    recs = run([cell("hf:gpt_oss.eager", "sinks", dtype=dtype, causal=True) for dtype in ("fp32", "bf16")]
               + [cell("hf:eager", "sinks"), cell("hf:gpt_oss.eager", "normal")])
    for dtype in ("fp32", "bf16"):
        r = recs[cell("hf:gpt_oss.eager", "sinks", dtype=dtype, causal=True).id]
        assert r["status"] == "ok" and r["within_budget"] is True and r["dsinks_within_budget"] is True, r
    assert recs[cell("hf:eager", "sinks").id]["status"] == "skipped"
    assert "reads no module.sinks" in recs[cell("hf:eager", "sinks").id]["reason"]
    assert recs[cell("hf:gpt_oss.eager", "normal").id]["within_budget"] is True    # -inf sinks: no weight


def test_a_budget_on_few_values_is_widened_by_their_chance_spread():
    from audit.measure.golden.numerics import _f_equal_dof_cdf, small_sample_factor
    assert _f_equal_dof_cdf(19.0, 2) == pytest.approx(0.95) and _f_equal_dof_cdf(99.0, 2) == pytest.approx(0.99)
    assert _f_equal_dof_cdf(1.0, 7) == pytest.approx(0.5)                      # F(n, n) is symmetric in log
    factors = [small_sample_factor(n) for n in (2, 4, 16, 1000)]
    assert factors == sorted(factors, reverse=True) and factors[0] == pytest.approx(999 ** 0.5, rel=1e-6)
    assert 1.0 < factors[-1] < 1.2


def test_the_cuda_only_lse_ops_are_skipped_on_the_cpu_with_the_reason_and_predicted_so():
    from audit.plan.cell_shape import CellShape
    from audit.plan.cell_work import predicted_unsupported
    recs = run([cell(v) for v in ("efficient_op", "cudnn_op")])
    for r in recs.values():
        assert r["status"] == "skipped" and "a CUDA-only op" in r["reason"], r
    for v in ("efficient_op", "cudnn_op"):
        c = cell(v)
        assert predicted_unsupported(c, CellShape.of(c)) == "no such backend on the CPU"


def test_the_lse_masked_rows_warning_reads_only_unmergeable_values():
    def rec(variant, kind):
        return {"id": f"{variant}-{kind}", "variant": variant, "status": "ok", "scenario": "fully_masked_bool",
                "dtype": "fp32", "lse_masked_rows": kind}
    found = compute_findings(to_frame([rec("a", "zero"), rec("b", "-inf"), rec("c", "+inf"), rec("d", "nan"),
                                       rec("e", None)]))
    flagged = {f["variant"] for f in found if f["check"] == "lse_masked_rows"}
    assert flagged == {"a", "d"}


def test_the_report_tabulates_the_lse_checks_of_variants_returning_one():
    from audit.render.stability_tables import lse_table

    def rec(variant, ok, **extra):
        return {"id": f"{variant}-{ok}-{len(extra)}", "variant": variant, "status": "ok", "dtype": "fp32",
                "scenario": "normal", "lse_err": 1e-7, "lse_within_budget": True, "lse_err_ratio": 1.0,
                "merge_within_budget": ok, "merge_err_ratio": 1.0 if ok else 50.0,
                "lse_grads_within_budget": ok, "lse_dq_err_ratio": 1.0, "lse_differentiable": ok,
                "lse_masked_rows": None, **extra}
    table = lse_table(to_frame([rec("good", True), rec("bad", False), rec("bad", True, lse_masked_rows="zero"),
                                {"id": "x", "variant": "sdpa", "status": "ok", "dtype": "fp32", "scenario": "normal"}]))
    rows = {r["variant"]: r for r in table.to_dict("records")}
    assert set(rows) == {"good", "bad"}                                          # sdpa returns no lse
    assert rows["good"]["merge"] == "1/1" and rows["good"]["differentiable"] == "yes"
    assert rows["bad"]["merge"] == "1/2" and rows["bad"]["max merge_err_ratio"] == 50.0
    assert rows["bad"]["differentiable"] == "mixed" and rows["bad"]["on empty rows"] == "zero"


# --------------------------------------------------------------------------- sinks and merges without a mask

def _sink_cells(variant: str) -> list[Case]:
    return [Case(variant, "cpu", dtype, 16, 32, 1, 4, causal, scenario, 2)
            for scenario in ("sinks_prefill", "sinks_decode") for dtype in ("fp32", "bf16") for causal in (False, True)]


@pytest.fixture(scope="module")
def sink_kernel_run():
    """A sink kernel of gpt-oss's call form (tests/plugins/declared.py: sinks, causal, no mask, its lse
    with the sink counted), and the same kernel dropping its sinks, on the sinks prefill and decode cells."""
    sys.path.insert(0, str(PLUGINS))
    try:
        cache = cellcache.InputCache()
        recs = [runner.run_cell(c, cache, PRESET, {}) for c in _sink_cells("declared:sink_kernel")
                + _sink_cells("lse_kernels:sink_kernel_dropping_sinks")]
    finally:
        sys.path.remove(str(PLUGINS))
    return recs, compute_findings(to_frame(recs))


def test_a_maskless_sink_kernel_gets_sinks_prefill_cells_and_a_merge_on_its_causal_ones(sink_kernel_run):
    recs, found = sink_kernel_run
    mine = [r for r in recs if r["variant"] == "declared:sink_kernel"]
    assert [r["status"] for r in mine] == ["ok"] * 8, [(r["id"], r["reason"]) for r in mine]
    assert all(r["within_budget"] and r["lse_within_budget"] for r in mine)
    assert all(r["merge_within_budget"] is True for r in mine), [(r["id"], r["reason"]) for r in mine]
    assert {r["causal"] for r in mine if r["scenario"] == "sinks_prefill" and r["merge_err"] is not None} == {False, True}
    assert all(r["arguments"] == {"sinks": "honoured"} for r in mine)
    assert not [f for f in found if f["variant"] == "declared:sink_kernel" and f["severity"] != "info"]


def test_a_maskless_sink_kernel_dropping_its_sinks_is_caught_on_the_prefill_cells(sink_kernel_run):
    recs, found = sink_kernel_run
    mine = [r for r in recs if r["variant"] == "lse_kernels:sink_kernel_dropping_sinks"]
    prefill = [r for r in mine if r["scenario"] == "sinks_prefill"]
    assert len(prefill) == 4 and all(r["status"] == "ok" and r["within_budget"] is False for r in prefill)
    assert all(r["arguments"]["sinks"] == "ignored" and r["diagnosis"] == "sink_ignored" for r in prefill)
    checks = {f["check"] for f in found if f["variant"] == "lse_kernels:sink_kernel_dropping_sinks"}
    assert {"error_budget", "argument_ignored"} <= checks


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_causal_halves_by_position_merge_to_causal_attention_whatever_the_alignment(alignment):
    """Three mask-free calls (two causal squares, one whole block) give the two key halves of causal
    self-attention; merged, they are causal attention, for a kernel of either causal alignment."""
    from audit.measure.golden.lse import causal_position_halves
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=gen, dtype=torch.float64) for _ in range(3))

    def call(q, k, v, *, causal=False):
        tq, tk = q.shape[-2], k.shape[-2]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if causal:
            offset = tk - tq if alignment == "bottom-right" else 0
            s = s.masked_fill(~torch.ones(tq, tk, dtype=torch.bool).tril(offset), float("-inf"))
        return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)

    out, _ = merge_partials(*causal_position_halves(call, q, k, v, 5))
    want, _ = call(q, k, v, causal=True)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    wrong, _ = merge_partials(call(q, k[..., :5, :], v[..., :5, :], causal=True),
                              call(q, k[..., 5:, :], v[..., 5:, :], causal=True))
    assert not torch.allclose(wrong, want, atol=1e-3)     # the naive split with the kernel's own flag is not


def test_the_merge_of_two_empty_parts_is_an_empty_row_not_nan():
    """lse -inf (or FA2's +inf) on both parts: out 0, lse -inf, where exp(lse_i - lse) alone is NaN;
    a finite lse (0) on an empty part weighs its out in, which the lse_masked_rows warning names."""
    out = torch.ones(1, 1, 3, 2)
    inf = math.inf
    l1 = torch.tensor([[[-inf, inf, 0.0]]])
    l2 = torch.tensor([[[-inf, -inf, -inf]]])
    merged, lse = merge_partials((out, l1), (2 * out, l2))
    assert merged[0, 0, 0].tolist() == [0.0, 0.0] and merged[0, 0, 1].tolist() == [0.0, 0.0]
    assert lse[0, 0, 0] == -inf and lse[0, 0, 1] == -inf
    assert merged[0, 0, 2].tolist() == [1.0, 1.0] and lse[0, 0, 2] == 0.0   # a finite lse: read as keys
    naive = torch.exp(l2 - torch.logaddexp(l2, l2))
    assert bool(torch.isnan(naive).all())


# --------------------------------------------------------------------------- context parallel: N shards

def test_the_keys_cut_in_shards_cover_each_key_once_the_first_shards_a_key_longer():
    from audit.measure.golden.lse import shard_bounds
    assert shard_bounds(64, 4) == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert shard_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert shard_bounds(3, 4) is None                                   # fewer keys than shards


def test_causal_shards_by_position_merge_to_what_the_masked_shards_merge_to():
    """A kernel that takes causal but no mask gets its shards by position (rows before a shard see
    none of it); merged, they are the masked shards' merge, and the whole attention's."""
    from audit.measure.golden.lse import causal_position_shards, merge_ring, shard_bounds, shard_calls
    from audit.workload.eager import eager_lse_attention
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 24, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    whole = eager_lse_attention(q, k, v, causal=True)
    masked = merge_ring(shard_calls(eager_lse_attention, q, k, v, None, True, "top-left", 4))
    by_position = merge_ring(causal_position_shards(eager_lse_attention, q, k, v, shard_bounds(24, 4)))
    for got in (masked, by_position):
        assert torch.allclose(got[0], whole[0], atol=1e-12) and torch.allclose(got[1], whole[1], atol=1e-12)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_kernel_wrong_only_on_short_key_ranges_passes_two_halves_and_fails_context_parallel(dtype):
    """lse_kernels:tile_padding counts the padding of its 32-key tile: 64 keys, and two halves of 32, are
    right; 4 and 8 shards (16 and 8 keys) are not. eager, eager_fp32 and lse_kernels:correct are within
    at every N."""
    cases = [cell(v, scenario, dtype, causal, heads=2, t=64)
             for v in ("lse_kernels:tile_padding", "lse_kernels:correct", "eager", "eager_fp32")
             for scenario in ("normal", "padding") for causal in (False, True)]
    recs = run(cases)
    for c in cases:
        rec = recs[c.id]
        assert rec["status"] == "ok", rec["reason"]
        assert set(rec["shards_errs"]) == {"4", "8"} and rec["merge_within_budget"] is True, c.id
        want = c.variant != "lse_kernels:tile_padding"
        assert rec["shards_within_budget"] is want, (c.id, rec["shards_err_ratios"])
        assert (rec["shards_err_ratio"] <= 2.5) is want, (c.id, rec["shards_err_ratio"])
    found = [f for f in compute_findings(to_frame(list(recs.values()))) if f["check"] == "lse_error_budget"]
    assert [f["variant"] for f in found] == ["lse_kernels:tile_padding"]
    assert "shards, merged as context parallel merges its ranks'" in found[0]["message"]


def test_the_context_parallel_table_reads_each_shard_count_and_an_empty_frame():
    from audit.render.stability_tables import shards_table
    assert shards_table(to_frame([])).empty
    recs = run([cell(v, "normal", "fp32", False, heads=2, t=64) for v in ("lse_kernels:tile_padding", "eager")])
    table = shards_table(to_frame(list(recs.values()))).set_index("variant")
    assert list(table.columns) == ["dtype", "2 shards", "4 shards", "8 shards", "cells"]
    assert table.loc["eager", "8 shards"] < 2 and table.loc["lse_kernels:tile_padding", "8 shards"] > 100
    assert table.loc["lse_kernels:tile_padding", "2 shards"] < 2
