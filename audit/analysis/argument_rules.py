"""The argument probes judged (measure/checks/arguments.py): per variant and argument, whether it was
honoured, and a finding where an argument is ignored or applied wrongly."""
from __future__ import annotations

from typing import Any

import pandas as pd

from ..workload.arguments import ARGUMENT_CONSEQUENCES, ARGUMENT_TITLES, ARGUMENTS, NOT_HONOURED, STATUSES
from .finding_rows import _finding, _ok
from .rule_registry import rule

# A variant's status for one argument over its probed cells, the first that any cell has, in this
# order (every one of workload.arguments.STATUSES): a defect wins over any number of honoured cells
# (it is there), honoured over the statuses that say nothing either way.
SUMMARY_ORDER: tuple[str, ...] = ("ignored", "misapplied", "accepted", "failed", "honoured", "unjudged",
                                  "uninformative", "refused")
assert set(SUMMARY_ORDER) == set(STATUSES)
ARGUMENT_CHECK = "argument_ignored"      # the finding's check


def _probes(frame: pd.DataFrame) -> list[tuple[str, str, str, str, dict]]:
    """(variant, cell id, argument, status, evidence) of every probe of the ok cells."""
    ok = _ok(frame)
    if ok.empty or "arguments" not in ok.columns:
        return []
    evidence = ok["argument_evidence"] if "argument_evidence" in ok.columns else pd.Series(None, index=ok.index)
    out = []
    for variant, cell, statuses, found in zip(ok["variant"], ok["id"], ok["arguments"], evidence):
        if not isinstance(statuses, dict):
            continue
        for name, status in statuses.items():
            out.append((str(variant), str(cell), str(name), str(status),
                        (found.get(name) or {}) if isinstance(found, dict) else {}))
    return out


def argument_summary(frame: pd.DataFrame) -> dict[str, dict[str, str]]:
    """variant -> {argument: its status over the variant's probed cells (SUMMARY_ORDER)}."""
    seen: dict[str, dict[str, set[str]]] = {}
    for variant, _, name, status, _ in _probes(frame):
        seen.setdefault(variant, {}).setdefault(name, set()).add(status)
    rank = {s: i for i, s in enumerate(SUMMARY_ORDER)}
    return {v: {name: min(statuses, key=lambda s: rank.get(s, len(rank))) for name, statuses in args.items()}
            for v, args in seen.items()}


@rule(220)
def check_arguments(frame: pd.DataFrame) -> list[dict]:
    """An argument the variant takes and ignores, or applies wrongly: one error finding per variant
    and argument, with the probe's numbers at its worst cell."""
    probes = _probes(frame)
    out = []
    groups: dict[tuple[str, str], list[tuple[str, str, dict]]] = {}
    probed: dict[tuple[str, str], int] = {}
    for variant, cell, name, status, found in probes:
        probed[(variant, name)] = probed.get((variant, name), 0) + 1
        if status in NOT_HONOURED:
            groups.setdefault((variant, name), []).append((cell, status, found))
    for (variant, name), bad in sorted(groups.items()):
        if any(b[1] == "accepted" for b in bad):
            out.append(_accepted(variant, name, bad, probed[(variant, name)]))
            continue
        if name in ARGUMENTS and ARGUMENTS[name].invariant:
            out.append(_moved(variant, name, bad, probed[(variant, name)]))
            continue
        ignored = [b for b in bad if b[1] == "ignored"]
        status = "ignored" if len(ignored) * 2 >= len(bad) else "misapplied"
        worst = max(bad, key=lambda b: _ratio(b[2]))
        cell, _, found = worst
        title, change = ARGUMENT_TITLES.get(name, (name, "changed"))
        verb = "ignores" if status == "ignored" else "applies wrongly"
        message = (f"{variant} {verb} its `{name}` argument ({title}) in {len(bad)} of {probed[(variant, name)]} "
                   f"probed cell(s): when it changes ({change}), the float64 golden's output moves by RMSE "
                   f"{_fmt(found.get('golden_moved'))} and {variant}'s by {_fmt(found.get('moved'))}; the two moves "
                   f"differ by {_fmt(found.get('err'))}, budget {_fmt(found.get('budget'))} (at {cell}). "
                   f"{ARGUMENT_CONSEQUENCES.get(name, '')}").rstrip()
        same = [b for b in bad if b[1] == status]
        diagnosis_title = f"{title} {status}"
        message += (f" Diagnosis: in {len(same)} of {len(bad)} cell(s) {diagnosis_title}: "
                    + ("changing it leaves the output as it was." if status == "ignored"
                       else "the output moves, but not as the golden's."))
        out.append(_argument_finding(variant, name, status, message, [b[0] for b in bad], len(same),
                                     found.get("moved") if status == "ignored" else None, found.get("err")))
    return out


def _argument_finding(variant: str, name: str, status: str, message: str, cells: list[str], diagnosed: int,
                      err: Any = None, golden_err: Any = None) -> dict:
    """The argument_ignored finding of one variant and argument, diagnosed `<argument>_<status>`."""
    title = ARGUMENT_TITLES.get(name, (name, ""))[0]
    finding = _finding(ARGUMENT_CHECK, "error", variant, message, cells)
    finding.update(argument=name, diagnosis=f"{name}_{status}", diagnosis_title=f"{title} {status}",
                   diagnosis_cells=diagnosed, diagnosis_err=err, diagnosis_golden_err=golden_err)
    return finding


def _moved(variant: str, name: str, bad: list[tuple[str, str, dict]], probed: int) -> dict:
    """The finding of a change the output must not follow and did (workload.arguments: Argument.invariant)."""
    title, change = ARGUMENT_TITLES.get(name, (name, "changed"))
    nan = [b for b in bad if b[2].get("nan_appeared")]
    cell, _, found = nan[0] if nan else max(bad, key=lambda b: _ratio({**b[2], "err": b[2].get("moved")}))
    how = ("rows turn NaN" if found.get("nan_appeared")
           else f"it moves by RMSE {_fmt(found.get('moved'))}, budget {_fmt(found.get('budget'))}")
    message = (f"{variant} ignores its `{name}` argument ({title}) in {len(bad)} of {probed} probed cell(s): when "
               f"{change}, which changes nothing the golden computes, its output follows ({how}; at {cell}). "
               f"{ARGUMENT_CONSEQUENCES.get(name, '')} Diagnosis: in {len(bad)} of {len(bad)} cell(s) {title} "
               f"ignored: the output follows where the data sits, not what the argument says.").rstrip()
    return _argument_finding(variant, name, "ignored", message, [b[0] for b in bad], len(bad))


def _accepted(variant: str, name: str, bad: list[tuple[str, str, dict]], probed: int) -> dict:
    """The finding of a call the variant must refuse and computed (workload.arguments: Argument.refuse)."""
    title, change = ARGUMENT_TITLES.get(name, (name, "changed"))
    cell, _, found = bad[0]
    message = (f"{variant} computes an output where it must refuse ({title}: {change}) in {len(bad)} of {probed} "
               f"probed cell(s): {found.get('heads', '?')} query heads against {found.get('kv_heads', '?')} "
               f"key/value heads returned shape {found.get('returned', '?')} (at {cell}). "
               f"{ARGUMENT_CONSEQUENCES.get(name, '')}").rstrip()
    return _argument_finding(variant, name, "accepted", message, [b[0] for b in bad], len(bad))


def _ratio(found: dict[str, Any]) -> float:
    try:
        return float(found.get("err", 0.0)) / float(found.get("budget") or 1.0)
    except (TypeError, ValueError):
        return 0.0


def _fmt(value: Any) -> str:
    try:
        return f"{float(value):.3g}"
    except (TypeError, ValueError):
        return "n/a"
