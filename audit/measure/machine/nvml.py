"""NVML, read through an injectable module object (`nvml`, default the real pynvml), so the
logic is unit-tested with a fake NVML on machines without a driver: the GPUs' facts, their
mapping to torch's device indices, throttle-reason bits. Nothing here raises for a missing
driver: callers get None and a reason.
"""
from __future__ import annotations

from typing import Any, Callable

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
            facts = nvml_device_info(pynvml, h)   # adds uuid, compute capability, power limit
            gpus.append({"index": i, "name": text(pynvml.nvmlDeviceGetName(h)),
                         **{k: facts[k] for k in ("uuid", "compute_capability", "power_limit_w")}})
        return {"driver": text(pynvml.nvmlSystemGetDriverVersion()),
                "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion(), "gpus": gpus}, None
    except Exception as exc:
        return None, f"NVML query failed: {type(exc).__name__}: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


# nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (nvml.h); the two
# families share values. Hard-coded so decoding needs no NVML.
THROTTLE_REASON_BITS: dict[int, str] = {
    0x0001: "gpu_idle",
    0x0002: "applications_clocks_setting",
    0x0004: "sw_power_cap",
    0x0008: "hw_slowdown",
    0x0010: "sync_boost",
    0x0020: "sw_thermal_slowdown",
    0x0040: "hw_thermal_slowdown",
    0x0080: "hw_power_brake_slowdown",
    0x0100: "display_clock_setting",
    0x0200: "board_limit",
    0x0400: "reliability",
}
NVML_CLOCK_SM = 1          # pynvml.NVML_CLOCK_SM
NVML_TEMPERATURE_GPU = 0   # pynvml.NVML_TEMPERATURE_GPU


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the bits set in an NVML clocks-event (throttle) reason bitmask, in bit order.

    Unknown bits are kept as `unknown_0x...` rather than dropped, so a newer
    driver's reason still shows up.
    """
    names = []
    bit = 1
    mask = int(mask)
    while bit <= mask:
        if mask & bit:
            names.append(THROTTLE_REASON_BITS.get(bit, f"unknown_{bit:#x}"))
        bit <<= 1
    return names


def norm_uuid(u: Any) -> str | None:
    """Comparable form of a GPU UUID: lower case hex without the "GPU-" prefix.

    NVML returns "GPU-8932f937-d72c-..."; torch's `uuid` property prints as
    "8932f937-d72c-..." (a _CUuuid object; older builds expose only `.bytes`).
    """
    if u is None:
        return None
    if isinstance(u, bytes):
        u = u.decode(errors="replace")
    elif not isinstance(u, str):
        raw = getattr(u, "bytes", None)
        s = str(u)
        if isinstance(raw, bytes) and len(raw) == 16 and len(s.replace("-", "")) != 32:
            h = raw.hex()
            s = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        u = s
    u = u.strip().lower()
    if u.startswith("gpu-"):
        u = u[4:]
    return u or None


def nvml_index_for(torch_index: int, torch_uuid: str | None, nvml_uuids: list[str],
                   visible_env: str | None) -> int:
    """NVML device index of torch's CUDA device `torch_index`.

    torch numbers only the devices CUDA_VISIBLE_DEVICES exposes, NVML numbers all
    of them, so the same index can name different GPUs. In order of trust:
    1. the UUID: the one identifier both APIs agree on;
    2. the torch_index-th entry of CUDA_VISIBLE_DEVICES: an integer is an NVML
       index (exact when CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML's order), otherwise a
       UUID or unique UUID prefix ("GPU-8932f937"), matched against NVML's UUIDs;
       CUDA stops at the first invalid entry, and so does this parser;
    3. the same index.
    """
    norm = [norm_uuid(u) for u in nvml_uuids]
    want = norm_uuid(torch_uuid)
    if want:
        for i, u in enumerate(norm):
            if u == want:
                return i
    if visible_env is not None and visible_env.strip():
        entries: list[int] = []
        for token in visible_env.split(","):
            token = token.strip()
            if not token:
                break
            if token.lstrip("-").isdigit():
                idx = int(token)
                if idx < 0:
                    break
                entries.append(idx)
                continue
            prefix = norm_uuid(token)
            hits = [i for i, u in enumerate(norm) if u and prefix and u.startswith(prefix)]
            if len(hits) != 1:
                break          # unknown, ambiguous or MIG-form: CUDA ignores the rest
            entries.append(hits[0])
        if 0 <= torch_index < len(entries):
            return entries[torch_index]
    return torch_index


def as_text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def try_call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None


def nvml_device_info(nvml: Any, handle: Any) -> dict[str, Any]:
    """Per-run facts about one GPU: name, UUID, driver, CUDA driver version,
    compute capability ("9.0") and enforced power limit in W.

    Each field is queried on its own: an unsupported query gives None for that
    field only.
    """
    def cuda_version() -> str:
        v = int(nvml.nvmlSystemGetCudaDriverVersion())       # e.g. 12040
        return f"{v // 1000}.{(v % 1000) // 10}"

    def capability() -> str:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return f"{major}.{minor}"

    def power_limit() -> float:
        try:
            mw = nvml.nvmlDeviceGetEnforcedPowerLimit(handle)
        except Exception:
            mw = nvml.nvmlDeviceGetPowerManagementLimit(handle)
        return float(mw) / 1000.0

    return {
        "name": try_call(lambda: as_text(nvml.nvmlDeviceGetName(handle))),
        "uuid": try_call(lambda: as_text(nvml.nvmlDeviceGetUUID(handle))),
        "driver": try_call(lambda: as_text(nvml.nvmlSystemGetDriverVersion())),
        "cuda_driver": try_call(cuda_version),
        "compute_capability": try_call(capability),
        "power_limit_w": try_call(power_limit),
    }


def is_not_supported(nvml: Any, exc: BaseException) -> bool:
    cls = getattr(nvml, "NVMLError_NotSupported", None)
    if isinstance(cls, type) and isinstance(exc, cls):
        return True
    return getattr(exc, "value", None) == 3    # NVML_ERROR_NOT_SUPPORTED


def torch_cuda_uuid(index: int) -> str | None:
    """UUID of torch's CUDA device `index`; raises RuntimeError without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA unavailable to torch")
    return norm_uuid(getattr(torch.cuda.get_device_properties(index), "uuid", None))
