"""Reproduction-script verifier of the referee's findings: the variant called again on the audit's
inputs the way the referee calls it, each check the record says failed judged by the referee's own
mechanisms (measure/referee/). Copied into standalone scripts like audit.repro.checks: audit names
imported at module level only, torch inside functions, no lambdas.

A verifier is `verify(case, inputs, load_variant, recorded) -> (defect, lines, measured)`.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..core.dtypes import dtype_spec
from ..core.referee import REFEREE_CHECKS
from ..measure.cell.cellcache import build_reference
from ..measure.golden.numerics import budget_bound, error_vs_reference, within_budget
from ..measure.cell.repeats import bitwise_equal
from ..measure.referee.physical import PHYSICAL_MARGIN, lower_bound_s, visible_pairs
from ..measure.referee.tensors import follows_move, plain_problems, shifted_values
from ..measure.referee.timers import SETTLE_MIN_S
from ..measure.referee.vault import DECOY_SHARE, Vault
from ..measure.machine.roofline import matmul_rate_now

TIMED_CALLS = 30                 # every_call: calls in a row on the same tensors, as a timed loop makes
CLOCKS = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time")


def _copies(inputs: Any, grad: bool) -> tuple[Any, Any, Any, dict]:
    """The cell's q, k, v (requiring grad when `grad`) and keyword arguments, as copies of the inputs."""
    import torch
    q, k, v = (t.detach().clone().requires_grad_(grad) for t in (inputs.q, inputs.k, inputs.v))
    kwargs = {n: t.detach().clone() if isinstance(t, torch.Tensor) else t for n, t in inputs.call_kwargs().items()}
    return q, k, v, kwargs


def _out(result: Any) -> Any:
    return result[0] if isinstance(result, (tuple, list)) else result


def _inputs_untouched(attention: Callable, case: Any, inputs: Any, ref: Any) -> tuple[bool, str]:
    import torch
    q, k, v, kwargs = _copies(inputs, True)
    grad_out = inputs.grad_out.detach().clone()
    out = _out(attention(q, k, v, **kwargs))
    if out.requires_grad:
        out.backward(grad_out)
    current = {"q": q, "k": k, "v": v, "grad_out": grad_out, **{n: t for n, t in kwargs.items()
                                                                 if isinstance(t, torch.Tensor)}}
    pristine = {"q": inputs.q, "k": inputs.k, "v": inputs.v, "grad_out": inputs.grad_out, **inputs.call_kwargs()}
    changed = [n for n, t in current.items() if not bitwise_equal(t.detach(), pristine[n])]
    return not changed, f"changed by a forward and a backward: {', '.join(changed) or 'nothing'}"


def _values_follow(attention: Callable, case: Any, inputs: Any, ref: Any) -> tuple[bool, str]:
    import torch
    q, k, v, kwargs = _copies(inputs, True)
    before = _out(attention(q, k, v, **kwargs)).detach()
    with torch.no_grad():
        v.detach().copy_(shifted_values(v))
    moved = _out(attention(q, k, v, **kwargs)).detach()
    golden_move = ref.values_moved.out - ref.golden.out
    ok, share = follows_move(ref.take(moved), ref.take(before), golden_move, ref.golden.row_visible)
    return ok, (f"new values written into the same tensors moved the output {share:.3g} of the float64 golden's "
                "move away from it (at most 0.25)")


def _complete_at_return(attention: Callable, case: Any, inputs: Any, ref: Any) -> tuple[bool, str]:
    import torch
    q, k, v, kwargs = _copies(inputs, False)
    threads = set(threading.enumerate())
    out = _out(attention(q, k, v, **kwargs))
    at_return = out.detach().clone()
    for t in [t for t in threading.enumerate() if t not in threads]:
        t.join(timeout=1.0)
    if case.device.startswith("cuda"):
        torch.cuda.synchronize()
    time.sleep(max(SETTLE_MIN_S, 0.05))
    same = bitwise_equal(at_return, out.detach())
    return same, f"the output read at return {'equals' if same else 'differs from'} the same output read later"


def _plain_result(attention: Callable, case: Any, inputs: Any, ref: Any) -> tuple[bool, str]:
    q, k, v, kwargs = _copies(inputs, True)
    first = _out(attention(q, k, v, **kwargs))
    second = _out(attention(q, k, v, **kwargs))
    named = [("q", q), ("k", k), ("v", v)]
    problems = plain_problems(first, named, [], "the first call's out") + \
        plain_problems(second, named, [first], "the second call's out")
    return not problems, "; ".join(problems) or "two calls returned plain tensors of their own"


def _out_of_reach(attention: Callable, case: Any, inputs: Any, ref: Any) -> tuple[bool | None, str]:
    q, k, v, kwargs = _copies(inputs, True)
    budget = budget_bound(ref.baseline_rmse or 0.0, case.dtype)
    vault = Vault([ref.golden, ref.values_moved], (*q.shape[:-1], v.shape[-1]), ref.slices, budget)
    vault.plant(ref.golden.out)
    vault.seal()
    try:
        out = _out(attention(q, k, v, **kwargs)).detach()
    finally:
        vault.unseal()
    ok, seen = vault.clear_of_decoy(ref.take(out), ref.golden.out, ref.golden.row_visible)
    return ok, f"{seen} (the decoy: the golden + {DECOY_SHARE:g} x the error budget x a random sign)"


def _every_call(attention: Callable, case: Any, inputs: Any, ref: Any) -> tuple[bool, str]:
    q, k, v, kwargs = _copies(inputs, True)
    outs = [_out(attention(q, k, v, **kwargs)).detach() for _ in range(TIMED_CALLS)]
    if bitwise_equal(outs[-1], outs[0]):
        return True, f"the last of {TIMED_CALLS} calls equals the first bit for bit"
    errs = [error_vs_reference(ref.take(o), ref.golden.out, ref.golden.row_visible)["rmse"]
            for o in (outs[0], outs[-1])]
    first_ok, last_ok = (within_budget(e, ref.baseline_rmse, case.dtype) for e in errs)
    ok = not (first_ok and last_ok is False)
    return ok, (f"RMSE against the float64 golden: first call {errs[0]:.3g}, call {TIMED_CALLS} {errs[-1]:.3g} "
                f"({'within' if last_ok else 'outside'} the error budget)")


def _timers_untouched(attention: Callable, case: Any, inputs: Any, ref: Any) -> tuple[bool, str]:
    before = {name: getattr(time, name) for name in CLOCKS}
    q, k, v, kwargs = _copies(inputs, True)
    for _ in range(3):
        attention(q, k, v, **kwargs)
    changed = [name for name in CLOCKS if getattr(time, name) is not before[name]]
    for name in changed:
        setattr(time, name, before[name])
    return not changed, f"time.{', time.'.join(changed)} replaced by the calls" if changed else "no clock replaced"


def _physically_possible(attention: Callable, case: Any, inputs: Any, ref: Any) -> tuple[bool, str]:
    import torch
    q, k, v, kwargs = _copies(inputs, True)
    sync = torch.cuda.synchronize if case.device.startswith("cuda") else None
    for _ in range(3):
        attention(q, k, v, **kwargs)                                   # warm
    clock = time.perf_counter
    best = float("inf")
    for _ in range(5):
        start = clock()
        for _ in range(10):
            attention(q, k, v, **kwargs)
        if sync:
            sync()
        best = min(best, (clock() - start) / 10)
    flops = 2.0 * visible_pairs(inputs, ref.alignment) * (q.shape[-1] + v.shape[-1])
    rate = max(matmul_rate_now(case.device, dt, None) for dt in (case.dtype, dtype_spec(case.dtype).upcast))
    bound, how = lower_bound_s(flops, 0.0, rate, None)
    ok = best * PHYSICAL_MARGIN >= bound
    return ok, (f"a forward took {best * 1e3:.4g} ms (best of 5 blocks of 10); this machine needs at least "
                f"{bound * 1e3:.4g} ms ({how}, a matmul measured now; margin {PHYSICAL_MARGIN:g}x)")


REFEREE_VERIFIERS: dict[str, Callable[..., tuple]] = {
    "inputs_untouched": _inputs_untouched, "values_follow": _values_follow,
    "complete_at_return": _complete_at_return, "plain_result": _plain_result, "out_of_reach": _out_of_reach,
    "every_call": _every_call, "timers_untouched": _timers_untouched, "physically_possible": _physically_possible,
}


def verify_referee(case: Any, inputs: Any, load_variant: Callable, recorded: dict) -> tuple:
    """Each referee check the audit recorded as failed in this cell, run again: the finding holds when
    one of them fails again."""
    attention, _ = load_variant()
    ref = build_reference(case, inputs, recorded.get("golden_alignment") or "top-left")
    failed = [name for name in REFEREE_CHECKS if recorded.get(f"referee_{name}") is False]
    lines, measured, again = [], {}, []
    for name in failed:
        ok, seen = REFEREE_VERIFIERS[name](attention, case, inputs, ref)
        measured[f"referee_{name}"] = ok
        lines.append(f"{name}: {'passed' if ok else 'FAILED' if ok is False else 'not judged'}: {seen}")
        if ok is False:
            again.append(name)
    if not failed:
        lines.append("the record names no failed referee check")
    return bool(again), lines, measured


REFEREE_CHECK_VERIFIERS: dict[str, Callable[..., tuple]] = {"referee": verify_referee}
