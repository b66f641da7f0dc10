"""The referee's verdicts of one cell: a column per check of core.referee.REFEREE_CHECKS and, per
failure, what was seen."""
from __future__ import annotations

from typing import Any

from ...core.referee import REFEREE_CHECKS, column


class Verdicts:
    """The referee's verdicts of one cell: a column per check (None until it runs) and, per failure,
    what was seen (the call and the numbers)."""

    def __init__(self) -> None:
        self.passed: dict[str, bool | None] = dict.fromkeys(REFEREE_CHECKS)
        self.detail: dict[str, str] = {}

    def judge(self, name: str, ok: bool | None, detail: str = "") -> None:
        """One check's verdict on one call; a check judged on several calls fails if any fails
        (the first failure's detail is kept, later ones appended)."""
        if name not in REFEREE_CHECKS:
            raise ValueError(f"unknown referee check {name!r}; known: {', '.join(REFEREE_CHECKS)}")
        if ok is None:
            return
        before = self.passed[name]
        self.passed[name] = bool(ok) and before is not False
        if not ok and detail:
            self.detail[name] = "; ".join(filter(None, [self.detail.get(name), detail]))

    def failed(self, name: str) -> bool:
        return self.passed[name] is False

    def columns(self) -> dict[str, Any]:
        cols: dict[str, Any] = {column(name): ok for name, ok in self.passed.items()}
        cols["referee_detail"] = dict(self.detail) or None
        return cols
