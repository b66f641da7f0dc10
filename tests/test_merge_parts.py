"""Merge functions judged on the partial states real kernels make (run --merge-parts): each part the kernel
on its keys, what it holds on rows that see no key named (parts_defects), the blame on the parts where the
reference merge of them misses too (merge_parts_wrong) and on the merge function where it does not
(merge_wrong, naming the parts' defects). The kernels are tests/plugins/lse_kernels.py's: `correct` (out 0,
lse -inf on a row that sees no key), `lse_empty_rows_zero` (lse 0 there, as torch's CPU flash op) and
`lse_base2` (every lse in base 2)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from audit.analysis.merge_rules import check_merges, merge_summary
from audit.core.errors import UsageError
from audit.measure.merging.run_audit import kernel_parts, merge_records, parts_variant
from audit.measure.merging.states import EDGES, SPLITS, all_states, kernel_made
from audit.plan.budget import merge_state_sets
from audit.workload.presets import presets

pytestmark = pytest.mark.cpu_kinds     # decides on floating-point results: run again under the emulated CPU kinds

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"
RIGHT, ZERO, BASE2 = "lse_kernels:correct", "lse_kernels:lse_empty_rows_zero", "lse_kernels:lse_base2"
NAN_ON_EMPTY = "merge_plugins:flashinfer_nan_on_empty"      # FlashInfer's call form, NaN on two empty parts


@pytest.fixture(scope="module", autouse=True)
def plugins_importable():
    sys.path.insert(0, str(PLUGINS))
    yield
    sys.path.remove(str(PLUGINS))


@pytest.fixture(scope="module")
def records():
    return merge_records(["reference", NAN_ON_EMPTY], [RIGHT, ZERO, BASE2])


def test_a_kernels_states_are_the_splits_it_can_make_in_its_own_numbers():
    states = all_states(parts_from=kernel_parts(RIGHT))
    assert {s.name for s in states} == {s.name for s in SPLITS + EDGES if kernel_made(s)}
    assert {"far_apart", "posinf_empty"}.isdisjoint({s.name for s in states})     # a bias, an lse put in by hand
    bf16 = next(s for s in states if s.name == "two_shards" and s.dtype == "bf16")
    assert bf16.parts_from == RIGHT and str(bf16.parts[0][0].dtype) == "torch.bfloat16"
    assert all(s.parts_defects == "none" for s in states)


def test_the_lse_a_kernel_gives_a_row_with_no_key_is_named_and_blamed_on_the_kernel(records):
    zero = [r for r in records if r.get("parts_from") == ZERO and r["merge"] == "reference"]
    empty = {r["state"] for r in zero if r["parts_defects"] != "none"}
    assert empty == {"ring_4", "load_balanced", "first_empty", "second_empty", "both_empty", "causal_fully_masked"}
    assert {r["parts_defects"] for r in zero if r["state"] in empty} == {"lse_finite_on_empty"}
    assert all(r["reference_outcome"] == "wrong" for r in zero if r["state"] in empty)
    assert all(r["reference_outcome"] == "right" for r in zero if r["state"] not in empty)
    found = check_merges(records)
    parts = [f for f in found if f["check"] == "merge_parts_wrong"]
    assert {f["variant"] for f in parts} == {ZERO, BASE2}                       # never the right kernel's
    by = {f["variant"]: f for f in parts}
    assert by[ZERO]["diagnosis"] == "lse_finite_on_empty" and "a finite lse" in by[ZERO]["message"]
    assert by[BASE2]["diagnosis"] == "none"                                     # wrong everywhere, not on empty rows
    # the parts' fault is no merge function's: the reference merge gets no finding on them
    assert not [f for f in found if f["check"] == "merge_wrong" and f["variant"] == "reference"]
    assert merge_summary(records)["reference"]["both_empty@" + ZERO] == "parts"


def test_a_merge_that_misses_on_a_kernels_mergeable_parts_is_blamed_and_told_what_the_parts_hold(records):
    """A merge NaN on two empty parts, on the right kernel's parts: NaN where two parts are empty, as on
    the golden's."""
    found = [f for f in check_merges(records) if f["check"] == "merge_wrong" and f["variant"] == NAN_ON_EMPTY]
    assert found and any("both_empty@" + RIGHT in f["message"] for f in found)
    right = [r for r in records if r.get("parts_from") == RIGHT and r["merge"] == "reference"]
    assert right and all(r["outcome"] == "right" for r in right)               # the rule is met by right parts


def test_only_a_variant_that_returns_its_lse_uncompiled_on_the_cpu_makes_parts():
    assert parts_variant("eager").name == "eager"
    for name, why in (("sdpa", "returns no log-sum-exp on the CPU"), ("flex", "a compiled variant")):
        with pytest.raises(UsageError, match=why):
            parts_variant(name)


def test_a_kernel_that_cannot_make_its_parts_is_a_finding_not_a_crash():
    records = merge_records(["reference"], ["lse_kernels:not_a_pair"])
    failed = [r for r in records if r.get("merge") is None]
    assert [r["status"] for r in failed] == ["error"] and "could not make partial states" in failed[0]["reason"]
    [finding] = [f for f in check_merges(records) if f["check"] == "merge_parts_failed"]
    assert finding["variant"] == "lse_kernels:not_a_pair"


def test_the_plan_counts_a_set_of_states_per_kernel():
    import dataclasses
    quick = presets()["quick"]
    assert merge_state_sets(quick) == 1
    assert merge_state_sets(dataclasses.replace(quick, merge_parts=("eager", "flash_op"))) == 3
    assert merge_state_sets(dataclasses.replace(quick, merges=())) == 0


@pytest.mark.parametrize("name", ["flex", "sdpa"])
def test_a_variant_that_cannot_make_parts_exits_2_naming_those_that_can(tmp_path, name):
    done = subprocess.run([sys.executable, "-m", "audit", "run", "--preset", "quick", "--variant", "eager",
                           "--merge-parts", name, "--dry-run", "--out", str(tmp_path / "r")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"--merge-parts {name!r}" in done.stderr and "flash_op" in done.stderr and "Traceback" not in done.stderr


def test_an_lse_kept_in_the_outs_low_precision_is_named_and_one_in_float32_is_not():
    low = all_states(("fp32", "bf16"), parts_from=kernel_parts("eager"))          # eager: its lse in bf16 too
    high = all_states(("fp32", "bf16"), parts_from=kernel_parts("eager_fp32"))    # computes in float32
    assert all("lse_in_low_precision" in s.parts_defects for s in low if s.dtype == "bf16")
    assert not any("lse_in_low_precision" in s.parts_defects for s in low + high if s.dtype == "fp32")
    assert not any("lse_in_low_precision" in s.parts_defects for s in high)


def test_the_report_has_a_table_per_maker_of_parts_and_says_whose_parts_cannot_be_merged(records):
    from audit.render.merge_section import merge_section, merge_verdict
    found = check_merges(records)
    blocks = merge_section(records, found)
    captions = [b.caption for b in blocks if hasattr(b, "caption")]
    assert captions[0] == "Per merge function and partial state"
    assert any(ZERO in c and "parts unmergeable" in c for c in captions) and len(captions) == 4
    verdict = " ".join(str(part) for b in merge_verdict(records, found) for part in b.parts)
    assert "Partial states no merge can merge right" in verdict and f"{ZERO}'s (lse_finite_on_empty)" in verdict


def test_the_verdict_blames_a_merge_only_for_the_states_whose_parts_can_be_merged(records):
    from audit.render.merge_section import merge_verdict
    verdict = " ".join(str(part) for b in merge_verdict(records, check_merges(records)) for part in b.parts)
    wrong = verdict.split("Wrong: ", 1)[1].split(" (see ", 1)[0]
    assert NAN_ON_EMPTY in wrong and "parts unmergeable" not in wrong and "@" + ZERO not in wrong
