"""A reproduction script per merge_grad_wrong finding (the gradient through a merge is NaN or wrong), in
the merge function's own API, as merge_scripts.py writes one for a wrong value (their pieces:
merge_cases.py): the first row of the state whose gradient fails, cut to two features where that still
fails, the parts as leaves, the call as its library makes it, the loss <out, g_out> + <lse, g_lse>
(measure/merging/gradients.py: the same drawn upstream gradients, 0 on a row that sees no key), and the
right gradients from float64 autograd of the right merge, all found by the merge audit (measure/merging/
smallest.py) and written here as numbers. Exit 1 while the finding holds, 0 once the gradient is right."""
from __future__ import annotations

from typing import Any

from ..core.dtypes import dtype_spec
from ..workload.merge_functions import MergeFunction
from .merge_cases import FORM_CALLS, literal


def gradient_script(finding: dict, merge: MergeFunction, case: dict[str, Any]) -> str:
    """The script's text, from the merge record's `smallest_grad` (measure/merging/smallest.py: the row's parts,
    the upstream gradients, each leaf's right gradient, its tolerance and verdict)."""
    import_line, expression = merge.api
    dtype = dtype_spec(case["dtype"]).torch_name
    parts = ",\n".join(f"    (torch.tensor({literal(o)}, dtype=torch.{dtype}).view(1, 1, 1, -1)"
                       f".requires_grad_(), "
                       f"torch.tensor({literal(l)}, dtype=torch.float32).view(1, 1, 1).requires_grad_())"
                       for o, l in case["parts"])
    expected = ",\n".join(f"    torch.tensor({literal(g)}, dtype=torch.float64)" for g in case["expected"])
    call = FORM_CALLS[merge.form].replace("FN", "merge_fn")
    to_base = "1.0" if merge.lse_base == "e" else "1.0 / math.log(2.0)"
    return f'''"""{finding["message"]}

The smallest failing case of the audit's state `{case["state"]}` ({case["dtype"]}): one query row,
{len(case["parts"])} parts of its keys, each (out, lse) a leaf, merged by {merge.name} in its own API; the gradient of
<out, g_out> + <lse, g_lse> against float64 autograd of the right merge (an empty part gets 0).
Exit 1 while the gradient is {case["grad_outcome"]}, 0 once it is right."""
import math
import sys

import torch
{import_line}

merge_fn = {expression}
TO_BASE = {to_base}     # the lse base {merge.name} takes ({merge.lse_base})
parts = [   # (out (1, 1, 1, d), lse (1, 1, 1) natural log) per part
{parts},
]
leaves = [t for part in parts for t in part]
g_out = torch.tensor({literal(case["g_out"])}, dtype=torch.float64).view(1, 1, 1, -1)
g_lse = {literal(case["g_lse"])}[0]
SEES_A_KEY = {case["sees"]}     # a row that sees no key has no lse term (its lse is -inf)

{call}
lse_term = lse.double() if SEES_A_KEY else torch.zeros((), dtype=torch.float64)
loss = (out.double() * g_out).sum() + (lse_term * g_lse).sum()
grads = torch.autograd.grad(loss, leaves, allow_unused=True)
grads = [torch.zeros_like(t, dtype=torch.float64) if g is None else g.double().flatten() for g, t in zip(grads, leaves)]
expected = [   # d out_0, d lse_0, d out_1, ...
{expected},
]
worst = 0.0
for n, (g, e) in enumerate(zip(grads, expected)):
    print(f"part {{n // 2}} d{{'lse' if n % 2 else 'out'}}: got", g.flatten().tolist(), "expected", e.tolist())
    worst = max(worst, math.inf if not bool(g.isfinite().all()) else float((g.flatten() - e).abs().max()))
right = worst <= {case["grad_tol"]!r}
print("NOT REPRODUCED: the gradient is right" if right else "REPRODUCED: the finding holds ({case['grad_outcome']})")
sys.exit(0 if right else 1)
'''
