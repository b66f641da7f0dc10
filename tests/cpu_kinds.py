"""Which of the emulated CPU kinds (make's EMULATED_CPUS) differ from this machine's own: `make test`
runs the tests marked cpu_kinds again under each setting that does, and says which it leaves out.

A setting only lowers what the machine has: `ATEN_CPU_CAPABILITY=avx2` on an AVX2-only CPU picks the
kernels ATen picks there anyway, and `ONEDNN_MAX_CPU_ISA=AVX2` caps oneDNN at what it has already.
On such a machine (a 2-core AVX2-only AMD EPYC) the AVX2 kind ran every marked test a second time
for nothing: 420 tests, about 45 CPU-seconds of the parallel phase.

    python tests/cpu_kinds.py 'ATEN_CPU_CAPABILITY=default;ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2'

prints the settings that differ, `;` between them (an empty line: none), and on stderr a line for
each left out. torch is imported once, for the capability ATen picked here.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping

# ATen's capabilities on x86 (ATEN_CPU_CAPABILITY), lowest first: a request above what the CPU has is
# ignored (torch keeps its own pick)
ATEN_LEVELS = ("default", "avx2", "avx512")
# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA, also read as DNNL_MAX_CPU_ISA) by level, and the /proc/cpuinfo
# flag that gives a CPU each level: a cap at or above the CPU's level changes nothing
ONEDNN_LEVELS = {"SSE41": 0, "AVX": 0, "AVX2": 1, "AVX2_VNNI": 1, "AVX2_VNNI_2": 1, "AVX512_CORE": 2,
                 "AVX512_CORE_VNNI": 2, "AVX512_CORE_BF16": 2, "AVX512_CORE_FP16": 2, "AVX10_1_512": 2,
                 "AVX512_CORE_AMX": 3, "AVX512_CORE_AMX_FP16": 3, "AVX10_1_512_AMX": 3,
                 "AVX10_1_512_AMX_FP16": 3, "ALL": 99, "DEFAULT": 99}
CPU_FLAG_LEVELS = (("amx_tile", 3), ("avx512f", 2), ("avx2", 1))


def parse(settings: str) -> list[dict[str, str]]:
    """`A=1 B=2;C=3` -> [{A: 1, B: 2}, {C: 3}] (make's EMULATED_CPUS)."""
    return [dict(kv.split("=", 1) for kv in part.split()) for part in settings.split(";") if part.strip()]


def onednn_level(flags: set[str]) -> int:
    """The oneDNN ISA level of a CPU with these /proc/cpuinfo flags."""
    return next((level for flag, level in CPU_FLAG_LEVELS if flag in flags), 0)


def kind(setting: Mapping[str, str], aten_native: str, onednn_native: int) -> tuple[str, float]:
    """(ATen's capability, oneDNN's level) under `setting` on a machine whose own are these. An unknown
    name counts as a kind of its own (run, never left out for a guess)."""
    aten = setting.get("ATEN_CPU_CAPABILITY", aten_native).lower()
    if aten in ATEN_LEVELS and aten_native in ATEN_LEVELS and ATEN_LEVELS.index(aten) > ATEN_LEVELS.index(aten_native):
        aten = aten_native                              # torch ignores a capability the CPU lacks
    cap = setting.get("ONEDNN_MAX_CPU_ISA", setting.get("DNNL_MAX_CPU_ISA"))
    onednn = float(onednn_native) if cap is None else min(ONEDNN_LEVELS.get(cap.upper(), float("nan")), onednn_native)
    return aten, onednn


def differing(settings: list[dict[str, str]], aten_native: str, flags: set[str]) -> tuple[list[dict], list[dict]]:
    """(the settings whose kind differs from this machine's, those that are this machine's own)."""
    level = onednn_level(flags)
    native = (aten_native, float(level))
    runs, same = [], []
    for setting in settings:
        (same if kind(setting, aten_native, level) == native else runs).append(setting)
    return runs, same


def _flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def _text(setting: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def main(argv: list[str]) -> int:
    import torch
    aten_native = torch.backends.cpu.get_cpu_capability().lower()
    runs, same = differing(parse(argv[0] if argv else ""), aten_native, _flags())
    for setting in same:
        print(f"CPU kind {_text(setting)}: this machine's own (ATen {aten_native}): its tests ran natively",
              file=sys.stderr)
    print(";".join(map(_text, runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
