"""Print what a restructuring must not change, as JSON: for every preset, its cells in order
with their ids, input seeds and cost-model predictions (shipped priors, the reference
machines' ceilings and memory, a cold compile cache), the budget's skips and a 3-way shard
split. `python .ci/behaviour_snapshot.py > a.json`, change the code, run again, diff."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

try:                                   # the layout after the restructuring
    from audit.plan.cell_work import device_type
    from audit.plan.costmodel import CostModel
    from audit.plan.priors import load_priors
    from audit.plan.settings import Settings
    from audit.plan.budget import choose
    from audit.plan.shard import assign, cell_costs
    from audit.workload.inputs import seed_for
    from audit.workload.presets import preset_cases, presets
except ImportError:                    # the flat layout before it
    from audit.plan.costmodel import CostModel, Settings, device_type, load_priors
    from audit.plan.budget import choose
    from audit.plan.shard import assign, cell_costs
    from audit.workload.inputs import seed_for
    from audit.workload.presets import preset_cases, presets


def snapshot() -> dict:
    params = load_priors()
    out = {}
    for name, preset in presets().items():
        cases = preset_cases(preset)
        devices = {c.device for c in cases}
        ceilings = {d: params.reference[device_type(d)]["ceilings"] for d in devices}
        free = {d: params.reference[device_type(d)].get("free_bytes") for d in devices}
        pred = CostModel(params).predict(cases, Settings.of_preset(preset), ceilings, free, set())
        chosen = choose(pred, budget_s=preset.budget_s, reserve_s=10.0, max_cell_s=preset.max_cell_s)
        skip, tier = chosen.skip, chosen.tier
        shards = assign(cases, 3, cell_costs(cases, preset))
        shard_of = {c.id: i for i, s in enumerate(shards) for c in s}
        cols = [c for c in pred.columns if c not in ("id", "shares")]
        out[name] = [{"id": c.id, "seed": seed_for(c), "shard": shard_of[c.id], "skip": skip.get(c.id),
                      "tier": tier.get(c.id),
                      **{k: (round(v, 9) if isinstance(v, float) else v) for k, v in row.items()}}
                     for c, (_, row) in zip(cases, pred.set_index("id").loc[[c.id for c in cases], cols]
                                            .reset_index().iterrows())]
    return out


if __name__ == "__main__":
    json.dump(snapshot(), sys.stdout, indent=0, sort_keys=True, default=str)
    print()
