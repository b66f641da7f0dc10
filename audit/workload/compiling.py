"""How compiled code is configured: Dynamo and Inductor settings every compiled variant (the
built-ins and transformers' compiled flex_attention) runs under. One place, so the built-in
variants and audit.workload.hf share it without importing each other."""
from __future__ import annotations

import functools
from typing import Any, Callable

from ..core.errors import PlatformRefusal
from .platform_limits import compiled_flex_refusal

RECOMPILE_LIMIT = 1024   # a safety margin: each build compiles its own copy of the function


def configure_dynamo() -> None:
    """Dynamo and Inductor as every compiled variant needs them: a recompile limit that a run's
    shapes never reach, hitting it an error (never a silent eager fallback), and no FX-graph or
    AOT-autograd cache, so fusion is always observed (_compiled_fn says why)."""
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
    if trusted_vec_isa():
        inductor_config.cpp.vec_isa_ok = True


VEC_ISA_ENV = "TORCHINDUCTOR_VEC_ISA_OK"


@functools.cache
def trusted_vec_isa() -> bool:
    """Whether Inductor may take the vector ISAs this x86 CPU reports (torch.cpu's cpuinfo, which asks the
    OS too) without building a check of each in every process (config.cpp.vec_isa_ok): when the C++
    compiler Inductor uses accepts every one of their flags, which one compile of an empty program
    shows (about 50 ms). Inductor's own check builds a probe against ATen's vector headers per ISA and
    loads it in a child process: 6.5 s of a process's first compile with its cache cold (14 s -> 7.5 s
    on 2 cores of a Xeon with AMX), 1 s warm; a quick run's compiles were most of its cell time on a
    slower CPU. AMX and AVX-512 bf16 are still checked by Inductor (their own probes follow). False
    where $TORCHINDUCTOR_VEC_ISA_OK is set (the user's choice stands), off x86, or where the compiler
    refuses a flag (Inductor then checks as it would)."""
    import os
    import platform
    import subprocess
    import tempfile
    if os.environ.get(VEC_ISA_ENV) is not None or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        import torch
        from torch._inductor import cpp_builder, cpu_vec_isa
        reported = cpu_vec_isa.x86_isa_checker()
        flags = {f for isa in cpu_vec_isa.supported_vec_isa_list if all(x in reported for x in str(isa).split())
                 for f in isa._arch_flags.split()}
        if torch.cpu._is_avx512_bf16_supported():
            flags.add("-mavx512bf16")
        if not flags:
            return False
        with tempfile.TemporaryDirectory() as folder:
            done = subprocess.run([cpp_builder.get_cpp_compiler(), *sorted(flags), "-x", "c++", "-",
                                   "-o", os.path.join(folder, "probe")], input="int main() { return 0; }\n",
                                  capture_output=True, text=True, timeout=60)
        return done.returncode == 0
    except Exception:  # noqa: BLE001 - no compiler, an Inductor without these names: Inductor checks as it would
        return False


def _private_copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The same function with its own code object.

    Dynamo keeps compiled code per code object. When every build compiled the one
    `eager_attention`, its entries piled up and each new compile got slower (on a 2-core
    CPU: 1.0 s per compile after a dozen shapes, against 0.28 s with a private copy or a
    Dynamo reset); a reset would throw away the code other builds still use.
    """
    import types
    code = fn.__code__.replace()
    copy = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__doc__, copy.__qualname__, copy.__module__ = fn.__doc__, fn.__qualname__, fn.__module__
    return copy


def _compiled_fn(fn: Callable[..., Any], options: dict | None, *, fullgraph: bool = False) -> Callable[..., Any]:
    """torch.compile(fn) with static shapes, compiled for real, never silently eager.

    One compiled callable serves every cell of one shape, dtype and mask kind (the
    run's cellcache.BuildCache), so Dynamo is not reset per cell; each build compiles a private
    copy of `fn` (_private_copy), so builds do not share Dynamo's per-function cache.
    Hitting Dynamo's recompile limit is an error rather than a silent eager fallback.
    dynamic=False keeps every graph specialized to its shapes, as a user's static-shape
    compile would be (automatic dynamic shapes would also change what Inductor fuses).
    fullgraph=True makes a graph break an error instead of running that frame eagerly.
    """
    import torch
    configure_dynamo()
    fn = _private_copy(fn)
    extra = {"options": options} if options else {}
    return torch.compile(fn, dynamic=False, fullgraph=fullgraph, **extra)


def compiled_flex_attention() -> Callable[..., Any]:
    """torch.compile(flex_attention, fullgraph=True) (_compiled_fn) that refuses, before compiling, a
    CPU whose lowering torch refuses (platform_limits.compiled_flex_refusal): PlatformRefusal, the
    words torch's own refusal would give after a second or more of tracing."""
    from torch.nn.attention.flex_attention import flex_attention

    compiled = _compiled_fn(flex_attention, None, fullgraph=True)
    cpu_refusal = compiled_flex_refusal("cpu")             # the machine does not change under a run

    def call(q: Any, *args: Any, **kwargs: Any) -> Any:
        if cpu_refusal is not None and q.device.type == "cpu":
            raise PlatformRefusal(cpu_refusal)
        return compiled(q, *args, **kwargs)

    return call


def fused_attention_count() -> int:
    """How many times Inductor's pattern matcher rewrote attention into SDPA so far."""
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["fuse_attention"])


def graph_break_count() -> int:
    """How many graph breaks Dynamo has met in this process so far (each one splits a compiled
    function, and the code between the pieces runs eagerly). 0 while nothing has imported Dynamo:
    importing it only to count costs every eager-only worker process a second or two."""
    import sys
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else int(sum(utils.counters["graph_break"].values()))


def compiled_graph_count() -> int:
    """How many graphs Dynamo has compiled in this process so far (a compile happened when it grows)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])
