"""Why a variant's output is wrong: the known mistake (workload.mistakes) its output matches.

Computed only for the cells the caller asks about (those with a numerics finding), in float64
on the cell's own inputs, on a bounded subset of the golden's (batch, head) slices
(diagnosis_slices). A mistake matches when

- the variant's output is within the dtype's budget of the mistake's output
  (err <= factor(dtype) · rmse(baseline) + atol(dtype), numerics.budget_bound's rule;
  without a finite baseline, FALLBACK_ROUNDING × the golden's own rounding to the dtype
  stands in for the baseline's RMSE),
  — or of the mistake's own budget, when larger: factor(dtype) × the error the mistaken code
  itself has in the cell's dtype (the mistake run in that dtype against float64) + atol
  (a mistake of precision "cell" is evaluated in the cell's dtype only, at the cell's budget),
- the variant's output is not correct attention's: further from the golden than the cell's
  budget, so a correct output never matches; and the mistake is one: its output further from
  the golden than its own budget, and
- the variant's output is nearer to it than to the golden, with at least one compared row
  finite in both (a NaN pattern alone is no evidence).

Every edge of that rule sits where the defect's own does. A mistake the output makes has its
error at the variant's rounding, a fraction of its budget, and its distance from the golden is
the output's; an output at the edge of naming it is at the edge of the cell's error budget, so
the diagnosis flips only where the finding it explains flips too. (Requiring the mistake to be
further from the golden than both budgets together, as this rule did, put an edge where the
defect is clear: a kernel clamping its probabilities on a causal scaled_x64 fp32 cell, twice
the budget from the golden and at rounding from the mistake, was named under
ATEN_CPU_CAPABILITY=default and not natively, the mistake 0.97 and 1.01 times the two budgets
from the golden.)

Every match is named (named_matches): a mistake is named alone only where no other explains the
output, and where two do (two budgets overlap, or the two are the same on this cell's inputs) the
diagnosis says both, "a or b" (core.diagnosis_names), in the order registered, never the one
whose error came out smaller in the last bits. A mistake the cell cannot tell from a match (its
output within their tolerances of the match's) is named with it though its own error was just
over its budget; and of two mistakes the cell cannot tell apart, the more specific (a special
case of the other, or not fitted) is named alone.

A cell no mistake matches is diagnosed again on its leak probes when the caller can run the
variant (diagnose_cell's `call`): the keys some rows must not see changed, by enough that their
scores pass the dtype's range (probe_gain), the comparison on those rows only. There correct
attention is the cell's own, so golden and tolerance are the cell's; a mistake bound to the
dtype's range (precision "cell": masking after a renormalised softmax, exact in float64 and at
roundoff in fp32 on N(0, 1) inputs) shows there in every dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from ...core.diagnosis_names import NONE, joined, members
from ...workload.backward_mistakes import BACKWARD_MISTAKES, backward_of, full_groups
from ...workload.draws import read_as_contiguous, torch_dtype
from ...workload.inputs import Inputs
from ...workload.mistake_base import Attempt, Mistake, sq_diff
from ...workload.mistakes import MISTAKES
from .mistake_memo import MistakeMemo, run as memo_run
from ..golden.numerics import GRAD_BUDGET_FACTOR, attention_flops, budget_bound, error_vs_reference

# Float64 FLOPs one mistake may spend (one forward over the diagnosis slices); like
# reference.GOLDEN_FLOP_BUDGET, per device type. gqa_permuted spends about twice that (a fit
# on 1/kv_heads of the rows against every kv head, then one forward).
DIAGNOSIS_FLOP_BUDGET = {"cpu": 1e8, "cuda": 1e10}
# Without a finite baseline (eager overflowed: fp16_range in fp16) its RMSE is taken as this many
# times the RMSE of the golden rounded to the dtype: eager's ratio to that on the T=256 cells of
# the cpu preset is 3.9 (bf16) and 3.7 (fp16) at the median, from 2.0 (in fp32 atol dominates).
FALLBACK_ROUNDING = 4.0
# A leak probe changes the keys some rows must not see by 3 + N(0, 1) an element: their scores
# move by about 10, inside every dtype's range, where a mistake bound to that range is at
# roundoff (broken.mask_after_softmax, fp32, d 32, T 128: RMSE 6e-8 against the golden on the
# probe's rows, the mistake in fp32 as far from it, both under the tolerance of 1.1e-6).
# diagnose_probes scales the change until the median probe row's largest hidden score has
# risen this many times the dtype's range (probe_gain): x 108-152 in fp32, x 19-23 in fp16.
PROBE_REACH = 4.0


@dataclass
class Diagnosis:
    """What the matcher found: the mistake named ("none" when none matched) and its evidence."""

    name: str
    err: float | None                      # RMSE of the output against the named mistake's
    golden_err: float                      # RMSE against the golden (rows that see a key)
    tolerance: float
    # every evaluated mistake: (err against it, its distance from the golden, its tolerance, matched)
    scores: dict[str, tuple[float, float, float, bool]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)   # mistakes whose function raised


@dataclass
class Candidate:
    """A mistake compared with a variant's result: whether it matched, how well (score: smaller is
    better), and its own result (evidence: what `close` compares between two candidates)."""

    name: str
    order: int                             # registration order
    specificity: int
    score: float
    matched: bool
    evidence: Any = None


def named_matches(candidates: list[Candidate], close: Callable[[Candidate, Candidate], bool]) -> list[Candidate]:
    """The candidates a diagnosis names, in registration order: every match; every candidate the
    cell cannot tell from a match (close: their results within tolerance of each other); less those
    the cell cannot tell from a more specific one so named (a fitted pairing that came out as the
    interleaved one, causal ignored where bottom-right alignment sees every key). [] when none
    matched. The name is core.diagnosis_names.joined of theirs."""
    matched = [c for c in candidates if c.matched]
    if not matched:
        return []
    tied = matched + [c for c in candidates if not c.matched and any(close(c, m) for m in matched)]
    kept = [c for c in tied if not any(o.specificity > c.specificity and close(c, o) for o in tied)]
    return sorted(kept, key=lambda c: c.order)


def _rmse(x: Any, y: Any, rows: Any) -> float:
    """RMSE over the elements of the selected rows (b, h, Tq), NaN matching NaN (sq_diff)."""
    sel = sq_diff(x, y)[rows]                                                # (n, d)
    return math.sqrt(float(sel.mean())) if sel.numel() else math.nan


def tolerance(baseline_rmse: float | None, dtype: str, golden_out: Any = None, rows: Any = None,
              factor: float | None = None) -> float:
    """The budget a match must meet: numerics.budget_bound (factor · baseline + atol(dtype), the factor
    the dtype's unless given), as within_budget; with no finite baseline, FALLBACK_ROUNDING × the RMSE of
    the golden rounded to the dtype stands in for the baseline's (none either: atol alone)."""
    if baseline_rmse is not None and math.isfinite(baseline_rmse):
        return budget_bound(baseline_rmse, dtype, factor)
    if golden_out is None:
        return budget_bound(0.0, dtype, factor)
    rounded = golden_out.to(torch_dtype(dtype)).double()
    rounding = error_vs_reference(rounded, golden_out, rows)["rmse"]
    return budget_bound(FALLBACK_ROUNDING * rounding, dtype, factor)


def diagnose(observed: Any, attempt: Attempt, golden_out: Any, tol: float,
             mistakes: Mapping[str, Mistake] | None = None, own_error: bool = True,
             within: Any = None, memo: MistakeMemo | None = None, tag: tuple = ()) -> Diagnosis:
    """Match `observed` (b, h, Tq, d) against every mistake on `attempt` (golden_out: the correct
    (b, h, Tq, d) float64 output, 0 on rows that see no key); see the module docstring.
    within: (b|1, 1, Tq) bool, the only rows compared (a leak probe's, where the golden is the
    cell's own), or None: every row.

    tol is the cell's budget (tolerance()). own_error: a mistake's budget is also at least
    the dtype's budget factor × the error of the mistaken code itself in the cell's dtype (the mistake run
    on the attempt in that dtype, against float64) + atol: unscaled scores, say, carry sqrt(d)
    times the rounding of scaled ones, so the correct code's baseline would be too tight. It is
    computed only where it can decide (tol < err < distance: a match needs err <= its budget <
    distance). Whatever the budget, a correct output (within tol of the golden) never matches.
    A mistake of precision "cell" is evaluated in the cell's dtype only (its tolerance is tol).
    memo: the input set's mistake_memo.MistakeMemo (each mistake's output computed once for every
    variant diagnosed there), with `tag` naming this attempt in it (the cell's slices, a probe).
    """
    import torch
    observed, golden_out = observed.double(), golden_out.double()
    shape = observed.shape[:-1]                                              # (b, h, Tq)
    within = (torch.ones(shape, dtype=torch.bool, device=observed.device) if within is None
              else within.expand(shape))                                     # (b, h, Tq)
    seen = attempt.seen().expand(shape) & within
    result = Diagnosis(NONE, None, error_vs_reference(observed, golden_out, seen)["rmse"], tol)
    if attempt.observed is None:
        attempt.observed = observed
    twin = attempt.in_dtype()                                                # q, k, v in the cell dtype
    finite_obs = torch.isfinite(observed).all(-1)                            # (b, h, Tq)
    candidates = []
    for order, m in enumerate((MISTAKES if mistakes is None else mistakes).values()):
        try:
            in_dtype = m.precision == "cell"
            out = memo_run(memo, tag + (m.name, in_dtype), m.fn, twin if in_dtype else attempt)
        except Exception as exc:  # noqa: BLE001 - a broken (plug-in) mistake must not lose the cell
            result.failed[m.name] = f"{type(exc).__name__}: {exc}"
            continue
        if out is None:
            continue
        out = out.double()
        if m.rows == "seen":
            rows = seen & ~torch.isnan(out).any(-1)                          # rows it leaves a key
        else:
            rows = within
        if not bool((rows & finite_obs & torch.isfinite(out).all(-1)).any()):
            continue                                                         # no finite evidence
        err, dist = _rmse(observed, out, rows), _rmse(out, golden_out, rows)
        tol_m = tol
        if own_error and m.precision != "cell" and tol < err < dist:      # only where it can decide
            try:
                own = _rmse(memo_run(memo, tag + (m.name, True), m.fn, twin).double(), out, rows)
            except Exception as exc:  # noqa: BLE001
                result.failed[m.name] = f"{type(exc).__name__}: {exc}"
                continue
            if math.isfinite(own):
                tol_m = max(tol, budget_bound(own, attempt.dtype))
        wrong = _rmse(observed, golden_out, rows)                            # the output against correct
        distinct = dist > tol_m                                              # a mistake, not a rounding
        ok = err <= tol_m and distinct and wrong > tol and err < wrong
        result.scores[m.name] = (err, dist, tol_m, ok)
        if distinct:
            candidates.append(Candidate(m.name, order, m.specificity, err, ok, (out, rows, tol_m)))

    def close(a: Candidate, b: Candidate) -> bool:                           # indistinguishable here
        (out_a, rows_a, tol_a), (out_b, rows_b, tol_b) = a.evidence, b.evidence
        return _rmse(out_a, out_b, rows_a & rows_b) <= max(tol_a, tol_b)
    named = named_matches(candidates, close)
    if named:
        result.name, result.err = joined(c.name for c in named), min(c.score for c in named)
    return result


def diagnosis_slices(batch: int, heads: int, kv_heads: int, tq: int, tk: int, d: int, device: str,
                     allowed: list[tuple[int, int]] | None = None) -> tuple[list[int], list[int]]:
    """(batches, heads) whose product the diagnosis covers: within the golden's slices `allowed`
    (None: all), at most DIAGNOSIS_FLOP_BUDGET // one slice's forward FLOPs slices, at least one.

    The first batch's heads, whole when they fit (so every kv head is there for the GQA
    mistakes); capped, they keep a head whose interleaved pairing (h % kv_heads) differs from
    the grouped one (h // group). Then further batches with the same heads, while they fit.
    Deterministic in the shapes and device type.
    """
    budget = DIAGNOSIS_FLOP_BUDGET["cuda" if str(device).startswith("cuda") else "cpu"]
    n_max = max(1, int(budget // max(1, attention_flops(1, 1, tq, tk, d, causal=False))))
    by_batch: dict[int, list[int]] = {}
    for b, h in (allowed if allowed is not None else [(b, h) for b in range(batch) for h in range(heads)]):
        by_batch.setdefault(b, []).append(h)
    first = min(by_batch)
    chosen = sorted(by_batch[first])
    if len(chosen) > n_max:
        group = heads // kv_heads
        telling = [h for h in chosen if h // group != h % kv_heads]
        picked = telling[:1]
        picked += [h for h in chosen if h not in picked][:n_max - len(picked)]
        chosen = sorted(picked)
    batches = [first]
    for b in sorted(by_batch):
        if b != first and (len(batches) + 1) * len(chosen) <= n_max and set(chosen) <= set(by_batch[b]):
            batches.append(b)
    return batches, chosen


def _golden_for(ref: Any, batches: list[int], heads: list[int]) -> Any:
    """The reference's float64 golden output on batches × heads: (b, h, Tq, d)."""
    import torch
    out = ref.golden.out
    if ref.slices is None:
        return out[batches][:, heads]
    pos = {tuple(s): i for i, s in enumerate(ref.slices)}
    return torch.stack([torch.stack([out[0, pos[(b, h)]] for h in heads]) for b in batches])


def attempt_for(inputs: Inputs, batches: list[int], heads: list[int], *, alignment: str = "top-left",
                dtype: str = "fp32", observed: Any = None) -> Attempt:
    """The float64 Attempt of `inputs` on batches × heads (k and v: every kv head of those batches)."""
    import torch
    b_index = torch.tensor(batches, device=inputs.q.device)
    h_index = torch.tensor(heads, device=inputs.q.device)
    q = inputs.q.detach().index_select(0, b_index).index_select(1, h_index).double()   # (b, h, Tq, d)
    k, v = (t.detach().index_select(0, b_index).double() for t in (inputs.k, inputs.v))  # (b, Hkv, Tk, d)
    vis = inputs.visible
    if vis is not None and vis.shape[0] > 1:
        vis = vis.index_select(0, b_index)                                   # (b, 1, Tq|1, Tk)
    bias = inputs.mask.detach().double() if inputs.mask_form == "bias" else None
    if bias is not None and bias.shape[0] > 1:
        bias = bias.index_select(0, b_index)                                 # (b, 1, Tq|1, Tk)
    if observed is not None:
        observed = observed.detach().index_select(0, b_index).index_select(1, h_index).double()
    read_contiguous = None
    if not all(t.is_contiguous() for t in (inputs.q, inputs.k, inputs.v)):   # views: what a raw read sees
        rq, rk, rv = (read_as_contiguous(t.detach()) for t in (inputs.q, inputs.k, inputs.v))
        read_contiguous = (rq.index_select(0, b_index).index_select(1, h_index).double(),     # (b, h, Tq, d)
                           *(t.index_select(0, b_index).double() for t in (rk, rv)))          # (b, Hkv, Tk, d)
    flat_kv = None
    if inputs.cu_seqlens is not None:          # a packed cell: every token, as a kernel on (total, H, d) sees them
        flat_kv = tuple(t.detach().transpose(1, 2).reshape(-1, *t.shape[1:2], t.shape[-1]).double()
                        for t in (inputs.k, inputs.v))                       # (B·Tk, Hkv, d)
    return Attempt(q=q, k=k, v=v, heads=tuple(heads), n_heads=inputs.q.shape[1], causal=inputs.causal,
                   alignment=alignment, visible=vis, bias=bias, score_mod=inputs.score_mod, observed=observed,
                   dtype=dtype, sinks=None if inputs.sinks is None else inputs.sinks.detach().double(),
                   batches=tuple(batches), n_batch=inputs.q.shape[0], cu_seqlens=inputs.cu_seqlens, flat_kv=flat_kv,
                   window=inputs.window, read_contiguous=read_contiguous)


def diagnose_cell(out: Any, inputs: Inputs, ref: Any, dtype: str, baseline_rmse: float | None,
                  call: Callable[[Any, Any], Any] | None = None) -> dict[str, Any]:
    """The diagnosis columns of one cell: `diagnosis` (a mistake's name, "none" when none
    matched), `diagnosis_err`, `diagnosis_golden_err` and `diagnosis_slices` ([[b, h], ...]).

    out: the variant's full (B, H, Tq, d) output in the cell dtype; ref: the cell's
    cellcache.Reference (golden of ref.alignment on ref.slices); baseline_rmse: ref.baseline_rmse.
    call: (k', v') (B, Hkv, Tk, d) in the cell dtype -> the variant's detached (B, H, Tq, d) output
    on (q, k', v') with the cell's keyword arguments, or None. With it, a cell no mistake matches
    is diagnosed again on its leak probes (diagnose_probes): the mistakes bound to the dtype's
    range show on N(0, 1) inputs at roundoff only. The columns are then those of the probe that
    named a mistake (the errors on its rows), else the cell's.
    """
    import torch
    B, H, Tq, d = out.shape
    Hkv, Tk = inputs.k.shape[1], inputs.k.shape[-2]
    batches, heads = diagnosis_slices(B, H, Hkv, Tq, Tk, d, str(out.device), ref.slices)
    with torch.no_grad():
        attempt = attempt_for(inputs, batches, heads, alignment=ref.alignment, dtype=dtype, observed=out)
        golden = _golden_for(ref, batches, heads).double()                  # (b, h, Tq, d)
        seen = attempt.seen().expand(golden.shape[:-1])
        tol = tolerance(baseline_rmse, dtype, golden, seen)
        memo, tag = getattr(ref, "memo", None), ("out", dtype, tuple(batches), tuple(heads))
        found = diagnose(attempt.observed, attempt, golden, tol, memo=memo, tag=tag)
    if found.name == "none" and call is not None:
        found = diagnose_probes(call, inputs, ref, attempt, golden, tol, batches, memo=memo, tag=tag) or found
    return {"diagnosis": found.name, "diagnosis_err": found.err,
            "diagnosis_golden_err": found.golden_err,
            "diagnosis_slices": [[b, h] for b in batches for h in heads]}


def weight_range(dtype: str) -> float:
    """-ln of the dtype's smallest positive number (subnormal): a softmax weight e^-x with x past
    it is 0 in that dtype (fp32 103.3, bf16 92.2, fp16 16.6), the range a mistake of precision
    "cell" lives at the edge of."""
    import torch
    info = torch.finfo(torch_dtype(dtype))
    return -math.log(info.tiny * info.eps)


def probe_gain(attempt: Attempt, k2: Any, rows: Any) -> float:
    """The factor a leak probe's change to the hidden keys is scaled by, so that a mistake bound
    to the dtype's range shows on the probe's rows: the median row's largest score change on a
    changed key (those that rise) becomes PROBE_REACH × weight_range(dtype); at least 1.

    k2: the probe's keys on the attempt's batches (b, Hkv, Tk, d) float64; rows: (b|1, 1, Tq) bool.
    """
    delta = attempt.pair(k2 - attempt.k)                                     # (b, h, Tk, d)
    changed = delta.ne(0).any(-1)[:, :, None]                                # (b, h, 1, Tk)
    moved = (attempt.q @ delta.transpose(-2, -1)) * attempt.scale            # (b, h, Tq, Tk)
    top = moved.masked_fill(~changed, -math.inf).amax(-1)                   # (b, h, Tq)
    rising = top[rows.expand(top.shape) & (top > 0)]                         # (n,)
    if not rising.numel():
        return 1.0
    return max(1.0, PROBE_REACH * weight_range(attempt.dtype) / float(rising.median()))


def diagnose_probes(call: Callable[[Any, Any], Any], inputs: Inputs, ref: Any, attempt: Attempt,
                    golden: Any, tol: float, batches: list[int], memo: MistakeMemo | None = None,
                    tag: tuple = ()) -> Diagnosis | None:
    """The first leak probe (ref.leak_probes: k', v' changed on keys its rows must not see) on
    which a mistake matches the variant's output, compared on the probe's rows only; None when
    none does.

    On those rows correct attention is the cell's own (the changed keys are hidden from them), so
    the golden and the tolerance are the cell's and a correct variant's output is the one the
    cell already judged; a mistake that lets the hidden keys in shows there. The probe's change
    is scaled first (probe_gain): its keys' scores must pass the dtype's range for the mistakes
    of precision "cell" to show (softmax over every key then masked: the visible weights flush
    to zero and renormalising gives 0/0).
    attempt, golden (b, h, Tq, d), tol: the cell's, on the diagnosis slices of `batches`. A probe
    the variant raises on is skipped: the cell keeps its own diagnosis, an explanation, not a
    measurement.
    """
    import torch
    b_index = torch.tensor(batches, device=inputs.k.device)
    for probe_index, (k2, v2, rows) in enumerate(ref.leak_probes):
        with torch.no_grad():
            rows = rows if rows.shape[0] == 1 else rows.index_select(0, b_index)          # (b|1, 1, Tq)
            k = inputs.k.detach()
            delta = k2.detach().double() - k.double()                                    # (B, Hkv, Tk, d)
            # keys past sqrt(max) could overflow the scores (d products summed): a finite probe
            most = math.sqrt(torch.finfo(k.dtype).max) / max(float(delta.abs().max()), 1e-30)
            gain = min(probe_gain(attempt, k2.detach().index_select(0, b_index).double(), rows),
                       max(1.0, most))
            k3 = (k.double() + gain * delta).to(k.dtype)                                 # (B, Hkv, Tk, d)
        try:                        # not under no_grad: the timed calls' grad mode (compiled code reused)
            out = call(k3, v2)      # (B, H, Tq, d)
        except Exception:  # noqa: BLE001 - a variant refusing the probe's keys keeps the cell's diagnosis
            continue
        with torch.no_grad():
            h_index = torch.tensor(attempt.heads, device=out.device)
            probe = replace(attempt, k=k3.index_select(0, b_index).double(),
                            v=v2.detach().index_select(0, b_index).double(),
                            observed=out.detach().index_select(0, b_index).index_select(1, h_index).double())
            found = diagnose(probe.observed, probe, golden, tol, within=rows, memo=memo,
                             tag=tag + ("probe", probe_index))
        if found.name != "none":
            return found
    return None


# --------------------------------------------------------------------------- the gradients

@dataclass
class GradDiagnosis:
    """What the backward matcher found: the mistake named ("none" when none matched), the largest
    RMSE of a compared gradient against it and against the golden, and every mistake's scores
    (gradient -> (err against it, its distance from the golden, tolerance)) and whether it matched."""

    name: str
    err: float | None
    golden_err: float
    compared: list[str]
    scores: dict[str, tuple[dict[str, tuple[float, float, float]], bool]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def _grad_rmse(x: Any, y: Any) -> float:
    return math.sqrt(float(((x.double() - y.double()) ** 2).mean())) if x.numel() else 0.0


def diagnose_grads(attempt: Attempt, golden: dict[str, Any], observed: dict[str, Any], tol: dict[str, float],
                   mistakes: Mapping[str, Mistake] | None = None, memo: MistakeMemo | None = None,
                   tag: tuple = ()) -> GradDiagnosis:
    """Match the variant's gradients `observed` against every backward mistake on `attempt`
    (golden: its right float64 gradients, backward_mistakes.backward_of). dq is compared
    everywhere, dk and dv on the key/value heads whose whole group the attempt holds. A mistake
    matches when every compared gradient is within its tolerance of the mistake's (tol: the
    gradient budget), on some gradient the variant's is outside its budget (no correct gradient
    matches) and the mistake's further from the golden's than its tolerance (the forward's rule:
    each edge where the defect's own is), and the gradients are nearer to it than to the golden's
    (in tolerances). A
    mistake's tolerance on a gradient is the budget's times how much larger its gradient is than
    the right one (its own rounding grows with it). Every match is named, with the mistakes whose
    gradients are within tolerance of a match's (named_matches: the forward's rule)."""
    kv = full_groups(attempt)
    names = ["dq"] + (["dk", "dv"] if kv else [])

    def pick(grads: dict[str, Any], g: str) -> Any:
        return grads[g] if g == "dq" else grads[g][:, kv]

    gold = {g: pick(golden, g) for g in names}
    obs = {g: pick(observed, g) for g in names}
    size = {g: _grad_rmse(gold[g], gold[g] * 0.0) for g in names}
    golden_err = {g: _grad_rmse(obs[g], gold[g]) for g in names}
    result = GradDiagnosis(NONE, None, max(golden_err.values()), names)
    candidates = []
    for order, m in enumerate((BACKWARD_MISTAKES if mistakes is None else mistakes).values()):
        try:
            grads = memo_run(memo, tag + (m.name,), m.fn, attempt)
        except Exception as exc:  # noqa: BLE001 - a broken (plug-in) mistake must not lose the cell
            result.failed[m.name] = f"{type(exc).__name__}: {exc}"
            continue
        if grads is None:
            continue
        mine = {g: pick(grads, g) for g in names}
        # the mistaken kernel's own rounding grows with its gradients: a gradient sqrt(d) times too
        # large carries sqrt(d) times the error (the forward's own_error, in one line)
        own = {g: tol[g] * max(1.0, _grad_rmse(mine[g], mine[g] * 0.0) / size[g]) if size[g] else tol[g]
               for g in names}
        per = {g: (_grad_rmse(obs[g], mine[g]), _grad_rmse(mine[g], gold[g]), own[g]) for g in names}
        distinct = any(dist > t for _, dist, t in per.values())             # a mistake, not a rounding
        ok = (all(err <= t for err, _, t in per.values())
              and any(dist > t and golden_err[g] > tol[g] for g, (_, dist, t) in per.items())
              and sum(err / t for err, _, t in per.values()) < sum(golden_err[g] / tol[g] for g in names))
        result.scores[m.name] = (per, ok)
        if distinct:
            candidates.append(Candidate(m.name, order, m.specificity, max(err for err, _, _ in per.values()), ok,
                                        (mine, own)))
    named = named_matches(candidates, lambda a, b: all(                     # within their tolerances
        _grad_rmse(a.evidence[0][g], b.evidence[0][g]) <= max(a.evidence[1][g], b.evidence[1][g]) for g in names))
    if named:
        result.name, result.err = joined(c.name for c in named), min(c.score for c in named)
    return result


@dataclass
class GradEvidence:
    """A cell's gradients on its diagnosis slices, kept (float64, small) past its gradients phase
    for the record stage, where the forward's diagnosis is known: grad_forward_diagnosis."""

    batches: list[int]
    heads: list[int]
    observed: dict[str, Any]               # {"dq": (b, h, Tq, d), "dk", "dv": (b, Hkv, Tk, d)} float64
    grad_out: Any                          # (b, h, Tq, d) float64
    golden: dict[str, Any]                 # the right float64 gradients (backward_of)
    tol: dict[str, float]                  # each gradient's budget


def _grad_evidence(grads: tuple, inputs: Inputs, ref: Any, dtype: str) -> tuple[GradEvidence, Attempt, Any, tuple]:
    """(evidence, its attempt, the memo, the memo's tag) of a cell's gradients (dq, dk, dv)."""
    import torch
    dq, dk, dv = grads
    B, H, Tq, d = dq.shape
    Hkv, Tk = dk.shape[1], dk.shape[-2]
    batches, heads = diagnosis_slices(B, H, Hkv, Tq, Tk, d, str(dq.device), ref.slices)
    b_index = torch.tensor(batches, device=dq.device)
    h_index = torch.tensor(heads, device=dq.device)
    with torch.no_grad():
        attempt = attempt_for(inputs, batches, heads, alignment=ref.alignment, dtype=dtype)
        attempt.grad_out = inputs.grad_out.detach().index_select(0, b_index).index_select(1, h_index).double()
        observed = {"dq": dq.detach().index_select(0, b_index).index_select(1, h_index).double(),
                    "dk": dk.detach().index_select(0, b_index).double(),
                    "dv": dv.detach().index_select(0, b_index).double()}
        attempt.observed_grads = observed
        memo, tag = getattr(ref, "memo", None), ("grads", dtype, tuple(batches), tuple(heads))
        golden = memo_run(memo, tag + ("right",), backward_of, attempt)
        base = ref.baseline_grad_rmse or {}
        tol = {g: tolerance(base.get(g), dtype, golden[g], factor=GRAD_BUDGET_FACTOR[g]) for g in golden}
    return GradEvidence(batches, heads, observed, attempt.grad_out, golden, tol), attempt, memo, tag


def diagnose_grads_cell(grads: tuple, inputs: Inputs, ref: Any, dtype: str) -> tuple[dict[str, Any], GradEvidence]:
    """The backward diagnosis columns of one cell: `grad_diagnosis` (a backward mistake's name,
    "none" when none matched), `grad_diagnosis_err`, `grad_diagnosis_golden_err`; and the evidence,
    for the forward's mistake to be tried on the gradients once the forward is diagnosed
    (diagnose_grads_as_forward).

    grads: the variant's (dq (B, H, Tq, d), dk (B, Hkv, Tk, d), dv) in the cell dtype; ref: the
    cell's cellcache.Reference (its baseline's gradient RMSEs set the tolerances)."""
    import torch
    evidence, attempt, memo, tag = _grad_evidence(grads, inputs, ref, dtype)
    with torch.no_grad():
        found = diagnose_grads(attempt, evidence.golden, evidence.observed, evidence.tol, memo=memo, tag=tag)
    return ({"grad_diagnosis": found.name, "grad_diagnosis_err": found.err,
             "grad_diagnosis_golden_err": found.golden_err}, evidence)


def forward_mistake_grads(a: Attempt, name: str) -> dict[str, Any] | None:
    """The float64 gradients (dq (b, h, Tq, d), dk, dv (b, Hkv, Tk, d)) of the forward mistake `name`'s
    output under the attempt's upstream gradient: what a kernel making that mistake in its forward,
    and differentiating what it computed, gives. A row the mistake leaves no key gets 0 (not NaN),
    so its gradients stay finite; keys a packed cell's mistake reads from another batch row
    (Attempt.flat_kv) add to that row's. None where the mistake cannot differ here, or lives in the
    cell dtype's range (precision "cell": its float64 gradients say nothing)."""
    import torch
    mistake = MISTAKES.get(name)
    if mistake is None or mistake.precision != "float64":
        return None
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (a.q, a.k, a.v))
    flat = None if a.flat_kv is None else tuple(t.detach().clone().requires_grad_(True) for t in a.flat_kv)
    attempt = replace(a, q=q, k=k, v=v, flat_kv=flat, empty_rows_zero=True)
    with torch.enable_grad():
        out = mistake.fn(attempt)                                            # (b, h, Tq, d)
        if out is None:
            return None
        finite = torch.isfinite(out).all(-1, keepdim=True)                   # (b, h, Tq, 1)
        loss = (torch.where(finite, out, torch.zeros_like(out)) * a.grad_out).sum()
        leaves = (q, k, v) + (flat if flat is not None else ())
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)]
    dq, dk, dv = grads[:3]
    if flat is not None:                                    # (B·T, Hkv, d) -> the attempt's batches' (b, Hkv, T, d)
        rows = torch.tensor(a.batches, device=dk.device)
        dk, dv = (d + g.reshape(a.n_batch, -1, *g.shape[1:]).permute(0, 2, 1, 3).index_select(0, rows)
                  for d, g in ((dk, grads[3]), (dv, grads[4])))
    return {"dq": dq, "dk": dk, "dv": dv}


def diagnose_grads_as_forward(evidence: GradEvidence, inputs: Inputs, ref: Any, dtype: str, forward: str,
                              out: Any) -> dict[str, Any] | None:
    """The gradient diagnosis columns naming the forward's mistake `forward` (a diagnosis: one name,
    or several the cell could not tell apart, each tried), where the cell's gradients (evidence)
    match that mistake's own gradients (forward_mistake_grads) by diagnose_grads' rule and budgets;
    None where they do not. out: the variant's (B, H, Tq, d) output (a mistake fitted to it, e.g.
    the form of a document-range mistake, is fitted again)."""
    import torch
    entries = {name: replace(MISTAKES[name], fn=lambda a, name=name: forward_mistake_grads(a, name))
               for name in members(forward) if name in MISTAKES}
    if not entries:
        return None
    with torch.no_grad():
        attempt = attempt_for(inputs, evidence.batches, evidence.heads, alignment=ref.alignment, dtype=dtype,
                              observed=out)
        attempt.grad_out = evidence.grad_out
    found = diagnose_grads(attempt, evidence.golden, evidence.observed, evidence.tol, mistakes=entries)
    if found.name == NONE:
        return None
    return {"grad_diagnosis": found.name, "grad_diagnosis_err": found.err,
            "grad_diagnosis_golden_err": found.golden_err}
