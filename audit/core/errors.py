"""Errors every layer may raise: a user's bad value (exit 2, one line, no traceback)."""
from __future__ import annotations


class UsageError(ValueError):
    """A bad value given by the user: reported as one line naming the value and what is
    allowed, exit code 2."""
