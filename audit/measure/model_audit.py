"""The model audit: a small decoder (workload/model.py) run with each variant as its attention function,
in each dtype, against the same model in float64 with float64 attention, layer by layer.

Per variant and dtype (one record each, MODEL_SCHEMA):
- hidden_err[l]: the hidden state's error after layer l + 1, RMSE relative to the float64 run's RMS;
- attn_err[l]: the attention block's own output (after o_proj) the same way;
- growth_median, growth_max: hidden_err[l + 1] / hidden_err[l] over the layers (how error compounds);
- kl: KL(float64 || variant) of the next-token distribution, mean over every position; top1_agreement:
  the fraction of positions whose most likely token is the float64 run's; logprob_check (vLLM's
  check_logprobs_close): at the first position where the two most likely tokens differ, each is in the
  other's top LOGPROB_TOP_K; first_divergence: that position (None: none differs); top1_mismatches: every
  such position (b · T + t); decisive_mismatches: those where float64's top token leads the next by more
  than DECISIVE_MARGIN (a near tie flips with any rounding);
- batch_max_diff, batch_bitwise: the first prompt alone against the same prompt in the batch (logits);
- chunk_max_diff: the prompt's last half prefilled after its first half (a KV cache) against one
  prefill (logits of the last half), relative to their RMS.
The float64 run's spread is recorded once (reference record): the attention logits' std per layer, the
share of peaked heads, the next-token entropy and most likely token's probability.

Imports torch in the functions only.
"""
from __future__ import annotations

import copy
import math
import time
from typing import Any, Callable, Iterator

from ..core.dtypes import model_dtypes
from ..core.errors import BackwardUnsupported, Unsupported, skip_platform_refusals
from ..workload.inputs import torch_dtype
from ..workload.model import (DECISIVE_MARGIN, ModelSpec, as_transformers_attention, build_model, prompts,
                              register_variant)

MODEL_SCHEMA = 1
LOGPROB_TOP_K = 5                 # vLLM's check_logprobs_close default

PEAKED_ENTROPY_FRACTION = 0.3     # a head is peaked when its rows' entropy is under this share of ln(keys seen)
REFERENCE_NAME = "audit_model_float64"


def _name(variant: str) -> str:
    """The transformers registry name of an audited variant."""
    return "audit_model_" + "".join(c if c.isalnum() else "_" for c in variant)


class Trace:
    """What one forward leaves: each layer's output hidden state and attention output (float64 copies),
    and the logits (B, T, V)."""

    def __init__(self, model: Any) -> None:
        self.hidden: list[Any] = []
        self.attn: list[Any] = []
        self._hooks = []
        for layer in model.model.layers:
            self._hooks.append(layer.register_forward_hook(self._keep(self.hidden)))
            self._hooks.append(layer.self_attn.register_forward_hook(self._keep(self.attn)))

    @staticmethod
    def _keep(into: list) -> Callable:
        def hook(module: Any, args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, (tuple, list)) else output
            into.append(out.detach().double())                                   # (B, T, hidden)
        return hook

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


def _forward(model: Any, ids: Any, **kwargs: Any) -> tuple[Any, Trace]:
    import torch
    trace = Trace(model)
    try:
        with torch.no_grad():
            out = model(ids, **kwargs)
    finally:
        trace.close()
    return out, trace


def _relative(x: Any, ref: Any) -> float:
    """RMSE(x - ref) / RMS(ref)."""
    num = float(((x - ref) ** 2).mean().sqrt())
    den = float((ref ** 2).mean().sqrt())
    return num / den if den > 0 else num


class Reference:
    """The float64 model with float64 attention (the audit's eager) on the spec's prompts, and the
    spread its logits show."""

    def __init__(self, spec: ModelSpec, device: str = "cpu") -> None:
        import torch
        from ..workload.variants import builtin_variants
        start = time.perf_counter()
        self.spec, self.device = spec, device
        self._logit_std: dict[int, list[float]] = {}
        self._peaked: list[bool] = []
        self._record_on = True                  # the float64 run's own forward only
        self._in_dtype: dict[str, Any] = {}
        eager = builtin_variants()["eager"].build()
        register_variant(REFERENCE_NAME, as_transformers_attention(eager, True, self._record))
        self.model = build_model(spec, REFERENCE_NAME, device)
        self.ids = prompts(spec, device)                                          # (B, T)
        out, self.trace = _forward(self.model, self.ids)
        self.logits = out.logits.double()                                         # (B, T, V)
        self._record_on = False
        # what every variant's run is compared with, computed once: log-probabilities, top token, and the
        # positions where the top token leads the next by more than DECISIVE_MARGIN
        self.log_probs = torch.log_softmax(self.logits, -1)                       # (B, T, V)
        self.top = self.logits.argmax(-1)                                         # (B, T)
        two = self.log_probs.topk(2, dim=-1).values                              # (B, T, 2)
        self.decisive = (two[..., 0] - two[..., 1]) > DECISIVE_MARGIN            # (B, T)
        self.probs = probs = self.log_probs.exp()                                 # (B, T, V)
        self.stats = {
            "kind": "reference", "model": spec.name, "schema": MODEL_SCHEMA, "device": device, "status": "ok",
            "logit_std": [float(sum(v) / len(v)) for _, v in sorted(self._logit_std.items())],
            "peaked_heads": float(sum(self._peaked) / max(1, len(self._peaked))),
            "next_token_entropy": float(-(probs * torch.log(probs.clamp_min(1e-300))).sum(-1).mean()),
            "next_token_top1_prob": float(probs.max(-1).values.mean()),
            "seconds": time.perf_counter() - start,     # its build and float64 run (the cost model's build_s)
        }

    def model_in(self, dtype: str) -> Any:
        """The model cast to `dtype`, made once per dtype and shared by the variants (each sets its
        attention implementation before its runs)."""
        if dtype not in self._in_dtype:
            self._in_dtype[dtype] = copy.deepcopy(self.model).to(torch_dtype(dtype))
        return self._in_dtype[dtype]

    def _record(self, module: Any, q: Any, k: Any) -> None:
        """The float64 run's attention logits: their std over the keys each query sees, per layer, and
        which heads are peaked (mean row entropy under PEAKED_ENTROPY_FRACTION of ln(keys seen))."""
        import torch
        if not self._record_on:
            return
        group = q.shape[1] // k.shape[1]
        kk = k.repeat_interleave(group, dim=1)                                    # (B, H, T, d)
        scores = (q @ kk.transpose(-2, -1)) * module.scaling                     # (B, H, T, T)
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()   # (T, T)
        window = getattr(module, "sliding_window", None)
        if window:
            keep &= ~torch.ones_like(keep).tril(-window)
        seen = scores.masked_select(keep)
        self._logit_std.setdefault(module.layer_idx, []).append(float(seen.std()))
        p = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
        entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)                   # (B, H, T)
        rows = keep.sum(-1).double().log().clamp_min(1e-9)                       # (T,)
        share = (entropy[..., 1:] / rows[1:]).mean(dim=(0, 2))                    # (H,)
        self._peaked.extend(bool(s < PEAKED_ENTROPY_FRACTION) for s in share)


def audit_variant(ref: Reference, variant: Any, dtype: str) -> dict[str, Any]:
    """One record: the model with `variant` as its attention, in `dtype`, against the float64 run."""
    spec = ref.spec
    base = {"kind": "variant", "model": spec.name, "schema": MODEL_SCHEMA, "device": ref.device,
            "variant": variant.name, "dtype": dtype}
    name = _name(variant.name)
    takes_sinks = "sinks" not in variant.unsupported
    refusal = variant.refusal(spec.needs())
    if refusal:
        return {**base, "status": "skipped", "reason": refusal}
    try:
        fn = variant.build()
        register_variant(name, as_transformers_attention(fn, takes_sinks))
        model = ref.model_in(dtype)
        model.config._attn_implementation = name
        start = time.perf_counter()
        with skip_platform_refusals():                      # torch refusing this machine: skipped
            out, trace = _forward(model, ref.ids)
        logits = out.logits.double()                                              # (B, T, V)
        columns = _compare(ref, trace, logits)
        columns.update(_batch_invariance(model, ref.ids, logits), **_chunked(model, ref.ids, logits))
        _synchronize(ref.device)
        columns["seconds"] = time.perf_counter() - start
    except (Unsupported, BackwardUnsupported) as exc:
        return {**base, "status": "skipped", "reason": str(exc)[:300]}
    except Exception as exc:  # noqa: BLE001 - a variant that fails in the model: its record says why
        return {**base, "status": "failed", "reason": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
    return {**base, "status": "ok", "reason": None, **columns}


def _compare(ref: Reference, trace: Trace, logits: Any) -> dict[str, Any]:
    import torch
    hidden = [_relative(x, r) for x, r in zip(trace.hidden, ref.trace.hidden)]
    attn = [_relative(x, r) for x, r in zip(trace.attn, ref.trace.attn)]
    growth = [b / a for a, b in zip(hidden, hidden[1:]) if a > 0 and math.isfinite(a) and math.isfinite(b)]
    p_ref, top_ref, decisive = ref.log_probs, ref.top, ref.decisive
    p = torch.log_softmax(logits, -1)                                             # (B, T, V)
    kl = float((ref.probs * (p_ref - p)).sum(-1).mean())
    top = logits.argmax(-1)                                                       # (B, T)
    agree = top_ref == top
    first, check = None, True
    flat = (~agree).flatten().nonzero()
    if len(flat):
        first = int(flat[0])
        b, t = divmod(first, agree.shape[1])
        k_ref = ref.logits[b, t].topk(LOGPROB_TOP_K).indices.tolist()
        k_var = logits[b, t].topk(LOGPROB_TOP_K).indices.tolist()
        check = int(top[b, t]) in k_ref and int(top_ref[b, t]) in k_var
    finite = all(math.isfinite(h) for h in hidden)
    return {"layers": len(hidden), "hidden_err": hidden, "attn_err": attn,
            "final_hidden_err": hidden[-1] if hidden else None,
            "growth_median": float(sorted(growth)[len(growth) // 2]) if growth else None,
            "growth_max": max(growth) if growth else None,
            "kl": kl if math.isfinite(kl) else None, "top1_agreement": float(agree.double().mean()),
            "top1_mismatches": flat[:, 0].tolist(),
            # one transfer, not one a position
            "decisive_mismatches": flat[:, 0][decisive.flatten()[flat[:, 0]]].tolist(),
            "logprob_check": check if finite else False, "first_divergence": first}


def _batch_invariance(model: Any, ids: Any, logits: Any) -> dict[str, Any]:
    """The first prompt alone against the same prompt in the batch."""
    if ids.shape[0] < 2:
        return {"batch_max_diff": None, "batch_bitwise": None}
    out, _ = _forward(model, ids[:1])
    alone = out.logits.double()[0]
    return {"batch_max_diff": float((alone - logits[0]).abs().max()), "batch_bitwise": bool((alone == logits[0]).all())}


def _chunked(model: Any, ids: Any, logits: Any) -> dict[str, Any]:
    """The prompt's first half prefilled into a KV cache, then its last half: the last half's logits
    against one prefill's, relative to their RMS."""
    import inspect
    from transformers import DynamicCache
    half = ids.shape[1] // 2
    cache = DynamicCache()
    # transformers 5.x renames past_key_values to cache (the old name goes in 5.40)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    _forward(model, ids[:, :half], **{name: cache}, use_cache=True)
    out, _ = _forward(model, ids[:, half:], **{name: cache}, use_cache=True)
    return {"chunk_err": _relative(out.logits.double(), logits[:, half:])}


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


STEP_PREFIX = "model"             # a model audit step's in-flight mark: "model:<model>[:<variant>:<dtype>]"


def step_id(model: str, variant: str | None = None, dtype: str | None = None) -> str:
    """A model audit step's name in a run's in-flight marker and its record's key: "model:<model>" (its
    float64 run) or "model:<model>:<variant>:<dtype>"."""
    return ":".join([STEP_PREFIX, model, *([variant, dtype] if variant is not None else [])])


def record_key(record: dict) -> str | None:
    """step_id of a model.jsonl record (None for a record of no step: transformers unavailable)."""
    if record.get("kind") == "reference":
        return step_id(record["model"])
    if record.get("kind") == "variant":
        return step_id(record["model"], record["variant"], record["dtype"])
    return None


def audit_model(spec: ModelSpec, variants: list[Any], dtypes: list[str], device: str = "cpu",
                done: dict[str, dict] | None = None, before: Callable[[str], None] | None = None
                ) -> Iterator[dict[str, Any]]:
    """The reference record, then one record per variant and dtype, each as it is made. done: records of
    an earlier, interrupted audit by step_id (those steps are not made again; the float64 run is, where
    a variant step is left, unless it failed: then every step left is skipped); before(step_id): called
    before each step (a run marks it in flight, execute.supervisor)."""
    done = done or {}
    steps = [(v, d) for v in variants for d in dtypes if step_id(spec.name, v.name, d) not in done]
    ref_id = step_id(spec.name)
    earlier = done.get(ref_id)
    if earlier is not None and not steps:
        return
    ref, failure = None, None
    if earlier is not None and earlier.get("status", "ok") != "ok":
        failure = earlier.get("reason")
    else:
        if before is not None:
            before(ref_id)
        try:
            ref = Reference(spec, device)
        except Exception as exc:  # noqa: BLE001 - the model itself fails here: its record says why
            failure = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        if earlier is None:
            yield ref.stats if ref is not None else {"kind": "reference", "model": spec.name, "schema": MODEL_SCHEMA,
                                                    "device": device, "status": "failed", "reason": failure}
    for variant, dtype in steps:
        if ref is None:
            yield {"kind": "variant", "model": spec.name, "schema": MODEL_SCHEMA, "device": device,
                   "variant": variant.name, "dtype": dtype, "status": "skipped",
                   "reason": f"the model's float64 run failed: {failure}"}
            continue
        if before is not None:
            before(step_id(spec.name, variant.name, dtype))
        yield audit_variant(ref, variant, dtype)


def append_record(run_dir: Any, record: dict[str, Any]) -> None:
    """One record appended to DIR/model.jsonl, flushed: what a crash leaves behind is kept."""
    import json
    import os
    from pathlib import Path
    from ..core.runfolder import MODEL_FILE
    with open(Path(run_dir) / MODEL_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def record_crash(run_dir: Any, step: str, reason: str, status: str = "error") -> None:
    """The record of a step whose measuring process died in it, or was killed over its time limit
    (execute.supervisor): the run goes on in a new process, which resumes after it."""
    parts = step.split(":")
    record: dict[str, Any] = {"schema": MODEL_SCHEMA, "model": parts[1], "status": status, "reason": reason}
    if len(parts) == 2:
        record["kind"] = "reference"
    else:
        record.update(kind="variant", variant=":".join(parts[2:-1]), dtype=parts[-1])
    append_record(run_dir, record)


def write_run_audit(run_dir: Any, models: tuple[str, ...], run_variants: list[str], device: str = "cpu",
                    before: Callable[[str], None] | None = None, left_out: str | None = None) -> int:
    """A run's model audit, after its cells (execute/supervisor.py): `models` on `device` with the run's
    eligible variants (workload.model.model_variants) in core.dtypes.model_dtypes(), each record appended to
    DIR/model.jsonl as it is made; an audit cut short (a crash, a time limit, Ctrl-C) resumes after its
    last record; without transformers one record saying so. Returns the records written now (0: no
    model asked for, or none left). left_out: why the run's plan leaves the audit out (plan.budget): one
    record saying so instead."""
    from ..workload.model import MODEL_SPECS, model_audit_unavailable, model_variants
    from ..workload.variants import resolve
    if not models:
        return 0
    from ..core.runfolder import read_model_records
    earlier = read_model_records(run_dir)
    done = {key: r for r in earlier if (key := record_key(r)) is not None}
    unavailable = model_audit_unavailable()
    if left_out is not None or unavailable:
        if earlier:
            return 0
        append_record(run_dir, {"kind": "left_out" if left_out else "unavailable", "schema": MODEL_SCHEMA,
                                "models": list(models), "reason": left_out or unavailable})
        return 1
    variants = [resolve(v) for v in model_variants(run_variants)]
    written = 0
    for name in models:
        for record in audit_model(MODEL_SPECS[name], variants, list(model_dtypes()), device, done, before):
            append_record(run_dir, record)
            written += 1
    return written
