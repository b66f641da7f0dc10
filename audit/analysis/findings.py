"""Rules that turn records into plain-language findings a reviewer can act on.

Each rule reads the tidy DataFrame (records.to_frame) and returns findings:
dicts with `check`, `severity` (error, warning, info), `variant`, `message`
and `cells` (the ids it covers). Pure pandas: no torch, no measuring.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from ..core.defects import BUDGETED_GRADIENTS, REPEATED_TENSORS, grad_outside_budget, leaks, nonfinite
from ..core.diagnosis_names import agrees, members, title_of
from ..core.grid import INPUT_AXES
from ..core.referee import REFEREE_CHECKS
from ..core.referee import column as referee_column
from ..core.runfolder import FINDINGS_FILE
from .finding_rows import NEGATIVE_CONTROL_PREFIX, _finding, _num, _ok, _per_variant, _real_code, _rows_where, _where
from .layout_rules import check_cross_document, check_invariance, check_paged_reads
from .argument_rules import check_arguments
from .noise_rules import check_timing_noise

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
FINFO_MIN_SCENARIO = "fully_masked_finfo_min"
FP16_RANGE_SCENARIO = "fp16_range"
SATURATION_EXCESS = 0.25     # a variant's one-hot row fraction above the golden's by more: `saturation`
INPUT_SATURATION = 0.5       # the golden's one-hot row fraction above which inputs saturate softmax
UNDERFLOW_FRAC = 0.01        # probabilities exactly 0 where float64 is positive, above which: `underflow`


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


def check_lse_error_budget(frame: pd.DataFrame) -> list[dict]:
    """A returned log-sum-exp outside its budget, or its halves' merge outside theirs
    (measure.checks.lse: lse_error, lse_merge): 2 × hand-written attention's in the same dtype + atol."""
    ok = _ok(frame)
    bad = pd.Series(False, index=ok.index)
    for verdict in ("lse_within_budget", "merge_within_budget"):
        if verdict in ok:
            bad |= ok[verdict].astype("object").eq(False)
    rows = ok[bad]

    def make(variant: str, g: pd.DataFrame) -> dict:
        parts = [p for p in (_outside(g, "lse_within_budget", "lse_err_ratio", "its lse"),
                             _outside(g, "merge_within_budget", "merge_err_ratio",
                                      "its (out, lse) merged over the keys split in two")) if p]
        return _finding("lse_error_budget", "error", variant,
                        f"{variant}'s log-sum-exp is outside its error budget (RMSE vs float64 above 2× that of "
                        f"hand-written attention's in the same dtype, plus atol): {'; '.join(parts)} ({_where(g)}). "
                        f"Code that merges its partial results (split-KV decoding, ring attention, chunked "
                        f"prefill) or applies sinks through its lse gets wrong outputs, even where out is right.",
                        g["id"])
    return _per_variant(rows, make)


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


def check_compiled_rewrite(frame: pd.DataFrame) -> list[dict]:
    ok = _ok(frame)
    if "fused_sdpa" not in ok:
        return []
    fused = ok[ok["fused_sdpa"].astype("object").eq(True)]

    def make(variant: str, g: pd.DataFrame) -> dict:
        total = int((ok["variant"] == variant).sum())
        return _finding("compiled_rewritten", "info", variant,
                        f"Inductor rewrote {variant} into fused SDPA in {len(g)} of {total} cells "
                        f"(no mask or a float mask): there its speed and numerics are SDPA's, e.g. "
                        f"fully masked rows give 0 instead of NaN.", g["id"])
    return _per_variant(fused, make)


def check_graph_breaks(frame: pd.DataFrame) -> list[dict]:
    """A compiled variant whose code Dynamo split (graph_breaks > 0): between the pieces it ran
    eagerly, so its time and memory are partly not the compiled code's."""
    ok = _ok(frame)
    rows = ok[_num(ok, "graph_breaks") > 0]

    def make(variant: str, g: pd.DataFrame) -> dict:
        return _finding("graph_breaks", "warning", variant,
                        f"Dynamo broke {variant}'s compiled code into pieces in {len(g)} cell(s) ({_where(g)}), "
                        f"up to {int(_num(g, 'graph_breaks').max())} graph break(s): the code between them ran "
                        f"eagerly, so these times are partly eager Python's. TORCH_LOGS=graph_breaks names them.",
                        g["id"])
    return _per_variant(rows, make)


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


def check_underflow(frame: pd.DataFrame) -> list[dict]:
    ok = _ok(frame)
    rows = ok[_num(ok, "underflow_frac") > UNDERFLOW_FRAC]

    def make(variant: str, g: pd.DataFrame) -> dict:
        return _finding("underflow", "info", variant,
                        f"{variant}: up to {_num(g, 'underflow_frac').max():.1%} of probabilities "
                        f"are exactly 0 where float64 is positive ({len(g)} cell(s); {_where(g)}).",
                        g["id"])
    return _per_variant(rows, make)


def check_memory_leak(frame: pd.DataFrame) -> list[dict]:
    """Memory a variant kept across its timed calls (leaked_bytes): it grows with every call."""
    rows = _ok(frame)
    rows = rows[_num(rows, "leaked_bytes") > 0]

    def make(variant: str, g: pd.DataFrame) -> dict:
        return _finding("memory_leak", "warning", variant,
                        f"{variant} kept up to {_num(g, 'leaked_bytes').max() / 2**20:.0f} MiB across its timed "
                        f"calls in {len(g)} cell(s) ({_where(g)}): memory grows with every call.", g["id"])
    return _per_variant(rows, make)


def _differs(frame: pd.DataFrame) -> list[tuple | None]:
    """repeat_differs per row as a tuple of names (() for bitwise identical, None where not checked)."""
    if "repeat_differs" not in frame:
        return [None] * len(frame)
    return [tuple(v) if isinstance(v, (list, tuple)) else None for v in frame["repeat_differs"]]


def _differing(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows where some tensor differed between runs."""
    return frame[pd.Series([bool(d) for d in _differs(frame)], index=frame.index, dtype=bool)]


def check_nondeterministic(frame: pd.DataFrame) -> list[dict]:
    """Outputs or gradients that are not bitwise identical across runs on identical inputs."""
    ok = _ok(frame)
    rows = _differing(ok)

    def make(variant: str, g: pd.DataFrame) -> dict:
        checked = sum(d is not None for d in _differs(ok[ok["variant"] == variant]))
        names = [n for n in REPEATED_TENSORS if any(n in d for d in _differs(g))]
        mode = (" even under torch.use_deterministic_algorithms(True)"
                if g.get("deterministic_algorithms", pd.Series(dtype=object)).astype("object").eq(True).any()
                else "")
        return _finding("nondeterministic", "warning", variant,
                        f"{variant} is not run-to-run deterministic{mode}: {', '.join(names)} differ between "
                        f"runs on identical inputs in {len(g)} of {checked} cell(s), by up to "
                        f"{_num(g, 'repeat_max_diff').max():.3g} ({_where(g)}). Training with it is not "
                        f"bitwise reproducible.", g["id"])
    return _per_variant(rows, make)


def check_deterministic_mode(frame: pd.DataFrame) -> list[dict]:
    """Under --deterministic: which variants refuse (raise), and which run bitwise identically."""
    if "deterministic_refused" not in frame:
        return []
    mode = frame[frame["deterministic_refused"].astype("object").isin([True, False])]
    if mode.empty:
        return []
    refused = set(mode.loc[mode["deterministic_refused"].astype("object").eq(True), "variant"])
    ran = _ok(mode)
    still = set(_differing(ran)["variant"])
    identical = set(ran["variant"]) - still - refused
    parts = [f"{label}: {', '.join(sorted(names)) or 'none'}" for label, names in
             (("refuse (an operation has no deterministic implementation)", refused),
              ("bitwise identical across runs", identical), ("still differ", still))]
    return [_finding("deterministic_mode", "warning" if refused or still else "info", "*",
                     "Under torch.use_deterministic_algorithms(True) (--deterministic) — "
                     + "; ".join(parts) + ".", mode["id"])]


def check_referee(frame: pd.DataFrame) -> list[dict]:
    """The referee's checks (core.referee): one error finding per variant and failed check, naming
    the check, what the first failing call showed (the numbers), and where. A variant that fails
    one was not measured doing the work: its speed is not comparable, its numerics not trusted."""
    ok = _ok(frame)
    found = []
    for name, meaning in REFEREE_CHECKS.items():
        col = referee_column(name)
        if col not in ok:
            continue
        failed = ok[ok[col].astype("object").eq(False)]
        for variant, g in failed.groupby("variant", sort=True):
            judged = int(ok.loc[ok["variant"] == variant, col].astype("object").isin([True, False]).sum())
            details = [d.get(name) for d in g.get("referee_detail", pd.Series(dtype=object))
                       if isinstance(d, dict) and d.get(name)]
            seen = f" First: {details[0]}." if details else ""
            finding = _finding("referee", "error", str(variant),
                               f"{variant} fails the referee's {name} check in {len(g)} of {judged} cell(s) "
                               f"({_where(g)}): it must hold that {meaning}.{seen} Its times there are not of "
                               "the work and its numbers cannot be trusted: never use it as measured "
                               "(docs/generated-kernels.md).", g["id"])
            finding["referee_check"] = name
            found.append(finding)
    return found


# A failed cell's reason that is torch.compile's failure (Inductor's C++ or Triton compile, its
# generated code's own checks, Dynamo's backend), not the variant's arithmetic nor the audit's.
TORCH_COMPILE_FAILURE = r"InductorError|CppCompileError|BackendCompilerFailed|torch\._inductor|cpp_builder|\.main\.cpp:\d+"


def check_failed_cells(frame: pd.DataFrame) -> list[dict]:
    """Cells that failed (error, oom, timeout): the reasons (with the line naming the cause: a
    compiler's error line, a chain's root), where the whole failure is kept (failure_file), and
    whether the failures came after other cells of the variant in the same measuring process (a
    compile that fails only as a recompile: the reproduction script replays those first)."""
    rows = frame[frame["status"].isin(["error", "oom", "timeout"])]

    def make(variant: str, g: pd.DataFrame) -> dict:
        reasons = "; ".join(sorted(set(str(r)[:240] for r in g["reason"])))[:480]
        files = [f for f in g.get("failure_file", pd.Series(dtype=object)) if isinstance(f, str)]
        after = [a for a in g.get("failed_after", pd.Series(dtype=object)) if isinstance(a, list) and a]
        text = f"{variant} failed in {len(g)} cell(s): {reasons}."
        compiled = [r for r in g["reason"].astype(str) if re.search(TORCH_COMPILE_FAILURE, r)]
        if compiled:
            text += (f" {len(compiled)} of them are torch.compile failing on the variant's code (torch's Inductor or "
                     "Dynamo, the compiler's own line quoted: a failure of torch's, not of attn-audit's; report it "
                     "upstream with the reproduction script, which needs torch alone).")
        if files:
            text += f" The whole failure of each is in the run folder ({files[0]}{' and more' if len(files) > 1 else ''})."
        if after:
            first = min(after, key=len)
            ran_ok = set(frame.loc[(frame["variant"] == variant) & (frame["status"] == "ok"), "id"])
            before = [c for c in first if c in ran_ok]
            text += (f" {len(after)} of them failed after other cells of {variant} in the same measuring process "
                     f"(the first after {len(first)}: {first[0]}" + (", which ran ok" if first[0] in ran_ok else "")
                     + "): a compiled variant can fail only on a recompile, so its reproduction script replays "
                     f"them first when the cell alone does not fail" + (f" ({len(before)} of them ran ok)" if before else "")
                     + ".")
        found = _finding("cell_failed", "warning", variant, text, g["id"])
        if files:
            found["failure_file"] = files[0]
        return found
    return _per_variant(rows, make)


RULES: tuple[Callable[[pd.DataFrame], list[dict]], ...] = (
    check_nonfinite, check_error_budget, check_grad_error_budget, check_lse_error_budget, check_lse_grad_budget,
    check_lse_masked_rows, check_masked_leakage, check_cross_document, check_paged_reads, check_fully_masked_rows,
    check_finfo_min_masks, check_fp16_range, check_saturation, check_compiled_rewrite, check_graph_breaks,
    check_alignment, check_underflow, check_memory_leak, check_nondeterministic, check_invariance,
    check_deterministic_mode,
    check_arguments, check_referee, check_failed_cells, check_timing_noise,
)


# Error findings about numerics: their cells carry a diagnosis (measure/diagnosis/diagnosis.py), of the
# output (column "diagnosis", workload.mistakes) or of the gradients ("grad_diagnosis",
# workload.backward_mistakes).
DIAGNOSED_CHECKS = {"nonfinite": "diagnosis", "error_budget": "diagnosis", "masked_leakage": "diagnosis",
                    "grad_error_budget": "grad_diagnosis", "lse_error_budget": "lse_diagnosis",
                    "lse_grad_budget": "lse_grad_diagnosis"}


def _add_diagnosis(finding: dict, frame: pd.DataFrame) -> None:
    """The known mistake most of the finding's diagnosed cells match, with its explanation, on
    the finding (diagnosis, diagnosis_title, diagnosis_cells, diagnosis_err, diagnosis_golden_err)
    and at the end of its message; "none" when no mistake matched any of them."""
    from ..workload.backward_mistakes import BACKWARD_MISTAKES
    from ..workload.lse_mistakes import all_lse_mistakes
    from ..workload.mistakes import MISTAKES

    column = DIAGNOSED_CHECKS[finding["check"]]
    # gradients are named by a backward mistake, or by the forward's mistake where they are its
    # gradients (measure/diagnosis/diagnosis.py: diagnose_grads_as_forward)
    library = {"grad_diagnosis": {**MISTAKES, **BACKWARD_MISTAKES}, "lse_diagnosis": all_lse_mistakes(),
               "lse_grad_diagnosis": all_lse_mistakes()}.get(column, MISTAKES)
    if column not in frame:
        return
    cells = frame[frame["id"].isin(finding["cells"]) & frame[column].notna()]
    if cells.empty:
        return
    what = {"grad_diagnosis": "its gradients match", "lse_diagnosis": "its lse matches",
            "lse_grad_diagnosis": "its gradient through the lse matches"}.get(column, "the output matches")
    matched = cells[cells[column] != "none"]
    if matched.empty:
        finding.update(diagnosis="none", diagnosis_cells=0)
        subject = {"grad_diagnosis": "its gradients", "lse_diagnosis": "its lse",
                   "lse_grad_diagnosis": "its gradient through the lse"}.get(column, "its output")
        finding["message"] += (f" Diagnosis: no known mistake matches {subject} "
                               f"in the {len(cells)} diagnosed cell(s) (docs/numerics.md, Diagnosis).")
        return
    counts = matched[column].value_counts()
    # a cell that could not tell a from b ("a or b") agrees with a cell named a: the name most cells
    # agree with, then the one most cells have, then the fewest names
    agreeing = {n: int(matched[column].map(lambda m, n=n: agrees(m, n)).sum()) for n in counts.index}
    name = str(sorted(counts.index, key=lambda n: (-agreeing[n], -counts[n], len(members(n)), n))[0])
    best = matched[matched[column].map(lambda m: agrees(m, name))]
    golden_err = _num(best, f"{column}_golden_err")
    example = best.loc[golden_err.idxmax()] if golden_err.notna().any() else best.iloc[0]
    known = [library[n] for n in members(name) if n in library]
    title = title_of(name, library)
    lead = f"{what} a known mistake," if len(members(name)) < 2 else \
        f"{what} known mistakes its inputs cannot tell apart,"
    if column == "grad_diagnosis" and all(n in MISTAKES and n not in BACKWARD_MISTAKES for n in members(name)):
        lead = "no backward mistake explains its gradients: they are those of the forward's mistake, differentiated,"
    finding.update(diagnosis=name, diagnosis_title=title, diagnosis_cells=int(len(best)),
                   diagnosis_err=_float(example.get(f"{column}_err")),
                   diagnosis_golden_err=_float(example.get(f"{column}_golden_err")))
    others = [f"{n} ({int(counts[n])})" for n in counts.index if not agrees(n, name)]
    text = (f" Diagnosis: in {len(best)} of {len(cells)} diagnosed cell(s) {lead} "
            f"{title} (RMSE {_fmt(finding['diagnosis_err'])} against it, {_fmt(finding['diagnosis_golden_err'])} "
            f"against the correct golden, at {example['id']}).")
    for m in known:
        text += f" {m.what} Usually {m.where}"
        if not text.endswith("."):
            text += "."
    if others:
        text += f" Other cells match: {', '.join(others)}."
    finding["message"] += text


def _float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def compute_findings(frame: pd.DataFrame) -> list[dict]:
    """Every rule over the frame, most severe first; numerics errors with their diagnosis."""
    if frame.empty:
        return []
    found = [f for rule in RULES for f in _guarded(rule, frame)]
    for finding in found:
        if finding["check"] in DIAGNOSED_CHECKS:
            try:
                _add_diagnosis(finding, frame)
            except Exception as exc:  # noqa: BLE001 - the finding stands without its diagnosis, said so
                finding["diagnosis_error"] = f"{type(exc).__name__}: {exc}"
    return sorted(found, key=lambda f: (SEVERITY_ORDER[f["severity"]], f["check"], f["variant"]))


RULE_FAILED = "audit_rule_failed"     # a rule that raised on these records: the audit's bug, said in a finding


def _guarded(rule: Callable[[pd.DataFrame], list[dict]], frame: pd.DataFrame) -> list[dict]:
    """A rule's findings; a rule that raises on these records (a bug of the audit's, or records
    edited by hand) gives one warning naming it and why, and the other rules still judge: a report
    is never lost to one rule, and no traceback is printed."""
    try:
        return rule(frame)
    except Exception as exc:  # noqa: BLE001 - reported as a finding, as documented
        text = str(exc).strip().splitlines()
        return [_finding(RULE_FAILED, "warning", "*",
                         f"attn-audit's rule {rule.__name__} could not judge these records ({type(exc).__name__}: "
                         f"{text[0] if text else ''}): what it checks is not reported for this run. This is a bug "
                         "of attn-audit (or records edited by hand): please report it with the run folder.", [])]


def write_findings(run_dir: str | Path) -> list[dict[str, Any]]:
    """Compute findings from DIR's records and write DIR/findings.json (and the model audit's to
    DIR/model_findings.json where the run made one)."""
    from ..core.records import load

    from ..core.runfolder import MODEL_FINDINGS_FILE, read_model_records
    found = compute_findings(load(run_dir))
    path = Path(run_dir) / FINDINGS_FILE
    path.write_text(json.dumps(found, indent=1, default=_json_default) + "\n")
    if read_model_records(run_dir):       # the model audit's own, beside (its runs are not cells: no repro script)
        (Path(run_dir) / MODEL_FINDINGS_FILE).write_text(json.dumps(model_findings(run_dir), indent=1) + "\n")
    return found


def model_findings(run_dir: str | Path) -> list[dict[str, Any]]:
    """The model audit's findings (analysis/model_rules.py) of DIR's model.jsonl."""
    from ..core.runfolder import read_model_records
    from .model_rules import check_model
    return check_model(read_model_records(run_dir))


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, float) and math.isnan(obj):
        return None
    raise TypeError(type(obj).__name__)
