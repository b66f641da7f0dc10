"""Environment capture: software versions, device and CPU names, git commit, NVML.

Without an NVIDIA driver every NVML field is null and `nvml_reason` says why;
nothing fails.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def git_commit(root: Path = PROJECT_ROOT) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def nvml_info() -> tuple[dict[str, Any] | None, str | None]:
    """(NVML facts per GPU, None) or (None, reason NVML is unavailable)."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"nvidia-ml-py not importable: {exc}"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound without a driver
        return None, f"NVML unavailable: {type(exc).__name__}: {exc}"
    try:
        def text(x: Any) -> str:
            return x.decode() if isinstance(x, bytes) else str(x)

        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append({"index": i, "name": text(pynvml.nvmlDeviceGetName(h))})
        return {"driver": text(pynvml.nvmlSystemGetDriverVersion()),
                "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion(), "gpus": gpus}, None
    except Exception as exc:
        return None, f"NVML query failed: {type(exc).__name__}: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


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
