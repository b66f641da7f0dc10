"""Packed (varlen) sequences and paged KV caches: where each token of a cell sits.

Both are layouts of the same dense (B, H, T, d) tensors every other cell has, so the golden,
the checks and the variants that take dense tensors keep working; a variant that declares the
layout (variant_contract.CALL_FORMS: "varlen", "paged") is handed it instead.

- Packed: each batch row of length T holds several documents back to back, one of length 0 and
  one of length 1 among them, and the last row ends in padding rows no document owns (past
  cu_seqlens[-1]). cu_seqlens indexes the B·T tokens flattened row by row (flash-attn's
  (total, H, d) layout), so a document never crosses a row: the dense view is block-diagonal.
- Paged: sequence b's first used[b] keys sit in pages of PAGE_SIZE slots, in a shuffled order,
  listed in its row of the block table; every slot a correct kernel must not read (the tail of
  each last page, unused pages, one extra page listed after the used ones) holds NaN.

Pure functions of the shapes (no torch at import), so the cost model and the docs can read them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PAGE_SIZE = 16   # slots per page: vLLM's default block size; presets may pass another


def packed_documents(batch: int, seq_len: int) -> list[list[int]]:
    """Document lengths per batch row: each row of length T holds [3T/8, 0, 1, rest split in
    two] (a document of length 0 and one of length 1 in every row); the last row keeps
    padding_rows(T) rows at its end that no document owns. Lengths of a row sum to T, the last
    row's to T - padding_rows(T)."""
    rows = []
    for b in range(batch):
        usable = seq_len - (padding_rows(seq_len) if b == batch - 1 else 0)
        first = usable * 3 // 8
        rest = max(0, usable - first - 1)
        docs = [first, 0, min(1, usable - first)] + [(rest + 1) // 2, rest // 2]
        rows.append([n for i, n in enumerate(docs) if n > 0 or i == 1])   # keep the deliberate empty one
    return rows


def padding_rows(seq_len: int) -> int:
    """Rows past cu_seqlens[-1] at the end of a packed cell's last batch row: T/8, at least 1
    (none when T is 1: the one row is the document of length 1)."""
    return 0 if seq_len < 2 else max(1, seq_len // 8)


def cu_seqlens_of(documents: list[list[int]]) -> list[int]:
    """[0, end of document 1, ...] over the tokens flattened row by row: flash-attn's cu_seqlens.
    The rows are full but for the last, so offsets follow across rows."""
    out = [0]
    for row in documents:
        for n in row:
            out.append(out[-1] + n)
    return out


def document_ids(documents: list[list[int]], seq_len: int) -> list[list[int]]:
    """Per batch row, per position: the index of the document that owns it (numbered over the
    whole batch, as in cu_seqlens), or -1 for a padding row."""
    ids, doc = [], 0
    for row in documents:
        owner = []
        for n in row:
            owner += [doc] * n
            doc += 1
        ids.append(owner + [-1] * (seq_len - len(owner)))
    return ids


def visible_pairs_packed(documents: list[list[int]], causal: bool) -> int:
    """(query, key) pairs the documents hold, per head: the work of a packed cell."""
    return sum(n * (n + 1) // 2 if causal else n * n for row in documents for n in row)


def documents_mask(owner: Any) -> Any:
    """(B, T) owners -> (B, 1, T, T) bool: same document, and owned."""
    return ((owner[:, :, None] == owner[:, None, :]) & (owner[:, :, None] >= 0))[:, None]


# --------------------------------------------------------------------------- latent heads


def v_at_k_stride(v: Any, d_k: int) -> Any:
    """(B, Hkv, Tk, dv) -> V as a kernel stepping its rows by d_k reads it: row j = the dv elements
    from j·d_k of the head's flat values, 0 past their end. Unchanged when dv == d_k."""
    import torch
    B, H, T, dv = v.shape
    if dv == d_k:
        return v
    flat = v.reshape(B, H, T * dv)                                                   # (B, Hkv, T·dv)
    index = torch.arange(T, device=v.device)[:, None] * d_k + torch.arange(dv, device=v.device)[None, :]
    inside = index < T * dv                                                          # (T, dv)
    read = flat[..., index.clamp(max=T * dv - 1)]                                    # (B, Hkv, T, dv)
    return torch.where(inside, read, torch.zeros_like(read))


# --------------------------------------------------------------------------- paged


@dataclass(frozen=True)
class PagedLayout:
    """Where sequence b's keys sit in a paged cache: block_table[b][i] is the page of its keys
    i·page_size to (i + 1)·page_size - 1; used[b] keys are real; pages is the pool's size."""

    page_size: int
    used: tuple[int, ...]                    # (B,) keys a kernel must read per sequence
    block_table: tuple[tuple[int, ...], ...]  # (B, width): the used pages, one extra page, then unused pages
    pages: int                                # pages in the pool
    seed: int = 0                             # the shuffle's seed (the same layout at another page size)

    def with_page_size(self, page_size: int) -> "PagedLayout":
        """The same used lengths and shuffle seed in pages of `page_size` slots (a kernel's own)."""
        return self if page_size == self.page_size else paged_layout(list(self.used), page_size, self.seed)

    def rows(self, n: int) -> "PagedLayout":
        """The first n sequences alone, their pages where they were (the pool keeps its size)."""
        return PagedLayout(self.page_size, self.used[:n], self.block_table[:n], self.pages, self.seed)

    def moved(self) -> "PagedLayout":
        """The same sequences with every page at another place of the pool (each page number to the next
        in a fixed shuffled cycle of them all, the unlisted page included: none stays): what each sequence
        reads is unchanged, where it sits is not. The block table's probe (workload/arguments.py): a
        kernel reading its pages through the table returns the same output on both."""
        import random
        order = list(range(self.pages))
        random.Random(self.seed + 1).shuffle(order)
        to = {page: order[(i + 1) % len(order)] for i, page in enumerate(order)}
        table = tuple(tuple(to[p] for p in row) for row in self.block_table)
        return PagedLayout(self.page_size, self.used, table, self.pages, self.seed)

    def used_pages(self, b: int) -> int:
        return -(-self.used[b] // self.page_size)

    def slot(self, b: int, t: int) -> tuple[int, int]:
        """(page, offset) of key t of sequence b."""
        return self.block_table[b][t // self.page_size], t % self.page_size


def paged_layout(used: list[int], page_size: int, seed: int) -> PagedLayout:
    """Pages shuffled (by `seed`) over a pool: each sequence's used pages, one extra page listed in its
    table row right after them (a kernel reading one page too many reads it), the rest of its row
    (every row has the same width) pages of its own, and one page no row lists. Only the used pages
    hold keys."""
    import random
    need = [-(-n // page_size) for n in used]
    width = max(need) + 1
    pages = len(used) * width + 1
    order = list(range(pages))
    random.Random(seed).shuffle(order)
    rows = tuple(tuple(order[b * width:(b + 1) * width]) for b in range(len(used)))   # order[-1]: unlisted
    return PagedLayout(page_size, tuple(used), rows, pages, seed)


def pool_from_dense(t: Any, layout: PagedLayout, fill: float = float("nan")) -> Any:
    """(B, Hkv, T, d) dense keys or values -> the pool (pages, page_size, Hkv, d) (flash-attn's
    and vLLM's cache layout): each used key at its slot, `fill` (NaN) in every other slot."""
    import torch
    B, hkv, _, d = t.shape
    pool = torch.full((layout.pages, layout.page_size, hkv, d), fill, dtype=t.dtype, device=t.device)
    for b in range(B):
        n = layout.used[b]
        for i in range(layout.used_pages(b)):
            lo, hi = i * layout.page_size, min(n, (i + 1) * layout.page_size)
            pool[layout.block_table[b][i], : hi - lo] = t[b, :, lo:hi].transpose(0, 1)   # (slots, Hkv, d)
    return pool


def gather_dense(pool: Any, block_table: Any, length: int) -> Any:
    """(pages, page_size, Hkv, d) pool, (B, width) table -> (B, Hkv, length, d): each sequence's
    first `length` slots in table order (a kernel then masks past its used length)."""
    pages = pool[block_table.long()]                                     # (B, width, page_size, Hkv, d)
    B, width, size, hkv, d = pages.shape
    return pages.reshape(B, width * size, hkv, d)[:, :length].transpose(1, 2)   # (B, Hkv, length, d)
