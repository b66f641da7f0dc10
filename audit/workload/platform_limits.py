"""What torch refuses on this machine's kind, known before a call: Inductor's FlexAttention lowering
for the CPU (compiled flex on a CPU without AVX2, or under ATEN_CPU_CAPABILITY=default). A refusal
met in a call is recognised by its words wherever it comes from (core.errors.PLATFORM_REFUSALS,
skip_platform_refusals); this module lets the built-ins refuse before a compile that would take a
second or more to fail (compiling.compiled_flex_attention), and lets the plan predict such cells as
skipped (plan.cell_work)."""
from __future__ import annotations

import os
import sys

from ..core.errors import platform_reason

# torch's words in Inductor's flex lowering (torch/_inductor/kernel/flex/flex_cpu.py, lower_cpu)
FLEX_CPU_REFUSED = "torch.compile on current platform is not supported for CPU."
# The variants whose calls compile flex_attention: the built-ins flex and paged_flex, and transformers'
# flex_attention, which compiles it itself.
COMPILED_FLEX_VARIANTS: tuple[str, ...] = ("flex", "paged_flex", "hf:flex_attention")


def flex_cpu_supported() -> bool:
    """torch 2.13's check_cpu_supported (torch._inductor.kernel.flex.flex_cpu), mirrored: importing
    it imports Inductor (2-4 s), which the plan and an eager-only process never pay. x86 with AVX2, the
    capability not forced to default, no XPU, not macOS (tests compare it with torch's own). About a
    microsecond: the plan asks it per cell."""
    try:
        import torch
    except ImportError:
        return True                         # nothing to predict without torch: no refusal
    avx2 = getattr(torch.cpu, "_is_avx2_supported", None)
    xpu = getattr(torch, "xpu", None)
    return bool(avx2 is not None and avx2() and os.getenv("ATEN_CPU_CAPABILITY") != "default"
                and not (xpu is not None and xpu.is_available()) and sys.platform != "darwin")


def compiled_flex_refusal(device: str) -> str | None:
    """The skip reason of compiled flex_attention on `device` ("cpu", "cuda:0") here, or None."""
    if str(device).split(":")[0] != "cpu" or flex_cpu_supported():
        return None
    return platform_reason(FLEX_CPU_REFUSED)


def predicted_refusal(variant: str, device: str) -> str | None:
    """Why torch refuses variant `variant` on `device` on this machine, as far as it is known before
    a call (COMPILED_FLEX_VARIANTS on a CPU Inductor's flex lowering refuses), or None."""
    return compiled_flex_refusal(device) if variant in COMPILED_FLEX_VARIANTS else None

