"""float64 golden attention and gradients, chunked over query rows so memory stays bounded.

Computed once per input set and shared by every variant of that set (the
run caches it per Case.input_key: cellcache.InputCache). The golden works from the *logical*
visibility (causal alignment plus the scenario's mask), never from a float
mask's values, so a finfo.min mask is still a mask here. Rows with no visible
key get output 0 (SDPA's convention); error metrics leave them out.

GQA/MQA: k and v have Hkv <= H heads; query head h meets key/value head
h // (H / Hkv). The golden computes it per group (a view, never a copy of k and v
per query head), so dk and dv are sums over each group's query heads, as autograd
gives them for any implementation. A score modification (inputs.ScoreMod) is
applied to the float64 scaled scores before masking.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from ...workload.draws import causal_offset
from .numerics import BACKWARD_FLOP_FACTOR, SaturationAccumulator, attention_flops

CHUNK_BYTES = 32 * 2**20        # float64 score block per chunk on the CPU; backward holds a few
CUDA_CHUNK_BYTES = 256 * 2**20  # on a GPU: fewer, larger chunks (each chunk costs launches and syncs)

# Float64 FLOPs (forward + backward) the golden may spend on one input set. Past it, the
# golden covers an evenly spaced, deterministic subset of (batch, head) slices: attention is
# independent per slice, so the subset's golden is exact for those slices (golden_subset).
GOLDEN_FLOP_BUDGET = {"cpu": 3e10, "cuda": 4e12}


@dataclass
class Golden:
    out: Any                      # (B, H, Tq, d) float64
    dq: Any                       # (B, H, Tq, d) float64
    dk: Any                       # (B, Hkv, Tk, d) float64
    dv: Any                       # (B, Hkv, Tk, d) float64
    row_visible: Any              # (B|1, H|1, Tq) bool: row sees at least one key
    saturation: dict[str, Any]    # max_prob, entropy, min_entropy, onehot_frac, max_logit, max_qk
    alignment: str = "top-left"
    lse: Any = None               # (B, H, Tq) float64 logsumexp over the keys (no sink), -inf on rows seeing none
    dsinks: Any = None            # (H,) float64 gradient of the sinks (a sinks cell with gradients), or None
    # {"dq", "dk"}: the gradient through the lse alone, of <lse, grad_lse> (a returned LSE's), or None
    lse_grads: dict[str, Any] | None = None
    # sinks cells: the lse with the sink counted, logaddexp(lse, sink) (flash-attn's, FlashInfer's
    # convention), and the gradient through it; None elsewhere
    lse_sink: Any = None
    lse_sink_grads: dict[str, Any] | None = None
    # with moved_values: the output had v been moved_values (same probabilities: P @ moved_values), or None
    moved_out: Any = None


def visibility(tq: int, tk: int, r0: int, r1: int, *, causal: bool, device: Any,
               alignment: str = "top-left", visible: Any = None) -> Any:
    """(…, r1-r0, Tk) bool of which keys rows [r0, r1) may see, or None when all.

    `device` has no default: the causal part is built here and must land where the
    inputs are (a CPU arange meeting a CUDA mask broke every masked causal cell on CUDA).
    """
    import torch
    vis = None
    if causal:
        i = torch.arange(r0, r1, device=device)[:, None]                      # (rows, 1)
        j = torch.arange(tk, device=device)[None, :]                          # (1, Tk)
        vis = j <= i + causal_offset(tq, tk, alignment)                       # (rows, Tk)
    if visible is not None:
        rows = visible[..., r0:r1, :] if visible.shape[-2] > 1 else visible   # (B|1, 1, rows|1, Tk)
        vis = rows if vis is None else (vis & rows)
    return vis


def grouped_matmul(a: Any, b: Any) -> Any:
    """a (B, H, n, x) @ b (B, Hkv, x, m) -> (B, H, n, m), query head h using b's head
    h // (H / Hkv): a view per group, so b is never copied per query head."""
    B, H = a.shape[0], a.shape[1]
    kv = b.shape[1]
    if kv == H:
        return a @ b
    grouped = a.reshape(B, kv, H // kv, *a.shape[2:]) @ b.unsqueeze(2)        # (B, Hkv, G, n, m)
    return grouped.reshape(B, H, *grouped.shape[3:])


def _chunk_bytes(device: Any) -> int:
    return CUDA_CHUNK_BYTES if str(device).startswith("cuda") else CHUNK_BYTES


def _chunks(tq: int, per_row_bytes: int, device: Any = "cpu") -> Iterator[tuple[int, int]]:
    rows = max(1, _chunk_bytes(device) // max(1, per_row_bytes))
    for r0 in range(0, tq, rows):
        yield r0, min(tq, r0 + rows)


def golden_prob_chunks(q: Any, k: Any, *, causal: bool, visible: Any = None, scale: float | None = None,
                       alignment: str = "top-left", score_mod: Any = None,
                       sinks: Any = None) -> Iterator[tuple[int, int, Any, Any]]:
    """Yield (r0, r1, probs (B, H, rows, Tk) float64, vis or None); fully masked rows are 0."""
    import torch
    q64, k64 = q.detach().double(), k.detach().double()
    B, H, Tq, d = q64.shape
    Tk = k64.shape[-2]
    scale = d ** -0.5 if scale is None else scale
    for r0, r1 in _chunks(Tq, B * H * Tk * 8, q.device):
        scores = grouped_matmul(q64[:, :, r0:r1], k64.transpose(-2, -1)) * scale   # (B, H, rows, Tk)
        if score_mod is not None:
            scores = score_mod(scores)
        vis = visibility(Tq, Tk, r0, r1, causal=causal, alignment=alignment, visible=visible,
                         device=q.device)
        if vis is not None:
            scores = scores.masked_fill(~vis, float("-inf"))
        if sinks is not None:                                                  # (H,): one more column, dropped
            column = sinks.detach().double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
            probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        probs = torch.nan_to_num(probs, nan=0.0)                               # (B, H, rows, Tk)
        yield r0, r1, probs, vis


def golden_attention(q: Any, k: Any, v: Any, *, grad_out: Any = None, causal: bool = False,
                     visible: Any = None, scale: float | None = None,
                     alignment: str = "top-left", score_mod: Any = None, sinks: Any = None,
                     grad_lse: Any = None, moved_values: Any = None) -> Golden:
    """Attention, its logsumexp and (when grad_out is given) its gradients in float64 on the
    rounded inputs. sinks: (H,) logits, one more softmax column per query head with no value (a
    row that sees no key then gives the sink all its weight: out 0); with gradients their dsinks.
    grad_lse (B, H, Tq): also dq and dk of <lse, grad_lse>, the gradient through the lse alone
    (Golden.lse_grads; the lse does not depend on v). moved_values (B, Hkv, Tk, dv): also the
    output with them in place of v (Golden.moved_out; the referee's shifted values): the same
    probabilities times the features they change, added to the output, not a second golden."""
    import torch

    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    moved_cols = delta = moved_part = None
    if moved_values is not None:
        delta = moved_values.detach().double() - v64                             # (B, Hkv, Tk, dv)
        moved_cols = delta.ne(0).reshape(-1, delta.shape[-1]).any(0).nonzero().flatten()   # features it moves
        delta = delta[..., moved_cols]                                            # (B, Hkv, Tk, c)
        moved_part = q64.new_zeros(q64.shape[0], q64.shape[1], q64.shape[2], len(moved_cols))
    B, H, Tq, d = q64.shape
    Tk = k64.shape[-2]
    scale = d ** -0.5 if scale is None else scale
    out = q64.new_empty(B, H, Tq, v64.shape[-1])                               # (B, H, Tq, dv)
    lse = torch.empty(B, H, Tq, dtype=torch.float64, device=q.device)          # (B, H, Tq)
    dq, dk, dv = ((torch.zeros_like(t) if grad_out is not None else None) for t in (q64, k64, v64))
    with_lse_grads = grad_out is not None and grad_lse is not None
    lse_grads = {g: torch.zeros_like(t) for g, t in (("dq", q64), ("dk", k64))} if with_lse_grads else None
    lse_sink_grads = {g: torch.zeros_like(t) for g, t in (("dq", q64), ("dk", k64))} \
        if with_lse_grads and sinks is not None else None
    row_visible = torch.zeros(B, H, Tq, dtype=torch.bool, device=q.device)
    sat = SaturationAccumulator()
    max_qk = torch.zeros((), dtype=torch.float64, device=q.device)            # stays on the device
    needs_grad = grad_out is not None
    kl = k64.detach().requires_grad_(needs_grad)                               # (B, Hkv, Tk, d)
    vl = v64.detach().requires_grad_(needs_grad)
    sl = None if sinks is None else sinks.detach().double().requires_grad_(needs_grad)   # (H,)
    dsinks = None if sl is None or not needs_grad else torch.zeros_like(sl)
    for r0, r1 in _chunks(Tq, B * H * Tk * 8, q.device):
        vis = visibility(Tq, Tk, r0, r1, causal=causal, alignment=alignment, visible=visible,
                         device=q.device)
        with torch.enable_grad():
            qc = q64[:, :, r0:r1].detach().requires_grad_(needs_grad)          # (B, H, rows, d)
            raw = grouped_matmul(qc, kl.transpose(-2, -1))                     # (B, H, rows, Tk)
            scores = raw * scale
            if score_mod is not None:
                scores = score_mod(scores)
            if vis is not None:
                scores = scores.masked_fill(~vis, float("-inf"))
            if sl is None:
                probs = torch.softmax(scores, dim=-1)
            else:                                                              # the sink: one more column
                column = sl.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)   # (B, H, rows, 1)
                probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
            any_vis = torch.ones_like(probs[..., 0], dtype=torch.bool) if vis is None \
                else vis.any(-1).expand(probs.shape[:-1])                      # (B, H, rows)
            probs = torch.where(any_vis[..., None], probs, torch.zeros_like(probs))
            oc = grouped_matmul(probs, vl)                                     # (B, H, rows, d)
            lse_c = torch.where(any_vis, torch.logsumexp(scores.masked_fill(~any_vis[..., None], 0.0), dim=-1),
                                torch.full_like(probs[..., 0], float("-inf")))  # (B, H, rows)
            if needs_grad:
                leaves = (qc, kl, vl) + (() if sl is None else (sl,))
                grads = torch.autograd.grad(oc, leaves, grad_out[:, :, r0:r1].double(), retain_graph=with_lse_grads)
                dq[:, :, r0:r1] = grads[0]
                dk += grads[1]
                dv += grads[2]
                if dsinks is not None:
                    dsinks += grads[3]
            if with_lse_grads:
                upstream = grad_lse[:, :, r0:r1].double().masked_fill(~any_vis, 0.0)        # (B, H, rows)
                grads = torch.autograd.grad(lse_c, (qc, kl), upstream, retain_graph=lse_sink_grads is not None)
                lse_grads["dq"][:, :, r0:r1] = grads[0]
                lse_grads["dk"] += grads[1]
                if lse_sink_grads is not None:
                    with_sink = torch.logaddexp(lse_c, sl.detach().view(1, -1, 1))            # (B, H, rows)
                    grads = torch.autograd.grad(with_sink, (qc, kl), upstream)
                    lse_sink_grads["dq"][:, :, r0:r1] = grads[0]
                    lse_sink_grads["dk"] += grads[1]
        out[:, :, r0:r1] = oc.detach()
        lse[:, :, r0:r1] = lse_c.detach()
        row_visible[:, :, r0:r1] = any_vis
        p = probs.detach()
        if moved_part is not None:
            moved_part[:, :, r0:r1] = grouped_matmul(p, delta)                    # (B, H, rows, c)
        sat.add(p, None if vis is None else vis.expand_as(p))
        seen = raw.detach() if vis is None else raw.detach().masked_fill(~vis, 0.0)
        if seen.numel():
            max_qk = torch.maximum(max_qk, seen.abs().amax())
        del raw, scores, probs, p, seen, lse_c
    saturation = sat.result()
    saturation["max_qk"] = float(max_qk)
    saturation["max_logit"] = float(max_qk) * scale
    lse_sink = None if sl is None else torch.logaddexp(lse, sl.detach().view(1, -1, 1))     # (B, H, Tq)
    moved_out = None
    if moved_part is not None:
        moved_out = out.clone()                                                  # (B, H, Tq, dv)
        moved_out[..., moved_cols] += moved_part
    return Golden(out=out, dq=dq, dk=dk, dv=dv, row_visible=row_visible, saturation=saturation,
                  alignment=alignment, lse=lse, dsinks=dsinks, lse_grads=lse_grads, lse_sink=lse_sink,
                  lse_sink_grads=lse_sink_grads, moved_out=moved_out)


def row_visibility(tq: int, tk: int, *, causal: bool, device: Any, visible: Any = None,
                   alignment: str = "top-left") -> Any:
    """(B|1, 1, Tq) bool: which query rows see at least one key. Cheap (no float64 work),
    so it covers the whole output even when the golden covers a subset of slices."""
    import torch
    if visible is None:
        # Causal alone hides no whole row while each query sees at least key 0 (top-left
        # always; bottom-right unless Tq > Tk): no (Tq, Tk) matrix needed for that.
        if not causal or causal_offset(tq, tk, alignment) >= 0:
            return torch.ones(1, 1, tq, dtype=torch.bool, device=device)
    vis = visibility(tq, tk, 0, tq, causal=causal, device=device, alignment=alignment,
                     visible=visible)
    if vis is None:
        return torch.ones(1, 1, tq, dtype=torch.bool, device=device)
    while vis.dim() < 4:
        vis = vis[None]
    return vis.any(-1).expand(vis.shape[0], 1, tq)                            # (B|1, 1, Tq)


def golden_flops(tq: int, tk: int, d: int, causal: bool, d_v: int | None = None) -> float:
    """Float64 FLOPs of one (batch, head) slice's golden, forward and backward."""
    return float(attention_flops(1, 1, tq, tk, d, causal, d_v=d_v)) * (1 + BACKWARD_FLOP_FACTOR)


def golden_slices(batch: int, heads: int, tq: int, tk: int, d: int, causal: bool,
                  device: str, kv_heads: int | None = None, d_v: int | None = None) -> list[tuple[int, int]] | None:
    """The (batch, query head) slices the golden covers: None for all of them, else k groups
    evenly spaced over b·Hkv + g (the first always included), k = budget // one group's FLOPs,
    >= 1, each group with all its H / Hkv query heads (so the kv heads' gradients are whole).
    With kv_heads == heads a group is one slice.

    Deterministic in the shapes and device type alone, so a cell gets the same subset in
    every run and runs stay comparable.
    """
    budget = GOLDEN_FLOP_BUDGET["cuda" if str(device).startswith("cuda") else "cpu"]
    kv = heads if kv_heads is None else kv_heads
    group = heads // kv
    n = batch * kv
    k = max(1, int(budget // max(1.0, group * golden_flops(tq, tk, d, causal, d_v))))
    if k >= n:
        return None
    picked = ((i * n // k) for i in range(k))
    return [(g // kv, (g % kv) * group + j) for g in picked for j in range(group)]


def take_slices(t: Any, slices: list[tuple[int, int]] | None, heads: int | None = None) -> Any:
    """(B|1, H|1, ...) -> (1, k, ...): the given (batch, head) slices (broadcast dims read 0).
    heads: the query heads, when t is k- or v-shaped with Hkv < heads: slice (b, h) reads kv
    head h·Hkv // heads, once per group -> (1, k / group, ...). None (every slice) returns `t`."""
    import torch
    if slices is None or t is None:
        return t
    B, H = t.shape[0], t.shape[1]
    if heads is not None and H != heads:
        picks = list(dict.fromkeys((b if B > 1 else 0, h * H // heads) for b, h in slices))
    else:
        picks = [(b if B > 1 else 0, h if H > 1 else 0) for b, h in slices]
    return torch.stack([t[b, h] for b, h in picks])[None]
