"""Tests of audit.core.records: schema, JSONL store, partial lines, DataFrame view."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import audit
from audit.core.grid import AXES, Case
from audit.core.columns import COLUMNS
from audit.core.records import (ENV_COLUMNS, MIGRATIONS, RECORDS_FILE, _restore, SCHEMA_VERSION, RecordWriter,
                                completed_ids, dumps, load, migrate, new_record, read_records, to_frame)

CASE = Case("sdpa", "cpu", "bf16", 64, 1024, 1, 8, True)
V1_GOLDEN = Path(__file__).resolve().parent / "data" / "records_v1.jsonl"
V4_GOLDEN = Path(__file__).resolve().parent / "data" / "records_v4.jsonl"


def same(a, b) -> bool:
    """Deep equality where NaN equals NaN and a float stays a float."""
    if isinstance(a, float) or isinstance(b, float):
        if type(a) is not type(b):
            return False
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def strict_loads(line: str):
    def reject(name):
        raise AssertionError(f"non-standard JSON constant {name} in the file")
    return json.loads(line, parse_constant=reject)


def make_record(case: Case = CASE, **values):
    rec = new_record(case.axes(), case.id)
    rec.update(values)
    return rec


def full_record():
    return make_record(
        status="ok", fwd_ms=1.5, fwd_iqr_ms=0.25, fwd_n=5,
        fwd_samples_s=[0.001, float("nan"), float("inf"), -float("inf"), 0.002],
        out_nan=3, out_inf=0, max_abs_err=float("nan"), rel_err=float("inf"),
        entropy=-float("inf"), fused_sdpa=False, compile_s=None, reason=None,
        started_at="2024-01-01T00:00:00+00:00",
        env={"torch": "2.13.0+cpu", "threads": 2, "nvml": None,
             "nested": {"x": float("nan"), "y": [1, float("inf")]}},
    )


# --------------------------------------------------------------------------- schema

def test_new_record_has_every_column_and_nothing_else():
    rec = new_record(CASE.axes(), CASE.id)
    assert set(rec) == set(COLUMNS)
    assert rec["schema"] == SCHEMA_VERSION
    assert rec["id"] == CASE.id
    for axis in AXES:
        assert rec[axis] == CASE.axes()[axis]
    assert rec["kv_heads"] == rec["heads"] == 8         # multi-head: kv_heads is heads, a number
    measured = set(COLUMNS) - set(AXES) - {"schema", "id"}
    assert all(rec[c] is None for c in measured)


def test_migrate_rejects_unknown_schema():
    rec = make_record()
    assert migrate(rec) is rec
    for bad in (SCHEMA_VERSION + 1, 999, 0, None, "1"):
        with pytest.raises(ValueError) as info:
            migrate({**rec, "schema": bad})
        assert repr(bad) in str(info.value)
    with pytest.raises(ValueError):
        migrate({k: v for k, v in rec.items() if k != "schema"})


def test_reading_a_file_of_unknown_schema_raises(tmp_path):
    (tmp_path / RECORDS_FILE).write_text(json.dumps({**make_record(), "schema": 999}) + "\n")
    with pytest.raises(ValueError, match="999"):
        read_records(tmp_path)


def test_schema_is_17_with_migrations_from_1_to_16():
    assert SCHEMA_VERSION == 17
    assert set(MIGRATIONS) == set(range(1, 17))


def test_a_v16_record_reads_the_context_parallel_columns_as_not_measured():
    old = full_record()
    for col in ("shards_errs", "shards_err_ratios", "shards_err_ratio", "shards_within_budget"):
        old.pop(col, None)
    old.update(schema=16)
    new = migrate(old)
    assert new["schema"] == 17 and new["shards_within_budget"] is None and new["shards_errs"] is None
    assert new["lse_err"] == old.get("lse_err")


def test_a_v15_record_gets_its_medians_interval_from_its_raw_samples(tmp_path):
    """Schema 15 recorded the samples but not how well their median is known: read back, the
    interval comes from the samples (5 samples: their range), and with no target the cell is not
    judged (noise_target null)."""
    old = full_record()
    for col in ("fwd_ci_rel", "fwd_bwd_ci_rel", "fwd_extra_s", "fwd_bwd_extra_s", "noise_target"):
        old.pop(col, None)
    old.update(schema=15, fwd_samples_s=[0.179, 0.292, 0.392, 0.181, 0.223], fwd_bwd_samples_s=None)
    (tmp_path / RECORDS_FILE).write_text(dumps(old) + "\n")
    back = read_records(tmp_path)[0]
    assert back["fwd_ci_rel"] == pytest.approx((0.392 - 0.179) / 2 / 0.223)
    assert back["fwd_bwd_ci_rel"] is None and back["noise_target"] is None and back["fwd_extra_s"] is None


@pytest.mark.parametrize("schema, added", [
    # schema 6 measured neither diagnosis nor determinism: null, not "deterministic"
    (6, ("diagnosis", "diagnosis_err", "diagnosis_golden_err", "repeat_runs", "repeat_differs",
         "repeat_max_diff", "deterministic_algorithms", "deterministic_refused")),
    # schema 7 counted no graph breaks: null (unknown), not 0 (one graph)
    (7, ("graph_breaks", "sampled_power_source", "energy_read_s")),
    # schema 8 did not split a cell's time into phases: null, not {} (no phase at all)
    (8, ("phase_s",)),
    # schema 9 judged no gradient: null (not judged), not True
    (9, ("dq_err_ratio", "dk_err_ratio", "dv_err_ratio", "dq_within_budget", "dk_within_budget",
         "dv_within_budget", "grad_diagnosis", "grad_diagnosis_err", "grad_diagnosis_golden_err")),
    # schema 10 checked no lse and no sinks' gradient: null (not judged), not True
    (10, ("lse_err", "lse_err_ratio", "lse_within_budget", "lse_masked_rows", "merge_err", "merge_err_ratio",
          "merge_within_budget", "lse_differentiable", "lse_dq_err_ratio", "lse_dk_err_ratio",
          "lse_grads_within_budget", "lse_diagnosis", "lse_grad_diagnosis", "dsinks_err", "dsinks_err_ratio",
          "dsinks_within_budget")),
    # schema 11 had no referee: null (not refereed), not True (passed)
    (11, ("referee_inputs_untouched", "referee_values_follow", "referee_every_call", "referee_physically_possible",
          "referee_detail", "fwd_fenced_ms")),
    # schema 12 had no packed, paged or invariance checks: null (not checked), not 0 or True
    (12, ("cross_doc_max_change", "paged_unread_max_change", "paged_diagnosis", "batch_invariant",
          "chunk_invariant", "chunk_within_budget", "invariance_reason", "page_size")),
    # schema 13 did not say how a cell got its golden: null (not recorded), not "built"
    (13, ("golden_source",)),
])
def test_an_older_record_reads_with_the_columns_it_did_not_measure_null(tmp_path, schema, added):
    old = full_record()
    for col in added:
        old.pop(col, None)
    old["schema"] = schema
    (tmp_path / RECORDS_FILE).write_text(dumps(old) + "\n")
    back = read_records(tmp_path)[0]
    assert back["schema"] == SCHEMA_VERSION
    assert all(back[col] is None for col in added)


def test_a_v5_record_reads_with_the_top_left_golden_where_an_alignment_was_measured(tmp_path):
    """Schema 5 had no golden_alignment: every golden then was top-left, and only causal cells
    with q_len != seq_len have an alignment at all."""
    cross, plain = full_record(), full_record()
    for rec, alignment in ((cross, "bottom-right"), (plain, None)):
        rec.pop("golden_alignment", None)
        rec.update(schema=5, causal_alignment=alignment)
    (tmp_path / RECORDS_FILE).write_text(dumps(cross) + "\n" + dumps(plain) + "\n")
    back = read_records(tmp_path)
    assert [r["schema"] for r in back] == [SCHEMA_VERSION] * 2
    assert [r["golden_alignment"] for r in back] == ["top-left", None]
    assert back[0]["causal_alignment"] == "bottom-right"


def _v1_record(**values):
    """A schema-1 record as the v1 writer made it: v1 columns only."""
    rec = json.loads(V1_GOLDEN.read_text(encoding="utf-8").splitlines()[0])
    assert rec["schema"] == 1
    rec.update(values)
    return rec


def test_migrate_v1_to_v2_fills_the_new_columns():
    v1 = _v1_record()
    assert "q_len" not in v1 and "rmse" not in v1
    v2 = migrate(dict(v1))
    assert v2["schema"] == SCHEMA_VERSION
    assert set(COLUMNS) <= set(v2)
    assert v2["q_len"] == v1["seq_len"] == 64
    assert v2["saturation_source"] == "golden"        # v1 saturation came from the golden
    for col, value in v1.items():                      # nothing of v1 is lost or changed
        if col != "schema":
            assert same(v2[col], value), col
    for col in ("rmse", "err_ratio", "within_budget", "leak_mass", "masked_rows", "min_entropy"):
        assert v2[col] is None, col                     # not measured in v1: null, not made up


def test_migrate_v1_without_saturation_has_no_saturation_source():
    v2 = migrate(_v1_record(status="skipped", max_prob=None, entropy=None, onehot_frac=None))
    assert v2["saturation_source"] is None
    assert v2["q_len"] == 64


def test_migrate_v1_non_finite_strings_become_floats(tmp_path):
    # The v1 writer stored NaN and infinities as "nan", "inf", "-inf" (README of schema 1);
    # after migration they must be floats again, like schema 2's "NaN" / "Infinity".
    v1 = _v1_record(max_abs_err="nan", rel_err="inf", entropy="-inf",
                    fwd_samples_s=[0.001, "nan", "inf"])
    (tmp_path / RECORDS_FILE).write_text(json.dumps(v1) + "\n")
    back = read_records(tmp_path)[0]
    assert back["schema"] == SCHEMA_VERSION
    assert isinstance(back["max_abs_err"], float) and math.isnan(back["max_abs_err"])
    assert back["rel_err"] == math.inf
    assert back["entropy"] == -math.inf
    assert back["fwd_samples_s"][0] == 0.001
    assert math.isnan(back["fwd_samples_s"][1]) and back["fwd_samples_s"][2] == math.inf


def test_reading_the_v1_golden_file_gives_current_records(tmp_path):
    shutil.copy(V1_GOLDEN, tmp_path / RECORDS_FILE)
    raw = [json.loads(line) for line in V1_GOLDEN.read_text(encoding="utf-8").splitlines()]
    assert {r["schema"] for r in raw} == {1}
    back = read_records(tmp_path)
    assert len(back) == len(raw) == 3
    for old, rec in zip(raw, back):
        assert rec["schema"] == SCHEMA_VERSION
        assert set(COLUMNS) <= set(rec)
        assert rec["q_len"] == rec["seq_len"] == old["seq_len"]
        assert rec["kv_heads"] == rec["heads"] == old["heads"]
        assert rec["id"] == old["id"] and rec["status"] == old["status"]
        assert same(rec["fwd_ms"], old["fwd_ms"])
    assert [r["status"] for r in back] == ["ok", "ok", "skipped"]
    assert [r["saturation_source"] for r in back] == ["golden", "golden", None]
    assert completed_ids(tmp_path) == {r["id"] for r in raw}
    frame = load(tmp_path)
    assert list(frame["q_len"]) == [64, 64, 64]
    assert (frame["schema"] == SCHEMA_VERSION).all()
    # the file itself is left as it was
    assert (tmp_path / RECORDS_FILE).read_bytes() == V1_GOLDEN.read_bytes()


def test_reading_schema_2_records_of_the_h200_run(tmp_path):
    """The shared H200 records (schema 2) are the golden file of schema 2."""
    from tests.helpers import h200_run

    run = h200_run("stab", tmp_path)
    raw = [json.loads(line) for line in (run / RECORDS_FILE).read_text().splitlines()]
    assert {r["schema"] for r in raw} == {2}
    back = read_records(run)
    assert len(back) == len(raw) == 60
    for old, rec in zip(raw, back):
        assert rec["schema"] == SCHEMA_VERSION
        assert set(COLUMNS) <= set(rec)
        for col, value in old.items():                 # nothing of v2 is lost or changed
            if col != "schema":
                assert same(rec[col], _restore(value)), col
        for col in ("golden_subset", "fwd_host_ms", "host_bound", "compile_reused", "energy_idle_frac"):
            assert rec[col] is None, col                # not measured in v2
        assert rec["kv_heads"] == rec["heads"] == 16    # multi-head, like every cell before schema 4


def test_reading_schema_3_records_of_a_cpu_run(tmp_path):
    """The stored CPU run (schema 3) is the golden file of schema 3: every cell was multi-head,
    so kv_heads reads as heads, and the cell ids, which have no KV part, stay as they were."""
    from tests.helpers import cpu_run

    run = cpu_run("quick", tmp_path)
    raw = [json.loads(line) for line in (run / RECORDS_FILE).read_text().splitlines()]
    assert {r["schema"] for r in raw} == {3} and all("kv_heads" not in r for r in raw)
    back = read_records(run)
    assert len(back) == len(raw) > 100
    for old, rec in zip(raw, back):
        assert rec["schema"] == SCHEMA_VERSION
        assert rec["kv_heads"] == rec["heads"]
        for col, value in old.items():                 # nothing of v3 is lost or changed
            if col != "schema":
                assert same(rec[col], _restore(value)), col
        assert Case.from_mapping(rec).id == rec["id"]


def test_reading_the_v4_golden_file_gives_current_records(tmp_path):
    """tests/data/records_v4.jsonl (schema 4, written by c18218a: GQA cells, compiled ones
    among them; env left out) reads with compile_cache null, unknown then, and nothing else
    lost or changed."""
    shutil.copy(V4_GOLDEN, tmp_path / RECORDS_FILE)
    raw = [json.loads(line) for line in V4_GOLDEN.read_text(encoding="utf-8").splitlines()]
    assert {r["schema"] for r in raw} == {4} and all("compile_cache" not in r for r in raw)
    assert any(r["compile_s"] for r in raw) and any(r["kv_heads"] != r["heads"] for r in raw)
    back = read_records(tmp_path)
    assert len(back) == len(raw) == 12
    for old, rec in zip(raw, back):
        assert rec["schema"] == SCHEMA_VERSION and set(COLUMNS) <= set(rec)
        assert rec["compile_cache"] is None
        for col, value in old.items():
            if col != "schema":
                assert same(rec[col], _restore(value)), col
        assert Case.from_mapping(rec).id == rec["id"]


# --------------------------------------------------------------------------- round trip

def test_round_trip_including_nan_and_inf(tmp_path):
    rec = full_record()
    with RecordWriter(tmp_path) as writer:
        writer.write(rec)
    back = read_records(tmp_path)
    assert len(back) == 1
    assert same(back[0], rec), (back[0], rec)


def test_file_is_strict_json_one_record_per_line(tmp_path):
    recs = [full_record(), make_record(Case("eager", "cpu", "fp32", 16, 8, 1, 2, False),
                                       reason="multi\nline reason", status="error")]
    with RecordWriter(tmp_path) as writer:
        for rec in recs:
            writer.write(rec)
    text = (tmp_path / RECORDS_FILE).read_text(encoding="utf-8")
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) == 3
    parsed = [strict_loads(line) for line in lines[:-1]]
    assert parsed[0]["max_abs_err"] == "NaN"
    assert parsed[0]["rel_err"] == "Infinity"
    assert parsed[0]["entropy"] == "-Infinity"
    assert parsed[0]["fwd_samples_s"][1:4] == ["NaN", "Infinity", "-Infinity"]
    assert parsed[0]["env"]["nested"] == {"x": "NaN", "y": [1, "Infinity"]}
    assert parsed[1]["reason"] == "multi\nline reason"
    assert "\n" not in dumps(recs[1])


def test_numpy_and_torch_scalars_are_stored_as_numbers(tmp_path):
    torch = pytest.importorskip("torch")
    rec = make_record(out_nan=np.int64(4), fwd_n=torch.tensor(7), fwd_ms=np.float32(0.5),
                      max_abs_err=torch.tensor(0.25, dtype=torch.float64))
    with RecordWriter(tmp_path) as writer:
        writer.write(rec)
    strict_loads((tmp_path / RECORDS_FILE).read_text().splitlines()[0])
    back = read_records(tmp_path)[0]
    assert back["out_nan"] == 4 and back["fwd_n"] == 7
    assert back["fwd_ms"] == 0.5 and back["max_abs_err"] == 0.25


def test_nan_numpy_and_torch_scalars_round_trip(tmp_path):
    # NaN is data in this project: a non-finite numpy/torch scalar must be stored like a
    # Python float NaN ("NaN"), not make the writer raise.
    torch = pytest.importorskip("torch")
    rec = make_record(max_abs_err=np.float32("nan"), rel_err=torch.tensor(float("inf")),
                      entropy=torch.tensor(float("nan"), dtype=torch.float64))
    with RecordWriter(tmp_path) as writer:
        writer.write(rec)
    stored = strict_loads((tmp_path / RECORDS_FILE).read_text().splitlines()[0])
    assert (stored["max_abs_err"], stored["rel_err"], stored["entropy"]) == ("NaN", "Infinity", "NaN")
    back = read_records(tmp_path)[0]
    assert math.isnan(back["max_abs_err"])
    assert back["rel_err"] == math.inf
    assert math.isnan(back["entropy"])


# --------------------------------------------------------------------------- interrupted writes

def _ids(n):
    return [Case("eager", "cpu", "fp32", 16, 8 * (i + 1), 1, 2, False) for i in range(n)]


def test_partial_last_line_is_ignored_then_truncated(tmp_path):
    cases = _ids(3)
    with RecordWriter(tmp_path) as writer:
        writer.write(make_record(cases[0], status="ok"))
        writer.write(make_record(cases[1], status="ok"))
    path = tmp_path / RECORDS_FILE
    good_size = path.stat().st_size
    third = dumps(make_record(cases[2], status="ok"))
    with open(path, "a", encoding="utf-8") as fh:  # killed halfway through the third write
        fh.write(third[: len(third) // 2])
    assert path.stat().st_size > good_size

    assert [r["id"] for r in read_records(tmp_path)] == [cases[0].id, cases[1].id]
    assert completed_ids(tmp_path) == {cases[0].id, cases[1].id}

    with RecordWriter(tmp_path) as writer:
        assert path.stat().st_size == good_size  # garbage removed on open
        writer.write(make_record(cases[2], status="ok", fwd_ms=2.0))
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    for line in lines:
        strict_loads(line)
    back = read_records(tmp_path)
    assert [r["id"] for r in back] == [c.id for c in cases]
    assert back[2]["fwd_ms"] == 2.0


def test_a_lone_partial_line_is_truncated_to_empty(tmp_path):
    path = tmp_path / RECORDS_FILE
    path.write_text(dumps(make_record())[:20])
    assert read_records(tmp_path) == []
    with RecordWriter(tmp_path) as writer:
        assert path.stat().st_size == 0
        writer.write(make_record())
    assert [r["id"] for r in read_records(tmp_path)] == [CASE.id]


def test_complete_file_is_left_alone_by_a_new_writer(tmp_path):
    with RecordWriter(tmp_path) as writer:
        writer.write(make_record())
    before = (tmp_path / RECORDS_FILE).read_bytes()
    RecordWriter(tmp_path).close()
    assert (tmp_path / RECORDS_FILE).read_bytes() == before


def test_writer_creates_the_run_folder(tmp_path):
    run_dir = tmp_path / "a" / "b"
    with RecordWriter(run_dir) as writer:
        writer.write(make_record())
    assert (run_dir / RECORDS_FILE).is_file()


def test_completed_ids(tmp_path):
    assert completed_ids(tmp_path) == set()
    assert completed_ids(tmp_path / "missing") == set()
    cases = _ids(3)
    with RecordWriter(tmp_path) as writer:
        for case in cases:
            writer.write(make_record(case, status="ok"))
        writer.write(make_record(cases[0], status="error", reason="again"))
    assert completed_ids(tmp_path) == {c.id for c in cases}


# --------------------------------------------------------------------------- DataFrame view

def test_to_frame_keeps_the_last_record_of_an_id():
    a, b = _ids(2)
    frame = to_frame([make_record(a, fwd_ms=1.0, status="ok"), make_record(b, fwd_ms=5.0, status="ok"),
                      make_record(a, fwd_ms=2.0, status="ok")])
    assert len(frame) == 2
    assert sorted(frame["id"]) == sorted([a.id, b.id])
    assert frame.set_index("id").loc[a.id, "fwd_ms"] == 2.0
    assert frame.set_index("id").loc[b.id, "fwd_ms"] == 5.0


def test_to_frame_flattens_env():
    rec = make_record(env={"torch": "2.13.0+cpu", "threads": 2, "cpu_model": "X", "extra": 1})
    frame = to_frame([rec])
    assert "env" not in frame.columns
    assert frame.loc[0, "env_torch"] == "2.13.0+cpu"
    assert frame.loc[0, "env_threads"] == 2
    assert frame.loc[0, "env_cpu_model"] == "X"
    assert frame.loc[0, "env_git_commit"] is None
    for col in COLUMNS:
        if col != "env":
            assert col in frame.columns


def test_load_of_an_empty_dir_is_an_empty_frame_with_the_columns(tmp_path):
    expected = [c for c in COLUMNS if c != "env"] + [f"env_{k}" for k in ENV_COLUMNS]
    for frame in (load(tmp_path), audit.load(tmp_path)):
        assert isinstance(frame, pd.DataFrame)
        assert len(frame) == 0
        assert list(frame.columns) == expected


def test_load_reads_the_store(tmp_path):
    cases = _ids(2)
    with RecordWriter(tmp_path) as writer:
        writer.write(make_record(cases[0], status="ok", rel_err=float("nan"), env={"torch": "t"}))
        writer.write(make_record(cases[1], status="skipped", reason="too slow"))
    frame = audit.load(tmp_path)
    assert list(frame["id"]) == [c.id for c in cases]
    assert list(frame["status"]) == ["ok", "skipped"]
    assert math.isnan(frame.loc[0, "rel_err"])
    assert frame.loc[0, "env_torch"] == "t"
    assert list(frame["seq_len"]) == [8, 16]


# --------------------------------------------------------------------------- damaged lines

def test_damaged_lines_are_moved_aside_with_their_line_numbers(tmp_path):
    from audit.core.records import QUARANTINE_FILE, quarantine_damaged
    good = [make_record(c, status="ok") for c in _ids(3)]
    path = tmp_path / RECORDS_FILE
    path.write_text(dumps(good[0]) + "\n" + dumps(good[1])[:40] + "\n" + "[1, 2]\n"
                    + dumps({**good[2], "status": "exploded"}) + "\n" + dumps(good[2]) + "\n")
    assert [r["id"] for r in read_records(tmp_path)] == [good[0]["id"], good[2]["id"]]   # skipped, not fatal
    moved = quarantine_damaged(tmp_path)
    assert [n for n, _ in moved] == [2, 3, 4]
    assert "unknown status 'exploded'" in moved[2][1]
    assert [r["id"] for r in read_records(tmp_path)] == [good[0]["id"], good[2]["id"]]
    kept = path.read_text().splitlines()
    assert len(kept) == 2 and all(strict_loads(line) for line in kept)
    aside = [json.loads(x) for x in (tmp_path / QUARANTINE_FILE).read_text().splitlines()]
    assert [a["line"] for a in aside] == [2, 3, 4] and aside[1]["text"] == "[1, 2]"
    assert quarantine_damaged(tmp_path) == []                             # nothing left to move


def test_newer_schema_is_refused_not_quarantined(tmp_path):
    from audit.core.records import NewerSchema, quarantine_damaged
    path = tmp_path / RECORDS_FILE
    path.write_text(dumps({**make_record(status="ok"), "schema": SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(NewerSchema, match=f"schema {SCHEMA_VERSION + 1} is newer"):
        read_records(tmp_path)
    with pytest.raises(NewerSchema):
        quarantine_damaged(tmp_path)
    assert path.read_text().count("\n") == 1
