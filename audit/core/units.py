"""Durations as people write and read them: '90s', '10m', '1h30m' in, '8.5 min', '36 s' out."""
from __future__ import annotations

import re

from .errors import UsageError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(h|min|m|s)?")
_UNIT_S = {"h": 3600.0, "min": 60.0, "m": 60.0, "s": 1.0, None: 1.0}


def parse_duration(text: str) -> float | None:
    """'90s', '10m', '1h', '1m30s', '45' (seconds) -> seconds; 'none' -> None (no budget)."""
    value = str(text).strip().lower()
    if value in ("none", "off", "0"):
        return None
    pos, total = 0, 0.0
    for match in _DURATION.finditer(value.replace(" ", "")):
        if match.start() != pos or not match.group(0):
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    if pos != len(value.replace(" ", "")) or pos == 0 or total <= 0:
        raise UsageError(f"--budget: {text!r} is not a duration (e.g. 90s, 10m, 1h, 1m30s; none for no budget)")
    return total


def format_duration(seconds: float) -> str:
    """'8.5 min', '36 s', '2.5 s': minutes from 90 s on, a decimal under 10 s."""
    if seconds >= 90:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def format_clock(seconds: float) -> str:
    """'4:07', '1:02:09': a stopwatch's reading (the progress bar's elapsed and left)."""
    whole = max(0, int(round(seconds)))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_budget(seconds: float | None) -> str | None:
    """A --budget value of at least `seconds`: whole seconds under two minutes ("13s"), else whole
    minutes ("3m"); None without a finite positive number (what a plan that measures nothing, or
    the report of one, tells a user to give)."""
    import math
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        return None
    return f"{math.ceil(seconds)}s" if seconds < 120 else f"{math.ceil(seconds / 60)}m"
