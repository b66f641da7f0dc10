"""Compiled code is built once per shapes, dtype, causal flag and mask kind, and reused."""
from __future__ import annotations

import tempfile
from pathlib import Path

from audit.core.grid import Case
from audit.execute import runner
from audit.measure.cell import cellcache
from audit.workload import presets

PRESET = presets.Preset(name="t", description="", grids=(), min_samples=1, min_time_s=0.0,
                        max_cell_s=60.0, energy_window_s=0.0)


def test_compiled_code_is_reused_by_cells_of_the_same_shapes_dtype_and_mask_kind():
    """normal and scaled_x4 differ only in values: the second reuses the first's compiled code;
    padding brings a mask tensor: compiled anew."""
    cache, builds = cellcache.InputCache(), cellcache.BuildCache()
    recs = [runner.run_cell(Case("compiled_unfused", "cpu", "fp32", 8, 16, 1, 2, False, s), cache, PRESET, {},
                            builds=builds) for s in ("normal", "scaled_x4", "padding")]
    assert [r["status"] for r in recs] == ["ok"] * 3, [r["reason"] for r in recs]
    assert [r["compile_reused"] for r in recs] == [False, True, False]
    assert recs[0]["compile_s"] > 0 and recs[1]["compile_s"] is None and recs[2]["compile_s"] > 0
    assert recs[1]["fused_sdpa"] == recs[0]["fused_sdpa"] is False
    assert [r["graph_breaks"] for r in recs] == [0, 0, 0]                 # one graph each


def test_build_cache_keys_on_shapes_dtype_causal_and_mask_kind():
    from audit.workload.inputs import make_inputs
    from audit.workload.variants import resolve
    variant = resolve("compiled")
    key = cellcache.BuildCache.key
    base = make_inputs(Case("compiled", "cpu", "fp32", 8, 16, 1, 2, False, "normal"))
    same = make_inputs(Case("compiled", "cpu", "fp32", 8, 16, 1, 2, False, "outliers"))
    assert key(variant, base) == key(variant, same)
    for other in (Case("compiled", "cpu", "bf16", 8, 16, 1, 2, False, "normal"),
                  Case("compiled", "cpu", "fp32", 8, 32, 1, 2, False, "normal"),
                  Case("compiled", "cpu", "fp32", 8, 16, 1, 2, True, "normal"),
                  Case("compiled", "cpu", "fp32", 8, 16, 1, 2, False, "fully_masked_bool"),
                  Case("compiled", "cpu", "fp32", 8, 16, 1, 2, False, "fully_masked_neginf")):
        assert key(variant, make_inputs(other)) != key(variant, base), other


def test_a_compile_that_builds_kernels_is_a_miss_and_one_that_finds_them_a_hit(tmp_path, monkeypatch):
    """In an empty Inductor cache, a shape no other test compiles (d_k 24, T 40) builds its
    kernels: miss. A new build of the same (a fresh BuildCache) finds them: hit. A cell that
    reuses compiled code compiles nothing: null."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cells = [Case("compiled_unfused", "cpu", "fp32", 24, 40, 1, 2, False, s) for s in ("normal", "scaled_x4")]
    outcomes = []
    for _ in range(2):
        cache, builds = cellcache.InputCache(), cellcache.BuildCache()
        recs = [runner.run_cell(c, cache, PRESET, {}, builds=builds) for c in cells]
        assert [r["status"] for r in recs] == ["ok", "ok"], [r["reason"] for r in recs]
        outcomes.append([r["compile_cache"] for r in recs])
    assert outcomes == [["miss", None], ["hit", None]]
    assert any(tmp_path.joinpath("inductor").rglob("*.so"))


def test_only_new_compiled_binaries_make_a_miss(tmp_path, monkeypatch):
    from audit.measure.machine import compile_cache
    root = tmp_path / "inductor"
    (root / "ab").mkdir(parents=True)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root))
    assert not compile_cache.warm(root)
    before = compile_cache.snapshot()
    (root / "ab" / "wrapper.py").write_text("# a Python wrapper: written by hits too\n")
    (root / "locks").mkdir()
    (root / "locks" / "k.lock").write_text("")
    assert compile_cache.outcome(before) == "hit"
    (root / "cd").mkdir()
    (root / "cd" / "kernel.main.so").write_bytes(b"\x7fELF")
    assert compile_cache.outcome(before) == "miss"
    assert compile_cache.outcome(compile_cache.snapshot()) == "hit"     # nothing new since
    assert compile_cache.warm(root)


def test_precompiled_headers_count_as_built_only_where_a_header_newer_than_torch_is(tmp_path, monkeypatch):
    """Inductor keeps its precompiled headers in the temporary folder whatever TORCHINDUCTOR_CACHE_DIR says: a
    new TMPDIR has none (the first compile builds them, 7.6 s on 2 cores), a new Inductor cache finds them."""
    import os
    import tempfile

    from audit.measure.machine import compile_cache
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)          # gettempdir() reads TMPDIR again
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert not compile_cache.headers_built()
    folder = os.path.join(compile_cache._default_dir(), compile_cache.HEADERS_DIR)
    assert folder.startswith(str(tmp_path))
    os.makedirs(folder)
    header = os.path.join(folder, "c4pz.h.gch")
    with open(header, "wb") as out:
        out.write(b"gpch")
    assert compile_cache.headers_built()
    os.utime(header, (0, 0))                                # built before this torch was installed
    assert not compile_cache.headers_built()


def _breaking(attention):
    """`attention` with a graph break before it, as an untraceable call would make."""
    def breaking_attention(q, k, v, **kwargs):
        import torch
        torch._dynamo.graph_break()
        return attention(q, k, v, **kwargs)
    return breaking_attention


def test_graph_breaks_are_counted_and_kept_for_the_cells_that_reuse_the_code(monkeypatch):
    from audit.workload import torch_kernels
    monkeypatch.setattr(torch_kernels, "eager_attention", _breaking(torch_kernels.eager_attention))
    cache, builds = cellcache.InputCache(), cellcache.BuildCache()
    recs = [runner.run_cell(Case("compiled", "cpu", "fp32", 8, 24, 1, 2, False, s), cache, PRESET, {},
                            builds=builds) for s in ("normal", "scaled_x4")]
    assert [r["status"] for r in recs] == ["ok", "ok"], [r["reason"] for r in recs]
    assert recs[0]["graph_breaks"] >= 1
    assert recs[1]["compile_reused"] is True and recs[1]["graph_breaks"] == recs[0]["graph_breaks"]


def test_flex_fails_on_a_graph_break_instead_of_running_eagerly(monkeypatch):
    """Without fullgraph, a break inside flex_attention made Dynamo run it eagerly (flex then
    builds the full score matrix) and the cell was timed as "flex". The break is met while Dynamo
    traces, before Inductor's lowering: on a CPU whose lowering torch refuses (ATEN_CPU_CAPABILITY=
    default) the built-in's refusal before compiling is set aside to reach it."""
    import pytest
    import torch

    from audit.workload import platform_limits
    from audit.workload.variants import resolve

    def breaking_score_mod(score):
        torch._dynamo.graph_break()
        return score
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    monkeypatch.setattr(platform_limits, "flex_cpu_supported", lambda: True)
    flex = resolve("flex").build()         # (flex cells of the quick preset run it without a break)
    with pytest.raises(RuntimeError, match="did not compile as one graph"):
        flex(q, k, v, score_mod=breaking_score_mod)


def test_the_cache_folder_is_the_one_torch_resolves(tmp_path, monkeypatch):
    """compile_cache.cache_dir resolves the folder itself (no import of torch._inductor): from
    TORCHINDUCTOR_CACHE_DIR, a relative path made absolute, and without it torch's default in the
    temporary folder; the folder is made, as torch's own cache_dir() does."""
    from torch._inductor.runtime.runtime_utils import cache_dir as torch_cache_dir
    from audit.measure.machine import compile_cache
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "relative/inductor")
    ours = compile_cache.cache_dir()
    assert ours == str(tmp_path / "relative" / "inductor") and (tmp_path / "relative" / "inductor").is_dir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "relative/inductor")    # torch's writes the absolute path back
    assert torch_cache_dir() == ours
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)          # gettempdir() reads TMPDIR again
    (tmp_path / "tmp").mkdir()
    ours = compile_cache.cache_dir()
    assert ours.startswith(str(tmp_path / "tmp")) and Path(ours).is_dir()
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert torch_cache_dir() == ours
