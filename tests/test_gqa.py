"""GQA/MQA (the kv_heads axis), the sliding_window and softcap scenarios, and the GQA
negative control: ids, validation, inputs, golden, every variant, findings, bytes and memory."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from audit.analysis import findings
from audit.core import records
from audit.core.errors import UsageError
from audit.core.referee import failed_checks, refereed
from audit.core.grid import Case
from audit.execute import runner
from audit.measure.golden.numerics import attention_flops, error_vs_reference
from audit.measure.golden.reference import golden_attention, golden_slices, take_slices
from audit.measure.machine.roofline import attention_bytes, cell_roofline
from audit.plan import costmodel
from audit.plan.cell_shape import CellShape
from audit.plan.memory_model import predicted_peak_bytes
from audit.plan.settings import Settings
from audit.workload import presets, variants
from audit.workload.controls import broken_gqa_wrong_head_probs
from audit.workload.draws import window_size
from audit.workload.eager import eager_probs
from audit.workload.inputs import SOFTCAP, make_inputs, seed_for
from audit.workload.presets import LAYOUT_VARIANTS
from tests.helpers import platform_skipped

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"
PRESET = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0, max_cell_s=60.0,
                     energy_window_s=0.0)


def case(variant: str = "eager", *, heads: int = 4, kv_heads: int | None = 2, scenario: str = "normal",
         causal: bool = False, seq_len: int = 32, dtype: str = "fp32") -> Case:
    return Case(variant, "cpu", dtype, 16, seq_len, 1, heads, causal, scenario, kv_heads)


def run(cases) -> dict[str, dict]:
    cache = runner.InputCache()
    return {c.id: runner.run_cell(c, cache, PRESET, {}) for c in cases}


# --------------------------------------------------------------------------- the axis

def test_multi_head_ids_inputs_keys_and_seeds_are_what_they_were():
    mha = Case("sdpa", "cpu", "bf16", 64, 1024, 1, 8, True)
    legacy_key = ("cpu", "bf16", 64, 1024, 1, 8, True, "normal")   # the key before kv_heads existed
    assert mha.id == "sdpa-cpu-bf16-d64-T1024-B1-H8-causal-normal"
    assert mha.input_key == legacy_key
    assert seed_for(mha) == zlib.crc32(repr(legacy_key).encode()) & 0x7FFFFFFF
    same = dataclasses.replace(mha, kv_heads=8)                    # kv_heads == heads is multi-head
    assert same == mha and same.id == mha.id and same.input_key == mha.input_key
    assert mha.axes()["kv_heads"] == 8 and not mha.gqa
    assert dataclasses.replace(mha, heads=4).axes()["kv_heads"] == 4   # kv_heads follows heads


def test_a_gqa_cell_has_its_own_id_and_inputs():
    mha = Case("sdpa", "cpu", "bf16", 64, 1024, 1, 8, True)
    gqa = dataclasses.replace(mha, kv_heads=2)
    assert gqa.id == "sdpa-cpu-bf16-d64-T1024-B1-H8-KV2-causal-normal"
    assert gqa.gqa and gqa.input_key != mha.input_key and seed_for(gqa) != seed_for(mha)
    assert Case.from_mapping(gqa.axes()) == gqa
    old_record = {k: v for k, v in mha.axes().items() if k != "kv_heads"}   # schema 3: no kv_heads
    assert Case.from_mapping(old_record) == mha


@pytest.mark.parametrize("kv", [3, 16, 0, -2])
def test_kv_heads_must_divide_heads(kv):
    with pytest.raises(UsageError) as info:
        case(heads=8, kv_heads=kv)
    assert f"--kv-heads: {kv} does not divide --heads 8" in str(info.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "audit", "run", "--preset", "quick", *args, "--dry-run"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_cli_kv_heads_not_dividing_heads_is_exit_2_naming_both():
    done = _cli("--heads", "4", "--kv-heads", "3")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "attn-audit: error: --kv-heads: 3 does not divide --heads 4; heads must be a multiple of kv_heads "
        "(1 <= kv_heads <= heads)"]
    done = _cli("--kv-heads", "0")
    assert done.returncode == 2 and "--kv-heads: '0' is not a positive integer" in done.stderr
    done = _cli("--heads", "6")                     # the preset's GQA cells have kv_heads 4, 2, 1
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "--kv-heads: 4 does not divide --heads 6" in done.stderr and "give --kv-heads" in done.stderr


def test_cli_kv_heads_selects_gqa_cells():
    done = _cli("--variant", "sdpa", "--heads", "4", "--kv-heads", "4", "2", "--scenario", "normal",
                "--dtype", "fp32", "--seq-len", "64", "--causal", "false", "--batch", "1", "--d-k", "32")
    assert done.returncode == 0, done.stderr
    ids = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("sdpa-")]
    assert ids == ["sdpa-cpu-fp32-d32-T64-B1-H4-full-normal", "sdpa-cpu-fp32-d32-T64-B1-H4-KV2-full-normal"]


# --------------------------------------------------------------------------- inputs

def test_inputs_follow_the_scenario_and_kv_heads():
    gqa = make_inputs(case(kv_heads=2, scenario="sliding_window", causal=True))
    assert gqa.q.shape == (1, 4, 32, 16) and gqa.k.shape == gqa.v.shape == (1, 2, 32, 16)
    assert gqa.grad_out.shape == gqa.q.shape and gqa.needs() == {"gqa"}
    i = torch.arange(32)
    assert torch.equal(gqa.visible[0, 0], (i[:, None] - i[None, :]).abs() < window_size(32))
    assert gqa.mask.dtype == torch.bool and gqa.score_mod is None
    mqa = make_inputs(case(kv_heads=1, scenario="softcap"))
    assert mqa.k.shape == (1, 1, 32, 16) and mqa.needs() == {"gqa", "mqa", "score_mod"}
    assert mqa.score_mod is SOFTCAP and mqa.call_kwargs()["score_mod"] is SOFTCAP
    assert 10 < float(mqa.q.std()) < 22                              # q × 16
    assert "score_mod" not in make_inputs(case(kv_heads=None)).call_kwargs()


# --------------------------------------------------------------------------- golden

@pytest.mark.parametrize("kv", [4, 2, 1])
@pytest.mark.parametrize("masked", [False, True])
def test_golden_matches_sdpa_with_enable_gqa(kv, masked):
    gen = torch.Generator().manual_seed(kv)
    q, g = (torch.randn(2, 4, 24, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(2, kv, 24, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    keep = torch.rand(2, 1, 24, 24, generator=gen) > 0.3 if masked else None
    keep = None if keep is None else keep | torch.eye(24, dtype=torch.bool)   # no empty row
    gold = golden_attention(q, k, v, grad_out=g, causal=True, visible=keep)
    ql, kl, vl = (t.clone().requires_grad_(True) for t in (q, k, v))
    causal = torch.ones(24, 24, dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(ql, kl, vl, attn_mask=causal if keep is None else keep & causal,
                                         enable_gqa=kv != 4)
    dq, dk, dv = torch.autograd.grad(out, (ql, kl, vl), g)
    assert gold.dk.shape == gold.dv.shape == (2, kv, 24, 8)
    for got, want in ((out, gold.out), (dq, gold.dq), (dk, gold.dk), (dv, gold.dv)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_golden_applies_the_score_mod_and_it_changes_the_result():
    inputs = make_inputs(case(kv_heads=2, scenario="softcap"))
    capped = golden_attention(inputs.q, inputs.k, inputs.v, score_mod=inputs.score_mod)
    k, v = (t.double().repeat_interleave(2, 1) for t in (inputs.k, inputs.v))
    s = inputs.q.double() @ k.transpose(-2, -1) / 4.0               # d_k 16
    want = torch.softmax(torch.tanh(s / 50.0) * 50.0, -1) @ v
    torch.testing.assert_close(capped.out, want, rtol=1e-10, atol=1e-12)
    plain = golden_attention(inputs.q, inputs.k, inputs.v)
    # A variant that ignored the cap would be this far off: far outside any error budget.
    assert error_vs_reference(plain.out, capped.out)["rel_err"] > 0.05


def test_golden_subset_takes_whole_groups():
    # one slice's golden FLOPs are above a third of the CPU budget: the subset is needed
    big = dict(batch=2, heads=8, tq=2048, tk=2048, d=128, causal=False, device="cpu")
    per_slice = golden_slices(**big)                                 # multi-head: the old rule
    n = 2 * 8
    k = len(per_slice)
    assert per_slice == [((i * n // k) // 8, (i * n // k) % 8) for i in range(k)]
    assert golden_slices(**big, kv_heads=8) == per_slice
    grouped = golden_slices(**big, kv_heads=2)                      # groups of 4 query heads
    assert grouped and len(grouped) % 4 == 0
    for start in range(0, len(grouped), 4):
        group = grouped[start:start + 4]
        assert len({b for b, _ in group}) == 1 and [h % 4 for _, h in group] == [0, 1, 2, 3]
        assert len({h // 4 for _, h in group}) == 1


def test_a_golden_over_a_subset_of_groups_is_exact_for_them():
    gen = torch.Generator().manual_seed(0)
    q, g = (torch.randn(2, 6, 16, 8, generator=gen) for _ in range(2))
    k, v = (torch.randn(2, 3, 16, 8, generator=gen) for _ in range(2))
    slices = [(0, 2), (0, 3), (1, 4), (1, 5)]                        # kv head 1 of batch 0, kv head 2 of batch 1
    full = golden_attention(q, k, v, grad_out=g)
    sub = golden_attention(take_slices(q, slices), take_slices(k, slices, heads=6), take_slices(v, slices, heads=6),
                           grad_out=take_slices(g, slices))
    assert take_slices(k, slices, heads=6).shape == (1, 2, 16, 8)
    torch.testing.assert_close(sub.out, take_slices(full.out, slices), rtol=0, atol=1e-12)
    torch.testing.assert_close(sub.dk, take_slices(full.dk, slices, heads=6), rtol=0, atol=1e-12)
    torch.testing.assert_close(sub.dv, take_slices(full.dv, slices, heads=6), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- every variant

SDPA = ("sdpa", "sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
NO_CPU_BACKEND = ("sdpa_efficient", "sdpa_cudnn", "efficient_op", "cudnn_op")


CELLS = ((2, "sliding_window", True), (2, "softcap", False), (1, "normal", True))
# Compiled variants cost a compile per cell (seconds here), and flex two (its probes recompile): each gets
# the one cell that matters to it, two query heads a kv head (MQA's one kv head cannot show a head mapped
# to the wrong group); flex's score modification on GQA is flex_eager's softcap cell above, the same
# flex_attention uncompiled.
COMPILED_CELLS = {"compiled": [(2, "softcap", True)], "compiled_unfused": [(2, "sliding_window", False)],
                  "flex": [(2, "sliding_window", True)]}


def test_every_variant_is_right_or_skipped_with_a_reason_on_gqa_window_and_softcap_cells():
    cells = [case(v, kv_heads=kv, scenario=scenario, causal=causal)
             for v in variants.BUILTIN_NAMES for kv, scenario, causal in COMPILED_CELLS.get(v, CELLS)]
    recs = run(cells)
    for c in cells:
        rec = recs[c.id]
        if c.variant in LAYOUT_VARIANTS and rec["status"] == "skipped":      # made for packed or paged cells
            assert any(why in rec["reason"] for why in (
                "takes documents (cu_seqlens), not a mask tensor", "runs on CUDA only", "takes a paged KV cache",
                "no backend for is_causal", "cannot take GQA/MQA", "cannot take a score modification")), (
                c.id, rec["reason"])
        elif "score_mod" in variants.builtin_variants()[c.variant].unsupported and c.scenario == "softcap":
            assert rec["status"] == "skipped", c.id
            assert rec["reason"].startswith(f"{c.variant} cannot take a score modification"), rec["reason"]
        elif c.variant in NO_CPU_BACKEND:
            assert rec["status"] == "skipped" and "cannot run this cell" in rec["reason"], c.id
        elif platform_skipped(rec):                                 # torch refuses it on this machine
            continue
        else:                                                       # ok means right: never silently wrong
            assert rec["status"] == "ok", (c.id, rec["reason"])
            assert rec["within_budget"] is True and rec["rel_err"] < 1e-5, (c.id, rec["rel_err"])
            if c.variant not in ("flex", "flex_eager"):             # no FlexAttention backward on the CPU
                assert max(rec["dq_err"], rec["dk_err"], rec["dv_err"]) < 1e-4, c.id
            assert rec["kv_heads"] == c.effective_kv_heads and rec["id"] == c.id
            assert refereed(rec) and not failed_checks(rec), (c.id, rec["referee_detail"])  # does the work


def test_sdpa_passes_enable_gqa_only_to_gqa_cells():
    """A multi-head call stays exactly what it was; an MQA call without enable_gqa would broadcast."""
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("enable_gqa"))
        return real(*args, **kwargs)
    fn = variants.resolve("sdpa").build()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(F, "scaled_dot_product_attention", spy)
        for kv in (None, 2, 1):
            inputs = make_inputs(case(kv_heads=kv))
            fn(inputs.q, inputs.k, inputs.v, **inputs.call_kwargs())
    assert calls == [None, True, True]


# --------------------------------------------------------------------------- the GQA negative control

def test_gqa_wrong_head_pairs_query_head_h_with_kv_head_h_mod_kv_heads():
    inputs = make_inputs(case(heads=4, kv_heads=2))
    probs = broken_gqa_wrong_head_probs(inputs.q, inputs.k)                  # (B, H, Tq, Tk)
    right = eager_probs(inputs.q, inputs.k)
    for h in range(4):
        torch.testing.assert_close(probs[:, h], eager_probs(inputs.q[:, h:h + 1], inputs.k[:, h % 2:h % 2 + 1])[:, 0])
        torch.testing.assert_close(right[:, h], eager_probs(inputs.q[:, h:h + 1], inputs.k[:, h // 2:h // 2 + 1])[:, 0])


def test_gqa_control_is_flagged_and_the_correct_variants_are_not():
    correct = ("eager", "sdpa", "sdpa_math", "sdpa_flash")
    cells = [case(v, kv_heads=2, causal=causal) for causal in (False, True)
             for v in correct + ("broken.gqa_wrong_head",)]
    recs = run(cells)
    assert all(r["status"] == "ok" for r in recs.values()), [r["reason"] for r in recs.values()]
    found = findings.compute_findings(records.to_frame(recs.values()))
    errors = {(f["variant"], f["check"]) for f in found if f["severity"] == "error"}
    assert ("broken.gqa_wrong_head", "error_budget") in errors
    assert not {v for v, _ in errors} & set(correct)


@pytest.mark.parametrize("kv", [None, 1])
def test_gqa_control_is_skipped_where_every_pairing_is_right(kv):
    rec = run([case("broken.gqa_wrong_head", kv_heads=kv)]).popitem()[1]
    assert rec["status"] == "skipped" and "nothing to detect" in rec["reason"]
    # ... and there it would indeed compute the right thing
    inputs = make_inputs(case(kv_heads=kv))
    torch.testing.assert_close(broken_gqa_wrong_head_probs(inputs.q, inputs.k),
                               eager_probs(inputs.q, inputs.k), rtol=0, atol=0)


# --------------------------------------------------------------------------- plug-ins declare

@pytest.fixture
def plugins_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delitem(sys.modules, "gqa_plugin", raising=False)


def test_a_plugin_gets_only_what_it_declares(plugins_on_path):
    cells = [case(f"gqa_plugin:{name}", kv_heads=kv, scenario=scenario)
             for name in ("declared", "undeclared") for kv, scenario in ((1, "normal"), (None, "softcap"))]
    recs = run(cells)
    for c in cells:
        rec = recs[c.id]
        if c.variant.endswith(":declared"):
            assert rec["status"] == "ok" and rec["within_budget"] is True, rec["reason"]
        else:
            assert rec["status"] == "skipped"
            assert "does not declare it" in rec["reason"] and "gqa_plugin:undeclared.audit_supports" in rec["reason"]


@pytest.mark.parametrize("name,needle", [("declared_as_string", "expected a tuple"),
                                         ("unknown_feature", "'rope'")])
def test_a_bad_declaration_is_a_usage_error(plugins_on_path, name, needle):
    with pytest.raises(UsageError) as info:
        variants.resolve(f"gqa_plugin:{name}")
    assert needle in str(info.value) and "gqa, score_mod" in str(info.value)


# --------------------------------------------------------------------------- bytes, FLOPs, memory

def test_bytes_shrink_with_kv_heads_while_flops_do_not():
    b, h, t, d = 2, 16, 8192, 128
    by_kv = {kv: attention_bytes(b, h, t, t, d, "bf16", kv_heads=kv) for kv in (16, 4, 1)}
    assert by_kv[16] == attention_bytes(b, h, t, t, d, "bf16")       # multi-head: as before
    assert by_kv[16] > by_kv[4] > by_kv[1]
    assert by_kv[16] - by_kv[4] == 2 * b * 12 * t * d * 2            # K and V of 12 fewer heads
    rows = [cell_roofline(case(kv_heads=kv, heads=4).axes(), 1e-3, 2e-3, {}) for kv in (4, 2, 1)]
    assert rows[0]["bytes"] > rows[1]["bytes"] > rows[2]["bytes"]
    assert rows[0]["fwd_bwd_bytes"] > rows[1]["fwd_bwd_bytes"] > rows[2]["fwd_bwd_bytes"]
    shapes = [CellShape.of(case("sdpa", heads=4, kv_heads=kv)) for kv in (4, 2, 1)]
    assert len({s.flops for s in shapes}) == 1
    assert shapes[0].flops == attention_flops(1, 4, 32, 32, 16, False)


def test_memory_model_follows_the_real_shapes():
    def peak(variant, kv, seq_len=131072):
        c = Case(variant, "cuda", "bf16", 128, seq_len, 1, 16, False, "decode", kv)
        return predicted_peak_bytes(c, 1)[0]
    # decoding against a long cache: the gradients of k and v dominate and shrink with kv_heads
    assert peak("compiled_unfused", 16) > peak("compiled_unfused", 4) > peak("compiled_unfused", 1)
    assert peak("compiled_unfused", 4) == (16 * 1 + 2 * 4 * 131072) * 128 * 2
    # eager repeats k and v per query head: its peak does not shrink below the copies
    assert peak("eager", 4) == peak("eager", 1) >= 2 * 16 * 131072 * 128 * 2
    # square attention: the score matrix (and for eager the copies) as before
    square = Case("eager", "cpu", "fp32", 64, 1024, 1, 8, False, "normal")
    assert predicted_peak_bytes(square, 1024)[0] == 8 * 1024 * 1024 * 16
    gqa = dataclasses.replace(square, kv_heads=2)
    assert predicted_peak_bytes(gqa, 1024)[0] == 8 * 1024 * 1024 * 16 + 2 * 8 * 1024 * 64 * 4


# --------------------------------------------------------------------------- cost model and presets

def test_cost_model_predicts_the_skips_and_compiles_per_kv_heads():
    cells = [case("sdpa", scenario="softcap"), case("broken.gqa_wrong_head", kv_heads=None),
             case("compiled", kv_heads=None), case("compiled", kv_heads=2)]
    pred = costmodel.CostModel().predict(cells, Settings()).set_index("id")
    assert pred.loc[cells[0].id, "status"] == "skipped" and "score modification" in pred.loc[cells[0].id, "reason"]
    assert pred.loc[cells[1].id, "status"] == "skipped" and "nothing to detect" in pred.loc[cells[1].id, "reason"]
    assert pred.loc[cells[2].id, "compile"] > 0 and pred.loc[cells[3].id, "compile"] > 0
    assert list(pred["kv_heads"]) == [2, 4, 4, 2]


@pytest.mark.parametrize("name", ["quick", "cpu", "gpu"])
def test_presets_have_gqa_cells_and_the_new_scenarios(name):
    cells = presets.preset_cases(presets.presets()[name])
    assert {c.effective_kv_heads for c in cells if c.heads == (16 if name == "gpu" else 4)} >= \
        ({16, 4, 1} if name == "gpu" else {4, 2, 1})
    assert {"sliding_window", "softcap"} <= {c.scenario for c in cells}
    assert any(c.variant == "broken.gqa_wrong_head" and c.gqa and c.effective_kv_heads > 1 for c in cells)
    if name == "gpu":
        decode = [c for c in cells if c.scenario == "decode" and c.gqa]
        assert max(c.seq_len for c in decode) == 131072 and {c.effective_kv_heads for c in decode} == {4, 1}
        for c in decode:                                            # the golden stays whole and bounded
            assert golden_slices(c.batch, c.heads, 1, c.seq_len, c.d_k, c.causal, "cuda",
                                 kv_heads=c.effective_kv_heads) is None
