"""The model audit's section: the error through the decoder, layer by layer (a figure, one line per
variant and dtype), a table per variant and dtype, the float64 model's spread and the findings."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..analysis.model_rules import MODEL_BASELINES, variant_rows
from .page import Block, Figure, Heading, Mono, Table, para

HEADING = "Model audit"
FIGURE_FILE = "model_error.png"
TABLE_COLUMNS = {"variant": "variant", "dtype": "dtype", "model": "model",
                 "final_hidden_err": "error after last layer", "growth_median": "growth / layer (median)",
                 "growth_max": "growth / layer (max)", "kl": "next-token KL", "top1_agreement": "top-1 agreement",
                 "logprob_check": "logprob check", "batch_bitwise": "batch of 1 bitwise",
                 "chunk_err": "chunked prefill error", "status": "status"}


def model_table(records: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """One row per variant, dtype and model: the table's columns (TABLE_COLUMNS)."""
    rows = variant_rows(records)
    if rows.empty:
        return pd.DataFrame(columns=list(TABLE_COLUMNS.values()))
    for column in TABLE_COLUMNS:
        if column not in rows.columns:
            rows[column] = None
    return rows[list(TABLE_COLUMNS)].rename(columns=TABLE_COLUMNS)


def draw_model_error(records: list[dict] | pd.DataFrame, out: Path) -> Path | None:
    """Hidden-state error against layer, one line per variant and dtype, a panel per model; None when
    nothing ran."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plotting import dtype_style, save_figure, variant_colors
    rows = variant_rows(records)
    if rows.empty or "hidden_err" not in rows.columns:
        return None
    rows = rows[(rows["status"] == "ok") & rows["hidden_err"].map(lambda e: isinstance(e, list) and len(e) > 0)]
    if rows.empty:
        return None
    models = list(dict.fromkeys(rows["model"]))
    colors = variant_colors(rows["variant"])
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        for _, r in rows[rows["model"] == model].iterrows():
            errs = [max(e, 1e-17) for e in r["hidden_err"]]
            marker, line = dtype_style(r["dtype"])
            ax.plot(range(1, len(errs) + 1), errs, line, marker=marker, markersize=3,
                    color=colors[r["variant"]], label=f"{r['variant']} {r['dtype']}")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_ylabel("hidden state error vs float64 (relative RMSE)")
        ax.set_title(model, fontsize=9)
        ax.legend(fontsize=7)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, out)
    return out


def model_section(records: list[dict] | pd.DataFrame, findings: list[dict], figure: Path | None,
                  link: str | None = None) -> list[Block]:
    """The section's blocks (empty when there are no model records)."""
    frame = records if isinstance(records, pd.DataFrame) else pd.DataFrame(list(records))
    if frame.empty or "kind" not in frame.columns:
        return []
    blocks: list[Block] = [Heading(2, HEADING), para(
        "Each variant runs as the attention of a small decoder (transformers, weights shaped as a trained "
        "model's: docs/model.md) in each dtype, against the same model in float64 with float64 attention. "
        "The error is the hidden state's after each layer (RMSE relative to its RMS); growth is its ratio from "
        "one layer to the next; the next-token distribution is compared by KL divergence, top-1 agreement and "
        "vLLM's logprob check. ", Mono(MODEL_BASELINES[0]), " is the yardstick of the findings (",
        Mono(MODEL_BASELINES[1]), " in a model whose sinks it cannot take).")]
    for _, r in frame[frame["kind"].isin(["left_out", "unavailable"])].iterrows():
        models = ", ".join(r.get("models") or []) if isinstance(r.get("models"), list) else ""
        blocks.append(para(f"No model audit{' of ' + models if models else ''}: {r.get('reason')}."))
    reference = frame[frame["kind"] == "reference"]
    for _, r in reference.iterrows():
        if isinstance(r.get("status"), str) and r.get("status") != "ok":     # (records before schema 1's status: ok)
            blocks.append(para(f"{r['model']}: its float64 run did not complete ({r.get('status')}): "
                               f"{r.get('reason')}; its variants were not run."))
            continue
        stds = ", ".join(f"{s:.2f}" for s in (r.get("logit_std") or []))
        blocks.append(para(f"{r['model']} in float64: attention logits' std per layer {stds}; "
                           f"{100 * float(r.get('peaked_heads') or 0):.0f}% of heads peaked; next-token entropy "
                           f"{float(r.get('next_token_entropy') or 0):.2f} nats, the most likely token's probability "
                           f"{float(r.get('next_token_top1_prob') or 0):.2f} on average."))
    if figure is not None:
        blocks.append(Figure(link or figure.name, "Error through the decoder",
                             "Hidden-state error against layer, one line per variant and dtype (log scale)"))
    table = model_table(frame)
    if not table.empty:
        blocks.append(Table(table, caption="Per variant and dtype: the error through the decoder and the next token"))
    for f in findings:
        blocks.append(para(f"{f['severity']}: {f['message']}"))
    return blocks
