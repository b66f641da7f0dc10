"""The partial states a merge function is audited on, each with its float64 golden.

A state is the (out, lse) parts of attention over disjoint sets of keys, in key order, as the
consumers of a merge produce them, and the golden: float64 attention over all the keys, with
(out 0, lse -inf) for a row that sees none (cuDNN frontend's context-parallel oracle,
test/python/sdpa/cp_numerics/reference_math.py, defines an empty chunk the same way). Each part is
the float64 golden over its keys (golden/reference.py), its out rounded to the state's dtype and its
lse to float32, as a kernel hands them on.

Real splits of a cell (SPLITS): two shards; a ring of four shards merged in a chain under causal
masking (later shards are empty for early queries); the causal load-balanced split of context
parallelism (each of two ranks holds a chunk from each end); split-KV decode (one query, four
splits). Edge states (EDGES): one part empty on some rows, first or second; both parts empty
(fully masked rows); the empty part carrying FlashAttention's +inf lse; lses more than 88 apart
(float32's exp overflows past 88.7); fully masked rows in a causal split.

The same states with their parts made by an attention kernel (`parts_from`: a variant that returns its
lse), so that a merge is judged on what real kernels hand it: each part the kernel on its keys in the
state's dtype, told which key each query sees by a bool mask (as the lse checks' halves are,
golden/lse.shard_calls), its out as it returns it and its lse in float32; the golden is that of the
inputs as the kernel sees them (rounded to the dtype), so what is judged is the kernel's and the merge's
own error. Kernels differ exactly where merges break: on a row that sees no key torch's CPU flash op
returns out 0 and lse 0, eager attention NaN and -inf, FlexAttention 0 and -inf. The states whose parts no kernel makes (a score bias, an
empty part's lse replaced by +inf) stay the golden's only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.dtypes import dtype_spec
from ...workload.draws import causal_keep
from ...workload.merge_mistakes import GOLDEN_PARTS
from ..golden.reference import golden_attention

BATCH, HEADS, QUERIES, KEYS, HEAD_DIM = 1, 2, 16, 16, 16
FAR_APART = 100.0                       # nats between two parts' lses: exp(100) overflows float32 (88.7)
# A maker of parts: (q, k, v) in the state's dtype, (B, H, Tq, d) and (B, H, Tk_part, d), and a bool mask
# (1, 1, Tq, Tk_part), True where a query sees a key, or None where it sees every one -> (out, lse).
PartsMaker = Callable[..., tuple[Any, Any]]


@dataclass
class PartialState:
    """Parts (out (B, H, T, d) in `dtype`, lse (B, H, T) float32) in key order, and the golden over all keys."""

    name: str
    dtype: str
    parts: list[tuple[Any, Any]]
    golden: tuple[Any, Any]             # float64 (out, lse): (0, -inf) on a row that sees no key
    what: str                           # what it tests, one line (docs/numerics.md)
    parts_from: str = GOLDEN_PARTS      # who made the parts: the golden, or the attention variant's name
    parts_defects: str = "none"         # what the parts hold on rows that see no key of them (parts_defects)
    # what every merge function audited on this state is compared with, made once (judge.py, gradients.py):
    # the right merge's and each known mistake's results and gradients
    memo: dict = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Split:
    name: str
    what: str
    shards: Callable[[int], list[list[int]]]       # keys -> the key indices of each part, in merge order
    causal: bool = False
    queries: int = QUERIES
    hidden_keys: tuple[int, ...] = ()              # keys no query sees (key padding)
    hidden_rows: tuple[int, ...] = ()              # query rows that see no key of the FIRST part
    hidden_rows_second: tuple[int, ...] = ()       # ... of the second part
    empty_lse: float = -math.inf                   # the lse an empty part carries (+inf: FlashAttention's)
    bias: tuple[float, ...] = ()                   # a score added to every key of each part (lses apart)


def _contiguous(n: int) -> Callable[[int], list[list[int]]]:
    return lambda tk: [list(range(i * tk // n, (i + 1) * tk // n)) for i in range(n)]


def _load_balanced(tk: int) -> list[list[int]]:
    """Two ranks, four chunks: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (context parallelism's
    causal load balancing: each rank as much of the triangle)."""
    c = tk // 4
    return [list(range(0, c)) + list(range(3 * c, tk)), list(range(c, 3 * c))]


SPLITS: tuple[Split, ...] = (
    Split("two_shards", "the keys in two halves, no mask", _contiguous(2)),
    Split("ring_4", "four shards merged in a chain under causal masking: later shards empty for early queries",
          _contiguous(4), causal=True),
    Split("load_balanced", "causal, two ranks each holding a chunk from each end (context parallelism)",
          _load_balanced, causal=True),
    Split("split_kv_decode", "one query over four splits of the keys (split-KV decoding)", _contiguous(4), queries=1),
)
EDGES: tuple[Split, ...] = (
    Split("first_empty", "the first part empty on half the rows (lse -inf, out 0)", _contiguous(2),
          hidden_rows=tuple(range(QUERIES // 2))),
    Split("second_empty", "the second part empty on half the rows", _contiguous(2),
          hidden_rows_second=tuple(range(QUERIES // 2))),
    Split("both_empty", "rows that see no key in either part: the merge must give (0, -inf), not NaN",
          _contiguous(2), hidden_rows=tuple(range(4)), hidden_rows_second=tuple(range(4))),
    Split("posinf_empty", "the first part empty on half the rows with FlashAttention's +inf lse (out 0)",
          _contiguous(2), hidden_rows=tuple(range(QUERIES // 2)), empty_lse=math.inf),
    Split("far_apart", f"the second part's scores {FAR_APART:g} higher: lses {FAR_APART:g} nats apart "
          "(exp overflows float32 past 88.7)", _contiguous(2), bias=(0.0, FAR_APART)),
    Split("causal_fully_masked", "causal, two shards, the first two keys hidden: the first two rows see no key",
          _contiguous(2), causal=True, hidden_keys=(0, 1)),
)
STATE_DTYPES = ("fp32", "bf16", "fp16")     # outs in these, lses in float32 (a kernel's usual pair)


def _inputs(seed: int, queries: int) -> tuple[Any, Any, Any]:
    import torch
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, HEADS, queries, HEAD_DIM, generator=gen, dtype=torch.float64)   # (B, H, Tq, d)
    k, v = (torch.randn(BATCH, HEADS, KEYS, HEAD_DIM, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v


def _visible(split: Split, tq: int) -> Any:
    """(1, 1, Tq, Tk) bool: which key each query sees (causal top-left, hidden keys) before the parts' own rows."""
    import torch
    vis = causal_keep(tq, KEYS, "cpu") if split.causal else torch.ones(tq, KEYS, dtype=torch.bool)
    vis = vis.clone()
    vis[:, list(split.hidden_keys)] = False
    return vis[None, None]


def parts_defects(parts: list[tuple[Any, Any]], empty: list[Any], dtype: str) -> str:
    """The defects (workload/merge_mistakes.PART_DEFECTS) of kernel-made parts in `dtype`, each part's rows
    that see none of its keys given ((B|1, H|1, Tq) bool); "none" where every such row holds (out finite,
    lse -inf) and the lse is float32's (not every finite value one the out's dtype holds exactly)."""
    import torch
    found = []
    low = getattr(torch, dtype_spec(dtype).torch_name)
    lses = torch.cat([lse.flatten() for _, lse in parts])
    lses = lses[lses.isfinite()]
    if low != torch.float32 and lses.numel() >= 8 and bool((lses.to(low).float() == lses).all()):
        found.append("lse_in_low_precision")
    for (out, lse), rows in zip(parts, empty):
        rows = rows.expand_as(lse)
        if not rows.any():
            continue
        l, o = lse[rows], out[rows]                                             # (n,), (n, d)
        if torch.isfinite(l).any():
            found.append("lse_finite_on_empty")
        if (l == math.inf).any():
            found.append("lse_posinf_on_empty")
        if l.isnan().any():
            found.append("lse_nan_on_empty")
        if o.isnan().any():
            found.append("out_nan_on_empty")
    return ", ".join(dict.fromkeys(found)) or "none"                       # several may hold at once


def kernel_made(split: Split) -> bool:
    """Whether a kernel can make this split's parts: no score bias and no lse put in by hand."""
    return not split.bias and split.empty_lse == -math.inf


def build_state(split: Split, dtype: str, seed: int = 0, parts_from: tuple[str, PartsMaker] | None = None
                ) -> PartialState:
    """One state: each part the float64 golden over its keys (rounded to `dtype`, lse float32), or, given
    parts_from (a name and its PartsMaker), that kernel's parts; the golden over all keys with the same
    visibility and score bias."""
    import torch
    q, k, v = _inputs(seed, split.queries)
    out_dtype = getattr(torch, dtype_spec(dtype).torch_name)
    if parts_from is not None:       # the kernel sees its inputs in the dtype: the golden of the same inputs
        q, k, v = (t.to(out_dtype).double() for t in (q, k, v))
    shards = split.shards(KEYS)
    visible = _visible(split, split.queries)
    for part, rows in ((0, split.hidden_rows), (1, split.hidden_rows_second)):   # rows a part gives no key
        if rows:
            visible[0, 0, torch.tensor(rows)[:, None], torch.tensor(shards[part])[None, :]] = False
    bias = torch.zeros(KEYS, dtype=torch.float64)                               # (Tk,)
    for part, extra in enumerate(split.bias):
        bias[shards[part]] = extra
    whole = golden_attention(q, k, v, visible=visible, score_mod=lambda s: s + bias)
    if parts_from is not None:
        name, make = parts_from
        assert kernel_made(split), split.name
        qd, kd, vd = (t.to(out_dtype) for t in (q, k, v))
        parts, empty = [], []
        for idx in shards:
            sel = torch.tensor(idx)
            sees = visible[..., sel]                                            # (1, 1, Tq, Tk_part)
            out, lse = make(qd, kd[..., sel, :], vd[..., sel, :], None if bool(sees.all()) else sees)
            parts.append((out.detach(), lse.detach().float()))
            empty.append(~sees.any(-1))                                         # (1, 1, Tq)
        return PartialState(split.name, dtype, parts, (whole.out, whole.lse), split.what, name,
                            parts_defects(parts, empty, dtype))
    parts = []
    for idx in shards:
        sel = torch.tensor(idx)
        g = golden_attention(q, k[..., sel, :], v[..., sel, :], visible=visible[..., sel],
                             score_mod=lambda s, b=bias[sel]: s + b)
        lse = g.lse.clone()
        lse[lse == -math.inf] = split.empty_lse                                 # FlashAttention's +inf, where asked
        parts.append((g.out.to(out_dtype), lse.float()))
    return PartialState(split.name, dtype, parts, (whole.out, whole.lse), split.what)


def all_states(dtypes: tuple[str, ...] = STATE_DTYPES, seed: int = 0,
               parts_from: tuple[str, PartsMaker] | None = None) -> list[PartialState]:
    """Every split in every dtype, every edge state in float32 and the narrowest dtypes' first (bf16);
    given parts_from, those whose parts a kernel can make (kernel_made), made by it."""
    splits = [(s, dtypes) for s in SPLITS] + [(s, dtypes[:2]) for s in EDGES]
    return [build_state(s, dt, seed, parts_from) for s, dts in splits for dt in dts
            if parts_from is None or kernel_made(s)]
