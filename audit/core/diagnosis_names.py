"""A diagnosis's name, as the records keep it: one known mistake's name, "none", or several
mistakes the cell cannot tell apart, joined ("document_queries_late or cu_seqlens_off_by_one").

measure/diagnosis/diagnosis.py names every mistake that explains the output where no other explains it
by a margin (docs/numerics.md, Diagnosis); everything that reads a diagnosis (the findings, the
report, the reproduction scripts) reads it through these, so a joined name is understood
everywhere one name is.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

NONE = "none"          # no known mistake matched
OR = " or "            # between the names of mistakes the cell cannot tell apart


def joined(names: Iterable[str]) -> str:
    """The diagnosis naming `names` (in their order, each once); "none" when there are none."""
    names = list(dict.fromkeys(str(n) for n in names if n and str(n) != NONE))
    return OR.join(names) if names else NONE


def members(name: Any) -> list[str]:
    """The mistakes a recorded diagnosis names: [] for none, null or NaN; one or more names."""
    if name is None or (isinstance(name, float) and math.isnan(name)):
        return []
    text = str(name).strip()
    if not text or text == NONE:
        return []
    return [part.strip() for part in text.split(OR) if part.strip()]


def agrees(recorded: Any, found: Any) -> bool:
    """Whether a diagnosis made again (found) holds the recorded one: both name nothing, or they
    share a mistake (a cell that could not tell a from b, diagnosed a or b once and a the next time,
    says the same of the variant)."""
    a, b = members(recorded), members(found)
    return (not a and not b) or bool(set(a) & set(b))


def title_of(name: Any, library: Mapping[str, Any]) -> str:
    """The diagnosis's title: each member's (library[n].title; its name where the library has none),
    joined by OR; "none" for none."""
    parts = [getattr(library.get(n), "title", None) or n for n in members(name)]
    return OR.join(parts) if parts else NONE
