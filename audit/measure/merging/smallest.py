"""The smallest failing case of a merge record: the first row of its state the merge gets wrong (its value, or
its gradient), cut to two features where that still fails, found where the merge audit runs and kept in the
record as plain numbers (`smallest`, `smallest_grad`). The report writes each finding's script from them
(repro/merge_scripts.py) without building a state, running a merge or importing torch: the report's process
imported torch only for this and for copying sdpa's factory, 2.3 s of a cold quick run's 11.6 s report on
2 cores, and torch.distributed 0.9 s more for torch's merge.

Why one row: a merge works row by row and feature by feature, so the first failing row of a state, cut to
its first two features, fails as the whole state did (the whole feature width is kept where the cut row
does not fail)."""
from __future__ import annotations

from typing import Any, Iterator

from ...workload.merge_functions import MergeFunction
from ...workload.merge_mistakes import GRAD_BAD
from .gradients import RIGHT, _grads, _upstream, merge_gradient
from .judge import measures, outcome_of, tolerances
from .states import PartialState

FEATURES = 2           # features kept of the failing row


def row_state(state: PartialState, b: int, h: int, t: int, features: int | None) -> PartialState:
    """The state cut to one row (b, h, t) and its first `features` features (None: all)."""
    cut = slice(None) if features is None else slice(0, features)
    parts = [(o[b:b + 1, h:h + 1, t:t + 1, cut], l[b:b + 1, h:h + 1, t:t + 1]) for o, l in state.parts]
    g_out, g_lse = state.golden
    return PartialState(state.name, state.dtype, parts, (g_out[b:b + 1, h:h + 1, t:t + 1, cut],
                                                         g_lse[b:b + 1, h:h + 1, t:t + 1]), state.what,
                        state.parts_from, state.parts_defects)


def candidate_rows(state: PartialState) -> Iterator[PartialState]:
    """The rows a smallest failing case is looked for in, in order: each row of `state` (batch, head,
    query), first cut to FEATURES features, then whole (a merge works row by row and feature by feature,
    so a failing row cut to two features fails too, unless the failure sits in the features cut off)."""
    b_, h_, t_ = state.golden[1].shape
    for b in range(b_):
        for h in range(h_):
            for t in range(t_):
                for features in (FEATURES, None):
                    yield row_state(state, b, h, t, features)


def numbers(t: Any) -> list[float]:
    """A tensor's values, flattened, as float64 Python floats (infinities and NaN kept: records.dumps)."""
    return [float(v) for v in t.detach().double().flatten().tolist()]


def _row(row: PartialState) -> dict[str, Any]:
    """What a script needs of a one-row state: its name and dtype, each part's (out, lse), the golden."""
    g_out, g_lse = row.golden
    return {"state": row.name, "dtype": row.dtype, "parts": [[numbers(o), numbers(l)] for o, l in row.parts],
            "golden": [numbers(g_out), numbers(g_lse)]}


def value_case(merge: MergeFunction, state: PartialState) -> dict[str, Any] | None:
    """The first row of `state` the merge gets wrong (with the state's tolerances), as plain numbers, with
    the tolerances its script judges by; None where no row fails."""
    out_tol, lse_tol = tolerances(state)
    for row in candidate_rows(state):
        got = merge.merge([(o.clone(), l.clone()) for o, l in row.parts])
        if outcome_of(measures(got, row), out_tol, lse_tol) != "right":
            return {**_row(row), "out_tol": out_tol, "lse_tol": lse_tol}
    return None


def gradient_case(merge: MergeFunction, state: PartialState) -> dict[str, Any] | None:
    """The first row of `state` whose gradient through the merge fails, as plain numbers: its parts, the
    upstream gradients (g_out, g_lse: gradients._upstream's), the right gradients of each leaf (float64
    autograd of the right merge), whether the row sees a key, and the row's gradient verdict; None where
    no row fails."""
    for row in candidate_rows(state):
        got = merge_gradient(merge, row)
        if got["grad_outcome"] in GRAD_BAD:
            g_out, g_lse = _upstream(row)
            return {**_row(row), "g_out": numbers(g_out), "g_lse": numbers(g_lse),
                    "expected": [numbers(g) for g in _grads(RIGHT, row.parts, row, widen=True)],
                    "sees": bool(row.golden[1].isfinite().all()), "grad_tol": got["grad_tol"],
                    "grad_outcome": got["grad_outcome"]}
    return None


def smallest_cases(merge: MergeFunction, state: PartialState, record: dict[str, Any]) -> dict[str, Any]:
    """A record's `smallest` (its value wrong) and `smallest_grad` (its gradient nan or wrong), each None
    where that is right, where no single row shows it, or for a negative control (its mistake is the audit's
    own: a finding says only when it is not caught, with no script; 94 of the quick preset's 102 failing
    records, half the merge audit's time)."""
    if merge.control:
        return {"smallest": None, "smallest_grad": None}
    try:
        value = value_case(merge, state) if record.get("outcome") not in ("right", "error", None) else None
        gradient = gradient_case(merge, state) if record.get("grad_outcome") in GRAD_BAD else None
    except Exception:        # a user's merge that raises on one row (it ran whole): no script, the record stands
        return {"smallest": None, "smallest_grad": None}
    return {"smallest": value, "smallest_grad": gradient}
