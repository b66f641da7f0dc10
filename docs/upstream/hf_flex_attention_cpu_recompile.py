"""transformers' flex_attention path on the CPU: Inductor fails to compile it (torch + transformers alone).

What attn-audit's `hf:flex_attention` cells showed (docs/variants.md), in a few lines:

A. One decode call (one query against 128 keys, the last 32 of them padding): Inductor's C++ for
   the mask does not compile, in a fresh process too:
     error: operands to '?:' have different types 'VecMask<int, 1>' and 'VecMask<float, 1>'
B. Packed documents, causal: the call compiles and runs at T=128; the same function called at T=512
   (a recompile, automatic dynamic shapes now) runs code that fails its own bounds check:
     RuntimeError: ... index out of bounds: 0 <= tmp29 < cur_qSplitSize
   Alone in a fresh process, the T=512 call runs: the failure shows only on the recompile.

Seen with torch 2.13.0+cpu and transformers 5.25.0 on 2 cores of an Intel Xeon (AMX, AVX-512).
Run: python docs/upstream/hf_flex_attention_cpu_recompile.py [A|B|B-alone]   (exit 1: it fails)
"""
import sys

import torch
from transformers.integrations.flex_attention import flex_attention_forward
from transformers.masking_utils import and_masks, causal_mask_function, flex_attention_mask


def call(q_len: int, kv_len: int, mask_function, padding=None):
    """transformers' flex_attention_forward as a Llama layer calls it: q, k, v (1, 2, T, 32) fp32."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, q_len, 32, generator=gen)
    k, v = (torch.randn(1, 2, kv_len, 32, generator=gen) for _ in range(2))
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = 1, True, False
    block_mask = flex_attention_mask(batch_size=1, q_length=q_len, kv_length=kv_len, q_offset=kv_len - q_len,
                                     kv_offset=0, mask_function=mask_function, attention_mask=padding)
    with torch.no_grad():
        out, _ = flex_attention_forward(module, q, k, v, block_mask, scaling=32 ** -0.5)
    return out


def documents(length: int):
    """Two documents per row, causal within each: a packed batch's mask."""
    doc = (torch.arange(length) >= length // 2).long()
    return and_masks(causal_mask_function, lambda b, h, qi, ki: doc[qi] == doc[ki])


if __name__ == "__main__":
    which = (sys.argv[1:] or ["A"])[0]
    print(f"torch {torch.__version__}")
    try:
        if which == "A":
            padding = torch.ones(1, 128, dtype=torch.bool)
            padding[:, 96:] = False
            call(1, 128, causal_mask_function, padding)
        elif which == "B":
            call(128, 128, documents(128))
            print("T=128: ran")
            call(512, 512, documents(512))
        else:
            call(512, 512, documents(512))
    except Exception as exc:  # noqa: BLE001
        lines = [line for line in str(exc).splitlines() if "error:" in line or "out of bounds" in line]
        print(f"FAILS: {type(exc).__name__}: {(lines or str(exc).splitlines() or [''])[0].strip()}")
        sys.exit(1)
    print("runs")
