"""The record schema (its columns and what each means: columns.py), the JSONL store and the DataFrame view.

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

from .columns import COLUMNS
from .runfolder import QUARANTINE_FILE, RECORDS_FILE

SCHEMA_VERSION = 17
STATUSES = ("ok", "skipped", "error", "oom", "timeout")


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
    """JSON has no NaN/inf: store them as the strings "NaN", "Infinity", "-Infinity"."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_V1_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # schema 1's spelling


def _restore(value: Any, table: dict[str, float] = _NONFINITE) -> Any:
    """Non-finite floats back from their string form, through nested dicts and lists."""
    if isinstance(value, str) and value in table:
        return table[value]
    if isinstance(value, dict):
        return {k: _restore(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v, table) for v in value]
    return value


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(_clean(record), default=_json_default, allow_nan=False, sort_keys=False)


class RecordWriter:
    """Appends one record per line and makes it durable before returning (durable=False: at
    the next durable write or close, for records a rerun would write the same, such as cells
    the budget skipped: an fsync each cost a planned cut as much as its bookkeeping).

    A run killed mid-write (kill -9) can leave a partial last line; opening the
    store truncates it, so a resumed run never writes after garbage.
    """

    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / RECORDS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _truncate_partial_line(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any], *, durable: bool = True) -> None:
        self._fh.write(dumps(record) + "\n")
        self._fh.flush()               # other processes (the supervisor, a merge) see it now
        if durable:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
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


def _v1_to_v2(record: dict[str, Any]) -> dict[str, Any]:
    """v2 added the numerics-audit columns; v1 cells had q_len == seq_len and golden saturation."""
    record = _restore(record, _V1_NONFINITE)
    out = {col: record.get(col) for col in COLUMNS}
    out.update({k: v for k, v in record.items() if k not in out})
    out["q_len"] = record.get("seq_len")
    if record.get("max_prob") is not None:
        out["saturation_source"] = "golden"
    out["schema"] = 2
    return out


def _with_columns(record: dict[str, Any], schema: int) -> dict[str, Any]:
    """The record with every current column (those it lacks null) and its other keys kept."""
    out = {col: record.get(col) for col in COLUMNS}
    out.update({k: v for k, v in record.items() if k not in out})
    out["schema"] = schema
    return out


def _at_schema(record: dict[str, Any], schema: int) -> dict[str, Any]:
    """A copy of the record marked with a later schema: a step that only added columns (null before)
    changes nothing else; migrate gives the record every current column once, after the last step
    (each step filling all ~200 columns made reading an old run's records 3x slower)."""
    out = dict(record)
    out["schema"] = schema
    return out


def _v2_to_v3(record: dict[str, Any]) -> dict[str, Any]:
    """v3 added golden_subset (v2 goldens covered every slice), host-side timing, compile reuse
    and the energy window's idle fraction and sampled power (absent before: null)."""
    return _at_schema(record, 3)


def _v3_to_v4(record: dict[str, Any]) -> dict[str, Any]:
    """v4 added kv_heads (GQA/MQA); every earlier cell was multi-head: kv_heads = heads."""
    out = _at_schema(record, 4)
    if out.get("kv_heads") is None:          # absent, or null from an earlier step's column list
        out["kv_heads"] = record.get("heads")
    return out


def _v4_to_v5(record: dict[str, Any]) -> dict[str, Any]:
    """v5 added compile_cache (whether a compile came from Inductor's cache: unknown before, null)."""
    return _at_schema(record, 5)


def _v5_to_v6(record: dict[str, Any]) -> dict[str, Any]:
    """v6 added golden_alignment; every earlier golden was top-left (where an alignment applied)."""
    out = _at_schema(record, 6)
    if out.get("causal_alignment") is not None:
        out["golden_alignment"] = "top-left"
    return out


def _v6_to_v7(record: dict[str, Any]) -> dict[str, Any]:
    """v7 added the diagnosis and determinism columns (not measured before: null)."""
    return _at_schema(record, 7)


def _v7_to_v8(record: dict[str, Any]) -> dict[str, Any]:
    """v8 added graph_breaks, sampled_power_source and energy_read_s (not recorded before: null)."""
    return _at_schema(record, 8)


def _v8_to_v9(record: dict[str, Any]) -> dict[str, Any]:
    """v9 added phase_s (where a cell's time went; not recorded before: null)."""
    return _at_schema(record, 9)


def _v9_to_v10(record: dict[str, Any]) -> dict[str, Any]:
    """v10 added the gradient budget (dq/dk/dv_err_ratio, dq/dk/dv_within_budget) and the backward
    diagnosis (grad_diagnosis*); not judged before: null."""
    return _at_schema(record, 10)


def _v10_to_v11(record: dict[str, Any]) -> dict[str, Any]:
    """v11 added the log-sum-exp checks (lse_*, merge_*, lse_differentiable, lse_diagnosis*,
    lse_grad_diagnosis*) and the
    sinks' gradient (dsinks_*); not measured before: null."""
    return _at_schema(record, 11)


def _v11_to_v12(record: dict[str, Any]) -> dict[str, Any]:
    """v12 added the referee (referee_<check>, referee_detail) and CUDA's device-wide fenced times
    (fwd_fenced_ms, fwd_bwd_fenced_ms); not checked before: null."""
    return _at_schema(record, 12)


def _v12_to_v13(record: dict[str, Any]) -> dict[str, Any]:
    """v13 added d_v (latent heads) and the packed, paged and invariance columns; every earlier cell had
    d_v = d_k, and the new columns read null."""
    out = _at_schema(record, 13)
    if out.get("d_v") is None:
        out["d_v"] = record.get("d_k")
    return out


def _v13_to_v14(record: dict[str, Any]) -> dict[str, Any]:
    """v14 added golden_source (whether a cell's float64 reference was built or read back from the
    golden store), and a failed cell's failure_file and failed_after; not recorded before: null."""
    return _at_schema(record, 14)


def _v14_to_v15(record: dict[str, Any]) -> dict[str, Any]:
    """v15 added the argument probes (arguments, argument_evidence); not probed before: null."""
    return _at_schema(record, 15)


def _v15_to_v16(record: dict[str, Any]) -> dict[str, Any]:
    """v16 added how well each median is known (fwd_ci_rel, fwd_bwd_ci_rel: computed here from the
    raw samples), the extra sampling (fwd_extra_s, fwd_bwd_extra_s) and noise_target (null: an older
    run had no target, so its cells are not judged unstable)."""
    from .noise import ci_rel
    out = _at_schema(record, 16)
    for prefix in ("fwd", "fwd_bwd"):
        samples = record.get(f"{prefix}_samples_s")
        if out.get(f"{prefix}_ci_rel") is None and isinstance(samples, list) and samples:
            out[f"{prefix}_ci_rel"] = ci_rel([float(x) for x in samples])
    return out


def _v16_to_v17(record: dict[str, Any]) -> dict[str, Any]:
    """v17 added the context-parallel check (shards_errs, shards_err_ratios, shards_err_ratio,
    shards_within_budget); not measured before: null."""
    return _at_schema(record, 17)


MIGRATIONS = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6, 6: _v6_to_v7, 7: _v7_to_v8,
              8: _v8_to_v9, 9: _v9_to_v10, 10: _v10_to_v11, 11: _v11_to_v12, 12: _v12_to_v13,
              13: _v13_to_v14, 14: _v14_to_v15, 15: _v15_to_v16, 16: _v16_to_v17}


class NewerSchema(ValueError):
    """Records written by a newer attn-audit: reading them would misread them."""


def migrate(record: dict[str, Any]) -> dict[str, Any]:
    """Bring a record of any known schema version to the current one, step by step."""
    version = record.get("schema")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise NewerSchema(f"record schema {version} is newer than this attn-audit's schema {SCHEMA_VERSION}: "
                          "update attn-audit to read it")
    while version != SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise ValueError(f"record schema {version!r} is not supported (this is schema {SCHEMA_VERSION})")
        record = MIGRATIONS[version](record)
        version = record["schema"]
        if version == SCHEMA_VERSION:
            record = _with_columns(record, version)
    return record


def parse_line(line: str) -> dict[str, Any]:
    """One JSONL line as a current record. Raises NewerSchema, or ValueError for a line that is
    not a record (not JSON, not an object, no cell id, an unknown status or schema)."""
    raw = json.loads(line)
    if not isinstance(raw, dict):
        raise ValueError(f"not a JSON object but {type(raw).__name__}")
    if '"NaN"' in line or 'Infinity"' in line or "\\u" in line:      # a non-finite value may be in it
        raw = _restore(raw)
    record = migrate(raw)
    if not isinstance(record.get("id"), str):
        raise ValueError("no cell id")
    if record.get("status") is not None and record["status"] not in STATUSES:
        raise ValueError(f"unknown status {record['status']!r}")
    return record


def iter_records(path: Path | str) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file; a partial last line (interrupted write) is ignored, and so is a
    damaged line (quarantine_damaged moves those aside). Raises NewerSchema."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # interrupted write
            line = line.strip()
            if line:
                try:
                    yield parse_line(line)
                except NewerSchema:
                    raise
                except ValueError:
                    continue


def quarantine_damaged(run_dir: Path | str) -> list[tuple[int, str]]:
    """Move every damaged line of DIR/records.jsonl (not JSON, not a record of a known schema)
    to DIR/records.quarantine.jsonl, each with its line number and why; the cell is then
    missing and a rerun measures it again. Returns [(line number, why)]. Raises NewerSchema
    (a newer attn-audit's records are not damaged: they must not be moved)."""
    path = Path(run_dir) / RECORDS_FILE
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    keep, moved = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            parse_line(line)
            keep.append(line)
        except NewerSchema:
            raise
        except ValueError as exc:
            moved.append((number, line, f"{type(exc).__name__}: {str(exc)[:200]}"))
    if not moved:
        return []
    last_partial = not lines[-1] == ""
    with open(Path(run_dir) / QUARANTINE_FILE, "a", encoding="utf-8") as fh:
        for number, line, why in moved:
            if last_partial and number == len(lines):
                continue                                   # an interrupted last write: just dropped
            fh.write(json.dumps({"line": number, "why": why, "text": line}) + "\n")
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
    os.replace(tmp, path)
    return [(number, why) for number, _, why in moved if not (last_partial and number == len(lines))]


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
    every = [c for c in COLUMNS if c != "env"] + [f"env_{k}" for k in ENV_COLUMNS]
    if not rows:
        return pd.DataFrame(columns=every)
    # The last record of an id wins (a cell measured twice keeps the newer one). Every column is
    # there (null where no record has it: a hand-edited file, a plug-in's extra keys aside), so a
    # rule, table or figure never meets a frame without one.
    frame = pd.DataFrame(rows).drop_duplicates(subset="id", keep="last").reset_index(drop=True)
    missing = [c for c in every if c not in frame.columns]
    if missing:
        frame = pd.concat([frame, pd.DataFrame({c: [None] * len(frame) for c in missing}, index=frame.index)], axis=1)
    return frame


def load(run_dir: Path | str):
    """The run's records as a tidy pandas DataFrame."""
    return to_frame(read_records(run_dir))
