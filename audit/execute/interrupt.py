"""How a run is stopped: Ctrl-C (SIGINT) or SIGTERM ends it cleanly, whatever its parent set.

A process started with SIGINT ignored (a background job of a script, `cmd &` in a
non-interactive shell, some CI runners and test harnesses) keeps ignoring it under Python:
Python installs its KeyboardInterrupt handler only where SIGINT was left at its default.
A run started that way ignored Ctrl-C and `kill -INT`, and a hung cell then held it forever.
The run's supervisor and its measuring process therefore install their own handlers: the
first SIGINT or SIGTERM raises KeyboardInterrupt (the run saves what it has and says how to
resume); later ones are ignored while it stops, so a second signal cannot cut its clean-up.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_on_signals(*, ignore_after_stop: bool = False) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise KeyboardInterrupt once; the handlers found
    before are restored after it. Outside the main thread (where Python cannot set handlers)
    it changes nothing.

    ignore_after_stop: for a process that exits after the block (the command line's run, its
    measuring process). Once stopped, the signals stay ignored after the block, so a late
    second one (the supervisor forwarding Ctrl-C to a worker that had it already) cannot raise
    KeyboardInterrupt in the exit handlers and print a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopped = []

    def stop(signum: int, frame: Any) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        stopped.append(signum)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    try:
        yield
    finally:
        if not (stopped and ignore_after_stop):
            for sig, handler in before.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
