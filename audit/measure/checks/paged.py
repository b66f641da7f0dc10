"""The paged check: does a paged kernel read slots it must not, and which paged mistake is it?

The variant is called on two pools holding the cell's used keys and values where they belong and
different finite values (seeded N(0, 1) · 4) in every other slot: a kernel that never reads those
slots returns the same output on both. Where it does not, each paged mistake
(workload/paged_mistakes.py: which table row and how many slots it reads) is computed in float64
on the first pool, and the one the output matches within the cell's error budget is named (every
one that matches, and those the cell cannot tell from one: measure.diagnosis.diagnosis.named_matches).
"""
from __future__ import annotations

import math
from typing import Any

from ...core.diagnosis_names import joined
from ...workload.paged_mistakes import PAGED_MISTAKES
from ...workload.packing import gather_dense, pool_from_dense
from ..diagnosis.diagnosis import Candidate, named_matches
from ..golden.numerics import budget_bound, changed_max

POISON_SEEDS = (97, 98)     # the two fills of the slots a kernel must not read
POISON_SCALE = 4.0          # their values: N(0, 1) · this (far from the used keys' spread)


def poisoned_pool(t: Any, layout: Any, seed: int) -> Any:
    """(B, Hkv, T, d) -> the pool (pages, page_size, Hkv, d) with finite seeded values where NaN was."""
    import torch
    pool = pool_from_dense(t.detach(), layout)
    gen = torch.Generator().manual_seed(seed)
    fill = (torch.randn(pool.shape, generator=gen) * POISON_SCALE).to(pool.device, pool.dtype)
    return torch.where(torch.isnan(pool), fill, pool)


def mistaken_output(q: Any, k_pages: Any, v_pages: Any, layout: Any, reads: Any, scale: float | None,
                    dtype: Any = None) -> Any:
    """Attention of each sequence over the slots `reads(b, ...)` names, in float64 (or `dtype`: the
    rounding a kernel's own arithmetic has): -> (B, H, Tq, d_v) float64."""
    import torch
    dtype = torch.float64 if dtype is None else dtype
    B, H = q.shape[0], q.shape[1]
    width = len(layout.block_table[0])
    outs = []
    for b in range(B):
        used = layout.used[b]
        row, slots, first = (*reads(b, used, layout.used_pages(b), width, layout.page_size, B), 0)[:3]
        table = torch.tensor([layout.block_table[row]], device=q.device)
        end = min(first + slots, width * layout.page_size)                             # the row's slots end there
        k, v = (gather_dense(p.to(dtype), table, end)[..., first:, :] for p in (k_pages, v_pages))   # (1, Hkv, n, d)
        group = H // k.shape[1]
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))                     # (1, H, slots, d)
        scores = (q[b:b + 1].detach().to(dtype) @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None
                                                                          else scale)
        outs.append((torch.softmax(scores, dim=-1) @ v).double())                       # (1, H, Tq, dv)
    return torch.cat(outs)


def paged_reads_columns(cell: Any) -> dict[str, Any]:
    """paged_unread_max_change, paged_diagnosis and paged_diagnosis_err of one paged cell."""
    import torch
    call = cell.paged_call
    layout = call.layout
    kwargs = {n: t for n, t in cell.kwargs.items() if n != "mask"}
    pools = [(poisoned_pool(cell.k, layout, s), poisoned_pool(cell.v, layout, s)) for s in POISON_SEEDS]
    with torch.no_grad():
        outs = []
        for kp, vp in pools:
            result = call.with_pools(cell.q.detach(), kp, vp, **kwargs)
            outs.append((result[0] if isinstance(result, tuple) else result).detach())
            cell.settle_if_incomplete()
    everywhere = torch.ones(outs[0].shape[:-1], dtype=torch.bool, device=outs[0].device)
    change = changed_max(outs[0], outs[1], everywhere)
    columns = {"paged_unread_max_change": change, "paged_diagnosis": None, "paged_diagnosis_err": None}
    if change == 0.0:
        return columns
    base = cell.ref.baseline_rmse
    bound = budget_bound(base if base is not None and math.isfinite(base) else 0.0, cell.case.dtype)
    observed = outs[0].double()
    golden = mistaken_output(cell.q, *pools[0], layout, lambda b, used, *_: (b, used), kwargs.get("scale"))
    wrong = float(((observed - golden) ** 2).mean().sqrt())                            # against correct
    candidates = []
    for order, (name, m) in enumerate(PAGED_MISTAKES.items()):
        expected = mistaken_output(cell.q, *pools[0], layout, m.reads, kwargs.get("scale"))
        own = mistaken_output(cell.q, *pools[0], layout, m.reads, kwargs.get("scale"), cell.q.dtype)
        err = float(((observed - expected) ** 2).mean().sqrt())
        tolerance = max(bound, budget_bound(float(((own - expected) ** 2).mean().sqrt()), cell.case.dtype))
        if float(((golden - expected) ** 2).mean().sqrt()) > tolerance:              # a mistake, not a rounding
            candidates.append(Candidate(name, order, 1, err, err <= tolerance and bound < wrong and err < wrong,
                                        (expected, tolerance)))

    def close(a: Candidate, b: Candidate) -> bool:
        return float(((a.evidence[0] - b.evidence[0]) ** 2).mean().sqrt()) <= max(a.evidence[1], b.evidence[1])
    named = named_matches(candidates, close)
    columns.update(paged_diagnosis=joined(c.name for c in named),
                   paged_diagnosis_err=min((c.score for c in named), default=None))
    return columns
