"""Every argument a variant is handed is checked to do something (workload/arguments.py's probes).

For each argument probed in a cell, the variant is called again with that one argument changed,
and its output's change D = B - A (the probe's output less the cell's) is compared with the float64
golden's change D' = B' - A', on the golden's diagnosis slices (diagnosis.diagnosis_slices) and the
rows that see a key under both settings:

- `uninformative`: the golden hardly moves (RMSE(D') <= INFORMATIVE × the cell's tolerance): no
  output could show the argument is read (a probe on a cell where it changes nothing);
- `honoured`: RMSE(D - D') <= 2 × the tolerance: A and B each within the cell's error budget of
  their golden, so the output follows the argument;
- `ignored`: RMSE(D) <= 2 × the tolerance: the output did not move where the golden did;
- `misapplied`: it moved, but not as the golden (a scale applied twice, a cap read as its inverse);
- `unjudged`: it moved, but the cell's own output is outside its error budget, so how it should
  move is not known (a kernel ignoring causal, probed on the scale); `ignored` is still told;
- `refused`: the variant declines the changed value (Unsupported: a plug-in declaring no scale
  argument is handed a non-default scale), or has no such keyword at all (a TypeError naming it: the
  cells hand `scale` only where it is not the default, so a plug-in may leave it out); not a defect;
- `failed`: the probe's call raised anything else (its reason in the record's `reason`).

A probe of a change the output must not follow (Argument.invariant: a paged cache's pages moved in
the pool, the block table saying where) is `honoured` when RMSE(D) <= 2 × the tolerance, `ignored`
(the argument is not what the kernel reads by) when the output moves or a finite row turns NaN, and
`unjudged` where no row is finite under both calls.

A probe of what a kernel must refuse (Argument.refuse: k and v with a head count that does not
divide the query heads) is `honoured` when the call raises (anything: the kernel refused, its first
line in the evidence) and `accepted`, a defect, when it returns an output.

A compiled variant's probes each build code of their own (a new scale is a recompile, a new cap
another: 0.5-3 s each on 2 cores): its first cell of each argument in a run probes it, and its later
cells take that status, with `shared_from` naming the cell in their
evidence (the run's cellcache.BuildCache.probe_memo). The causal flag is not probed on compiled
built-ins (workload/arguments.py: Argument.compiled).

The tolerance is the cell's own budget (diagnosis.tolerance: 2 × the same-dtype baseline's RMSE +
atol). A variant returning its log-sum-exp gets the lse checked on the scale probe too (argument
"lse"): the returned lse must move by the golden's, within the lse's own budget (2 × the baseline
lse's RMSE + atol) at each setting.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from ...core.errors import Unsupported
from ...workload.arguments import ARGUMENTS, probed_arguments
from ..diagnosis.diagnosis import _golden_for, attempt_for, diagnosis_slices, tolerance
from ..golden.numerics import budget_bound

INFORMATIVE = 4.0          # the golden must move by more than this many tolerances for a probe to tell


def present_arguments(case: Any, compiled: bool, kwargs: dict) -> list[str]:
    """The arguments probed in this cell: those its Case allows (probed_arguments) that its call
    hands the variant (a varlen variant gets cu_seqlens, not the document mask)."""
    return [name for name in probed_arguments(case, compiled) if ARGUMENTS[name].present(kwargs)]


def _rmse(x: Any, rows: Any) -> float:
    """RMSE of x (b, h, Tq, d) over the selected rows (b, h, Tq)."""
    sel = x[rows]
    return math.sqrt(float((sel * sel).mean())) if sel.numel() else math.nan


def judge(moved: float, golden_moved: float, err: float, tol: float, right_before: bool = True) -> str:
    """The status of one probe from RMSE(D), RMSE(D'), RMSE(D - D') and the cell's tolerance;
    right_before: the cell's own output is within its budget (else a move is `unjudged`)."""
    if not math.isfinite(golden_moved) or golden_moved <= INFORMATIVE * tol:
        return "uninformative"
    if moved <= 2 * tol:
        return "ignored"
    if not right_before:
        return "unjudged"
    return "honoured" if err <= 2 * tol else "misapplied"


def argument_columns(cell: Any, call: Callable[[dict], Any], failure_reason: Callable[[BaseException], str],
                     lse_baseline: float | None = None) -> dict:
    """The `arguments` columns of one cell (module docstring). call(kwargs) -> the variant's result
    on the cell's q, k, v with these keyword arguments ((out, lse) for a variant returning its lse);
    lse_baseline: the same-dtype baseline's lse RMSE (the lse's budget), for a variant returning one."""
    import torch
    names = present_arguments(cell.case, cell.variant.compiled, cell.kwargs)
    if not names:
        return {"arguments": None, "argument_evidence": None}
    out, inputs, ref, dtype = cell.out, cell.inputs, cell.ref, cell.case.dtype
    B, H, Tq, d = out.shape
    batches, heads = diagnosis_slices(B, H, inputs.k.shape[1], Tq, inputs.k.shape[-2], d, str(out.device), ref.slices)
    b_index, h_index = (torch.tensor(x, device=out.device) for x in (batches, heads))

    def sliced(t: Any) -> Any:                       # (B, H, Tq, …) -> the slices', float64
        return t.detach().index_select(0, b_index).index_select(1, h_index).double()

    with torch.no_grad():
        attempt = attempt_for(inputs, batches, heads, alignment=ref.alignment, dtype=dtype)
        golden_a = _golden_for(ref, batches, heads).double()                        # (b, h, Tq, d)
        seen_a = attempt.seen().expand(golden_a.shape[:-1])                          # (b, h, Tq)
        tol = tolerance(ref.baseline_rmse, dtype, golden_a, seen_a)
        mine_a = sliced(out)
    statuses, evidence, reasons = {}, {}, []
    memo = getattr(cell, "probe_memo", None)
    shared = memo.setdefault(cell.variant.name, {}) if cell.variant.compiled and memo is not None else {}
    for name in names:
        key = name
        if key in shared:
            for n, (status, found, first) in shared[key].items():
                statuses[n], evidence[n] = status, {**found, "shared_from": first}
            continue
        argument = ARGUMENTS[name]
        kwargs = argument.changed(cell.kwargs, inputs)
        if argument.refuse is not None:
            statuses[name], evidence[name] = _refused(call, kwargs, argument.refuse(cell.k, cell.v, H), H)
            continue
        try:
            result = call(kwargs)
        except Unsupported as exc:
            statuses[name] = "refused"
            evidence[name] = {"reason": str(exc)[:200]}
            continue
        except TypeError as exc:
            new = [key for key in kwargs if key not in cell.kwargs and f"keyword argument '{key}'" in str(exc)]
            if not new:                      # not an argument the cell's own calls never hand it: a failure
                statuses[name] = "failed"
                reasons.append(f"argument probe {name} failed: {failure_reason(exc)}")
                continue
            statuses[name] = "refused"       # a plug-in without the keyword (the cells never hand it a scale)
            evidence[name] = {"reason": f"it takes no `{new[0]}` argument ({str(exc)[:150]})"}
            continue
        except Exception as exc:  # noqa: BLE001 - a probe the variant fails on: the cell keeps its measurements
            statuses[name] = "failed"
            reasons.append(f"argument probe {name} failed: {failure_reason(exc)}")
            continue
        mine_b_full, lse_b = (result[0], result[1]) if isinstance(result, (tuple, list)) else (result, None)
        with torch.no_grad():
            golden_b = argument.golden(attempt, kwargs, inputs).double()              # (b, h, Tq, d): NaN where no key
            mine_b = sliced(mine_b_full)
            rows = (seen_a & torch.isfinite(golden_b).all(-1) & torch.isfinite(mine_a).all(-1)
                    & torch.isfinite(mine_b).all(-1))                                  # (b, h, Tq)
            golden_a0 = torch.nan_to_num(golden_a)
            moved, golden_moved = _rmse(mine_b - mine_a, rows), _rmse(golden_b - golden_a0, rows)
            err = _rmse((mine_b - mine_a) - (golden_b - golden_a0), rows)
        right_before = cell.columns.get("within_budget") is not False
        evidence[name] = {"moved": moved, "golden_moved": golden_moved, "err": err, "budget": 2 * tol}
        if argument.invariant:          # a row finite before and not after moved, whatever the other rows did
            appeared = bool((seen_a & torch.isfinite(mine_a).all(-1) & ~torch.isfinite(mine_b).all(-1)).any())
            statuses[name] = _stays(math.inf if appeared else moved, tol)
            evidence[name]["nan_appeared"] = appeared
        else:
            statuses[name] = judge(moved, golden_moved, err, tol, right_before)
        if name == "scale" and lse_b is not None and cell.lse is not None:
            statuses["lse"], evidence["lse"] = _lse_follows(attempt, cell.lse, lse_b, kwargs["scale"], sliced, seen_a,
                                                            dtype, lse_baseline)
        if cell.variant.compiled:
            shared[key] = {n: (statuses[n], evidence[n], cell.case.id) for n in ((name, "lse") if name == "scale"
                                                                                 else (name,)) if n in statuses}
    columns = {"arguments": statuses, "argument_evidence": evidence}
    if reasons:
        columns["reason"] = "; ".join(reasons)
    return columns


def _stays(moved: float, tol: float) -> str:
    """An invariant probe's status: honoured when the output stayed within twice the tolerance, ignored
    when it moved (inf: a row turned NaN or inf), unjudged where no row is finite under both calls (a
    kernel already reading NaN)."""
    if math.isnan(moved):
        return "unjudged"
    return "honoured" if moved <= 2 * tol else "ignored"


def _refused(call: Callable[..., Any], kwargs: dict, kv: tuple, heads: int) -> tuple[str, dict]:
    """A call the variant must refuse, on k and v `kv`: honoured when it raises, accepted when it returns."""
    shape = {"heads": heads, "kv_heads": int(kv[0].shape[1])}
    try:
        result = call(kwargs, kv)
    except Exception as exc:  # noqa: BLE001 - any refusal is a refusal: its first line is the evidence
        text = str(exc).strip().splitlines()
        return "honoured", {**shape, "raised": f"{type(exc).__name__}: {text[0] if text else ''}"[:200]}
    out = result[0] if isinstance(result, (tuple, list)) else result
    return "accepted", {**shape, "returned": list(out.shape)}


def _lse_follows(attempt: Any, lse_a: Any, lse_b: Any, scale: float, sliced: Callable, seen: Any,
                 dtype: str, baseline: float | None) -> tuple[str, dict]:
    """The returned lse under the scale probe: its change against the golden's (keys-only lse on the
    normal scenario's cells, where the scale is probed), judged with the lse's budget (numerics.budget_bound:
    the dtype's factor × the baseline's lse RMSE + atol); unjudged where the lse is outside it at the cell's scale."""
    import torch
    with torch.no_grad():
        def golden_lse(s: float) -> Any:
            kk = attempt.pair(attempt.k)                                                  # (b, h, Tk, d)
            scores = (attempt.q @ kk.transpose(-2, -1)) * s                              # (b, h, Tq, Tk)
            keep = attempt.keep()
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            return torch.logsumexp(scores, -1)                                           # (b, h, Tq)
        want_a, want_b = golden_lse(attempt.scale), golden_lse(scale)
        mine_a, mine_b = sliced(lse_a[..., None])[..., 0], sliced(lse_b[..., None])[..., 0]   # (b, h, Tq)
        rows = seen & torch.isfinite(mine_a) & torch.isfinite(mine_b)                      # (b, h, Tq)
        tol = budget_bound(baseline if baseline is not None and math.isfinite(baseline) else 0.0, dtype)
        own = _rmse((mine_a - want_a)[..., None], rows)
        moved = _rmse((mine_b - mine_a)[..., None], rows)
        golden_moved = _rmse((want_b - want_a)[..., None], rows)
        err = _rmse(((mine_b - mine_a) - (want_b - want_a))[..., None], rows)
    status = judge(moved, golden_moved, err, tol, right_before=own <= tol)
    return status, {"moved": moved, "golden_moved": golden_moved, "err": err, "budget": 2 * tol}
