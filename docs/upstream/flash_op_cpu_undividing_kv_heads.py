"""torch's CPU flash-attention op takes key/value heads that do not divide the query heads.

Found by attn-audit's `kv_heads` argument probe (docs/numerics.md, Arguments) on torch 2.13.0+cpu:
`aten._scaled_dot_product_flash_attention_for_cpu` (what SDPA's FLASH_ATTENTION backend runs on the
CPU) with q of 4 heads and k, v of 3 returns an output: heads 0-2 read kv heads 0-2, and head 3 reads
past the end of k and v (whatever memory follows: 1e34 or NaN here). With more kv heads than query
heads (q 2 heads, k, v 3) the process dies of SIGFPE (an integer division by H // Hkv = 0).
`F.scaled_dot_product_attention` refuses both ("Number of heads in key and value must divide ...").

Run: python docs/upstream/flash_op_cpu_undividing_kv_heads.py   (the second case kills the process)
"""
import torch
import torch.nn.functional as F

torch.manual_seed(0)
q, k, v = torch.randn(1, 4, 16, 8), torch.randn(1, 3, 16, 8), torch.randn(1, 3, 16, 8)
try:
    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
except RuntimeError as exc:
    print("F.scaled_dot_product_attention refuses:", str(exc).splitlines()[0])
out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]          # (1, 4, 16, 8)
print("the CPU flash op returns", tuple(out.shape), "; largest |out| per head:",
      [f"{x:.3g}" for x in out.abs().amax(dim=(0, 2, 3)).tolist()])
print("q 2 heads, k and v 3: the next call dies of SIGFPE")
torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(torch.randn(1, 2, 16, 8), k, v)
print("not reached on torch 2.13.0+cpu")
