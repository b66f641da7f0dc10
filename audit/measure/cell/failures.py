"""A failed cell's reason and whole text: the line that names the cause (a compiler's `error:` line,
the root of a chain of `raise ... from`) in the record's one-line reason, and every exception with
its stack and full message for the run folder's failures/ (execute.runner writes them)."""
from __future__ import annotations

import re
import traceback
from pathlib import Path


class ContractError(Exception):
    """A variant returned something other than attention's output (docs/variants.md)."""


REASON_CHARS = 400          # a reason's length at most, before its location
# A line of a compiler's (or a tool's) own output that names what failed: gcc and clang's
# "file:line:col: error: ...", nvcc's and ptxas's "error : ...", a linker's "undefined reference".
# (a pattern string, not a compiled one: reproduction scripts copy this code, and copy strings only)
_CAUSE_LINE = r"(?:^|\s|:)(?:fatal )?error\s?:\s*\S|undefined reference to"


def exception_chain(exc: BaseException) -> list[BaseException]:
    """exc and the exceptions it was raised from (`raise ... from`), outermost first, each once. An
    exception raised while another was being handled is not caused by it (the forward-only retry
    of a cell whose backward was refused), so an implicit context is not followed."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not e for e in chain):
        chain.append(exc)
        exc = exc.__cause__
    return chain


def cause_line(exc: BaseException) -> str | None:
    """The first line of the exception chain's messages that names the cause where the first line
    does not: a compiler's first `error:` line (Inductor's C++ or Triton compile errors carry the
    compiler's output in their message), else the root exception of a chain ("Type: first line")
    when it differs from the outermost; None when the first line is all there is."""
    chain = exception_chain(exc)
    for e in chain:
        for line in str(e).splitlines()[1:] + str(e).splitlines()[:1]:
            if re.search(_CAUSE_LINE, line, re.IGNORECASE):
                return _short_paths(line.strip())
    root = chain[-1]
    if root is not exc:
        text = str(root).strip()
        return f"{type(root).__name__}: {text.splitlines()[0] if text else ''}".strip()
    return None


def _short_paths(line: str) -> str:
    """A compiler line with its generated file's folder cut (/tmp/.../cxyz.main.cpp:65:51 -> cxyz.main.cpp:65:51)."""
    return re.sub(r"(?:/[^\s:/]+)+/([^\s:/]+:\d+)", r"\1", line)


def failure_reason(exc: BaseException) -> str:
    """`Type: first line of message; cause: the line naming it (at file:line in function)`, short
    enough for a table (cause_line: a compiler's `error:` line, a chain's root exception).
    A broken variant contract is the variant's fault, not a place in the audit: no location."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, ContractError):
        return first[:REASON_CHARS]
    cause = cause_line(exc)
    head = f"{type(exc).__name__}: {first}"
    if cause and cause not in head:
        head = f"{head[:REASON_CHARS // 2]}; cause: {cause}"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return head[:REASON_CHARS] + where


FAILURE_HEADER = "Stack of the failure (most recent call last):"


def failure_text(exc: BaseException) -> str:
    """The whole failure: every exception of the chain with its stack and full message (a
    compiler's output included), as Python prints it, but for its header line (FAILURE_HEADER:
    a run folder holds no "Traceback", the word a crash of the audit itself prints)."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines).replace("Traceback (most recent call last):", FAILURE_HEADER)
