"""tests/cpu_kinds.py: the emulated CPU kinds `make test` runs are those that differ from the machine's
own; a setting that only restates what the machine has is left out."""
from __future__ import annotations

from tests.cpu_kinds import differing, kind, onednn_level, parse

EMULATED = "ATEN_CPU_CAPABILITY=default;ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
XEON_AMX = {"avx2", "avx512f", "amx_tile"}
EPYC_AVX512 = {"avx2", "avx512f"}
EPYC_AVX2 = {"avx2"}


def test_parse_reads_make_s_settings():
    assert parse(EMULATED) == [{"ATEN_CPU_CAPABILITY": "default"},
                               {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}]
    assert parse("") == [] and parse(" ; ") == []


def test_on_an_avx512_machine_both_kinds_are_emulated():
    for flags in (XEON_AMX, EPYC_AVX512):
        runs, same = differing(parse(EMULATED), "avx512", flags)
        assert runs == parse(EMULATED) and same == []


def test_on_an_avx2_only_machine_the_avx2_kind_is_its_own_and_left_out():
    runs, same = differing(parse(EMULATED), "avx2", EPYC_AVX2)
    assert runs == [{"ATEN_CPU_CAPABILITY": "default"}]
    assert same == [{"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}]


def test_a_cap_only_on_onednn_still_differs_where_onednn_has_more():
    """ATen's AVX2 kernels on an AVX-512 machine whose oneDNN keeps AVX-512: a kind of its own."""
    assert kind({"ATEN_CPU_CAPABILITY": "avx2"}, "avx512", onednn_level(EPYC_AVX512)) == ("avx2", 2.0)
    runs, _ = differing([{"ONEDNN_MAX_CPU_ISA": "AVX2"}], "avx512", XEON_AMX)
    assert runs == [{"ONEDNN_MAX_CPU_ISA": "AVX2"}]
    _, same = differing([{"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}], "avx2", EPYC_AVX2)
    assert same == [{"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}]      # a cap above the CPU changes nothing


def test_a_request_above_the_cpu_or_an_unknown_name_is_handled_without_a_guess():
    assert kind({"ATEN_CPU_CAPABILITY": "avx512"}, "avx2", 1) == ("avx2", 1.0)     # torch keeps its own pick
    runs, _ = differing([{"ONEDNN_MAX_CPU_ISA": "SOMETHING_NEW"}], "avx2", EPYC_AVX2)
    assert runs == [{"ONEDNN_MAX_CPU_ISA": "SOMETHING_NEW"}]                      # run, not left out
