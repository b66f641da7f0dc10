"""What the cost model's fits share: non-negative least squares, a record's Case, the host a run was
made on, a golden read's seconds. Pure Python + numpy: nothing here imports torch."""
from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ..core.grid import Case


def nnls(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Non-negative least squares by trying every support (few features): weighted rows.

    The columns are solved at unit scale (each divided by its weighted norm) and the
    coefficients scaled back: the features span many orders of magnitude (1 beside float64
    FLOPs of 1e12), and unscaled, the SVD's cut-off and rounding move a fitted constant by
    ~1e-6 from one BLAS build or CPU to the next; scaled, by ~1e-15 (tests/test_costmodel.py)."""
    weighted = X * w[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0
    unit = weighted / scale
    best, best_err = np.zeros(X.shape[1]), math.inf
    for support in itertools.product((0, 1), repeat=X.shape[1]):
        idx = [i for i, on in enumerate(support) if on]
        if not idx:
            continue
        coef, *_ = np.linalg.lstsq(unit[:, idx], y * w, rcond=None)
        coef = coef / scale[idx]
        if (coef < 0).any():
            continue
        full = np.zeros(X.shape[1])
        full[idx] = coef
        err = float(np.sum(((X @ full - y) * w) ** 2))
        if err < best_err - 1e-15:
            best, best_err = full, err
    return best


class Row:
    """One row of a frame, read by column name (row["variant"], row.get("phase_s")) from the frame's
    columns as Python lists: what the fits read row by row. A row of DataFrame.iterrows is a new
    Series whose every read goes through pandas' indexing, and to_dict("records") boxes every value of
    ~250 columns: fitting the stored records spent 5 s in either, here a list index."""

    __slots__ = ("_columns", "_i")

    def __init__(self, columns: dict[str, list], i: int) -> None:
        self._columns, self._i = columns, i

    def __getitem__(self, name: str) -> Any:
        return self._columns[name][self._i]

    def get(self, name: str, default: Any = None) -> Any:
        column = self._columns.get(name)
        return default if column is None else column[self._i]


def rows(frame: Any) -> list[Row]:
    """A frame's rows, in order (Row)."""
    columns = {name: frame[name].tolist() for name in frame.columns}
    return [Row(columns, i) for i in range(len(frame))]


def labelled_rows(frame: Any) -> list[tuple[Any, Row]]:
    """(index label, Row) of each row, in order."""
    return list(zip(frame.index, rows(frame)))


def case_of(row: Any) -> Case:
    kv = row.get("kv_heads")
    dv = row.get("d_v")
    return Case(variant=row["variant"], device=row["device"], dtype=row["dtype"], d_k=int(row["d_k"]),
                d_v=int(dv) if isinstance(dv, (int, float)) and dv == dv else None,
                seq_len=int(row["seq_len"]), batch=int(row["batch"]), heads=int(row["heads"]),
                causal=bool(row["causal"]), scenario=row.get("scenario") or "normal",
                kv_heads=int(kv) if isinstance(kv, (int, float)) and kv == kv else None)


def run_host(run: Any) -> float:
    """The host factor a run was made at (plan.overhead.host_factor of its ceilings; 1 without a
    probe): its host-bound seconds divided by it are the reference host's (priors.HOST_BOUND)."""
    from .overhead import host_factor
    return host_factor(run.ceilings)


def golden_read_s(shape: Any, slices: float) -> float:
    """Predicted seconds to read a cell's reference back from the golden store (its size over the
    store's read rate), before the fitted golden_read_s."""
    from ..measure.golden.golden_store import read_s, reference_bytes
    case = shape.case
    return read_s(reference_bytes(slices, shape.q_len, case.seq_len, case.d_k, case.effective_d_v))


def mean_of_most(values: list[float]) -> float:
    """The mean without the top 1%: what compiles cost in all (a median under-counts their long tail:
    the cpu preset's misses, median 1.59 s, mean 1.77 s), without the one that also started the compiler."""
    arr = np.sort(np.asarray(values, dtype=float))
    return float(arr[:max(1, int(np.ceil(len(arr) * 0.99)))].mean())
