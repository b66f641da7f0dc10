"""The finding rules' registration: each rules module marks its rules with `rule(order)`, and
analysis/findings.py runs every registered rule in that order (`RULES`).

The order is explicit because it is seen: compute_findings sorts the findings by severity, check and
variant, keeping the rules' order among findings of one key (several rules failing on the same records:
audit_rule_failed). The numbers leave gaps, so a new rule takes its place without renumbering.
"""
from __future__ import annotations

from typing import Callable

import pandas as pd

Rule = Callable[[pd.DataFrame], list[dict]]

_REGISTERED: dict[int, Rule] = {}


def rule(order: int) -> Callable[[Rule], Rule]:
    """Registers the decorated rule to run at `order` (unique among all rules); returns it unchanged."""
    def register(check: Rule) -> Rule:
        taken = _REGISTERED.get(order)
        # a rule registered again (its module reloaded) keeps its place; another rule may not take it
        if taken is not None and _name(taken) != _name(check):
            raise ValueError(f"rule order {order} is taken by {taken.__name__}; {check.__name__} needs another")
        _REGISTERED[order] = check
        return check
    return register


def _name(check: Rule) -> str:
    return f"{check.__module__}.{check.__qualname__}"


def registered_rules() -> tuple[Rule, ...]:
    """Every registered rule, in its order."""
    return tuple(check for _, check in sorted(_REGISTERED.items()))
