"""pytest configuration shared by tests/ and suites/.

`--audit-preset` chooses the grid the suites run over (default: quick); the
`--audit-<axis>` options narrow it like the CLI's axis options.
"""
from __future__ import annotations

AXIS_OPTIONS = ("variant", "device", "dtype", "d_k", "seq_len", "batch", "heads", "kv_heads", "causal",
                "scenario")


def pytest_addoption(parser):
    group = parser.getgroup("attn-audit")
    group.addoption("--audit-preset", default="quick",
                    help="grid the suites/ run over: quick (default), cpu or gpu")
    for axis in AXIS_OPTIONS:
        flag = "--audit-" + axis.replace("_", "-")
        group.addoption(flag, nargs="+", default=None, metavar="V",
                        help=f"only these {axis} values (like the CLI's --{axis.replace('_', '-')})")


def pytest_benchmark_update_machine_info(config, machine_info):
    """Saved benchmark runs carry the torch/CUDA stack and the device they ran on."""
    import torch

    from audit.telemetry import cpu_model, nvml_info

    machine_info["torch"] = torch.__version__
    machine_info["cuda"] = torch.version.cuda
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["cpu_model"] = cpu_model()
    machine_info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    nvml, reason = nvml_info()
    machine_info["nvidia_driver"] = nvml["driver"] if nvml else None
    machine_info["nvml_reason"] = reason
