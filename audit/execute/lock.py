"""One writer per run folder: an OS lock (flock) on DIR/.lock that dies with its holder.

Two runs writing one folder measured every cell twice, each timing taken while the other
loaded the machine. The supervising `audit run` holds the lock for the whole run (its
worker writes under it); a second run on the same folder stops at once, naming the holder.
The kernel releases an flock when its holder exits, however it exits (kill -9 included),
so a lock left by a killed run never blocks: the file may remain, the lock does not.
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path
from typing import IO, Any

from ..core.runfolder import LOCK_FILE


class FolderBusy(RuntimeError):
    """Another live process holds the run folder's lock."""


class RunLock:
    """`with RunLock(run_dir):` holds DIR/.lock exclusively, recording pid and command."""

    def __init__(self, run_dir: Path | str) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fh: IO[str] | None = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = _holder(fh.read())
            fh.close()
            raise FolderBusy(f"{self.path.parent} is being written by another attn-audit run "
                             f"(pid {holder.get('pid', '?')}: {holder.get('command', '?')}); "
                             "wait for it, or give this run another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "command": " ".join(sys.argv)}) + "\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
        return value if isinstance(value, dict) else {}
    except ValueError:
        return {}
