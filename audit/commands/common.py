"""What several commands share: a run folder's default path and reports/latest, moving damaged
record lines aside, and the report written after a run, a merge or `report`."""
from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from ..core.errors import UsageError
from ..core.paths import reports_root
from ..core.records import NewerSchema, quarantine_damaged
from ..core.runfolder import FINDINGS_FILE, LATEST_LINK, QUARANTINE_FILE, RECORDS_FILE


def resolve_out(out: str | Path | None, prefix: str = "") -> Path:
    """`out`, else reports/<prefix><timestamp>/ (core.paths.reports_root)."""
    if out:
        return Path(out)
    return reports_root() / f"{prefix}{datetime.now():%Y%m%d-%H%M%S}"


def point_latest(run_dir: Path) -> None:
    """reports/latest -> the newest run folder under reports/ (core.paths)."""
    reports = reports_root()
    try:
        if run_dir.resolve().parent != reports.resolve():
            return
        latest = reports / LATEST_LINK
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(run_dir.name)
    except OSError:
        pass


def quarantine(run_dir: Path) -> None:
    """Move damaged record lines aside (their cells are measured again); say so in one line.
    Records of a newer schema stop the command: UsageError naming both versions."""
    try:
        moved = quarantine_damaged(run_dir)
    except NewerSchema as exc:
        raise UsageError(f"{run_dir / RECORDS_FILE}: {exc}") from None
    if moved:
        lines = ", ".join(str(n) for n, _ in moved[:10]) + (" ..." if len(moved) > 10 else "")
        print(f"attn-audit: {len(moved)} damaged line(s) of {RECORDS_FILE} (line {lines}) moved to "
              f"{run_dir / QUARANTINE_FILE}; their cells are measured again by a run", file=sys.stderr)


def write_report(run_dir: Path, before_page: Callable[[], None] | None = None) -> dict[str, Any]:
    """Findings from the records, a reproduction script per finding, then figures and index:
    no torch computation. Prints what was found; returns build_report's paths. before_page:
    build_report's (a run records its time split there)."""
    from ..analysis.findings import write_findings
    from ..core.records import read_records, to_frame
    from ..render.build import build_report
    from ..render.finding_tables import is_control_finding, negative_control_check
    from ..repro.merge_scripts import write_merge_repro_scripts
    from ..repro.scripts import write_repro_scripts

    records = read_records(run_dir)                                 # read once for each step below
    found = write_repro_scripts(run_dir, write_findings(run_dir, records), records)   # DIR/repro/: a script per finding
    write_merge_repro_scripts(run_dir)                              # ... and per merge finding
    paths = build_report(run_dir, before_page, records)
    real = [f for f in found if not is_control_finding(f)]
    by_severity = {s: sum(f["severity"] == s for f in real) for s in ("error", "warning", "info")}
    controls = negative_control_check(to_frame(records), found)
    missed = ", ".join(controls.loc[~controls["flagged"], "control"])
    print(f"findings about real code: {by_severity['error']} error, {by_severity['warning']} warning, "
          f"{by_severity['info']} info ({run_dir / FINDINGS_FILE}); negative controls flagged: "
          f"{int(controls['flagged'].sum())}/{len(controls)}" + (f" (NOT flagged: {missed})" if missed else ""))
    print(f"report: {paths['index_md']} (also {paths['index_html'].name}, {len(paths['figures'])} figures)")
    return paths


class UsageArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad argument as UsageError: one line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)
