"""Whether a compile found its kernels in Inductor's on-disk cache, and where that cache is.

A compiled cell's cost is mostly its compile, and that depends on the cache more than on the
machine: on 2 CPU cores a compile whose C++ kernels are already built in the cache
(TORCHINDUCTOR_CACHE_DIR; Triton's kernels live there too unless TRITON_CACHE_DIR moves them)
takes 0.3-0.4 s, one that must build them 1.8-2 s. The audit compiles with Inductor's FX-graph
cache off (workload.compiling._compiled_fn: a cached graph would skip the pattern matcher), so the graph
is always lowered again; what the cache saves is building the kernels, which writes new files
into it. A compile is therefore a miss when it wrote a new compiled binary into the cache (a
kernel's shared library, a cubin, a precompiled header), else a hit. Each compiled cell
records which (`compile_cache`), run.json the cache folder and its identity, and the cost
model predicts a hit where an earlier run built the same kernels into the same cache.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

LOCKS = "locks"        # Inductor's lock files: touched by hits too


def cache_dir() -> str | None:
    """Inductor's cache folder as this process resolves it (None without torch).

    torch's own (torch._inductor.runtime.cache_dir_utils.cache_dir): TORCHINDUCTOR_CACHE_DIR made
    absolute, else torchinductor_<user> in the temporary folder, the folder made. Read here without
    importing torch._inductor, whose package import took 1-2 s of every run's start in the process
    that writes run.json and of every dry-run's plan (neither compiles anything);
    tests/test_compile_reuse.py holds it equal to torch's."""
    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or _default_dir()
    if not given:
        return None
    folder = os.path.abspath(given)
    os.makedirs(folder, exist_ok=True)
    return folder


def _default_dir() -> str | None:
    """torch's default_cache_dir (torch._inductor.runtime.cache_dir_utils): torchinductor_<user> in the
    temporary folder, whatever TORCHINDUCTOR_CACHE_DIR says; None without torch."""
    import getpass
    import re
    import tempfile
    from importlib.util import find_spec

    if find_spec("torch") is None:
        return None
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        getuid = getattr(os, "getuid", None)
        user = f"uid_{getuid()}" if callable(getuid) else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


HEADERS_DIR = "precompiled_headers"   # in torch's default cache folder (codecache._HEADER_DIR)


def headers_built() -> bool:
    """Whether Inductor's precompiled C++ headers are built already (a `.gch` in its headers folder newer
    than this torch's install). A process's first CPU compile builds them where they are not: 7.6 s more
    for a run's first compiled cell on a 2-core AVX2-only EPYC (14.3 s against 6.7 s). torch keeps them in
    its default cache folder, in the temporary folder (codecache._HEADER_DIR), whatever
    TORCHINDUCTOR_CACHE_DIR says: a new Inductor cache there finds them built, a new TMPDIR does not."""
    from importlib.util import find_spec

    base, spec = _default_dir(), find_spec("torch")
    if base is None or spec is None or not spec.origin:
        return False
    try:
        installed = os.stat(os.path.join(os.path.dirname(spec.origin), "version.py")).st_mtime_ns
        with os.scandir(os.path.join(base, HEADERS_DIR)) as entries:
            return any(e.name.endswith(".gch") and e.is_file() and e.stat().st_mtime_ns >= installed
                       for e in entries)
    except OSError:
        return False


def _roots() -> list[str]:
    roots = [d for d in (cache_dir(), os.environ.get("TRITON_CACHE_DIR")) if d]
    return list(dict.fromkeys(roots))


BINARIES = (".so", ".cubin", ".hsaco", ".gch", ".pch")   # what building a kernel writes
Snapshot = tuple[int, dict[str, int]]


def snapshot() -> Snapshot:
    """(now in ns, {folder: mtime ns}) of the cache's folders: a folder's mtime moves when an
    entry is created in it. Folders only are stat'ed (a few hundred), not files."""
    now, folders = time.time_ns(), {}
    for root in _roots():
        for folder, subfolders, _files in os.walk(root):
            subfolders[:] = [s for s in subfolders if s != LOCKS]
            try:
                folders[folder] = os.stat(folder).st_mtime_ns
            except OSError:
                continue
    return now, folders


def built_since(before: Snapshot) -> int:
    """Compiled binaries written into the cache since `before` (only changed folders are read)."""
    taken, folders = before
    built = 0
    for folder, mtime in snapshot()[1].items():
        if folders.get(folder) == mtime:
            continue
        try:
            with os.scandir(folder) as entries:
                built += sum(1 for e in entries if e.name.endswith(BINARIES) and e.is_file()
                             and e.stat().st_mtime_ns >= taken)
        except OSError:
            continue
    return built


def outcome(before: Snapshot) -> str:
    """miss when the compile since `before` built a kernel into the cache, else hit."""
    return "miss" if built_since(before) else "hit"


ID_FILE = ".attn-audit-cache-id"   # in the cache folder: which folder it is, across wipes


def identity(folder: str | Path | None, *, create: bool = False) -> str | None:
    """The cache folder's identity: a random id kept in it (made when `create`), so that a
    folder wiped and made again (a /tmp cleared at boot) is another folder though its name is
    the same (a new inode is no proof: a folder made again at once may get the old one).
    None where the folder has none."""
    if not folder:
        return None
    path = Path(folder) / ID_FILE
    try:
        return path.read_text().strip() or None
    except OSError:
        if not create:
            return None
    import uuid
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(uuid.uuid4().hex + "\n")
        return path.read_text().strip()
    except OSError:
        return None


def warm(folder: str | Path) -> bool:
    """Whether a cache folder still holds a compiled binary (a wiped /tmp leaves none)."""
    for _folder, subfolders, files in os.walk(folder):
        subfolders[:] = [s for s in subfolders if s != LOCKS]
        if any(f.endswith(BINARIES) for f in files):
            return True
    return False
