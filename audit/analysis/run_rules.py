"""The finding rules of how a variant ran: Inductor rewriting it, graph breaks, memory kept across
calls, run-to-run determinism and deterministic mode, the referee's checks, failed cells. Each reads
the tidy frame (records.to_frame) and returns findings (analysis/finding_rows.py); findings.py runs them.
"""
from __future__ import annotations

import re

import pandas as pd

from ..core.defects import REPEATED_TENSORS
from ..core.referee import REFEREE_CHECKS
from ..core.referee import column as referee_column
from .finding_rows import _finding, _num, _ok, _per_variant, _where
from .rule_registry import rule

REFEREE_CHECK = "referee"        # the check of a referee finding: the variant was not measured doing the work


@rule(140)
def check_compiled_rewrite(frame: pd.DataFrame) -> list[dict]:
    ok = _ok(frame)
    if "fused_sdpa" not in ok:
        return []
    fused = ok[ok["fused_sdpa"].astype("object").eq(True)]

    def make(variant: str, g: pd.DataFrame) -> dict:
        total = int((ok["variant"] == variant).sum())
        return _finding("compiled_rewritten", "info", variant,
                        f"Inductor rewrote {variant} into fused SDPA in {len(g)} of {total} cells "
                        f"(no mask or a float mask): there its speed and numerics are SDPA's, e.g. "
                        f"fully masked rows give 0 instead of NaN.", g["id"])
    return _per_variant(fused, make)


@rule(150)
def check_graph_breaks(frame: pd.DataFrame) -> list[dict]:
    """A compiled variant whose code Dynamo split (graph_breaks > 0): between the pieces it ran
    eagerly, so its time and memory are partly not the compiled code's."""
    ok = _ok(frame)
    rows = ok[_num(ok, "graph_breaks") > 0]

    def make(variant: str, g: pd.DataFrame) -> dict:
        return _finding("graph_breaks", "warning", variant,
                        f"Dynamo broke {variant}'s compiled code into pieces in {len(g)} cell(s) ({_where(g)}), "
                        f"up to {int(_num(g, 'graph_breaks').max())} graph break(s): the code between them ran "
                        f"eagerly, so these times are partly eager Python's. TORCH_LOGS=graph_breaks names them.",
                        g["id"])
    return _per_variant(rows, make)

@rule(180)
def check_memory_leak(frame: pd.DataFrame) -> list[dict]:
    """Memory a variant kept across its timed calls (leaked_bytes): it grows with every call."""
    rows = _ok(frame)
    rows = rows[_num(rows, "leaked_bytes") > 0]

    def make(variant: str, g: pd.DataFrame) -> dict:
        return _finding("memory_leak", "warning", variant,
                        f"{variant} kept up to {_num(g, 'leaked_bytes').max() / 2**20:.0f} MiB across its timed "
                        f"calls in {len(g)} cell(s) ({_where(g)}): memory grows with every call.", g["id"])
    return _per_variant(rows, make)


def _differs(frame: pd.DataFrame) -> list[tuple | None]:
    """repeat_differs per row as a tuple of names (() for bitwise identical, None where not checked)."""
    if "repeat_differs" not in frame:
        return [None] * len(frame)
    return [tuple(v) if isinstance(v, (list, tuple)) else None for v in frame["repeat_differs"]]


def _differing(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows where some tensor differed between runs."""
    return frame[pd.Series([bool(d) for d in _differs(frame)], index=frame.index, dtype=bool)]


@rule(190)
def check_nondeterministic(frame: pd.DataFrame) -> list[dict]:
    """Outputs or gradients that are not bitwise identical across runs on identical inputs."""
    ok = _ok(frame)
    rows = _differing(ok)

    def make(variant: str, g: pd.DataFrame) -> dict:
        checked = sum(d is not None for d in _differs(ok[ok["variant"] == variant]))
        names = [n for n in REPEATED_TENSORS if any(n in d for d in _differs(g))]
        mode = (" even under torch.use_deterministic_algorithms(True)"
                if g.get("deterministic_algorithms", pd.Series(dtype=object)).astype("object").eq(True).any()
                else "")
        return _finding("nondeterministic", "warning", variant,
                        f"{variant} is not run-to-run deterministic{mode}: {', '.join(names)} differ between "
                        f"runs on identical inputs in {len(g)} of {checked} cell(s), by up to "
                        f"{_num(g, 'repeat_max_diff').max():.3g} ({_where(g)}). Training with it is not "
                        f"bitwise reproducible.", g["id"])
    return _per_variant(rows, make)


@rule(210)
def check_deterministic_mode(frame: pd.DataFrame) -> list[dict]:
    """Under --deterministic: which variants refuse (raise), and which run bitwise identically."""
    if "deterministic_refused" not in frame:
        return []
    mode = frame[frame["deterministic_refused"].astype("object").isin([True, False])]
    if mode.empty:
        return []
    refused = set(mode.loc[mode["deterministic_refused"].astype("object").eq(True), "variant"])
    ran = _ok(mode)
    still = set(_differing(ran)["variant"])
    identical = set(ran["variant"]) - still - refused
    parts = [f"{label}: {', '.join(sorted(names)) or 'none'}" for label, names in
             (("refuse (an operation has no deterministic implementation)", refused),
              ("bitwise identical across runs", identical), ("still differ", still))]
    return [_finding("deterministic_mode", "warning" if refused or still else "info", "*",
                     "Under torch.use_deterministic_algorithms(True) (--deterministic) — "
                     + "; ".join(parts) + ".", mode["id"])]


@rule(230)
def check_referee(frame: pd.DataFrame) -> list[dict]:
    """The referee's checks (core.referee): one error finding per variant and failed check, naming
    the check, what the first failing call showed (the numbers), and where. A variant that fails
    one was not measured doing the work: its speed is not comparable, its numerics not trusted."""
    ok = _ok(frame)
    found = []
    for name, meaning in REFEREE_CHECKS.items():
        col = referee_column(name)
        if col not in ok:
            continue
        failed = ok[ok[col].astype("object").eq(False)]
        for variant, g in failed.groupby("variant", sort=True):
            judged = int(ok.loc[ok["variant"] == variant, col].astype("object").isin([True, False]).sum())
            details = [d.get(name) for d in g.get("referee_detail", pd.Series(dtype=object))
                       if isinstance(d, dict) and d.get(name)]
            seen = f" First: {details[0]}." if details else ""
            finding = _finding(REFEREE_CHECK, "error", str(variant),
                               f"{variant} fails the referee's {name} check in {len(g)} of {judged} cell(s) "
                               f"({_where(g)}): it must hold that {meaning}.{seen} Its times there are not of "
                               "the work and its numbers cannot be trusted: never use it as measured "
                               "(docs/generated-kernels.md).", g["id"])
            finding["referee_check"] = name
            found.append(finding)
    return found


# A failed cell's reason that is torch.compile's failure (Inductor's C++ or Triton compile, its
# generated code's own checks, Dynamo's backend), not the variant's arithmetic nor the audit's.
TORCH_COMPILE_FAILURE = (r"InductorError|CppCompileError|BackendCompilerFailed|torch\._inductor|cpp_builder"
                         r"|\.main\.cpp:\d+")


@rule(240)
def check_failed_cells(frame: pd.DataFrame) -> list[dict]:
    """Cells that failed (error, oom, timeout): the reasons (with the line naming the cause: a
    compiler's error line, a chain's root), where the whole failure is kept (failure_file), and
    whether the failures came after other cells of the variant in the same measuring process (a
    compile that fails only as a recompile: the reproduction script replays those first)."""
    rows = frame[frame["status"].isin(["error", "oom", "timeout"])]

    def make(variant: str, g: pd.DataFrame) -> dict:
        reasons = "; ".join(sorted(set(str(r)[:240] for r in g["reason"])))[:480]
        files = [f for f in g.get("failure_file", pd.Series(dtype=object)) if isinstance(f, str)]
        after = [a for a in g.get("failed_after", pd.Series(dtype=object)) if isinstance(a, list) and a]
        text = f"{variant} failed in {len(g)} cell(s): {reasons}."
        compiled = [r for r in g["reason"].astype(str) if re.search(TORCH_COMPILE_FAILURE, r)]
        if compiled:
            text += (f" {len(compiled)} of them are torch.compile failing on the variant's code (torch's Inductor or "
                     "Dynamo, the compiler's own line quoted: a failure of torch's, not of attn-audit's; report it "
                     "upstream with the reproduction script, which needs torch alone).")
        if files:
            more = " and more" if len(files) > 1 else ""
            text += f" The whole failure of each is in the run folder ({files[0]}{more})."
        if after:
            first = min(after, key=len)
            ran_ok = set(frame.loc[(frame["variant"] == variant) & (frame["status"] == "ok"), "id"])
            before = [c for c in first if c in ran_ok]
            text += (f" {len(after)} of them failed after other cells of {variant} in the same measuring process "
                     f"(the first after {len(first)}: {first[0]}" + (", which ran ok" if first[0] in ran_ok else "")
                     + "): a compiled variant can fail only on a recompile, so its reproduction script replays "
                     "them first when the cell alone does not fail"
                     + (f" ({len(before)} of them ran ok)" if before else "") + ".")
        found = _finding("cell_failed", "warning", variant, text, g["id"])
        if files:
            found["failure_file"] = files[0]
        return found
    return _per_variant(rows, make)

