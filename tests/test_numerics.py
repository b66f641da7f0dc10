"""Tests of audit.measure.golden.numerics and audit.measure.golden.reference on hand-built tensors."""
from __future__ import annotations

from functools import partial

import math

import pytest
import torch
from tests.helpers import random_qkv

from audit.measure.golden import reference
from audit.measure.golden.numerics import SaturationAccumulator, attention_flops, error_vs_reference, nonfinite_counts
from audit.measure.golden.reference import golden_attention

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds

NAN, INF = float("nan"), float("inf")


# --------------------------------------------------------------------------- nonfinite_counts

def test_nonfinite_counts_known_counts():
    a = torch.zeros(4, 5)
    a[0, 0] = NAN
    a[1, 2] = NAN
    a[2, 3] = INF
    a[3, 4] = -INF
    b = torch.ones(3, dtype=torch.bfloat16)
    b[1] = NAN
    assert nonfinite_counts([a]) == (2, 2)
    assert nonfinite_counts([a, None, b]) == (3, 2)
    assert nonfinite_counts((t for t in [b, b])) == (2, 0)


def test_nonfinite_counts_clean_tensors_are_zero():
    clean = torch.randn(3, 4, 5)
    big = torch.full((4,), torch.finfo(torch.float16).max, dtype=torch.float16)  # finite extremes
    assert nonfinite_counts([clean, big, None]) == (0, 0)
    assert nonfinite_counts([]) == (0, 0)
    counts = nonfinite_counts([clean])
    assert all(type(c) is int for c in counts)


# --------------------------------------------------------------------------- error_vs_reference

def test_error_vs_reference_hand_computed():
    golden = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)   # ||golden|| = 5
    out = torch.tensor([[3.0, 4.0], [0.3, -0.4]], dtype=torch.float32)    # ||diff|| = 0.5
    err = error_vs_reference(out, golden)
    assert set(err) == {"max_abs_err", "rmse", "rel_err"}
    assert err["max_abs_err"] == pytest.approx(0.4, rel=1e-6)
    assert err["rmse"] == pytest.approx(0.25, rel=1e-6)                   # 0.5 / sqrt(4)
    assert err["rel_err"] == pytest.approx(0.1, rel=1e-6)
    assert all(type(x) is float for x in err.values())


def test_error_vs_reference_over_selected_rows_only():
    golden = torch.zeros(1, 2, 3, 2, dtype=torch.float64)                  # (B, H, Tq, d)
    golden[..., 0] = 3.0
    golden[..., 1] = 4.0                                                   # every row (3, 4)
    out = golden.clone().float()
    out[0, 0, 1] = torch.tensor([3.3, 3.6])                                # diff (0.3, -0.4)
    out[..., 2, :] = NAN                                                   # a row left out
    rows = torch.tensor([True, True, False])                               # (Tq,), broadcast
    err = error_vs_reference(out, golden, rows)
    # 4 selected rows, ||golden|| = 5 * sqrt(4) = 10, ||diff|| = 0.5 over 8 values
    assert err["max_abs_err"] == pytest.approx(0.4, rel=1e-6)
    assert err["rmse"] == pytest.approx(0.5 / math.sqrt(8), rel=1e-6)
    assert err["rel_err"] == pytest.approx(0.05, rel=1e-6)
    # the NaN row counts when it is selected
    assert math.isnan(error_vs_reference(out, golden)["rmse"])
    assert math.isnan(error_vs_reference(out, golden, torch.ones(3, dtype=torch.bool))["max_abs_err"])
    # per (B, H) row selection: (B, H, Tq)
    rows_bh = torch.tensor([[[False, True, False], [False, False, False]]])
    err = error_vs_reference(out, golden, rows_bh)
    assert err["max_abs_err"] == pytest.approx(0.4, rel=1e-6)
    assert err["rmse"] == pytest.approx(0.5 / math.sqrt(2), rel=1e-6)


def test_error_vs_reference_of_no_selected_rows_is_zero():
    golden = torch.ones(1, 1, 2, 3, dtype=torch.float64)
    out = torch.full((1, 1, 2, 3), NAN)
    none = torch.zeros(2, dtype=torch.bool)
    assert error_vs_reference(out, golden, none) == {"max_abs_err": 0.0, "rmse": 0.0, "rel_err": 0.0}


def test_error_vs_reference_exact_match_is_zero():
    golden = torch.randn(2, 3, 4, dtype=torch.float64)
    err = error_vs_reference(golden.clone(), golden)
    assert err == {"max_abs_err": 0.0, "rmse": 0.0, "rel_err": 0.0}
    zero = torch.zeros(3, dtype=torch.float64)
    assert error_vs_reference(zero.float(), zero) == {"max_abs_err": 0.0, "rmse": 0.0, "rel_err": 0.0}


def test_error_vs_reference_nan_propagates():
    golden = torch.ones(2, 3, dtype=torch.float64)
    out = torch.ones(2, 3)
    out[1, 2] = NAN
    err = error_vs_reference(out, golden)
    assert math.isnan(err["max_abs_err"])
    assert math.isnan(err["rmse"])
    assert math.isnan(err["rel_err"])


def test_error_vs_reference_inf_gives_inf():
    golden = torch.ones(4, dtype=torch.float64)
    out = torch.ones(4)
    out[0] = INF
    err = error_vs_reference(out, golden)
    assert err["max_abs_err"] == INF and err["rel_err"] == INF and err["rmse"] == INF


def test_error_vs_reference_nan_propagates_even_when_golden_is_zero():
    # Every row fully masked: golden is all 0 and eager gives NaN. The error is NaN (a
    # measurement of NaN output), not inf (which would mean a finite but huge error).
    golden = torch.zeros(2, 3, dtype=torch.float64)
    out = torch.zeros(2, 3)
    out[0, 0] = NAN
    err = error_vs_reference(out, golden)
    assert math.isnan(err["max_abs_err"])
    assert math.isnan(err["rmse"])
    assert math.isnan(err["rel_err"])


def test_error_vs_reference_nonzero_against_zero_golden_is_inf():
    golden = torch.zeros(3, dtype=torch.float64)
    err = error_vs_reference(torch.tensor([0.0, 1.0, 0.0]), golden)
    assert err["max_abs_err"] == 1.0 and err["rel_err"] == INF
    assert err["rmse"] == pytest.approx(1.0 / math.sqrt(3))


# --------------------------------------------------------------------------- SaturationAccumulator

def _result(probs, visible=None):
    acc = SaturationAccumulator()
    acc.add(probs.double(), visible)
    return acc.result()


def test_saturation_uniform_rows():
    n = 8
    r = _result(torch.full((2, 3, 5, n), 1.0 / n))
    assert r["max_prob"] == pytest.approx(1.0 / n)
    assert r["entropy"] == pytest.approx(1.0)
    assert r["min_entropy"] == pytest.approx(1.0)
    assert r["onehot_frac"] == 0.0


def test_saturation_onehot_rows():
    probs = torch.zeros(2, 3, 5, 8)
    probs[..., 3] = 1.0
    r = _result(probs)
    assert r["max_prob"] == 1.0
    assert r["entropy"] == pytest.approx(0.0, abs=1e-12)
    assert r["min_entropy"] == pytest.approx(0.0, abs=1e-12)
    assert r["onehot_frac"] == 1.0


def test_saturation_mixed_rows_average():
    probs = torch.full((4, 8), 1.0 / 8)
    probs[2:] = 0.0
    probs[2:, 0] = 1.0
    r = _result(probs)
    assert r["max_prob"] == pytest.approx((1.0 / 8 + 1.0) / 2)
    assert r["entropy"] == pytest.approx(0.5)
    assert r["min_entropy"] == pytest.approx(0.0, abs=1e-12)   # the mean hides the one-hot rows
    assert r["onehot_frac"] == 0.5


def test_saturation_min_entropy_is_the_lowest_row_over_chunks():
    half = torch.tensor([[0.5, 0.5, 0.0, 0.0]])                 # H = log 2 -> 0.5 of log 4
    uniform = torch.full((1, 4), 0.25)                           # 1.0
    acc = SaturationAccumulator()
    acc.add(uniform.double(), None)
    assert acc.result()["min_entropy"] == pytest.approx(1.0)
    acc.add(half.double(), None)
    acc.add(uniform.double(), None)
    r = acc.result()
    assert r["min_entropy"] == pytest.approx(0.5)
    assert r["entropy"] == pytest.approx(2.5 / 3)


def test_saturation_onehot_threshold_both_sides():
    above = torch.tensor([[0.995, 0.005, 0.0]])
    below = torch.tensor([[0.98, 0.02, 0.0]])
    assert _result(above)["onehot_frac"] == 1.0
    assert _result(below)["onehot_frac"] == 0.0


def test_saturation_entropy_is_normalized_by_visible_keys():
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.5, 0.0, 0.5]])
    visible = torch.tensor([[True, True, False, False], [False, True, False, True]])
    r = _result(probs, visible)
    assert r["entropy"] == pytest.approx(1.0)   # log 2 / log 2, not log 2 / log 4
    assert r["max_prob"] == pytest.approx(0.5)
    # the same rows read as if all 4 keys were visible: half the normalized entropy
    assert _result(probs)["entropy"] == pytest.approx(0.5)


def test_saturation_leaves_out_rows_with_one_visible_key():
    """A row that sees one key is one-hot by construction (the first causal row, causal decode):
    counting it would report saturation the inputs did not cause."""
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    visible = torch.tensor([[True, False, False], [True, True, False]])
    acc = SaturationAccumulator()
    acc.add(probs.double(), visible)
    assert acc.rows == 1
    assert acc.result() == {"max_prob": 0.5, "entropy": 1.0, "min_entropy": 1.0, "onehot_frac": 0.0}
    only_single = _result(torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[True, False, False]]))
    assert only_single["onehot_frac"] is None


def test_saturation_excludes_fully_masked_rows():
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    visible = torch.tensor([[True, True, False, False], [True, False, True, False], [False] * 4])
    acc = SaturationAccumulator()
    acc.add(probs.double(), visible)
    assert acc.rows == 2
    r = acc.result()
    assert r["max_prob"] == pytest.approx(0.5)   # 1/3 if the masked row were counted
    assert r["entropy"] == pytest.approx(1.0)
    assert r["min_entropy"] == pytest.approx(1.0)   # 0 if the masked row were counted
    assert r["onehot_frac"] == 0.0


def test_saturation_of_no_rows_is_none():
    none = {"max_prob": None, "entropy": None, "min_entropy": None, "onehot_frac": None}
    assert SaturationAccumulator().result() == none
    r = _result(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert r == none


def test_saturation_two_chunks_equal_one():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 10, 6, generator=gen, dtype=torch.float64) * 3
    visible = torch.rand(2, 3, 10, 6, generator=gen) > 0.3
    visible[0, 0, 4] = False  # a fully masked row
    probs = torch.nan_to_num(torch.softmax(scores.masked_fill(~visible, -INF), -1), nan=0.0)
    one = SaturationAccumulator()
    one.add(probs, visible)
    two = SaturationAccumulator()
    two.add(probs[:, :, :4], visible[:, :, :4])
    two.add(probs[:, :, 4:], visible[:, :, 4:])
    assert one.rows == two.rows == int((visible.sum(-1) > 0).sum()) < 2 * 3 * 10
    r1, r2 = one.result(), two.result()
    for key in r1:
        assert r1[key] == pytest.approx(r2[key], rel=1e-12)


# --------------------------------------------------------------------------- attention_flops

def _visible_pairs(tq, tk, causal):
    return sum(1 for i in range(tq) for j in range(tk) if not causal or j <= i)


def test_flops_non_causal():
    assert attention_flops(2, 3, 16, 16, 8, False) == 4 * 2 * 3 * 16 * 16 * 8
    assert attention_flops(1, 1, 5, 9, 4, False) == 4 * 5 * 9 * 4


def test_flops_causal_square_counts_the_triangle():
    t = 16
    assert attention_flops(2, 3, t, t, 8, True) == 4 * 2 * 3 * (t * (t + 1) // 2) * 8
    assert attention_flops(1, 1, 1, 1, 1, True) == 4


@pytest.mark.parametrize("tq,tk", [(5, 9), (9, 5), (1, 7), (7, 1), (4, 4), (3, 8), (12, 2)])
def test_flops_causal_top_left_matches_brute_force(tq, tk):
    assert attention_flops(2, 2, tq, tk, 4, True) == 4 * 2 * 2 * _visible_pairs(tq, tk, True) * 4
    assert attention_flops(2, 2, tq, tk, 4, False) == 4 * 2 * 2 * _visible_pairs(tq, tk, False) * 4


# --------------------------------------------------------------------------- golden reference

def direct_attention(q, k, v, *, causal=False, mask=None, scale=None):
    """float64 softmax(QKᵀ·scale)V in one piece; rows with no visible key give 0.

    mask: bool (True = visible) or an additive float mask whose -inf entries hide keys.
    """
    q, k, v = q.double(), k.double(), v.double()
    tq, tk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    keep = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        for i in range(tq):
            for j in range(tk):
                keep[i, j] = j <= i
    keep = keep.expand_as(scores).clone()
    if mask is not None:
        if mask.dtype == torch.bool:
            keep &= mask.expand_as(scores)
        else:
            scores = scores + mask.double()
            keep &= ~torch.isneginf(mask.double()).expand_as(scores)
    scores = scores.masked_fill(~keep, -INF)
    rowmax = scores.amax(-1, keepdim=True).clamp(min=-1e300)
    e = torch.exp(scores - rowmax) * keep
    denom = e.sum(-1, keepdim=True)
    probs = torch.where(denom > 0, e / denom.clamp(min=1e-300), torch.zeros_like(e))
    return torch.einsum("bhij,bhjd->bhid", probs, v), probs, keep


def saturation_by_hand(probs, keep):
    rows_max, rows_ent, onehot = [], [], 0
    p2, k2 = probs.reshape(-1, probs.shape[-1]), keep.reshape(-1, keep.shape[-1])
    for p, k in zip(p2, k2):
        n = int(k.sum())
        if n < 2:  # fully masked rows and rows seeing one key say nothing about saturation
            continue
        p = p[k]
        ent = -sum(float(x) * math.log(float(x)) for x in p if x > 0)
        rows_max.append(float(p.max()))
        rows_ent.append(ent / math.log(n))
        onehot += float(p.max()) > 0.99
    n = len(rows_max)
    return {"max_prob": sum(rows_max) / n, "entropy": sum(rows_ent) / n, "min_entropy": min(rows_ent),
            "onehot_frac": onehot / n}


qkv = partial(random_qkv, tq=7, tk=7)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_golden_equals_direct_float64(causal, dtype):
    q, k, v = qkv(dtype=dtype)
    g = golden_attention(q, k, v, causal=causal)
    expected, probs, keep = direct_attention(q, k, v, causal=causal)
    assert g.out.dtype == torch.float64 and g.out.shape == q.shape
    torch.testing.assert_close(g.out, expected, rtol=1e-12, atol=1e-12)
    hand = saturation_by_hand(probs, keep)
    for key, value in hand.items():
        assert g.saturation[key] == pytest.approx(value, rel=1e-9, abs=1e-12)
    # max |q·k| and max |logit| over visible pairs, by hand
    raw = torch.einsum("bhid,bhjd->bhij", q.double(), k.double())
    max_qk = float(raw.abs().masked_fill(~keep, 0.0).max())
    assert g.saturation["max_qk"] == pytest.approx(max_qk, rel=1e-12)
    assert g.saturation["max_logit"] == pytest.approx(max_qk / math.sqrt(q.shape[-1]), rel=1e-12)
    assert g.alignment == "top-left"
    assert g.row_visible.all()
    assert g.dq is None and g.dk is None and g.dv is None       # no grad_out, no gradients


def test_golden_can_fail_unscaled_is_different():
    q, k, v = qkv(d=16)
    wrong, _, _ = direct_attention(q, k, v, scale=1.0)
    assert not torch.allclose(golden_attention(q, k, v).out, wrong, atol=1e-6)


def test_golden_scale_and_decode_shapes():
    q, k, v = qkv(tq=3, tk=9, d=4)
    for causal in (False, True):
        g = golden_attention(q, k, v, causal=causal, scale=0.3)
        expected, _, _ = direct_attention(q, k, v, causal=causal, scale=0.3)
        torch.testing.assert_close(g.out, expected, rtol=1e-12, atol=1e-12)
    q1, k1, v1 = qkv(tq=1, tk=9, d=4)
    expected, _, _ = direct_attention(q1, k1, v1)
    torch.testing.assert_close(golden_attention(q1, k1, v1).out, expected, rtol=1e-12, atol=1e-12)


class CountingAccumulator(SaturationAccumulator):
    adds = 0

    def add(self, probs, visible):
        type(self).adds += 1
        super().add(probs, visible)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rows_per_chunk", [1, 3])
def test_golden_chunked_equals_unchunked(monkeypatch, causal, rows_per_chunk):
    b, h, t = 1, 2, 10
    q, k, v = qkv(b=b, h=h, tq=t, tk=t)
    mask = torch.rand(t, t, generator=torch.Generator().manual_seed(3)) > 0.4
    mask[5] = False  # a fully masked row
    visible = mask[None, None]                                  # (1, 1, Tq, Tk)
    whole = golden_attention(q, k, v, causal=causal, visible=visible)

    monkeypatch.setattr(reference, "CHUNK_BYTES", rows_per_chunk * b * h * t * 8)
    CountingAccumulator.adds = 0
    monkeypatch.setattr(reference, "SaturationAccumulator", CountingAccumulator)
    chunked = golden_attention(q, k, v, causal=causal, visible=visible)
    assert CountingAccumulator.adds == math.ceil(t / rows_per_chunk)

    torch.testing.assert_close(chunked.out, whole.out, rtol=1e-12, atol=1e-12)
    for key in whole.saturation:
        assert chunked.saturation[key] == pytest.approx(whole.saturation[key], rel=1e-12)
    torch.testing.assert_close(chunked.row_visible, whole.row_visible)
    expected, probs, keep = direct_attention(q, k, v, causal=causal, mask=mask)
    torch.testing.assert_close(chunked.out, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(chunked.row_visible, keep.any(-1))
    assert not chunked.row_visible[..., 5].any()


@pytest.mark.parametrize("mask_shape", [(7, 7), (1, 2, 7, 7)])
def test_golden_fully_masked_rows_give_zero(mask_shape):
    q, k, v = qkv()
    mask = torch.ones(mask_shape, dtype=torch.bool)
    mask[..., 2, :] = False
    mask[..., 4, 5:] = False  # a partly masked row
    g = golden_attention(q, k, v, visible=mask)
    assert not torch.isnan(g.out).any()
    assert torch.count_nonzero(g.out[..., 2, :]) == 0
    assert g.row_visible.shape == (1, 2, 7)
    assert g.row_visible.tolist() == [[[True, True, False, True, True, True, True]] * 2]
    expected, probs, keep = direct_attention(q, k, v, mask=mask)
    torch.testing.assert_close(g.out, expected, rtol=1e-12, atol=1e-12)
    hand = saturation_by_hand(probs, keep)  # leaves the masked row out
    for key, value in hand.items():
        assert g.saturation[key] == pytest.approx(value, rel=1e-9, abs=1e-12)


def test_golden_visible_equals_direct_neg_inf_float_mask():
    # The golden takes the logical visibility; a -inf float mask means the same thing.
    q, k, v = qkv()
    mask = torch.zeros(7, 7)
    mask[3] = -INF
    mask[1, :2] = -INF
    visible = ~torch.isneginf(mask)
    g = golden_attention(q, k, v, visible=visible)
    assert not torch.isnan(g.out).any()
    assert torch.count_nonzero(g.out[..., 3, :]) == 0
    expected, _, _ = direct_attention(q, k, v, mask=mask)
    torch.testing.assert_close(g.out, expected, rtol=1e-12, atol=1e-12)
    assert g.row_visible[..., 3].logical_not().all() and g.row_visible[..., [0, 1, 2, 4, 5, 6]].all()


def test_golden_treats_a_hidden_row_as_masked_whatever_the_mask_form():
    # A finfo.min float mask is finite (a variant gives uniform weights there); the golden
    # never sees the float: a row with no visible key is 0, not the mean of v.
    q, k, v = qkv()
    visible = torch.ones(7, 7, dtype=torch.bool)
    visible[3] = False
    g = golden_attention(q, k, v, visible=visible)
    assert torch.count_nonzero(g.out[..., 3, :]) == 0
    assert not torch.allclose(g.out[..., 3, :], v.double().mean(-2))
    expected, _, _ = direct_attention(q, k, v, mask=visible)
    torch.testing.assert_close(g.out, expected, rtol=1e-12, atol=1e-12)


def test_golden_rejects_an_unknown_alignment():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="sideways"):
        golden_attention(q, k, v, causal=True, alignment="sideways")
