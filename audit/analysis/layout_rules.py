"""The finding rules of the layouts and of invariance: packed documents that see each other, a paged
kernel reading slots of its cache it must not, rows whose bits depend on the batch or on chunking."""
from __future__ import annotations

import pandas as pd

from ..core.defects import crosses_documents, reads_unused_slots
from ..core.diagnosis_names import members, title_of
from .finding_rows import _finding, _num, _ok, _per_variant, _rows_where, _where
from .rule_registry import rule


@rule(80)
def check_cross_document(frame: pd.DataFrame) -> list[dict]:
    """Packed documents that attend each other: a document's output moves with the other documents."""
    ok = _ok(frame)
    rows = ok[_rows_where(ok, crosses_documents)]

    def make(variant: str, g: pd.DataFrame) -> dict:
        return _finding("cross_document", "error", variant,
                        f"{variant} attends across packed documents in {len(g)} cell(s): a document's output "
                        f"changes by up to {_num(g, 'cross_doc_max_change').max():.3g} when the other documents' "
                        f"keys and values change ({_where(g)}). Training on packed sequences with it mixes "
                        f"unrelated documents.", g["id"])
    return _per_variant(rows, make)


@rule(90)
def check_paged_reads(frame: pd.DataFrame) -> list[dict]:
    """A paged kernel that reads slots of its cache it must not: the mistake its output matches."""
    from ..workload.paged_mistakes import PAGED_MISTAKES
    ok = _ok(frame)
    rows = ok[_rows_where(ok, reads_unused_slots)]

    def make(variant: str, g: pd.DataFrame) -> dict:
        names = [n for n in g.get("paged_diagnosis", pd.Series(dtype=object)).dropna().astype(str) if members(n)]
        found, named = ".", {"diagnosis": "none", "diagnosis_cells": 0}
        if names:
            top = max(sorted(set(names)), key=names.count)
            title = title_of(top, PAGED_MISTAKES)
            what = "a known mistake" if len(members(top)) < 2 else "known mistakes its inputs cannot tell apart"
            found = (f". Diagnosis: in {names.count(top)} of {len(g)} cell(s) the output matches {what}, {title}: "
                     + _explained([PAGED_MISTAKES[n] for n in members(top) if n in PAGED_MISTAKES]))
            errs = _num(g[g["paged_diagnosis"] == top], "paged_diagnosis_err")
            named = {"diagnosis": top, "diagnosis_title": title, "diagnosis_cells": names.count(top),
                     "diagnosis_err": float(errs.min()), "diagnosis_golden_err": None}
        return {**_finding("paged_reads", "error", variant,
                           f"{variant} reads slots of its paged KV cache that no sequence uses in {len(g)} cell(s): "
                           f"its output changes by up to {_num(g, 'paged_unread_max_change').max():.3g} with their "
                           f"contents ({_where(g)}); on a fresh pool their zeros hide it{found}", g["id"]), **named}
    return _per_variant(rows, make)


def _explained(known: list) -> str:
    """What each paged mistake does and where it usually sits, one after another (the last without its
    closing period: the finding's message ends there)."""
    texts = [f"{m.what} Usually {m.where}" for m in known]
    return " ".join(t if i == len(texts) - 1 or t.endswith(".") else t + "." for i, t in enumerate(texts))


@rule(200)
def check_invariance(frame: pd.DataFrame) -> list[dict]:
    """Variants whose rows depend on the rest of the batch or on chunking: a warning, as determinism is;
    an error where the chunked output is outside the error budget (chunked prefill computes other attention)."""
    ok, out = _ok(frame), []
    for check, what in (("batch", "batch row 0 computed alone differs from the same row in the full batch"),
                        ("chunk", "the queries in two chunks (chunked prefill) differ from the single-shot output")):
        if f"{check}_invariant" not in ok:
            continue
        checked = ok[ok[f"{check}_invariant"].astype("object").isin([True, False])]
        rows = checked[checked[f"{check}_invariant"].astype("object").eq(False)]
        for variant, g in rows.groupby("variant", sort=True):
            wrong = g[g.get("chunk_within_budget", pd.Series(dtype=object)).astype("object").eq(False)] \
                if check == "chunk" else g.iloc[:0]
            text = (f"; outside the error budget in {len(wrong)} of them: two chunks against a KV prefix do not "
                    f"compute the single shot's attention" if len(wrong) else
                    ". A trainer and a server cutting the work differently will not agree bit for bit")
            out.append(_finding(f"{check}_invariance", "error" if len(wrong) else "warning", str(variant),
                                f"{variant} is not {check} invariant: {what} in {len(g)} of "
                                f"{int((checked['variant'] == variant).sum())} cell(s), by up to "
                                f"{_num(g, f'{check}_max_diff').max():.3g} ({_where(g)}){text}.", g["id"]))
    return out
