"""The smallest failing case in the library's own API: DIR/repro/<check>-<variant>-minimal.py.

A finding about code the audit did not write, once shrunk (execute/shrink.py), is what a maintainer
asks for as a short script: it imports torch (and the variant's library), draws the shrunk cell's
inputs in plain torch, calls the code as its users call it, computes attention in float64 written out
in the script, and exits 1 while the defect shows, 0 once it is gone, so it can be bisected with. The
long script beside it (repro/scripts.py) embeds the audit's own code; this one none of it.

A script is three registrations put together, one general mechanism each:
- CALLS: how a variant is called (its imports, and the lines that set `out`, and `lse` where the
  variant returns one, from q, k, v and `keep`, the bool visibility of each key to each query);
- INPUTS: how a scenario's inputs are drawn (q, k, v and keep; the scenario's own parameters, such as
  the used lengths, computed by the audit's draw functions and written in as literals);
- VERDICTS: how a check decides from `out` (and `lse`) against the float64 `ref`.
A finding whose variant, scenario or check has none gets the reason instead (`minimal_reason`).
"""
from __future__ import annotations

import dataclasses
import textwrap
from typing import Any, Callable, Sequence

MAX_LINES = 60          # what a maintainer reads in a tracker

# The float64 attention every script compares with, written out: softmax(q k^T / sqrt(d)) v over the
# kept keys (GQA: each key/value head repeated over its query heads), a row that sees no key zero.
REFERENCE = '''\
def attention64(q, k, v, keep):
    """float64 attention written out: softmax(q k^T / sqrt(d)) v over the kept keys; no key: 0."""
    q, k, v = (t.double() for t in (q, k, v))
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))  # GQA
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    s = s if keep is None else s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v
'''


# Exit 2 where the script itself fails (not the call a cell_failed finding is about): exit 1 means the defect.
CRASH = '''\
def cannot_check(*info):
    sys.__excepthook__(*info)
    os._exit(2)                      # exit 2: the script could not check (1 means the defect shows)
sys.excepthook = cannot_check
'''


@dataclasses.dataclass(frozen=True)
class Call:
    """A variant called as its users call it: `imports` (lines), `lines` setting `out` (and `lse` where
    `returns_lse`) from q, k, v and keep (None: every key visible); `needs` the input form it takes
    ("dense", or "paged": k_pool, v_pool, block_table, used and page_size as a Draw with pools gives them)."""

    api: str                    # what the user calls, for a report's title
    imports: tuple[str, ...]
    lines: str
    returns_lse: bool = False
    needs: str = "dense"        # "paged": the paged cache's pools (Draw.pools)
    takes: str = "mask"         # "padding": key padding (`pad`), CAUSAL and a pattern per row (`rows`), not `keep`
    # calls with fewer libraries or layers tried first (keys of CALLS): the first whose script shows the
    # defect is the minimal one (transformers' flex path -> torch's compiled create_block_mask alone)
    simpler: tuple[str, ...] = ()
    backward: bool = True       # it has a backward on the CPU (compiled FlexAttention: forward only)


def _sdpa(backend: str | None) -> Call:
    call = "out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=k.shape[1] != q.shape[1])"
    if backend is None:
        return Call("F.scaled_dot_product_attention", ("import torch.nn.functional as F",), call)
    return Call(f"F.scaled_dot_product_attention (SDPBackend.{backend})",
                ("import torch.nn.functional as F", "from torch.nn.attention import SDPBackend, sdpa_kernel"),
                f"with sdpa_kernel(SDPBackend.{backend}):\n    {call}")


CALLS: dict[str, Call] = {
    "sdpa": _sdpa(None),
    "sdpa_math": _sdpa("MATH"),
    "sdpa_flash": _sdpa("FLASH_ATTENTION"),
    "flash_op": Call("torch.ops.aten._scaled_dot_product_flash_attention_for_cpu", (), '''\
bias = None if keep is None else torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, float("-inf"))
out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)[:2]''',
                     returns_lse=True),
    "flex": Call("torch.compile(flex_attention)", ("from torch.nn.attention.flex_attention import create_block_mask, flex_attention",), '''\
mask_mod = (lambda b, h, qi, ki: qi >= 0) if keep is None else (lambda b, h, qi, ki: keep[b % keep.shape[0], 0, qi, ki])
block_mask = create_block_mask(mask_mod, q.shape[0], None, q.shape[2], k.shape[2], device="cpu")
out = torch.compile(flex_attention, fullgraph=True)(q, k, v, block_mask=block_mask,
                                                    enable_gqa=k.shape[1] != q.shape[1])''', backward=False),
    "flex_eager": Call("flex_attention", ("from torch.nn.attention.flex_attention import create_block_mask, flex_attention",), '''\
mask_mod = (lambda b, h, qi, ki: qi >= 0) if keep is None else (lambda b, h, qi, ki: keep[b % keep.shape[0], 0, qi, ki])
block_mask = create_block_mask(mask_mod, q.shape[0], None, q.shape[2], k.shape[2], device="cpu")
out = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])'''),
    "hf:flex_attention": Call(
        "transformers' flex_attention_forward", (
            "from transformers.integrations.flex_attention import flex_attention_forward",
            "from transformers.masking_utils import and_masks, bidirectional_mask_function, causal_mask_function, "
            "flex_attention_mask"), '''\
module = torch.nn.Module()                                  # what flex_attention_forward reads of a Llama layer
module.num_key_value_groups, module.is_causal, module.training = H // HKV, CAUSAL, False
mask_function = causal_mask_function if CAUSAL else bidirectional_mask_function    # and a pattern per row (documents):
mask_function = mask_function if rows is None else and_masks(mask_function, lambda b, h, qi, ki: rows[b, 0, qi - (T - TQ), ki])
block_mask = flex_attention_mask(batch_size=B, q_length=TQ, kv_length=T, q_offset=T - TQ, kv_offset=0,
                                 mask_function=mask_function, attention_mask=pad)
out = flex_attention_forward(module, q, k, v, block_mask, scaling=D ** -0.5)[0].transpose(1, 2)''',
        takes="padding", simpler=("flex_compiled_mask",), backward=False),
    # what transformers' flex_attention_mask and flex_attention_forward do, in torch alone: the block mask's
    # mask_mod compiled (create_block_mask(_compile=True)), then compiled flex_attention
    "flex_compiled_mask": Call(
        "create_block_mask(_compile=True) and torch.compile(flex_attention)",
        ("from torch.nn.attention.flex_attention import create_block_mask, flex_attention",), '''\
def mask_mod(b, h, qi, ki):                                 # causal (bottom-right), key padding, documents
    seen = ki <= qi + (T - TQ) if CAUSAL else ki >= 0
    seen = seen if pad is None else seen & pad[b, ki]
    return seen if rows is None else seen & rows[b, 0, qi, ki]
block_mask = create_block_mask(mask_mod, B, None, TQ, T, device="cpu", _compile=True)
out = torch.compile(flex_attention)(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])''',
        takes="padding", backward=False),
    "paged_flex": Call("PagedAttention over torch.compile(flex_attention)", ("from torch.nn.attention.experimental._paged_attention import PagedAttention",
                        "from torch.nn.attention.flex_attention import create_block_mask, flex_attention"), '''\
B, width = block_table.shape
paged = PagedAttention(k_pool.shape[2] // page_size, page_size, B, device="cpu")   # its page table: ours
paged.page_table[:, :width] = block_table
paged.physical_to_logical[torch.arange(B)[:, None], block_table] = torch.arange(width)
logical = create_block_mask(lambda b, h, qi, ki: ki < used[b], B, None, q.shape[2], width * page_size,
                            device="cpu", BLOCK_SIZE=(128, page_size))
out = torch.compile(flex_attention, fullgraph=True)(
    q, k_pool, v_pool, block_mask=paged.convert_logical_block_mask(logical, kv_len=used))''', needs="paged",
                       backward=False),
}


def _dense(case: Any, tq: int) -> str:
    from ..core.dtypes import dtype_spec
    dtype = f"torch.{dtype_spec(case.dtype).torch_name}"
    if case.d_v is None:
        return (f"B, H, HKV, TQ, T, D = {case.batch}, {case.heads}, {case.effective_kv_heads}, {tq}, {case.seq_len}, "
                f"{case.d_k}\n"
                f"q = torch.randn(B, H, TQ, D).to({dtype})\n"
                f"k, v = (torch.randn(B, HKV, T, D).to({dtype}) for _ in range(2))")
    return (f"B, H, HKV, TQ, T, D, DV = {case.batch}, {case.heads}, {case.effective_kv_heads}, {tq}, {case.seq_len}, "
            f"{case.d_k}, {case.d_v}                  # DV: the values' head size\n"
            f"q = torch.randn(B, H, TQ, D).to({dtype})\n"
            f"k, v = torch.randn(B, HKV, T, D).to({dtype}), torch.randn(B, HKV, T, DV).to({dtype})")


def _causal(case: Any) -> str:
    """CAUSAL, and keep &= causal (bottom-right: the last query sees every key) where the cell is causal."""
    if not case.causal:
        return "\nCAUSAL = False"
    return ("\nCAUSAL, causal = True, torch.ones(TQ, T, dtype=torch.bool).tril(T - TQ)       # bottom-right\n"
            "keep = causal[None, None] if keep is None else keep & causal")


def _normal(case: Any, tq: int, pools: bool) -> str:
    return _dense(case, tq) + "\npad = keep = None" + _causal(case)


def _scaled(alpha: int) -> Callable[[Any, int, bool], str]:
    def lines(case: Any, tq: int, pools: bool) -> str:
        return (_dense(case, tq) + f"\nq = q * {alpha}                                  # logits about {alpha}x those of "
                "N(0, 1) inputs\npad = keep = None" + _causal(case))
    return lines


def _fully_masked(case: Any, tq: int, pools: bool) -> str:
    from ..workload.draws import fully_masked_rows
    return (_dense(case, tq) + "\nkeep = torch.ones(1, 1, TQ, T, dtype=torch.bool)\n"
            f"keep[..., {fully_masked_rows(tq)}, :] = False                       # rows that see no key"
            + _causal(case))


def _used(used: list[int], page_size: int | None = None) -> str:
    """The used keys per sequence (and the cache's page size) as key padding, `pad` and `keep`."""
    first = f"used = torch.tensor({used})" if page_size is None else \
        f"used, page_size = torch.tensor({used}), {page_size}"
    return (f"\n{first}          # keys per sequence\n"
            "pad = torch.arange(T)[None, :] < used[:, None]                # (B, T): the used keys\n"
            "keep = pad[:, None, None, :]                                  # (B, 1, 1, T)")


def _padding(case: Any, tq: int, pools: bool) -> str:
    from ..workload.draws import _valid_lengths
    return _dense(case, tq) + _used(_valid_lengths(case.batch, case.seq_len)) + _causal(case)


def _packed(case: Any, tq: int, pools: bool) -> str:
    from ..workload.packing import packed_documents
    return (_dense(case, tq) + f"\ndocs = {packed_documents(case.batch, case.seq_len)}          # document lengths per row\n"
            "owner = torch.tensor([sum(([i] * n for i, n in enumerate(row)), []) + [-1] * (T - sum(row)) for row in docs])\n"
            "rows = ((owner[:, :, None] == owner[:, None, :]) & (owner[:, :, None] >= 0))[:, None]   # (B, 1, T, T)\n"
            "pad, keep = None, rows                                        # owner (B, T): each key's document, -1 none"
            + _causal(case))


POOLS = ("\nW = -(-T // page_size)                     # pages per sequence: sequence b's are b*W .. b*W + W-1\n"
         "block_table = torch.arange(B * W).reshape(B, W)\n"
         "unused = torch.arange(W * page_size)[None, :] >= used[:, None]     # (B, W*page_size): past the used keys\n"
         "k_pool, v_pool = (torch.nn.functional.pad(t, (0, 0, 0, W * page_size - T))     # every unused slot NaN\n"
         "                  .masked_fill(unused[:, None, :, None], float('nan'))\n"
         "                  .transpose(0, 1).reshape(1, HKV, B * W * page_size, t.shape[-1]) for t in (k, v))")


def _paged(lengths: Callable[[int, int], list[int]]) -> Callable[[Any, int, bool], str]:
    """A paged scenario's draw: the used keys as key padding, and, for a call taking a paged cache, the
    pools of PAGE_SIZE slots with every slot past a sequence's used keys NaN."""
    def lines(case: Any, tq: int, pools: bool) -> str:
        from ..workload.packing import PAGE_SIZE
        used = lengths(case.batch, case.seq_len)
        if not pools:
            return _dense(case, tq) + _used(used) + _causal(case)
        return _dense(case, tq) + _used(used, PAGE_SIZE) + POOLS + _causal(case)
    return lines


def _paged_lengths(batch: int, tk: int) -> list[int]:
    from ..workload.draws import _valid_lengths
    return _valid_lengths(batch, tk)


def _edge_lengths(batch: int, tk: int) -> list[int]:
    from ..workload.draws import page_edge_lengths
    return page_edge_lengths(batch, tk)


@dataclasses.dataclass(frozen=True)
class Draw:
    """How a scenario's inputs are drawn in a script: `lines(case, q length, pools)` set q, k, v, `keep` (the
    visibility, causal included; None: every key), CAUSAL, and where `padding` is true `pad` (the key padding,
    (B, T) bool, or None) and `rows` (a pattern per row beyond padding and causal, (B, 1, TQ, T) bool, or None:
    packed documents), all a call taking padding is given (transformers' mask functions); with `pools` the
    scenario can also give a paged cache (k_pool, v_pool, block_table, used, page_size)."""

    lines: Callable[[Any, int, bool], str]
    pools: bool = False
    padding: bool = True        # its mask is key padding, causal and `rows` (a pattern per row) alone
    rows: bool = False          # its lines set `rows` (else a call taking padding is given rows = None)


# scenario -> its Draw
INPUTS: dict[str, Draw] = {
    "normal": Draw(_normal),
    **{f"scaled_x{a}": Draw(_scaled(a)) for a in (4, 16, 64)},
    "fully_masked_bool": Draw(_fully_masked, padding=False),
    "padding": Draw(_padding),
    "paged": Draw(_paged(_paged_lengths), pools=True),
    "paged_edges": Draw(_paged(_edge_lengths), pools=True),
    "packed": Draw(_packed, rows=True),
}

@dataclasses.dataclass(frozen=True)
class Verdict:
    """How a check decides in a script: `lines` setting `defect` (and printing what shows it) from out,
    lse, ref and keep (an argument probe's: from `refused`, after `before` changed the inputs); `expected`,
    what a right kernel gives, and `headline`, the defect in a few words (an upstream report's)."""

    lines: str
    expected: str
    headline: str
    before: str = ""
    budget: bool = False        # its lines read FACTOR and ATOL: the budget's for the cell's dtype (core/dtypes.py)
    grads: bool = False         # it needs the inputs' gradients: a call with a backward (dense inputs)
    lse: bool = False           # it reads the lse the call returns
    again: bool = False         # it calls again, on other inputs: the call is made a function, attend()
    seen: bool = False          # it reads `seen`, the rows that see a key (B|1, H|1, TQ), set with ref


# The rows that see a key, (B, H, TQ) (keep: (B|1, 1, TQ, T) or None): the rows a budget verdict judges.
SEEN = "(torch.ones(q.shape[:-1], dtype=torch.bool) if keep is None else keep.expand(*q.shape[:-1], -1).any(-1))"

# The budgets' yardstick, written out: attention64's math in the input dtype (the audit's baseline is its
# hand-written eager attention in that dtype).
WRITTEN_OUT = '''def written_out(q, k, v, keep):                             # the same math, by hand, in q's dtype: the yardstick
    s = q @ k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(s if keep is None else s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0) @ v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
'''

# check -> its Verdict
VERDICTS: dict[str, Verdict] = {
    "nonfinite": Verdict('''\
bad = ~torch.isfinite(out.double()) & torch.isfinite(ref)
defect = bool(bad.any())
print(f"{int(bad.sum())} of {bad.numel()} outputs are NaN/inf where float64 is finite")''',
                         "finite outputs wherever attention computed in float64 is finite",
                         "returns NaN/inf where attention is finite"),
    "fully_masked_rows": Verdict('''\
empty = ~keep.expand(out.shape[0], out.shape[1], -1, -1).any(-1)          # (B, H, TQ): rows seeing no key
defect = bool(out[empty].isnan().any())
print(f"{int(out[empty].isnan().any(-1).sum())} of {int(empty.sum())} rows that see no key are NaN (float64: 0)")''',
                                 "no NaN on rows that see no key (zeros, as SDPA returns)",
                                 "returns NaN on rows that see no key"),
    "lse_masked_rows": Verdict('''\
empty = ~keep.expand(lse.shape[0], lse.shape[1], -1, -1).any(-1)         # (B, H, TQ): rows seeing no key
defect = bool((lse[empty] != float("-inf")).any())
print(f"lse on the {int(empty.sum())} rows that see no key: {sorted(set(lse[empty].tolist()))} (a merge needs -inf)")''',
                               "an lse of -inf on rows that see no key: what a merge of partial results reads as an "
                               "empty part (FlashAttention-2 returns +inf)",
                               "returns a finite lse on rows that see no key", lse=True),
    "error_budget": Verdict(WRITTEN_OUT + '''err, base = ((x.double() - ref)[seen].pow(2).mean().sqrt().item() for x in (out, written_out(q, k, v, keep)))
print(f"RMSE {err:.3g} against float64, {err / base:.3g}x the same math's in {q.dtype} ({base:.3g}); budget {FACTOR:g}x + {ATOL:g}")
defect = not err <= FACTOR * base + ATOL                    # NaN: a defect too''',
                            "an output within 2x the error of attention written out by hand in the same dtype (its "
                            "RMSE against float64 on rows that see a key, plus the dtype's atol)",
                            "returns outputs with many times the error of attention written out in the same dtype",
                            budget=True, seen=True),
    "grad_error_budget": Verdict(WRITTEN_OUT + '''def grads(f, *inputs):
    inputs = [t.detach().requires_grad_() for t in inputs]
    return torch.autograd.grad(f(*inputs, keep), inputs, g.to(inputs[0].dtype))
g = torch.randn(out.shape, dtype=torch.float64)             # the upstream gradient
got = torch.autograd.grad(out, (q, k, v), g.to(out.dtype))
want, yard = grads(attention64, q.double(), k.double(), v.double()), grads(written_out, q, k, v)
rmse = [[(x.double() - w).pow(2).mean().sqrt().item() for x in (a, b)] for a, w, b in zip(got, want, yard)]
for name, (err, base) in zip(("dq", "dk", "dv"), rmse):
    print(f"{name}: RMSE {err:.3g} against float64, {err / base:.3g}x the same math's in {q.dtype} ({base:.3g}); budget {FACTOR:g}x + {ATOL:g}")
defect = any(not err <= FACTOR * base + ATOL for err, base in rmse)        # NaN: a defect too''',
                                 "gradients within 2x the error of attention written out by hand in the same dtype "
                                 "(their RMSE against float64 autograd, plus the dtype's atol)",
                                 "computes gradients with many times the error of attention written out in the same "
                                 "dtype", before="q, k, v = (t.requires_grad_() for t in (q, k, v))", budget=True,
                                 grads=True),
    "lse_grad_budget": Verdict('''\
def lse_of(q, k, keep):                                     # logsumexp of the scaled scores, written out
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.logsumexp(s if keep is None else s.masked_fill(~(keep | ~keep.any(-1, keepdim=True)), float("-inf")), -1)
def grads(*inputs):                                         # of the lse of rows that see a key, against g
    inputs = [t.detach().requires_grad_() for t in inputs]
    return torch.autograd.grad(lse_of(*inputs, keep)[seen], inputs, g.to(inputs[0].dtype)[seen])
seen = ''' + SEEN + '''
g = torch.randn(lse.shape, dtype=torch.float64)             # the upstream gradient of the lse
got = [torch.zeros_like(q), torch.zeros_like(k)]
if lse.requires_grad:
    got = [torch.zeros_like(t) if d is None else d for d, t in
           zip(torch.autograd.grad(lse[seen], (q, k), g.to(lse.dtype)[seen], allow_unused=True), (q, k))]
want, yard = grads(q.double(), k.double()), grads(q, k)
rmse = [[(x.double() - w).pow(2).mean().sqrt().item() for x in (a, b)] for a, w, b in zip(got, want, yard)]
for name, (err, base) in zip(("dq", "dk"), rmse):
    print(f"{name} through the lse: RMSE {err:.3g} against float64, {err / base:.3g}x the same math's in {q.dtype}; budget {FACTOR:g}x + {ATOL:g}")
print(f"the lse carries a gradient: {lse.requires_grad}")
defect = any(not err <= FACTOR * base + ATOL for err, base in rmse)        # NaN: a defect too''',
                               "a gradient through the returned lse: dq and dk of a loss on it within 2x the error "
                               "of its logsumexp written out in the same dtype (against float64 autograd)",
                               "returns an lse that carries no gradient, or a wrong one",
                               before="q, k, v = (t.requires_grad_() for t in (q, k, v))", budget=True, grads=True,
                               lse=True),
    "lse_error_budget": Verdict('''\
k_all, v_all, keep_all, parts = k, v, keep, []
for half in (slice(0, T // 2), slice(T // 2, T)):           # the call on each half of the keys, as split-KV does
    k, v, keep = k_all[:, :, half], v_all[:, :, half], None if keep_all is None else keep_all[..., half]
    parts.append(attend())
k, v, keep = k_all, v_all, keep_all
(o1, l1), (o2, l2) = ((o.double(), l.double()[..., None]) for o, l in parts)
both = torch.logaddexp(l1, l2)                              # the merge split-KV decoding and ring attention do
merged = (o1 * torch.exp(l1 - both) + o2 * torch.exp(l2 - both)).nan_to_num(0.0)
err, base = ((x.double() - ref)[seen].pow(2).mean().sqrt().item() for x in (merged, out))
print(f"its halves merged: RMSE {err:.3g} against float64, {err / base:.3g}x its whole output's ({base:.3g}); budget {FACTOR:g}x + {ATOL:g}")
defect = not err <= FACTOR * base + ATOL                    # NaN: a defect too''',
                                "its (out, lse) over each half of the keys, merged as split-KV decoding and ring "
                                "attention merge them, as close to float64 as its output over all keys (within 2x "
                                "its error, plus the dtype's atol)",
                                "returns an (out, lse) that merges wrong over keys split in two", budget=True,
                                lse=True, again=True, seen=True),
}
# cell_failed: the call raising is the verdict (_called)
FAILED = Verdict("", "the call returns an output", "fails on inputs it accepts")


# argument (an argument_ignored finding's) -> its Verdict: `before` changes the inputs as its probe does,
# `lines` judge the call's outcome (`refused`: what it raised, None where it returned)
ARGUMENT_PROBES: dict[str, Verdict] = {
    "kv_heads": Verdict('''\
defect = not refused                     # no pairing of H query heads with H - 1 key/value heads exists
print(f"{H} query heads against {H - 1} key/value heads: " + (f"refused ({refused})" if refused else
      f"an output of shape {list(out.shape)}, where the call must refuse"))''',
                        "a refusal: H query heads cannot be paired with H - 1 key/value heads (SDPA raises \"Number "
                        "of heads in key and value must divide the number of heads in query\")",
                        "returns an output for key/value heads that do not divide the query heads",
                        before="k, v = (torch.randn(B, H - 1, T, t.shape[-1]).to(q.dtype) for t in (k, v))   # H - 1 kv heads"),
}


def _no_verdict(check: str, argument: str | None) -> str | None:
    """Why no Verdict is registered for `check` (an argument_ignored finding's: for its argument), or None."""
    from ..analysis.argument_rules import ARGUMENT_CHECK
    if check == ARGUMENT_CHECK:
        return None if argument in ARGUMENT_PROBES else \
            f"no probe of argument {argument} is registered (repro/minimal.py: ARGUMENT_PROBES)"
    if check in VERDICTS or check == "cell_failed":
        return None
    return f"no verdict for check {check} is registered (repro/minimal.py: VERDICTS)"


def writable(variant: str, check: str, argument: str | None = None) -> bool:
    """Whether a finding of `check` about `variant` can get a minimal script at all (its scenario aside)."""
    return variant in CALLS and _no_verdict(check, argument) is None


def unsupported(case: Any, check: str, argument: str | None = None, call_name: str | None = None) -> str | None:
    """Why no minimal script can be written for this finding (None: one can); `argument`: an
    argument_ignored finding's argument; `call_name`: the CALLS entry to write it with (the variant's)."""
    name = call_name or case.variant
    call, inputs = CALLS.get(name), INPUTS.get(case.scenario)
    if call is None:
        return f"no call of {name} in its own API is registered (repro/minimal.py: CALLS)"
    if inputs is None:
        return f"no plain-torch draw of scenario {case.scenario} is registered (repro/minimal.py: INPUTS)"
    if why := _no_verdict(check, argument):
        return why
    if call.needs == "paged" and not inputs.pools:
        return f"{name} takes a paged cache; scenario {case.scenario} draws none"
    if call.takes == "padding" and not inputs.padding:
        return f"{name} takes key padding, causal and a pattern per row only; scenario {case.scenario} masks more"
    judged = VERDICTS.get(check)
    if judged and judged.lse and not call.returns_lse:
        return f"{name} returns no lse"
    if judged and judged.grads and not call.backward:
        return f"{name} has no backward on the CPU"
    if case.device != "cpu":
        return "minimal scripts are written for CPU cells only"
    return None


def _called(call: Call, check: str, argument: str | None) -> str:
    """The call's lines and the verdict after them: the check's; for a check about the call failing
    (cell_failed) the failure; for an argument's probe its change of the inputs before the call and
    whether the call refused after it."""
    if check in VERDICTS:
        judged = VERDICTS[check]
        return (judged.before + "\n" if judged.before else "") + call.lines + "\n" + judged.lines + "\n"
    attempt = "try:\n" + textwrap.indent(call.lines, "    ") + "\nexcept Exception as exc:\n"
    if check == "cell_failed":                   # the call raising is the defect: the compiler's error line
        return (attempt
                + "    said = [s for s in str(exc).splitlines() if \"error:\" in s] or str(exc).strip().splitlines()[-1:] or [\"\"]\n"
                "    print(f\"the call fails: {type(exc).__name__}: {said[0].strip()[:300]}\")\n"
                "    sys.exit(1)\n"
                "defect = False\nprint(\"the call runs\")\n")
    probe = ARGUMENT_PROBES[str(argument)]
    return (probe.before + "\nrefused = None\n" + attempt
            + "    refused = f\"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}\"\n" + probe.lines + "\n")


def _budget(case: Any, check: str) -> str:
    """The line setting a budget verdict's FACTOR and ATOL: the audit's budget for the cell's dtype (core/dtypes.py;
    a gradient's factor, measure/golden/numerics.py: GRAD_BUDGET_FACTOR, the same for every gradient)."""
    from ..core.dtypes import dtype_spec
    from ..measure.golden.numerics import GRAD_BUDGET_FACTOR
    spec = dtype_spec(case.dtype)
    factors = set(GRAD_BUDGET_FACTOR.values()) if VERDICTS[check].grads else {spec.budget_factor}
    if len(factors) != 1:
        raise ValueError(f"{check}: one budget factor for every gradient is written, not {sorted(factors)}")
    return (f"FACTOR, ATOL = {factors.pop()!r}, {spec.atol!r}              # attn-audit's budget in {case.dtype}: "
            "FACTOR x the yardstick's error + ATOL\n")


def _drawn(case: Any, call: Call) -> str:
    """The lines drawing `case`'s inputs for `call` (a call taking padding gets rows = None where the
    scenario has no pattern per row)."""
    from ..workload.inputs import SCENARIOS
    draw = INPUTS[case.scenario]
    lines = draw.lines(case, SCENARIOS[case.scenario].q_len(case.seq_len), call.needs == "paged")
    return lines + ("\nrows = None" if call.takes == "padding" and not draw.rows else "") + "\n"


def minimal_script(case: Any, check: str, *, title: str, versions: str, argument: str | None = None,
                   call_name: str | None = None, before: Sequence[Any] = (), part: int | None = None) -> str:
    """The script's text for the (shrunk) cell `case` and `check` with CALLS[call_name] (default: the
    variant's own; unsupported() must be None). `before`: cells called first, in order, each as the call
    does it (a failure that shows only when the function is called again at a new shape, a recompile:
    a cell of the same call at another length, execute/shrink.py: replays); `part`: script_name's."""
    call = CALLS[call_name or case.variant]
    called_first = "".join(f"Called first as {b.id}: the failure shows on the call after it (a recompile).\n"
                           for b in before)
    head = (f'"""{title}\n\nThe smallest cell attn-audit found: {case.id}\n{called_first}{versions}\n'
            f'Run: python {script_name(check, case.variant, part)}   (exit 1: the defect shows; 0: it is gone)\n"""\n'
            "import os\nimport sys\n\nimport torch\n")
    compared = check != "cell_failed"       # a call that raises has no output to compare with float64
    parts = [head + "".join(line + "\n" for line in call.imports), CRASH, *([REFERENCE] if compared else [])]
    judged = VERDICTS.get(check)            # None: cell_failed, an argument's probe
    if judged and judged.budget:
        parts.append(_budget(case, check))
    earlier: list[str] = []
    if before or (judged and judged.again):             # the call once, as a function of the cell's globals, made for each cell
        returned = "out, lse" if call.returns_lse else "out"
        parts.append("def attend():                                   # the call, on q, k, v and keep as they are now\n"
                     + textwrap.indent(call.lines, "    ") + f"\n    return {returned}\n")
        shape = "attend()[0].shape" if call.returns_lse else "attend().shape"
        earlier = [_drawn(b, call) + f'print(f"first, at T={{T}}: the call runs, out {{list({shape})}}")\n' for b in before]
        call = dataclasses.replace(call, lines=f"{returned} = attend()")
    drawings = [*earlier, _drawn(case, call)]
    drawings[0] = "torch.manual_seed(0)\n" + drawings[0]        # seeded once, for the whole script
    forward = compared and not (judged and judged.grads)       # a gradients' verdict: its own float64
    reference = (f"ref, seen = attention64(q, k, v, keep), {SEEN}     # seen: the rows that see a key\n"
                 if judged and judged.seen else "ref = attention64(q, k, v, keep)\n")
    parts += [*drawings, (reference if forward else "") + _called(call, check, argument)
              + "sys.exit(1 if defect else 0)\n"]
    return "\n".join(parts)


def script_name(check: str, variant: str, part: int | None = None) -> str:
    """The minimal script's file name in DIR/repro (beside the long script, <check>-<variant>.py); `part`
    (2, 3, ...): a finding's other failure (a cell_failed finding whose cells failed in different ways)."""
    from ..core.runfolder import MINIMAL_SUFFIX, file_safe
    return f"{check}-{file_safe(variant)}{f'-{part}' if part and part > 1 else ''}{MINIMAL_SUFFIX}"


def verdict(check: str, argument: str | None = None) -> Verdict:
    """The registered Verdict of a check (an argument_ignored finding's: its argument's probe)."""
    if check in VERDICTS:
        return VERDICTS[check]
    return FAILED if check == "cell_failed" else ARGUMENT_PROBES[str(argument)]


def title(case: Any, check: str, argument: str | None = None, call_name: str | None = None,
          again: bool = False) -> str:
    """An upstream report's title: the API called, the defect, where (the scenario, shrunk cell's dtype);
    `again`: it shows when the function is called again at a new shape (minimal_script's `before`)."""
    api = CALLS[call_name or case.variant].api
    headline = "fails when called again at a new shape (a recompile)" if again else verdict(check, argument).headline
    return f"{api} {headline} ({case.scenario} inputs, {case.dtype}, CPU)"


def calls_to_try(variant: str) -> tuple[str, ...]:
    """The CALLS entries a finding about `variant` is written with, in order: its simpler ones, then its own."""
    own = CALLS.get(variant)
    return (*own.simpler, variant) if own else (variant,)


def upstream_draft(script: str, *, name: str, title: str, versions: str, found: str, check: str,
                   argument: str | None, actual: str, elsewhere: str | None) -> str:
    """A report for the library's tracker, beside the minimal script: its title, the versions, the script,
    what a right kernel gives against what this one gave, and what other kernels do where the audit knows."""
    lines = [f"# {title}", "", f"**Versions:** {versions}", "", f"**Found by:** {found}", "", "## Reproduce", "",
             f"`python {name}` (exit 1 while the defect shows, 0 once it is gone):", "", "```python", script.rstrip(),
             "```", "", "## Expected", "", verdict(check, argument).expected, "", "## Actual", "", actual]
    if elsewhere:
        lines += ["", "## What other kernels do", "", elsewhere]
    return "\n".join(lines) + "\n"
