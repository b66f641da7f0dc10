"""Options <-> command line, one rule for the Python API and for the Ray tasks: a command's
options as {dest: value} become the arguments its parser reads back as the same values."""
from __future__ import annotations

import argparse
from typing import Any, Mapping, Sequence


def to_argv(options: Mapping[str, Any], actions: Sequence[argparse.Action]) -> list[str]:
    """The command-line arguments that give `options` ({dest: value}) to a parser with these
    actions: True -> the flag, None, False or an empty list -> nothing (a flag of one or more values
    given none would be refused), a list -> the flag and its values (booleans as true/false). An option the parser lacks raises TypeError naming the allowed."""
    flags = {a.dest: a.option_strings[0] for a in actions if a.option_strings and a.help != argparse.SUPPRESS}
    argv: list[str] = []
    for dest, value in options.items():
        if value is None or value is False or (isinstance(value, (list, tuple)) and not value):
            continue
        if dest not in flags:
            raise TypeError(f"unknown option {dest!r}; allowed: {', '.join(sorted(flags))}")
        values = value if isinstance(value, (list, tuple)) else [value]
        text = [str(v).lower() if isinstance(v, bool) else str(v) for v in values]
        argv += [flags[dest]] if value is True else [flags[dest], *text]
    return argv
