"""A standalone reproduction script for every finding: DIR/repro/<check>-<variant>.py.

Each script imports torch only (and, for a plug-in, the plug-in's module, from the
directories the run imported it from), rebuilds the inputs of the finding's worst cell
from its seed and shapes, runs the variant and prints the defect with numbers. It exits
1 while the finding holds, 0 once it does not, 2 when it cannot check (no CUDA device
for a CUDA cell, the check itself failed).

The code in a script is the audit's own, copied by audit.repro.embed from the live objects:
the scenario's draw function and inputs.draw_inputs, the variant as built, the
verifier for the check (audit.repro.checks) with the golden, baseline and metrics it
uses. Where something cannot be copied, the finding gets `repro_reason` instead of a
script that would check something else.
"""
from __future__ import annotations

import functools

import json
import math
import textwrap
from pathlib import Path
from typing import Any, Callable

from ..core.diagnosis_names import agrees, members
from ..core.referee import REFEREE_COLUMNS, failed_checks
from ..core.runfolder import FINDINGS_FILE, MINIMAL_SUFFIX, REPRO_DIR, RUN_FILE, file_safe
from ..workload.variant_contract import BROKEN_PREFIX


def _num(rec: dict, col: str) -> float:
    """A record's number for ranking: missing -> -inf, NaN -> -inf, inf stays inf."""
    value = rec.get(col)
    if value in (None, "NaN"):
        return -math.inf
    if value in ("Infinity", "-Infinity"):
        return math.inf if value == "Infinity" else -math.inf
    try:
        value = float(value)
    except (TypeError, ValueError):
        return -math.inf
    return -math.inf if math.isnan(value) else value


_STATUS_RANK = {"error": 2, "oom": 1, "timeout": 0}   # timeouts last: they take the whole limit to reproduce

# check -> (how "worse" ranks a record of the finding's cells, what that means in words)
WORST: dict[str, tuple[Callable[[dict], tuple], str]] = {
    "nonfinite": (lambda r: (_num(r, "out_nonfinite_visible") + max(_num(r, "grad_nan"), 0)
                             + max(_num(r, "grad_inf"), 0),), "most NaN/inf values"),
    # as the finding's message: the largest finite ratio, else the first cell (a NaN error)
    "error_budget": (lambda r: (_num(r, "err_ratio"),), "largest error relative to the baseline's"),
    "grad_error_budget": (lambda r: (max(_num(r, f"{g}_err_ratio") for g in ("dq", "dk", "dv")),),
                          "largest gradient error relative to the baseline's"),
    "masked_leakage": (lambda r: (_num(r, "leak_max_change"), _num(r, "leak_mass")), "largest leak"),
    "fully_masked_rows": (lambda r: (_num(r, "out_nan"),), "most NaN outputs"),
    "finfo_min_mask": (lambda r: (_num(r, "leak_max_change"),), "largest change of fully masked rows"),
    "fp16_overflow": (lambda r: (_num(r, "out_nonfinite_visible"),), "most NaN/inf outputs"),
    "saturation": (lambda r: (_num(r, "onehot_frac") - _num(r, "golden_onehot_frac"),), "most excess one-hot rows"),
    "input_saturation": (lambda r: (_num(r, "golden_onehot_frac"),), "most one-hot float64 rows"),
    "compiled_rewritten": (lambda r: (1.0 if r.get("fused_sdpa") else 0.0,), "rewritten into SDPA"),
    "causal_alignment": (lambda r: (1.0 if r.get("causal_alignment") else 0.0,), "alignment recorded"),
    "underflow": (lambda r: (_num(r, "underflow_frac"),), "largest underflow fraction"),
    "memory_leak": (lambda r: (_num(r, "leaked_bytes"),), "most memory kept"),
    "cell_failed": (lambda r: (_STATUS_RANK.get(r.get("status"), -1),), "first error, else oom, else timeout"),
    "nondeterministic": (lambda r: (_num(r, "repeat_max_diff"),), "largest difference between runs"),
    "lse_error_budget": (lambda r: (max(_num(r, "lse_err_ratio"), _num(r, "merge_err_ratio"),
                                        _num(r, "shards_err_ratio")),),
                         "largest lse, merge or context-parallel error relative to the baseline's"),
    "lse_grad_budget": (lambda r: (max(_num(r, "lse_dq_err_ratio"), _num(r, "lse_dk_err_ratio")),),
                        "largest error of the gradient through the lse relative to the baseline's"),
    "lse_masked_rows": (lambda r: (1.0 if r.get("lse_masked_rows") else 0.0,), "lse on empty rows recorded"),
    "referee": (lambda r: (float(len(failed_checks(r))),), "most referee checks failed"),
    "cross_document": (lambda r: (_num(r, "cross_doc_max_change"),), "largest change across documents"),
    "argument_ignored": (lambda r: (float(sum(s in ("ignored", "misapplied")
                                              for s in (r.get("arguments") or {}).values())),),
                         "most arguments not honoured"),
    "paged_reads": (lambda r: (_num(r, "paged_unread_max_change"),), "largest change with the unread slots"),
    "batch_invariance": (lambda r: (_num(r, "batch_max_diff"),), "largest difference of a row alone"),
    "chunk_invariance": (lambda r: (_num(r, "chunk_max_diff"),), "largest difference of the two chunks"),
}

# Checks whose finding lists cells that do not show the defect themselves (fp16_overflow lists
# every fp16_range cell, finite or not): only those that do are reproduced.
SHOWS: dict[str, Callable[[dict], bool]] = {
    "fp16_overflow": lambda r: _num(r, "out_nonfinite_visible") > 0,
}

# The record columns a script prints as "audit recorded" beside what it measures now.
RECORDED_COLUMNS = ("out_nonfinite_visible", "grad_nan", "grad_inf", "rmse", "max_abs_err", "err_ratio",
                    "within_budget", "leak_max_change", "leak_mass", "masked_rows", "onehot_frac",
                    "golden_onehot_frac", "max_logit", "fused_sdpa", "causal_alignment", "golden_alignment",
                    "underflow_frac", "diagnosis", "diagnosis_err", "diagnosis_golden_err", "repeat_differs",
                    "repeat_max_diff", "deterministic_algorithms",
                    "dq_err_ratio", "dk_err_ratio", "dv_err_ratio", "dq_within_budget", "dk_within_budget",
                    "dv_within_budget",
                    "grad_diagnosis", "grad_diagnosis_err", "grad_diagnosis_golden_err",
                    "lse_err", "lse_within_budget", "lse_masked_rows", "merge_err", "merge_within_budget",
                    "shards_errs", "shards_within_budget",
                    "lse_differentiable", "lse_grads_within_budget", "lse_diagnosis", "lse_grad_diagnosis",
                    *REFEREE_COLUMNS, "referee_detail", "leaked_bytes", "status", "reason", "cross_doc_max_change",
                    "paged_unread_max_change", "paged_diagnosis", "paged_diagnosis_err", "batch_invariant",
                    "batch_max_diff",
                    "chunk_invariant", "chunk_max_diff", "chunk_within_budget", "arguments")


def ranked_cells(finding: dict, by_id: dict[str, dict]) -> list[dict]:
    """The finding's recorded cells that show it, worst first (ties keep the finding's order)."""
    key, _ = WORST[finding["check"]]
    shows = SHOWS.get(finding["check"], lambda r: True)
    cells = [by_id[c] for c in finding["cells"] if c in by_id and shows(by_id[c])]
    if finding["variant"] == "*":   # about inputs or a mask form: shown on a real, uncompiled variant if one has it
        from ..workload.presets import COMPILED
        return sorted(cells, key=lambda r: (str(r.get("variant")).startswith(BROKEN_PREFIX),
                                            r.get("variant") in COMPILED, *(-x for x in key(r))))
    named = finding.get("diagnosis")     # a diagnosed finding: shown on a cell of its diagnosis first
    column = {"grad_error_budget": "grad_diagnosis",
              "paged_reads": "paged_diagnosis"}.get(finding["check"], "diagnosis")
    return sorted(cells, key=lambda r: (bool(members(named)) and not agrees(r.get(column), named),
                                        *(-x for x in key(r))))


def script_name(finding: dict, worst: dict, taken: set[str]) -> str:
    """`<check>-<variant>.py`, the variant made file-safe (file_safe); on a clash the
    worst cell's scenario is added, then a number."""
    variant = file_safe(finding["variant"])
    stem = f"{finding['check']}-{variant}"
    candidates = [stem, f"{stem}-{worst.get('scenario')}"] + [f"{stem}-{n}" for n in range(2, 1000)]
    name = next(c for c in candidates if c + ".py" not in taken)
    taken.add(name + ".py")
    return name + ".py"


def _plugin_paths(spec: str, run_info: dict) -> list[str]:
    """Directories the run imported plug-ins from (its cwd, then PYTHONPATH), narrowed to those
    that hold the plug-in's top-level module or package when one does."""
    import os
    paths = [p for p in [run_info.get("cwd"), *(run_info.get("pythonpath") or "").split(os.pathsep)] if p]
    top = spec.partition(":")[0].split(".")[0]
    holding = [p for p in paths if (Path(p) / f"{top}.py").exists() or (Path(p) / top / "__init__.py").exists()]
    return holding or paths


_PLUGIN_LOADER = '''
PLUGIN = {spec!r}
PLUGIN_PATHS = {paths!r}   # {where}


def load_variant():
    """The plug-in under test, imported as the audit imported it: (attention, None)."""
    import importlib
    for path in reversed(PLUGIN_PATHS):
        if path not in sys.path:
            sys.path.insert(0, path)
    module_name, _, attr = PLUGIN.partition(":")
    fn = importlib.import_module(module_name)
    for part in attr.split("."):
        fn = getattr(fn, part)
    return fn, None
'''

_BUILTIN_LOADER = '''

def load_variant():
    """The variant under test: (attention, its attention-weights function or None)."""
    return {attention}, {probs}
'''


# The script's own constants (written below): copied audit code must not define these names.
SCRIPT_CONSTANTS = ("TITLE", "CELL_AXES", "SEED", "TQ", "RECORDED", "ENV", "FORMS", "CACHE_PAGE_SIZE", "REPLAY")


REPLAY_MAX = 24     # earlier cells a cell_failed script replays at most (the latest ones)


def _embed_builtin(emb: Any, name: str, check: str) -> None:
    """Bind a built-in variant into the script: its factory copied where it can be, else what it
    built (`attention_under_test`), and its attention weights (`probs_under_test`) where it has them."""
    from ..core.errors import Unsupported
    from ..workload.variants import resolve
    from .embed import NotSelfContained
    variant = resolve(name)
    if check in ("saturation", "underflow") and variant.probs is None:
        raise NotSelfContained(f"{name} does not expose its attention weights")
    build = emb.try_expr(variant.build, hint="build_variant")   # copy the factory when it can be
    if build is not None:
        emb.assign("attention_under_test", f"{build}()")
    else:                                                     # else what it built
        try:
            attention = variant.build()
        except Unsupported as exc:
            raise NotSelfContained(f"{name} cannot be built here: {exc}") from None
        emb.bind("attention_under_test", attention)
    if variant.probs is not None:
        emb.bind("probs_under_test", variant.probs)


def _embed_replay(emb: Any, earlier: list[dict] | None) -> tuple[list, dict]:
    """A cell_failed script's replay: (axes, query length, scenario) of the latest REPLAY_MAX cells the
    variant ran on before, and each of their scenarios' draw (and score modification) bound once."""
    from ..core.grid import Case
    from ..workload.inputs import SCENARIOS, q_len
    replay, replay_draws = [], {}
    for record in (earlier or [])[-REPLAY_MAX:]:
        before = Case.from_mapping(record)
        if before.scenario not in SCENARIOS:
            continue
        replay.append(({k: getattr(before, k) for k in before.axes()}, q_len(before), before.scenario))
        if before.scenario not in replay_draws:
            scenario = SCENARIOS[before.scenario]
            mod = emb.bind(f"replay_score_mod_{before.scenario}", scenario.score_mod) \
                if scenario.score_mod is not None else "None"
            replay_draws[before.scenario] = f"({emb.bind(f'replay_draw_{before.scenario}', scenario.draw)}, {mod})"
    return replay, replay_draws


def build_script(finding: dict, cell: dict, run_info: dict, n_cells: int, worst_note: str,
                 earlier: list[dict] | None = None) -> str:
    """The source of one reproduction script. Raises embed.NotSelfContained when some piece
    cannot be copied into a standalone script. earlier: the records of the cells the audit's
    measuring process ran the variant on before this one (a cell_failed script replays them when
    the cell alone does not fail)."""
    from ..core.grid import Case
    from ..workload.inputs import SCENARIOS, draw_inputs, q_len, seed_for
    from ..workload.plugins import is_plugin_name
    from .checks import VERIFIERS, run_repro, time_limit_s
    from .failure_checks import FAILURE_VERIFIERS, cell_failed_child
    from .embed import Embedder, NotSelfContained
    from .layout_checks import LAYOUT_VERIFIERS
    from .lse_checks import LSE_VERIFIERS
    from .referee_checks import REFEREE_CHECK_VERIFIERS

    verifiers = {**VERIFIERS, **FAILURE_VERIFIERS, **LSE_VERIFIERS, **REFEREE_CHECK_VERIFIERS, **LAYOUT_VERIFIERS}
    check = finding["check"]
    if check not in verifiers:
        raise NotSelfContained(f"no verifier checks {check} in a standalone script yet")
    case = Case.from_mapping(cell)
    if case.scenario not in SCENARIOS:
        raise NotSelfContained(f"scenario {case.scenario!r} is unknown to this version of the audit")
    from ..workload.hf import is_hf_name
    # an hf: variant is transformers' code: its script imports transformers (and needs it)
    emb = Embedder(libraries=("transformers",) if is_hf_name(case.variant) else ())
    emb.reserve(*SCRIPT_CONSTANTS)
    needs_variant = check != "input_saturation"
    plugin = needs_variant and is_plugin_name(case.variant)
    declared = _declared(case.variant) if needs_variant else None
    forms = declared.forms if declared is not None else ()
    page_size = (declared.page_size if declared is not None else None) or cell.get("page_size")
    if needs_variant and not plugin:
        _embed_builtin(emb, case.variant, check)
    variant_end = emb.mark()
    emb.bind("Case", Case)
    emb.bind("seed_for", seed_for)
    emb.bind("scenario_draw", SCENARIOS[case.scenario].draw)
    score_mod = SCENARIOS[case.scenario].score_mod
    score_mod_name = emb.bind("scenario_score_mod", score_mod) if score_mod is not None else "None"
    emb.bind("draw_inputs", draw_inputs)
    replay, replay_draws = _embed_replay(emb, earlier) if check == "cell_failed" else ([], {})
    inputs_end = emb.mark()
    emb.bind("verify", verifiers[check])
    emb.bind("run_repro", run_repro)
    child = emb.bind("child", cell_failed_child) if check == "cell_failed" else "None"
    if plugin:
        where = ("the run's cwd and PYTHONPATH (run.json)" if run_info.get("cwd")
                 else "run.json records no cwd: the directory the report was written from")
        loader = _PLUGIN_LOADER.format(spec=case.variant, paths=_plugin_paths(case.variant, run_info), where=where)
    elif needs_variant:
        loader = _BUILTIN_LOADER.format(attention="attention_under_test",
                                        probs="probs_under_test" if emb.bound("probs_under_test") else "None")
    else:
        loader = _BUILTIN_LOADER.format(attention="None", probs="None")

    axes = {k: getattr(case, k) for k in case.axes()}
    recorded = {c: cell.get(c) for c in RECORDED_COLUMNS if c in cell}
    recorded["time_limit_s"] = time_limit_s(cell.get("reason")) if cell.get("status") == "timeout" else None
    recorded["variant_alignment"] = declared.causal_alignment if declared is not None else None
    if replay:
        recorded["replay_ids"] = [Case(**axes).id for axes, _, _ in replay]
    env = {k: (cell.get("env") or run_info.get("env") or {}).get(k) for k in ("torch", "float32_matmul_precision")}
    title = (f"attn-audit finding: {check} ({finding['severity']}) of {finding['variant']}, "
             f"reproduced on cell {cell['id']}")
    doc = _docstring(finding, cell, case, n_cells, worst_note, plugin, run_info)
    imports = sorted(set(["import sys", "import torch"] + emb.import_lines()))
    parts = [
        "#!/usr/bin/env python3",
        doc,
        "from __future__ import annotations",
        "\n".join(imports),
        f"TITLE = {title!r}\nCELL_AXES = {axes!r}\nSEED = {seed_for(case)}   # crc32 of repr(Case.input_key)\n"
        f"TQ = {q_len(case)}   # query length of scenario {case.scenario}\n"
        f"RECORDED = {_py(recorded)}   # what the audit measured in this cell\nENV = {_py(env)}\n"
        f"FORMS = {forms!r}   # the layouts the variant is called in (packed: varlen, paged)\n"
        f"CACHE_PAGE_SIZE = {page_size!r}   # slots per page of a paged cache\n"
        f"REPLAY = {replay!r}   # (axes, query length, scenario) of the cells the variant ran on before this one",
        "# " + "-" * 70 + " the variant under test"
        + (f" ({case.variant})" if needs_variant else " (none: a property of the inputs)"),
        emb.section(0, variant_end),
        loader.strip("\n"),
        "# " + "-" * 70 + f" the inputs: scenario {case.scenario} (attn-audit's audit/workload/inputs.py)",
        emb.section(variant_end, inputs_end),
        "# " + "-" * 70 + f" the check: {check} (attn-audit's measuring code, copied verbatim)",
        emb.section(inputs_end),
        "if __name__ == \"__main__\":\n    sys.exit(run_repro(TITLE, CELL_AXES, SEED, TQ, scenario_draw, load_variant, "
        f"verify, RECORDED, ENV, child={child}, score_mod={score_mod_name}, forms=FORMS, page_size=CACHE_PAGE_SIZE, "
        f"replay=REPLAY, replay_draws={{{', '.join(f'{k!r}: {v}' for k, v in replay_draws.items())}}}))",
    ]
    parts = [p for p in parts if p]
    copied = {emb.section(0, variant_end), emb.section(variant_end, inputs_end), emb.section(inputs_end)}
    for part in [p for p in parts if p not in copied] + emb.chunks():
        _compiles(part)
    return "\n\n\n".join(parts) + "\n"


@functools.lru_cache(maxsize=4096)
def _compiles(part: str) -> None:
    """Raise SyntaxError unless this top-level part of a script compiles: the script's own parts, and
    each definition it copies on its own (top-level statements: the script compiles when each does).
    Each is compiled once per report: the copied definitions recur in most scripts, their sections
    rarely whole (a quick run's 78 scripts: 1.1 s of its report compiling 329 sections)."""
    import __future__
    compile(part, "<repro>", "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)


def _declared(variant: str) -> Any:
    """The Variant a script calls (its layouts, page size and causal alignment): a plug-in that cannot be
    imported here (the report is made elsewhere) has none, and its script calls it dense."""
    from ..workload.variants import resolve
    try:
        return resolve(variant)
    except Exception:  # noqa: BLE001 - a script is still written; the plug-in loader imports it there
        return None


def _py(obj: Any) -> str:
    """A Python literal for record values (NaN and inf included; anything odd as its str)."""
    from .embed import _literal
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k!r}: {_py(v)}" for k, v in obj.items()) + "}"
    literal = _literal(obj)
    return literal if literal is not None else repr(str(obj))


def _docstring(finding: dict, cell: dict, case: Any, n_cells: int, worst_note: str, plugin: bool,
               run_info: dict) -> str:
    message = "\n".join(textwrap.wrap(finding["message"], 96))
    needs = "torch" + (f" and the plug-in module {case.variant.partition(':')[0]} (see PLUGIN_PATHS)" if plugin else "")
    ran = (cell.get("env") or run_info.get("env") or {}).get("torch") or "?"
    return f'''"""Reproduce attn-audit's `{finding["check"]}` finding ({finding["severity"]}) of {finding["variant"]}.

{message}

Cell {cell["id"]}: {worst_note} of the finding's {n_cells} cell(s).
Its inputs are rebuilt here from the seed and shapes exactly as the audit built them
(the same tensors, bit for bit); the check uses the audit's own measuring code.

Run: python {{this file}}    (needs {needs}; torch {ran} ran the audit)
Exit status: 1 while the finding holds, 0 once it no longer does, 2 when it cannot be checked here.
"""'''


def write_repro_scripts(run_dir: str | Path, findings: list[dict], records: list[dict] | None = None) -> list[dict]:
    """Write DIR/repro/<check>-<variant>.py per finding; add `repro` (path relative to DIR) or
    `repro_reason` (why there is none) to each finding and rewrite DIR/findings.json. `records`: DIR's,
    where already read."""
    from ..analysis.findings import _json_default
    from ..core.records import read_records
    from .embed import NotSelfContained

    run_dir = Path(run_dir)
    out_dir = run_dir / REPRO_DIR
    out_dir.mkdir(exist_ok=True)
    for old in out_dir.glob("*.py"):
        if not old.name.endswith(MINIMAL_SUFFIX):      # the shrinking's minimal scripts are not the report's
            old.unlink()
    by_id = {r["id"]: r for r in (read_records(run_dir) if records is None else records)}
    run_file = run_dir / RUN_FILE
    run_info = json.loads(run_file.read_text()) if run_file.exists() else {}
    taken: set[str] = set()
    for finding in findings:
        finding.pop("repro", None)
        finding.pop("repro_reason", None)
        reason = _no_script_reason(finding)
        cells = ranked_cells(finding, by_id) if reason is None else []
        if reason is None and not cells:
            reason = "none of the finding's cells is in records.jsonl"
        tried: list[str] = []
        # The worst cell; if some piece of it cannot be copied, the worst cell of another
        # variant and scenario (the pieces a script copies).
        for rank, cell in enumerate(_first_per_variant_and_scenario(cells)):
            note = f"the cell with the {WORST[finding['check']][1]}"
            if rank:
                note = f"the worst cell whose pieces can be copied ({'; '.join(dict.fromkeys(tried))})"
            earlier = [by_id[i] for i in (cell.get("failed_after") or []) if i in by_id]
            try:
                text = build_script(finding, cell, run_info, len(cells), note, earlier)
            except NotSelfContained as exc:
                tried.append(f"{cell['variant']}: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - a report never fails for want of a script
                tried.append(f"{cell['variant']}: {type(exc).__name__}: {exc}")
                continue
            name = script_name(finding, cell, taken)
            (out_dir / name).write_text(text)
            finding["repro"] = f"{REPRO_DIR}/{name}"
            notes = ["worst cell not copied: " + "; ".join(dict.fromkeys(tried))] if tried else []
            if cell.get("status") == "oom" and str(cell.get("reason")).startswith("predicted"):
                notes.append("the audit predicted this cell would not fit in memory and did not run it; "
                             "the script runs it for real")
            if notes:
                finding["repro_reason"] = "; ".join(notes)
            break
        else:
            finding["repro_reason"] = reason or ("no standalone script: " + "; ".join(dict.fromkeys(tried)))
    (run_dir / FINDINGS_FILE).write_text(json.dumps(findings, indent=1, default=_json_default) + "\n")
    return findings


def _first_per_variant_and_scenario(cells: list[dict]) -> list[dict]:
    seen: set = set()
    out = []
    for cell in cells:
        key = (cell.get("variant"), cell.get("scenario"))
        if key not in seen:
            seen.add(key)
            out.append(cell)
    return out


def _no_script_reason(finding: dict) -> str | None:
    """Findings with nothing to reproduce, or a check this module does not know."""
    if finding["check"] not in WORST:
        return f"no reproduction recipe for check {finding['check']!r}"
    if finding["check"] == "fp16_overflow" and finding["severity"] == "info":
        return "no variant overflowed in fp16: nothing to reproduce"
    return None
