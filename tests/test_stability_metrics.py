"""Tests of the numerics audit: input scenarios, the float64 golden and its gradients,
the stability metrics, and the detectors proven on the negative controls.

Every metric is checked on a hand-built input where the right answer is known, and
every detector on an input that must trigger it and on one that must not.
"""
from __future__ import annotations

from functools import partial

import dataclasses
import math
import textwrap
import uuid

import pytest
import torch
from tests.helpers import random_qkv

from audit.core import records
from audit.core.grid import Case
from audit.execute import runner
from audit.measure.cell import cellcache
from audit.measure.machine import memory
from audit.measure.golden import reference
from audit.core.dtypes import dtype_names, dtype_spec
from audit.measure.golden.numerics import changed_max, classify_masked_rows, relative_error, within_budget
from audit.measure.golden.reference import golden_attention
from audit.workload import inputs, presets
from audit.workload.draws import _valid_lengths, fully_masked_rows, torch_dtype
from audit.workload.inputs import SCENARIOS, make_inputs

NAN, INF = float("nan"), float("inf")
FP16_MAX = 65504.0

# the small case of the scenario tests: B=2, H=2, T=16, d=8, fp32
B, H, T, D = 2, 2, 16, 8


def small_case(scenario: str, dtype: str = "fp32", causal: bool = False, **change) -> Case:
    case = Case("eager", "cpu", dtype, D, T, B, H, causal, scenario)
    return dataclasses.replace(case, **change)


# =========================================================================== inputs

def expected_q_len(scenario: str, t: int) -> int:
    return {"decode": 1, "sinks_decode": 1, "paged": 1, "paged_edges": 1, "cross_causal": t // 2}.get(scenario, t)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_scenario_builds_with_the_documented_shapes(scenario):
    case = small_case(scenario)
    inp = make_inputs(case)
    tq = expected_q_len(scenario, T)
    assert inputs.q_len(case) == tq
    assert inp.q.shape == (B, H, tq, D)
    assert inp.k.shape == (B, H, T, D) and inp.v.shape == (B, H, T, D)
    assert inp.grad_out.shape == (B, H, tq, D)
    for t in (inp.q, inp.k, inp.v, inp.grad_out):
        assert t.dtype == torch.float32 and t.is_leaf and not t.requires_grad
        assert torch.isfinite(t).all()
    assert inp.causal is False
    if inp.mask is None:
        assert inp.visible is None and inp.mask_form == "none"
    elif inp.mask_form == "bias":               # a finite additive bias that masks nothing
        assert inp.visible is None and inp.mask.dtype == torch.float32 and torch.isfinite(inp.mask).all()
        assert inp.mask.shape == (1, 1, tq, T)
    else:
        # (B|1, 1, Tq|1, Tk): broadcastable against (B, H, Tq, Tk)
        assert inp.mask.dim() == 4 and inp.mask.shape[1] == 1 and inp.mask.shape[-1] == T
        assert inp.mask.shape[0] in (1, B) and inp.mask.shape[2] in (1, tq)
        assert inp.visible.dtype == torch.bool
        assert inp.visible.shape == inp.mask.shape
    assert inp.mask_form in ("none", "bool", "neginf", "finfo_min", "bias")


def test_decode_and_cross_causal_query_lengths():
    assert make_inputs(small_case("decode")).q.shape[-2] == 1
    assert make_inputs(small_case("cross_causal", causal=True)).q.shape[-2] == T // 2 == 8
    assert make_inputs(small_case("cross_causal", seq_len=7)).q.shape[-2] == 3
    assert make_inputs(small_case("normal")).q.shape[-2] == T


def test_padding_mask_is_b_1_1_t_with_the_valid_lengths():
    inp = make_inputs(small_case("padding"))
    lengths = _valid_lengths(B, T)
    assert lengths == [12, 8]                           # 3/4 T, then shorter
    assert inp.mask.shape == (B, 1, 1, T) and inp.mask.dtype == torch.bool
    assert inp.mask_form == "bool"
    assert torch.equal(inp.visible, inp.mask)
    for b, n in enumerate(lengths):
        row = inp.mask[b, 0, 0]
        assert row[:n].all() and not row[n:].any()
    # the mask of a longer batch: every length >= 1 and strictly decreasing
    many = _valid_lengths(5, 16)
    assert all(n >= 1 for n in many) and many == sorted(many, reverse=True) and len(set(many)) == 5


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_fully_masked_forms_mask_the_same_rows(dtype):
    rows = fully_masked_rows(T)
    assert rows == [3, 11]
    forms = {form: make_inputs(small_case(f"fully_masked_{form}", dtype=dtype))
             for form in ("bool", "neginf", "finfo_min")}
    expected = torch.ones(1, 1, T, T, dtype=torch.bool)
    expected[..., rows, :] = False
    for form, inp in forms.items():
        assert inp.mask_form == form
        assert torch.equal(inp.visible, expected), form
        assert inp.mask.shape == (1, 1, T, T)
    assert torch.equal(forms["bool"].mask, expected)
    neginf = forms["neginf"].mask
    assert neginf.dtype == torch_dtype(dtype)
    assert torch.isneginf(neginf[~expected]).all()
    assert (neginf[expected] == 0).all()
    fmin = forms["finfo_min"].mask
    assert fmin.dtype == torch_dtype(dtype)
    assert torch.isfinite(fmin).all()
    assert (fmin[~expected] == torch.finfo(torch_dtype(dtype)).min).all()
    assert (fmin[expected] == 0).all()


def test_fully_masked_rows_at_least_one_row():
    assert fully_masked_rows(1) == [0]
    assert fully_masked_rows(2) == [1]
    assert fully_masked_rows(4) == [3]
    assert fully_masked_rows(20) == [3, 11, 19]


def test_fp16_range_overflows_q_dot_k_in_fp16_only():
    for dtype in ("fp16", "bf16", "fp32"):
        inp = make_inputs(small_case("fp16_range", dtype=dtype))
        for t in (inp.q, inp.k, inp.v):
            assert torch.isfinite(t).all(), dtype          # the inputs fit every dtype
        exact = inp.q.double() @ inp.k.double().transpose(-2, -1)
        assert float(exact.abs().max()) > FP16_MAX, dtype
        scores = inp.q @ inp.k.transpose(-2, -1)           # in the input dtype
        if dtype == "fp16":
            assert torch.isinf(scores).any()
        else:
            assert torch.isfinite(scores).all(), dtype
    # |q| ≈ 576 and |k| ≈ 383 per row
    inp = make_inputs(small_case("fp16_range"))
    torch.testing.assert_close(inp.q.norm(dim=-1), torch.full((B, H, T), 576.0), rtol=1e-5, atol=0)
    torch.testing.assert_close(inp.k.norm(dim=-1), torch.full((B, H, T), 383.0), rtol=1e-5, atol=0)
    # a normal input of the same size is nowhere near the fp16 range
    normal = make_inputs(small_case("normal", dtype="fp16"))
    assert float((normal.q.double() @ normal.k.double().transpose(-2, -1)).abs().max()) < 100


def test_outliers_have_a_few_large_entries():
    big = dict(seq_len=256, d_k=64)                       # 65536 values per tensor
    out = make_inputs(small_case("outliers", **big))
    normal = make_inputs(small_case("normal", **big))
    n = out.q.numel() * 3
    large = sum(int((t.abs() > 6).sum()) for t in (out.q, out.k, out.v))
    assert 0 < large < 0.002 * n                          # Bernoulli(0.001) spikes of N(0, 100)
    assert max(float(t.abs().max()) for t in (out.q, out.k, out.v)) > 15
    assert sum(int((t.abs() > 6).sum()) for t in (normal.q, normal.k, normal.v)) == 0


def test_scaled_multiplies_q_only():
    for alpha in (1, 4, 16, 64):
        inp = make_inputs(small_case(f"scaled_x{alpha}", seq_len=256, d_k=32))
        assert float(inp.q.std()) == pytest.approx(alpha, rel=0.1)
        assert float(inp.k.std()) == pytest.approx(1.0, rel=0.1)
        assert float(inp.v.std()) == pytest.approx(1.0, rel=0.1)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenarios_are_deterministic_per_input_key(scenario):
    a = make_inputs(small_case(scenario, dtype="bf16"))
    b = make_inputs(small_case(scenario, dtype="bf16", variant="sdpa"))   # same input key
    for name in ("q", "k", "v", "grad_out", "mask", "visible"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or torch.equal(x, y), name
    other = make_inputs(small_case(scenario, dtype="bf16", batch=3))
    assert not torch.equal(a.k, other.k[:B])              # a different input key draws anew


def test_scenarios_draw_different_inputs():
    qs = [make_inputs(small_case(s)).k for s in ("normal", "scaled_x4", "padding", "outliers")]
    for i in range(len(qs)):
        for j in range(i + 1, len(qs)):
            assert not torch.equal(qs[i], qs[j])


# =========================================================================== golden

def direct_attention_with_grads(q, k, v, grad_out, keep, scale=None):
    """float64 attention in one piece through autograd; rows with no visible key give 0.

    keep: bool broadcastable to (B, H, Tq, Tk). Returns (out, dq, dk, dv).
    """
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("bhid,bhjd->bhij", q, k) * scale                 # (B, H, Tq, Tk)
    keep = keep.expand_as(scores)
    scores = scores.masked_fill(~keep, -INF)
    rowmax = scores.amax(-1, keepdim=True).clamp(min=-1e300).detach()
    e = torch.exp(scores - rowmax) * keep
    denom = e.sum(-1, keepdim=True)
    probs = torch.where(denom > 0, e / denom.clamp(min=1e-300), torch.zeros_like(e))
    out = torch.einsum("bhij,bhjd->bhid", probs, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out.double())
    return out.detach(), dq, dk, dv


rand_qkv = partial(random_qkv, b=2, tq=6, tk=9, d=4, grad_out=True)


def causal_keep(tq, tk, offset=0):
    i = torch.arange(tq)[:, None]
    j = torch.arange(tk)[None, :]
    return j <= i + offset                                                  # (Tq, Tk)


def visible_mask(b, tq, tk, seed=4, masked_row=None):
    m = torch.rand(b, 1, tq, tk, generator=torch.Generator().manual_seed(seed)) > 0.35
    m[..., 0] = True
    if masked_row is not None:
        m[0, 0, masked_row] = False                                         # one fully masked row
    return m                                                                # (B, 1, Tq, Tk)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("tq,tk", [(7, 7), (5, 9)])
def test_golden_gradients_equal_autograd_of_direct_float64(causal, with_mask, tq, tk):
    q, k, v, g = rand_qkv(tq=tq, tk=tk)
    visible = visible_mask(2, tq, tk, masked_row=2) if with_mask else None
    keep = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        keep = keep & causal_keep(tq, tk)
    if visible is not None:
        keep = keep & visible
    gold = golden_attention(q, k, v, grad_out=g, causal=causal, visible=visible)
    out, dq, dk, dv = direct_attention_with_grads(q, k, v, g, keep)
    for got, want in ((gold.out, out), (gold.dq, dq), (gold.dk, dk), (gold.dv, dv)):
        assert got.dtype == torch.float64 and got.shape == want.shape
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert torch.equal(gold.row_visible, keep.expand(2, 2, tq, tk).any(-1))
    if with_mask:
        assert torch.count_nonzero(gold.dq[0, :, 2]) == 0                  # masked row: no gradient
        assert torch.count_nonzero(gold.out[0, :, 2]) == 0


def test_golden_gradients_can_fail():
    # a wrong scale gives different gradients: the comparison above is not vacuous
    q, k, v, g = rand_qkv()
    gold = golden_attention(q, k, v, grad_out=g)
    _, dq, dk, dv = direct_attention_with_grads(q, k, v, g, torch.ones(6, 9, dtype=torch.bool), scale=1.0)
    assert not torch.allclose(gold.dq, dq, atol=1e-6)
    assert not torch.allclose(gold.dk, dk, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_golden_chunked_equals_unchunked_with_gradients(monkeypatch, causal, alignment):
    q, k, v, g = rand_qkv(tq=10, tk=13)
    visible = visible_mask(2, 10, 13, masked_row=6)
    args = dict(grad_out=g, causal=causal, visible=visible, alignment=alignment)
    whole = golden_attention(q, k, v, **args)
    for tiny in (1, 2 * 2 * 13 * 8 * 3):                                    # one row, three rows
        monkeypatch.setattr(reference, "CHUNK_BYTES", tiny)
        assert len(list(reference._chunks(10, 2 * 2 * 13 * 8))) == (10 if tiny == 1 else 4)
        chunked = golden_attention(q, k, v, **args)
        for name in ("out", "dq", "dk", "dv", "row_visible"):
            torch.testing.assert_close(getattr(chunked, name), getattr(whole, name),
                                       rtol=1e-12, atol=1e-13, msg=name)
        for key, value in whole.saturation.items():
            assert chunked.saturation[key] == pytest.approx(value, rel=1e-12), key


@pytest.mark.parametrize("tq,tk", [(4, 9), (1, 9), (8, 8)])
def test_golden_bottom_right_alignment_is_the_shifted_causal_mask(tq, tk):
    q, k, v, g = rand_qkv(tq=tq, tk=tk)
    hand = causal_keep(tq, tk, offset=tk - tq)[None, None]                 # j <= i + (Tk - Tq)
    br = golden_attention(q, k, v, grad_out=g, causal=True, alignment="bottom-right")
    assert br.alignment == "bottom-right"
    by_mask = golden_attention(q, k, v, grad_out=g, visible=hand)
    for name in ("out", "dq", "dk", "dv"):
        torch.testing.assert_close(getattr(br, name), getattr(by_mask, name), rtol=1e-12, atol=1e-13)
    tl = golden_attention(q, k, v, causal=True)
    if tq == tk:
        torch.testing.assert_close(br.out, tl.out, rtol=1e-12, atol=1e-13)   # same when square
    else:
        assert not torch.allclose(br.out, tl.out, atol=1e-3)
        if tq == 1:  # decode: bottom-right sees every key, top-left only the first
            full = golden_attention(q, k, v)
            torch.testing.assert_close(br.out, full.out, rtol=1e-12, atol=1e-13)
            torch.testing.assert_close(tl.out, v.double()[..., :1, :].expand_as(tl.out),
                                       rtol=1e-12, atol=1e-13)


def test_golden_bottom_right_with_a_visible_mask():
    q, k, v, _ = rand_qkv(tq=5, tk=9)
    visible = visible_mask(2, 5, 9)
    br = golden_attention(q, k, v, causal=True, visible=visible, alignment="bottom-right")
    both = golden_attention(q, k, v, visible=visible & causal_keep(5, 9, offset=4))
    torch.testing.assert_close(br.out, both.out, rtol=1e-12, atol=1e-13)


def test_golden_memory_stays_bounded_by_its_chunks(monkeypatch):
    # The golden's chunking, at a quarter of the work of T=4096 (16 s on 2 cores): chunks of 4 MiB
    # of scores (the CPU default is 32 MiB) at T=2048 by 8 heads, where one unchunked float64 score
    # matrix alone would be 8 * 2048 * 2048 * 8 B = 256 MiB. Measured on a 2-core AMD EPYC: 166 MiB
    # chunked, 1716 MiB with one chunk of every row.
    if not memory.cpu_peak_supported():
        pytest.skip("CPU peak memory needs a writable /proc/self/clear_refs and VmHWM, absent here")
    from audit.measure.golden import reference
    monkeypatch.setattr(reference, "CHUNK_BYTES", 4 * 2**20)
    q, k, v, g = rand_qkv(b=1, h=8, tq=2048, tk=2048, d=64)
    gold, peak = memory.peak_during(
        lambda: golden_attention(q, k, v, grad_out=g, causal=True), "cpu")
    assert peak is not None and peak > 0
    assert peak < 256 * 2**20, f"golden used {peak / 2**20:.0f} MiB above the baseline"
    assert gold.out.shape == (1, 8, 2048, 64) and gold.dk.shape == (1, 8, 2048, 64)
    assert torch.isfinite(gold.out).all() and torch.isfinite(gold.dq).all()


# --------------------------------------------------------------------------- computed once per input set

def test_golden_is_computed_once_per_input_set(tmp_path, monkeypatch):
    calls = {"top-left": 0, "bottom-right": 0}
    real = cellcache.golden_attention

    def counting(*args, **kwargs):
        calls[kwargs.get("alignment", "top-left")] += 1
        return real(*args, **kwargs)

    caches = []

    class RecordingCache(cellcache.InputCache):
        def __init__(self):
            super().__init__()
            caches.append(self)

    monkeypatch.setattr(cellcache, "golden_attention", counting)
    monkeypatch.setattr(runner, "InputCache", RecordingCache)
    names = ("eager", "sdpa", "broken.unscaled")
    cases = ([Case(v, "cpu", "fp32", 8, 16, 1, 2, False, "normal") for v in names]
             + [Case(v, "cpu", "fp32", 8, 16, 1, 2, True, "cross_causal") for v in names])
    assert len({c.input_key for c in cases}) == 2
    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
    counts = runner.run_grid(cases, tmp_path, preset, {}, progress=False)
    assert counts.get("ok") == 6
    assert len(caches) == 1
    assert caches[0].golden_calls == 2                     # not once per variant (6)
    assert calls["top-left"] == 2                          # each set's golden (the referee's shifted values in it)
    assert calls["bottom-right"] == 1                      # only the causal cross_causal set
    recs = {r["id"]: r for r in records.read_records(tmp_path)}
    assert len(recs) == 6 and all(r["status"] == "ok" for r in recs.values())


# =========================================================================== numerics

def test_within_budget():
    atol = dtype_spec("fp32").atol
    assert all(dtype_spec(d).budget_factor == 2.0 for d in dtype_names())
    assert within_budget(1e-3, 1e-3, "fp32") is True                     # equal to the baseline
    assert within_budget(2e-3, 1e-3, "fp32") is True                     # at 2x (plus atol)
    assert within_budget(2e-3 + atol, 1e-3, "fp32") is True              # exactly on the edge
    assert within_budget(2.1e-3, 1e-3, "fp32") is False                  # over
    assert within_budget(0.0, 0.0, "fp32") is True
    assert within_budget(0.5 * atol, 0.0, "fp32") is True                # atol allows a floor
    assert within_budget(1.5 * atol, 0.0, "fp32") is False
    for dtype in dtype_names():
        a = dtype_spec(dtype).atol
        assert within_budget(0.9 * a, 0.0, dtype) is True
        assert within_budget(1.1 * a, 0.0, dtype) is False
    assert dtype_spec("fp32").atol < dtype_spec("fp16").atol < dtype_spec("bf16").atol


def test_within_budget_non_finite():
    for baseline in (None, NAN, INF, -INF):
        assert within_budget(1e-3, baseline, "fp16") is None               # no yardstick
        assert within_budget(NAN, baseline, "fp16") is None
    assert within_budget(NAN, 1e-3, "fp32") is False                      # NaN error: over budget
    assert within_budget(INF, 1e-3, "fp32") is False
    assert type(within_budget(1e-3, 1e-3, "bf16")) is bool


def _rows_case():
    """out (1, 2, 4, 3), v (1, 2, 5, 3); rows 1 and 3 are 'fully masked'."""
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(1, 2, 5, 3, generator=gen)
    out = torch.randn(1, 2, 4, 3, generator=gen)
    rows = torch.tensor([False, True, False, True])                        # (Tq,)
    return out, rows, v


def test_classify_masked_rows_each_kind():
    out, rows, v = _rows_case()
    mean_v = v.mean(-2, keepdim=True)                                      # (1, 2, 1, 3)

    def with_rows(fill):
        o = out.clone()
        o[..., [1, 3], :] = fill.expand(1, 2, 2, 3) if torch.is_tensor(fill) else fill
        return o

    assert classify_masked_rows(with_rows(NAN), rows, v) == "nan"
    assert classify_masked_rows(with_rows(0.0), rows, v) == "zero"
    assert classify_masked_rows(with_rows(mean_v.expand(1, 2, 2, 3)), rows, v) == "uniform"
    assert classify_masked_rows(with_rows(mean_v.expand(1, 2, 2, 3) + 1e-4), rows, v) == "uniform"
    assert classify_masked_rows(with_rows(mean_v.expand(1, 2, 2, 3) + 0.5), rows, v) == "other"
    assert classify_masked_rows(with_rows(torch.tensor(7.0)), rows, v) == "other"
    mixed = with_rows(0.0)
    mixed[0, 1, 3] = NAN
    assert classify_masked_rows(mixed, rows, v) == "mixed"
    one_nan = with_rows(0.0)
    one_nan[0, 0, 1, 2] = NAN                                              # one NaN value is a NaN row
    assert classify_masked_rows(one_nan, rows, v) == "mixed"


def test_classify_masked_rows_ignores_the_other_rows():
    out, rows, v = _rows_case()
    o = out.clone()
    o[..., [1, 3], :] = 0.0
    o[..., 0, :] = NAN                                                     # not a masked row
    assert classify_masked_rows(o, rows, v) == "zero"


def test_classify_masked_rows_none_when_no_row_is_masked():
    out, _, v = _rows_case()
    assert classify_masked_rows(out, torch.zeros(4, dtype=torch.bool), v) is None
    assert classify_masked_rows(torch.full_like(out, NAN), torch.zeros(1, 2, 4, dtype=torch.bool), v) is None


def test_classify_masked_rows_per_batch_rows():
    out, _, v = _rows_case()
    rows = torch.zeros(1, 2, 4, dtype=torch.bool)
    rows[0, 1, 2] = True                                                   # one row of head 1
    o = out.clone()
    o[0, 1, 2] = v[0, 1].mean(0)
    assert classify_masked_rows(o, rows, v) == "uniform"


def test_changed_max():
    rows = torch.tensor([True, True, False])                               # (Tq,)
    a = torch.tensor([[[[1.0, 2.0], [3.0, NAN], [5.0, 6.0]]]])            # (1, 1, 3, 2)
    assert changed_max(a, a.clone(), rows) == 0.0                          # NaN == NaN: unchanged
    b = a.clone()
    b[..., 0, 1] = 2.25
    b[..., 1, 0] = 2.5
    b[..., 2, :] = 100.0                                                   # not a selected row
    assert changed_max(a, b, rows) == 0.5
    c = a.clone()
    c[..., 0, 0] = NAN                                                     # finite turned NaN
    assert changed_max(a, c, rows) == INF
    d = a.clone()
    d[..., 1, 1] = 4.0                                                     # NaN turned finite
    assert changed_max(a, d, rows) == INF
    e = a.clone()
    e[..., 2, 0] = NAN                                                     # outside the rows
    assert changed_max(a, e, rows) == 0.0
    assert changed_max(a, b, torch.zeros(3, dtype=torch.bool)) == 0.0
    assert changed_max(a, b, torch.ones(3, dtype=torch.bool)) == 95.0      # |100 - 5|
    assert type(changed_max(a, b, rows)) is float


def test_changed_max_sees_tiny_changes():
    a = torch.ones(1, 2, 4, 3)
    b = a.clone()
    b[0, 1, 2, 1] = 1.0 + 2**-20
    assert changed_max(a, b, torch.ones(4, dtype=torch.bool)) == 2**-20


def test_relative_error():
    golden = torch.tensor([3.0, 4.0], dtype=torch.float64)                 # norm 5
    assert relative_error(torch.tensor([3.3, 3.6]), golden) == pytest.approx(0.1, rel=1e-6)
    assert relative_error(golden.clone(), golden) == 0.0
    assert relative_error(torch.zeros(2), torch.zeros(2, dtype=torch.float64)) == 0.0
    assert relative_error(torch.tensor([0.0, 1.0]), torch.zeros(2, dtype=torch.float64)) == INF
    assert math.isnan(relative_error(torch.tensor([NAN, 0.0]), torch.zeros(2, dtype=torch.float64)))
    assert math.isnan(relative_error(torch.tensor([NAN, 4.0]), golden))
    assert relative_error(torch.tensor([INF, 4.0]), golden) == INF
    assert type(relative_error(golden, golden)) is float


# =========================================================================== detectors via run_cell

PRESET = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)


def measure(variant: str, scenario: str, *, causal: bool = False, dtype: str = "fp32") -> dict:
    case = Case(variant, "cpu", dtype, 16, 32, 2, 2, causal, scenario)
    rec = runner.run_cell(case, runner.InputCache(), PRESET, {})
    assert rec["status"] == "ok", rec["reason"]
    return rec


def test_correct_variant_on_normal_triggers_nothing():
    rec = measure("eager", "normal")
    assert rec["within_budget"] is True and rec["err_ratio"] == pytest.approx(1.0)
    assert rec["out_nonfinite_visible"] == 0 and rec["out_nan"] == 0 and rec["out_inf"] == 0
    assert rec["masked_rows"] is None                        # nothing is masked
    assert rec["leak_max_change"] is None and rec["leak_mass"] is None
    assert rec["causal_alignment"] is None                   # not causal with Tq != Tk
    assert rec["underflow_frac"] == 0.0
    assert rec["q_len"] == 32
    assert rec["saturation_source"] == "variant"
    assert measure("sdpa", "normal")["saturation_source"] == "golden"   # hides its weights


def test_unscaled_is_outside_the_budget():
    bad = measure("broken.unscaled", "normal")
    assert bad["within_budget"] is False
    assert bad["err_ratio"] > 10
    assert bad["onehot_frac"] > measure("eager", "normal")["onehot_frac"]   # saturates
    assert measure("eager", "normal")["within_budget"] is True


@pytest.mark.parametrize("scenario,causal", [("padding", False), ("normal", True)])
def test_clamped_leaks_weight_to_masked_keys(scenario, causal):
    bad = measure("broken.clamped", scenario, causal=causal)
    assert bad["leak_max_change"] > 0
    assert bad["leak_mass"] >= 1e-6
    # known answer: 1e-6 on every masked key of the row with the most masked keys
    # (padding: T - shortest valid length = 32 - 16; causal: row 0 has 31 future keys)
    most_masked = 32 - min(_valid_lengths(2, 32)) if scenario == "padding" else 31
    assert bad["leak_mass"] == pytest.approx(most_masked * 1e-6, rel=1e-3)
    for name in ("eager", "sdpa"):
        good = measure(name, scenario, causal=causal)
        assert good["leak_max_change"] == 0, name
        assert good["leak_mass"] in (0.0, None), name       # sdpa exposes no weights: None
    assert measure("eager", scenario, causal=causal)["leak_mass"] == 0.0


def test_mask_after_softmax_breaks_on_saturated_causal_rows():
    # Both signs show here: with q x 64 the softmax over *all* keys puts (almost) all weight
    # on future keys, the visible keys' weights underflow to 0, and the renormalization
    # is 0/0 -> NaN on rows that see a key; so out_nonfinite_visible > 0 AND within_budget
    # is False (NaN rmse).
    bad = measure("broken.mask_after_softmax", "scaled_x64", causal=True)
    assert bad["out_nonfinite_visible"] > 0
    assert bad["within_budget"] is False
    good = measure("eager", "scaled_x64", causal=True)
    assert good["out_nonfinite_visible"] == 0
    assert good["within_budget"] is True


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_no_max_subtraction_overflows_on_large_logits(dtype):
    bad = measure("broken.no_max_subtraction", "scaled_x64", dtype=dtype)
    assert bad["out_nonfinite_visible"] > 0
    assert bad["within_budget"] is False
    assert bad["max_logit"] > 89                              # exp overflows fp32 past ~88.7
    good = measure("eager", "scaled_x64", dtype=dtype)
    assert good["out_nonfinite_visible"] == 0
    # on normal inputs the same defect is harmless: the detector stays quiet
    assert measure("broken.no_max_subtraction", "normal")["out_nonfinite_visible"] == 0


def test_softmax_wrong_dim_is_outside_the_budget():
    assert measure("broken.softmax_wrong_dim", "normal")["within_budget"] is False
    assert measure("eager_fp32", "normal")["within_budget"] is True


def test_fully_masked_rows_nan_vs_zero_vs_uniform():
    eager = measure("eager", "fully_masked_bool")
    assert eager["masked_rows"] == "nan"
    assert eager["out_nan"] > 0 and eager["out_nonfinite_visible"] == 0   # NaN only on masked rows
    sdpa = measure("sdpa", "fully_masked_bool")
    assert sdpa["masked_rows"] == "zero"
    assert sdpa["out_nan"] == 0
    assert sdpa["leak_max_change"] == 0
    fmin = measure("sdpa", "fully_masked_finfo_min")
    assert fmin["masked_rows"] == "uniform"
    assert fmin["leak_max_change"] > 0                        # finfo.min leaks: masked keys change it
    assert measure("eager", "fully_masked_neginf")["masked_rows"] == "nan"
    assert measure("sdpa", "fully_masked_neginf")["masked_rows"] == "zero"


def test_fp16_range_overflows_eager_only():
    eager = measure("eager", "fp16_range", dtype="fp16")
    assert eager["out_nonfinite_visible"] > 0
    assert eager["max_qk"] > FP16_MAX
    for name in ("sdpa", "eager_fp32"):
        rec = measure(name, "fp16_range", dtype="fp16")
        assert rec["out_nonfinite_visible"] == 0, name
        assert rec["within_budget"] is None, name              # the eager baseline is NaN
        assert rec["rmse"] < 1e-2, name


def test_cross_causal_alignment_top_left_for_eager_and_sdpa():
    for name in ("eager", "sdpa"):
        rec = measure(name, "cross_causal", causal=True)
        assert rec["q_len"] == 16 and rec["seq_len"] == 32
        assert rec["causal_alignment"] == "top-left", name
    assert measure("eager", "cross_causal", causal=False)["causal_alignment"] is None


def test_cross_causal_alignment_detects_bottom_right(tmp_path, monkeypatch):
    # a plug-in that aligns causality to the bottom-right corner, as causal_lower_right does
    module = f"bottom_right_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent('''
        import torch

        def attention(q, k, v, *, mask=None, causal=False, scale=None):
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            scores = (q @ k.transpose(-2, -1)) * scale
            if causal:
                tq, tk = q.shape[-2], k.shape[-2]
                keep = torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)
                scores = scores.masked_fill(~keep, float("-inf"))
            return torch.softmax(scores, dim=-1) @ v
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    rec = measure(f"{module}:attention", "cross_causal", causal=True)
    assert rec["causal_alignment"] == "bottom-right"
    assert rec["within_budget"] is False                      # judged against top-left (is_causal)
