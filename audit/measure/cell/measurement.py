"""Measure one cell, as a short sequence of named phases -> the record's measurement columns:

1. set-up: the variant's callable (compiled once per kind of cell: cellcache.BuildCache);
2. first calls: a warm-up forward (checked against the variant contract), the numerics forward
   (peak memory; its output is what the checks read) and a warm-up forward+backward;
3. numerics: the checks of the output (measure/checks/, stage "output");
4. gradients: the numerics forward+backward (peak memory; its gradients), then the checks of
   the gradients (stage "gradients");
5. timing: the timed samples of each pass;
6. derived columns: determinism, leaked memory, timing, FLOP/s, compiling, roofline, energy,
   then the checks that read the whole record (stage "record": saturation, diagnosis).

The cell's inputs and reference come from cellcache (built once per input set); runner
turns the columns, or the failure, into the cell's record. A new numerics check is a
function in measure/checks/ (registry.py: CHECK_ORDER), not a branch here.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.errors import BackwardUnsupported, skip_platform_refusals
from ...core.grid import Case
from ...core.timesplit import PhaseClock
from ...workload.inputs import Inputs
from ...workload.presets import Preset
from ...workload.compiling import compiled_graph_count, fused_attention_count, graph_break_count
from ...workload.variant_contract import Variant
from ..checks import gradients, lse, output, record
from ..checks.contract import check_output, split_out_lse
from ..checks.registry import CellState, run_checks
from ..golden.numerics import BACKWARD_FLOP_FACTOR, attention_flops
# The clocks through their modules, not names imported here: the referee pins them where they live
# (referee/timers.py: TIMER_OBJECTS), and a name imported here would be a copy it does not see.
from ..machine import cell_energy, cell_timing, compile_cache, timing
from ..machine.memory import held_bytes, peak_during
from ..machine.timing import Samples
from ..referee import physical, refereeing, tensors, timers
from ..referee.vault import Vault
from ..referee.verdicts import Verdicts
from .cellcache import BuildCache, Reference
from .repeats import Repeats, deterministic_algorithms_enabled

__all__ = ["CellSkipped", "LEAK_REPORT_BYTES", "input_grads", "measure_cell"]


# The families of checks run_checks runs: each module registers its checks as it is imported, and
# checks.registry.CHECK_ORDER orders them (a check not registered is an error there, not skipped).
CHECK_FAMILIES = (output, gradients, lse, record)


class CellSkipped(Exception):
    """A cell skipped by a documented rule (too slow for the device, say)."""


LEAK_REPORT_BYTES = 64 * 2**20      # held across the timed calls: recorded as leaked_bytes, and the
                                    # next cell gets a fresh process (the leak stays with the old one)


def input_grads(out: Any, leaves: tuple, grad_out: Any) -> tuple:
    """(dq, dk, dv): the backward of `out` with grad_out, read from the leaves' .grad.

    `out.backward()`, not `torch.autograd.grad(out, leaves)`: the latter refuses reentrant
    torch.utils.checkpoint ("incompatible with .grad() or passing an `inputs` parameter"),
    which memory-efficient attention code uses; custom autograd.Functions and non-leaf
    intermediates work either way. The .grad fields are cleared before and after, so nothing
    accumulates across calls and the inputs hold no gradient between them; a leaf the
    variant never used gets a zero gradient.
    """
    import torch
    for t in leaves:
        t.grad = None
    out.backward(grad_out)
    grads = tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves)
    for t in leaves:
        t.grad = None
    return grads


def _fill_timing(rec: dict[str, Any], prefix: str, samples: Samples) -> None:
    rec[f"{prefix}_ms"] = samples.median_s * 1e3
    rec[f"{prefix}_iqr_ms"] = samples.iqr_s * 1e3
    rec[f"{prefix}_n"] = samples.n
    rec[f"{prefix}_samples_s"] = samples.per_call_s
    rec[f"{prefix}_ci_rel"] = samples.ci_rel
    rec[f"{prefix}_extra_s"] = samples.extra_s


@dataclass
class _Cell(CellState):
    """The cell's state between its phases: the checks' CellState, and what the phases pass on."""

    phases: Any = None              # core.timesplit.PhaseClock
    sync: Any = None
    build: Any = None               # cellcache.Build
    n_timed: int = 0
    limit_s: float = math.inf
    repeats: Any = None             # repeats.Repeats
    backward_reason: str | None = None
    first_fwd: float = 0.0          # the first calls' seconds (a compile's included)
    first_fb: float = 0.0
    warm_fwd: float = 0.0           # the numerics calls' seconds: they size the timed blocks
    warm_fb: float = 0.0
    held_before_timing: int | None = None   # held_bytes() right before the timed calls
    counts_before: tuple = ()       # compiled graphs, graph breaks, fused SDPA, Inductor's cache
    compiled_here: bool = False
    cache_use: str | None = None
    fwd: Samples | None = None
    fb: Samples | None = None
    timer: dict | None = None
    last_lse: Any = None            # the lse of the last call, for a variant returning (out, lse)
    grad_out: Any = None            # (B, H, Tq, d_v) the cell's own copy of the upstream gradient
    pristine: dict | None = None    # the input set's tensors, untouched: what the cell's copies must still hold
    vault: Any = None               # referee.vault.Vault: the goldens sealed while the variant runs
    verdicts: Any = None            # referee.verdicts.Verdicts
    first_result: Any = None        # the warm-up forward's out, held for the referee (read again later)
    at_return: Any = None           # a copy of it taken as the call returned
    new_threads: list = field(default_factory=list)  # Python threads the first two forwards left running
    incomplete: bool = False        # complete_at_return failed: calls whose results are read at once settle first
    settle_s: float = timers.SETTLE_MIN_S    # how long work a call left running took to finish (twice that)
    threads_seen: set = field(default_factory=set)   # Python threads alive at the last wait (a pool's stay)
    returned_at: float = 0.0        # when the warm-up forward returned (perf_counter)
    fenced: dict | None = None      # CUDA: per-call seconds of each timed pass with a device-wide fence

    def forward(self) -> Any:
        """One call -> out (B, H, Tq, d_v); a variant returning (out, lse) leaves its lse in last_lse."""
        result = self.fn(self.q, self.k, self.v, **self.kwargs)
        if not self.variant.returns_lse(self.case.device):
            return result
        out, self.last_lse = split_out_lse(result, self.q)
        return out

    def leaves(self) -> tuple:
        """What the gradients are taken of: q, k, v, and the sinks in a sinks cell."""
        sinks = self.kwargs.get("sinks")
        return (self.q, self.k, self.v) + (() if sinks is None else (sinks,))

    def forward_backward(self) -> tuple:
        return input_grads(self.forward(), self.leaves(), self.grad_out)

    def settle_if_incomplete(self) -> None:
        """What a check calling the variant does after each call (checks.contract.forward_with)."""
        refereeing.settle_if_incomplete(self)

    def call_tensors(self) -> list:
        """(name, tensor) of everything the calls are handed: q, k, v, the keyword tensors, grad_out."""
        return tensors.call_tensors(self.q, self.k, self.v, self.kwargs, ("grad_out", self.grad_out))

    def release(self) -> None:
        """Drop what the cell's calls returned (another variant's outputs must not be reachable from
        the next cell's calls, even through a reference cycle) and unseal the goldens."""
        if self.vault is not None:
            self.vault.release()
        self.out = self.lse = self.grads = self.merged = self.first_result = self.last_lse = None
        self.lse_loss_grads = self.grad_evidence = None


@skip_platform_refusals()
def measure_cell(case: Case, variant: Variant, inputs: Inputs, ref: Reference,
                 preset: Preset, *, ceilings: dict | None = None, meter: Any = None,
                 builds: "BuildCache | None" = None, phases: PhaseClock | None = None) -> dict[str, Any]:
    """Measure one cell; return the measurement columns. Raises Unsupported/CellSkipped (torch's
    refusal of this machine as PlatformRefusal, an Unsupported: core.errors.PLATFORM_REFUSALS).

    ceilings: the run's measured limits for this device (roofline columns);
    meter: a energy.EnergyMeter for CUDA cells (energy and power columns);
    builds: the run's BuildCache (compiled code reused across cells of the same shapes);
    phases: where the cell's seconds per phase go (core.timesplit: the record's phase_s).
    """
    cell = _set_up(case, variant, inputs, ref, preset, builds, phases if phases is not None else PhaseClock())
    try:
        _first_calls(cell)
        run_checks("output", cell, cell.phases)
        _gradients(cell)
        refereeing.values_follow(cell)
        _timing(cell)
        _derived(cell, ceilings, meter)
        run_checks("record", cell, cell.phases)
        refereeing.timers_untouched(cell)
        cell.columns.update(cell.verdicts.columns())
        return cell.columns
    finally:
        refereeing.put_timers_back()               # a cell that raised (a refusal, an error) patched them too
        cell.release()


def _set_up(case: Case, variant: Variant, inputs: Inputs, ref: Reference, preset: Preset,
            builds: "BuildCache | None", phases: PhaseClock) -> _Cell:
    """The variant's callable, leaves that require grad, and the counters compiling moves."""
    timers.pin_timers()                         # before the variant is built (imported, compiled)
    with phases("setup"):
        fn, build = (builds or BuildCache()).get(variant, inputs)
        fn = _in_form(fn, variant, inputs, preset)
    counts_before = (compiled_graph_count() if variant.compiled else 0, graph_break_count(),
                     fused_attention_count() if variant.compiled else 0,
                     compile_cache.snapshot() if variant.compiled else None)
    # The cell's calls get copies of the input set's tensors (the referee compares them with the
    # originals after each pass, and a call that writes into its inputs cannot corrupt the next
    # variant's); the sinks are a leaf of their own (their gradient is checked).
    q, k, v = (tensors.own_copy(t, True) for t in (inputs.q, inputs.k, inputs.v))
    kwargs = {name: tensors.own_copy(t, name == "sinks") if refereeing.is_tensor(t) else t
              for name, t in inputs.call_kwargs(variant.forms).items()}
    vault = Vault([ref.golden, *ref.by_alignment.values(), ref.values_moved], (*q.shape[:-1], v.shape[-1]),
                  ref.slices, refereeing.error_budget(ref, case.dtype))
    ref.decoy = vault.plant(ref.golden.out, ref.decoy)
    cell = _Cell(case, variant, inputs, ref, preset, vault.guard(fn), q, k, v, kwargs)
    cell.paged_call = fn if "paged" in variant.forms else None
    if cell.paged_call is not None:
        cell.columns["page_size"] = fn.layout.page_size
    cell.grad_out = tensors.own_copy(inputs.grad_out, False)
    cell.pristine = dict(q=inputs.q, k=inputs.k, v=inputs.v, grad_out=inputs.grad_out,
                         **{name: t for name, t in inputs.call_kwargs(variant.forms).items()
                            if refereeing.is_tensor(t)})
    cell.vault, cell.verdicts = vault, Verdicts()
    cell.phases, cell.sync, cell.build, cell.counts_before = phases, timing.sync_for(case.device), build, counts_before
    cell.probe_memo = None if builds is None else builds.probe_memo
    cell.n_timed = preset.min_samples + 1  # timed samples plus the memory/numerics call
    cell.limit_s = math.inf if preset.max_cell_s is None else preset.max_cell_s
    cell.repeats = Repeats()
    cell.columns.update(q_len=q.shape[-2],
                        golden_subset=None if ref.slices is None else [list(p) for p in ref.slices])
    return cell


def _in_form(fn: Callable[..., Any], variant: Variant, inputs: Inputs, preset: Preset) -> Callable[..., Any]:
    """The variant's callable in the layout it declares for this cell: a "paged" variant behind
    varlen.PagedCall in a paged cell, its pages of the size it declares or the preset's
    (Unsupported in any other cell: it takes nothing but a cache)."""
    from ...core.errors import Unsupported
    from ...workload.varlen import PagedCall
    if "paged" not in variant.forms:
        return fn
    if inputs.paged is None:
        raise Unsupported(f"{variant.name} takes a paged KV cache (block table and pools): only the paged "
                          "scenario has one")
    return PagedCall(fn, inputs.paged.with_page_size(variant.page_size or preset.page_size))


def _first_calls(cell: _Cell) -> None:
    """Warm-up: one call of each pass; the numerics forward in between is the second, and its
    time sizes the timed blocks (the first compiles, allocates, builds plans). The first
    forward's output is checked against the variant contract before anything is measured.

    Every call runs on identical inputs: three runs of each output, compared bitwise
    (repeats.py) at no extra calls: out from the warm-up forward, the numerics forward and the
    warm-up forward+backward's own forward (a forward-only cell: a second warm-up forward); the
    gradients from the warm-up call, the numerics call and the last timed call."""
    phases, sync, m = cell.phases, cell.sync, cell.columns
    first_out: list = []

    def first_forward() -> None:
        threads = set(threading.enumerate())
        out = cell.forward()
        if refereeing.is_tensor(out):                 # as read at return (complete_at_return's), before anything else
            cell.at_return = out.detach().clone()
        first_out.append(out)
        cell.new_threads = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        cell.returned_at = timers.clock()

    with phases("warmup"):
        try:
            cell.first_fwd = timing.time_call(first_forward, sync=sync)
        except BackwardUnsupported as exc:  # forward-only here: inputs must not require grad
            cell.backward_reason = str(exc)
            cell.q, cell.k, cell.v = cell.q.detach(), cell.k.detach(), cell.v.detach()
            if "sinks" in cell.kwargs:
                cell.kwargs["sinks"] = cell.kwargs["sinks"].detach()
            cell.first_fwd = timing.time_call(first_forward, sync=sync)
    check_output(first_out[-1], cell.q, cell.v)
    cell.first_result = first_out[-1]
    refereeing.plain_result(cell, cell.first_result, "warm-up forward", [])
    first_out.pop()                         # held as cell.first_result until complete_at_return reads it again
    m["reason"] = cell.backward_reason and f"forward only: {cell.backward_reason}"
    with phases("numerics"):
        if cell.variant.backend is not None:
            m["sdpa_backend"] = cell.variant.backend(cell.q, cell.k, cell.v, mask=cell.inputs.mask,
                                                     causal=cell.inputs.causal)
        threads = set(threading.enumerate())
        (out, cell.warm_fwd), m["peak_bytes"] = peak_during(lambda: cell_timing.timed_result(cell.forward, sync),
                                                            cell.case.device)
        cell.new_threads += [t for t in threading.enumerate() if t not in threads and t.is_alive()]
    with phases("referee"):
        refereeing.plain_result(cell, out, "numerics forward", [cell.first_result])
        refereeing.complete_at_return(cell)
        refereeing.inputs_untouched(cell, "forward")
    cell.out = out.detach()                 # held for the checks and the diagnosis
    cell.lse = None if cell.last_lse is None else cell.last_lse.detach()
    with phases("referee"):
        refereeing.out_of_reach(cell)
    with phases("determinism"):
        cell.repeats.add("out", cell.out)
    if cell.warm_fwd * (1 + BACKWARD_FLOP_FACTOR) * cell.n_timed > cell.limit_s:
        raise CellSkipped(
            f"too slow for this device: one forward took {cell.warm_fwd:.3g} s, so this cell would "
            f"take about {cell.warm_fwd * (1 + BACKWARD_FLOP_FACTOR) * cell.n_timed:.0f} s "
            f"(limit {cell.preset.max_cell_s:g} s per cell, --max-cell-s)")

    def first_forward_backward() -> None:
        result = cell.forward()
        first_out.append(result.detach())
        first_out.append(input_grads(result, cell.leaves(), cell.grad_out))

    if cell.backward_reason is None:
        with phases("warmup"):
            cell.first_fb = timing.time_call(first_forward_backward, sync=sync)
        refereeing.settle_if_incomplete(cell)
        with phases("determinism"):
            cell.repeats.add_grads(first_out.pop())
            cell.repeats.add("out", first_out.pop())
    else:
        with phases("warmup"):
            timing.time_call(first_forward, sync=sync)
        refereeing.settle_if_incomplete(cell)
        with phases("determinism"):
            cell.repeats.add("out", first_out.pop())


def _gradients(cell: _Cell) -> None:
    """The numerics call of forward+backward (also the second of its warm-up: its time sizes the
    timed blocks), then the checks of its gradients; a forward-only cell has neither."""
    if cell.backward_reason is not None:
        return
    with cell.phases("numerics"):
        (cell.grads, cell.warm_fb), cell.columns["peak_fwd_bwd_bytes"] = peak_during(
            lambda: cell_timing.timed_result(cell.forward_backward, cell.sync), cell.case.device)
    with cell.phases("referee"):
        refereeing.inputs_untouched(cell, "backward")
    with cell.phases("determinism"):
        cell.repeats.add_grads(cell.grads)
    run_checks("gradients", cell, cell.phases)
    cell.grads = None


def _timing(cell: _Cell) -> None:
    """The timed samples of each pass, after the too-slow rule and the compile's bookkeeping. The
    third run the determinism check compares is the last timed call's gradients (held by
    reference: no copy, no call)."""
    if (cell.warm_fwd + cell.warm_fb) * cell.n_timed > cell.limit_s:
        raise CellSkipped(
            f"too slow for this device: one forward+backward took {cell.warm_fb:.3g} s, so this cell "
            f"would take about {(cell.warm_fwd + cell.warm_fb) * cell.n_timed:.0f} s "
            f"(limit {cell.preset.max_cell_s:g} s per cell, --max-cell-s)")
    variant = cell.variant
    graphs_before, _, fused_before, cache_before = cell.counts_before
    cell.compiled_here = variant.compiled and compiled_graph_count() > graphs_before
    cell.cache_use = compile_cache.outcome(cache_before) if cell.compiled_here and cache_before else None
    if variant.compiled and cell.build.fused is None:
        cell.build.fused = fused_attention_count() > fused_before
    last_grads: list = []
    last_out: list = [None]

    def timed_forward() -> Any:
        last_out[0] = out = cell.forward()         # a reference, not a copy: read after the timing
        return out

    def timed_forward_backward() -> None:
        last_grads[:] = [cell.forward_backward()]

    # Read here, not after the warm-up: the checks between (gradients, values_follow, mistakes)
    # build the audit's own float64 tensors, which are no leak of the variant's (on an H200 they
    # restarted the worker after broken.strides_ignored, and lost the compiled code with it).
    cell.held_before_timing = held_bytes(cell.case.device)
    with cell.phases("timed"), cell.vault.sealed_for():
        cell.fwd, cell.fb, cell.timer = cell_timing.time_cell(
            cell.case, cell.preset, timed_forward, timed_forward_backward if cell.backward_reason is None else None,
            cell.warm_fwd, cell.warm_fb)
    cell.fenced = cell.timer.pop("fenced_s", None)
    with cell.phases("referee"):
        refereeing.inputs_untouched(cell, "timed calls")
        refereeing.every_call(cell, last_out[0], last_grads[0] if last_grads else None)
        if cell.fenced:
            refereeing.stream_gap(cell)
    with cell.phases("determinism"):
        if last_grads and not cell.verdicts.failed("every_call"):   # skipped work is not nondeterminism
            cell.repeats.add_grads(last_grads.pop())
        cell.columns.update(cell.repeats.columns(), deterministic_algorithms=deterministic_algorithms_enabled())
        cell.repeats.release()


def _derived(cell: _Cell, ceilings: dict | None, meter: Any) -> None:
    """Columns computed from what the phases measured: leaked memory, timing, FLOP/s, compiling,
    graph breaks, the golden's saturation, roofline and energy."""
    m, case, variant, fwd, fb = cell.columns, cell.case, cell.variant, cell.fwd, cell.fb
    held_after_timing = held_bytes(case.device)
    if cell.held_before_timing is not None and held_after_timing is not None \
            and held_after_timing - cell.held_before_timing > LEAK_REPORT_BYTES:
        m["leaked_bytes"] = held_after_timing - cell.held_before_timing
    _fill_timing(m, "fwd", fwd)
    if fb is not None:
        _fill_timing(m, "fwd_bwd", fb)
    m.update(cell.timer)
    m["fwd_host_ms"] = None if fwd.host_median_s is None else fwd.host_median_s * 1e3
    m["fwd_bwd_host_ms"] = None if fb is None or fb.host_median_s is None else fb.host_median_s * 1e3
    timed_on_device = [s for s in (fwd, fb) if s is not None and s.host_median_s is not None]
    if timed_on_device:
        m["host_bound"] = any(s.host_median_s > s.median_s for s in timed_on_device)
    tq, tk = cell.q.shape[-2], cell.k.shape[-2]
    pairs = work_pairs(cell)
    flops = attention_flops(case.batch, case.heads, tq, tk, case.d_k, case.causal, d_v=case.effective_d_v,
                            pairs=pairs)   # per query head
    m["flops"] = flops
    m["gflops_per_s"] = flops / fwd.median_s / 1e9
    if fb is not None:
        m["fwd_bwd_gflops_per_s"] = flops * (1 + BACKWARD_FLOP_FACTOR) / fb.median_s / 1e9
    if variant.compiled:
        m["compile_reused"] = not cell.compiled_here
        if cell.compiled_here:
            m["compile_s"] = (max(0.0, cell.first_fwd - fwd.median_s)
                              + (max(0.0, cell.first_fb - fb.median_s) if fb else 0.0))
            m["compile_cache"] = cell.cache_use
            cell.phases.move(m["compile_s"], "warmup", "compile")
        m["fused_sdpa"] = cell.build.fused
    # Graph breaks: the code between the pieces ran eagerly. Counted over the whole cell (warm-up,
    # leak probes, timing: a recompile there counts too) and kept on the build, so a cell that
    # reuses compiled code reports the breaks of the compile it reuses.
    breaks = max(0, graph_break_count() - cell.counts_before[1])
    if variant.compiled:
        cell.build.graph_breaks = (cell.build.graph_breaks or 0) + breaks
        m["graph_breaks"] = cell.build.graph_breaks
    elif breaks:                  # a plug-in that compiles inside
        m["graph_breaks"] = breaks
    golden = cell.golden
    for key in ("max_logit", "max_qk"):
        m[key] = golden.saturation[key]
    m["golden_onehot_frac"] = golden.saturation["onehot_frac"]
    from ..machine.roofline import roofline_columns
    m.update(roofline_columns(case, tq, cell.inputs, fwd, fb, ceilings, pairs))
    with cell.phases("referee"):
        refereeing.physically_possible(cell, ceilings)
    with cell.phases("energy"), cell.vault.sealed_for():      # the goldens out of reach, as in the timed calls
        m.update(cell_energy.telemetry(case, cell.forward, fwd, cell.sync, meter, cell.preset))
    if variant.probs is None:       # no weights of its own: the golden's saturation
        m.update({key: golden.saturation[key] for key in ("max_prob", "entropy", "min_entropy", "onehot_frac")})
        m["saturation_source"] = "golden"


def work_pairs(cell: "_Cell") -> int | None:
    """The visible (query, key) pairs summed over batch and heads where the scenario's visibility is
    the work (inputs.Scenario.work_is_visible: packed documents), else None (the causal or full count)."""
    from ...workload.inputs import SCENARIOS
    if not SCENARIOS[cell.case.scenario].work_is_visible:
        return None
    return physical.visible_pairs(cell.inputs, cell.ref.alignment)
