"""Input sets' float64 references kept on disk, within a run and across runs.

An input set's reference (cellcache.Reference: the float64 golden with gradients, the golden of
the referee's shifted values, the same-dtype baseline's errors) is a pure function of the set's
axes (Case.input_key: its inputs are drawn from a seed of them), the causal alignment it follows,
the code that draws and computes them, torch and the machine's kernels. It costs up to a second a
set on the CPU (T 2048, d 128: 0.9 s on 2 cores), far more than reading it back. So a reference is
written here when it was worth it (STORE_MIN_BUILD_S, and reading it back predicted much faster
than building it) and read back:

- within a run, when the run comes back to an input set it left (the plan measures the coverage
  cells of every input set first, then the rest in grid order: 40% of the cpu preset's goldens
  were built twice before this store);
- across runs, by every later run of this machine with the same code (a warm `make audit`).

The key (entry_key) holds what the reference depends on: the input set's axes, the alignment,
a fingerprint of the audit's measuring and workload code (any change to how inputs are drawn or
goldens computed makes new keys), torch's version, its thread count and CPU capability (a float64
matmul's last bits follow the kernel), and the device. The files are plain torch.save dicts of
tensors and numbers, read with weights_only=True. The store keeps at most STORE_MAX_BYTES
(ATTN_AUDIT_GOLDEN_CACHE_MB moves it; 0 turns the store off), the least recently used files
going first. The cost model asks has() to predict a read instead of a build.
"""
from __future__ import annotations

import functools
import hashlib
import io
import os
from pathlib import Path
from typing import Any

from ...core.paths import cache_dir

FOLDER = "goldens"
STORE_ENV = "ATTN_AUDIT_GOLDEN_CACHE_MB"
STORE_MAX_BYTES = 1024 * 2**20      # the store's size at most (least recently used out first)
STORE_MIN_BUILD_S = 0.02            # a reference cheaper to build than this is built again, not stored
READ_BYTES_PER_S = 4e8              # reading a stored reference back: torch.load of a file, 2-core CPU
READ_FIXED_S = 0.002                # ... and opening it, unpickling its dict
STORE_GAIN = 4.0                    # stored only where reading it back is predicted this many times faster
# The code a reference depends on: the measuring and workload layers (inputs, eager, goldens, probes).
CODE_FOLDERS = ("measure", "workload", "core")


def max_bytes() -> int:
    """The store's size limit in bytes (ATTN_AUDIT_GOLDEN_CACHE_MB, else STORE_MAX_BYTES; 0: off)."""
    value = os.environ.get(STORE_ENV)
    if value is None or not value.strip():
        return STORE_MAX_BYTES
    try:
        return max(0, int(float(value) * 2**20))
    except ValueError:
        return STORE_MAX_BYTES


def folder() -> Path:
    return cache_dir() / FOLDER


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of the audit's core, workload and measure sources: a reference stored by other code
    is never read back."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.blake2b(digest_size=12)
    for sub in CODE_FOLDERS:
        for path in sorted((root / sub).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=8)
def _machine(device_type: str) -> tuple:
    """What a float64 reference's last bits follow besides the code: torch, its threads and CPU
    kernels, and the GPU's name."""
    import torch
    gpu = torch.cuda.get_device_name(0) if device_type == "cuda" and torch.cuda.is_available() else None
    return (torch.__version__, torch.get_num_threads(), torch.backends.cpu.get_cpu_capability(),
            os.environ.get("ONEDNN_MAX_CPU_ISA"), gpu)


def entry_key(input_key: tuple, alignment: str, device: str) -> str:
    """The file name (without suffix) of an input set's reference of `alignment` on `device`."""
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    text = repr((tuple(input_key), alignment, code_fingerprint(), _machine(device_type)))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _path(key: str) -> Path:
    return folder() / f"{key}.pt"


def has(key: str) -> bool:
    """Whether a reference is stored under `key` (the cost model predicts a read)."""
    return max_bytes() > 0 and _path(key).exists()


def worth_storing(build_s: float, nbytes: int) -> bool:
    """Store a reference that took build_s to build and holds nbytes: where building it again costs
    more than STORE_MIN_BUILD_S and reading it back is STORE_GAIN times faster."""
    return build_s >= STORE_MIN_BUILD_S and STORE_GAIN * read_s(nbytes) < build_s


def read_s(nbytes: float) -> float:
    """Predicted seconds to read a stored reference of nbytes back."""
    return READ_FIXED_S + nbytes / READ_BYTES_PER_S


def reference_bytes(slices: float, tq: int, tk: int, d: int, d_v: int) -> float:
    """About the bytes of a stored reference over `slices` (batch, head) slices: the float64 golden's
    out, dq, dk, dv and lse, and the referee's shifted-values golden (cellcache.reference_payload)."""
    return 8.0 * slices * (2 * tq * d_v + tq * d + tk * (d + d_v) + 2 * tq)


def load(key: str, device: str) -> dict[str, Any] | None:
    """The payload stored under `key`, its tensors on `device`; None when absent, unreadable or
    the store is off (a damaged file is removed)."""
    if max_bytes() <= 0:
        return None
    path = _path(key)
    try:
        import torch
        payload = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a damaged or foreign file: build again, and drop it
        path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)                     # recently used: evicted last
    except OSError:
        pass
    return payload if isinstance(payload, dict) else None


def save(key: str, payload: dict[str, Any]) -> bool:
    """Write `payload` under `key` (atomically: a reader never sees half a file), then keep the
    store under its size limit. False where the store is off or the disk refused."""
    limit = max_bytes()
    if limit <= 0:
        return False
    import torch
    target = _path(key)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        if buffer.tell() > limit:
            return False
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(buffer.getvalue())
        os.replace(tmp, target)
    except OSError:
        return False
    _evict(limit, keep=target)
    return True


def _evict(limit: int, keep: Path | None = None) -> None:
    """Remove the least recently used files until the store holds at most `limit` bytes."""
    try:
        files = [(p.stat().st_mtime, p.stat().st_size, p) for p in folder().glob("*.pt")]
    except OSError:
        return
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files, key=lambda f: f[0]):
        if total <= limit:
            break
        if path == keep:
            continue
        try:
            path.unlink()
            total -= size
        except OSError:
            pass


def tensor_bytes(payload: Any) -> int:
    """Bytes of the tensors in a payload (nested dicts, lists and tuples)."""
    if isinstance(payload, dict):
        return sum(tensor_bytes(v) for v in payload.values())
    if isinstance(payload, (list, tuple)):
        return sum(tensor_bytes(v) for v in payload)
    nbytes = getattr(payload, "nbytes", None)
    return int(nbytes) if isinstance(nbytes, int) else 0
