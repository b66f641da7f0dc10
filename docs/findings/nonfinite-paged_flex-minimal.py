"""PagedAttention over torch.compile(flex_attention) returns NaN/inf where attention is finite
(paged_edges inputs, fp32, CPU)

The smallest cell attn-audit found: paged_flex-cpu-fp32-d8-T16-B2-H1-causal-paged_edges
torch 2.13.0+cpu, Python 3.11.7, AMD EPYC (AVX2)
Run: python nonfinite-paged_flex-minimal.py   (exit 1: the defect shows; 0: it is gone)
"""
import os
import sys

import torch
from torch.nn.attention.experimental._paged_attention import PagedAttention
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

def cannot_check(*info):
    sys.__excepthook__(*info)
    os._exit(2)                      # exit 2: the script could not check (1 means the defect shows)
sys.excepthook = cannot_check

def attention64(q, k, v, keep):
    """float64 attention written out: softmax(q k^T / sqrt(d)) v over the kept keys; no key: 0."""
    q, k, v = (t.double() for t in (q, k, v))
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))  # GQA
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    s = s if keep is None else s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v

torch.manual_seed(0)
B, H, HKV, TQ, T, D = 2, 1, 1, 1, 16, 8
q = torch.randn(B, H, TQ, D).to(torch.float32)
k, v = (torch.randn(B, HKV, T, D).to(torch.float32) for _ in range(2))
used, page_size = torch.tensor([16, 15]), 16          # keys per sequence
keep = (torch.arange(T)[None, :] < used[:, None])[:, None, None, :]     # (B, 1, 1, T)
W = -(-T // page_size)                     # pages per sequence: sequence b's are b*W .. b*W + W-1
block_table = torch.arange(B * W).reshape(B, W)
unused = torch.arange(W * page_size)[None, :] >= used[:, None]     # (B, W*page_size): past the used keys
k_pool, v_pool = (torch.nn.functional.pad(t, (0, 0, 0, W * page_size - T))     # every unused slot NaN
                  .masked_fill(unused[:, None, :, None], float('nan'))
                  .transpose(0, 1).reshape(1, HKV, B * W * page_size, D) for t in (k, v))
causal = torch.ones(TQ, T, dtype=torch.bool).tril(T - TQ)            # bottom-right
keep = causal[None, None] if keep is None else keep & causal

ref = attention64(q, k, v, keep)
B, width = block_table.shape
paged = PagedAttention(k_pool.shape[2] // page_size, page_size, B, device="cpu")   # its page table: ours
paged.page_table[:, :width] = block_table
paged.physical_to_logical[torch.arange(B)[:, None], block_table] = torch.arange(width)
logical = create_block_mask(lambda b, h, qi, ki: ki < used[b], B, None, q.shape[2], width * page_size,
                            device="cpu", BLOCK_SIZE=(128, page_size))
out = torch.compile(flex_attention, fullgraph=True)(
    q, k_pool, v_pool, block_mask=paged.convert_logical_block_mask(logical, kv_len=used))
bad = ~torch.isfinite(out.double()) & torch.isfinite(ref)
defect = bool(bad.any())
print(f"{int(bad.sum())} of {bad.numel()} outputs are NaN/inf where float64 is finite")
sys.exit(1 if defect else 0)
