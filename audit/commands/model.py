"""`audit model`: does swapping the attention change the model? A small decoder (transformers, built from
a config in code, no download) run with each variant as its attention, in each dtype, against the same
model in float64: the error after each layer, its growth, the next-token distribution (docs/model.md).
Python: audit.model(models=[...], variants=[...], dtypes=[...], out=DIR) returns the records.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from ..core.dtypes import dtype_names, model_dtypes
from ..core.errors import UsageError
from ..core.runfolder import MODEL_FILE as RECORDS_FILE, MODEL_FINDINGS_FILE as FINDINGS_FILE
from ..workload.model import MODEL_VARIANTS as DEFAULT_VARIANTS

HELP = "run a small decoder with each variant as its attention against float64, layer by layer"
DESCRIPTION = (HELP + ": the hidden state's error after each layer and its growth, the next-token KL, top-1 "
               "agreement and vLLM's logprob check, batch of one against the batch, chunked prefill against one "
               "prefill. Needs transformers (pip install -e '.[hf]'). docs/model.md.")
DEFAULT_MODELS = ("llama-tiny", "gpt-oss-tiny")
DEVICES = ("cpu", "cuda")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..workload.model import MODEL_SPECS
    parser.add_argument("--model", nargs="+", default=list(DEFAULT_MODELS), metavar="NAME",
                        help=f"the decoders (default: {' '.join(DEFAULT_MODELS)}; allowed: {', '.join(MODEL_SPECS)})")
    parser.add_argument("--variant", nargs="+", default=list(DEFAULT_VARIANTS), metavar="NAME",
                        help=f"the attention variants, sdpa among them for the findings (default: "
                             f"{' '.join(DEFAULT_VARIANTS)}); any name `run` takes")
    parser.add_argument("--dtype", nargs="+", default=list(model_dtypes()), metavar="DTYPE",
                        help=f"{', '.join(dtype_names())} (default: {' '.join(model_dtypes())})")
    parser.add_argument("--device", default="cpu", metavar="DEVICE",
                        help="cpu or cuda: where the model and its float64 run go (default: cpu)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="where the records, the page and the figure go (default: reports/model-<timestamp>)")


def model(models: Sequence[str] = DEFAULT_MODELS, variants: Sequence[str] = DEFAULT_VARIANTS,
          dtypes: Sequence[str] | None = None, out: str | Path | None = None,
          device: str = "cpu") -> list[dict[str, Any]]:
    """The model audit's records (a reference record per model, one per model, variant and dtype: None,
    the registry's model dtypes, core.dtypes.model_dtypes), written with its findings, page and figure to
    `out` when given. UsageError for a bad name, dtype or device, or a missing transformers."""
    from ..measure.model_audit import audit_model
    from ..workload.hf import transformers_version
    from ..workload.model import check_model_name
    from ..workload.variants import resolve
    specs = [check_model_name(m) for m in models]
    dtypes = model_dtypes() if dtypes is None else dtypes
    bad = [d for d in dtypes if d not in dtype_names()]
    if bad:
        raise UsageError(f"--dtype: unknown dtype {bad[0]!r}; allowed: {', '.join(dtype_names())}")
    if device not in DEVICES:
        raise UsageError(f"--device: unknown device {device!r}; allowed: {', '.join(DEVICES)}")
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise UsageError("--device: cuda is not available on this machine (torch.cuda.is_available() is "
                             "False); allowed here: cpu")
    chosen = [resolve(v) for v in variants]
    if transformers_version() is None:
        raise UsageError("model: transformers is not installed; pip install -e '.[hf]'")
    records = [r for spec in specs for r in audit_model(spec, chosen, list(dtypes), device)]
    if out is not None:
        write(Path(out), records)
    return records


def write(out: Path, records: list[dict[str, Any]]) -> dict[str, Path]:
    """out/model.jsonl, out/model_findings.json, out/index.md and index.html, out/model_error.png."""
    from ..analysis.model_rules import check_model
    from ..render.model_section import FIGURE_FILE, draw_model_error, model_section
    from ..render.page import write_page
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    findings = check_model(records)
    (out / FINDINGS_FILE).write_text(json.dumps(findings, indent=1), encoding="utf-8")
    figure = draw_model_error(records, out / FIGURE_FILE)
    pages = write_page(out, model_section(records, findings, figure), title="attn-audit model audit")
    return {"records": out / RECORDS_FILE, "findings": out / FINDINGS_FILE, **pages}


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import time
    from ..core.paths import reports_root
    out = Path(args.out) if args.out else reports_root() / time.strftime("model-%Y%m%d-%H%M%S")
    records = model(args.model, args.variant, args.dtype, out, args.device)
    from ..analysis.model_rules import check_model
    for f in check_model(records):
        print(f"{f['severity']}: {f['message']}")
    print(f"model audit: {sum(r.get('kind') == 'variant' for r in records)} runs -> {out / 'index.md'}")
    return 0
