"""The diagnosis library's machinery: a Mistake, its registry, the @mistake and @mistake_family
decorators, and the Attempt every mistake is written on (a cell's float64 context, and correct
attention with one thing overridden). The mistakes themselves: mistakes.py (which registers its own,
then sink_mistakes.py's and layout_mistakes.py's, in that order), backward_mistakes.py, lse_mistakes.py.

Imports no torch at module level; the functions do.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from .draws import causal_offset, torch_dtype

ROWS = ("seen", "all")
PRECISIONS = ("float64", "cell")
class _SAME:
    """Default of an Attempt override: "as in the cell" (a class, so a reproduction script can
    copy it: the script compares against the same object)."""


@dataclass(frozen=True)
class Mistake:
    """One known mistake: its texts for the report, its float64 function, how it is compared."""

    name: str
    title: str                    # a few words
    what: str                     # what the mistaken code does, one plain sentence
    where: str                    # where such a mistake usually sits
    fn: Callable[["Attempt"], Any]
    rows: str = "seen"            # ROWS: which rows the comparison covers (module docstring)
    specificity: int = 1          # ties go to the higher: 0 a fit, 2 a special case of another
    precision: str = "float64"    # PRECISIONS: "cell" evaluates it in the cell's dtype (module docstring)
    family: str = ""              # the parameterised mistake it is a member of (mistake_family), or ""


MISTAKES: dict[str, Mistake] = {}


def register(registry: dict[str, Mistake], entry: Mistake) -> None:
    """Add `entry` to `registry` (MISTAKES, or backward_mistakes.BACKWARD_MISTAKES). The same name
    twice is an error unless it is the same function again (a module reload)."""
    old = registry.get(entry.name)
    if old is not None and _origin(old.fn) != _origin(entry.fn):
        raise ValueError(f"mistake {entry.name!r} is already registered by {'.'.join(map(str, _origin(old.fn)[:2]))}")
    registry[entry.name] = entry


def _origin(fn: Callable) -> tuple:
    """(module, qualified name, member parameters) of a mistake's function: a family member is a
    functools.partial of the family's function (a reproduction script copies it as one)."""
    inner = getattr(fn, "func", fn)
    return (inner.__module__, inner.__qualname__, tuple(sorted(getattr(fn, "keywords", {}).items())))


def mistake(name: str, *, title: str, what: str, where: str, rows: str = "seen",
            specificity: int = 1, precision: str = "float64") -> Callable[[Callable], Callable]:
    """Register a mistake (its function returns the mistaken float64 output or None)."""
    if rows not in ROWS:
        raise ValueError(f"mistake {name!r}: rows must be one of {ROWS}, not {rows!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"mistake {name!r}: precision must be one of {PRECISIONS}, not {precision!r}")

    def add(fn: Callable) -> Callable:
        register(MISTAKES, Mistake(name, title, what, where, fn, rows, specificity, precision))
        return fn
    return add


@dataclass(frozen=True)
class Member:
    """One member of a mistake family: its registered name, its texts and the keyword arguments the
    family's function takes for it."""

    name: str
    title: str
    what: str
    params: tuple[tuple[str, Any], ...]    # ((keyword, value), ...)


def mistake_family(family: str, members: "tuple[Member, ...]", *, where: str, rows: str = "seen",
                   specificity: int = 1, precision: str = "float64") -> Callable[[Callable], Callable]:
    """Register a parameterised mistake: fn(attempt, **params) -> the mistaken float64 output or
    None, once per member. Each member is a Mistake of its own (its name and texts, the family's
    function with its parameters, Mistake.family the family's name), so the diagnosis searches the
    whole family as it searches any mistake and names the member that matches: "each document sees
    one key past its end", not only "a document boundary is wrong"."""
    import functools
    if rows not in ROWS:
        raise ValueError(f"mistake family {family!r}: rows must be one of {ROWS}, not {rows!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"mistake family {family!r}: precision must be one of {PRECISIONS}, not {precision!r}")

    def add(fn: Callable) -> Callable:
        for m in members:
            register(MISTAKES, Mistake(m.name, m.title, m.what, where, functools.partial(fn, **dict(m.params)),
                                       rows, specificity, precision, family))
        return fn
    return add


def family_members(family: str) -> list[str]:
    """The registered members of a mistake family, in registration order."""
    return [name for name, m in MISTAKES.items() if m.family == family]


@dataclass
class Attempt:
    """The float64 context of one cell's diagnosis slices, and correct attention with overrides.

    q holds the selected query heads of the selected batches; k and v every key/value head of
    those batches, so any pairing of query head and kv head can be computed.
    """

    q: Any                        # (b, h, Tq, d) float64
    k: Any                        # (b, Hkv, Tk, d) float64: all kv heads of the selected batches
    v: Any                        # (b, Hkv, Tk, d) float64
    heads: tuple[int, ...]        # the cell's index of each of q's h heads
    n_heads: int                  # H, the cell's query heads
    causal: bool = False
    alignment: str = "top-left"   # the golden's causal alignment (inputs.causal_offset)
    visible: Any = None           # (b|1, 1, Tq|1, Tk) bool from the scenario, causal not applied, or None
    bias: Any = None              # (b|1, 1, Tq|1, Tk) a finite additive bias (masks nothing), or None
    scale: float | None = None    # None: d ** -0.5
    score_mod: Any = None         # callable on the scaled scores, or None
    observed: Any = None          # (b, h, Tq, d) float64: the variant's output (for fits), or None
    dtype: str = "fp32"           # the cell's dtype: the range of the mistakes that depend on it
    grad_out: Any = None          # (b, h, Tq, d) float64 upstream gradient (backward mistakes), or None
    observed_grads: Any = None    # {"dq", "dk", "dv"}: the variant's float64 gradients (for fits), or None
    sinks: Any = None             # (H,) float64 attention-sink logits of every query head (a sinks cell), or None
    grad_lse: Any = None          # (b, h, Tq) float64 upstream gradient on the lse (lse mistakes), or None
    batches: tuple[int, ...] = ()  # the cell's index of each of q's b batches
    n_batch: int = 0              # B, the cell's batch size
    cu_seqlens: Any = None        # a packed cell's (documents + 1,) offsets into the B·T flattened tokens, or None
    flat_kv: Any = None           # a packed cell's (k, v) of every token, (B·Tk, Hkv, d) float64 flattened row by row
    empty_rows_zero: bool = False  # softmax gives a row with no key 0 weights (not NaN): its gradients stay finite
    window: int | None = None     # a sliding-window cell's width w (visible is |i - j| < w), or None
    # q, k, v as a kernel reading them as contiguous memory from where each starts sees them (float64,
    # the selected batches and heads as q, k, v), where the cell's inputs are not contiguous; or None
    read_contiguous: Any = None

    def head_sinks(self, sinks: Any = _SAME) -> Any:
        """The sinks (H,) -> those of the selected query heads as a (1, h, 1, 1) column, or None."""
        sinks = self.sinks if sinks is _SAME else sinks
        if sinks is None:
            return None
        return sinks[list(self.heads)].view(1, -1, 1, 1)

    def __post_init__(self) -> None:
        if self.scale is None:
            self.scale = self.q.shape[-1] ** -0.5

    def in_dtype(self) -> "Attempt":
        """The same attempt on q, k, v (and bias) in the cell's dtype: a mistake run there gives
        the error the mistaken code itself has in that precision (the diagnosis's tolerance)."""
        dt = torch_dtype(self.dtype)
        cast = {n: getattr(self, n).to(dt) for n in ("q", "k", "v")}
        bias = None if self.bias is None else self.bias.to(dt)
        flat = None if self.flat_kv is None else tuple(t.to(dt) for t in self.flat_kv)
        return replace(self, **cast, bias=bias, flat_kv=flat)

    @property
    def tq(self) -> int:
        return self.q.shape[-2]

    @property
    def tk(self) -> int:
        return self.k.shape[-2]

    @property
    def kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def group(self) -> int:
        return self.n_heads // self.kv_heads

    @property
    def gqa(self) -> bool:
        """1 < kv_heads < heads: the only case where pairings of query and kv heads can differ."""
        return 1 < self.kv_heads < self.n_heads

    @property
    def offset(self) -> int:
        """Query i sees keys j <= i + offset under the golden's alignment (inputs.causal_offset's
        rule; measure is a layer above, so it is restated in _offset)."""
        return causal_offset(self.tq, self.tk, self.alignment)

    def pairing(self) -> list[int]:
        """The correct kv head of each selected query head: h // (H / Hkv)."""
        return [h // self.group for h in self.heads]

    def pair(self, t: Any, pairing: list[int] | None = None) -> Any:
        """k or v (b, Hkv, Tk, d) -> (b, h, Tk, d), query head i reading kv head pairing[i]."""
        import torch
        index = torch.tensor(self.pairing() if pairing is None else pairing, device=t.device)
        return t.index_select(1, index)                                      # (b, h, Tk, d)

    def keep(self, *, causal: bool | None = None, offset: int | None = None, upper: bool = False,
             visible: Any = _SAME, rows: Any = None) -> Any:
        """(b|1, 1, rows, Tk) bool of the keys each query may see, or None when all: causal as the
        cell's (j <= i + offset; upper: j >= i + offset) and the scenario's visibility."""
        import torch
        causal = self.causal if causal is None else causal
        visible = self.visible if visible is _SAME else visible
        out = None
        if causal:
            i = torch.arange(self.tq, device=self.q.device)[:, None]         # (Tq, 1)
            i = i if rows is None else i[rows]                               # (rows, 1)
            j = torch.arange(self.tk, device=self.q.device)[None, :]         # (1, Tk)
            off = self.offset if offset is None else offset
            out = ((j >= i + off) if upper else (j <= i + off))[None, None]  # (1, 1, rows, Tk)
        if visible is not None:
            vis = visible[..., rows, :] if rows is not None and visible.shape[-2] > 1 else visible
            out = vis if out is None else out & vis
        return out

    def seen(self) -> Any:
        """(b|1, 1, Tq) bool: rows that see at least one key in the golden."""
        import torch
        keep = self.keep()
        if keep is None:
            return torch.ones(1, 1, self.tq, dtype=torch.bool, device=self.q.device)
        return keep.expand(*keep.shape[:2], self.tq, self.tk).any(-1)      # (b|1, 1, Tq)

    def softmax(self, scores: Any, keep: Any, dim: int = -1, sinks: Any = None) -> Any:
        """Hidden scores to -inf, softmax over `dim`: an empty row (or column) becomes NaN (0 where
        the attempt has empty_rows_zero: the gradients of a mistake's output, measure.diagnosis.diagnosis). sinks
        (1, h, 1, 1) or None: one more column over the keys (dim -1), dropped after the softmax."""
        import torch
        has_key = None
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
            if self.empty_rows_zero and sinks is None:
                has_key = keep.any(dim, keepdim=True)                               # (…, 1) along dim
                scores = scores.masked_fill(~has_key, 0.0)
        if sinks is None or dim != -1:
            probs = torch.softmax(scores, dim=dim)
            return probs if has_key is None else probs * has_key
        column = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)            # (b, h, rows, 1)
        return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]

    def stored(self, t: Any) -> Any:
        """t as the cell's dtype stores it (rounded, overflow to inf, underflow to 0), in float64:
        for the mistakes whose outcome depends on the working precision's range."""
        return t.to(torch_dtype(self.dtype)).double()

    def attend(self, *, pairing: list[int] | None = None, scale: float | None = None,
               score_mod: Any = _SAME, keep: Any = _SAME, dim: int = -1,
               weights: Callable[[Any, Any], Any] | None = None, k: Any = None, v: Any = None,
               rows: Any = None, sinks: Any = _SAME) -> Any:
        """Attention as the cell defines it, except what is overridden: -> (b, h, rows, d), in the
        attempt's dtype (float64, or the cell's for Attempt.in_dtype).

        weights(scores (b, h, rows, Tk), keep or None) -> probabilities replaces the masked
        softmax; rows (a slice or index) computes only those query rows. sinks: the (H,) sinks to use
        instead of the cell's (None: none), applied by the masked softmax (`weights` applies its own).
        """
        q = self.q if rows is None else self.q[:, :, rows]                   # (b, h, rows, d)
        kk = self.pair(self.k if k is None else k, pairing)                  # (b, h, Tk, d)
        vv = self.pair(self.v if v is None else v, pairing)
        scores = (q @ kk.transpose(-2, -1)) * (self.scale if scale is None else scale)  # (b, h, rows, Tk)
        mod = self.score_mod if score_mod is _SAME else score_mod
        if mod is not None:
            scores = mod(scores)
        if self.bias is not None:
            bias = self.bias[..., rows, :] if rows is not None and self.bias.shape[-2] > 1 else self.bias
            scores = scores + bias                                           # after score_mod, as a mask
        keep = self.keep(rows=rows) if keep is _SAME else keep
        probs = weights(scores, keep) if weights is not None else self.softmax(scores, keep, dim,
                                                                             self.head_sinks(sinks))
        return probs.to(vv.dtype) @ vv                                       # (b, h, rows, d)


def sq_diff(x: Any, y: Any) -> Any:
    """Elementwise squared difference, NaN matching NaN (0) and any other non-finite pair
    that is not equal counting as inf (a NaN where the other is finite is a mismatch)."""
    import torch
    both_nan = torch.isnan(x) & torch.isnan(y)
    diff = torch.where(x == y, torch.zeros_like(x), (x - y) ** 2)            # inf - inf: NaN
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    return torch.where(both_nan, torch.zeros_like(diff), diff)


def nearest_form(forms: list[Any], observed: Any) -> Any:
    """Of a mistake's forms (each (b, h, Tq, d); NaN on a row it leaves no key), the one the variant's
    output `observed` (b, h, Tq, d) is nearest, compared on every row: a form's row with no key
    stands for the code's convention there, so it matches an output row of zeros or NaN and is
    compared with the output as zeros elsewhere; a NaN where the other is finite is a mismatch.

    The forms are ranked by (rows that mismatch on NaN, squared distance), the first form kept on a
    tie. Comparing only the rows every form has a key on is no choice at all: the forms agree there
    (the document-range forms differ only on rows one of them empties), and which one came out
    nearer was the last bits of their arithmetic (issue 54: the flattened form won under
    ATEN_CPU_CAPABILITY=default by 9e-23 of 5e-12, and the cell was diagnosed `none`)."""
    import torch
    obs_nan = torch.isnan(observed).any(-1, keepdim=True)                      # (b, h, Tq, 1)

    def misfit(form: Any) -> tuple[int, float]:
        empty = torch.isnan(form).all(-1, keepdim=True)                        # (b, h, Tq, 1): no key
        conv = torch.where(empty & obs_nan, observed, torch.where(empty, torch.zeros_like(form), form))
        per_row = sq_diff(conv.detach(), observed).sum(-1)                     # (b, h, Tq)
        bad = ~torch.isfinite(per_row)
        return int(bad.sum()), float(per_row.masked_fill(bad, 0.0).sum())
    scores = [misfit(f) for f in forms]
    return forms[min(range(len(forms)), key=lambda i: (scores[i], i))]
