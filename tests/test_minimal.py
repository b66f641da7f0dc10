"""Minimal scripts (audit/repro/minimal.py): the shrunk cell of a finding about torch's code, as a short
script in torch's own API that exits 1 while the defect shows and 0 once it is gone."""
from __future__ import annotations

import ast

import pytest

from audit.core.grid import Case
from audit.repro.minimal import CALLS, INPUTS, MAX_LINES, VERDICTS, minimal_script, script_name, unsupported

CHECKS = (*VERDICTS, "cell_failed")


def _script(case: Case, check: str) -> str:
    return minimal_script(case, check, title=f"{case.variant}: {check}", versions="torch (test)")


def _pairs():
    """Every registered call with every scenario of its input form, causal and not, GQA where dense."""
    for variant, call in CALLS.items():
        for scenario, draw in INPUTS.items():
            if draw.pools or call.needs != "paged":
                for causal in (False, True):
                    yield Case(variant, "cpu", "fp32", 8, 32, 3, 4, causal, scenario, kv_heads=2)
                yield Case(variant, "cpu", "fp32", 8, 32, 1, 2, True, scenario, d_v=4)     # latent: values' own size


@pytest.mark.parametrize("check", CHECKS)
def test_every_script_is_short_imports_only_torch_and_parses(check):
    written = 0
    for case in _pairs():
        if unsupported(case, check):
            continue
        text = _script(case, check)
        assert len(text.splitlines()) <= MAX_LINES, (case.id, check)
        tree = ast.parse(text)
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        library = {"transformers"} if case.variant.startswith("hf:") else set()    # the variant's own library
        assert imported <= {"os", "sys", "torch"} | library, imported
        assert ("attention64" in text) == (check != "cell_failed")     # a call that raises has nothing to compare
        assert "sys.exit(1 if defect else 0)" in text
        assert ("DV = " in text) == (case.d_v is not None)
        written += 1
    assert written


def test_what_cannot_be_written_says_why():
    assert "no call of eager" in unsupported(Case("eager", "cpu", "fp32", 8, 32, 1, 2, False, "normal"), "nonfinite")
    assert "scenario sinks" in unsupported(Case("sdpa", "cpu", "fp32", 8, 32, 1, 2, False, "sinks"), "nonfinite")
    assert "check referee" in unsupported(Case("sdpa", "cpu", "fp32", 8, 32, 1, 2, False, "normal"), "referee")
    assert "returns no lse" in unsupported(Case("sdpa", "cpu", "fp32", 8, 32, 1, 2, False, "fully_masked_bool"),
                                           "lse_masked_rows")
    assert "takes a paged cache" in unsupported(Case("paged_flex", "cpu", "fp32", 8, 32, 1, 2, False, "normal"),
                                                "nonfinite")
    assert script_name("nonfinite", "hf:flex_attention") == "nonfinite-hf_flex_attention-minimal.py"


def test_a_script_is_kept_where_it_exits_1_and_removed_with_the_reason_where_it_does_not(tmp_path):
    """torch 2.13's CPU flash op returns an lse of 0 on rows that see no key (a merge needs -inf): its
    script exits 1 and is kept, its report draft beside it; SDPA's output on normal inputs is finite, so
    a nonfinite script for it exits 0 and is removed, the line saying why. Both verdicts read the
    script's own float64 attention."""
    from audit.execute.shrink import write_minimal
    from audit.measure.machine.environment import environment
    env = environment()
    empty = Case("flash_op", "cpu", "fp32", 8, 16, 1, 1, False, "fully_masked_bool")
    kept = write_minimal(tmp_path, empty, {"check": "lse_masked_rows", "variant": "flash_op", "from": "x"}, env)
    assert kept["minimal"] == "repro/lse_masked_rows-flash_op-minimal.py", kept
    assert (tmp_path / kept["minimal"]).is_file() and (tmp_path / kept["minimal_report"]).is_file()
    assert "rows that see no key: [0.0]" in kept["minimal_says"]
    clean = Case("sdpa", "cpu", "fp32", 8, 16, 1, 1, True, "normal")
    gone = write_minimal(tmp_path, clean, {"check": "nonfinite", "variant": "sdpa", "from": "y"}, env)
    assert "exits 0 here, not 1" in gone["minimal_reason"] and "0 of " in gone["minimal_reason"]
    assert not (tmp_path / "repro" / "nonfinite-sdpa-minimal.py").exists()


def test_a_gradient_budget_script_exits_1_on_the_cpu_flash_backward_and_0_on_the_same_math(tmp_path):
    """A grad_error_budget finding of SDPA (its CPU flash backward recomputes P from the log-sum-exp: at
    logits 64x those of N(0, 1) inputs dv carries tens of times the error of the same math written out in
    fp32) gets a script that exits 1, the gradients' ratios printed; with the math backend, the same math,
    the script exits 0 and is removed. The budget is the audit's for the dtype, written into the script."""
    from audit.execute.shrink import write_minimal
    from audit.measure.machine.environment import environment
    env = environment()
    large = Case("sdpa", "cpu", "fp32", 8, 16, 1, 1, True, "scaled_x64")
    kept = write_minimal(tmp_path, large,
                         {"check": "grad_error_budget", "variant": "sdpa", "from": "x"}, env)
    assert kept["minimal"] == "repro/grad_error_budget-sdpa-minimal.py", kept
    text = (tmp_path / kept["minimal"]).read_text()
    assert "FACTOR, ATOL = 2.0, 1e-06" in text and "q = q * 64" in text
    assert kept["minimal_says"].startswith("dv: RMSE") and "the same math's in torch.float32" in kept["minimal_says"]
    same_math = Case("sdpa_math", "cpu", "fp32", 8, 16, 1, 1, True, "scaled_x64")
    gone = write_minimal(tmp_path, same_math, {"check": "grad_error_budget", "variant": "sdpa_math", "from": "y"}, env)
    assert "exits 0 here, not 1" in gone["minimal_reason"], gone
    assert not (tmp_path / "repro" / "grad_error_budget-sdpa_math-minimal.py").exists()
    assert "has no backward on the CPU" in unsupported(Case("paged_flex", "cpu", "fp32", 8, 32, 1, 2, False, "paged"),
                                            "grad_error_budget")


def test_a_report_draft_has_a_title_naming_the_api_the_script_and_expected_against_actual():
    from audit.repro.minimal import title, upstream_draft
    case = Case("flash_op", "cpu", "fp32", 8, 16, 1, 1, False, "fully_masked_bool")
    heading = title(case, "lse_masked_rows")
    assert heading.startswith("torch.ops.aten._scaled_dot_product_flash_attention_for_cpu returns a finite lse")
    script = _script(case, "lse_masked_rows")
    draft = upstream_draft(script, name="x.py", title=heading, versions="torch 2.13", found="attn-audit",
                           check="lse_masked_rows", argument=None, actual="lse [0.0]", elsewhere=None)
    assert draft.startswith(f"# {heading}\n") and script.strip() in draft
    assert draft.index("## Expected") < draft.index("-inf on rows that see no key") < draft.index("## Actual")
    assert "## What other kernels do" not in draft
    kv = title(Case("flash_op", "cpu", "fp32", 8, 16, 1, 4, False, "normal"), "argument_ignored", "kv_heads")
    assert "key/value heads that do not divide" in kv


def test_transformers_flex_path_is_tried_in_torch_alone_first():
    """hf:flex_attention's minimal script is first written with torch's create_block_mask(_compile=True) and
    compiled flex_attention alone (what transformers calls), then with transformers' own functions."""
    from audit.repro.minimal import calls_to_try
    assert calls_to_try("hf:flex_attention") == ("flex_compiled_mask", "hf:flex_attention")
    assert calls_to_try("sdpa") == ("sdpa",) and calls_to_try("faults:raises") == ("faults:raises",)
    decode = Case("hf:flex_attention", "cpu", "fp32", 8, 128, 1, 1, True, "paged")
    alone = minimal_script(decode, "cell_failed", title="t", versions="v", call_name="flex_compiled_mask")
    assert "import transformers" not in alone and "from transformers" not in alone and "_compile=True" in alone and "used = torch.tensor([96])" in alone
    assert "k_pool" not in alone                                   # a dense call: no paged cache drawn
    assert "flex_attention_forward(module" in _script(decode, "cell_failed")
    assert "masks more" in unsupported(Case("hf:flex_attention", "cpu", "fp32", 8, 32, 1, 2, False,
                                            "fully_masked_bool"), "cell_failed")


def test_rebuilding_the_reports_scripts_keeps_the_minimal_ones(tmp_path):
    """The report rewrites DIR/repro's long scripts; the minimal ones the shrinking wrote stay (a cpu-preset
    run lost paged_flex's to its own report before this)."""
    from audit.repro.scripts import write_repro_scripts
    repro = tmp_path / "repro"
    repro.mkdir()
    (repro / "nonfinite-paged_flex-minimal.py").write_text("import sys\nsys.exit(1)\n")
    (repro / "nonfinite-paged_flex.py").write_text("stale\n")
    (tmp_path / "records.jsonl").write_text("")
    write_repro_scripts(tmp_path, [], records=[])
    assert sorted(p.name for p in repro.iterdir()) == ["nonfinite-paged_flex-minimal.py"]


def test_a_failure_on_a_recompile_calls_first_as_the_cell_before_it():
    """A cell that fails only after another cell of its variant ran in the process (a recompile: transformers'
    packed masks at T=512 after T=128) gets a script that calls first as that cell, then as the failing one:
    the call once, as a function of the cell drawn last; within 60 lines with transformers' call too."""
    failing = Case("hf:flex_attention", "cpu", "fp32", 32, 512, 2, 2, True, "packed")
    earlier = Case("hf:flex_attention", "cpu", "fp32", 32, 128, 2, 2, True, "packed")
    for call_name in ("flex_compiled_mask", "hf:flex_attention"):
        text = minimal_script(failing, "cell_failed", title="t", versions="v", call_name=call_name, before=(earlier,))
        assert len(text.splitlines()) <= MAX_LINES, (call_name, len(text.splitlines()))
        ast.parse(text)
        assert text.count("def attend():") == 1 and text.count("attend()") == 3          # defined, then two calls
        assert text.index("D = 2, 2, 2, 128, 128, 32") < text.index("first, at T=") < text.index("D = 2, 2, 2, 512, 512")
        assert earlier.id in text and text.count("torch.manual_seed(0)") == 1
    alone = minimal_script(failing, "cell_failed", title="t", versions="v", call_name="flex_compiled_mask")
    assert "def attend" not in alone and "first, at T=" not in alone


def test_the_packed_draw_gives_each_query_the_keys_of_its_own_document():
    """The packed scenario drawn in plain torch: `rows` (B, 1, T, T) is the audit's own document mask."""
    import torch

    from audit.workload.inputs import make_inputs
    case = Case("flex_compiled_mask", "cpu", "fp32", 8, 32, 2, 2, False, "packed")
    text = minimal_script(case, "nonfinite", title="t", versions="v")
    drawing = text[text.index("torch.manual_seed(0)"):text.index("ref = attention64")]
    found: dict = {}
    exec(compile("import torch\n" + drawing, "draw", "exec"), found)
    ours = make_inputs(case)
    assert torch.equal(found["rows"], ours.mask.expand_as(found["rows"])) and torch.equal(found["keep"], found["rows"])
    assert not found["rows"][1, 0, -1].any()                # the last row ends in padding no document owns


def test_an_lse_gradient_script_exits_1_where_the_lse_carries_none_and_0_where_it_is_right(tmp_path):
    """torch 2.13's CPU flash op marks its lse non-differentiable: a loss on it gets no dq or dk, so its
    lse_grad_budget script exits 1, saying so. The same script with the lse written out in fp32 (the
    call's line replaced, gradients kept) exits 0."""
    import subprocess
    import sys
    case = Case("flash_op", "cpu", "fp32", 8, 16, 1, 1, True, "normal")
    text = _script(case, "lse_grad_budget")
    assert len(text.splitlines()) <= MAX_LINES and "FACTOR, ATOL = 2.0, 1e-06" in text
    call = next(line for line in text.splitlines() if "_scaled_dot_product_flash_attention_for_cpu(" in line)
    written = ("scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~keep, float('-inf'))\n"
               "out, lse = None, torch.logsumexp(scores, -1)")
    for name, body, code, says in (("flash_op.py", text, 1, "the lse carries a gradient: False"),
                                   ("written_out.py", text.replace(call, written), 0, "the lse carries a gradient: True")):
        (tmp_path / name).write_text(body)
        done = subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == code, done.stdout + done.stderr
        assert says in done.stdout


def test_a_merge_script_exits_1_where_a_half_leaves_rows_without_keys_and_0_where_none_does(tmp_path):
    """The CPU flash op's lse is 0 on rows that see no key: split in two halves of the keys, a causal cell's
    first rows see none of the second half, so its halves merge wrong (lse_error_budget's script exits 1);
    without the causal mask every row sees keys in both halves and the merge is right (exit 0)."""
    import subprocess
    import sys
    for causal, code in ((True, 1), (False, 0)):
        case = Case("flash_op", "cpu", "fp32", 8, 16, 1, 1, causal, "normal")
        text = _script(case, "lse_error_budget")
        assert len(text.splitlines()) <= MAX_LINES and "def attend():" in text
        name = f"causal_{causal}.py"
        (tmp_path / name).write_text(text)
        done = subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == code, done.stdout + done.stderr
        assert "its halves merged: RMSE" in done.stdout


def test_an_output_budget_script_exits_0_on_sdpa_and_1_on_the_same_call_unscaled(tmp_path):
    """error_budget's script: SDPA's output against float64, within 2x the error of the same math written out
    in the same dtype (exit 0); the call given scale=1.0 instead of 1/sqrt(d) (a kernel's missing scale) is
    far outside it (exit 1)."""
    import subprocess
    import sys
    text = _script(Case("sdpa", "cpu", "bf16", 8, 16, 1, 1, True, "normal"), "error_budget")
    assert len(text.splitlines()) <= MAX_LINES and "FACTOR, ATOL = 2.0, " in text
    call = "attn_mask=keep, enable_gqa"
    assert call in text
    for name, body, code in (("sdpa.py", text, 0), ("unscaled.py", text.replace(call, "attn_mask=keep, scale=1.0, enable_gqa"), 1)):
        (tmp_path / name).write_text(body)
        done = subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == code, done.stdout + done.stderr
        assert "the same math's in torch.bfloat16" in done.stdout
