"""Inductor takes the vector ISAs this CPU reports without its per-process check (compiling.trusted_vec_isa)
only where the C++ compiler accepts every one of their flags, and never over the user's own setting."""
from __future__ import annotations

import platform

import pytest

from audit.workload import compiling

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 vector ISAs only")


@pytest.fixture
def fresh(monkeypatch):
    """trusted_vec_isa as a first call in a process without $TORCHINDUCTOR_VEC_ISA_OK (the tests set it)."""
    monkeypatch.delenv(compiling.VEC_ISA_ENV, raising=False)
    trusted = compiling.trusted_vec_isa
    trusted.cache_clear()
    yield
    trusted.cache_clear()


def _compiler(tmp_path, refuses: str | None) -> str:
    """A stand-in for the C++ compiler: g++, refusing any flag containing `refuses`."""
    script = tmp_path / "cxx"
    check = f'case "$*" in *{refuses}*) echo "unrecognized command-line option" >&2; exit 1;; esac\n' if refuses else ""
    script.write_text(f"#!/bin/sh\n{check}exec g++ \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def test_a_compiler_taking_every_flag_is_trusted_and_one_refusing_a_flag_is_not(fresh, tmp_path, monkeypatch):
    import shutil

    from torch._inductor import cpp_builder
    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine")
    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", lambda: _compiler(tmp_path, None))
    assert compiling.trusted_vec_isa() is True
    compiling.trusted_vec_isa.cache_clear()
    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", lambda: _compiler(tmp_path, "-mavx2"))
    assert compiling.trusted_vec_isa() is False            # every x86-64 CPU torch vectorises for has AVX2


def test_the_users_setting_stands(fresh, monkeypatch):
    monkeypatch.setenv(compiling.VEC_ISA_ENV, "0")
    assert compiling.trusted_vec_isa() is False


def test_configuring_dynamo_sets_inductors_flag_only_where_trusted(fresh, monkeypatch):
    import torch._inductor.config as inductor_config
    before = inductor_config.cpp.vec_isa_ok              # (a config entry: monkeypatch would delete it on undo)
    try:
        inductor_config.cpp.vec_isa_ok = None
        monkeypatch.setattr(compiling, "trusted_vec_isa", lambda: False)
        compiling.configure_dynamo()
        assert inductor_config.cpp.vec_isa_ok is None
        monkeypatch.setattr(compiling, "trusted_vec_isa", lambda: True)
        compiling.configure_dynamo()
        assert inductor_config.cpp.vec_isa_ok is True
    finally:
        inductor_config.cpp.vec_isa_ok = before
