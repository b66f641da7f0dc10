"""The golden store (references kept on disk) and the mistake memo (mistakes' outputs shared by the
variants diagnosed on an input set): what they save must be exactly what building again gives."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from audit.core.grid import Case
from audit.execute import runner
from audit.measure.cell import cellcache
from audit.measure.golden import golden_store
from audit.measure.diagnosis.diagnosis import attempt_for, diagnose
from audit.measure.diagnosis.mistake_memo import MistakeMemo
from audit.workload.inputs import make_inputs
from audit.workload.presets import presets

PRESET = presets()["quick"]


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The golden store on, in a folder of this test's own."""
    monkeypatch.setenv("ATTN_AUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(golden_store.STORE_ENV, "64")
    monkeypatch.setattr(golden_store, "STORE_MIN_BUILD_S", 0.0)      # store every reference, however cheap
    monkeypatch.setattr(golden_store, "STORE_GAIN", 0.0)
    return tmp_path / "cache" / golden_store.FOLDER


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.nan_to_num(), b.nan_to_num())
    return a == b or (a != a and b != b)


@pytest.mark.parametrize("scenario, causal, q_alignment", [
    ("normal", False, "top-left"), ("sinks", True, "top-left"), ("cross_causal", True, "bottom-right"),
    ("fully_masked_neginf", True, "top-left"), ("packed", False, "top-left")])
def test_a_stored_reference_reads_back_as_built(store, scenario, causal, q_alignment):
    case = Case("eager", "cpu", "fp32", 16, 64, 2, 2, causal, scenario)
    inputs = make_inputs(case)
    built, read = cellcache.stored_reference(case, inputs, q_alignment)
    assert not read and len(list(store.glob("*.pt"))) == 1
    again, read = cellcache.stored_reference(case, make_inputs(case), q_alignment)
    assert read
    assert _same(cellcache.reference_payload(built), cellcache.reference_payload(again))
    assert list(again.by_alignment) == list(built.by_alignment)
    assert len(again.leak_probes) == len(built.leak_probes)
    assert all(_same(list(p), list(q)) for p, q in zip(again.leak_probes, built.leak_probes))
    assert (again.document_probe is None) == (built.document_probe is None)


def test_the_key_follows_the_input_set_and_the_alignment():
    a = Case("eager", "cpu", "fp32", 16, 64, 2, 2, True, "cross_causal")
    keys = {golden_store.entry_key(c.input_key, al, "cpu")
            for c in (a, Case("sdpa", "cpu", "fp32", 16, 64, 2, 2, True, "cross_causal"))
            for al in ("top-left",)}
    assert len(keys) == 1                                   # the variant is not part of the input set
    assert golden_store.entry_key(a.input_key, "bottom-right", "cpu") not in keys
    other = Case("eager", "cpu", "bf16", 16, 64, 2, 2, True, "cross_causal")
    assert golden_store.entry_key(other.input_key, "top-left", "cpu") not in keys


def test_the_store_off_builds_every_time(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_AUDIT_CACHE", str(tmp_path))
    monkeypatch.setenv(golden_store.STORE_ENV, "0")
    case = Case("eager", "cpu", "fp32", 16, 64, 1, 2, False, "normal")
    for _ in range(2):
        _, read = cellcache.stored_reference(case, make_inputs(case), "top-left")
        assert not read
    assert not (tmp_path / golden_store.FOLDER).exists()


def test_a_damaged_file_is_built_again_and_replaced(store):
    case = Case("eager", "cpu", "fp32", 16, 64, 1, 2, False, "normal")
    cellcache.stored_reference(case, make_inputs(case), "top-left")
    (path,) = store.glob("*.pt")
    path.write_bytes(b"not a torch file")
    ref, read = cellcache.stored_reference(case, make_inputs(case), "top-left")
    assert not read and ref.golden.out.dtype == torch.float64
    assert cellcache.stored_reference(case, make_inputs(case), "top-left")[1]   # stored again, and read


def test_the_store_keeps_to_its_size_least_recently_used_out_first(store, monkeypatch):
    cases = [Case("eager", "cpu", "fp32", 32, t, 1, 2, False, "normal") for t in (64, 96, 128)]
    sizes = []
    for case in cases:
        cellcache.stored_reference(case, make_inputs(case), "top-left")
        sizes.append(max(p.stat().st_size for p in store.glob("*.pt")))
    monkeypatch.setenv(golden_store.STORE_ENV, str((sizes[1] + sizes[2] + 1) / 2**20))
    first = golden_store.entry_key(cases[0].input_key, "top-left", "cpu")
    golden_store.load(first, "cpu")                             # the oldest, used again: now the newest
    golden_store._evict(golden_store.max_bytes())
    left = {p.stem for p in store.glob("*.pt")}
    assert first in left and golden_store.entry_key(cases[1].input_key, "top-left", "cpu") not in left


def test_a_run_coming_back_to_an_input_set_reads_its_reference(store):
    cache = cellcache.InputCache()
    a = Case("eager", "cpu", "fp32", 16, 64, 1, 2, False, "normal")
    b = Case("eager", "cpu", "fp32", 16, 64, 1, 2, False, "padding")
    sources = [runner.run_cell(c, cache, PRESET, {})["golden_source"] for c in (a, b, replace(a, variant="sdpa"))]
    assert sources == ["built", "built", "read"]
    same_set = runner.run_cell(replace(a, variant="eager_fp32"), cache, PRESET, {})
    assert same_set["golden_source"] is None                 # in memory still
    assert cache.golden_calls == 3 and cache.golden_reads == 1


def test_the_cost_model_predicts_a_read_where_the_store_holds_the_set():
    from audit.plan.costmodel import CostModel
    from audit.plan.settings import Settings
    case = Case("eager", "cpu", "fp32", 128, 2048, 1, 2, False, "normal")
    other = Case("eager", "cpu", "fp32", 64, 256, 2, 2, False, "padding")
    model, settings = CostModel(), Settings()
    built = model.predict([case], settings)["golden"].iloc[0]
    read = model.predict([case], settings, stored_goldens=[case.input_key])["golden"].iloc[0]
    assert 0 < read < built / 4
    again = model.predict([case, other, replace(case, variant="sdpa")], settings)["golden"].tolist()
    assert again[0] == built and again[2] < built / 4        # coming back: read, as it was stored
    old = model.predict([case, other, replace(case, variant="sdpa")], Settings(golden_store=False))
    assert old["golden"].iloc[2] == built                     # schema 13's runs built it again


# --------------------------------------------------------------------------- the mistake memo

def _diagnosis_of(observed, attempt, memo=None):
    golden = attempt.attend()
    return diagnose(observed, attempt, golden, 1e-6, memo=memo, tag=("t",))


def test_the_memo_shares_what_does_not_read_the_variant_and_names_the_same():
    """GQA, causal: a variant pairing heads interleaved, one permuted otherwise (gqa_permuted fits
    the pairing to each variant's own output) and a correct one: the same names with and without the
    memo, and the memo serves the mistakes that do not read the variant's output."""
    case = Case("eager", "cpu", "fp32", 16, 64, 1, 8, True, "normal", kv_heads=4)
    inputs = make_inputs(case)
    memo = MistakeMemo()
    found = {}
    for pairing in ([h % 4 for h in range(8)], [3, 3, 0, 0, 1, 1, 2, 2], None):
        attempt = attempt_for(inputs, [0], list(range(8)))
        observed = attempt.attend(pairing=pairing) if pairing else attempt.attend()
        attempt.observed = observed
        plain = _diagnosis_of(observed, attempt)
        shared = _diagnosis_of(observed, attempt, memo)
        assert shared.name == plain.name and shared.scores == plain.scores
        found[str(pairing)] = shared.name
    assert list(found.values()) == ["gqa_interleaved", "gqa_permuted", "none"]
    assert memo.hits > 0


def test_a_mistake_reading_the_variant_is_never_served_from_the_memo():
    seen = []

    def fit(a):
        seen.append(a.observed)
        return a.observed * 2

    def blind(a):
        return a.q * 3

    memo = MistakeMemo()
    attempt = attempt_for(make_inputs(Case("eager", "cpu", "fp32", 8, 16, 1, 1, False, "normal")), [0], [0])
    outs = []
    for value in (1.0, 2.0):
        attempt.observed = torch.full((1, 1, 16, 8), value, dtype=torch.float64)
        outs.append((memo.run("fit", fit, attempt), memo.run("blind", blind, attempt)))
    assert float(outs[0][0][0, 0, 0, 0]) == 2.0 and float(outs[1][0][0, 0, 0, 0]) == 4.0
    assert outs[0][1] is outs[1][1] and memo.hits == 1
