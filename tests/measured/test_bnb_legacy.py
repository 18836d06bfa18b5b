"""bitsandbytes before 0.43.2 as a registered 4-bit implementation (measured/quant_bnb_legacy.py; issue 25 item 3):
its MatMul4Bit kept each linear's input (``ctx.tensors = (A, B)``, bitsandbytes 0.43.1 autograd/_functions.py:516;
removed by 9e753741, #1270, released in 0.43.2). Derived, not measured. Hand-derived bytes on small shapes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlsysim_core import TrainingMemoryModel, scenario
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.hf import from_hf_config
from mlsysim_core.manager import get_plugin_manager
from mlsysim_core.types import HardwareNode
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


TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 176,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "tie_word_embeddings": False, "head_dim": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "hidden_act": "silu"}


def _solve(impl, checkpointing):
    return TrainingMemoryModel().solve(
        from_hf_config(TINY, name="tiny"), HardwareNode(name="unbounded", memory_capacity=2**60), 2, 16, "bf16",
        "adamw", checkpointing, profile="measured", regime="bf16", runtime_overheads=False,
        lora=LoRAConfig(rank=8, target_modules=("q_proj", "v_proj"), adapter_dtype="base", quantization="nf4",
                        quant_implementation=impl))


def _terms(r):
    return {t.label: t for t in r.terms}


def test_the_walk_reads_saves_input_checkpointed_by_hand():
    """The small layer of test_held_inputs_of_a_small_layer_by_hand (2 layers, T = 32, bf16, q/v adapted in bf16),
    under full checkpointing: every layer keeps its 4-bit linears' inputs past the checkpoint, alive until the
    backward ends. Layer 0's input needs no gradient (q/k/v keep nothing: ctx.needs_input_grad); o_proj's does (q is
    adapted): 4,096 + 4,096 + 11,264 = 19,456 B; layer 1 23,552 B: 43,008 B in the forward and backward and again at
    the backward's end. The recompute's own copies (the layer's saved set where nothing keeps them: gate/up's input
    4,096 B and down's 11,264 B) in the bottom layer's recompute and the top layer's backward: + 15,360 B each."""
    new, old = _terms(_solve("bitsandbytes-0.43.1", "full")), _terms(_solve("bitsandbytes", "full"))
    held = new["checkpointed layers: inputs the 4-bit matmuls keep (ctx.tensors)"]
    end = new["inputs the 4-bit matmuls keep (ctx.tensors), at the backward's end"]
    assert (held.nbytes, held.phases) == (19_456 + 23_552, ("forward", "backward"))
    assert (end.nbytes, end.phases) == (43_008, ("backward_end",))
    for label in ("recompute working set (one layer)",
                  "the top layer's backward over the 4-bit base (checkpointed), beyond the loss's moment"):
        assert new[label].nbytes - old[label].nbytes == 15_360, label
    assert not any("4-bit matmuls keep" in label for label in old)


def test_the_walk_reads_saves_input_without_checkpointing_by_hand():
    """No checkpointing: a layer's held inputs are among its saved tensors where nothing else keeps them. q/k/v's
    input is q_proj's adapter input (the bf16 norm output itself: one tensor), o_proj's the attention kernel's saved
    output; gate/up's input (4,096 B) and down's (11,264 B) are kept by the 4-bit matmuls alone: + 15,360 B a layer
    (both layers: layer 0's o/gate/up/down inputs need a gradient). At the backward's end all of them are still alive
    (the graph not freed yet): 43,008 B."""
    new, old = _terms(_solve("bitsandbytes-0.43.1", "none")), _terms(_solve("bitsandbytes", "none"))
    label = "decoder layers: saved for backward (LoRA)"
    assert new[label].nbytes - old[label].nbytes == 2 * 15_360
    assert new["inputs the 4-bit matmuls keep (ctx.tensors), at the backward's end"].nbytes == 43_008
    assert "down_proj input (kept by the 4-bit matmul) 352" in new[label].formula


def test_selected_it_is_priced_not_refused():
    """Selected, it answers (no refusal): the walk reads saves_input; the note says derived, not measured."""
    r = scenario.estimate("meta-llama/Llama-3.2-1B", "h100", 1, 256, profile="measured", precision="bf16",
                          regime="bf16", activation_checkpointing="full",
                          lora={"rank": 8, "quantization": "nf4", "quant_implementation": "bitsandbytes-0.43.1"})
    base = scenario.estimate("meta-llama/Llama-3.2-1B", "h100", 1, 256, profile="measured", precision="bf16",
                             regime="bf16", activation_checkpointing="full",
                             lora={"rank": 8, "quantization": "nf4", "quant_implementation": "bitsandbytes"})
    # 16 layers: q/k/v (the attention adapted by default) and o 2,048 x 2 B each, gate/up 2,048 x 2, down 8,192 x 2
    # per token, T = 256; layer 0 without q/k/v's
    per = (2 * 2048 + 2 * 2048 + 2 * 8192) * 256
    held = next(t for t in r.terms if t.label.startswith("checkpointed layers: inputs the 4-bit"))
    assert held.nbytes == per + 15 * (per + 2048 * 2 * 256)
    assert r.total_memory > base.total_memory
    assert "derived, not measured" in legacy.LEGACY.description


def test_partly_checkpointed_the_kept_layers_keep_theirs_among_the_saved():
    """4 layers, 2 checkpointed (the top two): those keep their inputs past the checkpoint (2 x 23,552 B); at the
    backward's end every layer's are alive (19,456 + 3 x 23,552 B)."""
    r = TrainingMemoryModel().solve(
        from_hf_config({**TINY, "num_hidden_layers": 4}, name="tiny4"),
        HardwareNode(name="unbounded", memory_capacity=2**60), 2, 16, "bf16", "adamw", "full", profile="measured",
        regime="bf16", runtime_overheads=False, checkpointed_layers=2,
        lora=LoRAConfig(rank=8, target_modules=("q_proj", "v_proj"), adapter_dtype="base", quantization="nf4",
                        quant_implementation="bitsandbytes-0.43.1"))
    t = _terms(r)
    assert t["checkpointed layers: inputs the 4-bit matmuls keep (ctx.tensors)"].nbytes == 2 * 23_552
    assert t["inputs the 4-bit matmuls keep (ctx.tensors), at the backward's end"].nbytes == 19_456 + 3 * 23_552


def test_a_family_derived_from_its_description_refuses_it():
    """The derived layer (generic_layer) does not know which tensor each linear's matmul would keep: refused, naming
    the field and the value."""
    qwen2 = {**TINY, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    with pytest.raises(NotModelledError, match="declares saves_input") as e:
        TrainingMemoryModel().solve(
            from_hf_config(qwen2, name="qwen2-tiny"), HardwareNode(name="unbounded", memory_capacity=2**60), 2, 16,
            "bf16", "adamw", "full", profile="measured", regime="bf16", runtime_overheads=False,
            lora=LoRAConfig(rank=8, quantization="nf4", quant_implementation="bitsandbytes-0.43.1"))
    assert (e.value.parameter, e.value.value) == ("lora.quant_implementation", "bitsandbytes-0.43.1")
