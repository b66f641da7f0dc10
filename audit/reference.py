"""float64 golden attention and gradients, chunked over query rows so memory stays bounded.

Computed once per input set and shared by every variant of that set (the
runner caches it per Case.input_key). The golden works from the *logical*
visibility (causal alignment plus the scenario's mask), never from a float
mask's values, so a finfo.min mask is still a mask here. Rows with no visible
key get output 0 (SDPA's convention); error metrics leave them out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from .numerics import SaturationAccumulator

CHUNK_BYTES = 32 * 2**20  # float64 score block per chunk; backward holds a few of these


@dataclass
class Golden:
    out: Any                      # (B, H, Tq, d) float64
    dq: Any                       # (B, H, Tq, d) float64
    dk: Any                       # (B, H, Tk, d) float64
    dv: Any                       # (B, H, Tk, d) float64
    row_visible: Any              # (B|1, H|1, Tq) bool: row sees at least one key
    saturation: dict[str, Any]    # max_prob, entropy, min_entropy, onehot_frac, max_logit, max_qk
    alignment: str = "top-left"


def causal_offset(tq: int, tk: int, alignment: str) -> int:
    """Query i may see keys j <= i + offset: 0 top-left, Tk - Tq bottom-right."""
    if alignment == "top-left":
        return 0
    if alignment == "bottom-right":
        return tk - tq
    raise ValueError(f"unknown causal alignment {alignment!r}")


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


def _chunks(tq: int, per_row_bytes: int) -> Iterator[tuple[int, int]]:
    rows = max(1, CHUNK_BYTES // max(1, per_row_bytes))
    for r0 in range(0, tq, rows):
        yield r0, min(tq, r0 + rows)


def golden_prob_chunks(q: Any, k: Any, *, causal: bool, visible: Any = None, scale: float | None = None,
                       alignment: str = "top-left") -> Iterator[tuple[int, int, Any, Any]]:
    """Yield (r0, r1, probs (B, H, rows, Tk) float64, vis or None); fully masked rows are 0."""
    import torch
    q64, k64 = q.detach().double(), k.detach().double()
    B, H, Tq, d = q64.shape
    Tk = k64.shape[-2]
    scale = d ** -0.5 if scale is None else scale
    for r0, r1 in _chunks(Tq, B * H * Tk * 8):
        scores = (q64[:, :, r0:r1] @ k64.transpose(-2, -1)) * scale            # (B, H, rows, Tk)
        vis = visibility(Tq, Tk, r0, r1, causal=causal, alignment=alignment, visible=visible,
                         device=q.device)
        if vis is not None:
            scores = scores.masked_fill(~vis, float("-inf"))
        probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)       # (B, H, rows, Tk)
        yield r0, r1, probs, vis


def golden_attention(q: Any, k: Any, v: Any, *, grad_out: Any = None, causal: bool = False,
                     visible: Any = None, scale: float | None = None,
                     alignment: str = "top-left") -> Golden:
    """Attention and (when grad_out is given) its gradients in float64 on the rounded inputs."""
    import torch

    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    B, H, Tq, d = q64.shape
    Tk = k64.shape[-2]
    scale = d ** -0.5 if scale is None else scale
    out = torch.empty_like(q64)                                                # (B, H, Tq, d)
    dq, dk, dv = ((torch.zeros_like(t) if grad_out is not None else None) for t in (q64, k64, v64))
    row_visible = torch.zeros(B, H, Tq, dtype=torch.bool, device=q.device)
    sat = SaturationAccumulator()
    max_logit = max_qk = 0.0
    needs_grad = grad_out is not None
    kl = k64.detach().requires_grad_(needs_grad)                               # (B, H, Tk, d)
    vl = v64.detach().requires_grad_(needs_grad)
    for r0, r1 in _chunks(Tq, B * H * Tk * 8):
        vis = visibility(Tq, Tk, r0, r1, causal=causal, alignment=alignment, visible=visible,
                         device=q.device)
        with torch.enable_grad():
            qc = q64[:, :, r0:r1].detach().requires_grad_(needs_grad)          # (B, H, rows, d)
            raw = qc @ kl.transpose(-2, -1)                                    # (B, H, rows, Tk)
            scores = raw * scale
            if vis is not None:
                scores = scores.masked_fill(~vis, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            any_vis = torch.ones_like(probs[..., 0], dtype=torch.bool) if vis is None \
                else vis.any(-1).expand(probs.shape[:-1])                      # (B, H, rows)
            probs = torch.where(any_vis[..., None], probs, torch.zeros_like(probs))
            oc = probs @ vl                                                    # (B, H, rows, d)
            if needs_grad:
                gq, gk, gv = torch.autograd.grad(oc, (qc, kl, vl), grad_out[:, :, r0:r1].double())
                dq[:, :, r0:r1] = gq
                dk += gk
                dv += gv
        out[:, :, r0:r1] = oc.detach()
        row_visible[:, :, r0:r1] = any_vis
        p = probs.detach()
        sat.add(p, None if vis is None else vis.expand_as(p))
        seen = raw.detach() if vis is None else raw.detach().masked_fill(~vis, 0.0)
        max_qk = max(max_qk, float(seen.abs().max()) if seen.numel() else 0.0)
        del raw, scores, probs, p, seen
    saturation = sat.result()
    saturation["max_qk"] = max_qk
    saturation["max_logit"] = max_qk * scale
    return Golden(out=out, dq=dq, dk=dk, dv=dv, row_visible=row_visible, saturation=saturation,
                  alignment=alignment)
