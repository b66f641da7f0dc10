"""`make gpu-check` / `python -m audit.gpucheck`: a reduced gpu preset in one prepared call.

Runs the speed cells of the gpu preset for bf16 and fp16 at d_k 128 (about 130
cells, a few minutes on an H200), prints a compact table, the energy plausibility
check (NVML counter vs mean power x time) and sdpa_flash's fraction of the
measured bf16 matmul ceiling, and, when $OUT is set, copies the run's key files
and a tarball of the whole run folder there.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

CHECK_ARGS = ("--preset", "gpu", "--scenario", "normal", "--dtype", "bf16", "fp16", "--d-k", "128",
              "--variant", "eager", "sdpa", "sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn",
              "compiled", "flex")
KEY_FILES = ("records.jsonl", "run.json", "findings.json", "index.md")
FLAGSHIP = dict(variant="sdpa_flash", dtype="bf16", d_k=128, seq_len=8192)


def compact_table(frame: "pd.DataFrame") -> "pd.DataFrame":
    """variant, dtype, seq_len, causal, ms, TFLOP/s, pct_of_limit, J/call, NaN for the ok cells."""
    import pandas as pd

    ok = frame[frame["status"] == "ok"].copy()
    table = pd.DataFrame({
        "variant": ok["variant"], "dtype": ok["dtype"], "seq_len": ok["seq_len"], "causal": ok["causal"],
        "ms": ok["fwd_ms"], "TFLOP/s": pd.to_numeric(ok["gflops_per_s"]) / 1e3,
        "pct_of_limit": ok["pct_of_limit"], "J/call": ok["energy_per_call_j"],
        "NaN": ok["out_nan"],
    })
    return table.sort_values(["dtype", "seq_len", "causal", "variant"]).reset_index(drop=True)


def energy_check(frame: "pd.DataFrame") -> "pd.DataFrame":
    """Counter energy per call against mean power x median time: the ratio should be near 1."""
    import pandas as pd

    ok = frame[(frame["status"] == "ok") & frame["energy_per_call_j"].notna()].copy()
    power_time = pd.to_numeric(ok["mean_power_w"]) * pd.to_numeric(ok["fwd_ms"]) / 1e3
    ok["power_x_time_j"] = power_time
    ok["ratio"] = pd.to_numeric(ok["energy_per_call_j"]) / power_time
    return ok[["id", "energy_method", "energy_per_call_j", "power_x_time_j", "ratio"]]


def flagship_fraction(frame: "pd.DataFrame", ceilings: dict | None) -> str:
    """sdpa_flash bf16 d128 T8192: achieved FLOP/s over the measured bf16 matmul ceiling."""
    rows = frame[(frame["status"] == "ok")
                 & (frame[list(FLAGSHIP)] == list(FLAGSHIP.values())).all(axis=1)]
    peak = ((ceilings or {}).get("cuda") or {}).get("matmul_flops_per_s", {}).get("bf16")
    if rows.empty or not peak:
        return "sdpa_flash bf16 d128 T8192: not measured"
    parts = []
    for _, r in rows.iterrows():
        parts.append(f"{'causal' if r['causal'] else 'full'}: {r['gflops_per_s'] / 1e3:.1f} TFLOP/s = "
                     f"{r['gflops_per_s'] * 1e9 / peak:.1%} of the measured bf16 matmul ceiling "
                     f"({peak / 1e12:.0f} TFLOP/s)")
    return "sdpa_flash bf16 d128 T8192: " + "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    import json

    import pandas as pd
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); "
              "run it on a GPU machine", file=sys.stderr)
        return 2
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path("reports") / f"gpu-check-{stamp}"
    cmd = [sys.executable, "-m", "audit", "run", *CHECK_ARGS, "--out", str(run_dir), *(argv or [])]
    code = subprocess.call(cmd)
    if code != 0:
        return code
    from .records import load

    frame = load(run_dir)
    ceilings = json.loads((run_dir / "run.json").read_text()).get("ceilings")
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.float_format", "{:.4g}".format):
        text = "\n".join([compact_table(frame).to_string(index=False), "",
                          "energy: NVML counter vs mean power x time",
                          energy_check(frame).to_string(index=False), "",
                          flagship_fraction(frame, ceilings)])
    (run_dir / "table.txt").write_text(text + "\n")
    out = os.environ.get("OUT")
    if out:
        dest = Path(out)
        dest.mkdir(parents=True, exist_ok=True)
        for name in (*KEY_FILES, "table.txt"):
            if (run_dir / name).exists():
                shutil.copy2(run_dir / name, dest / name)
        with tarfile.open(dest / "gpu-check-run.tar.gz", "w:gz") as tar:
            tar.add(run_dir, arcname=run_dir.name)
        print(f"gpu-check: copied the run's key files and gpu-check-run.tar.gz to {dest}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
