"""Why QLoRA with compiled blocks stays refused (issue 25 item 2): validation/compile/probe_nf4_compile.json, torchtune
0.6.1's NF4 LoRALinear compiled by torch 2.13, and the refusal that cites it. No torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.types import HardwareNode

ROOT = Path(__file__).resolve().parents[2]
RUNS = json.loads((ROOT / "validation/compile/probe_nf4_compile.json").read_text(encoding="utf-8"))["runs"]


def test_compiled_nf4_linear_multiplies_by_the_transpose():
    """Eager, the input's gradient is g W (bf16 rounding: < 0.011); compiled, it is g W^T on the square weight and
    a shape error on the 256 -> 1,024 one, with torchao 0.13.0 and 0.17.0 alike."""
    assert set(RUNS) == {"0.13.0", "0.17.0"}
    for run in RUNS.values():
        assert run["torch"].startswith("2.13.0") and run["torchtune"].startswith("0.6.1")
        square, wide = run["linears"]
        assert (square["in"], square["out"], wide["in"], wide["out"]) == (256, 256, 256, 1024)
        assert square["eager"]["max_diff_vs_gW"] < 0.011 < 1 < square["eager"]["max_diff_vs_gWT"]
        assert square["compiled"]["max_diff_vs_gWT"] < 0.011 < 1 < square["compiled"]["max_diff_vs_gW"]
        assert wide["eager"]["max_diff_vs_gW"] < 0.011
        assert "must have same reduction dim" in wide["compiled"]["error"]


def test_qlora_with_compiled_blocks_is_refused_citing_the_probe():
    with pytest.raises(NotModelledError, match="probe_nf4_compile.py") as err:
        TrainingMemoryModel().solve("llama3-8b", HardwareNode(name="big", memory_capacity=2**40), 2, 2048, "bf16",
                                    "adamw", "full", profile="measured", regime="bf16", compile="blocks",
                                    lora=LoRAConfig(rank=8, quantization="nf4", double_quant=True,
                                                    adapter_dtype="base"))
    assert err.value.parameter == "lora"
