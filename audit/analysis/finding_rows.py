"""What every finding rule is made of: the ok rows, the real variants' rows, a number column, the
cells' scenarios and dtypes in words, one finding per variant, and the finding dict itself."""
from __future__ import annotations

from typing import Callable, Iterable

import pandas as pd

from ..workload.variant_contract import BROKEN_PREFIX as NEGATIVE_CONTROL_PREFIX


def _finding(check: str, severity: str, variant: str, message: str, cells: Iterable[str]) -> dict:
    return {"check": check, "severity": severity, "variant": variant, "message": message,
            "cells": sorted(cells)}


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"]


def _real_code(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of real variants: a finding about several variants at once ("*") is about the
    user's code, so the negative controls (broken.*), built to fail, stay out of it."""
    return frame[~frame["variant"].astype(str).str.startswith(NEGATIVE_CONTROL_PREFIX)]


def _num(frame: pd.DataFrame, col: str) -> pd.Series:
    if col not in frame:
        return pd.Series(float("nan"), index=frame.index)
    return pd.to_numeric(frame[col], errors="coerce")


def _where(rows: pd.DataFrame) -> str:
    """'scenarios a, b; dtypes fp16' for the cells a finding covers."""
    parts = []
    for col, label in (("scenario", "scenarios"), ("dtype", "dtypes")):
        values = sorted(set(rows[col].astype(str)))
        parts.append(f"{label} {', '.join(values)}")
    return "; ".join(parts)


def _per_variant(rows: pd.DataFrame, make: Callable[[str, pd.DataFrame], dict | None]) -> list[dict]:
    out = []
    for variant, group in rows.groupby("variant", sort=True):
        found = make(str(variant), group)
        if found:
            out.append(found)
    return out


def _rows_where(frame: pd.DataFrame, test: Callable[[dict], bool]) -> pd.Series:
    """A bool per row: `test` (a core.defects rule) on the row as a record."""
    return pd.Series([bool(test(r)) for r in frame.to_dict("records")], index=frame.index, dtype=bool)
