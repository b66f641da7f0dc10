"""audit.adapt: a library kernel audited by declaration (its layout, causal alignment, mask forms
and argument names), on stand-ins of flash-attn's and xFormers' signatures (plugins/standins.py),
and the README's two declarations are the ones tested here (plugins/declared.py)."""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

import audit
from audit.core.errors import Unsupported, UsageError
from audit.core.grid import Case

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"
SCENARIOS = ("normal", "cross_causal", "decode", "padding", "fully_masked_bool", "fully_masked_neginf",
             "softcap", "left_padding")


def _declarations(text: str) -> list[str]:
    """Every `NAME = audit.adapt(...)` statement of a text, whitespace collapsed."""
    found = re.findall(r"^((\w+) = audit\.adapt\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\))", text, flags=re.M)
    return [re.sub(r"\s+", " ", d) for d, name in found if name in ("flash", "xformers")]


def test_the_readme_declares_flash_attn_and_xformers_as_the_tested_plugins_do():
    readme = _declarations((ROOT / "README.md").read_text())
    tested = _declarations((PLUGINS / "declared.py").read_text())
    assert len(tested) == 2 and readme == tested, (readme, tested)


@pytest.fixture(scope="module")
def cells():
    """One record per (plug-in, scenario, causal) on a GQA shape (4 query heads, 2 kv heads), made
    in this process with the runner's own run_cell."""
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets

    sys.path.insert(0, str(PLUGINS))
    try:
        preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
        cache = cellcache.InputCache()
        got = {}
        for name in ("declared:flash", "declared:xformers", "declared:flash_misdeclared"):
            for scenario in SCENARIOS:
                for causal in (False, True):
                    case = Case(name, "cpu", "fp32", 16, 32, 1, 4, causal, scenario, kv_heads=2)
                    got[name, scenario, causal] = runner.run_cell(case, cache, preset, {})
        yield got
    finally:
        sys.path.remove(str(PLUGINS))


def test_declared_kernels_get_no_error_cell_and_follow_their_bottom_right_alignment(cells):
    assert {r["status"] for r in cells.values()} <= {"ok", "skipped"}, [
        (k, r["reason"]) for k, r in cells.items() if r["status"] not in ("ok", "skipped")]
    for name in ("declared:flash", "declared:xformers"):
        for scenario in ("cross_causal", "decode"):
            rec = cells[name, scenario, True]
            if rec["status"] == "skipped":
                continue
            assert rec["causal_alignment"] == "bottom-right" and rec["golden_alignment"] == "bottom-right"
            assert rec["within_budget"] and rec["dq_err"] < 1e-5
    flash = cells["declared:flash", "cross_causal", True]
    assert flash["status"] == "ok"
    assert cells["declared:flash", "softcap", True]["status"] == "ok"        # softcap_arg="softcap"


def test_declared_kernels_pass_every_referee_check(cells):
    """The stand-ins do the work on every call: the referee has nothing to say about them."""
    from audit.core.referee import failed_checks, refereed
    ok = [r for r in cells.values() if r["status"] == "ok"]
    assert ok and all(refereed(r) for r in ok)
    assert {r["id"]: r["referee_detail"] for r in ok if failed_checks(r)} == {}


def test_cells_a_declared_kernel_cannot_take_are_skipped_with_the_reason(cells):
    padding = cells["declared:flash", "padding", False]
    assert padding["status"] == "skipped" and "flash_attn_func takes masks: none" in padding["reason"]
    assert "key padding mask" in padding["reason"]
    # xFormers' memory_efficient_attention in the BMHK layout takes no GQA: undeclared, skipped
    gqa = cells["declared:xformers", "normal", False]
    assert gqa["status"] == "skipped" and "GQA" in gqa["reason"]
    softcap = cells["declared:xformers", "softcap", False]
    assert softcap["status"] == "skipped"


def test_a_bottom_right_kernel_declared_top_left_is_caught(cells):
    """The same stand-in declared with the wrong alignment: its cross_causal cells are outside the
    error budget (measured against the top-left golden), the correctly declared one's are not."""
    from audit.analysis.findings import compute_findings
    from audit.core import records

    wrong = cells["declared:flash_misdeclared", "cross_causal", True]
    assert wrong["status"] == "ok" and wrong["golden_alignment"] == "top-left"
    assert wrong["causal_alignment"] == "bottom-right" and wrong["within_budget"] is False
    found = compute_findings(records.to_frame(list(cells.values())))
    budget = {f["variant"] for f in found if f["check"] == "error_budget"}
    assert budget == {"declared:flash_misdeclared"}


def _qkv(b=2, h=2, tq=8, tk=8, d=4):
    return torch.randn(b, h, tq, d), torch.randn(b, h, tk, d), torch.randn(b, h, tk, d)


def test_masks_are_converted_to_the_declared_form():
    seen = {}

    def kernel(q, k, v, attn_mask=None, key_padding_mask=None, causal=False):
        seen.update(attn_mask=attn_mask, key_padding_mask=key_padding_mask, causal=causal, q=q)
        return q

    q, k, v = _qkv()
    keep = torch.tensor([True] * 6 + [False] * 2)[None, None, None, :].expand(2, 1, 1, 8)   # (B, 1, 1, Tk)
    audit.adapt(kernel, masks=("additive",), scale_arg=None)(q, k, v, mask=keep)
    assert seen["attn_mask"].dtype == q.dtype and seen["attn_mask"][0, 0, 0, -1] == float("-inf")
    audit.adapt(kernel, masks=("key_padding",), scale_arg=None)(q, k, v, mask=keep)
    assert seen["attn_mask"] is None and seen["key_padding_mask"].shape == (2, 8)
    audit.adapt(kernel, layout="bthd", causal=None, masks=("bool",), scale_arg=None)(q, k, v, causal=True)
    assert seen["causal"] is False and seen["attn_mask"][0, 0].equal(torch.ones(8, 8, dtype=torch.bool).tril())
    assert seen["q"].shape == (2, 8, 2, 4)                                               # (B, T, H, d)
    with pytest.raises(Unsupported, match="additive float mask"):
        audit.adapt(kernel, masks=("bool",), scale_arg=None)(q, k, v, mask=torch.zeros(1, 1, 8, 8))
    with pytest.raises(Unsupported, match="no causal masking"):
        audit.adapt(kernel, causal=None, scale_arg=None)(q, k, v, causal=True)


def test_a_causal_flag_that_shares_the_mask_argument_is_folded_in_the_declared_alignment():
    """xFormers passes causal and a tensor bias through one attn_bias: a masked causal cell gets
    one additive bias with the causal part folded in, bottom-right as declared."""
    seen = {}

    def kernel(q, k, v, attn_bias=None):
        seen["bias"] = attn_bias
        return q

    fn = audit.adapt(kernel, causal="bottom-right", causal_arg=("attn_bias", "CAUSAL"), masks=("additive",),
                     mask_arg="attn_bias", scale_arg=None)
    q, k, v = _qkv(tq=4, tk=8)
    fn(q, k, v, causal=True)
    assert seen["bias"] == "CAUSAL"
    fn(q, k, v, causal=True, mask=torch.zeros(1, 1, 4, 8))
    visible = torch.isfinite(seen["bias"][0, 0])                                         # (Tq, Tk)
    assert visible.equal(torch.ones(4, 8, dtype=torch.bool).tril(4))


@pytest.mark.parametrize("kwargs, words", [
    (dict(layout="tbhd"), "layout='tbhd'; allowed: 'bhtd', 'bthd', 'thd'"),
    (dict(causal="top-right"), "causal='top-right'"),
    (dict(masks=("padding",)), "unknown form(s) 'padding'; allowed: none, bool, additive, key_padding"),
    (dict(returns="all"), "returns='all'"),
    (dict(causal_arg=None), "causal is declared but causal_arg is None"),
])
def test_a_bad_declaration_names_the_value_and_what_is_allowed(kwargs, words):
    with pytest.raises(UsageError) as err:
        audit.adapt(lambda q, k, v: q, **kwargs)
    assert words in str(err.value)
