"""The record schema, the JSONL store and the DataFrame view.

A record is a plain dict: the cell's axes, a status with a reason, the
measurements and the environment. Failure is a status, never a fake number:
a measurement that was not taken is None (null), while NaN counts are data.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

SCHEMA_VERSION = 1
RECORDS_FILE = "records.jsonl"
STATUSES = ("ok", "skipped", "error", "oom")

# Every column a user can rely on, with its meaning. README's column table is
# checked against this dict by a test, so adding a metric means: one function
# that computes it, one entry here.
COLUMNS: dict[str, str] = {
    "schema": "record schema version (integer)",
    "id": "cell id: variant-device-dtype-d{d_k}-T{seq_len}-B{batch}-H{heads}-{causal|full}-{scenario}",
    "variant": "attention implementation (see `python -m audit list`)",
    "device": "cpu or cuda",
    "dtype": "input dtype: fp32, fp16 or bf16",
    "d_k": "head dimension",
    "seq_len": "query and key length T",
    "batch": "batch size B",
    "heads": "number of heads H",
    "causal": "true: causal (top-left aligned) masking",
    "scenario": "input distribution (normal: q, k, v ~ N(0, 1))",
    "status": "ok, skipped, error or oom",
    "reason": "why a cell is not ok (null when ok)",
    "fwd_ms": "median forward latency in ms (inputs require grad, as in training)",
    "fwd_iqr_ms": "interquartile range of the forward samples in ms",
    "fwd_n": "number of forward samples",
    "fwd_bwd_ms": "median forward+backward latency in ms",
    "fwd_bwd_iqr_ms": "interquartile range of the forward+backward samples in ms",
    "fwd_bwd_n": "number of forward+backward samples",
    "fwd_samples_s": "raw forward samples, seconds per call",
    "fwd_bwd_samples_s": "raw forward+backward samples, seconds per call",
    "timer": "how time was measured (cpu: perf_counter around blocks of calls)",
    "compile_s": "compiled variants: first-call time minus steady-state time, forward plus forward+backward (null for eager variants)",
    "fused_sdpa": "compiled variants: true when Inductor rewrote the code into fused SDPA (its numerics are then SDPA's)",
    "peak_bytes": "peak memory of one forward call above the baseline, bytes (cpu: VmHWM; cuda: allocator peak)",
    "peak_fwd_bwd_bytes": "peak memory of one forward+backward call above the baseline, bytes",
    "flops": "forward FLOPs, 4*B*H*Tq*Tk*d_k, causal counting visible pairs only",
    "gflops_per_s": "achieved forward GFLOP/s (flops / fwd_ms)",
    "fwd_bwd_gflops_per_s": "achieved forward+backward GFLOP/s (3.5 * flops / fwd_bwd_ms)",
    "out_nan": "NaN count in the output",
    "out_inf": "inf count in the output",
    "grad_nan": "NaN count in the gradients of q, k and v together",
    "grad_inf": "inf count in the gradients of q, k and v together",
    "max_abs_err": "max |out - golden| against the float64 reference",
    "rel_err": "relative Frobenius error ||out - golden|| / ||golden||",
    "max_prob": "mean over query rows of the largest attention probability (float64 golden)",
    "entropy": "mean normalized row entropy H(p) / log(visible keys) (float64 golden)",
    "onehot_frac": "fraction of query rows whose largest probability exceeds 0.99 (float64 golden)",
    "elapsed_s": "wall time spent on the cell, seconds",
    "started_at": "UTC time the cell started (ISO 8601)",
    "env": "environment: torch version, device name, CPU model, threads, git commit, NVML info",
}


def new_record(case_axes: dict[str, Any], case_id: str) -> dict[str, Any]:
    """A record with every column present; measurements start as None."""
    rec: dict[str, Any] = {col: None for col in COLUMNS}
    rec.update(case_axes)
    rec["schema"] = SCHEMA_VERSION
    rec["id"] = case_id
    return rec


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: store them as strings so the file stays standard JSON."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _restore(value: Any) -> Any:
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(_clean(record), default=_json_default, allow_nan=False, sort_keys=False)


class RecordWriter:
    """Appends one record per line and makes it durable before returning.

    A run killed mid-write (kill -9) can leave a partial last line; opening the
    store truncates it, so a resumed run never writes after garbage.
    """

    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / RECORDS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _truncate_partial_line(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(dumps(record) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _truncate_partial_line(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1  # 0 when the only line is partial
    with open(path, "r+b") as fh:
        fh.truncate(keep)


def migrate(record: dict[str, Any]) -> dict[str, Any]:
    """Bring a record of any known schema version to the current one."""
    version = record.get("schema")
    if version == SCHEMA_VERSION:
        return record
    raise ValueError(f"record schema {version!r} is not supported (this is schema {SCHEMA_VERSION})")


def iter_records(path: Path | str) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file; a partial last line (interrupted write) is ignored."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # interrupted write
            line = line.strip()
            if line:
                yield migrate(_restore(json.loads(line)))


def read_records(run_dir: Path | str) -> list[dict[str, Any]]:
    path = Path(run_dir) / RECORDS_FILE
    return list(iter_records(path)) if path.exists() else []


def completed_ids(run_dir: Path | str) -> set[str]:
    """Ids already recorded: a resumed run does not redo them."""
    return {r["id"] for r in read_records(run_dir)}


ENV_COLUMNS = ("torch", "device_name", "cpu_model", "threads", "git_commit")


def to_frame(records: Iterable[dict[str, Any]]):
    """Tidy DataFrame: one row per cell, the COLUMNS plus env_* columns."""
    import pandas as pd

    rows = []
    for rec in records:
        row = {k: v for k, v in rec.items() if k != "env"}
        env = rec.get("env") or {}
        for key in ENV_COLUMNS:
            row[f"env_{key}"] = env.get(key)
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=[c for c in COLUMNS if c != "env"]
                            + [f"env_{k}" for k in ENV_COLUMNS])
    # The last record of an id wins (a cell measured twice keeps the newer one).
    return pd.DataFrame(rows).drop_duplicates(subset="id", keep="last").reset_index(drop=True)


def load(run_dir: Path | str):
    """The run's records as a tidy pandas DataFrame."""
    return to_frame(read_records(run_dir))
