"""The finding rules of the numbers a variant computes: NaN and inf, the error budgets of the
output, the gradients and the log-sum-exp, weight on masked keys, fully masked rows, softmax
saturation, fp16's range, the causal alignment and underflow. Each reads the tidy frame
(records.to_frame) and returns findings (analysis/finding_rows.py); findings.py runs them.
"""
from __future__ import annotations

import pandas as pd

from ..core.defects import BUDGETED_GRADIENTS, grad_outside_budget, leaks, nonfinite
from ..core.grid import INPUT_AXES
from ..workload.merge_functions import SHARD_COUNTS
from .finding_rows import _finding, _num, _ok, _per_variant, _real_code, _rows_where, _where
from .rule_registry import rule

FINFO_MIN_SCENARIO = "fully_masked_finfo_min"
FP16_RANGE_SCENARIO = "fp16_range"
SATURATION_EXCESS = 0.25     # a variant's one-hot row fraction above the golden's by more: `saturation`
INPUT_SATURATION = 0.5       # the golden's one-hot row fraction above which inputs saturate softmax
UNDERFLOW_FRAC = 0.01        # probabilities exactly 0 where float64 is positive, above which: `underflow`


@rule(10)
def check_nonfinite(frame: pd.DataFrame) -> list[dict]:
    """NaN/inf in outputs (rows that see a key) or gradients, where float64 is finite."""
    ok = _ok(frame)
    out_bad = _num(ok, "out_nonfinite_visible").fillna(0) > 0
    grad_bad = (_num(ok, "grad_nan").fillna(0) + _num(ok, "grad_inf").fillna(0)) > 0
    bad = _rows_where(ok, nonfinite)
    rows = ok[bad].assign(_out=out_bad[bad], _grad=grad_bad[bad])

    def make(variant: str, g: pd.DataFrame) -> dict:
        n_out, n_grad = int(g["_out"].sum()), int(g["_grad"].sum())
        what = []
        if n_out:
            what.append(f"NaN/inf outputs in {n_out} cell(s)")
        if n_grad:
            what.append(f"NaN/inf gradients in {n_grad} cell(s)")
        return _finding("nonfinite", "error", variant,
                        f"{variant} produces inf or NaN where the float64 golden is finite: "
                        f"{' and '.join(what)} ({_where(g)}).", g["id"])
    return _per_variant(rows, make)


@rule(20)
def check_error_budget(frame: pd.DataFrame) -> list[dict]:
    """Outside FlashAttention's budget: rmse > 2 × rmse(eager, same dtype) + atol."""
    ok = _ok(frame)
    rows = ok[ok["within_budget"].astype("object").eq(False)] if "within_budget" in ok else ok.iloc[0:0]

    def make(variant: str, g: pd.DataFrame) -> dict:
        ratio = _num(g, "err_ratio")
        worst = g.loc[ratio.idxmax()] if ratio.notna().any() else g.iloc[0]
        ratio_text = (f"worst {float(worst['err_ratio']):.3g}× the baseline's error"
                      if pd.notna(worst.get("err_ratio")) else "its error is not finite")
        return _finding("error_budget", "error", variant,
                        f"{variant} is outside its error budget (RMSE vs float64 above 2× that of "
                        f"hand-written attention in the same dtype, plus atol) in {len(g)} cell(s); "
                        f"{ratio_text} at {worst['id']} ({_where(g)}).", g["id"])
    return _per_variant(rows, make)


@rule(30)
def check_grad_error_budget(frame: pd.DataFrame) -> list[dict]:
    """Gradients outside their budget (measure.checks.gradients.grad_budget): each of dq, dk, dv's RMSE
    against float64 above 2 × that of hand-written attention's gradient in the same dtype, + atol."""
    ok = _ok(frame)
    rows = ok[_rows_where(ok, lambda r: bool(grad_outside_budget(r)))]

    def make(variant: str, g: pd.DataFrame) -> dict:
        parts = []
        for grad in BUDGETED_GRADIENTS:
            if f"{grad}_within_budget" not in g:
                continue
            outside = g[g[f"{grad}_within_budget"].astype("object").eq(False)]
            if outside.empty:
                continue
            ratio = _num(outside, f"{grad}_err_ratio")
            worst = outside.loc[ratio.idxmax()] if ratio.notna().any() else outside.iloc[0]
            err = pd.to_numeric(pd.Series([worst.get(f"{grad}_err")]), errors="coerce").iloc[0]
            parts.append(f"{grad} in {len(outside)} cell(s), worst {_num(outside, f'{grad}_err_ratio').max():.3g}× "
                         f"the baseline's error (relative error {err:.3g}) at {worst['id']}")
        return _finding("grad_error_budget", "error", variant,
                        f"{variant}'s gradients are outside their error budget (RMSE vs the float64 golden's "
                        f"above 2× that of hand-written attention's in the same dtype, plus atol): "
                        f"{'; '.join(parts)} ({_where(g)}). Training with it follows wrong gradients.", g["id"])
    return _per_variant(rows, make)


def _outside(g: pd.DataFrame, verdict: str, ratio: str, label: str) -> str | None:
    """"label in N cell(s), worst R× the baseline's error at ID" for the rows failing `verdict`."""
    if verdict not in g:
        return None
    outside = g[g[verdict].astype("object").eq(False)]
    if outside.empty:
        return None
    ratios = _num(outside, ratio)
    worst = outside.loc[ratios.idxmax()] if ratios.notna().any() else outside.iloc[0]
    how = f"worst {ratios.max():.3g}× the baseline's error" if ratios.notna().any() else "not finite"
    return f"{label} in {len(outside)} cell(s), {how} at {worst['id']}"


@rule(40)
def check_lse_error_budget(frame: pd.DataFrame) -> list[dict]:
    """A returned log-sum-exp outside its budget, or its halves' merge or its shards' (context parallel)
    outside theirs (measure.checks.lse: lse_error, lse_merge, lse_shards): 2 × hand-written attention's in
    the same dtype + atol."""
    ok = _ok(frame)
    bad = pd.Series(False, index=ok.index)
    for verdict in ("lse_within_budget", "merge_within_budget", "shards_within_budget"):
        if verdict in ok:
            bad |= ok[verdict].astype("object").eq(False)
    rows = ok[bad]

    def make(variant: str, g: pd.DataFrame) -> dict:
        parts = [p for p in (_outside(g, "lse_within_budget", "lse_err_ratio", "its lse"),
                             _outside(g, "merge_within_budget", "merge_err_ratio",
                                      "its (out, lse) merged over the keys split in two"),
                             _outside(g, "shards_within_budget", "shards_err_ratio",
                                      "its (out, lse) over the keys cut in "
                                      f"{' and '.join(map(str, SHARD_COUNTS))} shards, merged as context parallel "
                                      "merges its ranks'")) if p]
        return _finding("lse_error_budget", "error", variant,
                        f"{variant}'s log-sum-exp is outside its error budget (RMSE vs float64 above 2× that of "
                        f"hand-written attention's in the same dtype, plus atol): {'; '.join(parts)} ({_where(g)}). "
                        f"Code that merges its partial results (split-KV decoding, ring attention, chunked "
                        f"prefill) or applies sinks through its lse gets wrong outputs, even where out is right.",
                        g["id"])
    return _per_variant(rows, make)


@rule(50)
def check_lse_grad_budget(frame: pd.DataFrame) -> list[dict]:
    """The gradient through a returned log-sum-exp (dq, dk of <lse, grad_lse>) outside its budget."""
    ok = _ok(frame)
    rows = ok[ok["lse_grads_within_budget"].astype("object").eq(False)] if "lse_grads_within_budget" in ok \
        else ok.iloc[0:0]

    def make(variant: str, g: pd.DataFrame) -> dict:
        outside = _outside(g, "lse_grads_within_budget", "lse_dq_err_ratio", "dq")   # g: all outside
        dead = g["lse_differentiable"].astype("object").eq(False).sum() if "lse_differentiable" in g else 0
        note = f"; its lse carries no gradient at all in {int(dead)} of them" if dead else ""
        return _finding("lse_grad_budget", "error", variant,
                        f"{variant}'s gradient through its log-sum-exp is outside its budget: {outside}"
                        f"{note} ({_where(g)}). A loss or a merge that uses its lse trains with incomplete "
                        f"dq and dk (pytorch/torchtitan#4796).", g["id"])
    return _per_variant(rows, make)


UNMERGEABLE_LSE_ROWS = ("nan", "zero", "finite", "mixed")   # measure.golden.lse.classify_lse_rows, not ±inf


@rule(60)
def check_lse_masked_rows(frame: pd.DataFrame) -> list[dict]:
    """An lse that is neither -inf nor +inf on rows that see no key: a merge reads such a row as
    having keys (0 or a finite value) or gets NaN (measure.golden.lse.merge_partials)."""
    ok = _ok(frame)
    if "lse_masked_rows" not in ok:
        return []
    rows = ok[ok["lse_masked_rows"].astype(str).isin(UNMERGEABLE_LSE_ROWS)]

    def make(variant: str, g: pd.DataFrame) -> dict:
        kinds = ", ".join(sorted(set(g["lse_masked_rows"].astype(str))))
        return _finding("lse_masked_rows", "warning", variant,
                        f"{variant} returns an lse of {kinds} on rows that see no key ({len(g)} cell(s); "
                        f"{_where(g)}): a merge of partial results reads only -inf (or +inf, FlashAttention-2's) "
                        f"as an empty part, so such a row weighs its part's output in (or becomes NaN).", g["id"])
    return _per_variant(rows, make)


@rule(70)
def check_masked_leakage(frame: pd.DataFrame) -> list[dict]:
    """Weight on masked or future keys (finfo.min masks are reported separately)."""
    ok = _ok(frame)
    ok = ok[ok["scenario"] != FINFO_MIN_SCENARIO]
    leak = _rows_where(ok, leaks)
    rows = ok[leak]

    def make(variant: str, g: pd.DataFrame) -> dict:
        mass = _num(g, "leak_mass").max()
        change = _num(g, "leak_max_change").max()
        detail = [f"output changes by up to {change:.3g} when masked-out keys/values change"]
        if pd.notna(mass) and mass > 0:
            detail.append(f"up to {mass:.3g} of a row's probability sits on masked keys")
        return _finding("masked_leakage", "error", variant,
                        f"{variant} leaks weight to masked positions in {len(g)} cell(s): "
                        f"{'; '.join(detail)} ({_where(g)}).", g["id"])
    return _per_variant(rows, make)


@rule(110)
def check_finfo_min_masks(frame: pd.DataFrame) -> list[dict]:
    """A finfo.min float mask is finite: fully masked rows attend uniformly to masked keys."""
    ok = _real_code(_ok(frame))
    rows = ok[(ok["scenario"] == FINFO_MIN_SCENARIO) & _rows_where(ok, leaks)]
    if rows.empty:
        return []
    names = ", ".join(sorted(set(rows["variant"])))
    return [_finding("finfo_min_mask", "warning", "*",
                     f"With a float mask of finfo(dtype).min, fully masked rows are not masked: "
                     f"they attend uniformly to the masked keys, whose values then reach the output "
                     f"({names}). Use a bool mask or -inf, or handle empty rows explicitly.", rows["id"])]


@rule(100)
def check_fully_masked_rows(frame: pd.DataFrame) -> list[dict]:
    """NaN on fully masked rows where SDPA returns 0: each cell against sdpa's cell of the same
    inputs (every axis but the variant: core.grid.INPUT_AXES)."""
    ok = _ok(frame)
    if "masked_rows" not in ok:
        return []
    nan_rows = ok[ok["masked_rows"].astype(str) == "nan"]
    axes = [a for a in INPUT_AXES if a in ok.columns]
    sdpa = ok[ok["variant"] == "sdpa"].drop_duplicates(axes).set_index(axes)["masked_rows"]

    def make(variant: str, g: pd.DataFrame) -> dict:
        keys = [tuple(k) for k in g[axes].itertuples(index=False, name=None)]
        sdpa_says = {str(sdpa.loc[k]) for k in keys if k in sdpa.index}
        versus = f" while sdpa returns {', '.join(sorted(sdpa_says))}" if sdpa_says else ""
        forms = ", ".join(sorted(set(g["scenario"])))
        return _finding("fully_masked_rows", "warning", variant,
                        f"{variant} returns NaN on fully masked rows{versus} ({forms}; "
                        f"{len(g)} cell(s)). One empty row poisons the loss and every gradient.", g["id"])
    return _per_variant(nan_rows, make)


@rule(130)
def check_saturation(frame: pd.DataFrame) -> list[dict]:
    """Rows saturating to one-hot: by the variant itself, or by the inputs."""
    ok = _ok(frame)
    found = []
    own = ok[(ok.get("saturation_source") == "variant")
             & (_num(ok, "onehot_frac") - _num(ok, "golden_onehot_frac") > SATURATION_EXCESS)]

    def make(variant: str, g: pd.DataFrame) -> dict:
        return _finding("saturation", "warning", variant,
                        f"{variant}'s attention saturates to one-hot: up to "
                        f"{_num(g, 'onehot_frac').max():.0%} of rows put > 0.99 on one key where the "
                        f"float64 golden has at most {_num(g, 'golden_onehot_frac').max():.0%} "
                        f"({len(g)} cell(s); {_where(g)}). Gradients through such rows vanish.", g["id"])
    found += _per_variant(own, make)
    inputs = ok[_num(ok, "golden_onehot_frac") > INPUT_SATURATION]
    for scenario, g in inputs.groupby("scenario"):
        found.append(_finding("input_saturation", "info", "*",
                              f"Inputs of scenario {scenario} saturate softmax: up to "
                              f"{_num(g, 'golden_onehot_frac').max():.0%} of rows are one-hot even in "
                              f"float64 (max |logit| {_num(g, 'max_logit').max():.3g}).", g["id"]))
    return found

@rule(120)
def check_fp16_range(frame: pd.DataFrame) -> list[dict]:
    ok = _real_code(_ok(frame))
    rows = ok[(ok["scenario"] == FP16_RANGE_SCENARIO) & (ok["dtype"] == "fp16")]
    if rows.empty:
        return []
    bad = rows[_num(rows, "out_nonfinite_visible").fillna(0) > 0]
    finite = sorted(set(rows["variant"]) - set(bad["variant"]))
    overflow = sorted(set(bad["variant"]))
    return [_finding("fp16_overflow", "warning" if overflow else "info", "*",
                     f"fp16 inputs with q·k ≈ 2.2e5 > 65504: stay finite: {', '.join(finite) or 'none'}; "
                     f"overflow to inf/NaN: {', '.join(overflow) or 'none'}.", rows["id"])]


@rule(160)
def check_alignment(frame: pd.DataFrame) -> list[dict]:
    """One finding: which causal alignment each variant applies when q_len != kv_len."""
    ok = _real_code(_ok(frame))
    if "causal_alignment" not in ok:
        return []
    rows = ok[ok["causal_alignment"].notna()]
    if rows.empty:
        return []
    groups = rows.groupby("causal_alignment")["variant"].agg(lambda v: ", ".join(sorted(set(v))))
    parts = "; ".join(f"{kind}: {names}" for kind, names in groups.items())
    return [_finding("causal_alignment", "info", "*",
                     f"Causal alignment when q_len != kv_len — {parts}. Top-left is is_causal=True's; "
                     f"KV-cache decoding usually needs bottom-right "
                     f"(torch.nn.attention.bias.causal_lower_right).", rows["id"])]


@rule(170)
def check_underflow(frame: pd.DataFrame) -> list[dict]:
    ok = _ok(frame)
    rows = ok[_num(ok, "underflow_frac") > UNDERFLOW_FRAC]

    def make(variant: str, g: pd.DataFrame) -> dict:
        return _finding("underflow", "info", variant,
                        f"{variant}: up to {_num(g, 'underflow_frac').max():.1%} of probabilities "
                        f"are exactly 0 where float64 is positive ({len(g)} cell(s); {_where(g)}).",
                        g["id"])
    return _per_variant(rows, make)

