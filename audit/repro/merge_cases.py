"""What a merge finding's reproduction script is made of (merge_scripts.py for a value, merge_grad_scripts.py
for a gradient): the call snippet of each call form, and numbers written as literals (the smallest failing row
the merge audit kept: measure/merging/smallest.py)."""
from __future__ import annotations

import math
from typing import Sequence

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


def literal(values: Sequence[float | str]) -> str:
    """Numbers (a record's, measure/merging/smallest.py: infinities and NaN kept as records.dumps writes them,
    "-inf", "inf", "nan") as a Python list literal, infinities and NaN spelled out."""
    numbers = [float(v) for v in values]
    return "[" + ", ".join("float('-inf')" if v == -math.inf else "float('inf')" if v == math.inf else
                           "float('nan')" if v != v else repr(v) for v in numbers) + "]"
