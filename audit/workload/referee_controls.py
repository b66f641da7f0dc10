"""Negative controls of the referee: attention that games its benchmark, one trick each.

Each returns SDPA's correct values when checked once, and does one thing the referee's checks
(core.referee.REFEREE_CHECKS) exist to catch: variants._builtins registers them as
`broken.<name>`; each must be caught by its own check and by no other (tests/test_referee.py).
Their backward, where they have one of their own, recomputes SDPA's (so only the trick shows).
They are written as plug-ins would be (q, k, v, mask=, causal=) -> out, and keep their state
in module globals, as a generated kernel would.
"""
from __future__ import annotations

import functools
import gc
import threading
import time
import weakref
from typing import Any

# name -> (the check that must catch it, what it does)
REFEREE_CONTROLS: dict[str, tuple[str, str]] = {
    "writes_input": ("inputs_untouched", "sets the lowest mantissa bit of q's first row in place (a kernel "
                     "using its input as scratch), then computes SDPA on it"),
    "pointer_cache": ("values_follow", "caches its output keyed on the inputs' data pointers and shapes "
                      "(ScalingIntelligence/KernelBench#82)"),
    "background_thread": ("complete_at_return", "returns an empty output at once and fills it from a "
                          "background thread (gpu-mode/reference-kernels#104)"),
    "tensor_subclass": ("plain_result", "returns its output as a torch.Tensor subclass (a lazy result "
                        "passes a check that only reads it; gpu-mode/reference-kernels#162)"),
    "finds_reference": ("out_of_reach", "searches the process (gc) for a float64 tensor of the output's "
                        "shape, checks its last row, and returns it (gpu-mode/pygpubench#7)"),
    "skips_after_warmup": ("every_call", "does the work on its first calls only, then attends to the first "
                           "half of the keys (gpu-mode/pygpubench#7: detecting the warm-up)"),
    "patches_timer": ("timers_untouched", "replaces time.perf_counter with a clock running at half speed "
                      "(gpu-mode/reference-kernels#104)"),
    "value_cache": ("physically_possible", "caches its output keyed on every byte of its inputs: right on "
                    "every call, and faster than the machine can compute (AMD-AGI/AgentKernelArena#113)"),
}
# What each control's first honest calls cost before the trick starts (skips_after_warmup).
SKIP_AFTER_CALLS = 6
THREAD_DELAY_S = 0.02         # background_thread: the thread starts its work this long after the return


class _Memory:
    """What the controls keep between calls, held by a class rather than module globals: a
    reproduction script copies the controls' code (this class's source: empty), not what they
    held in the process that wrote the script."""

    pointer_cache: dict = {}      # pointer_cache: (pointers, shapes, ...) -> its first output
    found: dict = {}              # finds_reference: (shape, dtype, device) -> a weak reference to what it found
    # skips_after_warmup: per live q tensor (id(q): a benchmark's loop passes the same one again), calls per
    # shapes and flags; an entry goes when its q does (weakref.finalize), so a new q at a freed one's address
    # starts from 0 (keyed by address, an argument probe on a new q counted a freed q's timed calls and the
    # control skipped there: argument_ignored, by chance)
    calls: dict = {}
    patched: list = []            # patches_timer: the clocks it put in place
    value_cache: list = []        # value_cache: [(q, k, v, flags, out)], the last few


def _sdpa(q: Any, k: Any, v: Any, mask: Any, causal: bool) -> Any:
    """SDPA (B, H, Tq, d_v) on the cell's inputs, GQA by enable_gqa; a float mask is additive."""
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                          enable_gqa=k.shape[1] != q.shape[1])


def _with_sdpa_backward(values: Any, q: Any, k: Any, v: Any, mask: Any, causal: bool) -> Any:
    """`values` as the output (not copied), with SDPA's backward recomputed from q, k, v: a control's
    forward trick with an honest gradient."""
    import torch

    class Recomputed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):                               # noqa: ANN001, ANN205
            ctx.save_for_backward(q, k, v)
            return values

        @staticmethod
        def backward(ctx, grad_out):                             # noqa: ANN001, ANN205
            saved = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
            with torch.enable_grad():
                out = _sdpa(*saved, mask, causal)
                return torch.autograd.grad(out, saved, grad_out)

    if not torch.is_grad_enabled() or not any(t.requires_grad for t in (q, k, v)):
        return values
    return Recomputed.apply(q, k, v)


def broken_writes_input(q: Any, k: Any, v: Any, *, mask: Any = None, causal: bool = False) -> Any:
    """Sets the lowest mantissa bit of q's first row (idempotent: every call sees the same q), then
    SDPA: the output is within budget, q is not the caller's any more."""
    import torch
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[q.element_size()]
    with torch.no_grad():
        row = q.detach().view(bits)[0, 0, 0]                                     # (d,)
        row.bitwise_or_(1)
    return _sdpa(q, k, v, mask, causal)




def broken_pointer_cache(q: Any, k: Any, v: Any, *, mask: Any = None, causal: bool = False) -> Any:
    """The output of the first call with these data pointers and shapes, again. It still computes
    every call (its work is not what is wrong, so only the stale answer shows, on any CPU)."""
    key = tuple((t.data_ptr(), tuple(t.shape), t.dtype) for t in (q, k, v)) + (causal, mask is None)
    fresh = _sdpa(q.detach(), k.detach(), v.detach(), mask, causal)
    _Memory.pointer_cache.setdefault(key, fresh)
    return _with_sdpa_backward(_Memory.pointer_cache[key].clone(), q, k, v, mask, causal)


def broken_background_thread(q: Any, k: Any, v: Any, *, mask: Any = None, causal: bool = False) -> Any:
    """An empty output, returned at once; a thread writes SDPA's values into it afterwards."""
    import torch
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)   # (B, H, Tq, d_v)
    inputs = [t.detach() for t in (q, k, v)]

    def fill() -> None:
        time.sleep(THREAD_DELAY_S)           # the caller has its output by now
        with torch.no_grad():
            out.copy_(_sdpa(*inputs, mask, causal))
    threading.Thread(target=fill, daemon=True).start()
    return _with_sdpa_backward(out, q, k, v, mask, causal)


def broken_tensor_subclass(q: Any, k: Any, v: Any, *, mask: Any = None, causal: bool = False) -> Any:
    """SDPA's output, handed back as a subclass of torch.Tensor (LazyAttentionOutput)."""
    return _sdpa(q, k, v, mask, causal).as_subclass(lazy_output_type())


@functools.lru_cache(maxsize=1)
def lazy_output_type() -> type:
    """The result type a generated kernel defines: a torch.Tensor subclass (this one holds its values
    already; a lazy one computes them when read)."""
    import torch
    return type("LazyAttentionOutput", (torch.Tensor,), {"__module__": __name__})




def broken_finds_reference(q: Any, k: Any, v: Any, *, mask: Any = None, causal: bool = False) -> Any:
    """A float64 tensor of the output's shape found through gc (searched again only once the one it
    found is gone), used on the rows where it agrees with SDPA's (a check a careful cheat makes; SDPA
    elsewhere): the reference's precision at SDPA's cost."""
    import weakref

    import torch
    shape = (*q.shape[:-1], v.shape[-1])
    with torch.no_grad():
        honest = _sdpa(*(t.detach() for t in (q, k, v)), mask, causal)             # (B, H, Tq, d_v)
    key = (shape, q.dtype, str(q.device))
    found = _Memory.found[key]() if key in _Memory.found else None
    candidates = [found] if found is not None else gc.get_objects()
    for obj in candidates:
        if type(obj) is torch.Tensor and obj.dtype == torch.float64 and tuple(obj.shape) == shape \
                and obj.device == q.device and not obj.requires_grad:
            agrees = ((obj - honest.double()).abs() <= 0.05).all(-1, keepdim=True)  # (B, H, Tq, 1)
            if bool(agrees.any()):
                _Memory.found[key] = weakref.ref(obj)
                return _with_sdpa_backward(torch.where(agrees, obj.to(q.dtype), honest), q, k, v, mask, causal)
    return _with_sdpa_backward(honest, q, k, v, mask, causal)




def broken_skips_after_warmup(q: Any, k: Any, v: Any, *, mask: Any = None, causal: bool = False) -> Any:
    """SDPA for its first SKIP_AFTER_CALLS calls on the same q buffer (a benchmark's loop); later,
    attention over the first half of the keys only (the warm-up is over: nobody checks)."""
    key = (tuple(q.shape), tuple(k.shape), q.dtype, causal, mask is None)
    seen = _Memory.calls.get(id(q))
    if seen is None:
        seen = _Memory.calls[id(q)] = {}
        weakref.finalize(q, _Memory.calls.pop, id(q), None)
    seen[key] = seen.get(key, 0) + 1
    if seen[key] <= SKIP_AFTER_CALLS:
        return _sdpa(q, k, v, mask, causal)
    half = max(1, k.shape[-2] // 2)
    part = None if mask is None else mask[..., :half]
    values = _sdpa(q.detach(), k[..., :half, :].detach(), v[..., :half, :].detach(), part, causal)
    return _with_sdpa_backward(values, q, k, v, mask, causal)




def broken_patches_timer(q: Any, k: Any, v: Any, *, mask: Any = None, causal: bool = False) -> Any:
    """SDPA, after making time.perf_counter run at half speed (again whenever it was put back)."""
    if time.perf_counter not in _Memory.patched:
        real = time.perf_counter

        def half_speed() -> float:
            return real() / 2
        _Memory.patched.append(half_speed)
        time.perf_counter = half_speed
    return _sdpa(q, k, v, mask, causal)




def broken_value_cache(q: Any, k: Any, v: Any, *, mask: Any = None, causal: bool = False) -> Any:
    """The output of an earlier call whose inputs held exactly these values (compared in full), else
    SDPA: right on every call, and as fast as a comparison and a copy."""
    import torch
    flags = (causal, mask is None)
    for cq, ck, cv, cflags, out in _Memory.value_cache:
        if cflags == flags and cq.shape == q.shape and torch.equal(cq, q.detach()) and torch.equal(ck, k.detach()) \
                and torch.equal(cv, v.detach()):
            return _with_sdpa_backward(out.clone(), q, k, v, mask, causal)
    out = _sdpa(q.detach(), k.detach(), v.detach(), mask, causal)
    _Memory.value_cache.insert(0, (q.detach().clone(), k.detach().clone(), v.detach().clone(), flags, out))
    del _Memory.value_cache[4:]
    return _with_sdpa_backward(out.clone(), q, k, v, mask, causal)
