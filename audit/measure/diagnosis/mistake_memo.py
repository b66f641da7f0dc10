"""Each known mistake's float64 output on an input set, computed once for every variant diagnosed there.

The diagnosis (measure.diagnosis.diagnosis, measure.diagnosis.lse_diagnosis) runs every registered mistake on the
cell's inputs in float64, and on the fully masked, padding and reported scenarios most variants of
an input set are diagnosed (every hand-written one gives NaN rows, say): the same mistakes on the
same inputs, once per variant. A mistake's output depends on the variant only where it fits
something to the variant's output (gqa_permuted fits the head pairing; fully_masked_uniform picks
the form nearer to it); every other one is a function of the input set. The memo, one per input
set and causal alignment (cellcache.Reference.memo), keeps those outputs.

Which mistakes read the variant's output is found out, not declared: a mistake's first run on an
input set gets an attempt whose `observed` and `observed_grads` are a stand-in that raises on any
use. One that runs through without touching it is kept; one that trips over it (or fails for any
reason) is run again on the real attempt, now and for every later cell, and never kept. A plug-in
mistake (`@mistake`) needs to declare nothing.
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Callable, Hashable

VARIANT_FIELDS = ("observed", "observed_grads")     # what an Attempt holds of the variant's results


class ReadsVariant(Exception):
    """A mistake read the variant's results: its output is the variant's, not the input set's."""


def _reads_variant(*args: Any, **kwargs: Any) -> Any:
    raise ReadsVariant("the mistake reads the variant's output")


class _Unread:
    """Stands in for the variant's results in a mistake's first run: any use raises ReadsVariant."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):               # introspection (copy, pickle, a script's embedder): none here
            raise AttributeError(name)
        raise ReadsVariant("the mistake reads the variant's output")

    __getitem__ = __bool__ = __len__ = __iter__ = __array__ = _reads_variant
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _reads_variant
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __abs__ = __pow__ = __matmul__ = _reads_variant
    __hash__ = None    # type: ignore[assignment]

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise ReadsVariant("the mistake reads the variant's output")


class MistakeMemo:
    """Mistakes' outputs on one input set by key (the stage, the mistake's name, its precision, the
    slices): run() computes each once, where it does not depend on the variant."""

    def __init__(self) -> None:
        self._outputs: dict[Hashable, Any] = {}
        self._fitted: set[Hashable] = set()          # keys whose mistake reads the variant's results
        self.hits = 0                               # outputs served from the memo (tests, profiling)

    def run(self, key: Hashable, fn: Callable[[Any], Any], attempt: Any) -> Any:
        """fn(attempt), computed once per key where it does not read the attempt's variant results."""
        if key in self._fitted:
            return fn(attempt)
        if key in self._outputs:
            self.hits += 1
            return self._outputs[key]
        blind = _blind(attempt)
        try:
            out = fn(blind)
        except Exception:  # noqa: BLE001 - it read the stand-in, or failed: the real attempt decides, every time
            self._fitted.add(key)
            return fn(attempt)
        self._outputs[key] = out
        return out


def _blind(attempt: Any) -> Any:
    """The attempt with the variant results it holds (VARIANT_FIELDS not None) replaced by the raising
    stand-in (a field that is None is None for every cell of the stage: nothing to read there)."""
    names = {f.name for f in fields(attempt)}
    stand_in = _Unread()            # made here, not a module global: a reproduction script copies this code
    held = {name: stand_in for name in VARIANT_FIELDS if name in names and getattr(attempt, name) is not None}
    return replace(attempt, **held) if held else attempt


def run(memo: MistakeMemo | None, key: Hashable, fn: Callable[[Any], Any], attempt: Any) -> Any:
    """fn(attempt) through the memo when there is one."""
    return fn(attempt) if memo is None else memo.run(key, fn, attempt)
