"""How compiled code is configured: Dynamo and Inductor settings every compiled variant (the
built-ins and transformers' compiled flex_attention) runs under. One place, so the built-in
variants and audit.workload.hf share it without importing each other."""
from __future__ import annotations

RECOMPILE_LIMIT = 1024   # a safety margin: each build compiles its own copy of the function


def configure_dynamo() -> None:
    """Dynamo and Inductor as every compiled variant needs them: a recompile limit that a run's
    shapes never reach, hitting it an error (never a silent eager fallback), and no FX-graph or
    AOT-autograd cache, so fusion is always observed (variants._compiled_fn says why)."""
    import torch
    import torch._dynamo
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 8 * RECOMPILE_LIMIT))
    # A graph served from Inductor's FX-graph or AOT-autograd cache skips the pattern matcher,
    # so its fuse_attention counter would not move and `fused_sdpa` would read false: compile for real.
    import torch._inductor.config as inductor_config
    inductor_config.fx_graph_cache = False
    functorch_config = getattr(getattr(torch, "_functorch", None), "config", None)
    if functorch_config is not None and hasattr(functorch_config, "enable_autograd_cache"):
        functorch_config.enable_autograd_cache = False
    if hasattr(config, "fail_on_recompile_limit_hit"):
        # Past the recompile limit Dynamo silently runs eager; make that an error instead.
        config.fail_on_recompile_limit_hit = True
