"""The built-in merge functions by name: the audit's reference merge, torch's context-parallel merge
(where this torch has it) and one negative control per known mistake (workload/merge_mistakes.py:
the control is the mistake's own function). The mechanism, the call forms and declare_merge are
workload/merge_functions.py's."""
from __future__ import annotations

from typing import Any

from .merge_functions import (TORCH_MERGER_API, MergeFunction, merge_partials, torch_context_parallel_merger,
                              torch_merger_available)
from .merge_mistakes import MERGE_MISTAKES

CONTROL_PREFIX = "broken_merge."
TORCH_MERGE = "torch_context_parallel"


def merge_names() -> tuple[str, ...]:
    """Every built-in merge function's name, torch's included where this torch may lack it (the presets'
    list; imports no torch)."""
    return ("reference", TORCH_MERGE) + tuple(CONTROL_PREFIX + name for name in MERGE_MISTAKES)


def _reference(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    return merge_partials((out_a, lse_a), (out_b, lse_b))


def builtin_merges() -> dict[str, MergeFunction]:
    """Every built-in merge function by name, the reference first."""
    found = {"reference": MergeFunction("reference", _reference, description="the audit's own float64 merge "
                                        "(merge_partials): reads -inf and +inf as an empty part")}
    if torch_merger_available() is None:
        found[TORCH_MERGE] = MergeFunction(
            TORCH_MERGE, torch_context_parallel_merger, "stateful",
            description="torch's _SDPAMerger (context_parallel's ring attention), fp32, as it ships",
            api=TORCH_MERGER_API)
    for mistake in MERGE_MISTAKES.values():
        name = CONTROL_PREFIX + mistake.name
        found[name] = MergeFunction(name, mistake.fn, description=f"negative control: {mistake.what}",
                                    control=mistake.name)
    return found
