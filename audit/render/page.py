"""Blocks of a page and their two renderings: Markdown and self-contained HTML.

A page is a list of blocks (heading, paragraph, code, table, figure, contents), rendered
to Markdown and to HTML from the same list, so the two never diverge. Paragraphs and table
cells may hold inline parts (Mono, Link, Badge) besides plain text. The HTML page needs no
network: its CSS is inline and figures are relative paths into the same folder.
"""
from __future__ import annotations

import html
import math
import numbers
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Union
from urllib.parse import quote

import numpy as np
import pandas as pd
from ..core.runfolder import INDEX_HTML, INDEX_MD

MISSING = "—"
SEVERITIES = ("error", "warning", "info")


# --------------------------------------------------------------------------- inline parts

@dataclass(frozen=True)
class Mono:
    """Inline code inside a paragraph (names such as `fwd_ms` or `broken.*`)."""

    text: str


@dataclass(frozen=True)
class Link:
    """A link to a file of the same folder (relative path) or a heading (#id); title: what a
    pointer resting on it shows (HTML's title, Markdown's link title)."""

    text: str
    href: str
    title: str = ""


@dataclass(frozen=True)
class Badge:
    """A severity marker: coloured by `kind` (error, warning, info; default: the text
    itself) in HTML, bold in paragraphs and plain in tables in Markdown."""

    text: str
    kind: str = ""


@dataclass(frozen=True)
class Anchor:
    """A link target inside a paragraph or a table cell (`#name` lands on it), so a table row
    such as one finding can be linked to from elsewhere on the page, in Markdown and HTML."""

    name: str
    text: str = ""


@dataclass(frozen=True)
class Span:
    """Several inline parts in one table cell (a badge and a link, an anchor and a badge);
    keep_together: one unbroken line in HTML (a short badge and its words); struck: shown struck
    through (a speed the referee found was not of the work)."""

    parts: tuple["Inline", ...]
    keep_together: bool = False
    struck: bool = False

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p.text for p in self.parts)


Inline = Union[str, Mono, Link, Badge, Anchor, Span]
INLINE_TYPES = (Mono, Link, Badge, Anchor, Span)


# --------------------------------------------------------------------------- blocks

@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    parts: tuple[Inline, ...]


@dataclass(frozen=True)
class Code:
    text: str


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    filename: str
    title: str
    caption: str


@dataclass(frozen=True)
class Contents:
    """Where the table of contents goes: links to every heading of `levels` on the page, those
    above it too (the verdict comes before the contents, so it is read first)."""

    levels: tuple[int, ...] = (2, 3)


Block = Union[Heading, Paragraph, Code, Table, Figure, Contents]


def para(*parts: Inline) -> Paragraph:
    return Paragraph(tuple(parts))


# --------------------------------------------------------------------------- cells

def format_value(value: Any) -> str:
    """Display text of one table cell: 3 significant digits, blanks for missing."""
    if isinstance(value, INLINE_TYPES):
        return value.text
    if value is None or value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isnan(number):
            return MISSING
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        if number == 0:
            return "0"
        magnitude = math.floor(math.log10(abs(number)))
        if magnitude >= 5 or magnitude < -3:
            return f"{number:.2e}"
        return f"{number:.{max(0, 2 - magnitude)}f}"
    return str(value)


def _is_missing(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT or value == MISSING:
        return True
    return isinstance(value, float) and math.isnan(value)


def _is_number(value: Any) -> bool:
    """A real number, or text that reads as one ("1.00", "inf"); true/false is not."""
    if isinstance(value, (bool, np.bool_)) or isinstance(value, INLINE_TYPES):
        return False
    if isinstance(value, numbers.Real):
        return True
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return False
        return True
    return False


def numeric_columns(frame: pd.DataFrame) -> list[bool]:
    """Per column: True when every value present is a number (right-aligned), else text."""
    out = []
    for _, column in frame.items():
        present = [v for v in column.tolist() if not _is_missing(v)]
        out.append(bool(present) and all(_is_number(v) for v in present))
    return out


def severity_badges(frame: pd.DataFrame, column: str = "severity") -> pd.DataFrame:
    """The frame with `column`'s values as Badge parts (coloured in HTML)."""
    if column not in frame.columns:
        return frame
    return frame.assign(**{column: [Badge(str(v)) for v in frame[column]]})


# --------------------------------------------------------------------------- markdown

def _markdown_inline(parts: Iterable[Inline], in_table: bool = False) -> str:
    """Inline parts as Markdown; in a table cell a badge is plain text (bold is noise there)."""
    out = []
    for part in parts:
        if isinstance(part, Span):
            inner = _markdown_inline(part.parts, in_table)
            out.append(f"~~{inner}~~" if part.struck else inner)
        elif isinstance(part, Anchor):
            out.append(f'<a id="{html.escape(part.name)}"></a>{part.text}')
        elif isinstance(part, Badge) and in_table:
            out.append(part.text)
        elif isinstance(part, Mono):
            out.append(f"`{part.text}`")
        elif isinstance(part, Link):
            title = ' "{}"'.format(part.title.replace('"', "'")) if part.title else ""
            out.append(f"[{part.text}]({quote(part.href, safe='/#.-_~')}{title})")
        elif isinstance(part, Badge):
            out.append(f"**{part.text}**")
        else:
            out.append(part)
    return "".join(out)


def markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame (index ignored) as a GitHub-flavoured markdown table; numeric
    columns right-aligned."""
    def cell(value: Any) -> str:
        text = (_markdown_inline([value], in_table=True) if isinstance(value, INLINE_TYPES)
                else format_value(value))
        return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")

    rule = ["---:" if numeric else "---" for numeric in numeric_columns(frame)]
    lines = ["| " + " | ".join(cell(str(c)) for c in frame.columns) + " |",
             "|" + "|".join(rule) + "|"]
    for row in frame.astype(object).itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def slugify(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def heading_ids(blocks: Iterable[Block]) -> dict[int, str]:
    """id(heading) -> unique anchor (a repeated title gets -1, -2, as on GitHub)."""
    seen: dict[str, int] = {}
    ids: dict[int, str] = {}
    for block in blocks:
        if isinstance(block, Heading):
            slug = slugify(block.text) or "section"
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            ids[id(block)] = slug if count == 0 else f"{slug}-{count}"
    return ids


def _contents_entries(blocks: list[Block], levels: tuple[int, ...],
                      ids: dict[int, str]) -> list[tuple[int, str, str]]:
    """(depth, text, anchor) of the page's headings whose level is listed, in page order."""
    top = min(levels)
    return [(b.level - top, b.text, ids[id(b)]) for b in blocks
            if isinstance(b, Heading) and b.level in levels]


def render_markdown(blocks: Iterable[Block]) -> str:
    blocks = list(blocks)
    ids = heading_ids(blocks)
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + block.text)
        elif isinstance(block, Paragraph):
            out.append(_markdown_inline(block.parts))
        elif isinstance(block, Code):
            out.append("```\n" + block.text + "\n```")
        elif isinstance(block, Table):
            caption = f"*{block.caption}*\n\n" if block.caption else ""
            out.append(caption + markdown_table(block.frame))
        elif isinstance(block, Contents):
            entries = _contents_entries(blocks, block.levels, ids)
            if entries:
                out.append("**Contents**\n\n" + "\n".join(
                    "  " * depth + f"- [{text}](#{anchor})" for depth, text, anchor in entries))
        else:
            out.append(f"![{block.title}]({block.filename})\n\n{block.caption}")
    return "\n\n".join(out) + "\n"


# --------------------------------------------------------------------------- html

def _html_inline(parts: Iterable[Inline]) -> str:
    out = []
    for part in parts:
        if isinstance(part, Span):
            inner = _html_inline(part.parts)
            inner = f"<s>{inner}</s>" if part.struck else inner
            out.append(f'<span class="keep">{inner}</span>' if part.keep_together else inner)
        elif isinstance(part, Anchor):
            out.append(f'<span id="{html.escape(part.name)}">{html.escape(part.text)}</span>')
        elif isinstance(part, Mono):
            out.append(f"<code>{html.escape(part.text)}</code>")
        elif isinstance(part, Link):
            title = f' title="{html.escape(part.title)}"' if part.title else ""
            out.append(f'<a href="{html.escape(part.href)}"{title}>{html.escape(part.text)}</a>')
        elif isinstance(part, Badge):
            kind = part.kind or part.text
            kind = kind if kind in SEVERITIES else "other"
            out.append(f'<span class="badge sev-{kind}">{html.escape(part.text)}</span>')
        else:
            out.append(html.escape(part))
    return "".join(out)


UNBROKEN_CH = 24    # text columns are at least this wide (in ch) before a word may break


def _min_width(column: pd.Series) -> str:
    """A text column's minimum width: its longest word, up to UNBROKEN_CH characters, so
    names like compiled_unfused stay whole and only longer strings (cell ids) wrap."""
    longest = max((len(word) for value in column.tolist()
                   for word in format_value(value).split()), default=0)
    return f' style="min-width: calc({min(longest, UNBROKEN_CH)}ch + 1.2em)"'


def html_table(frame: pd.DataFrame) -> str:
    """A DataFrame (index ignored) as an HTML table with the same cell text as markdown;
    numeric columns carry class "num" (right-aligned), text columns class "text"."""
    classes = ["num" if numeric else "text" for numeric in numeric_columns(frame)]
    head = "".join(f'<th class="{c}"{_min_width(column) if c == "text" else ""}>'
                   f"{html.escape(str(name))}</th>"
                   for c, name, (_, column) in zip(classes, frame.columns, frame.items()))
    rows = []
    for row in frame.astype(object).itertuples(index=False):
        cells = "".join(
            f'<td class="{c}">'
            + (_html_inline([v]) if isinstance(v, INLINE_TYPES) else html.escape(format_value(v)))
            + "</td>" for c, v in zip(classes, row))
        rows.append(f"<tr>{cells}</tr>")
    return (f'<div class="table-wrap"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
            + "\n".join(rows) + "\n</tbody>\n</table></div>")


CSS = """
*, *::before, *::after { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1.2em;
       color: #222; line-height: 1.45; overflow-wrap: anywhere; }
h1, h2, h3 { line-height: 1.2; }
h2 { margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
a { color: #0550ae; }
.table-wrap { max-width: 100%; overflow-x: auto; margin: 0.5em 0 1.5em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.4em; vertical-align: top; }
th { background: #f2f2f2; overflow-wrap: normal; }
.text { text-align: left; }
td.text { overflow-wrap: anywhere; }
.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #fafafa; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; white-space: pre-wrap; }
code { background: #f2f2f2; padding: 0 0.2em; overflow-wrap: anywhere; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
img { max-width: 100%; height: auto; }
.caption { font-style: italic; margin-bottom: 0.2em; }
nav.toc { background: #f7f7f7; border: 1px solid #ddd; padding: 0.4em 1.2em; margin: 1em 0; }
nav.toc h2 { margin: 0.4em 0; border: 0; font-size: 1.1em; }
nav.toc ul { margin: 0.2em 0; padding-left: 1.2em; }
nav.toc > ul { columns: 3 16em; }
nav.toc li { break-inside: avoid; }
.badge { display: inline-block; padding: 0.05em 0.5em; border-radius: 0.7em; font-size: 0.85em;
         font-weight: 600; white-space: nowrap; }
.sev-error { background: #fde2e1; color: #a40e26; border: 1px solid #f4a9a4; }
.sev-warning { background: #fff1c2; color: #7a4d00; border: 1px solid #f0cf6c; }
.sev-info { background: #e1edfb; color: #0b4a8b; border: 1px solid #a9c8ee; }
.sev-other { background: #eee; color: #333; border: 1px solid #ccc; }
.keep { white-space: nowrap; }
"""


def _html_contents(entries: list[tuple[int, str, str]]) -> str:
    """Nested lists of links, one level per heading depth."""
    out = ['<nav class="toc"><h2>Contents</h2>']
    depth = -1
    for level, text, anchor in entries:
        while depth < level:
            out.append("<ul>")
            depth += 1
        while depth > level:
            out.append("</ul>")
            depth -= 1
        out.append(f'<li><a href="#{html.escape(anchor)}">{html.escape(text)}</a></li>')
    out.extend(["</ul>"] * (depth + 1))
    out.append("</nav>")
    return "".join(out)


def render_html(blocks: Iterable[Block], title: str = "attn-audit report") -> str:
    blocks = list(blocks)
    ids = heading_ids(blocks)
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f'<h{block.level} id="{html.escape(ids[id(block)])}">'
                       f"{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{_html_inline(block.parts)}</p>")
        elif isinstance(block, Code):
            out.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
        elif isinstance(block, Table):
            caption = (f'<p class="caption">{html.escape(block.caption)}</p>'
                       if block.caption else "")
            out.append(caption + html_table(block.frame))
        elif isinstance(block, Contents):
            entries = _contents_entries(blocks, block.levels, ids)
            if entries:
                out.append(_html_contents(entries))
        else:
            out.append(f'<figure><img src="{html.escape(block.filename)}" '
                       f'alt="{html.escape(block.title)}">'
                       f"<figcaption>{html.escape(block.caption)}</figcaption></figure>")
    body = "\n".join(out)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"{body}\n</body>\n</html>\n")


def write_page(out_dir: Path, blocks: list[Block], title: str) -> dict[str, Path]:
    """Write out_dir/index.md and out_dir/index.html from one list of blocks.

    `title` is the HTML page title; a visible title is the blocks' own first heading, and a
    Contents() block marks where the table of contents goes. Figures must already be in
    out_dir (the pages refer to them by file name). Returns {"index_md", "index_html"}.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    index_md = out_dir / INDEX_MD
    index_html = out_dir / INDEX_HTML
    index_md.write_text(render_markdown(blocks), encoding="utf-8")
    index_html.write_text(render_html(blocks, title=title), encoding="utf-8")
    return {"index_md": index_md, "index_html": index_html}
