"""The audit grid: a Case per cell, its axes, expansion and validation (presets: presets.py).

A Case holds primitives only ("bf16", never torch.bfloat16) so it is hashable,
serializable and importable without torch.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, Callable, Iterable, Mapping, Sequence

from .dtypes import dtype_names
from .errors import UsageError

DEVICES: tuple[str, ...] = ("cpu", "cuda")

# Axes in the order they appear in ids, records and tables.
AXES: tuple[str, ...] = (
    "variant", "device", "dtype", "d_k", "d_v", "seq_len", "batch", "heads", "kv_heads", "causal", "scenario",
)
INT_AXES: tuple[str, ...] = ("d_k", "d_v", "seq_len", "batch", "heads", "kv_heads")
# Axes a sub-grid or a command line may leave out, and what they then are: kv_heads
# left out (None) equals heads, plain multi-head attention; d_v left out equals d_k.
OPTIONAL_AXES: dict[str, tuple] = {"d_v": (None,), "kv_heads": (None,)}
# The optional axes' defaults: the axis a None follows (a Case normalises a value equal to it to None).
FOLLOWS: dict[str, str] = {"d_v": "d_k", "kv_heads": "heads"}
# Every axis but the variant: the cells sharing these share inputs and the float64 reference.
INPUT_AXES: tuple[str, ...] = tuple(a for a in AXES if a != "variant")


@dataclass(frozen=True, order=True)
class Case:
    """One cell of the grid. Its fields are the record's axis columns."""

    variant: str
    device: str
    dtype: str
    d_k: int
    seq_len: int
    batch: int
    heads: int
    causal: bool
    scenario: str = "normal"
    # Key/value heads when fewer than heads (GQA: heads a multiple of it; MQA: 1). None (also
    # what kv_heads == heads becomes) is multi-head attention, so kv_heads follows heads when
    # heads changes. Last, with a default: a Case built positionally is the same cell as before.
    kv_heads: int | None = None
    # The value head dimension when it differs from d_k (latent attention: DeepSeek's MLA has
    # d_k 192 with d_v 128). None (also what d_v == d_k becomes) follows d_k.
    d_v: int | None = None

    def __post_init__(self) -> None:
        if self.d_v is not None and self.d_v == self.d_k:
            object.__setattr__(self, "d_v", None)
        if self.kv_heads is None:
            return
        if self.kv_heads <= 0 or self.heads % self.kv_heads:
            raise UsageError(f"--kv-heads: {self.kv_heads} does not divide --heads {self.heads}; "
                             "heads must be a multiple of kv_heads (1 <= kv_heads <= heads)")
        if self.kv_heads == self.heads:
            object.__setattr__(self, "kv_heads", None)

    @property
    def effective_kv_heads(self) -> int:
        """The number of key/value heads: kv_heads, or heads for multi-head attention."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def effective_d_v(self) -> int:
        """The value head dimension: d_v, or d_k when they are equal."""
        return self.d_k if self.d_v is None else self.d_v

    @property
    def latent(self) -> bool:
        """True when values have another head dimension than queries and keys (d_v != d_k)."""
        return self.d_v is not None

    @property
    def gqa(self) -> bool:
        """True when keys and values have fewer heads than queries (GQA or MQA)."""
        return self.kv_heads is not None

    @cached_property
    def id(self) -> str:
        """Stable, readable id, e.g. `sdpa-cpu-bf16-d64-T1024-B1-H8-causal-normal`; a GQA cell
        adds its key/value heads after H (`-H16-KV4-`), a cell with d_v != d_k its value head
        dimension after d (`-d192v128-`), so every other id is unchanged."""
        mask = "causal" if self.causal else "full"
        kv = f"-KV{self.kv_heads}" if self.gqa else ""
        dv = f"v{self.d_v}" if self.latent else ""
        return (f"{self.variant}-{self.device}-{self.dtype}-d{self.d_k}{dv}-T{self.seq_len}"
                f"-B{self.batch}-H{self.heads}{kv}-{mask}-{self.scenario}")

    @cached_property
    def input_key(self) -> tuple:
        """Cells sharing this key share inputs and the float64 reference. An optional axis enters
        only when it differs from the axis it follows, so the other cells keep the key (and seed)
        they always had. (This and id are kept on the cell once read, as its fields never change:
        a plan reads them some 80,000 times on the cpu preset.)"""
        return tuple(getattr(self, a) for a in INPUT_AXES if a not in OPTIONAL_AXES or getattr(self, a) is not None)

    def axes(self) -> dict[str, Any]:
        """The axis values in AXES order (the record's axis columns; an optional axis always a number)."""
        return {a: self.effective(a) for a in AXES}

    def effective(self, axis: str) -> Any:
        """An axis's value, an optional axis left at None read as the axis it follows."""
        value = getattr(self, axis)
        return getattr(self, FOLLOWS[axis]) if value is None and axis in FOLLOWS else value

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> "Case":
        return cls(**{f.name: m[f.name] for f in fields(cls) if f.name in m})


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", "causal"):
        return True
    if text in ("0", "false", "no", "off", "full"):
        return False
    raise UsageError(f"--causal: {value!r} is not a boolean (use true/false)")


def _parse_positive_int(axis: str, value: Any) -> int:
    flag = "--" + axis.replace("_", "-")
    if isinstance(value, bool):
        raise UsageError(f"{flag}: {value!r} is not a positive integer")
    try:
        number = int(str(value), 10) if not isinstance(value, int) else value
    except ValueError:
        raise UsageError(f"{flag}: {value!r} is not a positive integer") from None
    if number <= 0:
        raise UsageError(f"{flag}: {value!r} is not a positive integer")
    return number


def _choice(axis: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise UsageError(f"--{axis}: unknown {axis} {value!r}; allowed: {', '.join(allowed)}")
    return value


def validate_axes(axes: Mapping[str, Iterable[Any]], *, known_variant: Callable[[str], None] | None = None,
                  known_scenario: Callable[[str], None] | None = None) -> dict[str, tuple]:
    """Check and normalise every axis value; raise UsageError naming the bad one.

    `known_variant(name) -> None` and `known_scenario(name) -> None` raise UsageError for
    unknown variants and scenarios (injected so plug-in loading stays in workload (variants.py, plugins.py) and the
    scenario table in inputs.py: grid imports neither). presets.preset_cases always checks
    scenarios.
    """
    out: dict[str, tuple] = {}
    for axis in AXES:
        values = list(axes.get(axis, OPTIONAL_AXES.get(axis, ())))
        if not values:
            raise UsageError(f"--{axis.replace('_', '-')}: needs at least one value")
        if axis in INT_AXES:   # an optional axis's None (its default) stays None
            norm = [None if v is None and axis in OPTIONAL_AXES else _parse_positive_int(axis, v)
                    for v in values]
        elif axis == "causal":
            norm = [_parse_bool(v) for v in values]
        elif axis == "dtype":
            norm = [_choice("dtype", v, dtype_names()) for v in values]   # the registry (core/dtypes.py)
        elif axis == "device":
            norm = [_choice("device", v, DEVICES) for v in values]
        else:  # variant, scenario: names checked by the injected validator
            norm = [str(v) for v in values]
            check = known_variant if axis == "variant" else known_scenario
            if check is not None:
                for name in norm:
                    check(name)
        out[axis] = tuple(dict.fromkeys(norm))  # dedupe, keep order
    return out


def sub_grid_values(sub: Mapping[str, tuple], axis: str) -> tuple:
    """A sub-grid's values of an axis (an optional axis it leaves out takes its default)."""
    return tuple(sub[axis]) if axis in sub else OPTIONAL_AXES[axis]


def expand(axes: Mapping[str, Sequence[Any]]) -> list[Case]:
    """Cross product of the axes, ordered so cells sharing inputs are adjacent.

    Variants vary fastest, so the inputs and float64 reference of one input set are
    built once and reused by every variant. A kv_heads that does not divide heads raises
    UsageError (Case) naming both.
    """
    outer = [a for a in AXES if a != "variant"]
    cases = []
    for combo in itertools.product(*(sub_grid_values(axes, a) for a in outer)):
        values = dict(zip(outer, combo))
        for variant in axes["variant"]:
            cases.append(Case(variant=variant, **values))
    return cases
