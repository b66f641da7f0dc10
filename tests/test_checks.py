"""The numerics checks' registry (measure/checks/registry.py): the checks run in one explicit order, the one
they ran in when the order was the order of registration, whatever the order their modules are
imported or defined in."""
from __future__ import annotations

import contextlib
import importlib

import pytest

from audit.measure.checks import registry as checks

# The order of registration before CHECK_ORDER made it explicit (a later check reads an earlier one's columns),
# and lse_shards (context parallel) after the two-way merge since.
ORDER_BEFORE = (
    "nonfinite_out", "error_budget", "masked_rows", "leak", "cross_document", "paged_reads", "arguments",
    "batch_invariance", "chunk_invariance", "causal_alignment",
    "nonfinite_grads", "grad_errors", "grad_budget", "grad_diagnosis", "sink_grad",
    "lse_error", "lse_merge", "lse_shards", "lse_grads", "lse_diagnosis", "lse_grad_diagnosis",
    "saturation", "diagnosis", "grad_forward_diagnosis",
)


def test_the_checks_run_in_the_order_they_always_ran_in():
    importlib.import_module("audit.measure.cell.measurement")        # what runs the checks: every one registered
    assert checks.CHECK_ORDER == ORDER_BEFORE
    assert set(checks.CHECKS) == set(ORDER_BEFORE)
    assert [c.name for c in checks.ordered_checks()] == list(ORDER_BEFORE)


def test_run_checks_follows_check_order_not_the_registry(monkeypatch):
    """The registry filled in reverse: the checks still run in CHECK_ORDER."""
    ran: list[str] = []
    reversed_registry = {name: checks.Check(name, frozenset({"out"}), "numerics",
                                            lambda cell, name=name: ran.append(name) or {})
                         for name in reversed(checks.CHECK_ORDER)}
    monkeypatch.setattr(checks, "CHECKS", reversed_registry)

    class Cell:
        columns: dict = {}

    checks.run_checks("output", Cell(), lambda phase: contextlib.nullcontext())
    assert ran == list(checks.CHECK_ORDER)


def test_a_check_missing_from_the_order_or_the_registry_is_an_error(monkeypatch):
    with pytest.raises(ValueError, match="not in CHECK_ORDER"):
        checks.check("unordered", needs=("out",))
    monkeypatch.setattr(checks, "CHECKS", {k: v for k, v in checks.CHECKS.items() if k != "sink_grad"})
    with pytest.raises(RuntimeError, match="sink_grad"):
        checks.ordered_checks()

