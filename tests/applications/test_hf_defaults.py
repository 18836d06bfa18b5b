"""transformers' config defaults (mlsysim_core/catalog/hf_defaults.json) and quantized checkpoints.

The table is written by tools/make_hf_defaults.py from transformers 5.23.0's config classes
(no torch). Hand checks cite the transformers 5.23.0 source: configuration_llama.py declares
``vocab_size: int = 32000, hidden_size: int = 4096, intermediate_size: int = 11008,
num_hidden_layers: int = 32, num_attention_heads: int = 32, num_key_value_heads: int | None = None``
(LlamaConfig() is Llama-2-7B, 6,738,415,616 parameters); configuration_gpt2.py declares
``vocab_size 50257, n_positions 1024, n_embd 768, n_layer 12, n_head 12`` (GPT2Config() is GPT-2
small, 124,439,808); configuration_gemma3.py's Gemma3TextConfig declares ``vocab_size 262208,
num_attention_heads 8, num_key_value_heads 4, head_dim 256``.
"""

import json
from pathlib import Path

import pytest

from mlsysim_core import InvalidInputError, NotModelledError, TrainingMemoryModel
from mlsysim_core.finetune import LoRAConfig, checkpoint_quantization
from mlsysim_core.hf import (ARCHITECTURES, SUPPORTED_MODEL_TYPES, TRANSFORMERS_VERSION, _NESTED, from_hf_config,
                             transformers_defaults)

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
TABLE = json.loads((Path(__file__).parents[2] / "mlsysim_core" / "catalog" / "hf_defaults.json").read_text())
MEASURED = TrainingMemoryModel("measured")


def test_the_table_records_its_transformers_version_and_covers_every_type():
    assert TABLE["transformers_version"] == TRANSFORMERS_VERSION == "5.23.0"
    assert TABLE["generated_by"] == "tools/make_hf_defaults.py"
    assert set(TABLE["model_types"]) | set(TABLE["not_in_transformers"]) == set(SUPPORTED_MODEL_TYPES)
    assert TABLE["not_in_transformers"] == ["kimi_k2"] and transformers_defaults("kimi_k2") is None
    # the multimodal configs read their text_config as the type the outer class reads it as
    assert {t: TABLE["model_types"][t]["sub_configs"]["text_config"] for t in _NESTED} == _NESTED
    # the package ships it (hatch packages every file under mlsysim_core/)
    assert transformers_defaults("llama")["defaults"]["vocab_size"] == 32000


def _sizes(t):
    d = TABLE["model_types"][t]["defaults"]
    get = lambda *keys: next(d[k] for k in keys if d.get(k) is not None)     # noqa: E731
    return (get("num_hidden_layers", "n_layer"), get("hidden_size", "n_embd"),
            get("num_attention_heads", "n_head"), get("vocab_size"))


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_every_type_loads_with_every_optional_field_omitted(model_type):
    """{"model_type": t} alone is transformers' default model of that type: the sizes used are
    the table's (DeepseekV2Config declares no num_experts_per_tok: given here, refused below)."""
    w = from_hf_config({"model_type": model_type, **({"num_experts_per_tok": 6} if model_type == "deepseek_v2" else {})})
    assert (w.layers, w.hidden_dim, w.heads, w.vocab_size) == _sizes(model_type)
    d = TABLE["model_types"][model_type]["defaults"]
    tie = d["tie_word_embeddings"]
    assert w.tied_embeddings is tie
    kv = d.get("num_key_value_heads") or d.get("num_kv_heads")
    if model_type == "falcon":       # multi_query (default true): one KV head
        assert d["multi_query"] and w.kv_heads == 1
    elif model_type.startswith("deepseek"):     # MLA: keys and values for every head
        assert w.kv_heads == w.heads
    else:
        assert w.kv_heads == (kv or w.heads)
    if d.get("head_dim") and model_type not in ("deepseek_v2", "deepseek_v3"):
        assert w.head_dim == d["head_dim"]
    if w.is_sparse:
        experts = d.get("num_local_experts") or d.get("num_experts") or d.get("n_routed_experts")
        assert (w.experts, w.active_experts_per_token) == (experts, d["num_experts_per_tok"] or 6)


@pytest.mark.parametrize("outer", sorted(_NESTED))
def test_nested_text_config_with_every_field_omitted(outer):
    text_type = _NESTED[outer]
    w = from_hf_config({"model_type": outer, "text_config": {}})
    assert w.architecture == text_type
    assert (w.layers, w.hidden_dim, w.heads, w.vocab_size) == _sizes(text_type)
    assert w.parameters == from_hf_config({"model_type": text_type}).parameters


def test_defaults_checked_by_hand_against_transformers_source():
    llama = from_hf_config({"model_type": "llama"})              # Llama-2-7B
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    assert llama.parameters == 2 * 32000 * 4096 + 32 * per_layer + 4096 == 6_738_415_616
    assert (llama.kv_heads, llama.head_dim, llama.tied_embeddings) == (32, 128, False)
    assert from_hf_config({"model_type": "gpt2"}).parameters == 124_439_808      # GPT-2 small
    # MistralConfig's defaults are Mistral-7B-v0.1 (num_key_value_heads 8, intermediate_size 14336)
    assert from_hf_config({"model_type": "mistral"}).parameters == 7_241_732_096
    # GPT-2's attribute_map: hidden_size is n_embd (a config may say either)
    assert from_hf_config({"model_type": "gpt2", "hidden_size": 64, "num_attention_heads": 4}).hidden_dim == 64
    # RoPE base when the config gives none: the class's default_theta (Llama 4: 500000)
    assert from_hf_config({"model_type": "llama4_text"}).details["rope_theta"] == 500000.0


def test_a_size_transformers_leaves_undefaulted_is_named():
    assert TABLE["model_types"]["deepseek_v2"]["defaults"]["num_experts_per_tok"] is None
    with pytest.raises(InvalidInputError, match=r"config.num_experts_per_tok=None.*DeepseekV2Config has no default"):
        from_hf_config({"model_type": "deepseek_v2"})


def test_kimi_k2_has_no_defaults_and_a_missing_size_is_named():
    with pytest.raises(InvalidInputError, match=r"config.num_hidden_layers.*no 'kimi_k2' config class"):
        from_hf_config({"model_type": "kimi_k2"})


def test_a_null_size_is_refused_naming_the_default_it_would_take():
    with pytest.raises(InvalidInputError, match=r"config.text_config.vocab_size=None.*Gemma3TextConfig default, 262208"):
        from_hf_config({"model_type": "gemma3", "text_config": {"vocab_size": None}})


# --- the published Gemma 3 multimodal configs ---------------------------------------------------------

def _gemma3_text_count(layers, hidden, heads, kv, head_dim, ffn, vocab=262208):
    """Gemma3ForCausalLM: q/k/v/o, gated MLP, four RMSNorms and per-head q/k norms a block; the
    embedding tied to the LM head; the final norm."""
    block = hidden * heads * head_dim * 2 + 2 * hidden * kv * head_dim + 3 * hidden * ffn + 4 * hidden + 2 * head_dim
    return vocab * hidden + layers * block + hidden


@pytest.mark.parametrize("name, shape, published", [
    ("gemma-3-4b-it.json", (34, 2560, 8, 4, 256, 10240), 4.3e9),       # heads from Gemma3TextConfig's defaults
    ("gemma-3-12b-it.json", (48, 3840, 16, 8, 256, 15360), 12.2e9),
    ("gemma-3-27b-it.json", (62, 5376, 32, 16, 128, 21504), 27.4e9),
])
def test_gemma3_multimodal_configs_load(name, shape, published):
    config = json.loads((CONFIGS / name).read_text())
    assert "vocab_size" not in config["text_config"]           # what used to be refused
    w = from_hf_config(CONFIGS / name)
    assert (w.layers, w.hidden_dim, w.heads, w.kv_heads, w.head_dim, w.ffn_dim) == shape
    assert (w.vocab_size, w.tied_embeddings, w.architecture) == (262208, True, "gemma3_text")
    assert w.parameters == _gemma3_text_count(*shape)
    # the published size counts the SigLIP vision tower and projector too (about 0.4B), not counted here
    assert 0.3e9 < published - w.parameters < 0.5e9
    assert w.details["sliding_window_layers"] == sum(1 for i in range(shape[0]) if (i + 1) % 6)
    MEASURED.solve(w, "h100", 1, 1024, precision="bf16")       # the measured profile takes it


# --- quantization_config ------------------------------------------------------------------------------

LLAMA = json.loads((CONFIGS / "Llama-3.2-1B.json").read_text())
NF4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
       "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16"}


def test_bitsandbytes_4bit_is_read_into_the_model():
    w = from_hf_config(dict(LLAMA, quantization_config=NF4))
    assert w.details["quantization"] == {"method": "bitsandbytes", "quantization": "nf4", "double_quant": True,
                                         "quant_blocksize": 64, "compute_dtype": "bfloat16"}
    assert w.parameters == from_hf_config(LLAMA).parameters      # the count is the model's; the storage is not
    # omitted keys take BitsAndBytesConfig's defaults (bnb_4bit_quant_type 'fp4', no double quant)
    fp4 = from_hf_config(dict(LLAMA, quantization_config={"load_in_4bit": True}))
    assert fp4.details["quantization"]["quantization"] == "fp4" and not fp4.details["quantization"]["double_quant"]
    int8 = from_hf_config(dict(LLAMA, quantization_config={"quant_method": "bitsandbytes", "load_in_8bit": True,
                                                          "llm_int8_skip_modules": ["lm_head"]}))
    assert int8.details["quantization"] == {"method": "bitsandbytes", "quantization": "int8"}


def test_bitsandbytes_with_lora_is_qlora():
    quantized = from_hf_config(dict(LLAMA, quantization_config=NF4))
    plain = from_hf_config(LLAMA)
    run = dict(batch_size=4, seq_len=1024, precision="bf16")
    q = MEASURED.solve(quantized, "h100", lora=LoRAConfig(rank=16), **run)
    by_hand = MEASURED.solve(plain, "h100", lora=LoRAConfig(rank=16, quantization="nf4", double_quant=True), **run)
    unquantized = MEASURED.solve(plain, "h100", lora=LoRAConfig(rank=16), **run)
    assert q.total_memory == by_hand.total_memory < unquantized.total_memory
    assert any("quantization_config (bitsandbytes nf4 with double quantization" in n for n in q.notes)
    with pytest.raises(InvalidInputError, match=r"lora.quantization='int8'.*'nf4' \(the checkpoint's\)"):
        MEASURED.solve(quantized, "h100", lora=LoRAConfig(rank=16, quantization="int8"), **run)
    with pytest.raises(InvalidInputError, match=r"lora.double_quant=False.*True \(the checkpoint's\)"):
        MEASURED.solve(quantized, "h100", lora=LoRAConfig(rank=16, quantization="nf4"), **run)


def test_full_training_of_a_bitsandbytes_checkpoint_is_refused():
    quantized = from_hf_config(dict(LLAMA, quantization_config=NF4))
    with pytest.raises(NotModelledError, match=r"lora=None.*bitsandbytes nf4.*full training of a quantized checkpoint"):
        checkpoint_quantization(quantized, None)
    assert checkpoint_quantization(from_hf_config(LLAMA), None) == (None, ())


def test_full_training_of_a_bitsandbytes_checkpoint_is_refused_by_solve():
    quantized = from_hf_config(dict(LLAMA, quantization_config=NF4))
    with pytest.raises(NotModelledError, match="full training of a quantized checkpoint"):
        MEASURED.solve(quantized, "h100", 4, 1024, precision="bf16")


@pytest.mark.parametrize("config", [
    {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
    {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
    {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]},
    {"quant_method": "compressed-tensors", "format": "float-quantized"},
    {"quant_method": "mxfp4"},          # mxfp4 is gpt-oss's; not modelled for another architecture
])
def test_other_methods_are_refused_by_name(config):
    method = config["quant_method"]
    with pytest.raises(NotModelledError) as info:
        from_hf_config(dict(LLAMA, quantization_config=config))
    assert info.value.parameter == "config.quantization_config.quant_method" and info.value.value == method
    assert "bitsandbytes" in info.value.allowed and "never costed as the unquantized model" in str(info.value)


def test_mxfp4_gpt_oss_is_read():
    config = json.loads((CONFIGS / "gpt-oss-20b.json").read_text())
    w = from_hf_config(dict(config, quantization_config={"quant_method": "mxfp4"}))
    assert w.details["quantization"] == {"method": "mxfp4"}
    assert w.details["quantization_config"] == {"quant_method": "mxfp4"}     # what the gpt_oss family reads


@pytest.mark.parametrize("change, parameter, error", [
    ({"bnb_4bit_quant_storage": "bfloat16"}, "bnb_4bit_quant_storage", NotModelledError),
    ({"llm_int8_skip_modules": ["lm_head", "mlp"]}, "llm_int8_skip_modules", NotModelledError),
    ({"load_in_8bit": True}, "load_in_8bit", InvalidInputError),
    ({"load_in_4bit": False}, "load_in_4bit", InvalidInputError),
    ({"bnb_4bit_quant_type": "int4"}, "bnb_4bit_quant_type", InvalidInputError),
])
def test_bitsandbytes_settings_not_modelled_are_named(change, parameter, error):
    with pytest.raises(error) as info:
        from_hf_config(dict(LLAMA, quantization_config=dict(NF4, **change)))
    assert info.value.parameter == f"config.quantization_config.{parameter}"


def test_bad_quantization_configs():
    with pytest.raises(InvalidInputError, match="config.quantization_config.quant_method='foo'.*awq"):
        from_hf_config(dict(LLAMA, quantization_config={"quant_method": "foo"}))
    with pytest.raises(InvalidInputError, match="config.quantization_config.quant_method=None"):
        from_hf_config(dict(LLAMA, quantization_config={"bits": 4}))
    with pytest.raises(InvalidInputError, match="config.quantization_config"):
        from_hf_config(dict(LLAMA, quantization_config="nf4"))
    with pytest.raises(NotModelledError, match="llm_int8_has_fp16_weight"):
        from_hf_config(dict(LLAMA, quantization_config={"load_in_8bit": True, "llm_int8_has_fp16_weight": True}))


def test_the_reference_profile_says_it_does_not_read_a_quantization_config():
    # mlsysim 0.3.0 never reads a checkpoint's quantization: its numbers stay the unquantized
    # model's, and a note says so (nothing read is silently ignored)
    from mlsysim_core import TrainingMemoryModel
    quantized, plain = from_hf_config(dict(LLAMA, quantization_config=NF4)), from_hf_config(LLAMA)
    r = TrainingMemoryModel().solve(quantized, "h100", 4, 1024)
    assert r.total_memory == TrainingMemoryModel().solve(plain, "h100", 4, 1024).total_memory
    assert r.notes == ("approximation: the checkpoint's quantization_config (bitsandbytes nf4) is not read by the "
                       "reference profile: its weights count at fp16, as an unquantized model's",)
    assert TrainingMemoryModel().solve(plain, "h100", 4, 1024).notes == ()
