"""The README's declarations (README.md, "Audit a library's kernel"), on the stand-ins of the same
signatures (standins.py): tests/test_adapt.py checks each `audit.adapt(...)` here is the README's."""
from __future__ import annotations

import audit
from standins import LowerTriangularFromBottomRightMask, flash_attn_func, memory_efficient_attention

flash = audit.adapt(flash_attn_func, layout="bthd", causal="bottom-right", causal_arg="causal",
                    scale_arg="softmax_scale", softcap_arg="softcap", gqa=True)

xformers = audit.adapt(memory_efficient_attention, layout="bthd", causal="bottom-right",
                       causal_arg=("attn_bias", LowerTriangularFromBottomRightMask()),
                       masks=("additive",), mask_arg="attn_bias", scale_arg="scale")

# The flash-attn stand-in declared with the wrong causal alignment: the audit must catch it
# (tests/test_adapt.py).
flash_misdeclared = audit.adapt(flash_attn_func, layout="bthd", causal="top-left", causal_arg="causal",
                                scale_arg="softmax_scale", softcap_arg="softcap", gqa=True)
