"""The README's declarations (README.md, "Audit a library's kernel") and docs/variants.md's varlen and
paged ones, on the stand-ins of the same signatures (standins.py): tests/test_adapt.py checks each
`audit.adapt(...)` here is the documents' own, character for character."""
from __future__ import annotations

import audit
from standins import (LowerTriangularFromBottomRightMask, flash_attn_func, flash_attn_varlen_func,
                      flash_attn_varlen_func_inclusive_end, flash_attn_varlen_func_one_sequence,
                      flash_attn_with_sinks, flash_attn_with_sinks_window_inclusive, memory_efficient_attention)

flash = audit.adapt(flash_attn_func, layout="bthd", causal="bottom-right", causal_arg="causal",
                    scale_arg="softmax_scale", softcap_arg="softcap", window_arg="window_size", gqa=True)

xformers = audit.adapt(memory_efficient_attention, layout="bthd", causal="bottom-right",
                       causal_arg=("attn_bias", LowerTriangularFromBottomRightMask()),
                       masks=("additive",), mask_arg="attn_bias", scale_arg="scale")

# The flash-attn stand-in declared with the wrong causal alignment: the audit must catch it
# (tests/test_adapt.py).
flash_misdeclared = audit.adapt(flash_attn_func, layout="bthd", causal="top-left", causal_arg="causal",
                                scale_arg="softmax_scale", softcap_arg="softcap", gqa=True)

varlen = audit.adapt(flash_attn_varlen_func, layout="thd", causal="bottom-right", causal_arg="causal",
                     scale_arg="softmax_scale", softcap_arg="softcap", gqa=True,
                     cu_seqlens_arg=("cu_seqlens_q", "cu_seqlens_k"), max_seqlen_arg=("max_seqlen_q", "max_seqlen_k"))

paged = audit.adapt(flash_attn_varlen_func, layout="thd", causal="bottom-right", causal_arg="causal",
                    scale_arg="softmax_scale", gqa=True, cu_seqlens_arg=("cu_seqlens_q", "cu_seqlens_k"),
                    max_seqlen_arg=("max_seqlen_q", "max_seqlen_k"), block_table_arg="block_table", page_size=256)

# A varlen fallback that drops the document boundaries: the audit must catch it (tests/test_adapt.py).
varlen_one_sequence = audit.adapt(flash_attn_varlen_func_one_sequence, layout="thd", causal="bottom-right",
                                  causal_arg="causal", scale_arg="softmax_scale", gqa=True,
                                  cu_seqlens_arg=("cu_seqlens_q", "cu_seqlens_k"),
                                  max_seqlen_arg=("max_seqlen_q", "max_seqlen_k"))

# A varlen kernel whose key loop bound is inclusive, declared as docs/variants.md declares `varlen`: the
# diagnosis must name the member of the document-range family (tests/test_layouts.py).
varlen_inclusive_end = audit.adapt(flash_attn_varlen_func_inclusive_end, layout="thd", causal="bottom-right",
                                   causal_arg="causal", scale_arg="softmax_scale", softcap_arg="softcap", gqa=True,
                                   cu_seqlens_arg=("cu_seqlens_q", "cu_seqlens_k"),
                                   max_seqlen_arg=("max_seqlen_q", "max_seqlen_k"))

# A sink kernel of gpt-oss's call form (sinks, causal, a window argument, no mask), returning its lse with
# the sink counted, declared as docs/variants.md declares it: the sinks prefill and sinks window cells and
# the merge check of its causal cells (tests/test_lse.py, tests/test_window.py).
sink_kernel = audit.adapt(flash_attn_with_sinks, layout="bthd", causal="bottom-right", causal_arg="causal",
                          scale_arg="softmax_scale", sink_arg="learnable_sink", window_arg="window_size", gqa=True,
                          returns="out_lse", lse_layout="bht", lse_includes_sink=True, return_softmax_lse=True)

# The same kernel with its window's left bound one key too far, declared the same way: the diagnosis must
# name the member of the window-bounds family (tests/test_window.py).
sink_kernel_window_inclusive = audit.adapt(
    flash_attn_with_sinks_window_inclusive, layout="bthd", causal="bottom-right", causal_arg="causal",
    scale_arg="softmax_scale", sink_arg="learnable_sink", window_arg="window_size", gqa=True, returns="out_lse",
    lse_layout="bht", lse_includes_sink=True, return_softmax_lse=True)
