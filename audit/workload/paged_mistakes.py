"""Mistakes of a paged KV cache: which slots a wrong kernel reads instead of a sequence's used keys.

A paged mistake says, for sequence b, which row of the block table it reads and how many slots of
it: `reads(b, used, pages_used, width, page_size, batch) -> (table row, slots)`, or (table row, slots,
first): `slots` slots from slot `first` of the row's pages in table order (a page or slot index off by
one: the family `page_index`). The paged check
(measure/checks/output.py: paged_reads) computes each one in float64 on the pools the variant was given
with finite values in the slots it must not read, and names the one its output matches.
Imports no torch (the report's texts come from here).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class PagedMistake:
    name: str
    title: str
    what: str
    where: str
    reads: Callable[[int, int, int, int, int, int], tuple[int, ...]]
    family: str = ""                 # the parameterised mistake it is a member of, or ""


PAGED_MISTAKES: dict[str, PagedMistake] = {}


def paged_mistake(name: str, *, title: str, what: str, where: str) -> Callable[[Callable], Callable]:
    def add(fn: Callable) -> Callable:
        PAGED_MISTAKES[name] = PagedMistake(name, title, what, where, fn)
        return fn
    return add


@paged_mistake("reads_past_used", title="reads past the used length",
               what="Each sequence reads every slot of its used pages and of the next page listed in its "
                    "block-table row: the tail of its last page and one extra page of stale keys.",
               where="a page count rounded up once too often (pages = used // page_size + 1), or a loop bound "
                     "on the table's width instead of the used length (pegainfer#291).")
def reads_past_used(b: int, used: int, pages_used: int, width: int, page_size: int, batch: int) -> tuple[int, int]:
    return b, min(width, pages_used + 1) * page_size


@paged_mistake("reads_last_page_tail", title="reads its last page's tail",
               what="Each sequence reads every slot of its used pages: the unused tail of its last page too.",
               where="a length rounded up to whole pages (pages × page_size) where the used length was meant.")
def reads_last_page_tail(b: int, used: int, pages_used: int, width: int, page_size: int,
                         batch: int) -> tuple[int, int]:
    return b, pages_used * page_size


@paged_mistake("block_table_wrong_sequence", title="block table of the wrong sequence",
               what="Sequence b reads the pages of block-table row b + 1 (its own used length): another "
                    "sequence's keys.",
               where="a batch index off by one or stale block-table rows after a sequence was evicted "
                     "(gittensor-ai-lab/sparkinfer#185).")
def block_table_wrong_sequence(b: int, used: int, pages_used: int, width: int, page_size: int,
                               batch: int) -> tuple[int, int]:
    return (b + 1) % batch, used


# The family page_index: each sequence's slots read from `pages` table entries and `slots` slots later
# than its own (member name, title, what, (pages, slots)).
PAGE_INDEX = (
    ("page_index_next", "pages read one table entry late",
     "Each sequence reads its logical page p from block-table entry p + 1: every key from the page after its own, "
     "the last ones from the extra page listed after its used pages.", (1, 0)),
    ("slot_index_next", "keys read one slot late",
     "Each sequence reads key t from slot t + 1 of its pages: its first key dropped, one slot past its used "
     "length read.", (0, 1)),
)
PAGE_INDEX_WHERE = ("a page or slot index computed from a position off by one (a 1-based position, (t + 1) // "
                    "page_size), or an offset taken after its increment")


def page_index(b: int, used: int, pages_used: int, width: int, page_size: int, batch: int, *, pages: int = 0,
               slots: int = 0) -> tuple[int, int, int]:
    """A member of the page_index family: sequence b's own row and used length, from `pages` pages and
    `slots` slots later."""
    return b, used, pages * page_size + slots


def _register_page_index() -> None:
    import functools
    for name, title, what, (pages, slots) in PAGE_INDEX:
        PAGED_MISTAKES[name] = PagedMistake(name, title, what, PAGE_INDEX_WHERE,
                                            functools.partial(page_index, pages=pages, slots=slots), "page_index")


_register_page_index()
