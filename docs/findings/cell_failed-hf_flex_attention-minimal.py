"""create_block_mask(_compile=True) and torch.compile(flex_attention) fails on inputs it accepts (paged
inputs, fp32, CPU)

The smallest cell attn-audit found: hf:flex_attention-cpu-fp32-d32-T512-B1-H2-causal-paged
torch 2.13.0+cpu, Python 3.11.7, AMD EPYC (AVX2)
Run: python cell_failed-hf_flex_attention-minimal.py   (exit 1: the defect shows; 0: it is gone)
"""
import os
import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

def cannot_check(*info):
    sys.__excepthook__(*info)
    os._exit(2)                      # exit 2: the script could not check (1 means the defect shows)
sys.excepthook = cannot_check

torch.manual_seed(0)
B, H, HKV, TQ, T, D = 1, 2, 2, 1, 512, 32
q = torch.randn(B, H, TQ, D).to(torch.float32)
k, v = (torch.randn(B, HKV, T, D).to(torch.float32) for _ in range(2))
used = torch.tensor([384])          # keys per sequence
pad = torch.arange(T)[None, :] < used[:, None]                # (B, T): the used keys
keep = pad[:, None, None, :]                                  # (B, 1, 1, T)
CAUSAL, causal = True, torch.ones(TQ, T, dtype=torch.bool).tril(T - TQ)       # bottom-right
keep = causal[None, None] if keep is None else keep & causal
rows = None

try:
    def mask_mod(b, h, qi, ki):                                 # causal (bottom-right), key padding, documents
        seen = ki <= qi + (T - TQ) if CAUSAL else ki >= 0
        seen = seen if pad is None else seen & pad[b, ki]
        return seen if rows is None else seen & rows[b, 0, qi, ki]
    block_mask = create_block_mask(mask_mod, B, None, TQ, T, device="cpu", _compile=True)
    out = torch.compile(flex_attention)(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])
except Exception as exc:
    said = [s for s in str(exc).splitlines() if "error:" in s] or str(exc).strip().splitlines()[-1:] or [""]
    print(f"the call fails: {type(exc).__name__}: {said[0].strip()[:300]}")
    sys.exit(1)
defect = False
print("the call runs")
sys.exit(1 if defect else 0)
