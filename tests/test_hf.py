"""transformers' attention functions as hf: variants, called as a model calls them with the masks
transformers builds: hf:sdpa agrees with sdpa, hf:eager leaks on fully masked rows (its finfo.min
mask), names that cannot run here are skipped with the reason, and a user's registered kernel runs."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from audit.core.errors import UsageError
from audit.core.grid import Case
from tests.helpers import platform_skipped

# Skipped without transformers; imported where used (every pytest-xdist worker collects this
# module, and importing transformers costs each 1.8 s).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers is an optional extra: pip install attn-audit[hf] "
                                       "(make test installs it)")

PLUGINS = Path(__file__).resolve().parent / "plugins"
SCENARIOS = ("normal", "padding", "left_padding", "fully_masked_bool", "fully_masked_neginf", "sliding_window",
             "cross_causal", "decode", "softcap", "shifted_bias")
VARIANTS = ("hf:eager", "hf:sdpa", "hf:flex_attention", "sdpa", "hf:hf_plugin:mine", "hf:hf_plugin:nomask")
# hf:flex_attention compiles for each kind of cell (the first 19 s, the next 9 s on a 2-core AMD
# EPYC, Inductor's cache cold, as in CI): one kind, and one it declines before compiling
FLEX_CELLS = {("cross_causal", True), ("fully_masked_neginf", False)}


@pytest.fixture(scope="module")
def cells():
    """Records of a GQA shape (4 query heads, 2 kv heads) in fp32 and fp16 (flex: FLEX_CELLS in fp32),
    made in this process with the runner's own run_cell and build cache."""
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets

    sys.path.insert(0, str(PLUGINS))
    try:
        preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
        cache, builds = cellcache.InputCache(), cellcache.BuildCache()
        got = {}
        for dtype in ("fp32", "fp16"):
            for scenario in SCENARIOS:
                for causal in (False, True):
                    for variant in VARIANTS:
                        if variant == "hf:flex_attention" and (dtype, (scenario, causal)) not in (
                                ("fp32", c) for c in FLEX_CELLS):
                            continue
                        if dtype == "fp16" and variant == "hf:hf_plugin:nomask":
                            continue
                        case = Case(variant, "cpu", dtype, 16, 32, 1, 4, causal, scenario, kv_heads=2)
                        got[variant, dtype, scenario, causal] = runner.run_cell(case, cache, preset, {},
                                                                                builds=builds)
        yield got
    finally:
        sys.path.remove(str(PLUGINS))


def test_no_hf_cell_is_an_error(cells):
    bad = {k: r["reason"] for k, r in cells.items() if r["status"] not in ("ok", "skipped")}
    assert not bad
    assert sum(r["status"] == "ok" for r in cells.values()) >= 0.75 * len(cells)


def test_transformers_attention_functions_pass_every_referee_check(cells):
    """transformers' functions do the work on every call: the referee has nothing to say about them."""
    from audit.core.referee import failed_checks, refereed
    ok = [r for r in cells.values() if r["status"] == "ok" and r["variant"].startswith("hf:")]
    assert ok and all(refereed(r) for r in ok)
    assert {r["id"]: r["referee_detail"] for r in ok if failed_checks(r)} == {}


def test_hf_sdpa_agrees_with_sdpa_on_every_cell(cells):
    compared = 0
    for (variant, dtype, scenario, causal), rec in cells.items():
        if variant != "hf:sdpa" or rec["status"] != "ok":
            continue
        ours = cells["sdpa", dtype, scenario, causal]
        assert rec["within_budget"], (dtype, scenario, causal)
        assert rec["masked_rows"] == ours["masked_rows"], (dtype, scenario, causal)
        assert not rec["leak_max_change"], (dtype, scenario, causal)
        compared += 1
    assert compared >= 30


def test_findings_flag_hf_eager_s_finfo_min_mask_and_nothing_of_hf_sdpa(cells):
    from audit.analysis.findings import compute_findings
    from audit.core import records

    found = compute_findings(records.to_frame(list(cells.values())))
    about = {(f["check"], f["variant"]) for f in found if f["severity"] == "error"}
    assert ("masked_leakage", "hf:eager") in about
    assert not {f for f in about if f[1] in ("hf:sdpa", "hf:hf_plugin:mine")}, about
    eager = cells["hf:eager", "fp32", "fully_masked_bool", False]
    assert eager["masked_rows"] == "uniform" and eager["leak_max_change"] > 1      # finfo.min: uniform weights
    assert cells["hf:sdpa", "fp32", "fully_masked_bool", False]["masked_rows"] == "zero"


def test_causal_hf_cells_follow_the_kv_cache_alignment(cells):
    flex = cells["hf:flex_attention", "fp32", "cross_causal", True]
    refused = platform_skipped(flex)             # no compiled flex on this CPU (ATEN_CPU_CAPABILITY=default)
    for variant in ("hf:eager", "hf:sdpa") + (() if refused else ("hf:flex_attention",)):
        rec = cells[variant, "fp32", "cross_causal", True]
        assert rec["status"] == "ok"
        assert rec["causal_alignment"] == "bottom-right" == rec["golden_alignment"], variant
    assert cells["sdpa", "fp32", "cross_causal", True]["causal_alignment"] == "top-left"
    if refused:
        pytest.skip(f"hf:flex_attention: {flex['reason']}")


def test_what_transformers_cannot_give_a_cell_is_skipped_with_the_reason(cells):
    assert "ignores softcap" in cells["hf:eager", "fp32", "softcap", False]["reason"]
    from audit.workload import variants
    assert variants.resolve("hf:flex_attention").refusal({"score_mod"}) is None    # it takes softcap
    assert variants.resolve("hf:sdpa").upstream == "transformers"              # its findings shrink (test_shrink.py)
    assert "SIGSEGV" in cells["hf:flex_attention", "fp32", "fully_masked_neginf", False]["reason"]
    nomask = cells["hf:hf_plugin:nomask", "fp32", "padding", False]
    assert nomask["status"] == "skipped" and "no mask function" in nomask["reason"]
    assert cells["hf:hf_plugin:nomask", "fp32", "normal", True]["status"] == "ok"


@pytest.mark.parametrize("name, words", [
    ("hf:flash_attention_2", "needs flash-attn"),
    ("hf:paged|eager", "paged KV cache"),
])
def test_names_that_cannot_run_here_are_skipped(name, words):
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets

    rec = runner.run_cell(Case(name, "cpu", "fp32", 16, 32, 1, 2, False, "normal"), cellcache.InputCache(),
                          presets.presets()["quick"], {})
    assert rec["status"] == "skipped" and words in rec["reason"]


def test_an_unknown_hf_name_or_missing_transformers_is_a_usage_error(monkeypatch):
    from audit.workload import hf, variants

    with pytest.raises(UsageError, match="hf:nope is not registered.*hf:MODULE:nope"):
        variants.resolve("hf:nope")
    monkeypatch.setattr(hf, "transformers_version", lambda: None)
    with pytest.raises(UsageError, match=r"pip install 'attn-audit\[hf\]'"):
        variants.resolve("hf:sdpa")


def test_list_shows_the_hf_names_of_this_environment(capsys):
    from audit import cli

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "hf:sdpa                  available" in out and "hf:eager" in out
    assert "hf:flash_attention_2     not here" in out


def test_an_hf_finding_has_a_script_that_reproduces_it(cells, tmp_path):
    """hf:eager's leak on fully masked rows: its reproduction script (which imports transformers,
    whose code the variant is) measures the audit's number again and exits 1."""
    import subprocess
    import sys as _sys

    from audit.analysis.findings import compute_findings
    from audit.core import records
    from audit.repro.scripts import write_repro_scripts

    keep = [r for (v, dtype, scenario, _), r in cells.items()
            if v in ("hf:eager", "sdpa") and dtype == "fp32" and scenario == "fully_masked_bool"]
    with records.RecordWriter(tmp_path) as writer:
        for rec in keep:
            writer.write(rec)
    found = [f for f in compute_findings(records.to_frame(keep))
             if (f["check"], f["variant"]) == ("masked_leakage", "hf:eager")]
    [entry] = write_repro_scripts(tmp_path, found)
    assert "repro" in entry, entry.get("repro_reason")
    script = tmp_path / entry["repro"]
    done = subprocess.run([_sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "REPRODUCED" in done.stdout and "import transformers" in script.read_text()
