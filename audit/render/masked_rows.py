"""What a variant returns on rows that see no key (the records' `masked_rows`): the report's Fully
masked rows table, one column per scenario that has such rows, and the verdict's few words on it.

The verdict's cell stays short whatever the grid holds: where the answer differs between scenarios
beyond the two mask forms, it says how many scenarios give each answer ("NaN 4 · zero 1": four
scenarios NaN, one zero), linked to the table and with the full list as the link's title. Listing every scenario made the
column as wide as its longest scenario name and cut the verdict's last column at 1400 px
(tests/test_html_browser.py). Reads the records frame; never measures, never imports torch.
"""
from __future__ import annotations

import re

import pandas as pd

from ..analysis.numerics_rules import FINFO_MIN_SCENARIO
from .data import MASK_FORMS, describe_values, ok_rows, scenario_order, variant_order
from .page import Block, Heading, Inline, Link, Table, para, slugify

MASKED_ROWS_HEADING = "Fully masked rows"
MASKED_ROWS_ANCHOR = slugify(MASKED_ROWS_HEADING)
# Masks whose "fully masked" rows are finite (finfo.min): every variant attends uniformly there by
# design, so they say nothing about what a variant does with a row that sees no key.
FINITE_MASK_SCENARIOS = (FINFO_MIN_SCENARIO,)
FORM_LABELS = dict(MASK_FORMS)          # scenario -> its mask form's label (bool, -inf float, ...)
NOT_TESTED = "not tested"


def _label(scenario: str) -> str:
    return FORM_LABELS.get(scenario, scenario)


def _nan_word(text: str) -> str:
    return re.sub(r"\bnan\b", "NaN", text)


def _rows_with_masked_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows whose cells have rows that see no key (finite finfo.min masks left out)."""
    if "masked_rows" not in rows.columns:
        return rows.iloc[0:0]
    return rows[rows["masked_rows"].notna() & ~rows["scenario"].astype(str).isin(FINITE_MASK_SCENARIOS)]


def _scenarios(present: pd.Series) -> list[str]:
    """The scenarios present, as the table's columns run: the mask forms, then the others in the
    catalogue's order."""
    names = set(present.astype(str))
    return [s for s, _ in MASK_FORMS if s in names] + [s for s in scenario_order(names) if s not in FORM_LABELS]


def by_scenario(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """(scenario label, what its cells return), in the table's column order, over the rows' cells with
    rows that see no key: [("bool", "NaN"), ("left_padding", "NaN (fp32), zero (fp16)")]."""
    rows = _rows_with_masked_rows(rows)
    scenarios = rows["scenario"].astype(str) if not rows.empty else pd.Series(dtype=str)
    out = []
    for scenario in _scenarios(scenarios):
        text = describe_values(rows[scenarios == scenario], "masked_rows")
        if text:
            out.append((_label(scenario), _nan_word(text)))
    return out


def masked_rows_summary(rows: pd.DataFrame) -> tuple[str, str]:
    """(masked_rows_text, and where it counts scenarios, the scenarios behind the counts: "NaN: bool,
    -inf float, left_padding, packed; zero: sinks"; else "")."""
    rows = _rows_with_masked_rows(rows)
    if rows.empty:
        return NOT_TESTED, ""
    whole = describe_values(rows, "masked_rows") or NOT_TESTED
    if not whole.startswith("{"):
        return _nan_word(whole), ""
    pairs = by_scenario(rows)
    if all(label in FORM_LABELS.values() for label, _ in pairs):
        return "; ".join(f"{label}: {text}" for label, text in pairs), ""
    groups: dict[str, list[str]] = {}
    for label, text in pairs:
        groups.setdefault(text, []).append(label)
    ranked = sorted(groups.items(), key=lambda item: -len(item[1]))      # the commonest answer first
    first, n_first = ranked[0][0], len(ranked[0][1])
    text = " · ".join(f"{answer} {len(labels)}" for answer, labels in ranked)
    return text, "; ".join(f"{answer}: {', '.join(labels)}" for answer, labels in ranked)


def masked_rows_text(rows: pd.DataFrame) -> str:
    """What a variant returns on rows that see no key, over its ok cells that have such rows
    (finite finfo.min masks left out): "zero", "NaN", "zero (fp32), NaN (fp16)"; split by mask form
    when forms differ ("bool: other; -inf float: zero"); where other scenarios differ too, how many
    scenarios give each answer ("NaN 4 · zero 1": masked_rows_summary names them);
    "not tested" when none ran."""
    return masked_rows_summary(rows)[0]


def masked_rows_cell(text: str, detail: str) -> Inline:
    """The verdict's cell: the text, or where it counts scenarios, a link to the table of them all
    with the list as its title."""
    return Link(text, "#" + MASKED_ROWS_ANCHOR, title=detail) if detail else text


def masked_rows_table(frame: pd.DataFrame) -> pd.DataFrame:
    """What each variant returns on fully masked rows: columns variant, then one per mask form present
    (bool, -inf float, finfo.min float), then one per other scenario with such rows (left_padding,
    packed, sinks, ...); values nan, zero, uniform, other, mixed, or a split such as
    "nan (fp32), other (fp16)"."""
    ok = ok_rows(frame)
    if "masked_rows" not in ok.columns:
        return pd.DataFrame(columns=["variant"])
    ok = ok[ok["masked_rows"].notna()]
    columns = [(s, _label(s)) for s in _scenarios(ok["scenario"])]
    out = []
    for variant in variant_order(ok["variant"]):
        rows = ok[ok["variant"] == variant]
        out.append({"variant": variant, **{label: describe_values(rows[rows["scenario"] == s], "masked_rows")
                                           for s, label in columns}})
    return pd.DataFrame(out, columns=["variant", *[label for _, label in columns]])


def masked_rows_section(frame: pd.DataFrame) -> list[Block]:
    table = masked_rows_table(frame)
    if table.empty or len(table.columns) < 2:
        return []
    return [
        Heading(2, MASKED_ROWS_HEADING),
        para("Hand-written softmax gives NaN for query rows that see no key; SDPA returns 0 "
             "for them. A finfo.min float mask is finite, so such rows are not masked at all: "
             "they attend uniformly to the masked keys."),
        para("Where the table says other under finfo.min, the rows are finite but not exactly "
             "the mean of all values, for example because causal masking still limits a row to "
             "the keys before it."),
        para("Per variant and mask form, then per other scenario with rows that see no key "
             "(left_padding's first rows with causal masking, packed's padding rows past its last "
             "document, the masked rows of the sinks scenarios: docs/scenarios.md), what those rows "
             "hold: nan, zero, uniform (the mean of all values), other (finite, neither zero nor "
             "uniform) or mixed (more than one in a cell); — where the variant ran no such cell. A "
             "split such as \"nan (fp32), other (fp16)\" names the axis along which the answer "
             "changes; {a, b}: differs with no single axis."),
        Table(table),
    ]
