"""The audit grid: a Case per cell, its axes, expansion and validation (presets: presets.py).

A Case holds primitives only ("bf16", never torch.bfloat16) so it is hashable,
serializable and importable without torch.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Iterable, Mapping, Sequence

DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16")
DEVICES: tuple[str, ...] = ("cpu", "cuda")

# Axes in the order they appear in ids, records and tables.
AXES: tuple[str, ...] = (
    "variant", "device", "dtype", "d_k", "seq_len", "batch", "heads", "causal", "scenario",
)
INT_AXES: tuple[str, ...] = ("d_k", "seq_len", "batch", "heads")
# Every axis but the variant: the cells sharing these share inputs and the float64 reference.
INPUT_AXES: tuple[str, ...] = tuple(a for a in AXES if a != "variant")


class UsageError(ValueError):
    """A bad value given by the user: reported as one line, exit code 2."""


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

    @property
    def id(self) -> str:
        """Stable, readable id, e.g. `sdpa-cpu-bf16-d64-T1024-B1-H8-causal-normal`."""
        mask = "causal" if self.causal else "full"
        return (f"{self.variant}-{self.device}-{self.dtype}-d{self.d_k}-T{self.seq_len}"
                f"-B{self.batch}-H{self.heads}-{mask}-{self.scenario}")

    @property
    def input_key(self) -> tuple:
        """Cells sharing this key share inputs and the float64 reference."""
        return tuple(getattr(self, a) for a in INPUT_AXES)

    def axes(self) -> dict[str, Any]:
        return asdict(self)

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
    unknown variants and scenarios (injected so plug-in loading stays in variants.py and the
    scenario table in inputs.py: grid imports neither). presets.preset_cases always checks
    scenarios.
    """
    out: dict[str, tuple] = {}
    for axis in AXES:
        values = list(axes.get(axis, ()))
        if not values:
            raise UsageError(f"--{axis.replace('_', '-')}: needs at least one value")
        if axis in INT_AXES:
            norm = [_parse_positive_int(axis, v) for v in values]
        elif axis == "causal":
            norm = [_parse_bool(v) for v in values]
        elif axis == "dtype":
            norm = [_choice("dtype", v, DTYPES) for v in values]
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


def expand(axes: Mapping[str, Sequence[Any]]) -> list[Case]:
    """Cross product of the axes, ordered so cells sharing inputs are adjacent.

    Variants vary fastest, so the inputs and float64 reference of one input set are
    built once and reused by every variant.
    """
    outer = [a for a in AXES if a != "variant"]
    cases = []
    for combo in itertools.product(*(axes[a] for a in outer)):
        values = dict(zip(outer, combo))
        for variant in axes["variant"]:
            cases.append(Case(variant=variant, **values))
    return cases
