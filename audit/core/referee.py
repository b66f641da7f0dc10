"""The referee's checks by name: one definition for the measuring side (measure/referee/ runs
them and writes a column per check), the findings (the `referee` family) and the report (the
verdict's referee column). Pure Python: no torch.

Each check is one mechanism over a variant's call, not a case per trick, so it covers every
tensor a call takes or returns (q, k, v, the mask, the sinks, the upstream gradients; out, the
lse and the gradients). A correct kernel passes every one of them (docs/generated-kernels.md).
"""
from __future__ import annotations

from typing import Any, Mapping

# name -> what a pass means, in the order the checks run in a cell.
REFEREE_CHECKS: dict[str, str] = {
    "inputs_untouched": "q, k, v, the mask, the sinks and the upstream gradients are bitwise the same after "
                        "the forward, the backward and the timed calls",
    "values_follow": "the output follows the values, not the tensor objects: new values written into the "
                     "same tensors move it as they move the float64 golden, and the old values in new "
                     "tensors give the numerics call's output",
    "complete_at_return": "the output read when the call returns equals the same output read later (CPU: "
                          "after a wait; CUDA: after a device-wide synchronize), and on CUDA the device-wide "
                          "time of the timed calls agrees with their stream's",
    "plain_result": "every tensor returned is a plain torch.Tensor that shares no memory with an input or "
                    "with the previous call's output",
    "out_of_reach": "the output does not follow the decoy the audit plants in the process while the variant "
                    "runs (a float64 reference only a search of the process can find)",
    "every_call": "the last timed call's output and gradients are the numerics call's: bitwise, or within "
                  "their budgets where the variant is not deterministic",
    "timers_untouched": "the clocks and timing functions the audit measures with are the objects they were "
                        "before the variant was imported and called",
    "physically_possible": "no timed pass is faster than this machine can compute it: FLOPs of the keys each "
                           "query must see at the measured matmul rate (and, past the caches, the bytes of "
                           "the inputs and output at the measured copy rate), with a margin for the "
                           "ceilings' own noise",
}


def column(name: str) -> str:
    """The record column of one referee check: True passed, False failed, null not run."""
    return f"referee_{name}"


REFEREE_COLUMNS: tuple[str, ...] = tuple(column(name) for name in REFEREE_CHECKS)


def failed_checks(rec: Mapping[str, Any]) -> list[str]:
    """The referee checks a record failed, in REFEREE_CHECKS order ([] when none, or not refereed)."""
    return [name for name in REFEREE_CHECKS if rec.get(column(name)) is False]


def refereed(rec: Mapping[str, Any]) -> bool:
    """Whether any referee check ran on the record (records before schema 12 have none)."""
    return any(rec.get(column(name)) is not None for name in REFEREE_CHECKS)
