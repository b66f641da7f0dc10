"""How a run is stopped: Ctrl-C (SIGINT) or SIGTERM ends it cleanly, whatever its parent set.

A process started with SIGINT ignored (a background job of a script, `cmd &` in a
non-interactive shell, some CI runners and test harnesses) keeps ignoring it under Python:
Python installs its KeyboardInterrupt handler only where SIGINT was left at its default.
A run started that way ignored Ctrl-C and `kill -INT`, and a hung cell then held it forever.
The run's supervisor and its measuring process therefore install their own handlers: the
first SIGINT or SIGTERM raises KeyboardInterrupt (the run saves what it has and says how to
resume); later ones are ignored while it stops, so a second signal cannot cut its clean-up.

Python runs a signal's handler wherever the main thread is, also inside a weakref callback
or a `__del__` (the garbage collector, an import's module lock): there the KeyboardInterrupt
is "ignored": printed as a traceback and dropped, and the run went on as if never stopped
(seen in CI: SIGTERM in a hung cell printed a traceback and the supervisor had to kill the
worker). A stop dropped that way is caught by sys.unraisablehook, not printed, and raised
again RETRY_S later from a timer, wherever the main thread is by then.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RETRY_S = 0.05   # how soon a stop that an "ignored" context dropped is raised again


@contextlib.contextmanager
def stop_on_signals(*, ignore_after_stop: bool = False) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise KeyboardInterrupt once (again, where a
    weakref callback or `__del__` dropped it); the handlers found before are restored after
    it. Outside the main thread (where Python cannot set handlers) it changes nothing.

    ignore_after_stop: for a process that exits after the block (the command line's run, its
    measuring process). Once stopped, the signals stay ignored after the block, so a late
    second one (the supervisor forwarding Ctrl-C to a worker that had it already) cannot raise
    KeyboardInterrupt in the exit handlers and print a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    main_ident = threading.main_thread().ident
    stopped: list[int] = []
    inside = [True]

    def stop(signum: int, frame: Any) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)     # stopping: a second signal is ignored
        stopped.append(signum)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def raise_again() -> None:
        if inside[0]:
            signal.pthread_kill(main_ident, stopped[-1])   # a real signal: it also wakes a sleep

    hook_before = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        # our KeyboardInterrupt, dropped (in the main thread: only there do handlers run):
        # not printed; the handler is put back and the signal sent again RETRY_S later
        if stopped and inside[0] and isinstance(unraisable.exc_value, KeyboardInterrupt):
            for sig in STOP_SIGNALS:
                signal.signal(sig, stop)
            timer = threading.Timer(RETRY_S, raise_again)
            timer.daemon = True
            timer.start()
            return
        hook_before(unraisable)

    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    sys.unraisablehook = hook
    try:
        yield
    finally:
        inside[0] = False
        if sys.unraisablehook is hook:
            sys.unraisablehook = hook_before
        for sig, handler in before.items():
            if stopped and ignore_after_stop:
                signal.signal(sig, signal.SIG_IGN)
            else:
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
