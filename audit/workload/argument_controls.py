"""Negative controls of the argument probes (measure/checks/arguments.py): eager's math, one argument
accepted and ignored each. Right on every cell where the argument has its usual value (a scale of
1/sqrt(d), Gemma 2's cap of 50): only a probe that changes the argument can see them.
variants._builtins registers them as `broken.<name>`.
"""
from __future__ import annotations

from .eager import eager_attention
from .varlen import paged_gather
from .inputs import ScoreMod

# name -> (the argument it ignores, what it does)
ARGUMENT_CONTROLS: dict[str, tuple[str, str]] = {
    "scale_ignored": ("scale", "takes `scale` and always uses 1/sqrt(d): right wherever the scale is the default"),
    "softcap_fixed": ("softcap", "takes the soft-capping cap and always uses Gemma 2's 50: right wherever the cap "
                                 "is 50"),
    "causal_ignored": ("causal", "takes `causal` and never masks the future (a wrapper that drops is_causal)"),
    "mask_ignored": ("mask", "takes `mask` and drops it (a mask passed where the kernel expects another argument)"),
    "window_ignored": ("window", "takes the sliding window's width and drops it: every key visible (a window "
                                 "accepted on one code path and lost on another)"),
    "block_table_stale": ("block_table", "keeps the block table of its first call on its queries and reads later "
                                         "calls' pages by it (a table captured once, as in a CUDA graph, and not "
                                         "updated): right until the cache's pages move"),
}
# Each control's scenarios: those where its argument is probed (workload/arguments.py) and its
# requirements (Variant.requires): a cell without the argument has nothing to show.
ARGUMENT_CONTROL_CELLS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "scale_ignored": (("normal",), {}),
    "softcap_fixed": (("softcap",), {"score_mod": "it ignores the cap: a cell without soft-capping has none"}),
    "causal_ignored": (("normal",), {}),
    "mask_ignored": (("padding", "sliding_window"), {}),
    "window_ignored": (("sliding_window",), {}),
    "block_table_stale": (("paged", "paged_edges"), {}),
}
GEMMA2_CAP = 50.0


def broken_scale_ignored(q, k, v, *, mask=None, causal=False, scale=None):
    """eager with the scale argument dropped."""
    return eager_attention(q, k, v, mask=mask, causal=causal, scale=None)


def broken_softcap_fixed(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None):
    """eager with soft-capping at a cap of 50 whatever the cap given."""
    fixed = None if score_mod is None else ScoreMod(score_mod.kind, GEMMA2_CAP)
    return eager_attention(q, k, v, mask=mask, causal=causal, scale=scale, score_mod=fixed)


def broken_causal_ignored(q, k, v, *, mask=None, causal=False, scale=None):
    """eager with the causal flag dropped."""
    return eager_attention(q, k, v, mask=mask, causal=False, scale=scale)


def broken_mask_ignored(q, k, v, *, mask=None, causal=False, scale=None):
    """eager with the mask dropped."""
    return eager_attention(q, k, v, mask=None, causal=causal, scale=scale)


FIRST_TABLE_ATTRIBUTE = "_audit_first_block_table"


def broken_block_table_stale(q, k_pages, v_pages, *, block_table, seqused, mask=None, causal=False, scale=None):
    """paged_gather by the block table of its first call on these queries (kept on the queries tensor, as
    long as it lives)."""
    if getattr(q, FIRST_TABLE_ATTRIBUTE, None) is None:
        setattr(q, FIRST_TABLE_ATTRIBUTE, block_table.clone())
    return paged_gather(q, k_pages, v_pages, block_table=getattr(q, FIRST_TABLE_ATTRIBUTE), seqused=seqused,
                        mask=mask, causal=causal, scale=scale)


def broken_window_ignored(q, k, v, *, mask=None, causal=False, scale=None, window=None):
    """eager taking the window as an argument (call form "window") and dropping it."""
    return eager_attention(q, k, v, mask=mask, causal=causal, scale=scale)
