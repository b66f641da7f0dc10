"""torch.ops.aten._scaled_dot_product_flash_attention_for_cpu returns a finite lse on rows that see no
key (fully_masked_bool inputs, fp32, CPU)

The smallest cell attn-audit found: flash_op-cpu-fp32-d8-T16-B1-H1-causal-fully_masked_bool
torch 2.13.0+cpu, Python 3.11.7, AMD EPYC (AVX2)
Run: python lse_masked_rows-flash_op-minimal.py   (exit 1: the defect shows; 0: it is gone)
"""
import os
import sys

import torch

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
B, H, HKV, TQ, T, D = 1, 1, 1, 16, 16, 8
q = torch.randn(B, H, TQ, D).to(torch.float32)
k, v = (torch.randn(B, HKV, T, D).to(torch.float32) for _ in range(2))
keep = torch.ones(1, 1, TQ, T, dtype=torch.bool)
keep[..., [3, 11], :] = False                       # rows that see no key
causal = torch.ones(TQ, T, dtype=torch.bool).tril(T - TQ)            # bottom-right
keep = causal[None, None] if keep is None else keep & causal

ref = attention64(q, k, v, keep)
bias = None if keep is None else torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, float("-inf"))
out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)[:2]
empty = ~keep.expand(lse.shape[0], lse.shape[1], -1, -1).any(-1)         # (B, H, TQ): rows seeing no key
defect = bool((lse[empty] != float("-inf")).any())
print(f"lse on the {int(empty.sum())} rows that see no key: {sorted(set(lse[empty].tolist()))} (a merge needs -inf)")
sys.exit(1 if defect else 0)
