"""Architecture import from Hugging Face config.json files, without transformers.

The committed configs under tests/data/hf_configs/ are the public config.json files of
the models named (fields copied as published). Their parameter counts are the exact
figures Hugging Face reports for those checkpoints; tests/applications/test_hf_models.py checks the
same counts against the real transformers classes where transformers is installed.
"""

import json
from pathlib import Path

import pytest

from mlsysim_core import InvalidInputError, SparseTransformerWorkload, TransformerWorkload
import attrs

from mlsysim_core.catalog import find_model, get_model
from mlsysim_core.hf import (ARCHITECTURES, SUPPORTED_MODEL_TYPES, HFArchitecture, architecture_of, from_hf_config,
                             load_hf_config)

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"

# file -> (total, active or None, curated catalog key)
EXACT = {
    "gpt2.json": (124_439_808, None, "openai-community/gpt2"),
    "Llama-3.2-1B.json": (1_235_814_400, None, "meta-llama/llama-3.2-1b"),
    "Mistral-7B-v0.1.json": (7_241_732_096, None, "mistralai/mistral-7b-v0.1"),
    "Qwen2.5-0.5B.json": (494_032_768, None, "qwen/qwen2.5-0.5b"),
    "gemma-2-2b.json": (2_614_341_888, None, "google/gemma-2-2b"),
    "Phi-3-mini-4k-instruct.json": (3_821_079_552, None, "microsoft/phi-3-mini-4k-instruct"),
    "pythia-160m.json": (162_322_944, None, None),
    "Mixtral-8x7B-v0.1.json": (46_702_792_704, 12_879_925_248, "mistralai/mixtral-8x7b-v0.1"),
    "Qwen1.5-MoE-A2.7B.json": (14_315_784_192, 2_689_173_504, "qwen/qwen1.5-moe-a2.7b"),
    # Copies of published configs found in public repositories (each catalog entry's sources
    # name the repository, path and commit). Counts: sum(p.numel()) of transformers 5.23
    # AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)) on the meta device,
    # measured; active = total - routed ".experts." parameters x (experts - top_k) / experts.
    "Qwen3-0.6B.json": (596_049_920, None, "qwen/qwen3-0.6b"),
    "Qwen3-1.7B.json": (1_720_574_976, None, "qwen/qwen3-1.7b"),
    "Qwen3-4B.json": (4_022_468_096, None, "qwen/qwen3-4b"),
    "Qwen3-8B.json": (8_190_735_360, None, "qwen/qwen3-8b"),
    "Qwen3-14B.json": (14_768_307_200, None, "qwen/qwen3-14b"),
    "Qwen3-32B.json": (32_762_123_264, None, "qwen/qwen3-32b"),
    "Qwen3-30B-A3B.json": (30_532_122_624, 3_353_032_704, "qwen/qwen3-30b-a3b"),
    "Qwen3-235B-A22B-Instruct-2507.json": (235_093_634_560, 22_190_763_520, "qwen/qwen3-235b-a22b-instruct-2507"),
    "gemma-3-1b-it.json": (999_885_952, None, "google/gemma-3-1b-it"),
    "DeepSeek-V2-Lite.json": (15_706_484_224, 2_661_150_208, "deepseek-ai/deepseek-v2-lite"),
    "DeepSeek-V3.json": (671_026_404_352, 37_552_282_624, "deepseek-ai/deepseek-v3"),
    "gpt-oss-20b.json": (20_914_757_184, 4_187_440_704, "openai/gpt-oss-20b"),
    "gpt-oss-120b.json": (116_829_156_672, 5_711_982_912, "openai/gpt-oss-120b"),
    "OLMo-2-1124-7B.json": (7_298_617_344, None, "allenai/olmo-2-1124-7b"),
    "OLMo-2-1124-13B.json": (13_716_198_400, None, "allenai/olmo-2-1124-13b"),
    "Llama-4-Maverick-17B-128E.json": (400_711_848_960, 17_184_691_200, "meta-llama/llama-4-maverick-17b-128e"),
    "Ministral-8B-Instruct-2410.json": (8_019_808_256, None, "mistralai/ministral-8b-instruct-2410"),
    # The multimodal Gemma 3 checkpoints' config.json (tests/data/hf_configs/README.md): their
    # text_config omits what Gemma3TextConfig defaults (vocab_size 262208, and for 4B the heads).
    # The count is the language model's, what a text fine-tune trains (tests/applications/test_hf_defaults.py).
    "gemma-3-4b-it.json": (3_880_263_168, None, None),
    "gemma-3-12b-it.json": (11_766_034_176, None, None),
    "gemma-3-27b-it.json": (27_009_346_304, None, None),
}

# The catalog entries written from these copies: equal to from_hf_config, details included.
FROM_CONFIG = ("Qwen3-0.6B.json", "Qwen3-1.7B.json", "Qwen3-4B.json", "Qwen3-8B.json", "Qwen3-14B.json",
               "Qwen3-32B.json", "Qwen3-30B-A3B.json", "Qwen3-235B-A22B-Instruct-2507.json",
               "gemma-3-1b-it.json", "DeepSeek-V2-Lite.json", "DeepSeek-V3.json", "gpt-oss-20b.json",
               "gpt-oss-120b.json", "OLMo-2-1124-7B.json", "OLMo-2-1124-13B.json",
               "Llama-4-Maverick-17B-128E.json", "Ministral-8B-Instruct-2410.json")


def load(name):
    return json.loads((CONFIGS / name).read_text())


def test_every_committed_config_is_covered():
    assert sorted(p.name for p in CONFIGS.glob("*.json")) == sorted(EXACT)


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_counts_of_published_configs(name):
    total, active, _ = EXACT[name]
    w = from_hf_config(CONFIGS / name)
    assert w.parameters == total
    config = load(name)
    assert w.architecture == config.get("text_config", config)["model_type"]   # a multimodal config: its text model
    assert w.details["model_type"] == w.architecture
    if active is None:
        assert type(w) is TransformerWorkload
    else:
        assert isinstance(w, SparseTransformerWorkload)
        assert w.active_parameters == active


@pytest.mark.parametrize("name", sorted(n for n, v in EXACT.items() if v[2]))
def test_import_agrees_with_the_curated_catalog(name):
    w = from_hf_config(load(name))
    entry = get_model(EXACT[name][2])
    for field in ("parameters", "layers", "hidden_dim", "heads", "kv_heads", "vocab_size", "ffn_dim",
                  "gated_mlp", "tied_embeddings", "context_length", "architecture"):
        assert getattr(w, field) == getattr(entry, field), field
    if entry.is_sparse:
        for field in ("active_parameters", "experts", "active_experts_per_token", "expert_ffn_dim"):
            assert getattr(w, field) == getattr(entry, field), field


@pytest.mark.parametrize("name", FROM_CONFIG)
def test_catalog_entry_is_from_hf_config_of_its_copy(name):
    entry = find_model(EXACT[name][2])
    w = from_hf_config(CONFIGS / name, name=entry.value.name)
    assert attrs.asdict(w) == attrs.asdict(entry.value)
    assert dict(w.details) == dict(entry.value.details)
    assert f"tests/data/hf_configs/{name}" in " ".join(entry.sources.values())


def test_field_mapping_llama():
    w = from_hf_config(CONFIGS / "Llama-3.2-1B.json", name="llama-1b")
    assert (w.name, w.layers, w.hidden_dim, w.heads, w.kv_heads, w.head_dim) == ("llama-1b", 16, 2048, 32, 8, 64)
    assert (w.vocab_size, w.ffn_dim, w.gated_mlp, w.tied_embeddings, w.context_length) == (
        128256, 8192, True, True, 131072)
    a = architecture_of(CONFIGS / "Llama-3.2-1B.json")
    assert isinstance(a, HFArchitecture)
    assert (a.norm, a.norms_per_layer, a.position_embedding, a.rope_theta) == ("rms", 2, "rotary", 500000.0)
    assert a.rope_scaling["rope_type"] == "llama3" and a.torch_dtype == "bfloat16"
    assert (a.embedding_parameters, a.lm_head_parameters) == (128256 * 2048, 0)


def test_field_mapping_gpt2():
    w = from_hf_config(load("gpt2.json"))
    assert (w.name, w.ffn_dim, w.gated_mlp, w.tied_embeddings, w.context_length, w.kv_heads) == (
        "gpt2", 3072, False, True, 1024, 12)
    a = architecture_of(load("gpt2.json"))
    assert (a.norm, a.position_embedding, a.qkv_bias, a.mlp_bias, a.hidden_act) == (
        "layer", "learned", True, True, "gelu_new")
    assert (a.attention_dropout, a.hidden_dropout, a.embedding_dropout) == (0.1, 0.1, 0.1)
    assert a.embedding_parameters == (50257 + 1024) * 768
    # n_inner sets the MLP width
    assert from_hf_config(dict(load("gpt2.json"), n_inner=1000)).ffn_dim == 1000


def test_architecture_facts():
    gemma = architecture_of(CONFIGS / "gemma-2-2b.json")
    assert (gemma.norms_per_layer, gemma.sliding_window, gemma.sliding_window_layers) == (4, 4096, 13)
    assert (gemma.attn_logit_softcapping, gemma.final_logit_softcapping) == (50.0, 30.0)
    assert gemma.embedding_scale and gemma.hidden_act == "gelu_pytorch_tanh"
    neox = architecture_of(CONFIGS / "pythia-160m.json")
    assert (neox.parallel_residual, neox.rotary_fraction, neox.norm, neox.fused_qkv) == (True, 0.25, "layer", True)
    mistral = architecture_of(CONFIGS / "Mistral-7B-v0.1.json")
    assert (mistral.sliding_window, mistral.sliding_window_layers) == (4096, 32)
    qwen = architecture_of(CONFIGS / "Qwen2.5-0.5B.json")
    assert (qwen.qkv_bias, qwen.attention_out_bias, qwen.sliding_window) == (True, False, None)
    phi = architecture_of(CONFIGS / "Phi-3-mini-4k-instruct.json")
    assert phi.fused_qkv and phi.fused_gate_up and phi.lm_head_parameters == 32064 * 3072
    moe = architecture_of(CONFIGS / "Qwen1.5-MoE-A2.7B.json")
    assert (moe.moe_layers, moe.dense_layers, moe.shared_expert_ffn_dim, moe.shared_expert_gate) == (
        24, 0, 5632, True)
    hash(moe)                                   # frozen and hashable


def test_moe_fields():
    m = from_hf_config(CONFIGS / "Mixtral-8x7B-v0.1.json")
    assert (m.experts, m.active_experts_per_token, m.shared_experts, m.expert_ffn_dim) == (8, 2, 0, 14336)
    q = from_hf_config(CONFIGS / "Qwen1.5-MoE-A2.7B.json")
    assert (q.experts, q.active_experts_per_token, q.shared_experts, q.expert_ffn_dim) == (60, 4, 4, 1408)


def test_qwen2_moe_dense_layers():
    cfg = load("Qwen1.5-MoE-A2.7B.json")
    full = from_hf_config(cfg)
    dense_mlp = 3 * 2048 * 5632
    moe_mlp = 2048 * 60 + 60 * 3 * 2048 * 1408 + 3 * 2048 * 5632 + 2048
    assert from_hf_config(dict(cfg, mlp_only_layers=[0, 5])).parameters == full.parameters - 2 * (moe_mlp - dense_mlp)
    assert from_hf_config(dict(cfg, decoder_sparse_step=2)).parameters == full.parameters - 12 * (moe_mlp - dense_mlp)
    dense = from_hf_config(dict(cfg, num_experts=0))
    assert type(dense) is TransformerWorkload and dense.parameters == full.parameters - 24 * (moe_mlp - dense_mlp)


def test_family_defaults_for_omitted_fields():
    # gemma2 ties by default (gemma-2-2b's config.json says nothing), llama does not
    gemma = load("gemma-2-2b.json")
    assert "tie_word_embeddings" not in gemma and from_hf_config(gemma).tied_embeddings
    llama = {k: v for k, v in load("Llama-3.2-1B.json").items() if k != "tie_word_embeddings"}
    w = from_hf_config(llama)
    assert not w.tied_embeddings and w.parameters == 1_235_814_400 + 128256 * 2048
    neox = dict(load("pythia-160m.json"))
    del neox["tie_word_embeddings"]
    assert from_hf_config(neox).parameters == 162_322_944
    # gemma's head_dim defaults to 256, not hidden_size / heads
    del gemma["head_dim"]
    assert from_hf_config(gemma).head_dim == 256
    # num_key_value_heads: LlamaConfig declares None (its __post_init__ takes the head count),
    # MistralConfig declares 8 (configuration_mistral.py: `num_key_value_heads: int | None = 8`)
    llama = {k: v for k, v in load("Llama-3.2-1B.json").items() if k != "num_key_value_heads"}
    assert from_hf_config(llama).kv_heads == 32
    mistral = {k: v for k, v in load("Mistral-7B-v0.1.json").items() if k != "num_key_value_heads"}
    assert from_hf_config(mistral).kv_heads == 8


def test_paths_and_names(tmp_path):
    (tmp_path / "config.json").write_text((CONFIGS / "Mistral-7B-v0.1.json").read_text())
    assert from_hf_config(tmp_path).parameters == 7_241_732_096            # a directory
    assert from_hf_config(str(tmp_path / "config.json")).name == "mistral"  # model_type by default
    assert from_hf_config(CONFIGS / "Phi-3-mini-4k-instruct.json").name == "Phi-3-mini-4k-instruct"
    assert load_hf_config(tmp_path) == load("Mistral-7B-v0.1.json")


def test_unknown_model_type_lists_the_supported_ones():
    with pytest.raises(InvalidInputError, match="model_type='bert'") as e:
        from_hf_config({"model_type": "bert", "hidden_size": 768})
    for family in ("llama", "mistral", "qwen2", "gemma", "gemma2", "phi3", "gpt2", "gpt_neox",
                   "mixtral", "qwen2_moe"):
        assert family in SUPPORTED_MODEL_TYPES and family in str(e.value)
    with pytest.raises(InvalidInputError, match="model_type"):
        from_hf_config({"hidden_size": 768})


# LlamaConfig's declared defaults (transformers 5.23 configuration_llama.py: vocab_size 32000,
# hidden_size 4096, intermediate_size 11008, num_hidden_layers 32, num_attention_heads 32)
@pytest.mark.parametrize("field, default", [("num_hidden_layers", 32), ("hidden_size", 4096),
                                            ("num_attention_heads", 32), ("vocab_size", 32000),
                                            ("intermediate_size", 11008)])
def test_omitted_size_takes_the_transformers_default_and_null_is_named(field, default):
    cfg = {k: v for k, v in load("Llama-3.2-1B.json").items() if k not in (field, "head_dim")}
    w = from_hf_config(cfg)
    assert {"num_hidden_layers": w.layers, "hidden_size": w.hidden_dim, "num_attention_heads": w.heads,
            "vocab_size": w.vocab_size, "intermediate_size": w.ffn_dim}[field] == default
    with pytest.raises(InvalidInputError, match=f"config.{field}=None.*sets it to null.*LlamaConfig default, {default}"):
        from_hf_config(dict(cfg, **{field: None}))


def test_omitted_moe_fields_take_defaults_and_null_is_named():
    # MixtralConfig: num_local_experts 8; Qwen2MoeConfig: moe_intermediate_size 1408 (both the published models')
    cfg = {k: v for k, v in load("Mixtral-8x7B-v0.1.json").items() if k != "num_local_experts"}
    assert from_hf_config(cfg).parameters == 46_702_792_704
    with pytest.raises(InvalidInputError, match="config.num_local_experts"):
        from_hf_config(dict(cfg, num_local_experts=None))
    cfg = {k: v for k, v in load("Qwen1.5-MoE-A2.7B.json").items() if k != "moe_intermediate_size"}
    assert from_hf_config(cfg).parameters == 14_315_784_192
    with pytest.raises(InvalidInputError, match="config.moe_intermediate_size"):
        from_hf_config(dict(cfg, moe_intermediate_size=None))


def test_bad_values_and_inputs(tmp_path):
    with pytest.raises(InvalidInputError, match="config.hidden_size"):
        from_hf_config(dict(load("Llama-3.2-1B.json"), hidden_size="big"))
    with pytest.raises(InvalidInputError, match="config.num_key_value_heads"):
        from_hf_config(dict(load("Llama-3.2-1B.json"), num_key_value_heads=5))
    with pytest.raises(InvalidInputError, match="config.tie_word_embeddings"):
        from_hf_config(dict(load("Llama-3.2-1B.json"), tie_word_embeddings="yes"))
    with pytest.raises(InvalidInputError, match="config="):
        from_hf_config(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match="JSON"):
        from_hf_config(tmp_path / "bad.json")
    with pytest.raises(InvalidInputError):
        from_hf_config(42)


# Hand-made configs of the other supported families, counted by hand.

def test_qwen3_per_head_qk_norm():
    cfg = {"model_type": "qwen3", "num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "intermediate_size": 3072,
           "tie_word_embeddings": True}
    w = from_hf_config(cfg)
    per_layer = 1024 * 2048 * 2 + 2 * 1024 * 1024 + 3 * 1024 * 3072 + 2 * 1024 + 2 * 128
    assert w.parameters == 151936 * 1024 + 28 * per_layer + 1024 == 596_049_920   # Qwen3-0.6B
    assert architecture_of(cfg).qk_norm == "head"


def test_falcon_variants():
    f7b = {"model_type": "falcon", "num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71,
           "vocab_size": 65024, "multi_query": True, "parallel_attn": True, "bias": False,
           "new_decoder_architecture": False, "alibi": False}
    w = from_hf_config(f7b)
    assert (w.parameters, w.kv_heads, w.tied_embeddings) == (get_model("tiiuae/falcon-7b").parameters, 1, True)
    assert architecture_of(f7b).norms_per_layer == 1
    f40b = {"model_type": "falcon", "num_hidden_layers": 60, "hidden_size": 8192, "num_attention_heads": 128,
            "num_kv_heads": 8, "vocab_size": 65024, "new_decoder_architecture": True, "parallel_attn": True,
            "bias": False, "alibi": False}
    assert from_hf_config(f40b).parameters == get_model("tiiuae/falcon-40b").parameters


def test_olmo_families():
    olmo = {"model_type": "olmo", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
            "vocab_size": 50304, "intermediate_size": 11008}
    assert from_hf_config(olmo).parameters == get_model("allenai/olmo-7b-hf").parameters
    assert architecture_of(olmo).norm == "none"
    olmo2 = {"model_type": "olmo2", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
             "vocab_size": 100352, "intermediate_size": 11008}
    assert from_hf_config(olmo2).parameters == get_model("allenai/olmo-2-1124-7b").parameters


# --- issue 15: MLA, first-k-dense MoE, gpt-oss, Llama 4, GLM-4.5, nested text configs -------------
# Each tiny config below was built with transformers 5.23 (AutoModelForCausalLM.from_config) and
# its sum(p.numel()) compared with from_hf_config (tests/applications/test_hf_models.py repeats it where
# torch is installed); the numbers here are derived by hand.

_TINY = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 211,
         "intermediate_size": 96, "max_position_embeddings": 128}
_MLA = {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12}
_DS_MOE = {"n_routed_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 20,
           "n_shared_experts": 2, "first_k_dense_replace": 1}


def test_deepseek_v3_mla_and_moe_by_hand():
    cfg = dict(_TINY, model_type="deepseek_v3", **_MLA, **_DS_MOE)
    w = from_hf_config(cfg)
    # MLA (DeepseekV3Attention): q_a_proj 64x24, q_a_layernorm 24, q_b_proj 24 -> 4 x (8+4),
    # kv_a_proj_with_mqa 64 -> 16+4, kv_a_layernorm 16, kv_b_proj 16 -> 4 x (8+12), o_proj 4x12 -> 64
    attention = 64 * 24 + 24 + 24 * 4 * 12 + 64 * 20 + 16 + 16 * 4 * 20 + 4 * 12 * 64
    block = attention + 2 * 64
    dense = 3 * 64 * 96                                    # first_k_dense_replace = 1 dense layer
    moe = 6 * 64 + 6 * 3 * 64 * 20 + 3 * 64 * (2 * 20)      # router, experts, one shared MLP 2 x 20 wide
    total = (block + dense) + 3 * (block + moe) + 2 * 211 * 64 + 64
    assert w.parameters == total == 172_768                  # transformers 5.23: 172,768
    assert w.active_parameters == total - 3 * (6 - 2) * 3 * 64 * 20 == 126_688
    assert (w.architecture, w.kv_heads, w.head_dim, w.kv_lora_rank, w.qk_rope_head_dim) == (
        "deepseek_v3", 4, 12, 16, 4)
    assert (w.experts, w.shared_experts, w.expert_ffn_dim, w.ffn_dim) == (6, 2, 20, 96)
    d = w.details
    assert (d["mla"], d["moe_layers"], d["dense_layers"], d["shared_expert_ffn_dim"]) == (True, 3, 1, 40)
    assert (d["q_lora_rank"], d["v_head_dim"], d["first_k_dense_replace"], d["norm_topk_prob"]) == (24, 12, 1, True)
    # no query compression: one q_proj 64 -> 4 x 12 instead of q_a/q_a_layernorm/q_b
    no_q = from_hf_config(dict(cfg, q_lora_rank=None))
    assert no_q.parameters == total - 4 * (64 * 24 + 24 + 24 * 48 - 64 * 48)
    assert "q_lora_rank" not in no_q.details and no_q.details["mla"]
    # attention_bias biases q_a_proj, kv_a_proj_with_mqa and o_proj only
    assert from_hf_config(dict(cfg, attention_bias=True)).parameters == total + 4 * (24 + 20 + 64)
    # the MTP layers are not built by AutoModelForCausalLM: recorded, not counted
    mtp = from_hf_config(dict(cfg, num_nextn_predict_layers=1))
    assert mtp.parameters == total and mtp.details["mtp_layers_not_built"] == 1
    assert mtp.details["num_nextn_predict_layers"] == 1
    # every block dense: an ordinary transformer
    dense_only = from_hf_config(dict(cfg, first_k_dense_replace=4))
    assert type(dense_only) is TransformerWorkload and dense_only.parameters == 4 * (block + dense) + 2 * 211 * 64 + 64


def test_deepseek_v2_biases_and_defaults():
    cfg = dict(_TINY, model_type="deepseek_v2", **_MLA, **_DS_MOE)
    v3 = from_hf_config(dict(cfg, model_type="deepseek_v3"))
    v2 = from_hf_config(cfg)
    assert v2.parameters == v3.parameters and v2.architecture == "deepseek_v2"
    assert not v2.details.get("norm_topk_prob", False)           # V2's default is False
    # mlp_bias (V2 only): the dense MLP (2 x 96 + 64) and the shared MLP (2 x 40 + 64), not the experts
    assert from_hf_config(dict(cfg, mlp_bias=True)).parameters == v2.parameters + (2 * 96 + 64) + 3 * (2 * 40 + 64)
    # V2 defaults first_k_dense_replace to 0 (every block MoE: ffn_dim is the expert width), V3 to 3
    no_k = {k: v for k, v in cfg.items() if k != "first_k_dense_replace"}
    assert (from_hf_config(no_k).details.get("dense_layers", 0), from_hf_config(no_k).ffn_dim) == (0, 20)
    assert from_hf_config(dict(no_k, model_type="deepseek_v3")).details["dense_layers"] == 3


def test_kimi_k2_is_read_as_deepseek_v3():
    cfg = dict(_TINY, model_type="kimi_k2", **_MLA, **_DS_MOE)
    w = from_hf_config(cfg)
    assert w.parameters == from_hf_config(dict(cfg, model_type="deepseek_v3")).parameters
    assert (w.architecture, w.details["config_model_type"], w.name) == ("deepseek_v3", "kimi_k2", "kimi_k2")
    assert "kimi_k2" in SUPPORTED_MODEL_TYPES and "kimi_k2" not in ARCHITECTURES
    assert set(ARCHITECTURES) == set(SUPPORTED_MODEL_TYPES) - {"kimi_k2", "gemma3", "llama4", "mistral3"}


def test_deepseek_v3_published_config():
    w = from_hf_config(CONFIGS / "DeepSeek-V3.json")
    assert (w.layers, w.experts, w.active_experts_per_token, w.shared_experts, w.expert_ffn_dim) == (61, 256, 8, 1, 2048)
    assert (w.kv_heads, w.head_dim, w.details["dense_layers"], w.details["moe_layers"]) == (128, 192, 3, 58)
    assert (w.details["scoring_func"], w.details["routed_scaling_factor"], w.details["mtp_layers_not_built"]) == (
        "sigmoid", 2.5, 1)


def test_mla_errors_name_the_key():
    cfg = dict(_TINY, model_type="deepseek_v3", **_MLA, **_DS_MOE)
    # omitted, each takes DeepseekV3Config's default; kimi_k2 (no transformers class) has none
    defaults = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "n_routed_experts": 256, "moe_intermediate_size": 2048, "num_experts_per_tok": 8}
    for key, default in defaults.items():
        if key == "num_experts_per_tok":     # the default, 8, is more than these 6 experts: said
            with pytest.raises(InvalidInputError, match="num_experts_per_tok=8.*leaves num_experts_per_tok out"):
                from_hf_config({k: v for k, v in cfg.items() if k != key})
            continue
        w = from_hf_config({k: v for k, v in cfg.items() if k != key})
        assert from_hf_config(dict(cfg, **{key: default})).parameters == w.parameters, key
        with pytest.raises(InvalidInputError, match=f"config.{key}.*no 'kimi_k2' config class"):
            from_hf_config({k: v for k, v in dict(cfg, model_type="kimi_k2").items() if k != key})
    with pytest.raises(InvalidInputError, match="config.num_experts_per_tok.*n_routed_experts=6"):
        from_hf_config(dict(cfg, num_experts_per_tok=7))
    with pytest.raises(InvalidInputError, match="config.kv_lora_rank"):
        from_hf_config(dict(cfg, kv_lora_rank=0))
    with pytest.raises(InvalidInputError, match="config.first_k_dense_replace"):
        from_hf_config(dict(cfg, first_k_dense_replace=-1))


def test_gpt_oss_by_hand():
    cfg = dict(_TINY, model_type="gpt_oss", num_key_value_heads=2, head_dim=24, num_local_experts=5,
               num_experts_per_tok=2, sliding_window=16)
    w = from_hf_config(cfg)
    q, kv = 4 * 24, 2 * 24
    attention = 64 * q + 2 * 64 * kv + q * 64 + (q + 2 * kv + 64) + 4     # biased q/k/v/o, 4 sinks
    moe = 64 * 5 + 5 + 5 * (3 * 64 * 96 + 2 * 96 + 64)                    # biased router and experts
    total = 4 * (attention + 2 * 64 + moe) + 2 * 211 * 64 + 64
    assert w.parameters == total == 477_412                             # transformers 5.23: 477,412
    assert w.active_parameters == total - 4 * 3 * (3 * 64 * 96 + 2 * 96 + 64)
    a = architecture_of(cfg)
    assert (a.attention_sinks, a.router_bias, a.qkv_bias, a.mlp_bias) == (True, True, True, True)
    # without layer_types: the even-indexed layers use the window (GptOssConfig's default)
    assert (a.sliding_window, a.sliding_window_layers, a.moe_layers) == (16, 2, 4)
    assert from_hf_config(dict(cfg, attention_bias=False)).parameters == total - 4 * (q + 2 * kv + 64)
    twenty = from_hf_config(CONFIGS / "gpt-oss-20b.json")
    assert (twenty.details["sliding_window_layers"], twenty.details["layer_types"][:2]) == (
        12, ("sliding_attention", "full_attention"))


def test_llama4_text_by_hand():
    cfg = dict(_TINY, model_type="llama4_text", num_key_value_heads=2, head_dim=24, num_local_experts=4,
               num_experts_per_tok=1, intermediate_size_mlp=80, interleave_moe_layer_step=2)
    w = from_hf_config(cfg)
    attention = 64 * 96 + 2 * 64 * 48 + 96 * 64
    dense = 3 * 64 * 80                                     # intermediate_size_mlp
    moe = 64 * 4 + 4 * 3 * 64 * 96 + 3 * 64 * 96            # router, experts, shared expert
    total = 2 * (attention + 128 + dense) + 2 * (attention + 128 + moe) + 2 * 211 * 64 + 64
    assert w.parameters == total == 316_864                 # transformers 5.23: 316,864
    assert (w.experts, w.shared_experts, w.expert_ffn_dim, w.ffn_dim) == (4, 1, 96, 80)
    assert (w.details["moe_layers"], w.details["dense_layers"], w.details["qk_norm"]) == (2, 2, "l2")
    listed = from_hf_config(dict(cfg, moe_layers=[0, 1, 3]))
    assert listed.details["moe_layers"] == 3
    # omitted: Llama4TextConfig's intermediate_size_mlp, 16384; null: refused by name
    assert from_hf_config({k: v for k, v in cfg.items() if k != "intermediate_size_mlp"}).ffn_dim == 16384
    with pytest.raises(InvalidInputError, match="config.intermediate_size_mlp"):
        from_hf_config(dict(cfg, intermediate_size_mlp=None))
    # every block MoE: intermediate_size_mlp is not needed
    all_moe = {k: v for k, v in cfg.items() if k not in ("intermediate_size_mlp", "interleave_moe_layer_step")}
    assert from_hf_config(all_moe).ffn_dim == 96


def test_glm4_moe_by_hand():
    cfg = dict(_TINY, model_type="glm4_moe", num_key_value_heads=2, head_dim=24, attention_bias=True,
               use_qk_norm=True, n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=20,
               n_shared_experts=1, first_k_dense_replace=1)
    w = from_hf_config(cfg)
    attention = 64 * 96 + 2 * 64 * 48 + 96 * 64 + (96 + 2 * 48) + 2 * 24   # q/k/v biases, no o bias; q/k norms
    moe = 6 * 64 + 6 * 3 * 64 * 20 + 3 * 64 * 20
    total = (attention + 128 + 3 * 64 * 96) + 3 * (attention + 128 + moe) + 2 * 211 * 64 + 64
    assert w.parameters == total == 202_496                 # transformers 5.23: 202,496
    a = architecture_of(cfg)
    assert (a.rotary_fraction, a.qk_norm, a.attention_out_bias, a.dense_layers) == (0.5, "head", False, 1)


def test_nested_text_configs():
    text = dict(_TINY, num_key_value_heads=2, head_dim=32)
    gemma = {"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 32}}
    w = from_hf_config(gemma)
    alone = from_hf_config(dict(text, model_type="gemma3_text"))
    assert w.parameters == alone.parameters                 # the vision tower is not counted
    assert (w.architecture, w.details["config_model_type"]) == ("gemma3_text", "gemma3")
    mistral = from_hf_config({"model_type": "mistral3", "text_config": dict(text, model_type="ministral3")})
    assert mistral.architecture == "ministral3"
    assert from_hf_config({"model_type": "mistral3", "text_config": text}).architecture == "mistral"
    llama4 = from_hf_config({"model_type": "llama4", "text_config": dict(text, num_local_experts=2,
                                                                         num_experts_per_tok=1)})
    assert llama4.architecture == "llama4_text" and llama4.is_sparse
    with pytest.raises(InvalidInputError, match="config.text_config"):
        from_hf_config({"model_type": "gemma3"})
    with pytest.raises(InvalidInputError, match="config.text_config.hidden_size"):
        from_hf_config({"model_type": "gemma3", "text_config": dict(text, hidden_size=None)})
    # omitted: Gemma3TextConfig's hidden_size, 2304
    assert from_hf_config({"model_type": "gemma3", "text_config": {k: v for k, v in text.items()
                                                                   if k != "hidden_size"}}).hidden_dim == 2304
    with pytest.raises(InvalidInputError, match="config.text_config.model_type"):
        from_hf_config({"model_type": "mistral3", "text_config": dict(text, model_type="bert")})
    with pytest.raises(InvalidInputError, match="config.text_config.num_key_value_heads"):
        from_hf_config({"model_type": "gemma3", "text_config": dict(text, num_key_value_heads=3)})
