"""A plug-in variant that kills its process on long sequences: a stand-in for a kernel that segfaults."""
import ctypes

import torch.nn.functional as F


def attention(q, k, v, *, mask=None, causal=False, scale=None):
    """SDPA, except that it segfaults the process when seq_len is 48."""
    if k.shape[-2] == 48:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
