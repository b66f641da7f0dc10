"""A reproduction script per merge finding (analysis/merge_rules.py's merge_wrong; merge_grad_wrong's
by merge_grad_scripts.py), in the merge function's own API: the smallest failing case the merge audit kept in
the record (measure/merging/smallest.py: one row of one partial state, two features where that still fails),
written out as literal tensors, the call as its library makes it, and the float64 golden it must give.
It imports torch and the function's library only, prints what it got beside what it should, and exits
1 while the finding holds ("REPRODUCED"), 0 once fixed ("NOT REPRODUCED"). Writing it runs nothing: the
report imports no torch for it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.dtypes import dtype_spec
from ..core.errors import UsageError
from ..core.runfolder import MERGE_FINDINGS_FILE, REPRO_DIR, read_merge_records
from ..analysis.merge_rules import state_label
from ..workload.merge_functions import MergeFunction
from ..workload.merges import TORCH_MERGE, builtin_merges, resolve_merge
from .merge_cases import FORM_CALLS, literal
from .merge_grad_scripts import gradient_script


def merge_script(finding: dict, merge: MergeFunction, case: dict[str, Any], outcome: str) -> str:
    """The script's text, from the merge record's `smallest` (measure/merging/smallest.py): literal parts, the
    call in the function's API, the golden, the verdict."""
    import_line, expression = merge.api
    out_tol, lse_tol = case["out_tol"], case["lse_tol"]
    dtype = dtype_spec(case["dtype"]).torch_name
    parts = ",\n".join(f"    (torch.tensor({literal(o)}, dtype=torch.{dtype}).view(1, 1, 1, -1), "
                       f"torch.tensor({literal(l)}, dtype=torch.float32).view(1, 1, 1))"
                       for o, l in case["parts"])
    call = FORM_CALLS[merge.form].replace("FN", "merge_fn")
    to_base = "1.0" if merge.lse_base == "e" else "1.0 / math.log(2.0)"
    g_out, g_lse = case["golden"]
    return f'''"""{finding["message"]}

The smallest failing case of the audit's state `{case["state"]}` ({case["dtype"]}): one query row,
{len(case["parts"])} parts of its keys in key order, each (out, lse) as a kernel hands it on, merged by {merge.name} in its own API.
Expected: float64 attention over all the keys, out 0 and lse -inf on a row that sees none.
Exit 1 while the merge still returns {outcome}, 0 once it is right."""
import math
import sys

import torch
{import_line}

merge_fn = {expression}
TO_BASE = {to_base}     # the lse base {merge.name} takes ({merge.lse_base})
parts = [   # (out (1, 1, 1, d), lse (1, 1, 1) natural log) per part
{parts},
]
expected_out = torch.tensor({literal(g_out)}, dtype=torch.float64)
expected_lse = {literal(g_lse)}[0]

{call}
out, lse = out.double().flatten(), float(lse.double().flatten()[0])
print("{merge.name} returned out", out.tolist(), "lse", lse)
print("expected            out", expected_out.tolist(), "lse", expected_lse)
right = (not out.isnan().any() and not math.isnan(lse) and bool((out - expected_out).abs().max() <= {out_tol!r})
         and (lse == expected_lse or abs(lse - expected_lse) <= {lse_tol!r}))
print("NOT REPRODUCED: the merge is right" if right else "REPRODUCED: the finding holds ({outcome})")
sys.exit(0 if right else 1)
'''


def write_merge_repro_scripts(run_dir: str | Path) -> list[dict]:
    """A script per merge_wrong and merge_grad_wrong finding of DIR/merge_findings.json, in DIR/repro/: its
    path (`repro`), or
    why there is none (`repro_reason`), added to the finding; the file rewritten."""
    run_dir = Path(run_dir)
    path = run_dir / MERGE_FINDINGS_FILE
    if not path.exists():
        return []
    findings = json.loads(path.read_text())
    by_id = {r.get("id"): r for r in read_merge_records(run_dir)}
    merges = builtin_merges(torch_merge="measured" if any(f.get("variant") == TORCH_MERGE for f in findings) else False)
    for finding in findings:
        finding.pop("repro", None)
        finding.pop("repro_reason", None)
        if finding.get("check") not in ("merge_wrong", "merge_grad_wrong"):
            continue
        try:
            merge = resolve_merge(finding["variant"], merges)
        except UsageError:
            merge = None
        ranked = sorted((by_id[c] for c in finding["cells"] if c in by_id),     # fp32 first: the plainest case
                        key=lambda r: (r.get("dtype") != "fp32", str(r.get("id"))))
        record = ranked[0] if ranked else None
        if merge is None or merge.api is None or record is None:
            finding["repro_reason"] = f"{finding['variant']}: no importable name to call it by in a script"
            continue
        gradient = finding["check"] == "merge_grad_wrong"
        case = record.get("smallest_grad" if gradient else "smallest")
        outcome = record.get("grad_outcome" if gradient else "outcome")
        if case is None:
            finding["repro_reason"] = ("no row of the state fails when merged again"
                                       if "smallest" in record else "recorded before the merge audit kept its "
                                       "smallest failing case (merge_version 4): run the audit again")
            continue
        text = gradient_script(finding, merge, case) if gradient else merge_script(finding, merge, case, outcome)
        name = f"{finding['check']}-{merge.name}-{outcome}-{state_label(record)}.py".replace("/", "_")
        (run_dir / REPRO_DIR).mkdir(exist_ok=True)
        (run_dir / REPRO_DIR / name).write_text(text)
        finding["repro"] = f"{REPRO_DIR}/{name}"
    path.write_text(json.dumps(findings, indent=1) + "\n")
    return findings
