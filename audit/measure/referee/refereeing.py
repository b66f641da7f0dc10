"""The referee's checks as steps of one cell's measurement (measure/cell/measurement.py calls them in
its phases): each reads what the cell has measured, calls the variant where it must, and judges
one check of core.referee.REFEREE_CHECKS into cell.verdicts. The mechanisms (tensors compared,
the vault, the clocks, the lower bound on time) are this package's other modules; what each check means
and why: docs/generated-kernels.md.
"""
from __future__ import annotations

import math
import threading
from typing import Any

from ...core.dtypes import dtype_spec
from ..cell.repeats import bitwise_equal
from . import physical, tensors, timers
from ..cell.cellcache import Reference
from ..checks.contract import out_of


def is_tensor(value: Any) -> bool:
    import torch
    return isinstance(value, torch.Tensor)


def error_budget(ref: Reference, dtype: str) -> float:
    """The output's error budget in this cell (numerics.budget_bound), or the dtype's atol where
    the baseline's error is not finite."""
    from ..golden.numerics import budget_bound
    base = ref.baseline_rmse
    return budget_bound(base if base is not None and math.isfinite(base) else 0.0, dtype)


def inputs_untouched(cell: Any, after: str) -> None:
    """The referee's inputs_untouched check after a pass: the call's tensors against the pristine
    ones, bitwise; what changed is named, then restored."""
    current = cell.call_tensors()
    changed = tensors.changed_inputs(current, cell.pristine)
    cell.verdicts.judge("inputs_untouched", not changed,
                        f"{', '.join(changed)} changed by the {after} (a call wrote into its inputs)")
    if changed:
        tensors.restore(current, cell.pristine, changed)


def plain_result(cell: Any, out: Any, call: str, previous: list) -> None:
    """The referee's plain_result check of one call's out (and lse)."""
    inputs = cell.call_tensors()
    problems = tensors.plain_problems(out, inputs, previous, f"the {call}'s out")
    if cell.last_lse is not None:
        problems += tensors.plain_problems(cell.last_lse, inputs, previous, f"the {call}'s lse")
    cell.verdicts.judge("plain_result", not problems, "; ".join(problems))


def complete_at_return(cell: Any) -> None:
    """The referee's complete_at_return check: the warm-up forward's out as read at return (copied
    first thing) against the same tensor read again once work left running has had time to finish
    (settle). The determinism check gets the later read: an incomplete read is not
    nondeterminism; and a variant found incomplete is let settle after every later call the
    checks read at once (an async kernel's late reads of its inputs must not fail other checks)."""
    at_return, later = cell.at_return, cell.first_result
    cell.at_return = None
    if at_return is None or later is None:
        return
    if cell.new_threads:                   # threads the calls left running (the warm-up's and the numerics'):
        timers.join_threads(cell.new_threads)      # their time since the warm-up returned
        cell.settle_s = min(timers.SETTLE_MAX_S, max(timers.SETTLE_MIN_S, 2 * (timers.clock() - cell.returned_at)))
    cell.new_threads = []
    cell.threads_seen = set(threading.enumerate())
    timers.settle(cell.sync, cell.warm_fwd)
    later = later.detach()
    if not bitwise_equal(at_return, later):
        from ..cell.repeats import largest_difference
        cell.verdicts.judge("complete_at_return", False,
                            f"the warm-up forward's out changed after it returned (largest change "
                            f"{largest_difference(at_return, later):.3g}): work still running when the call returned")
        cell.incomplete = True
    else:
        cell.verdicts.judge("complete_at_return", True)
    with cell.phases("determinism"):
        cell.repeats.add("out", later)


def settle_if_incomplete(cell: Any) -> None:
    """After a call whose result is read at once: let work it left running finish, for a variant
    complete_at_return already failed (once is enough for the finding)."""
    if cell.incomplete:
        wait_for_work(cell)


def wait_for_work(cell: Any) -> None:
    """The Python threads started since the last wait, each joined until it ends (timers.THREAD_JOIN_MAX_S:
    a loaded machine must not make a half-written output read as another defect), then the timed wait its
    work took before (up to SETTLE_MAX_S; device work too)."""
    started = [t for t in threading.enumerate() if t not in cell.threads_seen and t.is_alive()]
    if started:
        timers.join_threads(started)
    cell.threads_seen = set(threading.enumerate())
    timers.settle(cell.sync, max(cell.warm_fwd, cell.settle_s), timers.SETTLE_MAX_S)


def out_of_reach(cell: Any) -> None:
    """The referee's out_of_reach check: does the numerics forward's out follow the decoy?"""
    ok, seen = cell.vault.clear_of_decoy(cell.ref.take(cell.out), cell.golden.out, cell.golden.row_visible)
    cell.verdicts.judge("out_of_reach", ok, seen)


def values_follow(cell: Any) -> None:
    """The referee's values_follow check, before the timed calls: two more calls, (A) new values
    written into the cell's own tensor objects (v's last feature shifted at most keys:
    tensors.shifted_values), (B) the old values in new tensor objects. A must move the output as
    the float64 golden moves (a cache keyed on the objects, the shape or a few elements returns
    the old output); B must give the numerics call's output (bitwise where the forward was, else
    within its error budget). The objects get their old values back after A."""
    import torch

    from ..golden.numerics import error_vs_reference, within_budget
    verdicts, ref = cell.verdicts, cell.ref
    fresh = tensors.own_copy                    # new tensor objects, requires_grad as the cell's

    def call(q: Any, k: Any, v: Any) -> Any:
        kwargs = {name: fresh(t) if is_tensor(t) else t for name, t in cell.kwargs.items()}
        result = out_of(cell, cell.fn(q, k, v, **kwargs)).detach()
        settle_if_incomplete(cell)
        return result

    with cell.phases("referee"):
        v2 = tensors.shifted_values(cell.v)                                            # (B, Hkv, Tk, d_v)
        try:
            with torch.no_grad():
                cell.v.detach().copy_(v2)
            in_place = call(cell.q, cell.k, cell.v)                                     # (A): same objects
        finally:
            with torch.no_grad():
                cell.v.detach().copy_(cell.pristine["v"])
        old_values = call(fresh(cell.q), fresh(cell.k), fresh(cell.v))                  # (B): new objects
        moved = ref.values_moved.out      # the golden of v2, once per input set (cellcache.build_reference)
        golden_move = moved - cell.golden.out
        rows = cell.golden.row_visible
        ok, share = tensors.follows_move(ref.take(in_place), ref.take(cell.out), golden_move, rows)
        if not ok and cell.columns.get("within_budget") is not True:
            ok = None       # a wrong (or not judged: NaN) output need not move as the golden does: its findings say so
        verdicts.judge("values_follow", ok,
                       f"with new values written into the same tensors the output moved {share:.3g} of the "
                       f"golden's move away from it (at most {tensors.VALUES_FOLLOW:g}): it answered from what "
                       "it saw before")
        deterministic = "out" not in (cell.repeats.differing() or ())
        if deterministic:
            ok = bitwise_equal(old_values, cell.out)
            seen = "the old values in new tensors gave another output than the same values did (bitwise)"
        else:
            err = error_vs_reference(ref.take(old_values), cell.golden.out, rows)["rmse"]
            ok = bool(within_budget(err, ref.baseline_rmse, cell.case.dtype))
            seen = f"the old values in new tensors gave an output outside the error budget (RMSE {err:.3g})"
        verdicts.judge("values_follow", ok, seen)
        inputs_untouched(cell, "calls with new values")


def every_call(cell: Any, last_out: Any, last_grads: tuple | None) -> None:
    """The referee's every_call check: the last timed call's out and gradients against the numerics
    call's. Bitwise equal passes; otherwise the last call is judged by the same budgets (golden): it
    fails where the numerics call was within them and it is not (a kernel right only on its first
    calls, or while the warm-up runs). A cell whose numerics call was already outside is the
    numerics findings'."""
    from ..checks.gradients import grad_rmse
    from ..golden.numerics import GRAD_BUDGET_FACTOR, error_vs_reference, within_budget
    if last_out is None:
        return
    ref, m, dtype = cell.ref, cell.columns, cell.case.dtype
    if not bitwise_equal(last_out.detach(), cell.out):
        wait_for_work(cell)                                                               # work it left running
    if bitwise_equal(last_out.detach(), cell.out):
        cell.verdicts.judge("every_call", True)
    else:
        err = error_vs_reference(ref.take(last_out.detach()), cell.golden.out, cell.golden.row_visible)["rmse"]
        ok = within_budget(err, ref.baseline_rmse, dtype) is not False or m.get("within_budget") is False
        cell.verdicts.judge("every_call", ok, f"the last timed forward's out is outside the error budget "
                            f"(RMSE {err:.3g}; the numerics call's {float(m.get('rmse') or math.nan):.3g}): that "
                            "call did not do the work")
    first = [cell.repeats.first(g) for g in ("dq", "dk", "dv")]
    if last_grads is None or any(f is None for f in first):
        return
    if all(bitwise_equal(g.detach(), f) for g, f in zip(last_grads[:3], first)):
        cell.verdicts.judge("every_call", True)
        return
    base = ref.baseline_grad_rmse or {}
    outside = []
    for g, rmse in grad_rmse(tuple(t.detach() for t in last_grads[:3]), ref).items():
        if within_budget(rmse, base.get(g), dtype, GRAD_BUDGET_FACTOR[g]) is False \
                and m.get(f"{g}_within_budget") is not False:
            outside.append(f"{g} RMSE {rmse:.3g}")
    cell.verdicts.judge("every_call", not outside, f"the last timed forward+backward's gradients are outside "
                        f"their budgets ({', '.join(outside)}) where the numerics call's were within: that call "
                        "did not do the work")


def stream_gap(cell: Any) -> None:
    """CUDA: the timed calls' time with a device-wide fence against their stream's events (and the
    host's issue time): a gap is work on another stream, which the events did not time."""
    for label, samples, key in (("forward", cell.fwd, "fwd"), ("forward+backward", cell.fb, "fwd_bwd")):
        fenced = (cell.fenced or {}).get(key)
        if samples is None or fenced is None:
            continue
        cell.columns[f"{key}_fenced_ms"] = fenced * 1e3
        gap = timers.other_stream_gap(fenced, samples.median_s, samples.host_median_s)
        cell.verdicts.judge("complete_at_return", not gap,
                            f"the timed {label} calls took {fenced * 1e3:.4g} ms each with a device-wide fence but "
                            f"{samples.median_s * 1e3:.4g} ms by their stream's events: work left on another "
                            "stream (the cell is judged on the device-wide time)")


def physically_possible(cell: Any, ceilings: dict | None) -> None:
    """The referee's physically_possible check: each timed pass (on CUDA its device-wide time where
    larger) against the least time this machine's measured ceilings allow."""
    from ..machine.roofline import attention_bytes, compute_ceiling
    if not ceilings:
        return
    case, inputs = cell.case, cell.inputs
    tq, tk, d_v = cell.q.shape[-2], cell.k.shape[-2], cell.v.shape[-1]
    pairs = physical.visible_pairs(inputs, cell.ref.alignment)
    flops = 2.0 * pairs * (cell.q.shape[-1] + d_v)                     # QK^T and PV over the visible pairs
    mask = inputs.mask
    mask_bytes = 0 if mask is None else mask.numel() * mask.element_size()
    peak_flops, peak_bw = compute_ceiling(ceilings, case.dtype), ceilings.get("copy_bytes_per_s")
    spreads = ceilings.get("spread") or {}
    for label, samples, key, factor, backward in (("forward", cell.fwd, "fwd", 1.0, False),
                                                   ("forward+backward", cell.fb, "fwd_bwd",
                                                    1.0 + physical.BACKWARD_MIN_MATMULS, True)):
        if samples is None:
            continue
        seconds = max(samples.median_s, (cell.fenced or {}).get(key) or 0.0)
        nbytes = attention_bytes(case.batch, case.heads, tq, tk, cell.q.shape[-1], case.dtype, mask_bytes=mask_bytes,
                                 backward=backward, kv_heads=cell.k.shape[1], d_v=d_v)
        spread = max(spreads.get(case.dtype) or 1.0, spreads.get("copy") or 1.0)
        ok, seen = physical.physical_verdict(f"the {label}", seconds, flops * factor, nbytes, peak_flops, peak_bw,
                                             spread, recheck=lambda: ceilings_now(case.device, case.dtype, ceilings))
        cell.verdicts.judge("physically_possible", ok, seen)


def ceilings_now(device: str, dtype: str, ceilings: dict) -> tuple[float, float | None]:
    """(matmul FLOP/s of the dtype or of its upcast dtype (core/dtypes.py), whichever is better, copy
    bytes/s) measured again now, each the best this process has seen (physical.rechecked_rate); the copy
    is not re-measured (the run's stands: bytes bind only past the caches)."""
    from ..machine.roofline import matmul_rate_now
    rates = ceilings.get("matmul_flops_per_s") or {}
    flops = max(physical.rechecked_rate(device, dt, lambda dt=dt: matmul_rate_now(device, dt, rates.get(dt)))
                for dt in dict.fromkeys((dtype, dtype_spec(dtype).upcast)))
    return flops, ceilings.get("copy_bytes_per_s")


def timers_untouched(cell: Any) -> None:
    """The referee's timers_untouched check at the cell's end: a patched clock or timing function
    invalidates the cell's times (a finding) and is put back for the next cell."""
    changed = timers.timers_changed()
    cell.verdicts.judge("timers_untouched", not changed,
                        f"{', '.join(changed)} replaced while the variant was imported or called: this cell's "
                        "times are not the audit's (restored for the next cell)")
    if changed:
        timers.restore_timers()


def put_timers_back() -> None:
    """Restore any patched timing object without judging: a cell that raised before its end (a
    platform refusal, an error) must not leave its patch to time, and be blamed in, the next cell."""
    if timers.timers_changed():
        timers.restore_timers()
