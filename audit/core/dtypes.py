"""The dtypes a cell's inputs may take: one record each (Dtype), in one ordered registry, widest to
narrowest. Everything that depends on a dtype reads its record: the grid's and the command line's
choices, torch's dtype, the element size (roofline bytes, the memory model), the error budget
(numerics.budget_bound), the rounding floors of `compare` and of the model audit, the kernels a
cost-model prediction expects to take it, the dtype a kernel may upcast to (the compute ceiling), the
model audit's default dtypes and the plots' styles. An unknown name raises UsageError naming it and the
registered ones: nothing falls back to fp32.

No torch here (core is torch-free): a record names torch's dtype by its attribute (`torch_name`),
which workload.draws.torch_dtype resolves. Adding a dtype: docs/extending.md, Adding a dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class Dtype:
    """One input dtype and every rule that depends on it."""

    name: str               # as on the command line, in cell ids and in records: "bf16"
    torch_name: str         # torch's attribute for it: getattr(torch, "bfloat16")
    bytes: int              # bytes per element: the roofline's byte counts, the memory model
    unit_roundoff: float    # u: rounding a value to the dtype alone moves it by at most u relative
    budget_factor: float    # the error budget: err <= budget_factor * err(baseline) + atol
    atol: float             # ... its absolute term (numerics.budget_bound)
    baseline: str           # the dtype the same-dtype baseline (hand-written attention) computes in: its own
    upcast: str             # the dtype a kernel on it may compute in: that dtype's matmul rate bounds it too
    fused_kernels: bool     # the fused half-precision kernels take it (SDPA's flash and cuDNN backends)
    model_audit: bool       # `audit model` (and a run's model audit) runs it by default
    color: str              # the plots' colour (a matplotlib name) ...
    marker: str             # ... marker ...
    line: str               # ... and line style, so lines that coincide stay told apart
    scaled: bool = False    # needs per-tensor scales (FP8): register() refuses one until inputs carry scales

    @property
    def epsilon(self) -> float:
        """The machine epsilon: the gap between 1 and the next value, 2u."""
        return 2.0 * self.unit_roundoff


# The registry, widest to narrowest (the order of tables, figures and the command line's help).
_REGISTRY: dict[str, Dtype] = {}


def register(dtype: Dtype) -> Dtype:
    """Add a dtype at the narrow end of the registry. UsageError when its name is taken, its upcast
    dtype is neither itself nor registered, or it asks for what the measurement does not do yet: per-tensor
    scales (scaled) or a baseline in another dtype (the same-dtype baseline, measure/cellcache.py, runs on
    the cell's own inputs)."""
    if dtype.name in _REGISTRY:
        raise UsageError(f"dtype {dtype.name!r} is registered already")
    if dtype.upcast != dtype.name and dtype.upcast not in _REGISTRY:
        raise UsageError(f"dtype {dtype.name!r}: its upcast dtype {dtype.upcast!r} is not registered; "
                         f"registered: {', '.join(_REGISTRY)}")
    if dtype.scaled:
        raise UsageError(f"dtype {dtype.name!r} is scaled: the audit draws no per-tensor scales yet")
    if dtype.baseline != dtype.name:
        raise UsageError(f"dtype {dtype.name!r}: a baseline in {dtype.baseline!r} is not measured yet (the "
                         "baseline computes in the cell's own dtype)")
    _REGISTRY[dtype.name] = dtype
    return dtype


def unregister(name: str) -> None:
    """Remove a registered dtype (the tests' temporary ones)."""
    dtype_spec(name)
    del _REGISTRY[name]


def dtype_spec(name: str) -> Dtype:
    """The record of a registered dtype; UsageError naming the value and the registered ones."""
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None:
        raise UsageError(f"unknown dtype {name!r}; allowed: {', '.join(_REGISTRY)} (audit/core/dtypes.py)")
    return spec


def dtype_names() -> tuple[str, ...]:
    """Every registered dtype, widest to narrowest."""
    return tuple(_REGISTRY)


def widest_dtype() -> str:
    """The widest registered dtype (the most precise: a diagnosis against float64 is sharpest there)."""
    return next(iter(_REGISTRY))


def model_dtypes() -> tuple[str, ...]:
    """The dtypes the model audit runs by default, widest to narrowest."""
    return tuple(name for name, spec in _REGISTRY.items() if spec.model_audit)


def fused_kernel_dtypes() -> tuple[str, ...]:
    """The dtypes the fused half-precision kernels (flash, cuDNN) take, widest to narrowest."""
    return tuple(name for name, spec in _REGISTRY.items() if spec.fused_kernels)


def by_torch_name(torch_name: str) -> Dtype | None:
    """The registered dtype torch calls `torch_name` ("bfloat16"), or None (float64, say)."""
    return next((spec for spec in _REGISTRY.values() if spec.torch_name == torch_name), None)


def listed(names: tuple[str, ...], last: str = "or") -> str:
    """Names as prose: "fp32, fp16 or bf16"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


# The error budget's atol per dtype is FlashAttention's rule (docs/numerics.md). The unit roundoffs
# are IEEE binary32 (24-bit significand), bfloat16 (8) and binary16 (11).
register(Dtype("fp32", "float32", 4, 2.0 ** -24, budget_factor=2.0, atol=1e-6, baseline="fp32", upcast="fp32",
               fused_kernels=False, model_audit=True, color="tab:blue", marker="o", line="-"))
register(Dtype("fp16", "float16", 2, 2.0 ** -11, budget_factor=2.0, atol=1e-4, baseline="fp16", upcast="fp32",
               fused_kernels=True, model_audit=False, color="tab:orange", marker="s", line="--"))
register(Dtype("bf16", "bfloat16", 2, 2.0 ** -8, budget_factor=2.0, atol=1e-3, baseline="bf16", upcast="fp32",
               fused_kernels=True, model_audit=True, color="tab:green", marker="^", line=":"))
