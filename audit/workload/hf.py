"""transformers' attention functions as variants: `hf:sdpa`, `hf:eager`, `hf:flex_attention`,
`hf:NAME` for any name registered in `ALL_ATTENTION_FUNCTIONS` (a user's own kernel included),
`hf:MODEL.eager` for a model's own eager function (`hf:gpt_oss.eager`: gpt-oss's, with sinks).

Each is called the way a transformers model calls it (LlamaAttention.forward):

    attn_output, _ = attention_interface(module, query, key, value, attention_mask,
                                         dropout=0.0, scaling=module.scaling)

- `module` carries what the functions read: num_key_value_groups, is_causal, scaling,
  head_dim, layer_idx, training, config._attn_implementation.
- the mask comes from transformers' own mask interface (`masking_utils`,
  ALL_MASK_ATTENTION_FUNCTIONS[name]), built once per mask as a model builds it once per
  forward: sdpa gets a bool mask or None (is_causal), eager an additive finfo.min mask,
  flex_attention a BlockMask. The cell's key padding goes in as the 2-D `attention_mask`
  a tokenizer returns; a per-row pattern as a mask function; an additive float mask as
  the 4-D mask a user may pass, which transformers hands on as it is.
- causal masking follows transformers' KV-cache convention: queries are the last q_len
  positions (q_offset = kv_len - q_len), so the causal alignment is bottom-right, and the
  cell's golden follows it (Variant.causal_alignment).
- the output, (B, Tq, H, d), is turned back into (B, H, Tq, d).

transformers is an optional extra (`pip install attn-audit[hf]`); nothing here imports it
until an hf: variant is built or listed.
"""
from __future__ import annotations

from typing import Any, Callable

from ..core.errors import BackwardUnsupported, Unsupported, UsageError
from .draws import causal_keep
from .platform_limits import compiled_flex_refusal

HF_PREFIX = "hf:"
EAGER = "eager"     # not registered in ALL_ATTENTION_FUNCTIONS: each model defines its own
# Names that take no bare tensors: why each cannot run in a cell.
PAGED_REASON = ("needs a paged KV cache (PagedAttentionCache and its block tables), which a model's "
                "continuous-batching generate builds; it takes no bare q, k, v")


# Measured with transformers 5.24 and torch 2.13 on the CPU: every 4-D float mask (zeros included)
# kills the process. flex_attention_forward reads it as score_mask[b][0][q][kv] inside the compiled
# score_mod, the chained indexing that compiled for the CPU reads out of bounds (torch_kernels._flex).
FLEX_CPU_TENSOR_MASK = ("transformers' flex_attention_forward on the CPU crashes (SIGSEGV) on any 4-D float "
                        "mask: it indexes it as score_mask[b][0][q][kv] in the compiled score_mod, which "
                        "reads out of bounds when compiled for the CPU (torch 2.13); not run here")


def is_hf_name(name: str) -> bool:
    return name.startswith(HF_PREFIX)


def transformers_version() -> str | None:
    """The installed transformers' version, or None when it is not installed (nothing imported)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def _registry() -> tuple[Any, Any]:
    """(ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS); UsageError without transformers."""
    if transformers_version() is None:
        raise UsageError("--variant: hf: variants need transformers: pip install 'attn-audit[hf]' "
                         "(or pip install transformers)")
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    return ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS


def hf_names() -> list[str]:
    """Every hf: name of this environment: eager, then the registered attention functions."""
    functions, _ = _registry()
    return [HF_PREFIX + EAGER] + [HF_PREFIX + n for n in functions.valid_keys()]


def unavailable(name: str, device: str | None = None) -> str | None:
    """Why registered function `name` cannot run here (its package or device missing), or None."""
    if name.startswith("paged|"):
        return PAGED_REASON
    if name.startswith("flash_attention_"):
        import transformers.utils as tu
        check = getattr(tu, f"is_{name.replace('flash_attention', 'flash_attn')}_available", None)
        if check is None or not check():
            package = {"flash_attention_2": "flash-attn", "flash_attention_3": "flash-attn-3 (hopper)",
                       "flash_attention_4": "flash-attn-4 (cute)"}.get(name, "its flash-attn package")
            return f"transformers' {name} needs {package}, which is not installed here"
        if device is not None and not device.startswith("cuda"):
            return f"transformers' {name} runs on CUDA only"
    if name == "flex_attention" and device is not None:      # it compiles flex: a CPU Inductor refuses
        return compiled_flex_refusal(device)
    return None


MODEL_EAGER_SUFFIX = ".eager"      # hf:MODEL.eager: that model's own eager_attention_forward


def _model_eager(name: str) -> Callable[..., Any]:
    """`MODEL.eager` -> transformers.models.MODEL.modeling_MODEL.eager_attention_forward: a model's
    own eager attention (gpt-oss's reads module.sinks), called as that model calls it."""
    import importlib
    model = name[: -len(MODEL_EAGER_SUFFIX)]
    try:
        module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    except ImportError as exc:
        raise UsageError(f"--variant: hf:{name}: transformers has no model {model!r} here ({exc}); "
                         "give a model folder name, e.g. hf:gpt_oss.eager") from None
    fn = getattr(module, "eager_attention_forward", None)
    if fn is None:
        raise UsageError(f"--variant: hf:{name}: transformers.models.{model} defines no eager_attention_forward")
    return fn


def takes_sinks(name: str) -> bool:
    """Whether transformers' function `name` applies attention sinks: it takes `s_aux` (flex, flash),
    or (a model's eager function) reads `module.sinks`, as gpt-oss's does."""
    import inspect
    fn = _function(name)
    if "s_aux" in inspect.signature(fn).parameters:
        return True
    try:
        return "module.sinks" in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


# transformers 5.24's flex_attention_forward on the CPU: "Attention sinks cannot be run on CPU with flex
# attention" (it skips the lse there, and applies sinks through it).
FLEX_CPU_SINKS = ("transformers' flex_attention_forward cannot apply sinks on the CPU (it asks flex for no "
                  "lse there, and applies sinks through the lse)")


def check_name(name: str) -> None:
    """UsageError unless `name` is eager or registered in ALL_ATTENTION_FUNCTIONS."""
    _function(name)


def split(name: str) -> tuple[str | None, str]:
    """`module:NAME` -> (module, NAME): the module that registers a user's kernel (imported first,
    in every process that runs a cell); a plain NAME -> (None, NAME)."""
    module, _, registered = name.rpartition(":")
    return (module or None), registered


def _function(name: str) -> Callable[..., Any]:
    functions, _ = _registry()
    module, name = split(name)
    if module is not None:
        import importlib
        import os
        import sys
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - the user's import error, shown as such
            raise UsageError(f"--variant: hf:{module}:{name}: cannot import {module!r} (which should register "
                             f"{name!r}): {type(exc).__name__}: {exc}") from None
    if name == EAGER:
        from transformers.models.llama.modeling_llama import eager_attention_forward
        return eager_attention_forward
    if name.endswith(MODEL_EAGER_SUFFIX):
        return _model_eager(name)
    if name not in functions.valid_keys():
        raise UsageError(f"--variant: hf:{name} is not registered in transformers' ALL_ATTENTION_FUNCTIONS; "
                         f"registered: {', '.join(hf_names())}; a kernel of yours: hf:MODULE:{name}, "
                         f"where importing MODULE calls AttentionInterface.register({name!r}, fn)")
    return functions[name]


class _Config:
    """What attention functions read from `module.config`."""

    def __init__(self, name: str, heads: int, kv_heads: int, head_dim: int) -> None:
        self._attn_implementation = name
        self.num_attention_heads, self.num_key_value_heads, self.head_dim = heads, kv_heads, head_dim
        self.attention_dropout = 0.0


def _module(name: str, q: Any, k: Any, causal: bool, scaling: float) -> Any:
    """An attention nn.Module as transformers' functions see it (LlamaAttention's attributes)."""
    import torch

    module = torch.nn.Module()
    heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[-1]
    module.config = _Config(name, heads, kv_heads, head_dim)
    module.layer_idx, module.head_dim, module.scaling = 0, head_dim, scaling
    module.num_key_value_groups = heads // kv_heads
    module.is_causal = causal
    module.attention_dropout = 0.0
    module.eval()           # dropout 0 either way; flex_attention refuses dropout > 0
    return module


def _mask_function(q: Any, k: Any, mask: Any, causal: bool) -> tuple[Callable, Any, Any, int]:
    """(mask_function, 2-D attention_mask, 4-D float mask, q_offset) for the mask interface.

    A bool mask of one row per batch (B|1, 1, 1, Tk) is key padding: the 2-D attention_mask.
    Any other bool mask is a per-row pattern: and-ed into the mask function. A float mask is
    additive: transformers takes a 4-D mask as it is (and, causal, it must carry causality:
    folded in, as finfo.min like transformers' own additive masks).
    """
    import torch
    from transformers.masking_utils import and_masks, bidirectional_mask_function, causal_mask_function

    tq, tk = q.shape[-2], k.shape[-2]
    q_offset = tk - tq                           # the queries are the last tq positions
    base = causal_mask_function if causal else bidirectional_mask_function
    if mask is None:
        return base, None, None, q_offset
    if mask.dtype != torch.bool:
        full = mask.expand(q.shape[0], 1, tq, tk)                                # (B, 1, Tq, Tk)
        if causal:
            hidden = ~causal_keep(tq, tk, q.device, q_offset)                   # (Tq, Tk)
            # finfo.min where the mask says less already (-inf) would unmask: keep the lower
            full = torch.where(hidden, full.clamp(max=torch.finfo(full.dtype).min), full)
        return base, None, full.to(q.dtype), q_offset
    if mask.shape[-2] == 1:                                                      # key padding
        return base, mask[:, 0, 0, :].expand(q.shape[0], tk), None, q_offset    # (B, Tk)

    def cell_pattern(batch_idx, head_idx, q_idx, kv_idx):
        # mask: (B|1, 1, Tq, Tk); indices broadcast tensors (sdpa/eager) or scalars (flex)
        b = batch_idx if mask.shape[0] > 1 else batch_idx * 0
        return mask[b, 0, q_idx - q_offset, kv_idx]
    return and_masks(base, cell_pattern), None, None, q_offset


def build(name: str) -> Callable[..., Any]:
    """The audit-contract callable of transformers' attention function `name` (torch is imported
    in the call, not captured: audit.repro copies the closure into reproduction scripts)."""
    import inspect
    fn = _function(name)
    uses_s_aux = "s_aux" in inspect.signature(fn).parameters
    reads_sinks = not uses_s_aux and takes_sinks(name)
    _, name = split(name)
    if name == "flex_attention":
        # transformers compiles flex_attention once, and Dynamo recompiles it per kind of cell:
        # past its default limit (8) it would run the unfused eager flex, silently
        from .compiling import configure_dynamo
        configure_dynamo()
    _, mask_functions = _registry()
    if name.endswith(MODEL_EAGER_SUFFIX):
        name = EAGER        # a model's eager function gets the eager mask and config, as in the model
    make_mask = mask_functions.get(name) if name in mask_functions.valid_keys() else None
    built: list = []        # [(mask tensor, causal, q shape, (module, attention_mask))]: the last one built

    def attention(q, k, v, *, mask=None, causal=False, scale=None, score_mod=None, sinks=None):
        import torch
        reason = unavailable(name, q.device.type)
        if name == "flex_attention" and q.device.type == "cpu" and mask is not None \
                and mask.dtype != torch.bool:
            reason = FLEX_CPU_TENSOR_MASK
        if name == "flex_attention" and q.device.type == "cpu" and sinks is not None:
            reason = FLEX_CPU_SINKS
        if reason:
            raise Unsupported(reason)
        if name == "flex_attention" and q.device.type == "cpu" and torch.is_grad_enabled() \
                and any(t.requires_grad for t in (q, k, v)):
            raise BackwardUnsupported("FlexAttention has no backward on CPU in this torch "
                                      "(NotImplementedError); forward measured without grad")
        scaling = q.shape[-1] ** -0.5 if scale is None else scale
        # A model holds its attention module and builds its mask once per forward: once here per
        # mask (compared by identity while held) and shape, outside what a call costs.
        if not (built and built[0][0] is mask and built[0][1] == causal and built[0][2] == (q.shape, k.shape)):
            built[:] = [(mask, causal, (q.shape, k.shape),
                         (_module(name, q, k, causal, scaling), _attention_mask(name, make_mask, q, k, mask, causal)))]
        module, attention_mask = built[0][3]
        kwargs: dict[str, Any] = {}
        if score_mod is not None:
            kwargs["softcap"] = score_mod.cap
        if uses_s_aux:              # sinks as the model holds them: s_aux, or a parameter its function reads
            if sinks is not None:
                kwargs["s_aux"] = sinks
        elif reads_sinks:
            # a cell without sinks: -inf sinks, which take no weight (softmax over the keys alone)
            module.sinks = sinks if sinks is not None else torch.full((q.shape[1],), float("-inf"),
                                                                      dtype=q.dtype, device=q.device)
        out, _ = fn(module, q, k, v, attention_mask, dropout=0.0, scaling=scaling, **kwargs)
        return out.transpose(1, 2)                           # (B, Tq, H, d) -> (B, H, Tq, d)

    attention.__doc__ = f"transformers' {name} attention function, called as a model calls it"
    return attention


def _attention_mask(name: str, make_mask: Callable | None, q: Any, k: Any, mask: Any, causal: bool) -> Any:
    """The attention_mask transformers gives function `name` in this cell."""
    mask_function, padding, full, q_offset = _mask_function(q, k, mask, causal)
    if full is not None:
        return full
    if make_mask is None:
        # transformers builds no mask for an implementation without a registered mask function
        # (masking_utils._preprocess_mask_arguments): such a kernel sees causal as module.is_causal
        # and no mask at all.
        if mask is not None:
            raise Unsupported(f"transformers gives {name} no mask: it has no mask function in "
                              "ALL_MASK_ATTENTION_FUNCTIONS (register one with "
                              "AttentionMaskInterface.register)")
        return None
    tq, tk = q.shape[-2], k.shape[-2]
    kwargs: dict[str, Any] = dict(batch_size=q.shape[0], q_length=tq, kv_length=tk, q_offset=q_offset,
                                  kv_offset=0, mask_function=mask_function, attention_mask=padding,
                                  device=q.device)
    if name == EAGER:
        kwargs["dtype"] = q.dtype
    pattern = mask is not None and padding is None
    if pattern:
        # A per-row pattern (a window, fully masked rows) is more than causal and padding: the
        # mask must be built, as transformers' sliding-window masks are (local_size stops the skip).
        kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    elif not causal:
        # create_bidirectional_mask: no mask where nothing is masked
        kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=True)
    return make_mask(**kwargs)


def capabilities(name: str) -> dict[str, str]:
    """What `hf:name` cannot take (Variant.unsupported): soft-capping, except flex_attention; sinks,
    except the functions that take s_aux or read module.sinks (takes_sinks)."""
    limits = {} if takes_sinks(name) else {
        "sinks": "it takes no s_aux and reads no module.sinks: a model with sinks (gpt-oss) cannot use it"}
    _, name = split(name)
    if name.startswith("flash_attention"):
        limits["latent"] = ("flash-attn needs v of the head size of q and k (transformers' DeepSeek pads v "
                            "to it before calling)")
    if name == "flex_attention":
        return limits
    why = {EAGER: "Llama's eager_attention_forward ignores softcap (Gemma 2's applies it)",
           "sdpa": "transformers' sdpa_attention_forward raises on softcap"}.get(
        name, "not known to apply softcap: transformers passes it as a keyword a function may ignore")
    return {"score_mod": why, **limits}
