"""What a merge finding's reproduction script is made of (merge_scripts.py for a value, merge_grad_scripts.py
for a gradient): the call snippet of each call form, tensors written as literals, a state cut to one row."""
from __future__ import annotations

import math
from typing import Any, Iterator

from ..measure.merging.states import PartialState

FEATURES = 2           # features kept of the failing row

# How each call form is called in a script: `parts` is [(out, lse)] in the canonical layout (1, 1, 1, d) and
# (1, 1, 1), natural log; the snippet leaves `out` and `lse` the same way. FN names the function or factory.
FORM_CALLS = {
    "pairs": ("out, lse = parts[0]\n"
              "for o, l in parts[1:]:\n"
              "    out, lse = FN(out, lse * TO_BASE, o, l * TO_BASE)\n"
              "    lse = lse / TO_BASE"),
    "stateful": ("merger = FN()\n"
                 "for o, l in parts:\n"
                 "    merger.step(o, l * TO_BASE, partial=False)\n"
                 "out, lse = merger.results()\n"
                 "lse = lse / TO_BASE"),
    "flashinfer": ("v, s = parts[0][0].reshape(1, 1, -1), parts[0][1].reshape(1, 1) * TO_BASE   # (tokens, heads, d)\n"
                   "for o, l in parts[1:]:\n"
                   "    v, s = FN(v, s, o.reshape(1, 1, -1), l.reshape(1, 1) * TO_BASE)\n"
                   "out, lse = v.reshape(1, 1, 1, -1), s.reshape(1, 1, 1) / TO_BASE"),
    "vllm": ("v, s = parts[0][0].reshape(1, 1, -1), parts[0][1].reshape(1, 1) * TO_BASE   # lse (heads, tokens)\n"
             "for o, l in parts[1:]:\n"
             "    merged, merged_lse = torch.empty_like(v), torch.empty_like(s)\n"
             "    FN(merged, v, s, o.reshape(1, 1, -1), l.reshape(1, 1) * TO_BASE, merged_lse)\n"
             "    v, s = merged, merged_lse\n"
             "out, lse = v.reshape(1, 1, 1, -1), s.reshape(1, 1, 1) / TO_BASE"),
}


def literal(t: Any) -> str:
    values = ", ".join("float('-inf')" if v == -math.inf else "float('inf')" if v == math.inf else
                       "float('nan')" if v != v else repr(float(v)) for v in t.flatten().tolist())
    return f"[{values}]"


def row_state(state: PartialState, b: int, h: int, t: int, features: int | None) -> PartialState:
    """The state cut to one row (b, h, t) and its first `features` features (None: all)."""
    cut = slice(None) if features is None else slice(0, features)
    parts = [(o[b:b + 1, h:h + 1, t:t + 1, cut], l[b:b + 1, h:h + 1, t:t + 1]) for o, l in state.parts]
    g_out, g_lse = state.golden
    return PartialState(state.name, state.dtype, parts, (g_out[b:b + 1, h:h + 1, t:t + 1, cut],
                                                         g_lse[b:b + 1, h:h + 1, t:t + 1]), state.what,
                        state.parts_from, state.parts_defects)


def candidate_rows(state: PartialState) -> Iterator[PartialState]:
    """The rows a smallest failing case is looked for in, in order: each row of `state` (batch, head,
    query), first cut to FEATURES features, then whole (a merge works row by row and feature by feature,
    so a failing row cut to two features fails too, unless the failure sits in the features cut off)."""
    b_, h_, t_ = state.golden[1].shape
    for b in range(b_):
        for h in range(h_):
            for t in range(t_):
                for features in (FEATURES, None):
                    yield row_state(state, b, h, t, features)
