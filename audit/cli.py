"""`python -m audit ...` / `attn-audit ...`: parse the command line and dispatch to a command.

Each command's work is a function in audit/commands/ (the same functions audit.run,
audit.report, ... call). Usage errors print one line naming the bad value and what is
allowed, and exit with code 2; an internal error prints one line and exits with 3 (no traceback
either way; core.errors holds every exit code).
"""
from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
from types import ModuleType
from typing import NoReturn, Sequence

from .commands import compare, deps, fit_costs, gpu_check, listing, merge, model, report, run, shrink, verdict
from .commands.common import UsageArgumentParser
from .core.errors import DEBUG_ENV, EXIT_INTERNAL, EXIT_USAGE, UsageError
from .core.records import NewerSchema
# The subcommands, in --help's order: each module has HELP, DESCRIPTION, add_arguments, main.
COMMANDS: dict[str, ModuleType] = {
    "list": listing, "run": run, "report": report, "shrink": shrink, "verdict": verdict, "compare": compare,
    "merge": merge, "model": model, "fit-costs": fit_costs, "gpu-check": gpu_check, "deps": deps,
}


def build_parser() -> argparse.ArgumentParser:
    parser = UsageArgumentParser(prog="attn-audit",
                                 description="Benchmark and numerically audit attention implementations.")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}",
                                parser_class=UsageArgumentParser)
    sub.required = True
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.HELP, description=command.DESCRIPTION))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command].main(args, argv)
    except (UsageError, NewerSchema) as exc:
        lines = str(exc).strip().splitlines() or [""]
        print(f"attn-audit: error: {lines[0]}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - a bug of the audit's: one line, never a traceback
        if os.environ.get(DEBUG_ENV):
            raise
        lines = str(exc).strip().splitlines() or [""]
        print(f"attn-audit: internal error: {type(exc).__name__}: {lines[0][:300]} (a bug of attn-audit: "
              f"{DEBUG_ENV}=1 shows where; please report it)", file=sys.stderr)
        return EXIT_INTERNAL


def exit_process(code: int | None) -> NoReturn:
    """End this process with `code` the way Python would, less its teardown: what the
    interpreter's shutdown does first (threading's exit hooks, which stop executors' worker
    threads, then waiting for the threads that are not daemons; the atexit handlers), flushing
    stdout and stderr, then os._exit. Python's teardown frees every module and object one by
    one, which the operating system does at once: with torch imported it took 0.31 s, with
    Inductor's compiler 0.73 s (2-core Intel Xeon), paid at the end of every measuring process
    (each run, each worker a crash or a leak replaces) and by the supervising one."""
    shutdown = getattr(threading, "_shutdown", None)      # CPython's own first step of exiting
    if shutdown is not None:
        shutdown()
    else:                                                  # pragma: no cover (other Pythons)
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()        # logging's flush, weakref.finalize (temporary folders), ...
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(0 if code is None else int(code))


def entry_point() -> NoReturn:
    """`attn-audit` and `python -m audit`: the command line, then exit_process."""
    exit_process(main())


if __name__ == "__main__":  # pragma: no cover
    entry_point()
