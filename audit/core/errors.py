"""Errors every layer may raise: a user's bad value (exit 2, one line, no traceback); and the exit
codes of every command, defined once (docs/command-line.md, Exit codes)."""
from __future__ import annotations

import contextlib
import re
from typing import Iterator

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


# torch's refusals of the machine, not of the call: a cell meeting one is `skipped` with torch's words, never an
# `error`. Each is a phrase of torch 2.13's message (its source or libtorch_cpu) and why torch says it. Nothing
# else is one: "not supported" alone (a cuDNN frontend's failure, a plug-in's own NotImplementedError, flex's
# "Mixed query, key, and value dtype is not supported on this platform", a fault of the caller's inputs) stays
# what it was. docs/command-line.md (Statuses) lists them.
PLATFORM_REFUSALS: dict[str, str] = {
    "torch.compile on current platform is not supported for CPU":
        "Inductor compiles FlexAttention for the CPU only on x86 with AVX2 and ATEN_CPU_CAPABILITY other than "
        "default, not on macOS",
    "torch.compile on CPU only supports inference and `return_lse` is not supported yet":
        "Inductor's CPU FlexAttention returns no log-sum-exp",
    "pack_vnni2 is only supported when avx512 is supported":
        "ATen's CPU flash attention packs bf16 for oneDNN's AMX kernels, which it does only under the AVX-512 "
        "capability",
    "is only supported on X64 when oneDNN ukernel is enabled":
        "oneDNN's brgemm kernels in this dtype need AMX",
}
PLATFORM_REASON = "not supported on this platform"       # how the reason of a cell torch refuses here begins
_EXCEPTION_PREFIX = r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Failed): )+"   # "LoweringException: NotImplementedError: "


class PlatformRefusal(Unsupported):
    """torch refuses this cell on this machine (PLATFORM_REFUSALS): skipped with torch's words."""


def platform_reason(text: str) -> str | None:
    """The skip reason of a failure whose message says one of PLATFORM_REFUSALS: torch's sentence
    (without the exception names a wrapper put before it) and why torch says it; None otherwise."""
    for phrase, why in PLATFORM_REFUSALS.items():
        for line in text.splitlines():
            if phrase in line:
                return f"{PLATFORM_REASON}: {re.sub(_EXCEPTION_PREFIX, '', line.strip())} ({why})"
    return None


def refused_by_platform(reason: str | None) -> bool:
    """Whether a skipped cell's reason is torch's refusal of this machine (platform_reason's)."""
    return bool(reason) and reason.startswith(f"{PLATFORM_REASON}: ")


def platform_refusal(exc: BaseException) -> str | None:
    """platform_reason of exc or of an exception it was raised from (`raise ... from`; Inductor wraps a
    lowering's error in its own and repeats its message). An exception raised while handling another is
    not caused by it: a plug-in's bug in its fallback after a refusal stays its bug."""
    seen: list[BaseException] = []
    while exc is not None and all(exc is not e for e in seen):
        if isinstance(exc, Exception) and (reason := platform_reason(str(exc))):
            return reason
        seen.append(exc)
        exc = exc.__cause__
    return None


@contextlib.contextmanager
def skip_platform_refusals() -> Iterator[None]:
    """A failure in the block that is one of torch's PLATFORM_REFUSALS raised as PlatformRefusal, so
    whatever handles Unsupported skips it; every other failure as it was. Also a decorator."""
    try:
        yield
    except Unsupported:
        raise
    except Exception as exc:
        reason = platform_refusal(exc)
        if reason is None:
            raise
        raise PlatformRefusal(reason) from exc


class RunFailed(RuntimeError):
    """A run that ended before every cell had a record (audit.run): its exit code says how
    (1: the measuring process died outside any cell or crashed too often); what it measured
    stays in the run folder, and running again with the same `out` finishes it."""

    def __init__(self, code: int, run_dir: object) -> None:
        super().__init__(f"the run ended with exit code {code}; finished cells are in {run_dir}; "
                         "run again with the same out to measure the rest")
        self.code = code
        self.run_dir = run_dir
