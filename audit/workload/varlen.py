"""Variants that take packed sequences (the "varlen" call form) and paged KV caches ("paged").

A varlen variant is called as every variant is (variant_contract.py), plus, in a packed cell,
`cu_seqlens` ((documents + 1,) int32 offsets into the B·T tokens flattened row by row) and
`max_seqlen` in place of the document mask. In any other cell it gets no cu_seqlens: each batch
row is then one document (batch_cu_seqlens), so a varlen kernel runs every unmasked cell too.

A paged variant is called as fn(q, k_pages, v_pages, *, block_table, seqused, mask=None,
causal=False, scale=None): k_pages, v_pages (pages, page_size, Hkv, d) (flash-attn's and vLLM's
cache layout), block_table (B, width) int32, seqused (B,) int32 keys to read per sequence. The
audit builds the pools from the cell's dense keys and values (PagedCall), NaN in every slot a
kernel must not read.
"""
from __future__ import annotations

from typing import Any

from ..core.errors import BackwardUnsupported, Unsupported
from .packing import PagedLayout, gather_dense, pool_from_dense


def batch_cu_seqlens(batch: int, length: int, device: Any) -> Any:
    """[0, T, 2T, ..., B·T] int32: each batch row one document (a dense cell in varlen form)."""
    import torch
    return torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)


def to_thd(t: Any) -> Any:
    """(B, H, T, d) -> (B·T, H, d): flash-attn's packed layout (a copy unless t is (B, T, H, d) in memory)."""
    B, H, T, d = t.shape
    return t.transpose(1, 2).reshape(B * T, H, d)


def from_thd(t: Any, batch: int) -> Any:
    """(B·T, H, d) -> (B, H, T, d), a view."""
    total, H, d = t.shape
    return t.reshape(batch, total // batch, H, d).transpose(1, 2)


def document_owner(cu_seqlens: Any, batch: int, length: int) -> Any:
    """(B, T) long: the document each position belongs to (cu_seqlens over the B·T tokens flattened
    row by row; a boundary may fall inside a row, or cross one), -1 past cu_seqlens[-1]."""
    import torch
    positions = torch.arange(batch * length, device=cu_seqlens.device)                 # (B·T,)
    owner = torch.searchsorted(cu_seqlens.long(), positions, right=True) - 1
    owner = torch.where(positions < cu_seqlens[-1].long(), owner, torch.full_like(owner, -1))
    return owner.reshape(batch, length)


def documents(cu_seqlens: Any) -> list[tuple[int, int]]:
    """[(start, end), ...] of each document in the flattened tokens (a length-0 one included)."""
    offsets = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(offsets, offsets[1:]))


def _dense_only(name: str, mask: Any) -> None:
    if mask is not None:
        raise Unsupported(f"{name} takes documents (cu_seqlens), not a mask tensor: this cell has a mask of "
                          f"shape {tuple(mask.shape)}")


def packed_loop(q, k, v, *, mask=None, causal=False, scale=None, cu_seqlens=None, max_seqlen=None):
    """The plain reference of packed attention: SDPA's math on each document alone, in a Python
    loop over cu_seqlens; rows past cu_seqlens[-1] get 0 (no document owns them)."""
    import torch
    import torch.nn.functional as F
    _dense_only("packed_loop", mask)
    B, H, Tq, d = q.shape
    cu_q = batch_cu_seqlens(B, Tq, q.device) if cu_seqlens is None else cu_seqlens
    cu_k = batch_cu_seqlens(B, k.shape[-2], q.device) if cu_seqlens is None else cu_seqlens
    qt, kt, vt = (to_thd(t) for t in (q, k, v))                        # (B·T, H|Hkv, d|dv)
    gqa = {"enable_gqa": True} if kt.shape[1] != qt.shape[1] else {}
    pieces = []
    ends = 0
    for (start, end), (k0, k1) in zip(documents(cu_q), documents(cu_k)):
        if end > start:
            one = [qt[start:end].transpose(0, 1)[None]] + [t[k0:k1].transpose(0, 1)[None] for t in (kt, vt)]
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):   # (1, H, n, d) each
                o = F.scaled_dot_product_attention(*one, is_causal=causal, scale=scale, **gqa)
            pieces.append(o[0].transpose(0, 1))                         # (n, H, dv)
        ends = end
    tail = qt.shape[0] - ends
    if tail:
        pieces.append(qt.new_zeros(tail, H, v.shape[-1]))              # padding rows: no document
    return from_thd(torch.cat(pieces), B)                              # (B, H, T, dv)


def nested_sdpa(q, k, v, *, mask=None, causal=False, scale=None, cu_seqlens=None, max_seqlen=None):
    """SDPA on jagged nested tensors: the documents as a (D, H, {T}, d) nested tensor (layout
    torch.jagged), as torch runs packed sequences without flash-attn; rows past cu_seqlens[-1] 0.
    In a dense cell each batch row is one sequence (its queries and keys may differ in length).
    torch 2.13 on the CPU finds no backend with is_causal: causal cells are skipped there."""
    import torch
    import torch.nn.functional as F
    _dense_only("nested_sdpa", mask)
    B, H, Tq, d = q.shape
    if causal and q.device.type == "cpu":
        raise Unsupported("nested-tensor SDPA on the CPU has no backend for is_causal (torch: \"No viable "
                          "backend for scaled_dot_product_attention was found\")")
    if k.shape[1] != H:
        raise Unsupported("nested-tensor SDPA takes no enable_gqa: k and v need as many heads as q")
    cu_q = batch_cu_seqlens(B, Tq, q.device) if cu_seqlens is None else cu_seqlens
    cu_k = batch_cu_seqlens(B, k.shape[-2], q.device) if cu_seqlens is None else cu_seqlens
    spans = [(a, b, c, e) for (a, b), (c, e) in zip(documents(cu_q), documents(cu_k)) if b > a]

    def jagged(t, starts):                                             # (B·T, H, d) rows -> (D, H, {T}, d)
        lengths = torch.tensor([0] + [e - s for s, e in starts], device=q.device).cumsum(0)
        rows = torch.cat([t[s:e] for s, e in starts]).contiguous()     # documents back to back, dense
        return torch.nested.nested_tensor_from_jagged(rows, lengths).transpose(1, 2)
    nested_q = jagged(to_thd(q), [(a, b) for a, b, _, _ in spans])
    nested_k, nested_v = (jagged(to_thd(t), [(c, e) for _, _, c, e in spans]) for t in (k, v))
    try:
        out = F.scaled_dot_product_attention(nested_q, nested_k, nested_v, is_causal=causal, scale=scale)
    except RuntimeError as exc:
        if "No viable backend" not in str(exc) and "No available kernel" not in str(exc):
            raise
        raise Unsupported(f"nested-tensor SDPA finds no backend for this cell on {q.device.type} (d_k {d}, "
                          f"d_v {v.shape[-1]}): {str(exc).splitlines()[0]}") from None
    flat = out.transpose(1, 2).values()                                # (total_q, H, dv): documents in order
    full = flat.new_zeros(B * Tq, H, v.shape[-1])
    at = 0
    for a, b, _, _ in spans:                                           # each document's rows where it sits
        full[a:b] = flat[at:at + b - a]
        at += b - a
    return from_thd(full, B)                                           # (B, H, Tq, dv); past cu_seqlens[-1]: 0


def varlen_attn(q, k, v, *, mask=None, causal=False, scale=None, cu_seqlens=None, max_seqlen=None):
    """torch.nn.attention.varlen.varlen_attn (flash-attn's varlen kernel in torch; CUDA only):
    causal as window_size=(-1, 0), bottom-right aligned."""
    _dense_only("varlen_attn", mask)
    if q.device.type != "cuda":
        raise Unsupported("torch.nn.attention.varlen.varlen_attn runs on CUDA only (it raises on the CPU)")
    from torch.nn.attention.varlen import varlen_attn as kernel
    B, H, Tq, d = q.shape
    Tk = k.shape[-2]
    if cu_seqlens is None:
        cu_q, cu_k, max_q, max_k = batch_cu_seqlens(B, Tq, q.device), batch_cu_seqlens(B, Tk, q.device), Tq, Tk
    else:
        cu_q = cu_k = cu_seqlens
        max_q = max_k = max_seqlen
    out = kernel(to_thd(q), to_thd(k), to_thd(v), cu_q, cu_k, max_q, max_k, scale=scale,
                 window_size=(-1, 0) if causal else (-1, -1), enable_gqa=k.shape[1] != H)
    return from_thd(out, B)


# --------------------------------------------------------------------------- paged


class PagedCall:
    """A paged variant behind the audit's dense contract: fn(q, k, v, *, mask, causal, ...) with k, v
    (B, Hkv, T, d) dense calls the variant with pools built from them (NaN in every slot it must not
    read), the block table and the used lengths. The pools are built once per tensor and its
    values (keyed on the tensor's identity and version), so timed calls pass the same pools and pay
    nothing for them, and a call with new values (a check's) gets pools holding exactly those.

    Forward only: a paged cache is an inference layout (its kernels have no backward), and pools
    built per call would put their copy inside every timed call.
    """

    def __init__(self, fn: Any, layout: PagedLayout, own_mask: Any = None) -> None:
        self.fn = fn
        self.layout = layout
        self.own_mask = own_mask      # the cell's key padding mask, which the used lengths stand for
        self._pools: dict[tuple, tuple] = {}
        self._tables: dict[bool, Any] = {}

    def _layout(self, pages_moved: bool) -> PagedLayout:
        return self.layout.moved() if pages_moved else self.layout

    def _pool(self, name: str, t: Any, pages_moved: bool = False) -> Any:
        held = self._pools.get((name, pages_moved))
        key = (id(t), t._version)
        if held is None or held[0] is not t or held[1] != key or held[3] != held[2]._version:
            pool = pool_from_dense(t.detach(), self._layout(pages_moved))
            held = (t, key, pool, pool._version)
            self._pools[(name, pages_moved)] = held
        return held[2]

    def __call__(self, q, k, v, *, mask=None, causal=False, scale=None, pages_moved=False, **extra):
        """pages_moved: the cache built with its pages elsewhere in the pool (PagedLayout.moved), the
        block table saying where: the block table's argument probe (workload/arguments.py)."""
        import torch
        if mask is not None and mask is not self.own_mask:
            raise Unsupported(f"a paged cache takes its used lengths as key padding, not a mask tensor: this call has "
                              f"a mask of shape {tuple(mask.shape)}")
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise BackwardUnsupported("a paged KV cache is an inference layout: its kernels have no backward "
                                      "(forward measured without grad)")
        return self.with_pools(q, self._pool("k", k, pages_moved), self._pool("v", v, pages_moved), causal=causal,
                               scale=scale, pages_moved=pages_moved, **extra)

    def with_pools(self, q, k_pages, v_pages, pages_moved=False, **kwargs):
        """The variant on pools the caller built (the paged check's: finite values in the unread slots),
        laid out as the cell's layout says (pages_moved: as its moved layout says)."""
        import torch
        held = self._tables.get(pages_moved)
        if held is None or held[0].device != q.device:
            layout = self._layout(pages_moved)
            held = (torch.tensor(layout.block_table, dtype=torch.int32, device=q.device),
                    torch.tensor(layout.used, dtype=torch.int32, device=q.device))
            self._tables[pages_moved] = held
        block_table, seqused = held
        return self.fn(q, k_pages, v_pages, block_table=block_table, seqused=seqused, **kwargs)


def in_form(fn: Any, forms: tuple[str, ...], inputs: Any, page_size: int | None = None) -> Any:
    """A variant declaring layouts (variant_contract.CALL_FORMS) behind the dense contract, for calls made with
    an input set's own keyword arguments (the reproduction scripts): a paged variant behind PagedCall
    in a paged cell; a varlen variant in a packed cell gets cu_seqlens and max_seqlen (a window variant
    in a sliding-window cell window=w) wherever a call hands it the cell's own document (window) mask (a
    call with another mask keeps it)."""
    if "paged" in forms and inputs.paged is not None:
        return PagedCall(fn, inputs.paged.with_page_size(page_size or inputs.paged.page_size), own_mask=inputs.mask)
    if "window" in forms and inputs.window is not None:
        def windowed(q, k, v, *, mask=None, **kwargs):
            if mask is inputs.mask:
                return fn(q, k, v, window=inputs.window, **kwargs)
            return fn(q, k, v, mask=mask, **kwargs)
        return windowed
    if "varlen" not in forms or inputs.cu_seqlens is None:
        return fn

    def call(q, k, v, *, mask=None, **kwargs):
        if mask is inputs.mask:
            return fn(q, k, v, cu_seqlens=inputs.cu_seqlens, max_seqlen=inputs.max_seqlen, **kwargs)
        return fn(q, k, v, mask=mask, **kwargs)
    return call


def paged_gather(q, k_pages, v_pages, *, block_table, seqused, mask=None, causal=False, scale=None):
    """The plain reference of paged decoding: gather each sequence's pages in table order into a
    dense (B, Hkv, T, d) cache, mask every key past its used length, then SDPA's math. The masked
    slots are read (gathered) but replaced before any arithmetic, so their NaN never reaches out."""
    import torch
    import torch.nn.functional as F
    _dense_only("paged_gather", mask)
    width = block_table.shape[1] * k_pages.shape[1]
    k, v = (gather_dense(p, block_table, width) for p in (k_pages, v_pages))     # (B, Hkv, width, d)
    keep = torch.arange(width, device=q.device)[None, :] < seqused[:, None].long()   # (B, width)
    k, v = (t.masked_fill(~keep[:, None, :, None], 0.0) for t in (k, v))
    mask = keep[:, None, None, :]                                      # (B, 1, 1, width)
    if causal:
        tq = q.shape[-2]
        rows = torch.arange(tq, device=q.device)[:, None] + seqused[:, None, None].long() - tq   # (B, Tq, 1)
        mask = mask & (torch.arange(width, device=q.device)[None, None, :] <= rows)[:, None]    # bottom-right
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)


def paged_flex(compiled_flex: bool = True) -> Any:
    """torch's PagedAttention over FlexAttention (torch.nn.attention.experimental._paged_attention): the
    pools as its physical cache (1, Hkv, pages·page_size, d), the block table as its page table, a logical
    mask of each sequence's used keys (bottom-right causal) converted to the physical pages by
    PagedAttention.convert_logical_block_mask. Compiled (fullgraph) unless compiled_flex is False. The
    physical caches and the converted mask are built once per pool and table (what a server keeps)."""
    import torch
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from .compiling import compiled_flex_attention
    run = compiled_flex_attention() if compiled_flex else flex_attention     # refuses where torch does
    held: dict[str, tuple] = {}

    def physical(name: str, pool: Any) -> Any:
        got = held.get(name)
        if got is None or got[0] is not pool or got[1] != pool._version:
            pages, size, hkv, d = pool.shape
            got = (pool, pool._version, pool.permute(2, 0, 1, 3).reshape(1, hkv, pages * size, d).contiguous())
            held[name] = got
        return got[2]                                                   # (1, Hkv, pages·page_size, d)

    def converted_mask(block_table: Any, seqused: Any, causal: bool, tq: int, pages: int, size: int) -> Any:
        key = (id(block_table), id(seqused), causal, tq, pages, size)
        got = held.get("mask")
        if got is None or got[0] != key or got[1] is not block_table:
            B, width = block_table.shape
            device = block_table.device
            paged = PagedAttention(pages, size, B, device=device.type)
            table = block_table.long()
            paged.page_table[:, :width] = table
            rows = torch.arange(B, device=device)[:, None].expand(B, width)
            paged.physical_to_logical[rows, table] = torch.arange(width, device=device)[None].expand(B, width)
            used = seqused.long()

            def logical(b, h, qi, ki):
                keep = ki < used[b]
                return keep & (ki <= qi + used[b] - tq) if causal else keep    # bottom-right, within the used keys

            block_mask = create_block_mask(logical, B, None, tq, width * size, device=device.type,
                                           BLOCK_SIZE=(128, size))
            got = (key, block_table, paged.convert_logical_block_mask(block_mask, kv_len=used))
            held["mask"] = got
        return got[2]

    def call(q, k_pages, v_pages, *, block_table, seqused, mask=None, causal=False, scale=None):
        _dense_only("paged_flex", mask)
        pages, size = k_pages.shape[:2]
        block_mask = converted_mask(block_table, seqused, causal, q.shape[-2], pages, size)
        gqa = {"enable_gqa": True} if k_pages.shape[2] != q.shape[1] else {}
        return run(q, physical("k", k_pages), physical("v", v_pages), block_mask=block_mask, scale=scale, **gqa)

    return call
