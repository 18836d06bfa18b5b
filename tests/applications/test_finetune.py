"""LoRA / QLoRA counts (mlsysim_core.finetune).

Every expected number is derived by hand in the test. The ones marked RECORDED were also
measured once (not at test time: this file imports neither torch, peft nor bitsandbytes)
with torch 2.13.0 (CPU), transformers 5.23.0, peft 0.21.2 and bitsandbytes 0.50.2:

* LoRA: ``get_peft_model(model, LoraConfig(r=..., target_modules=...))
  .get_nb_trainable_parameters()`` on ``AutoModelForCausalLM.from_config(...)`` (Llama-2-7B
  and Llama-3-8B built on the meta device; tiny Llama and GPT-2 with random weights), and
  on a hand-built per-expert-``nn.Linear`` MoE (the transformers 4.x Qwen2-MoE layout).
* Quantization: the tiny Llama and GPT-2 saved in bf16 and reloaded with
  ``from_pretrained(..., quantization_config=BitsAndBytesConfig(...), device_map="cpu")``;
  the bytes of every ``Linear4bit``'s packed weight and ``QuantState`` tensors (absmax,
  code, nested absmax, nested code, offset) and every ``Linear8bitLt``'s int8 weight and
  ``SCB`` were summed; and ``bnb.functional.quantize_4bit`` on one 4096x4096 bf16 tensor.
"""

import math

import pytest

from mlsysim_core import InvalidInputError, SparseTransformerWorkload, TransformerWorkload
from mlsysim_core.catalog import get_model
from mlsysim_core.errors import InvalidInputTypeError, NotModelledError
from mlsysim_core.finetune import FineTuneCounts, LoRAConfig, lora_counts

LLAMA2_7B = TransformerWorkload(name="Llama-2-7B", parameters=6_738_415_616, layers=32,
                                hidden_dim=4096, heads=32, kv_heads=32, ffn_dim=11008,
                                gated_mlp=True, vocab_size=32000, tied_embeddings=False,
                                architecture="llama")
LLAMA3_8B = TransformerWorkload(name="Llama-3-8B", parameters=8_030_261_248, layers=32,
                                hidden_dim=4096, heads=32, kv_heads=8, ffn_dim=14336,
                                gated_mlp=True, vocab_size=128256, architecture="llama")
# the tiny models of the RECORDED runs (their parameters are from_config's exact totals)
TINY_LLAMA = TransformerWorkload(name="tiny-llama", parameters=2_590_464, layers=3,
                                 hidden_dim=256, heads=8, kv_heads=2, ffn_dim=688,
                                 gated_mlp=True, vocab_size=1000, tied_embeddings=False,
                                 architecture="llama")
TINY_GPT2 = TransformerWorkload(name="tiny-gpt2", parameters=1_551_552, layers=3, hidden_dim=192,
                                heads=6, ffn_dim=768, gated_mlp=False, vocab_size=1000,
                                tied_embeddings=True, architecture="gpt2")
TINY_MOE = SparseTransformerWorkload(
    name="tiny-moe", parameters=651_776, active_parameters=651_776, layers=2, hidden_dim=128,
    heads=4, kv_heads=2, head_dim=32, ffn_dim=64, expert_ffn_dim=64, gated_mlp=True,
    vocab_size=1000, experts=4, active_experts_per_token=2, shared_experts=2,
    architecture="qwen2_moe")


def lora(model, **kw):
    return lora_counts(model, LoRAConfig(**kw))


def lin(r, i, o):
    """peft's LoRA on one in x out linear: A is r x in, B is out x r."""
    return r * (i + o)


# --- LoRA trainable counts --------------------------------------------------------------------

def test_llama2_7b_q_v():
    # the well-known peft figure: r=8 on q_proj, v_proj -> 4,194,304 (RECORDED, with
    # get_nb_trainable_parameters() = (4194304, 6742609920))
    c = lora(LLAMA2_7B, rank=8, target_modules=("q_proj", "v_proj"))
    assert c.trainable_parameters == 2 * 32 * 8 * (4096 + 4096) == 4_194_304
    assert c.frozen_parameters == 6_738_415_616
    assert c.total_parameters == 6_742_609_920
    assert c.adapted_linear_parameters == 2 * 32 * 4096 * 4096
    assert c.per_module == (("q_proj", 4096, 4096, 65536), ("v_proj", 4096, 4096, 65536))
    assert c.quantized_parameters == c.quantized_weight_bytes == c.quantization_constant_bytes == 0
    # r=16 doubles it (RECORDED 8,388,608)
    assert lora(LLAMA2_7B, rank=16, target_modules=("q_proj", "v_proj")).trainable_parameters \
        == 8_388_608


def test_llama2_7b_all_linear_and_attention():
    per_layer = (4 * lin(16, 4096, 4096) + 2 * lin(16, 4096, 11008) + lin(16, 11008, 4096))
    c = lora(LLAMA2_7B, rank=16, target_modules="all-linear")
    assert c.trainable_parameters == 32 * per_layer == 39_976_960          # RECORDED
    assert c.total_parameters == 6_778_392_576                             # RECORDED
    assert [m for m, *_ in c.per_module] == ["q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"]
    assert c.adapted_linear_parameters == 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    # the default targets: q, k, v, o
    assert lora(LLAMA2_7B).trainable_parameters == 16_777_216              # RECORDED
    assert lora(LLAMA2_7B, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]) \
        == lora(LLAMA2_7B)                                                   # a list works too


def test_gqa_k_v_shapes():
    c = lora(LLAMA3_8B, rank=16)
    kv_out = 8 * (4096 // 32)    # kv_heads * head_dim = 1024
    assert dict((m, (i, o)) for m, i, o, _ in c.per_module) == {
        "q_proj": (4096, 4096), "k_proj": (4096, kv_out), "v_proj": (4096, kv_out),
        "o_proj": (4096, 4096)}
    assert c.trainable_parameters == 32 * (2 * lin(16, 4096, 4096) + 2 * lin(16, 4096, 1024)) \
        == 13_631_488                                                        # RECORDED
    assert lora(LLAMA3_8B, rank=8, target_modules=("q_proj", "v_proj")).trainable_parameters \
        == 3_407_872                                                         # RECORDED
    assert lora(LLAMA3_8B, rank=16, target_modules="all-linear").trainable_parameters \
        == 41_943_040                                                        # RECORDED
    # an explicit head_dim wider than hidden / heads (Gemma-style) sizes q/k/v/o by it
    wide = TransformerWorkload(name="w", parameters=10**9, layers=2, hidden_dim=2048, heads=8,
                               kv_heads=1, head_dim=256, ffn_dim=4096, gated_mlp=True)
    assert lora(wide, rank=1).per_module == (("q_proj", 2048, 2048, 4096),
                                             ("k_proj", 2048, 256, 2304),
                                             ("v_proj", 2048, 256, 2304),
                                             ("o_proj", 2048, 2048, 4096))


def test_tiny_models_recorded_against_peft():
    # (model, rank, targets) -> peft's (trainable, all params), RECORDED
    cases = [
        (TINY_LLAMA, 8, ("q_proj", "v_proj"), (19_968, 2_610_432)),
        (TINY_LLAMA, 16, ("q_proj", "k_proj", "v_proj", "o_proj"), (79_872, 2_670_336)),
        (TINY_LLAMA, 4, "all-linear", (53_952, 2_644_416)),
        (TINY_LLAMA, 8, ("gate_proj", "up_proj", "down_proj"), (67_968, 2_658_432)),
        (TINY_GPT2, 8, ("c_attn",), (18_432, 1_569_984)),
        (TINY_GPT2, 8, ("c_proj",), (32_256, 1_583_808)),
        (TINY_GPT2, 8, ("mlp.c_proj",), (23_040, 1_574_592)),
        (TINY_GPT2, 4, "all-linear", (36_864, 1_588_416)),
        (TINY_MOE, 8, ("gate_proj", "up_proj", "down_proj"), (49_152, 700_928)),
        (TINY_MOE, 8, ("router", "shared_expert_gate", "q_proj"), (8_272, 660_048)),
        (TINY_MOE, 4, "all-linear", (33_832, 685_608)),
    ]
    for model, r, targets, expected in cases:
        c = lora(model, rank=r, target_modules=targets)
        assert (c.trainable_parameters, c.total_parameters) == expected, (model.name, targets)
    # the same by hand: tiny Llama r=8 q,v (q 256->256, v 256->64), 3 layers
    assert 3 * (lin(8, 256, 256) + lin(8, 256, 64)) == 19_968
    # tiny GPT-2 r=8 "c_proj" hits attn.c_proj (192->192) AND mlp.c_proj (768->192)
    assert 3 * (lin(8, 192, 192) + lin(8, 768, 192)) == 32_256


def test_gpt2_names():
    gpt2 = get_model("openai-community/gpt2")
    c = lora(gpt2, rank=8, target_modules=("c_attn",))
    # the peft GPT-2 example's "trainable params: 294,912 || all params: 124,734,720"
    assert c.trainable_parameters == 12 * 8 * (768 + 3 * 768) == 294_912
    assert c.total_parameters == 124_734_720
    assert c.per_module == (("c_attn", 768, 2304, 24576),)
    both = lora(gpt2, rank=8, target_modules=("c_proj",))
    assert [m for m, *_ in both.per_module] == ["attn.c_proj", "mlp.c_proj"]
    assert lora(gpt2, rank=8, target_modules=("attn.c_proj",)).per_module == \
        (("attn.c_proj", 768, 768, 12288),)
    assert lora(gpt2, rank=8, target_modules=("c_fc", "mlp.c_proj")).per_module == \
        (("c_fc", 768, 3072, 30720), ("mlp.c_proj", 3072, 768, 30720))


def test_non_gated_mlp_has_up_and_down_only():
    plain = TransformerWorkload(name="plain", parameters=10**9, layers=4, hidden_dim=1024,
                                heads=16, ffn_dim=4096, gated_mlp=False)
    c = lora(plain, rank=4, target_modules="all-linear")
    assert [m for m, *_ in c.per_module] == ["q_proj", "k_proj", "v_proj", "o_proj",
                                             "up_proj", "down_proj"]
    assert c.trainable_parameters == 4 * (4 * lin(4, 1024, 1024) + 2 * lin(4, 1024, 4096))


def test_moe_mixtral():
    mixtral = get_model("mistralai/mixtral-8x7b-v0.1")   # 8 experts, ffn 14336, GQA 8 kv heads
    c = lora(mixtral, rank=16, target_modules="all-linear")
    per_layer = (2 * lin(16, 4096, 4096) + 2 * lin(16, 4096, 1024)     # q, o, k, v
                 + lin(16, 4096, 8)                                     # router
                 + 8 * (2 * lin(16, 4096, 14336) + lin(16, 14336, 4096)))
    assert c.trainable_parameters == 32 * per_layer == 242_225_152
    assert ("experts.gate_proj", 4096, 14336, 8 * lin(16, 4096, 14336)) in c.per_module
    mlp_only = lora(mixtral, rank=8, target_modules=("gate_proj", "up_proj", "down_proj"))
    assert mlp_only.trainable_parameters == 32 * 8 * 3 * lin(8, 4096, 14336)
    # every linear of the blocks holds all but the embeddings, lm_head and norms
    q = lora(mixtral, rank=8, target_modules=("q_proj",), quantization="nf4")
    linears = 32 * (4096 * (4096 + 1024 + 1024 + 4096) + 4096 * 8 + 8 * 3 * 4096 * 14336)
    assert q.quantized_parameters == linears == 46_440_382_464
    assert mixtral.parameters - linears == 2 * 32000 * 4096 + (2 * 32 + 1) * 4096


def test_moe_shared_expert_is_one_wider_mlp():
    # tiny Qwen2-MoE-style: 4 experts of 64, shared_experts=2 -> one shared MLP of width 128
    c = lora(TINY_MOE, rank=4, target_modules="all-linear")
    rows = {m: (i, o, n) for m, i, o, n in c.per_module}
    assert rows["router"] == (128, 4, lin(4, 128, 4))
    assert rows["experts.up_proj"] == (128, 64, 4 * lin(4, 128, 64))
    assert rows["shared_expert.up_proj"] == (128, 128, lin(4, 128, 128))
    assert rows["shared_expert_gate"] == (128, 1, lin(4, 128, 1))
    # another architecture has no shared_expert_gate
    other = SparseTransformerWorkload(**{**_fields(TINY_MOE), "architecture": None})
    assert "shared_expert_gate" not in {m for m, *_ in lora(other, target_modules="all-linear").per_module}


def _fields(model):
    import attrs
    return attrs.asdict(model)


# --- quantization bytes ---------------------------------------------------------------------

ONE = TransformerWorkload(name="one-4096-matrix", parameters=10**9, layers=1, hidden_dim=4096,
                          heads=32, ffn_dim=11008, gated_mlp=True)


def test_nf4_one_4096_square_by_hand():
    n = 4096 * 4096
    blocks = n // 64                                     # 262,144 absmax
    plain = 4 * blocks + 16 * 4                          # fp32 absmax + 16-entry fp32 quant_map
    nested = blocks + 4 * math.ceil(blocks / 256) + 4 + 256 * 4 + 16 * 4
    # RECORDED from bnb.functional.quantize_4bit(bf16 4096x4096, blocksize=64):
    # packed uint8 8,388,608 B; constants 1,048,640 B plain, 267,332 B with double quant
    assert (n // 2, plain, nested) == (8_388_608, 1_048_640, 267_332)
    from mlsysim_core.finetune import _tensor_bytes
    assert _tensor_bytes(n, 4096, LoRAConfig(quantization="nf4")) == (8_388_608, 1_048_640)
    assert _tensor_bytes(n, 4096, LoRAConfig(quantization="nf4", double_quant=True)) \
        == (8_388_608, 267_332)
    assert _tensor_bytes(n, 4096, LoRAConfig(quantization="fp4", double_quant=True,
                                             quant_blocksize=128)) == (8_388_608, 134_212)
    assert _tensor_bytes(n, 4096, LoRAConfig(quantization="int8")) == (n, 4 * 4096)
    # odd sizes: ceil(n / 2) packed bytes and a partial last block (RECORDED on 7x9, 1000x37)
    assert _tensor_bytes(63, 7, LoRAConfig(quantization="nf4")) == (32, 4 + 64)
    assert _tensor_bytes(37000, 1000, LoRAConfig(quantization="nf4", double_quant=True)) \
        == (18_500, 579 + 3 * 4 + 4 + 1024 + 64)


def test_quantized_model_totals():
    # one Llama-2-7B-shaped layer: 4 square matrices and 3 of 4096 x 11008
    sq, mlp = 4096 * 4096, 4096 * 11008
    c = lora(ONE, rank=8, target_modules=("q_proj", "v_proj"), quantization="nf4")
    assert c.quantized_parameters == 4 * sq + 3 * mlp
    assert c.quantized_weight_bytes == (4 * sq + 3 * mlp) // 2
    assert c.quantization_constant_bytes == 4 * (4 * sq // 64 + 64) + 3 * (4 * mlp // 64 + 64)
    assert c.trainable_parameters == 2 * lin(8, 4096, 4096)     # quantization leaves LoRA alone
    c8 = lora(ONE, rank=8, target_modules=("q_proj",), quantization="int8")
    assert c8.quantized_weight_bytes == 4 * sq + 3 * mlp
    # SCB: one fp32 per output row: q,k,v,o 4096 rows; gate, up 11008; down 4096
    assert c8.quantization_constant_bytes == 4 * (4 * 4096 + 2 * 11008 + 4096)
    # Llama-2-7B in nf4: 32 layers of that, embeddings and lm_head stay unquantized
    full = lora(LLAMA2_7B, rank=8, target_modules=("q_proj",), quantization="nf4")
    assert full.quantized_parameters == 32 * (4 * sq + 3 * mlp) == 6_476_005_376
    assert LLAMA2_7B.parameters - full.quantized_parameters == 2 * 32000 * 4096 + 65 * 4096


def test_quantized_tiny_models_recorded_against_bitsandbytes():
    # (quantized params, weight bytes, constant bytes) summed over the bnb layers, RECORDED
    cases = [
        (TINY_LLAMA, "nf4", False, (2_076_672, 1_038_336, 131_136)),
        (TINY_LLAMA, "nf4", True, (2_076_672, 1_038_336, 55_896)),
        (TINY_LLAMA, "fp4", True, (2_076_672, 1_038_336, 55_896)),
        (TINY_LLAMA, "int8", False, (2_076_672, 2_076_672, 27_264)),
        (TINY_GPT2, "nf4", False, (1_327_104, 663_552, 83_712)),
        (TINY_GPT2, "nf4", True, (1_327_104, 663_552, 34_176)),
        (TINY_GPT2, "fp4", True, (1_327_104, 663_552, 34_176)),
        (TINY_GPT2, "int8", False, (1_327_104, 1_327_104, 20_736)),
    ]
    for model, q, dq, expected in cases:
        c = lora(model, rank=8, target_modules="all-linear", quantization=q, double_quant=dq)
        got = (c.quantized_parameters, c.quantized_weight_bytes, c.quantization_constant_bytes)
        assert got == expected, (model.name, q, dq)
    # by hand, tiny GPT-2 int8: 3 layers of c_attn 192x576, c_proj 192x192, c_fc 192x768,
    # mlp.c_proj 768x192; SCB rows = out features
    assert 3 * 192 * (576 + 192 + 768 + 768) == 1_327_104
    assert 3 * 4 * (576 + 192 + 768 + 192) == 20_736


# --- errors ---------------------------------------------------------------------------------

def _raises(cls, match, fn, *a, **kw):
    with pytest.raises(cls, match=match) as info:
        fn(*a, **kw)
    return info.value


def test_config_errors():
    e = _raises(InvalidInputError, r"lora.rank=0 is not allowed: an integer >= 1",
                LoRAConfig, rank=0)
    assert (e.parameter, e.value) == ("lora.rank", 0)
    _raises(InvalidInputTypeError, r"lora.rank=True .*bools are not counts", LoRAConfig,
            rank=True)
    _raises(InvalidInputError, r"not a whole number", LoRAConfig, rank=2.5)
    e = _raises(InvalidInputError, r"lora.target_modules='q-proj' is not allowed: a non-empty "
                r"tuple of: q_proj, .*all-linear", LoRAConfig, target_modules=("q_proj", "q-proj"))
    assert e.value == "q-proj"
    # another family's module name is a name (qkv_proj: Phi-3's); the model decides whether it has it
    assert LoRAConfig(target_modules=("qkv_proj",)).target_modules == ("qkv_proj",)
    _raises(InvalidInputError, r"lora.target_modules='qkv'.*this architecture one of: q_proj", lora_counts,
            LLAMA2_7B, LoRAConfig(target_modules=("qkv",)))
    _raises(InvalidInputError, r"target_modules=\(\) is not allowed", LoRAConfig,
            target_modules=())
    _raises(InvalidInputTypeError, r"target_modules=3 ", LoRAConfig, target_modules=(3,))
    _raises(InvalidInputError, r"'all-linear' alone", LoRAConfig,
            target_modules=("all-linear", "q_proj"))
    _raises(InvalidInputError, r"lora.quantization='nf8' is not allowed: None, 'nf4', "
            r"'fp4' or 'int8'", LoRAConfig, quantization="nf8")
    _raises(InvalidInputTypeError, r"lora.quantization=4 ", LoRAConfig, quantization=4)
    _raises(InvalidInputError, r"lora.double_quant=True is not allowed: False unless "
            r"quantization is 'nf4' or 'fp4' \(quantization='int8'\)", LoRAConfig,
            quantization="int8", double_quant=True)
    _raises(InvalidInputError, r"lora.quant_blocksize=100 is not allowed: one of 32, 64",
            LoRAConfig, quantization="nf4", quant_blocksize=100)
    _raises(InvalidInputTypeError, r"lora.double_quant='yes'", LoRAConfig,
            double_quant="yes")
    with pytest.raises(attrs_frozen_error()):
        LoRAConfig().rank = 4


def attrs_frozen_error():
    import attrs
    return attrs.exceptions.FrozenInstanceError


def test_model_errors():
    bare = TransformerWorkload(name="bare", parameters=10**9, layers=8)
    e = _raises(NotModelledError, r"model.hidden_dim=None is not allowed: known: a "
                r"positive integer \(needed to size the linear layers", lora, bare)
    assert e.parameter == "model.hidden_dim"
    no_ffn = TransformerWorkload(name="no-ffn", parameters=10**9, layers=8, hidden_dim=1024,
                                 heads=16, gated_mlp=True)
    assert lora(no_ffn, rank=2, target_modules=("q_proj", "v_proj")).trainable_parameters \
        == 8 * 2 * lin(2, 1024, 1024)     # attention targets do not need the MLP's fields
    _raises(NotModelledError, r"model.ffn_dim=None", lora, no_ffn,
            target_modules=("up_proj",))
    _raises(NotModelledError, r"model.ffn_dim=None", lora, no_ffn,
            quantization="nf4")
    no_gate = TransformerWorkload(name="g", parameters=10**9, layers=8, hidden_dim=1024,
                                  heads=16, ffn_dim=4096)
    _raises(NotModelledError, r"model.gated_mlp=None", lora, no_gate,
            target_modules="all-linear")
    plain = TransformerWorkload(name="plain", parameters=10**9, layers=8, hidden_dim=1024,
                                heads=16, ffn_dim=4096, gated_mlp=False)
    _raises(InvalidInputError, r"target_modules='gate_proj' is not allowed: a module this model "
            r"has: .*\('plain' has no gate_proj\)", lora, plain, target_modules=("gate_proj",))
    _raises(InvalidInputError, r"'plain' has no router", lora, plain, target_modules=("router",))
    _raises(InvalidInputError, r"target_modules='q_proj' is not allowed: for GPT-2 "
            r"\(architecture='gpt2'\) one of: c_attn", lora, TINY_GPT2, target_modules=("q_proj",))
    _raises(InvalidInputError, r"target_modules='c_attn' is not allowed: for this architecture",
            lora, LLAMA2_7B, target_modules=("c_attn",))
    mla = get_model("deepseek-v3")
    _raises(InvalidInputError, r"kv_lora_rank=.* multi-head latent attention", lora, mla)
    phi3 = TransformerWorkload(name="phi3", parameters=10**9, layers=8, hidden_dim=1024,
                               heads=16, ffn_dim=4096, gated_mlp=True, architecture="phi3")
    _raises(InvalidInputError, r"architecture='phi3' is not allowed: .*fused projections", lora,
            phi3)
    tiny = TransformerWorkload(name="tiny", parameters=1000, layers=8, hidden_dim=1024,
                               heads=16, ffn_dim=4096, gated_mlp=True)
    _raises(InvalidInputError, r"model.parameters=1000 is not allowed: at least",
            lora, tiny)
    _raises(InvalidInputTypeError, r"model='llama' is not allowed", lora_counts, "llama",
            LoRAConfig())
    _raises(InvalidInputTypeError, r"config=\{\} is not allowed: a LoRAConfig", lora_counts,
            LLAMA2_7B, {})


def test_counts_is_frozen_and_typed():
    c = lora(LLAMA2_7B)
    assert isinstance(c, FineTuneCounts)
    assert all(type(v) is int for v in (c.trainable_parameters, c.frozen_parameters,
                                         c.adapted_linear_parameters, c.quantized_parameters,
                                         c.quantized_weight_bytes, c.quantization_constant_bytes))
    with pytest.raises(attrs_frozen_error()):
        c.trainable_parameters = 0
