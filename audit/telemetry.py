"""Environment capture (software versions, device and CPU names, git commit,
NVML) and per-cell NVML telemetry (energy, power, clocks, throttling).

Without an NVIDIA driver every NVML field is null and `nvml_reason` /
`telemetry_reason` says why; nothing fails.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Callable

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


# ---------------------------------------------------------------------------
# Per-run and per-cell NVML telemetry on NVIDIA GPUs.
#
# Every NVML call goes through an injectable module object (`nvml`, default the
# real pynvml) so the logic is unit-tested with a fake NVML on machines without
# a driver. Nothing here raises: a missing driver, CUDA or query gives None
# columns and a reason.

# Columns EnergyMeter.measure() and null_telemetry() produce, in this order.
TELEMETRY_COLUMNS: tuple[str, ...] = (
    "energy_per_call_j", "energy_method", "mean_power_w", "sm_clock_mhz", "temperature_c",
    "throttle_reasons", "energy_calls", "energy_window_s", "telemetry_reason",
)

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
_NVML_CLOCK_SM = 1          # pynvml.NVML_CLOCK_SM
_NVML_TEMPERATURE_GPU = 0   # pynvml.NVML_TEMPERATURE_GPU


def null_telemetry(reason: str) -> dict[str, Any]:
    """Every telemetry column None, with the reason telemetry is missing."""
    cols: dict[str, Any] = {c: None for c in TELEMETRY_COLUMNS}
    cols["telemetry_reason"] = reason
    return cols


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


def _norm_uuid(u: Any) -> str | None:
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
    norm = [_norm_uuid(u) for u in nvml_uuids]
    want = _norm_uuid(torch_uuid)
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
            prefix = _norm_uuid(token)
            hits = [i for i, u in enumerate(norm) if u and prefix and u.startswith(prefix)]
            if len(hits) != 1:
                break          # unknown, ambiguous or MIG-form: CUDA ignores the rest
            entries.append(hits[0])
        if 0 <= torch_index < len(entries):
            return entries[torch_index]
    return torch_index


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _try(fn: Callable[[], Any]) -> Any:
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
        "name": _try(lambda: _text(nvml.nvmlDeviceGetName(handle))),
        "uuid": _try(lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
        "driver": _try(lambda: _text(nvml.nvmlSystemGetDriverVersion())),
        "cuda_driver": _try(cuda_version),
        "compute_capability": _try(capability),
        "power_limit_w": _try(power_limit),
    }


def _is_not_supported(nvml: Any, exc: BaseException) -> bool:
    cls = getattr(nvml, "NVMLError_NotSupported", None)
    if isinstance(cls, type) and isinstance(exc, cls):
        return True
    return getattr(exc, "value", None) == 3    # NVML_ERROR_NOT_SUPPORTED


_VISIBLE_FROM_ENV = object()


def _torch_cuda_uuid(index: int) -> str | None:
    """UUID of torch's CUDA device `index`; raises RuntimeError without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA unavailable to torch")
    return _norm_uuid(getattr(torch.cuda.get_device_properties(index), "uuid", None))


class EnergyMeter:
    """Energy, power, clocks, temperature and throttling of one GPU while a cell runs.

    Construct once per run (NVML init and device mapping happen here); call
    measure() per cell. When NVML or CUDA is missing, `available` is False and
    measure() returns null_telemetry(reason); nothing raises.

    `nvml`: the NVML module (default: import pynvml); `cuda_uuid(index)` returns
    torch's UUID of that device (None when unknown) and raises without CUDA (the
    default asks torch); `visible_env` defaults to $CUDA_VISIBLE_DEVICES.
    """

    def __init__(self, nvml: Any = None, device_index: int = 0, *,
                 cuda_uuid: Callable[[int], str | None] | None = None,
                 visible_env: Any = _VISIBLE_FROM_ENV,
                 clock: Callable[[], float] | None = None,
                 sample_every_s: float = 0.1) -> None:
        import time

        self.device_index = device_index
        self.clock = clock or time.perf_counter
        self.sample_every_s = sample_every_s
        self.nvml = nvml
        self.handle: Any = None
        self.nvml_index: int | None = None
        self.reason: str | None = None
        self._initialized = False
        if visible_env is _VISIBLE_FROM_ENV:
            visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                self.reason = f"nvidia-ml-py not importable: {exc}"
                return
            self.nvml = pynvml
        try:
            self.nvml.nvmlInit()
            self._initialized = True
        except Exception as exc:  # NVMLError_LibraryNotFound without a driver
            self.reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return
        try:
            torch_uuid = (cuda_uuid or _torch_cuda_uuid)(device_index)
        except Exception as exc:
            self.reason = f"no CUDA device {device_index}: {type(exc).__name__}: {exc}"
            self.close()
            return
        try:
            n = int(self.nvml.nvmlDeviceGetCount())
            handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            uuids = [_try(lambda h=h: _text(self.nvml.nvmlDeviceGetUUID(h))) or "" for h in handles]
            idx = nvml_index_for(device_index, torch_uuid, uuids, visible_env)
            if not 0 <= idx < n:
                raise IndexError(f"NVML index {idx} out of range ({n} devices)")
            self.nvml_index, self.handle = idx, handles[idx]
        except Exception as exc:
            self.reason = f"NVML device lookup failed: {type(exc).__name__}: {exc}"
            self.close()

    @property
    def available(self) -> bool:
        return self.handle is not None and self.reason is None

    def info(self) -> dict[str, Any] | None:
        """nvml_device_info() of the mapped GPU plus its NVML index, or None."""
        if not self.available:
            return None
        return {"nvml_index": self.nvml_index, **nvml_device_info(self.nvml, self.handle)}

    def close(self) -> None:
        """Release NVML (reference-counted, so other users are unaffected)."""
        if self._initialized:
            self._initialized = False
            self.handle = None
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass

    def __enter__(self) -> "EnergyMeter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- readings -----------------------------------------------------------
    def _throttle_mask(self) -> int | None:
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue
            try:
                return int(fn(self.handle))
            except Exception:
                continue
        return None

    def _sample(self, power: list[float], clocks: list[float], temps: list[float]) -> int | None:
        """One reading of power, SM clock and temperature (each optional); returns the throttle mask."""
        p = _try(lambda: self.nvml.nvmlDeviceGetPowerUsage(self.handle))            # mW
        if p is not None:
            power.append(float(p) / 1000.0)
        c = _try(lambda: self.nvml.nvmlDeviceGetClockInfo(
            self.handle, getattr(self.nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM)))       # MHz
        if c is not None:
            clocks.append(float(c))
        t = _try(lambda: self.nvml.nvmlDeviceGetTemperature(
            self.handle, getattr(self.nvml, "NVML_TEMPERATURE_GPU", _NVML_TEMPERATURE_GPU)))
        if t is not None:
            temps.append(float(t))
        return self._throttle_mask()

    def _energy_mj(self) -> float:
        return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def measure(self, fn: Callable[[], object], *, min_window_s: float = 1.0,
                sync: Callable[[], None] | None = None) -> dict[str, Any]:
        """Run `fn` (already warmed up) repeatedly for >= min_window_s; telemetry columns.

        Energy per call is the total-energy counter's difference (mJ) over the
        window divided by the calls: one counter reading covers every kernel,
        however short, which sampled power cannot. Where the counter raises (e.g.
        NVMLError_NotSupported on older GPUs) or does not advance, it is mean
        sampled power × window / calls, and `energy_method` says which.

        Calls run in blocks; power, SM clock, temperature and throttle reasons
        are read after each block is enqueued, while the GPU works, then the
        block is synchronized. The window is timed between synchronizations, so
        it covers exactly the work of `calls` calls. sm_clock_mhz is the median
        reading, temperature_c the highest, mean_power_w the mean.
        throttle_reasons is the union over readings before, during and after
        the window; "gpu_idle" counts only during the window (the GPU is idle
        before and after by construction).
        """
        if not self.available:
            return null_telemetry(self.reason or "NVML unavailable")
        import statistics

        notes: list[str] = []
        power: list[float] = []
        clocks: list[float] = []
        temps: list[float] = []
        masks_outside: list[int] = []
        masks_during: list[int] = []

        if sync:
            sync()
        m = self._throttle_mask()
        if m is not None:
            masks_outside.append(m)
        counter_error: str | None = None
        try:
            e0: float | None = self._energy_mj()
        except Exception as exc:
            e0 = None
            counter_error = ("energy counter not supported" if _is_not_supported(self.nvml, exc)
                             else f"energy counter failed: {type(exc).__name__}: {exc}")
        start = self.clock()
        calls, block = 0, 1
        while True:
            block_start = self.clock()
            for _ in range(block):
                fn()
            calls += block
            m = self._sample(power, clocks, temps)
            if m is not None:
                masks_during.append(m)
            if sync:
                sync()
            now = self.clock()
            window = now - start
            if window >= min_window_s:
                break
            # grow blocks up to ~sample_every_s so sampling stays a small cost
            if now - block_start < self.sample_every_s / 2:
                block *= 2
        e1: float | None = None
        if e0 is not None:
            try:
                e1 = self._energy_mj()
            except Exception as exc:
                counter_error = f"energy counter failed: {type(exc).__name__}: {exc}"
        m = self._throttle_mask()
        if m is not None:
            masks_outside.append(m)

        mean_power = statistics.fmean(power) if power else None
        energy: float | None = None
        method: str | None = None
        if e0 is not None and e1 is not None and e1 > e0:
            energy, method = (e1 - e0) / 1000.0 / calls, "counter"
        else:
            if counter_error is None:
                counter_error = "energy counter did not advance"
            if mean_power is not None and window > 0:
                energy, method = mean_power * window / calls, "power×time"
            notes.append(counter_error)
        if mean_power is None:
            notes.append("power reading failed")
        if not clocks:
            notes.append("SM clock reading failed")
        if not temps:
            notes.append("temperature reading failed")
        if not masks_during and not masks_outside:
            notes.append("throttle reasons unavailable")
            throttle: list[str] | None = None
        else:
            union = 0
            for m in masks_during:
                union |= m
            for m in masks_outside:
                union |= m & ~0x1
            throttle = decode_throttle_reasons(union)
        return {
            "energy_per_call_j": energy,
            "energy_method": method,
            "mean_power_w": mean_power,
            "sm_clock_mhz": statistics.median(clocks) if clocks else None,
            "temperature_c": max(temps) if temps else None,
            "throttle_reasons": throttle,
            "energy_calls": calls,
            "energy_window_s": window,
            "telemetry_reason": "; ".join(notes) or None,
        }
