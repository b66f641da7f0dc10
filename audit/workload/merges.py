"""The built-in merge functions by name: the audit's reference merge, torch's context-parallel merge
(where this torch has it) and one negative control per known mistake (workload/merge_mistakes.py:
the control is the mistake's own function). The mechanism, the call forms and declare_merge are
workload/merge_functions.py's."""
from __future__ import annotations

import importlib
from dataclasses import replace

from ..core.errors import UsageError

from .merge_functions import (TORCH_MERGER_API, MergeFunction, declare_merge, reference_pairs,
                              torch_context_parallel_merger, torch_merger_available)
from .merge_mistakes import MERGE_MISTAKES

CONTROL_PREFIX = "broken_merge."
TORCH_MERGE = "torch_context_parallel"


def merge_names() -> tuple[str, ...]:
    """Every built-in merge function's name, torch's included where this torch may lack it (the presets'
    list; imports no torch)."""
    return ("reference", TORCH_MERGE) + tuple(CONTROL_PREFIX + name for name in MERGE_MISTAKES)


def builtin_merges(torch_merge: bool | str = True) -> dict[str, MergeFunction]:
    """Every built-in merge function by name, the reference first. torch_merge=False leaves torch's
    out: finding out whether this torch has it imports torch.distributed (1.5-2.5 s on 2 cores, and torch
    itself in a process without it); "measured": the caller knows it is there (a run measured it: its
    finding's script names it by its API), so it is not looked up."""
    found = {"reference": MergeFunction("reference", reference_pairs, description="the audit's own float64 merge "
                                        "(merge_partials): reads -inf and +inf as an empty part")}
    if torch_merge == "measured" or (torch_merge and torch_merger_available() is None):
        found[TORCH_MERGE] = MergeFunction(
            TORCH_MERGE, torch_context_parallel_merger, "stateful",
            description="torch's _SDPAMerger (context_parallel's ring attention), fp32, as it ships",
            api=TORCH_MERGER_API)
    for mistake in MERGE_MISTAKES.values():
        name = CONTROL_PREFIX + mistake.name
        found[name] = MergeFunction(name, mistake.fn, description=f"negative control: {mistake.what}",
                                    control=mistake.name)
    return found


def resolve_merge(name: str, builtins: dict[str, MergeFunction] | None = None) -> MergeFunction:
    """A merge function by name: a built-in's, or `module:attr` on the Python path (a declare_merge(...)
    result, or a function of the pairs form; a function may say `audit_merge_form` and `audit_lse_base`).
    UsageError names what is allowed."""
    builtins = builtin_merges() if builtins is None else builtins
    if name in builtins:
        return builtins[name]
    if ":" not in name:
        raise UsageError(f"--merge-fn {name!r}: no such merge function; one of all, none, {', '.join(builtins)}, "
                         "or module:attr (a declare_merge(...) in a module on the Python path)")
    module, _, attr = name.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--merge-fn {name!r}: cannot import {attr!r} from {module!r}: {exc}") from None
    if isinstance(obj, MergeFunction):
        return replace(obj, name=name)
    if callable(obj):
        return declare_merge(obj, form=getattr(obj, "audit_merge_form", "pairs"),
                             lse_base=getattr(obj, "audit_lse_base", None), name=name)
    raise UsageError(f"--merge-fn {name!r}: {type(obj).__name__} is neither declare_merge(...) nor a function")
