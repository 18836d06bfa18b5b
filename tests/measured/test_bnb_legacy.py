"""bitsandbytes before 0.43.2 as a registered 4-bit implementation (measured/quant_bnb_legacy.py; issue 25 item 3):
its MatMul4Bit kept each linear's input (``ctx.tensors = (A, B)``, bitsandbytes 0.43.1 autograd/_functions.py:516;
removed by 9e753741, #1270, released in 0.43.2). Derived, not measured. Hand-derived bytes on small shapes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlsysim_core import scenario
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.manager import get_plugin_manager
from mlsysim_plugins.measured import quant_bnb_legacy as legacy
from mlsysim_plugins.measured.quantizations import QuantImplementation, registered


def test_registered_through_the_hook_with_its_declaration():
    impls = registered(get_plugin_manager().registry)
    impl = impls["bitsandbytes-0.43.1"]
    assert isinstance(impl, QuantImplementation) and impl.saves_input and impl.input_lifetime == "graph"
    assert impl.kinds == ("nf4", "fp4") and "derived, not measured" in impl.description
    assert "9e753741" in impl.source and not getattr(impls["bitsandbytes"], "saves_input", False)


def test_stored_is_bitsandbytes_quantize_4bit_layout_by_hand():
    """A 64 x 64 nf4 weight: 4,096 codes at 2 a byte = 2,048 B; 64 blocks of 64 -> 64 fp32 absmax = 256 B and the
    16-entry fp32 code = 64 B. Double quantization: 64 uint8 absmax + 1 nested fp32 absmax (4 B) + the fp32
    offset (4 B) + the 256-entry fp32 dynamic code (1,024 B) + the 4-bit code (64 B)."""
    plain = LoRAConfig(rank=8, quantization="nf4", quant_blocksize=64)
    assert legacy.LEGACY.stored(64 * 64, 64, plain, 2) == (2048, 256 + 64)
    double = LoRAConfig(rank=8, quantization="nf4", quant_blocksize=64, double_quant=True)
    assert legacy.LEGACY.stored(64 * 64, 64, double, 2) == (2048, 64 + 4 + 4 + 1024 + 64)


def test_held_inputs_of_a_small_layer_by_hand():
    """hidden 64, q 64, kv 32, ffn 176; 2 sequences of 16 tokens (T = 32) in bf16: q/k/v share the norm output
    (32 x 64 x 2 = 4,096 B), o_proj the attention output (4,096 B), gate/up the post-attention norm output
    (4,096 B), down_proj the product (32 x 176 x 2 = 11,264 B): 23,552 B a layer. Inputs in another dtype: each
    linear its own cast (q, k, v, gate, up: 5 x 4,096) + o 4,096 + down 11,264 = 35,840 B."""
    shape = SimpleNamespace(hidden=64, q_dim=64, kv_dim=32, ffn=176)
    held = legacy.held_inputs(shape, 32, 2)
    assert [n for _, n in held] == [4096, 4096, 4096, 11264] and sum(n for _, n in held) == 23_552
    assert sum(n for _, n in legacy.held_inputs(shape, 32, 2, inputs_in_compute_dtype=False)) == 35_840


def test_selected_it_is_refused_naming_the_missing_reading():
    """The LoRA layer walk does not read saves_input: refused, never priced as bitsandbytes >= 0.43.2."""
    with pytest.raises(NotModelledError) as info:
        scenario.estimate("meta-llama/Llama-3.2-1B", "h100", 1, 256, profile="measured", precision="bf16",
                          regime="bf16", lora={"rank": 8, "quantization": "nf4",
                                               "quant_implementation": "bitsandbytes-0.43.1"})
    assert (info.value.parameter, info.value.value) == ("lora.quant_implementation", "bitsandbytes-0.43.1")
    assert "declares saves_input" in info.value.detail and "does not read that declaration yet" in info.value.detail
