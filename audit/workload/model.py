"""Small decoders for the model audit: does swapping the attention change the model's output?

A ModelSpec is a transformers config in code (Llama-style, or gpt-oss-style with sinks and sliding-window
layers), built with no download, its weights drawn from a seed and shaped as a trained model's behave
(shape_weights): random weights give near-uniform attention and next-token distributions, which hide
every error. Each audited variant is registered as a transformers attention function
(register_variant), so the model calls it exactly where it calls its own. measure/model_audit.py runs
it against the same model in float64 with float64 attention.

Imports no torch or transformers at module level.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.errors import UsageError

# Shaping (docs/model.md): the attention logits' std a trained model shows (3-5), every fourth head
# twice as sharp (a peaked head), and the next-token logits' std that makes the distribution peaked
ATTENTION_LOGIT_STD = 4.0
PEAKED_HEAD_FACTOR = 2.0
NEXT_TOKEN_LOGIT_STD = 6.0
ATTENTION_BLOCK_SCALE = 0.5   # the attention block's output RMS against the residual stream's (about 1)
RESIDUAL_STD = 0.02            # the MLP's output projection: its block small beside attention's
# A position is decisive when float64's most likely token leads the next by this much log-probability:
# nearer ties flip with any rounding (sdpa's own bf16 flips them), so only decisive flips are findings
DECISIVE_MARGIN = 0.5


@dataclass(frozen=True)
class ModelSpec:
    """A decoder the model audit builds: its family (llama | gpt_oss), size and prompt."""

    name: str
    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    seq_len: int                   # the prompt's tokens
    batch: int                     # prompts
    sliding_window: int | None = None   # gpt_oss: every other layer attends in this window
    seed: int = 0
    # The cost model's priors per device kind (plan/overhead.py: model_audit_seconds), until a run on this
    # machine fits its own (overhead.fit_overheads): (building it and its float64 run, one variant's run in
    # one dtype), in seconds. cpu: measured on the reference host (2-core Xeon with AMX, 2026-12-04);
    # cuda: estimated from the FLOPs at an H200's float64 rate, not yet measured on a GPU.
    priors: dict = field(default_factory=lambda: {"cpu": (0.15, 0.015)})

    def prior(self, device: str) -> tuple[float, float]:
        """(build_s, run_s) on this device kind: its own prior, else the cpu one."""
        return self.priors.get(device, self.priors["cpu"])

    @property
    def intermediate(self) -> int:
        return 2 * self.hidden

    @property
    def experts_per_token(self) -> int:
        """The MLPs a token runs through: gpt-oss routes each to 2 of its 4 experts (_config)."""
        return 2 if self.family == "gpt_oss" else 1

    def forward_flops(self) -> float:
        """FLOPs of one forward of the batch of prompts, in the model's dtype: the layers' projections
        (q, k, v, o), their MLPs (gate, up, down per expert a token runs through), the attention
        (4·B·H·T²·d, every key: an upper bound for the windowed layers) and lm_head. What the
        model audit's run of one (variant, dtype) costs beyond its prior on a slower matmul
        (plan/overhead.py: model_audit_seconds)."""
        tokens = self.batch * self.seq_len
        projections = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate * self.experts_per_token
        attention = 4.0 * self.batch * self.heads * self.seq_len ** 2 * self.head_dim
        return 2.0 * tokens * (self.layers * (projections + mlp) + self.hidden * self.vocab) + self.layers * attention

    def needs(self) -> set[str]:
        """What its attention asks of a variant (variant_contract.FEATURES): sinks (gpt-oss), GQA."""
        return ({"sinks"} if self.family == "gpt_oss" else set()) | ({"gqa"} if self.kv_heads < self.heads else set())


MODEL_SPECS: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec("llama-tiny", "llama", layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=256, seq_len=48,
              batch=2),
    ModelSpec("gpt-oss-tiny", "gpt_oss", layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=256,
              seq_len=48, batch=2, sliding_window=16, priors={"cpu": (0.15, 0.04)}),
    ModelSpec("llama-small", "llama", layers=8, hidden=256, heads=8, kv_heads=2, head_dim=32, vocab=1024,
              seq_len=256, batch=2, priors={"cpu": (0.6, 0.12)}),
    ModelSpec("gpt-oss-small", "gpt_oss", layers=8, hidden=256, heads=8, kv_heads=2, head_dim=32, vocab=1024,
              seq_len=256, batch=2, sliding_window=64, priors={"cpu": (0.6, 0.28)}),
    # the gpu preset's: 16 layers, head_dim 64 (the kernels' common case), 1024 tokens, 40M (llama) and 110M
    # (gpt-oss, 4 experts) parameters. cpu priors measured on the reference host (15 s and 24 s to build, a
    # variant's run 1-9 s); cuda ones estimated (see ModelSpec.priors)
    ModelSpec("llama-medium", "llama", layers=16, hidden=512, heads=8, kv_heads=2, head_dim=64, vocab=4096,
              seq_len=1024, batch=2, priors={"cpu": (15.0, 3.5), "cuda": (2.0, 0.25)}),
    ModelSpec("gpt-oss-medium", "gpt_oss", layers=16, hidden=512, heads=8, kv_heads=2, head_dim=64, vocab=4096,
              seq_len=1024, batch=2, sliding_window=128, priors={"cpu": (24.0, 8.5), "cuda": (3.0, 0.5)}),
)}
# What the model audit runs by default (`audit model`), and in a run: the yardsticks and the controls
# first (every model audit proves its checks, as a run's cells do), then the run's own variants but those
# compiled per shape (a compile per model and dtype), those taking no mask (documents or pages only) and
# the other controls. Each of MODEL_CONTROLS shows at model level: broken.clamped in fp32 only (its 1e-6
# clamp is under half precision's rounding), broken.sink_ignored in gpt-oss, the others everywhere.
MODEL_YARDSTICKS: tuple[str, ...] = ("sdpa", "eager")
MODEL_CONTROLS: tuple[str, ...] = ("broken.unscaled", "broken.softmax_wrong_dim", "broken.clamped",
                                   "broken.sink_ignored")
MODEL_VARIANTS: tuple[str, ...] = ("eager", "sdpa", "flex_eager", *MODEL_CONTROLS)
# Left out of a run's model audit (`audit model` runs them when named): flex_attention uncompiled traces its
# call with Dynamo once per shape and dtype, 0.5-1.4 s a run against sdpa's 0.01-0.12 s (measured: 2.2 s of
# the quick preset's 4.0 s model audit, 5.1 s of the cpu preset's 12.1 s), for torch's dense fallback,
# which no model is served with; its per-call numerics are the cells'
MODEL_RUN_LEFT_OUT: tuple[str, ...] = ("flex_eager",)
TRANSFORMERS_IMPORT_S = 1.0     # importing transformers and its model code in a measuring process that has torch


UNAVAILABLE = "transformers is not installed (pip install -e '.[hf]')"


def model_audit_unavailable() -> str | None:
    """Why no model audit can run in this environment (None: it can): it runs transformers' decoders, an
    optional extra. The plan reserves no time for it then, and its record says why."""
    from .hf import transformers_version
    return UNAVAILABLE if transformers_version() is None else None


def model_variants(run_variants: list[str]) -> list[str]:
    """The variants a run's model audit runs (MODEL_YARDSTICKS, MODEL_CONTROLS, then the run's own eligible
    ones)."""
    from .variant_contract import BROKEN_PREFIX
    from .variants import builtin_variants
    table = builtin_variants()

    def eligible(name: str) -> bool:
        spec = table.get(name)
        if spec is None:                       # a plug-in or an hf: function: the attention people run
            return True
        if name.startswith(BROKEN_PREFIX):
            return name in MODEL_CONTROLS
        return not spec.compiled and spec.masks and "paged" not in spec.forms and name not in MODEL_RUN_LEFT_OUT
    return list(dict.fromkeys([*MODEL_YARDSTICKS, *MODEL_CONTROLS, *(v for v in run_variants if eligible(v))]))


def predicted_runs(spec: ModelSpec, variants: list[str]) -> int:
    """How many runs of `spec` in each of the model audit's dtypes (core.dtypes.model_dtypes) are not
    refused up front (a built-in's declared refusal)."""
    from .variants import builtin_variants
    table = builtin_variants()
    refused = sum(1 for v in variants if v in table and table[v].refusal(spec.needs()))
    return len(variants) - refused
FAMILIES: tuple[str, ...] = ("llama", "gpt_oss")


def check_model_name(name: str) -> ModelSpec:
    if name not in MODEL_SPECS:
        raise UsageError(f"--model: unknown model {name!r}; allowed: {', '.join(MODEL_SPECS)}")
    return MODEL_SPECS[name]


def _config(spec: ModelSpec, attention: str) -> Any:
    """The transformers config of `spec`, calling the attention function registered as `attention`."""
    common = dict(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                  num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
                  head_dim=spec.head_dim, tie_word_embeddings=False)
    if spec.family == "llama":
        from transformers import LlamaConfig
        config = LlamaConfig(**common, max_position_embeddings=4 * spec.seq_len)
    else:
        from transformers import GptOssConfig
        config = GptOssConfig(**common, sliding_window=spec.sliding_window, num_local_experts=4,
                              experts_implementation="eager",      # grouped_mm takes no float64
                              num_experts_per_tok=2,
                              layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                                           for i in range(spec.layers)])
    config._attn_implementation = attention
    return config


def build_model(spec: ModelSpec, attention: str, device: str = "cpu") -> Any:
    """The decoder of `spec` on `device`, its weights drawn from spec.seed and shaped (shape_weights), in
    float64, eval mode, calling the attention function registered as `attention`. Built on the device
    itself (a 100M-parameter float64 model is initialised there, not on the host and copied)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()            # its config notes (RoPE defaults) are not the audit's findings
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(_config(spec, attention), dtype=torch.float64)
    shape_weights(model, spec)
    return model.eval()


def shape_weights(model: Any, spec: ModelSpec) -> None:
    """Weights whose attention and next-token distributions are peaked as a trained model's.

    After RMSNorm each hidden element has unit RMS, so a query or key element drawn with std σ has
    variance hidden·σ², and a logit q·k·d^-1/2 has std hidden·σ_q·σ_k: σ_q = σ_k = sqrt(std / hidden)
    gives ATTENTION_LOGIT_STD; every fourth query head is PEAKED_HEAD_FACTOR sharper. The next-token
    logits (after the final norm) get std NEXT_TOKEN_LOGIT_STD from lm_head's σ = std / sqrt(hidden);
    embeddings are N(0, 1); values have unit std (v_proj σ = hidden^-1/2) and the attention block's
    output ATTENTION_BLOCK_SCALE of the residual stream's RMS (o_proj σ = scale / sqrt(H·d)), so an
    attention error reaches the stream as it does in a trained model; the MLP's output is small
    (N(0, RESIDUAL_STD²)). The spread measured is recorded
    (measure/model_audit.py: logit_std, next_token_entropy)."""
    import math
    import torch
    device = model.lm_head.weight.device        # drawn there: the same weights on every CPU, its own on a GPU
    gen = torch.Generator(device=device).manual_seed(spec.seed)

    def draw(weight: Any, std: float) -> None:
        weight.copy_(torch.randn(weight.shape, generator=gen, dtype=torch.float64, device=device) * std)

    # RoPE's attention scaling (gpt-oss's YaRN: about 1.35) multiplies q and k: divided out here
    rope_scale = float(getattr(model.model.rotary_emb, "attention_scaling", 1.0) or 1.0)
    qk_std = math.sqrt(ATTENTION_LOGIT_STD / spec.hidden) / rope_scale
    with torch.no_grad():
        draw(model.get_input_embeddings().weight, 1.0)
        draw(model.lm_head.weight, NEXT_TOKEN_LOGIT_STD / math.sqrt(spec.hidden))
        for layer in model.model.layers:
            attn = layer.self_attn
            draw(attn.q_proj.weight, qk_std)
            draw(attn.k_proj.weight, qk_std)
            q = attn.q_proj.weight.view(spec.heads, spec.head_dim, spec.hidden)       # (H, d, hidden)
            q[::4] *= PEAKED_HEAD_FACTOR
            draw(attn.v_proj.weight, 1.0 / math.sqrt(spec.hidden))                    # v elements of unit std
            draw(attn.o_proj.weight, ATTENTION_BLOCK_SCALE / math.sqrt(spec.heads * spec.head_dim))
            for name, param in layer.mlp.named_parameters():
                if "down" in name:                                  # the MLP's output projection(s)
                    draw(param, RESIDUAL_STD)
            if getattr(attn, "sinks", None) is not None:
                attn.sinks.copy_(torch.randn(attn.sinks.shape, generator=gen, dtype=torch.float64, device=device) + 2.0)


def prompts(spec: ModelSpec, device: str = "cpu") -> Any:
    """(batch, seq_len) token ids drawn from spec.seed + 1 (on the host: the same prompts on every device)."""
    import torch
    gen = torch.Generator().manual_seed(spec.seed + 1)
    return torch.randint(0, spec.vocab, (spec.batch, spec.seq_len), generator=gen).to(device)


def as_transformers_attention(fn: Callable[..., Any], takes_sinks: bool,
                              record: Callable[[Any, Any, Any], None] | None = None) -> Callable[..., Any]:
    """An audit variant (variant_contract.py's contract) as a transformers attention function:
    f(module, q, k, v, attention_mask, scaling, dropout, s_aux=None, **kw) -> (out (B, T, H, d), None).
    transformers hands q (B, H, Tq, d), k, v (B, Hkv, Tk, d) and the bool mask of register_variant's
    mask function (True = attend; causal, the window and padding in it), so the variant gets causal=False.
    record(module, q, k): called first (the float64 run's logit statistics)."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, s_aux=None, **kwargs):
        if record is not None:
            record(module, query, key)
        if attention_mask is None:
            raise ValueError("transformers handed no attention mask: the mask function registered with the "
                             "variant (register_variant) was not used")
        call = dict(mask=attention_mask, causal=False, scale=scaling)
        if s_aux is not None:
            if not takes_sinks:
                from ..core.errors import Unsupported
                raise Unsupported("the model's layers have sinks (gpt-oss) and this variant takes none")
            call["sinks"] = s_aux.to(query.dtype)
        out = fn(query, key, value, **call)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.transpose(1, 2).contiguous(), None                             # (B, Tq, H, d)
    return attention


def register_variant(name: str, attention: Callable[..., Any]) -> None:
    """Register `attention` with transformers as `name`, with a mask function that always builds
    the bool mask (never skips it for is_causal): every variant is handed its masking."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, _always_a_mask)


def _always_a_mask(*args: Any, **kwargs: Any) -> Any:
    """transformers' sdpa_mask, never skipped: transformers passes allow_is_causal_skip=True itself (a None
    mask then means causal for SDPA alone), so it is overridden here."""
    from transformers.masking_utils import sdpa_mask
    return sdpa_mask(*args, **{**kwargs, "allow_is_causal_skip": False})
