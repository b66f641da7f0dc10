"""A CPU stand-in for a second device: catch host-made tensors that meet device data.

On CUDA, `torch.arange(n)` without `device=` lands on the CPU, and the first op that
combines it with a CUDA tensor raises "Expected all tensors to be on the same device".
On a CPU-only machine (CI) the same op succeeds, so the bug ships. HostProvenance is a
TorchFunctionMode that makes the mistake visible on the CPU:

- a factory call (arange, ones, zeros, empty, full, tensor, rand*, eye, ...) without a
  device, or with `device=None`, makes a *host-born* tensor, remembered with the line
  that made it;
- an op whose tensor inputs are all host-born makes a host-born tensor;
- `.to(device)`, `.cuda()`, a factory given a device, and a `*_like` factory of device
  data make device data, as does anything not made under the mode (the cell's inputs);
  `.cpu()` cannot be simulated (on the CPU it returns its input) and is left unmarked;
- an op that mixes a host-born tensor of more than one element (a 0-dim CPU tensor may
  meet CUDA tensors, so scalars are exempt) with device data raises HostMeetsDevice,
  naming the op and the line where the host tensor was made.
"""
from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

AUDIT_DIR = Path(__file__).resolve().parent.parent / "audit"

FACTORY_NAMES = ("arange", "ones", "zeros", "empty", "full", "tensor", "as_tensor", "rand", "randn",
                 "randint", "randperm", "eye", "linspace", "logspace", "empty_strided",
                 "tril_indices", "triu_indices", "scalar_tensor")
FACTORIES = {getattr(torch, name) for name in FACTORY_NAMES if hasattr(torch, name)}
MOVES = {"to", "cuda", "cpu"}


class HostMeetsDevice(AssertionError):
    """A tensor made without a device met device data: on a GPU this op would raise."""


def _call_site() -> str:
    """file:line of the innermost frame in audit/ (else the innermost non-torch frame)."""
    frames = traceback.extract_stack()[:-2]
    for frame in reversed(frames):
        if Path(frame.filename).resolve().is_relative_to(AUDIT_DIR):
            return f"audit/{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    for frame in reversed(frames):
        if "torch" not in frame.filename and "device_provenance" not in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return "unknown"


def _tensors(tree: Any, found: list | None = None) -> list:
    """The tensors in `tree`, through lists, tuples (named ones and torch.return_types too) and
    dicts, in order: what pytree's tree_flatten gives of an op's arguments and results, at a
    fraction of its cost (the mode sees every op of a cell: pytree was 60% of the sweep's time)."""
    found = [] if found is None else found
    if isinstance(tree, torch.Tensor):
        found.append(tree)
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            _tensors(item, found)
    elif isinstance(tree, dict):
        for item in tree.values():
            _tensors(item, found)
    return found


def _names_device(args: tuple, kwargs: dict) -> bool:
    """`.to(...)` arguments that choose a device (a str, torch.device, or another tensor)."""
    if kwargs.get("device") is not None:
        return True
    return any(isinstance(a, (str, torch.device, torch.Tensor)) for a in args[1:])


class HostProvenance(TorchFunctionMode):
    """Raise where a host-born tensor (factory without a device) meets device data."""

    def __init__(self) -> None:
        super().__init__()
        self.host: WeakIdKeyDictionary = WeakIdKeyDictionary()   # tensor -> where it was made
        self.violations: list[str] = []

    def _mark(self, out: Any, site: str) -> None:
        for t in _tensors(out):
            self.host[t] = site

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            out = func(*args, **kwargs)
            if kwargs.get("device") is None:
                self._mark(out, _call_site())
            return out
        if not self.host:          # no host-born tensor alive: none can meet device data, none is made
            return func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        tensors = _tensors((args, kwargs))
        host = [t for t in tensors if t in self.host]
        if name in MOVES and tensors and tensors[0] is args[0]:
            out = func(*args, **kwargs)
            if name == "cpu" or (name == "to" and not _names_device(args, kwargs)):
                if args[0] in self.host:            # a dtype-only .to keeps host data on the host
                    self._mark(out, self.host[args[0]])
            else:                                   # on the CPU a move may return its input itself
                self.host.pop(out, None)
            return out
        device_data = [t for t in tensors if t not in self.host]
        big_host = [t for t in host if t.dim() > 0 and t.numel() > 1]
        if big_host and device_data:
            where = self.host[big_host[0]]
            message = (f"{name}: a tensor made without a device (at {where}) meets device data; "
                       f"on CUDA this raises 'Expected all tensors to be on the same device'")
            self.violations.append(message)
            raise HostMeetsDevice(message)
        out = func(*args, **kwargs)
        if tensors and len(host) == len(tensors):
            self._mark(out, self.host[host[0]])
        return out
