"""Errors every layer may raise: a user's bad value (exit 2, one line, no traceback); and the exit
codes of every command, defined once (docs/command-line.md, Exit codes)."""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1          # a gate failed (verdict, compare --fail-on, gpu-check), an install failed, or a run
                         # stopped before its cells were done (its measuring process died outside a cell)
EXIT_USAGE = 2           # a bad value on the command line, or a run folder that cannot be used: one line
EXIT_INTERNAL = 3        # a bug of attn-audit: one line naming it, no traceback (ATTN_AUDIT_DEBUG=1 shows it)
EXIT_INTERRUPTED = 130   # Ctrl-C or SIGTERM: what was measured is kept, the same --out resumes
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done", EXIT_FAILED: "a gate failed, an install failed, or a run stopped early",
    EXIT_USAGE: "a usage error", EXIT_INTERNAL: "an internal error of attn-audit", EXIT_INTERRUPTED: "interrupted",
}
DEBUG_ENV = "ATTN_AUDIT_DEBUG"    # set: an internal error raises (its traceback printed) instead of one line


class UsageError(ValueError):
    """A bad value given by the user: reported as one line naming the value and what is
    allowed, exit code 2."""


class Unsupported(Exception):
    """This variant cannot run this cell (a backend's limits, a form of mask a kernel does not
    take): recorded as `skipped` with the message, not `error`, and no finding. A plug-in
    raises it (audit.Unsupported) or NotImplementedError to decline a cell."""


class BackwardUnsupported(Unsupported):
    """The variant runs forward but has no backward here: the cell is measured forward-only,
    with inputs that do not require grad, and `reason` says why fwd_bwd is missing."""


class RunFailed(RuntimeError):
    """A run that ended before every cell had a record (audit.run): its exit code says how
    (1: the measuring process died outside any cell or crashed too often); what it measured
    stays in the run folder, and running again with the same `out` finishes it."""

    def __init__(self, code: int, run_dir: object) -> None:
        super().__init__(f"the run ended with exit code {code}; finished cells are in {run_dir}; "
                         "run again with the same out to measure the rest")
        self.code = code
        self.run_dir = run_dir
