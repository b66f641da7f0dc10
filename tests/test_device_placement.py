"""Tensors made without a device must never meet device data (CI has no GPU to catch it).

The H200 run lost every causal cell with a mask for the hand-written variants: the
runner called `visibility` without `device`, so a CPU arange met a CUDA mask. These
tests run the measuring code on the CPU under HostProvenance, which raises wherever
that would have happened on a GPU.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from audit.core import grid
from audit.execute import runner
from audit.measure.cell import cellcache
from audit.measure.golden.reference import visibility
from audit.workload import presets
from audit.workload.inputs import SCENARIOS

from tests.device_provenance import HostMeetsDevice, HostProvenance


# --------------------------------------------------------------------------- the detector itself

def test_a_host_arange_meeting_device_data_is_caught():
    data = torch.randn(4, 3).to(device="cpu")                      # device data
    with HostProvenance() as mode, pytest.raises(HostMeetsDevice, match="arange"):
        data + torch.arange(3)[None, :]
    assert len(mode.violations) == 1
    assert "test_device_placement.py" in mode.violations[0]


def test_a_factory_given_the_data_device_is_fine():
    data = torch.randn(4, 3)
    with HostProvenance() as mode:
        out = data + torch.arange(3, device=data.device)[None, :]
        out = out * torch.tensor(2.0)                                # 0-dim CPU tensors may meet CUDA
        out = out.masked_fill(torch.ones_like(out, dtype=torch.bool), 0.0)
        host_only = torch.arange(3) + torch.ones(3)                  # host meets host: fine
        moved = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)).to(data.device)
        out = out + moved
    assert mode.violations == []
    assert host_only.shape == (3,)


def test_host_mark_survives_dtype_only_casts_and_views():
    data = torch.randn(2, 3)
    with HostProvenance(), pytest.raises(HostMeetsDevice):
        data * torch.arange(3).double().float()[None, :].expand(2, 3)


def test_the_h200_bug_is_caught_when_put_back():
    """visibility() with device=None, as runner.py called it, meets a device mask."""
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool).to("cpu")
    with HostProvenance(), pytest.raises(HostMeetsDevice, match="reference.py"):
        visibility(4, 4, 0, 4, causal=True, visible=mask, device=None)
    with HostProvenance() as mode:
        visibility(4, 4, 0, 4, causal=True, visible=mask, device=mask.device)
    assert mode.violations == []


# --------------------------------------------------------------------------- the measuring code

TINY = presets.Preset(name="tiny", description="device-placement sweep", grids=(),
                      min_samples=1, min_time_s=0.0, max_cell_s=60.0, energy_window_s=0.0)
HAND_WRITTEN_AND_SDPA = ("eager", "eager_fp32", "sdpa", "sdpa_math", "broken.clamped",
                         "broken.mask_after_softmax", "broken.unscaled")


def _sweep_cases(scenarios, causal_values=(False, True)):
    axes = dict(variant=HAND_WRITTEN_AND_SDPA, device=("cpu",), dtype=("fp32",), d_k=(8,),
                seq_len=(16,), batch=(2,), heads=(2,), causal=causal_values, scenario=scenarios)
    return grid.expand(grid.validate_axes(axes))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_scenario_measures_without_host_tensors_meeting_device_data(scenario):
    """Inputs, golden, baseline, leak probes, numerics and timing of every hand-written and
    SDPA variant, causal and not: no factory call without a device meets device data."""
    cache = cellcache.InputCache()
    with HostProvenance() as mode:
        recs = [runner.run_cell(case, cache, TINY, {}) for case in _sweep_cases((scenario,))]
    assert mode.violations == []
    bad = {r["id"]: r["reason"] for r in recs if r["status"] not in ("ok", "skipped")}
    assert bad == {}


def test_gqa_cells_measure_without_host_tensors_meeting_device_data():
    """The GQA paths (k and v repeated per query head, the golden per kv group, masked-row
    classification against a kv-head v, soft-capping), with the GQA negative control."""
    axes = dict(variant=HAND_WRITTEN_AND_SDPA + ("broken.gqa_wrong_head",), device=("cpu",), dtype=("fp32",),
                d_k=(8,), seq_len=(16,), batch=(2,), heads=(4,), kv_heads=(2,), causal=(True,),
                scenario=("fully_masked_bool", "sliding_window", "softcap", "cross_causal"))
    cache = runner.InputCache()
    with HostProvenance() as mode:
        recs = [runner.run_cell(case, cache, TINY, {}) for case in grid.expand(grid.validate_axes(axes))]
    assert mode.violations == []
    assert {r["status"] for r in recs} == {"ok", "skipped"}           # skipped: SDPA on softcap
    bad = {r["id"]: r["reason"] for r in recs if r["status"] not in ("ok", "skipped")}
    assert bad == {}


def test_the_sweep_fails_with_the_bug_put_back(monkeypatch):
    """The sweep above is able to fail: re-introduce the H200 bug (visibility without device)."""
    import audit.measure.golden.reference as reference

    real = reference.visibility

    def without_device(*args, **kwargs):
        kwargs["device"] = None
        return real(*args, **kwargs)

    monkeypatch.setattr(cellcache, "visibility", without_device, raising=False)
    monkeypatch.setattr(reference, "visibility", without_device)
    cache = cellcache.InputCache()
    case = dataclasses.replace(_sweep_cases(("padding",), (True,))[0], variant="eager")
    with HostProvenance() as mode:
        rec = runner.run_cell(case, cache, TINY, {})
    assert mode.violations, rec
    assert rec["status"] == "error" and "HostMeetsDevice" in rec["reason"]
