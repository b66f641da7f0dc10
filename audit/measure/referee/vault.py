"""What the audit holds while a variant runs (the out_of_reach check): the float64 goldens of the
cell are sealed (their bits scrambled in place and their dtype shown as int64) by a Vault, and a
decoy is planted instead: a float64 tensor of the output's shape within the error budget of the
golden but offset by a known random pattern. An output that follows the pattern was copied
from the decoy. Other variants' outputs are released when their cell ends.
"""
from __future__ import annotations

import contextlib
import math
import secrets
from typing import Any, Callable, Iterator


DECOY_SHARE = 0.25      # the decoy's offset: this share of the cell's error budget, per element
DECOY_CORRELATION = 0.5  # an output whose error correlates above this with the offset copied the decoy
DECOY_MIN_VALUES = 64    # fewer judged values than this: not judged


class Vault:
    """The cell's float64 results out of reach while the variant runs, and a decoy in their place.

    seal(): every float64 tensor of the cell's goldens has its bits XOR-ed in place with a key drawn
    for the cell and is shown as int64 (a search for float64 tensors of the output's shape does not
    find it; one that finds it reads noise); unseal() undoes both. Sealing costs one pass over the
    goldens' memory, twice per sealed stretch (the timed calls are one stretch). The decoy is a
    float64 tensor of the output's full shape: on the golden's slices the golden plus
    DECOY_SHARE × the error budget × a random sign per element, elsewhere 0.
    """

    def __init__(self, goldens: list[Any], out_shape: tuple[int, ...], slices: Any, budget: float) -> None:
        import torch
        self._tensors = _float64_tensors(goldens)
        self._key = secrets.randbits(62) | 1
        self.sealed = False
        self._out_shape, self._slices = tuple(out_shape), slices
        self.offset = DECOY_SHARE * budget if budget and math.isfinite(budget) and budget > 0 else 0.0
        self._signs: Any = None              # int8 (judged slices...) ±1: not a float64 tensor a search finds
        self.decoy: Any = None
        self._torch = torch

    def plant(self, golden_out: Any, planted: tuple | None = None) -> tuple:
        """Build the decoy from the golden's output (B|1, H|k, Tq, d) on its slices (call unsealed),
        or take `planted`, one built for the same input set and budget before; -> (decoy, signs),
        for the next cell of the input set to take."""
        if planted is not None:
            self.decoy, self._signs = planted
            return planted
        torch = self._torch
        gen = torch.Generator().manual_seed(secrets.randbits(31))
        signs = (torch.randint(0, 2, tuple(golden_out.shape), generator=gen, dtype=torch.int8) * 2 - 1)
        self._signs = signs.to(golden_out.device)
        offset = golden_out + self.offset * self._signs.double()                    # (…, Tq, d) float64
        decoy = torch.zeros(self._out_shape, dtype=torch.float64, device=golden_out.device)
        if self._slices is None:
            decoy.copy_(offset.expand(self._out_shape))
        else:
            for i, (b, h) in enumerate(self._slices):
                decoy[b, h] = offset[0, i]
        self.decoy = decoy
        return decoy, self._signs

    def seal(self) -> None:
        if self.sealed:
            return
        for storage_view in _storages(self._tensors):
            storage_view.bitwise_xor_(self._key)
        for t in self._tensors:
            _show_as(t, self._torch.int64)
        self.sealed = True

    def unseal(self) -> None:
        if not self.sealed:
            return
        for t in self._tensors:
            _show_as(t, self._torch.float64)
        for storage_view in _storages(self._tensors):
            storage_view.bitwise_xor_(self._key)
        self.sealed = False

    @contextlib.contextmanager
    def sealed_for(self) -> Iterator[None]:
        """Sealed for the block (already sealed: stays so, and the outer block unseals)."""
        if self.sealed:
            yield
            return
        self.seal()
        try:
            yield
        finally:
            self.unseal()

    def guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn, sealed while it runs: every call of the variant goes through this. Inside a sealed
        stretch (the timed calls) it costs one attribute read, not a context manager."""
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.sealed:
                return fn(*args, **kwargs)
            self.seal()
            try:
                return fn(*args, **kwargs)
            finally:
                self.unseal()
        guarded.__wrapped__ = fn               # type: ignore[attr-defined]
        return guarded

    def release(self) -> None:
        self.unseal()
        self.decoy = None

    def clear_of_decoy(self, out_slices: Any, golden_out: Any, rows: Any) -> tuple[bool | None, str]:
        """(whether the output's error does NOT follow the decoy's offset, what was seen): the
        correlation of out − golden with the offset's signs over the rows that see a key, at most
        DECOY_CORRELATION; None where there is no decoy or too little to judge."""
        torch = self._torch
        if self._signs is None or not self.offset:
            return None, "no decoy (no error budget to size its offset)"
        diff = out_slices.double() - golden_out                                   # (…, Tq, d)
        signs = self._signs.double().expand_as(diff)
        if rows is not None:
            keep = rows.expand(diff.shape[:-1])
            diff, signs = diff[keep], signs[keep]
        n = diff.numel()
        if n < DECOY_MIN_VALUES or not bool(torch.isfinite(diff).all()):
            return None, "too few finite values to judge"
        norm = float(diff.norm())
        corr = float((diff * signs).sum()) / (norm * math.sqrt(n)) if norm > 0 else 0.0
        return corr <= DECOY_CORRELATION, (f"the output's error correlates {corr:.2f} with the offset of the decoy "
                                         f"the audit planted (over {n} values; an honest kernel's: about "
                                         f"±{3 / math.sqrt(n):.2f}): it copied a reference found in the process")


def _float64_tensors(goldens: list[Any]) -> list[Any]:
    """Every float64 tensor held by the goldens (their fields and dict fields), once each."""
    import dataclasses

    import torch
    found: dict[int, Any] = {}
    for golden in goldens:
        if golden is None:
            continue
        values = [getattr(golden, f.name) for f in dataclasses.fields(golden)]
        for value in values:
            for t in (value.values() if isinstance(value, dict) else [value]):
                if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.numel():
                    found.setdefault(id(t), t)
    return list(found.values())


def _storages(tensors: list[Any]) -> list[Any]:
    """An int64 view of each distinct storage the tensors live in (XOR-ed once each)."""
    import torch
    seen: dict[int, Any] = {}
    for t in tensors:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in seen or storage.nbytes() % 8:
            continue
        raw = torch.empty(0, dtype=torch.uint8, device=t.device)
        raw.set_(storage)
        seen[ptr] = raw.view(torch.int64)
    return list(seen.values())


def _show_as(t: Any, dtype: Any) -> None:
    """Show a tensor as another dtype of the same element size, in place (its .data swapped)."""
    try:
        t.data = t.data.view(dtype)
    except RuntimeError:                      # a view torch will not retype: its bits stay scrambled
        pass
