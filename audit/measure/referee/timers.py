"""The referee's clocks. The timing objects a cell's times come from, pinned before any variant is
built and compared at each cell's end (timers_untouched: a patched one is found and put back); the
referee's own clock and sleep, as they were at import (a patched one does not fool them); the waits
for work a call left running (complete_at_return); and work left on another stream, which the timed
stream's events do not see (machine/timing.py's fenced_time against them).
"""
from __future__ import annotations

import importlib
import time
import types
from typing import Any, Callable

from ..machine import cell_energy, cell_timing, timing

_PRISTINE_TIMERS_CLOCK = time.perf_counter
_PRISTINE_SLEEP = time.sleep


# CPU: how long the referee waits before reading an output again: one numerics call's time, at
# least SETTLE_MIN_S and at most SETTLE_WAIT_S (work still writing shows as a change within that: the
# cpu preset's slowest calls take 0.1 s, and waiting each out cost 4% of its run).
SETTLE_MIN_S = 0.002
SETTLE_WAIT_S = 0.02
SETTLE_MAX_S = 0.1       # the longest timed wait for work a call left running
# The longest wait for the Python threads a call started to end (a thread pool never ends: a first compile's
# costs it once a process). 0.1 s was too short on a loaded machine: a thread's 20 ms of work outlasted it,
# complete_at_return read the unwritten output twice and passed, and the later checks read it half-written
# (an ignored argument, a masked-row leak, values that do not follow: broken.background_thread in CI).
THREAD_JOIN_MAX_S = 0.5


def settle(sync: Callable[[], None] | None, call_s: float, limit_s: float = SETTLE_WAIT_S) -> None:
    """Let work a call left running finish: on CUDA `sync` is the device-wide synchronize (every
    stream, not the current one's: timing.sync_for); on the CPU (no sync) a wait of about one
    call's time, SETTLE_MIN_S to limit_s (pinned sleep: a patched time.sleep does not shorten it)."""
    if sync is not None:
        sync()
        return
    _PRISTINE_SLEEP(min(limit_s, max(SETTLE_MIN_S, call_s)))


def clock() -> float:
    """The referee's own clock: time.perf_counter as it was at import (a patched one does not fool it)."""
    return _PRISTINE_TIMERS_CLOCK()


def join_threads(threads: list, limit_s: float = THREAD_JOIN_MAX_S) -> float:
    """Wait (at most limit_s in all) for Python threads a call started and left running; the seconds
    waited. A thread pool that stays alive costs the limit once (its first call)."""
    start = _PRISTINE_TIMERS_CLOCK()
    for t in threads:
        t.join(timeout=max(0.0, limit_s - (_PRISTINE_TIMERS_CLOCK() - start)))
    return _PRISTINE_TIMERS_CLOCK() - start


# CUDA: the timed calls' per-call time with a device-wide fence over that of the stream's events:
# above this factor (and STREAM_GAP_MIN_S) the calls left work on another stream.
STREAM_GAP_FACTOR = 1.5
STREAM_GAP_MIN_S = 20e-6


def other_stream_gap(fenced_s: float, device_s: float, host_s: float | None) -> bool:
    """Whether the device-wide time exceeds the stream's own (and the host's issue time) by more than
    noise: work the timed stream's events did not see."""
    seen = max(device_s, host_s or 0.0)
    return fenced_s > STREAM_GAP_FACTOR * seen + STREAM_GAP_MIN_S


# The clocks and timing functions a cell's times come from, as (module, attribute path). The
# audit's own modules import theirs by name, so both the source and the copies are pinned. Each of
# these must resolve (TimerPinError otherwise): a name that no longer does, after a rename or a move,
# would leave the timers_untouched check blind to a patch of it. The audit's modules are named by the
# modules themselves, so a move takes their names along.
TIMER_OBJECTS: tuple[tuple[str, str], ...] = (
    *(("time", name) for name in ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time",
                                  "time_ns", "process_time", "sleep")),
    *((timing.__name__, name) for name in ("measure", "measure_device", "time_call", "sync_for", "cuda_graph_replay",
                                           "cache_flusher", "Samples", "CudaClock", "CudaClock.host_clock",
                                           "median", "iqr")),
    *((cell_timing.__name__, name) for name in ("measure", "measure_device", "time_call", "sync_for",
                                                "cuda_graph_replay", "time_cell", "timed_result", "cuda_clock")),
    *((cell_energy.__name__, name) for name in ("measure_device", "cuda_graph_replay", "cuda_clock")),
)
# torch's CUDA clocks: pinned where they exist, absent on a build of torch without CUDA.
OPTIONAL_TIMER_OBJECTS: tuple[tuple[str, str], ...] = (
    *(("torch.cuda", name) for name in ("synchronize", "Event", "Event.record", "Event.elapsed_time",
                                        "Event.synchronize", "current_stream")),
)
_PINNED: dict[tuple[str, str], tuple[Any, Any, Any, Any]] | None = None


def _resolve(module: str, path: str) -> tuple[Any, str, Any]:
    """(owner, attribute, value) of module + dotted path; raises AttributeError where absent."""
    owner = importlib.import_module(module)
    *parents, attr = path.split(".")
    for name in parents:
        owner = getattr(owner, name)
    return owner, attr, owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)


def _fingerprint(value: Any) -> tuple[Any, Any, Any, Any]:
    """The object, and for a Python function its code and defaults (a patch may swap either)."""
    fn = getattr(value, "__func__", value)
    return (value, getattr(fn, "__code__", None), getattr(fn, "__defaults__", None),
            getattr(fn, "__kwdefaults__", None))


class TimerPinError(RuntimeError):
    """A timing object of the audit's own (TIMER_OBJECTS) that does not resolve: the referee would not
    see it patched."""


def pin_timers() -> None:
    """Remember the timing objects as they are now (once per process, before any variant is built).
    TimerPinError where one of TIMER_OBJECTS does not resolve; OPTIONAL_TIMER_OBJECTS may be absent."""
    global _PINNED
    if _PINNED is not None:
        return
    pinned = {(module, path): _fingerprint(_resolve_own(module, path)) for module, path in TIMER_OBJECTS}
    for module, path in OPTIONAL_TIMER_OBJECTS:
        try:
            _, _, value = _resolve(module, path)
        except (AttributeError, ImportError, KeyError):
            continue                                  # torch.cuda.Event.x on a build without it
        pinned[(module, path)] = _fingerprint(value)
    _PINNED = pinned


def _resolve_own(module: str, path: str) -> Any:
    """The value of one of TIMER_OBJECTS; TimerPinError where it does not resolve."""
    try:
        return _resolve(module, path)[2]
    except (AttributeError, ImportError, KeyError) as exc:
        raise TimerPinError(f"the referee pins {module}.{path}, which does not resolve ({exc!r}): "
                            "update TIMER_OBJECTS to where it lives now") from exc


def _not_genuine(module: str, path: str, value: Any) -> bool:
    """A clock of the time module that is not the time module's own builtin (patched before pinning)."""
    if module != "time":
        return False
    return not (isinstance(value, types.BuiltinFunctionType) and getattr(value, "__self__", None) is time
                and getattr(value, "__name__", None) == path)


def timers_changed() -> list[str]:
    """The timing objects that are not what pin_timers() saw (or, for the time module's clocks, not
    its builtins): replaced, or a function whose code or defaults were swapped."""
    pin_timers()
    changed = []
    for (module, path), pinned in (_PINNED or {}).items():
        try:
            _, _, value = _resolve(module, path)
        except (AttributeError, ImportError, KeyError):
            changed.append(f"{module}.{path} (removed)")
            continue
        now = _fingerprint(value)
        if any(a is not b for a, b in zip(now, pinned)) or _not_genuine(module, path, value):
            changed.append(f"{module}.{path}")
    return changed


def restore_timers() -> None:
    """Put every pinned timing object back (a patch found in one cell must not time the next)."""
    for (module, path), (value, code, defaults, kwdefaults) in (_PINNED or {}).items():
        try:
            owner, attr, _ = _resolve(module, path)
        except (AttributeError, ImportError, KeyError):
            owner, attr = _owner(module, path)
        if owner is None:
            continue
        setattr(owner, attr, value)
        fn = getattr(value, "__func__", value)
        if code is not None:
            fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults


def _owner(module: str, path: str) -> tuple[Any, str]:
    try:
        owner = importlib.import_module(module)
        *parents, attr = path.split(".")
        for name in parents:
            owner = getattr(owner, name)
        return owner, attr
    except (AttributeError, ImportError):
        return None, ""


def check_own_timers(objects: tuple[tuple[str, str], ...] = TIMER_OBJECTS) -> None:
    """TimerPinError where one of the audit's own timing objects does not resolve."""
    for module, path in objects:
        _resolve_own(module, path)


check_own_timers()      # as the referee is imported: a run whose pins do not resolve does not start
