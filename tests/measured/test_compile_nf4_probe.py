"""Why torch 2.13 miscompiled torchtune's QLoRA linear in the probe, and why the recipes' QLoRA compiles right
(issue 25 item 2): validation/compile/probe_nf4_compile.json, torchtune 0.6.1's NF4 LoRALinear compiled by torch
2.13 with its base requiring grad (as LoRALinear registers it) and frozen (as the recipes' set_trainable_params
leaves it before compile_model). No torch."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = json.loads((ROOT / "validation/compile/probe_nf4_compile.json").read_text(encoding="utf-8"))["runs"]


def _linears(run, requires_grad):
    return [lin for lin in run["linears"] if lin.get("base_requires_grad", True) is requires_grad]


def test_compiled_nf4_linear_multiplies_by_the_transpose_when_its_base_requires_grad():
    """Eager, the input's gradient is g W (bf16 rounding: < 0.011); compiled with the NF4 base requiring grad, it
    is g W^T on the square weight and a shape error on the 256 -> 1,024 one, with torchao 0.13.0 and 0.17.0 alike
    (0.17.0's record predates the frozen case)."""
    assert set(RUNS) == {"0.13.0", "0.17.0"}
    for run in RUNS.values():
        assert run["torch"].startswith("2.13.0") and run["torchtune"].startswith("0.6.1")
        square, wide = _linears(run, True)
        assert (square["in"], square["out"], wide["in"], wide["out"]) == (256, 256, 256, 1024)
        assert square["eager"]["max_diff_vs_gW"] < 0.011 < 1 < square["eager"]["max_diff_vs_gWT"]
        assert square["compiled"]["max_diff_vs_gWT"] < 0.011 < 1 < square["compiled"]["max_diff_vs_gW"]
        assert wide["eager"]["max_diff_vs_gW"] < 0.011
        assert "must have same reduction dim" in wide["compiled"]["error"]


def test_compiled_nf4_linear_is_right_with_its_base_frozen_as_the_recipes_run_it():
    """The base frozen before compiling (the recipes' order): the compiled input gradient is g W for both shapes,
    within bf16 rounding of eager's (max |grad| 2.2 and 3.4: differences < 0.015), and not g W^T."""
    square, wide = _linears(RUNS["0.13.0"], False)
    assert (square["in"], square["out"], wide["in"], wide["out"]) == (256, 256, 256, 1024)
    assert square["compiled"]["max_diff_vs_gW"] < 0.011 < 1 < square["compiled"]["max_diff_vs_gWT"]
    assert wide["compiled"]["max_diff_vs_gW"] < 0.015
    assert "error" not in wide["compiled"]


def test_the_mechanism_traced():
    """Requiring grad, the backward's weight.to(dtype) misses NF4Tensor's dequantizing override (6 calls, not 7) and
    the NF4Tensor reaches torchao's aten.mm handler (a @ b^T) with the (4, 512) gradient and the (512, 256) weight,
    which fails; frozen, every .to dequantizes and no NF4 mm runs."""
    wrong, right = RUNS["0.13.0"]["trace_aot_eager"]
    assert wrong["base_requires_grad"] and not right["base_requires_grad"]
    assert (wrong["nf4_to_calls"], right["nf4_to_calls"]) == (6, 7)
    assert wrong["nf4_mm_calls"] == [[[4, 512], [512, 256]]] and right["nf4_mm_calls"] == []
    assert wrong["error"].startswith("BackendCompilerFailed") and right["error"] is None
