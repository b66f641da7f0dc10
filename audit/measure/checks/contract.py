"""The variant contract, as the cell's calls and the checks read it: what a call must return (a
tensor of the output's shape, dtype and device; the lse's, for a variant returning one), and the
checks' own calls of the variant (the probes: the same grad mode and requires_grad as the timed
calls, so compiled code is reused)."""
from __future__ import annotations

from typing import Any, Callable

from ...core.dtypes import by_torch_name
from ..cell.failures import ContractError
from .registry import CellState


def forward_with(cell: CellState) -> Callable[[Any, Any], Any]:
    """(k', v') -> the variant's detached output on (q, k', v') with the cell's keyword arguments,
    in the timed calls' grad mode and requires_grad, so compiled code is reused: the leak check's
    probes and the diagnosis's (measure.diagnosis.diagnosis.diagnose_probes)."""
    grad = cell.q.requires_grad

    def call(k2: Any, v2: Any) -> Any:
        # copies: the probes are the input set's, shared by its variants (a call may write into its inputs)
        out = out_of(cell, cell.fn(cell.q, k2.detach().clone().requires_grad_(grad),
                                   v2.detach().clone().requires_grad_(grad), **cell.kwargs)).detach()
        cell.settle_if_incomplete()         # a variant the referee found incomplete: its work, first
        return out
    return call


def call_with(cell: CellState) -> Callable[..., Any]:
    """(kwargs, kv=None) -> the variant's detached result ((out, lse) for a variant returning its lse)
    on the cell's q and copies of k and v (of kv's (k', v') when given) with these keyword arguments,
    in the timed calls' grad mode (the argument probes: measure/checks/arguments.py)."""
    grad = cell.q.requires_grad

    def call(kwargs: dict, kv: Any = None) -> Any:
        k, v = (cell.k, cell.v) if kv is None else kv
        result = cell.fn(cell.q, k.detach().clone().requires_grad_(grad),
                         v.detach().clone().requires_grad_(grad), **kwargs)
        cell.settle_if_incomplete()
        if cell.variant.returns_lse(cell.case.device):
            out, lse = split_out_lse(result, cell.q)
            return out.detach(), lse.detach()
        return result.detach()
    return call


def split_out_lse(result: Any, q: Any) -> tuple[Any, Any]:
    """A variant declared to return (out, lse): the pair, its lse checked against the contract
    ((B, H, Tq) floating, on q's device); ContractError otherwise."""
    import torch
    if not isinstance(result, (tuple, list)) or len(result) < 2:
        raise ContractError(f"the variant declares it returns (out, lse) but returned {type(result).__name__}; "
                            "expected a pair (docs/variants.md: returns)")
    out, lse = result[0], result[1]
    want = f"the lse as a floating tensor of shape {tuple(q.shape[:-1])} on {q.device}"
    if not isinstance(lse, torch.Tensor):
        raise ContractError(f"the variant returned {type(lse).__name__} as its lse; expected {want}")
    if tuple(lse.shape) != tuple(q.shape[:-1]) or not lse.is_floating_point() or lse.device != q.device:
        raise ContractError(f"the variant returned an lse of shape {tuple(lse.shape)}, dtype "
                            f"{_dtype_name(lse.dtype)}, on {lse.device}; expected {want}")
    return out, lse


def out_of(cell: CellState, result: Any) -> Any:
    """A call's out: the first of (out, lse) for a variant returning its lse, else the result."""
    return split_out_lse(result, cell.q)[0] if cell.variant.returns_lse(cell.case.device) else result


def check_output(out: Any, q: Any, v: Any) -> None:
    """The variant contract: a tensor of shape (B, H, Tq, d_v), q's dtype, on q's device."""
    import torch
    expected = (*q.shape[:-1], v.shape[-1])
    want = f"a tensor of shape {tuple(expected)}, dtype {_dtype_name(q.dtype)}, on {q.device}"
    if not isinstance(out, torch.Tensor):
        raise ContractError(f"the variant returned {type(out).__name__}"
                            f"{'' if out is None else ' ' + repr(out)[:60]}; expected {want}")
    problems = []
    if tuple(out.shape) != tuple(expected):
        problems.append(f"shape {tuple(out.shape)}")
    if out.dtype != q.dtype:
        problems.append(f"dtype {_dtype_name(out.dtype)}")
    if out.device != q.device:
        problems.append(f"device {out.device}")
    if problems:
        raise ContractError(f"the variant returned a tensor of {', '.join(problems)}; expected {want}")


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    spec = by_torch_name(name)                  # a registered dtype by its short name, another by torch's
    return name if spec is None else spec.name
