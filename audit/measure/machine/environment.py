"""Environment capture, once per run: software versions, device and CPU names, git commit,
the GPUs' NVML facts. Without an NVIDIA driver the NVML fields are null and `nvml_reason`
says why; nothing fails.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from ...core.version import git_commit
from .nvml import nvml_info


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment() -> dict[str, Any]:
    """Facts that make a run's numbers interpretable; captured once per run."""
    import torch

    cuda = torch.cuda.is_available()
    nvml, nvml_reason = nvml_info()
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.version.cuda,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "device_name": torch.cuda.get_device_name(0) if cuda else cpu_model(),
        "git_commit": git_commit(),
        "nvml": nvml,
        "nvml_reason": nvml_reason,
    }
