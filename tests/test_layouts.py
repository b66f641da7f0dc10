"""Packed documents, paged KV caches, latent heads (d_v != d_k) and batch and chunk invariance: the
scenarios' layouts, the checks on an implementation that must trigger them and on one that must
not, the controls caught and diagnosed, and flash-attn's varlen declaration (docs/variants.md) on a
stand-in of its exact signature."""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

from audit.core.errors import UsageError
from audit.core.grid import Case
from tests.helpers import platform_skipped

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"


def _run(cases):
    from audit.execute import runner
    from audit.measure.cell import cellcache
    from audit.workload import presets
    preset = dataclasses.replace(presets.presets()["quick"], min_samples=1, min_time_s=0.0)
    cache = cellcache.InputCache()
    return {c.id: runner.run_cell(c, cache, preset, {}) for c in cases}


def _findings(records):
    from audit.analysis.findings import compute_findings
    from audit.core.records import to_frame
    return compute_findings(to_frame(list(records.values())))


def _cell(variant, scenario, causal=False, batch=2, d_v=None, dtype="fp32", d_k=16, seq_len=64, heads=2, kv=None):
    return Case(variant, "cpu", dtype, d_k, seq_len, batch, heads, causal, scenario, kv, d_v)


# --------------------------------------------------------------------------- the d_v axis


def test_d_v_is_an_optional_axis_that_keeps_every_other_cell_and_seed():
    from audit.workload.inputs import make_inputs, seed_for
    plain = Case("eager", "cpu", "fp32", 32, 64, 1, 2, False)
    assert Case("eager", "cpu", "fp32", 32, 64, 1, 2, False, d_v=32) == plain     # d_v == d_k: the same cell
    latent = Case("eager", "cpu", "fp32", 32, 64, 1, 2, False, d_v=16)
    assert plain.id == "eager-cpu-fp32-d32-T64-B1-H2-full-normal"
    assert latent.id == "eager-cpu-fp32-d32v16-T64-B1-H2-full-normal"
    assert plain.input_key == ("cpu", "fp32", 32, 64, 1, 2, False, "normal")       # as before the axis
    assert seed_for(latent) != seed_for(plain) and latent.axes()["d_v"] == 16 and plain.axes()["d_v"] == 32
    inputs = make_inputs(latent)
    assert inputs.v.shape == (1, 2, 64, 16) and inputs.grad_out.shape == (1, 2, 64, 16)
    assert inputs.k.shape == (1, 2, 64, 32) and inputs.needs() == {"latent"}


def test_old_records_read_d_v_as_d_k():
    from audit.core.records import SCHEMA_VERSION, migrate
    old = {"schema": 12, "id": "x", "d_k": 64, "variant": "eager", "status": "ok"}
    new = migrate(old)
    assert new["schema"] == SCHEMA_VERSION and new["d_v"] == 64 and new["cross_doc_max_change"] is None


def test_flops_count_d_v_and_the_documents():
    from audit.measure.golden.numerics import attention_flops
    from audit.workload.packing import packed_documents, visible_pairs_packed
    assert attention_flops(1, 2, 8, 8, 32, False) == 4 * 2 * 64 * 32
    assert attention_flops(1, 2, 8, 8, 32, False, d_v=16) == 2 * 2 * 64 * (32 + 16)
    recs = _run([_cell("sdpa", "packed", causal, batch=2, d_v=8) for causal in (False, True)])
    for rec in recs.values():
        pairs = visible_pairs_packed(packed_documents(2, 64), rec["causal"]) * 2      # per head, 2 heads
        assert rec["flops"] == 2 * pairs * (16 + 8)


def test_every_builtin_variant_is_right_or_skipped_with_a_reason_on_latent_cells():
    from audit.workload.variants import BUILTIN_NAMES
    recs = _run([_cell(v, "normal", causal, batch=1, d_v=8) for v in BUILTIN_NAMES for causal in (False, True)
                 if v not in ("compiled", "compiled_unfused", "flex")])       # compiled: their own test below
    for rec in recs.values():
        assert rec["status"] in ("ok", "skipped"), (rec["id"], rec["reason"])
        if rec["status"] == "skipped":
            assert rec["reason"]
        else:
            assert rec["within_budget"], rec["id"]
    assert recs[_cell("flash_op", "normal", batch=1, d_v=8).id]["status"] == "skipped"
    assert recs[_cell("sdpa", "normal", batch=1, d_v=8).id]["status"] == "ok"


def test_the_v_stride_control_is_caught_and_diagnosed_and_skipped_where_d_v_is_d_k():
    recs = _run([_cell("broken.v_read_at_k_stride", "normal", causal, batch=1, d_v=8) for causal in (False, True)]
                + [_cell("broken.v_read_at_k_stride", "normal", batch=1)])
    latent = [r for r in recs.values() if r["d_v"] == 8]
    assert all(r["within_budget"] is False and r["diagnosis"] == "v_read_at_k_stride" for r in latent)
    assert recs[_cell("broken.v_read_at_k_stride", "normal", batch=1).id]["status"] == "skipped"


# --------------------------------------------------------------------------- packed documents


def test_packed_documents_hold_an_empty_one_a_single_token_and_trailing_padding():
    from audit.workload.inputs import make_inputs
    from audit.workload.packing import cu_seqlens_of, packed_documents, padding_rows
    docs = packed_documents(2, 64)
    assert all(0 in row and 1 in row for row in docs)
    assert sum(docs[0]) == 64 and sum(docs[1]) == 64 - padding_rows(64) == 56
    inputs = make_inputs(_cell("sdpa", "packed"))
    cu = inputs.cu_seqlens.tolist()
    assert cu == cu_seqlens_of(docs) and cu[-1] == 2 * 64 - 8 and inputs.cu_seqlens.dtype == torch.int32
    vis = inputs.visible                                                    # (B, 1, T, T)
    assert not vis[1, 0, 56:].any() and not vis[1, 0, :, 56:].any()        # padding: no document owns it
    assert vis[0, 0, 0, :24].all() and not vis[0, 0, 0, 24:].any()         # document 0: its 24 tokens


def test_cross_document_attention_is_caught_on_a_kernel_that_drops_the_boundaries_and_not_on_correct_ones():
    recs = _run([_cell(v, "packed", causal) for v in ("sdpa", "packed_loop", "flex_eager",
                                                      "broken.document_boundary_ignored")
                 for causal in (False, True)])
    for rec in recs.values():
        assert rec["status"] == "ok", rec["reason"]
        bad = rec["variant"].startswith("broken.")
        assert (rec["cross_doc_max_change"] > 1.0) if bad else rec["cross_doc_max_change"] == 0.0, rec["id"]
        if not bad:
            assert rec["within_budget"] and rec["masked_rows"] == "zero"         # padding rows: 0
    found = {(f["check"], f["variant"]) for f in _findings(recs)}
    assert ("cross_document", "broken.document_boundary_ignored") in found
    assert not {f for f in found if f[1] != "broken.document_boundary_ignored"}, found
    flagged = recs[_cell("broken.document_boundary_ignored", "packed").id]
    assert flagged["diagnosis"] == "document_boundary_ignored"


def test_cu_seqlens_off_by_one_is_diagnosed():
    recs = _run([_cell("broken.cu_seqlens_off_by_one", "packed", causal) for causal in (False, True)])
    assert {r["diagnosis"] for r in recs.values()} == {"cu_seqlens_off_by_one"}


def test_a_varlen_variant_gets_cu_seqlens_and_a_dense_one_the_document_mask():
    from audit.workload.inputs import make_inputs
    inputs = make_inputs(_cell("sdpa", "packed"))
    dense, varlen = inputs.call_kwargs(), inputs.call_kwargs(("varlen",))
    assert dense["mask"] is inputs.mask and "cu_seqlens" not in dense
    assert varlen["mask"] is None and varlen["cu_seqlens"] is inputs.cu_seqlens and varlen["max_seqlen"] == 24


# --------------------------------------------------------------------------- paged caches


def test_the_pool_holds_nan_wherever_a_kernel_must_not_read():
    from audit.workload.inputs import make_inputs
    from audit.workload.packing import pool_from_dense
    inputs = make_inputs(_cell("paged_gather", "paged"))
    layout = inputs.paged
    pool = pool_from_dense(inputs.k, layout)                                 # (pages, 16, Hkv, d)
    assert layout.used == (48, 32) and len(layout.block_table[0]) == 4
    for b in range(2):
        row = layout.block_table[b]
        used = layout.used_pages(b)
        extra = pool[row[used]]
        assert torch.isnan(extra).all()                                      # the page listed after the used ones
        last = pool[row[used - 1]]
        tail = layout.used[b] - (used - 1) * 16
        assert not torch.isnan(last[:tail]).any() and torch.isnan(last[tail:]).all()
    listed = {p for row in layout.block_table for p in row}
    assert len(listed) < layout.pages                                        # a page no row lists


def test_a_paged_kernel_reading_the_extra_page_or_another_row_is_caught_and_named():
    recs = _run([_cell(v, "paged") for v in ("paged_gather", "paged_flex", "sdpa", "broken.paged_extra_page",
                                             "broken.paged_wrong_sequence")])
    by = {r["variant"]: r for r in recs.values()}
    refused = [f"{r['variant']}: {r['reason']}" for r in by.values() if platform_skipped(r)]
    assert not refused or refused == [f"paged_flex: {by['paged_flex']['reason']}"], refused
    for right in ("paged_gather", "paged_flex") if not refused else ("paged_gather",):
        assert by[right]["paged_unread_max_change"] == 0.0 and by[right]["within_budget"], by[right]["reason"]
    assert by["paged_gather"]["page_size"] == 16 and by["sdpa"]["paged_unread_max_change"] is None
    assert by["broken.paged_extra_page"]["paged_diagnosis"] == "reads_past_used"
    assert by["broken.paged_wrong_sequence"]["paged_diagnosis"] == "block_table_wrong_sequence"
    assert by["broken.paged_extra_page"]["out_nan"] > 0                      # NaN names the read
    found = {(f["check"], f["variant"]) for f in _findings(recs)}
    assert ("paged_reads", "broken.paged_extra_page") in found
    assert ("paged_reads", "broken.paged_wrong_sequence") in found
    assert not {f for f in found if not f[1].startswith("broken.")}, found
    if refused:                                   # compiled flex under ATEN_CPU_CAPABILITY=default, say
        pytest.skip(refused[0])


def test_page_edge_lengths_sit_on_and_around_a_page_boundary():
    from audit.workload.draws import page_edge_lengths
    assert page_edge_lengths(4, 64) == [49, 47, 48, 49]        # 48 = 3 pages of 16: one past, one short, on
    assert page_edge_lengths(3, 256, 16) == [193, 191, 192]
    assert page_edge_lengths(3, 8) == [8, 8, 8]                  # shorter than a page: every length T


def test_paged_kernels_on_lengths_around_a_page_boundary():
    """A last page of one key, one short of full, full: the references and the declared stand-in read
    none of the tail (its NaN would show), the controls are caught and named as on the paged scenario."""
    recs = _run([_cell(v, "paged_edges", batch=3) for v in ("paged_gather", "sdpa", "broken.paged_extra_page",
                                                             "broken.paged_wrong_sequence")])
    by = {r["variant"]: r for r in recs.values()}
    assert by["paged_gather"]["within_budget"] and by["paged_gather"]["out_nan"] == 0
    assert by["paged_gather"]["paged_unread_max_change"] == 0.0 and by["sdpa"]["within_budget"]
    assert by["broken.paged_extra_page"]["paged_diagnosis"] == "reads_past_used"
    assert by["broken.paged_wrong_sequence"]["paged_diagnosis"] == "block_table_wrong_sequence"


def test_a_paged_variant_is_skipped_outside_the_paged_scenario():
    rec = _run([_cell("paged_gather", "normal")])
    assert [r["status"] for r in rec.values()] == ["skipped"]


# --------------------------------------------------------------------------- invariance


def test_batch_and_chunk_invariance_catch_a_batch_dependent_kernel_and_pass_sdpa():
    recs = _run([_cell(v, "normal", causal) for v in ("sdpa", "eager", "broken.batch_dependent_splits")
                 for causal in (False, True)] + [_cell("sdpa", "normal", batch=1)])
    for rec in recs.values():
        if rec["batch"] == 1:
            assert rec["batch_invariant"] is None and rec["chunk_invariant"] is None   # does not apply
        elif rec["variant"].startswith("broken."):
            assert rec["batch_invariant"] is False and rec["chunk_invariant"] is False and rec["batch_max_diff"] > 0
            assert rec["chunk_within_budget"] is True                      # right to rounding
        else:
            assert rec["batch_invariant"] is True and rec["chunk_within_budget"] is True, rec["id"]
    found = {(f["check"], f["severity"], f["variant"]) for f in _findings(recs)}
    assert ("batch_invariance", "warning", "broken.batch_dependent_splits") in found
    assert ("chunk_invariance", "warning", "broken.batch_dependent_splits") in found
    assert {f[2] for f in found} == {"broken.batch_dependent_splits"}


def test_a_chunked_prefill_outside_the_budget_is_an_error():
    from audit.analysis.layout_rules import check_invariance
    import pandas as pd
    base = dict(status="ok", scenario="normal", dtype="fp32", batch_invariant=True, batch_max_diff=0.0)
    frame = pd.DataFrame([dict(base, id="a", variant="x", chunk_invariant=False, chunk_max_diff=0.5,
                               chunk_within_budget=False),
                          dict(base, id="b", variant="y", chunk_invariant=False, chunk_max_diff=1e-7,
                               chunk_within_budget=True),
                          dict(base, id="c", variant="z", chunk_invariant=True, chunk_max_diff=0.0,
                               chunk_within_budget=True)])
    got = {(f["variant"], f["severity"]) for f in check_invariance(frame)}
    assert got == {("x", "error"), ("y", "warning")}


def test_the_cost_model_plans_the_invariance_calls_where_they_apply():
    from audit.workload.inputs import invariance_applies
    assert invariance_applies(_cell("sdpa", "normal")) == (True, True)
    assert invariance_applies(_cell("sdpa", "normal", batch=1)) == (False, False)
    assert invariance_applies(_cell("sdpa", "packed")) == (True, False)
    assert invariance_applies(_cell("sdpa", "padding")) == (False, False)
    assert invariance_applies(_cell("sdpa", "normal", seq_len=2048)) == (False, False)


# --------------------------------------------------------------------------- flash-attn's varlen declaration


def _declarations(text: str, names: tuple[str, ...]) -> list[str]:
    found = re.findall(r"^((\w+) = audit\.adapt\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\))", text, flags=re.M)
    return [re.sub(r"\s+", " ", d) for d, name in found if name in names]


def test_the_docs_declare_flash_attn_varlen_as_the_tested_plugin_does():
    docs = _declarations((ROOT / "docs" / "variants.md").read_text(), ("varlen", "paged"))
    tested = _declarations((PLUGINS / "declared.py").read_text(), ("varlen", "paged"))
    assert len(tested) == 2 and docs == tested, (docs, tested)


def test_the_stand_in_has_flash_attn_varlen_funcs_exact_signature():
    import inspect
    sys.path.insert(0, str(PLUGINS))
    try:
        from standins import flash_attn_varlen_func
    finally:
        sys.path.remove(str(PLUGINS))
    assert str(inspect.signature(flash_attn_varlen_func)) == (
        "(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None, "
        "causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, "
        "return_attn_probs=False, block_table=None)")


@pytest.fixture(scope="module")
def declared():
    sys.path.insert(0, str(PLUGINS))
    try:
        cases = [_cell(f"declared:{n}", s, causal, heads=4, kv=2) for n in ("varlen", "paged")
                 for s in ("normal", "packed", "paged", "cross_causal") for causal in (False, True)]
        cases += [_cell("declared:varlen_one_sequence", "packed", causal, batch=1) for causal in (False, True)]
        cases += [_cell("declared:varlen_inclusive_end", "packed", causal, heads=4, kv=2) for causal in (False, True)]
        yield _run(cases)
    finally:
        sys.path.remove(str(PLUGINS))


def test_the_declared_varlen_kernel_is_right_and_gets_no_finding(declared):
    ok = [r for r in declared.values() if r["variant"] in ("declared:varlen", "declared:paged")]
    assert {r["status"] for r in ok} <= {"ok", "skipped"}, [(r["id"], r["reason"]) for r in ok]
    ran = [r for r in ok if r["status"] == "ok"]
    assert {(r["variant"], r["scenario"]) for r in ran} >= {("declared:varlen", "packed"), ("declared:varlen", "normal"),
                                                           ("declared:paged", "paged")}
    assert all(r["within_budget"] for r in ran)
    assert all(r["cross_doc_max_change"] == 0.0 for r in ran if r["scenario"] == "packed")
    assert all(r["paged_unread_max_change"] == 0.0 for r in ran if r["scenario"] == "paged")
    found = _findings({r["id"]: r for r in ran})
    assert [f for f in found if f["severity"] != "info"] == [], found


def test_a_declared_varlen_kernel_that_drops_the_documents_is_caught_and_diagnosed(declared):
    bad = [r for r in declared.values() if r["variant"] == "declared:varlen_one_sequence"]
    assert all(r["cross_doc_max_change"] > 1.0 for r in bad)
    assert {r["diagnosis"] for r in bad} == {"document_boundary_ignored"}


def test_a_varlen_kernel_reading_one_key_past_each_document_is_named_as_that_family_member(declared):
    """flash_attn_varlen_func's signature with an inclusive key bound: the diagnosis names the member of
    the document-range family, and the finding says what it does; causal hides the extra key."""
    from audit.workload.mistakes import MISTAKES
    rows = {r["causal"]: r for r in declared.values() if r["variant"] == "declared:varlen_inclusive_end"}
    assert rows[False]["status"] == "ok" and rows[False]["cross_doc_max_change"] > 0.1
    assert rows[False]["diagnosis"] == "document_keys_end_inclusive"
    assert MISTAKES["document_keys_end_inclusive"].family == "document_ranges"
    assert rows[True]["status"] == "ok" and rows[True]["within_budget"] and rows[True]["cross_doc_max_change"] == 0.0
    found = [f for f in _findings({rows[False]["id"]: rows[False]}) if f.get("diagnosis")]
    assert found and all(f["diagnosis"] == "document_keys_end_inclusive" for f in found)
    assert any("one key past its end" in f["message"] for f in found), found
    grads = [f for f in found if f["check"] == "grad_error_budget"]
    assert grads and "they are those of the forward's mistake, differentiated" in grads[0]["message"], grads


@pytest.mark.parametrize("kwargs, message", [
    (dict(layout="thd"), "layout='thd' needs cu_seqlens_arg"),
    (dict(cu_seqlens_arg="cu"), "give layout='thd'"),
    (dict(layout="thd", cu_seqlens_arg=("a",)), "cu_seqlens_arg=('a',); allowed"),
    (dict(seqused_arg="n"), "give block_table_arg"),
    (dict(block_table_arg="table"), "needs seqused_arg"),
    (dict(block_table_arg="table", seqused_arg="n", page_size=0), "page_size=0; allowed"),
])
def test_a_bad_layout_declaration_names_the_value(kwargs, message):
    import audit
    with pytest.raises(UsageError, match=re.escape(message)):
        audit.adapt(lambda q, k, v: q, **kwargs)


# --------------------------------------------------------------------------- q, k, v as views

def test_strided_inputs_are_views_of_one_fused_buffer_and_a_copy_keeps_their_layout():
    from audit.measure.referee.tensors import own_copy
    from audit.workload.inputs import make_inputs
    inputs = make_inputs(_cell("eager", "strided_qkv", heads=4, kv=2, dtype="bf16"))
    q, k, v = inputs.q, inputs.k, inputs.v
    assert not any(t.is_contiguous() for t in (q, k, v)) and all(t.stride(-1) == 1 for t in (q, k, v))
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert (q.stride(), k.storage_offset(), v.storage_offset()) == ((64 * 8 * 16, 16, 8 * 16, 1), 4 * 16, 6 * 16)
    for t in (q, k, v):
        copy = own_copy(t, True)
        assert copy.stride() == t.stride() and torch.equal(copy, t) and copy.requires_grad
        assert copy.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    # the gaps hold what the fused buffer holds there (k's and v's heads beside q's)
    from audit.workload.draws import read_as_contiguous
    assert torch.equal(read_as_contiguous(own_copy(q)), read_as_contiguous(q))
    assert not torch.equal(read_as_contiguous(q), q)
    latent = make_inputs(_cell("eager", "strided_qkv", d_v=8))
    assert latent.v.shape[-1] == 8 and not latent.v.is_contiguous() and not latent.q.is_contiguous()


def test_a_kernel_reading_views_as_contiguous_is_caught_and_named_and_correct_ones_are_not():
    cases = [_cell(v, "strided_qkv", causal, heads=4, kv=2, dtype=dtype) for causal in (False, True)
             for dtype in ("fp32", "bf16", "fp16") for v in ("broken.strides_ignored", "eager", "sdpa", "sdpa_math")]
    records = _run(cases)
    control = [r for r in records.values() if r["variant"] == "broken.strides_ignored"]
    assert len(control) == 6 and all(r["status"] == "ok" and r["within_budget"] is False for r in control)
    assert {r["diagnosis"] for r in control} == {"strides_ignored"}
    right = [r for r in records.values() if r["variant"] != "broken.strides_ignored" and not platform_skipped(r)]
    assert all(r["status"] == "ok" and r["within_budget"] and all(r[f"{g}_within_budget"] for g in ("dq", "dk", "dv")) for r in right), [
        (r["id"], r["status"], r["reason"]) for r in right]
    # on contiguous inputs the control reads what it is handed: right
    normal = _run([_cell("broken.strides_ignored", "normal", heads=4, kv=2)])
    assert all(r["within_budget"] for r in normal.values())


def test_a_page_or_slot_index_off_by_one_is_named_as_that_member_of_the_page_index_family():
    from audit.workload.paged_mistakes import PAGED_MISTAKES
    assert [n for n, m in PAGED_MISTAKES.items() if m.family == "page_index"] == ["page_index_next", "slot_index_next"]
    sys.path.insert(0, str(PLUGINS))
    try:
        recs = _run([_cell(f"paged_kernels:{name}", scenario, batch=3)
                     for name in ("page_index_next", "slot_index_next") for scenario in ("paged", "paged_edges")])
    finally:
        sys.path.remove(str(PLUGINS))
    for r in recs.values():
        assert r["status"] == "ok" and r["paged_unread_max_change"] > 0, (r["id"], r["reason"])
        assert r["paged_diagnosis"] == r["variant"].split(":")[1], (r["id"], r["paged_diagnosis"])


def test_the_block_table_probe_moves_the_pages_and_only_a_kernel_not_reading_by_the_table_follows():
    """Every page moved in the pool, the table saying where: the references and the declared stand-in
    return the same output; a kernel keeping the table of its first call does not (NaN where it reads
    pages now unused); a kernel already reading NaN cannot be judged."""
    from audit.analysis.argument_rules import check_arguments
    from audit.core.records import to_frame
    from audit.workload.packing import paged_layout
    layout = paged_layout([40, 17, 64], 16, 3)
    moved = layout.moved()
    assert moved.used == layout.used
    assert all(a != b for row, new in zip(layout.block_table, moved.block_table) for a, b in zip(row, new))
    listed = [p for row in moved.block_table for p in row]                  # still distinct pages of the pool
    assert len(set(listed)) == len(listed) == 3 * len(layout.block_table[0]) and max(listed) < layout.pages
    sys.path.insert(0, str(PLUGINS))
    try:
        recs = _run([_cell(v, s, causal, batch=3) for s in ("paged", "paged_edges") for causal in (False, True)
                     for v in ("paged_gather", "declared:paged", "paged_kernels:stale_block_table",
                               "broken.paged_extra_page")])
    finally:
        sys.path.remove(str(PLUGINS))
    status = {}
    for r in recs.values():
        status.setdefault(r["variant"], set()).add(r["arguments"]["block_table"])
    assert status == {"paged_gather": {"honoured"}, "declared:paged": {"honoured"},
                      "paged_kernels:stale_block_table": {"ignored"}, "broken.paged_extra_page": {"unjudged"}}
    stale = [r for r in recs.values() if r["variant"] == "paged_kernels:stale_block_table"]
    assert all(r["within_budget"] for r in stale)                     # right until the pages move
    found = check_arguments(to_frame(list(recs.values())))
    assert [(f["variant"], f["argument"]) for f in found] == [("paged_kernels:stale_block_table", "block_table")]
