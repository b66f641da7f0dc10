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
    "energy_per_call_j", "energy_method", "mean_power_w", "sampled_power_w", "energy_idle_frac",
    "sm_clock_mhz", "temperature_c", "throttle_reasons", "energy_calls", "energy_window_s",
    "energy_cost_s", "telemetry_reason",
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
                 sample_every_s: float = 0.01) -> None:
        import time

        self.device_index = device_index
        self.clock = clock or time.perf_counter
        self.sample_every_s = sample_every_s
        self._instant_unsupported = False
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
        """One reading of power (instantaneous where NVML has it, else its 1 s average), SM clock
        and temperature (each optional); returns the throttle mask."""
        p = self._instant_power_w()
        if p is None:
            mw = _try(lambda: self.nvml.nvmlDeviceGetPowerUsage(self.handle))       # mW
            p = None if mw is None else float(mw) / 1000.0
        if p is not None:
            power.append(p)
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

    def _instant_power_w(self) -> float | None:
        """Instantaneous board power (NVML_FI_DEV_POWER_INSTANT), or None where unsupported.

        nvmlDeviceGetPowerUsage is a 1-second average on Ampere and newer GPUs: over a
        0.1-0.3 s window it mostly reports the cell before. The instant field does not lag.
        """
        if self._instant_unsupported:
            return None
        field = getattr(self.nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        get = getattr(self.nvml, "nvmlDeviceGetFieldValues", None)
        if field is None or get is None:
            self._instant_unsupported = True
            return None
        try:
            value = get(self.handle, [field])[0]
            if getattr(value, "nvmlReturn", 0) != 0:
                raise RuntimeError(f"nvmlReturn {value.nvmlReturn}")
            return float(value.value.uiVal) / 1000.0
        except Exception:
            self._instant_unsupported = True
            return None

    def measure(self, run_unit: Callable[[], object], *, calls_per_unit: int = 1,
                kernel_s: float | None = None, device: Any = None, min_window_s: float = 0.1,
                max_wall_s: float = 0.3, sync: Callable[[], None] | None = None) -> dict[str, Any]:
        """Energy per call of back-to-back calls; every telemetry column.

        `run_unit()` queues `calls_per_unit` calls without synchronizing (a CUDA-graph replay
        of them, or a loop); `kernel_s` is one call's measured device time; `device` gives
        CUDA events (timing.CudaClock). Units keep running, at most two in flight, while:

        1. the total-energy counter is polled until it changes (it is updated every
           20-100 ms, not continuously): the window opens on that edge, E0 at t0;
        2. after at least `min_window_s` the counter is polled until it changes again:
           the window closes on that edge, E1 at t1.

        mean_power_w = (E1 - E0) / (t1 - t0): the GPU's power while running the calls,
        with no partial update period at either end. CUDA events around all units give
        the device time per call; energy_per_call_j = mean power × that time, and
        energy_idle_frac = 1 - calls × kernel_s / device time says how much of it the GPU
        waited for the host (energy then includes idle power, and the reason says so).
        sampled_power_w is the mean of the instantaneous power readings in the window, an
        independent check of the counter. When no edge comes within `max_wall_s` the
        energy is the counter's difference over the whole run (method "counter
        (unaligned)"), or sampled power × time where the counter fails ("power×time").
        """
        if not self.available:
            return null_telemetry(self.reason or "NVML unavailable")
        import statistics
        from collections import deque

        notes: list[str] = []
        power: list[float] = []
        clocks: list[float] = []
        temps: list[float] = []
        masks_outside: list[int] = []
        masks_during: list[int] = []
        inflight: deque = deque()
        units = 0

        def read_counter() -> float | None:
            nonlocal counter_error
            try:
                return self._energy_mj()
            except Exception as exc:
                counter_error = ("energy counter not supported" if _is_not_supported(self.nvml, exc)
                                 else f"energy counter failed: {type(exc).__name__}: {exc}")
                return None

        def sample() -> None:
            m = self._sample(power, clocks, temps)
            if m is not None:
                masks_during.append(m)

        def poll() -> None:
            """Read the counter (and, every sample_every_s, power and clocks); note an edge."""
            nonlocal last, last_sample
            now = self.clock()
            if now - last_sample >= self.sample_every_s:
                sample()
                last_sample = now
            e = read_counter() if e_begin is not None else None
            if e is not None and last is not None and e != last:
                if not edges or now - edges[0][0] >= min_window_s:
                    edges.append((now, e))
                last = e

        def unit() -> None:
            """Queue one unit; keep at most two queued, polling the counter while waiting."""
            nonlocal units
            run_unit()
            units += 1
            if device is not None:
                ev = device.event()
                ev.record()
                inflight.append(ev)
                while len(inflight) > 2:
                    if e_begin is None:                 # nothing to poll: just wait
                        inflight.popleft().synchronize()
                    elif inflight[0].query():
                        inflight.popleft()
                    else:
                        poll()
                        if len(edges) == 2:
                            return
            elif sync:
                sync()

        if sync:
            sync()
        m = self._throttle_mask()
        if m is not None:
            masks_outside.append(m)
        counter_error: str | None = None
        first = None
        if device is not None:
            first = device.event()
            first.record()
        begin = self.clock()
        e_begin = read_counter()
        edges: list[tuple[float, float]] = []      # (host time, counter mJ) at counter updates
        last, last_sample = e_begin, -1.0
        while True:
            unit()
            if len(edges) < 2:
                poll()
            now = self.clock()
            if len(edges) == 2:
                break
            if now - begin >= max_wall_s and (not edges or now - edges[0][0] >= min_window_s):
                break
            if now - begin >= 2 * max_wall_s + min_window_s:
                break
        end_host = self.clock()
        e_end = read_counter() if e_begin is not None else None
        span_s = None
        if device is not None:
            final = device.event()
            final.record()
            final.synchronize()
            span_s = first.elapsed_time(final) / 1e3
        elif sync:
            sync()
        m = self._throttle_mask()
        if m is not None:
            masks_outside.append(m)

        calls = units * calls_per_unit
        per_call_s = (span_s if span_s else end_host - begin) / calls
        sampled = statistics.fmean(power) if power else None
        method: str | None = None
        mean_power: float | None = None
        window = end_host - begin
        if len(edges) == 2:
            (t0, e0), (t1, e1) = edges
            window = t1 - t0
            mean_power, method = (e1 - e0) / 1000.0 / window, "counter"
        elif e_begin is not None and e_end is not None and e_end > e_begin:
            mean_power, method = (e_end - e_begin) / 1000.0 / window, "counter (unaligned)"
            notes.append(f"the energy counter changed {len(edges)} time(s) in {window:.2f} s: "
                         "window not aligned to its updates")
        else:
            notes.append(counter_error or "energy counter did not advance")
            if sampled is not None:
                mean_power, method = sampled, "power×time"
        energy = mean_power * per_call_s if mean_power is not None else None
        idle = None
        if kernel_s and span_s:
            idle = max(0.0, 1.0 - calls * kernel_s / span_s)
            if idle > 0.05:
                notes.append(f"GPU idle {idle:.0%} of the window between calls (host-bound): "
                             "energy per call includes idle power")
        if not power:
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
            "sampled_power_w": sampled,
            "energy_idle_frac": idle,
            "sm_clock_mhz": statistics.median(clocks) if clocks else None,
            "temperature_c": max(temps) if temps else None,
            "throttle_reasons": throttle,
            "energy_calls": calls,
            "energy_window_s": window,
            "energy_cost_s": self.clock() - begin,
            "telemetry_reason": "; ".join(notes) or None,
        }
