"""torch.ops.aten._scaled_dot_product_flash_attention_for_cpu returns an output for key/value heads
that do not divide the query heads (normal inputs, fp32, CPU)

The smallest cell attn-audit found: flash_op-cpu-fp32-d8-T16-B1-H3-KV1-causal-normal
torch 2.13.0+cpu, Python 3.11.7, AMD EPYC (AVX2)
Run: python argument_ignored-flash_op-minimal.py   (exit 1: the defect shows; 0: it is gone)
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
B, H, HKV, TQ, T, D = 1, 3, 1, 16, 16, 8
q = torch.randn(B, H, TQ, D).to(torch.float32)
k, v = (torch.randn(B, HKV, T, D).to(torch.float32) for _ in range(2))
keep = None
causal = torch.ones(TQ, T, dtype=torch.bool).tril(T - TQ)            # bottom-right
keep = causal[None, None] if keep is None else keep & causal

ref = attention64(q, k, v, keep)
k, v = (torch.randn(B, H - 1, T, D).to(q.dtype) for _ in range(2))   # H - 1 key/value heads
refused = None
try:
    bias = None if keep is None else torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, float("-inf"))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)[:2]
except Exception as exc:
    refused = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
defect = not refused                     # no pairing of H query heads with H - 1 key/value heads exists
print(f"{H} query heads against {H - 1} key/value heads: " + (f"refused ({refused})" if refused else
      f"an output of shape {list(out.shape)}, where the call must refuse"))
sys.exit(1 if defect else 0)
