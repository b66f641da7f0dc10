"""pytest-benchmark over the speed cells of the selected preset.

One benchmark per cell and phase, with stable, readable ids
(`sdpa-cpu-bf16-d64-T1024-B1-H8-causal-fwd`) so saved runs compare by name.
Inputs, warm-up and compilation happen before timing; on CUDA the timed
function synchronizes. `extra_info` carries the cell's axes, FLOPs, achieved
FLOP/s, peak memory and error, so one JSON file is a complete record
(`python -m audit report FILE.json` turns it into the audit's report).
"""
from __future__ import annotations

import pytest

from audit.core.errors import Unsupported, skip_platform_refusals
from audit.workload import variants
from audit.workload.variant_contract import BROKEN_PREFIX

from .conftest import selected_cases

pytestmark = pytest.mark.serial           # benchmarks: alone, not beside other tests (pytest-xdist turns them off)

PHASES = ("fwd", "fwd_bwd")


def speed_cases(config):
    """Cells that belong in speed comparisons: normal inputs, no negative controls."""
    return [c for c in selected_cases(config)
            if c.scenario == "normal" and not c.variant.startswith(BROKEN_PREFIX)]


def bench_id(case, phase: str) -> str:
    """The cell's id with the phase in place of the scenario (speed cells are all `normal`)."""
    return case.id.removesuffix(f"-{case.scenario}") + f"-{phase}"


def pytest_generate_tests(metafunc):
    if "speed_case" in metafunc.fixturenames:
        params = [(c, p) for c in speed_cases(metafunc.config) for p in PHASES]
        metafunc.parametrize("speed_case,phase", params, ids=[bench_id(c, p) for c, p in params])


@pytest.fixture(scope="module")
def builds():
    """Compiled code built once per cell, as a run does: a cell's fwd and fwd_bwd share it."""
    from audit.measure.cell.cellcache import BuildCache
    return BuildCache()


def _prepare(case, phase, builds):
    """Build the variant, its inputs and the timed callable; warm up (and compile) twice."""
    import torch

    from audit.workload.inputs import make_inputs

    variant = variants.resolve(case.variant)
    inputs = make_inputs(case)
    fn, _build = builds.get(variant, inputs)
    q, k, v = (t.detach().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    kwargs = inputs.call_kwargs()
    sync = torch.cuda.synchronize if case.device == "cuda" else (lambda: None)

    returns_lse = variant.returns_lse(case.device)

    def forward():
        out = fn(q, k, v, **kwargs)                                    # (B, H, T, d), or (out, lse)
        return out[0] if returns_lse else out

    def forward_backward():
        return torch.autograd.grad(forward(), (q, k, v), inputs.grad_out)

    body = forward if phase == "fwd" else forward_backward

    def timed():
        result = body()
        sync()
        return result

    refusal = variant.refusal(inputs.needs())
    if refusal is not None:
        pytest.skip(refusal)
    try:
        with skip_platform_refusals():     # torch refusing this machine's kind (core.errors.PLATFORM_REFUSALS)
            timed()
            timed()
    except Unsupported as exc:
        pytest.skip(str(exc))
    return timed, forward, inputs


def test_speed(benchmark, speed_case, phase, builds):
    if benchmark.disabled:
        pytest.skip("pytest-benchmark is disabled (--benchmark-disable, or pytest-xdist -n is active, "
                    "which turns it off): run without -n to benchmark")
    from audit.measure.machine.memory import peak_during
    from audit.measure.golden.numerics import BACKWARD_FLOP_FACTOR, attention_flops, error_vs_reference
    from audit.measure.golden.reference import golden_attention

    case = speed_case
    timed, forward, inputs = _prepare(case, phase, builds)
    flops = attention_flops(case.batch, case.heads, inputs.q.shape[-2], case.seq_len, case.d_k, case.causal)
    if phase == "fwd_bwd":
        flops = int(flops * (1 + BACKWARD_FLOP_FACTOR))
    out, peak = peak_during(timed, case.device)
    golden = golden_attention(inputs.q, inputs.k, inputs.v, causal=inputs.causal, visible=inputs.visible,
                              score_mod=inputs.score_mod)
    error = error_vs_reference(forward().detach(), golden.out, golden.row_visible)
    del out

    benchmark.group = f"{case.dtype}-d{case.d_k}-T{case.seq_len}-{phase}"
    benchmark.extra_info.update(case.axes())
    benchmark.extra_info.update(id=case.id, phase=phase, flops=flops, peak_bytes=peak,
                                rel_err=error["rel_err"], rmse=error["rmse"])
    benchmark(timed)
    median = benchmark.stats.stats.median
    benchmark.extra_info["gflops_per_s"] = flops / median / 1e9 if median > 0 else None
