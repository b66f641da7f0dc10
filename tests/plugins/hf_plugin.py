"""A user's own kernel registered with transformers, as `hf:hf_plugin:mine` names it
(tests/test_hf.py): SDPA through transformers' interface, with transformers' sdpa mask function;
`nomask` has no mask function, so transformers gives it no mask."""
from __future__ import annotations

import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


def mine(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query (B, H, Tq, d), key/value (B, Hkv, Tk, d) -> ((B, Tq, H, d), None), as transformers' own."""
    causal = attention_mask is None and module.is_causal and query.shape[2] > 1
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, is_causal=causal,
                                         scale=scaling, enable_gqa=module.num_key_value_groups > 1)
    return out.transpose(1, 2), None


AttentionInterface.register("mine", mine)
AttentionMaskInterface.register("mine", sdpa_mask)
AttentionInterface.register("nomask", mine)
