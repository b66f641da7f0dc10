"""pytest configuration shared by tests/ and suites/.

`--audit-preset` chooses the grid the suites run over (default: quick).
"""
from __future__ import annotations


def pytest_addoption(parser):
    group = parser.getgroup("attn-audit")
    group.addoption("--audit-preset", default="quick",
                    help="grid the suites/ run over: quick (default), cpu or gpu")
