"""Architecture import from Hugging Face config.json files, without transformers.

The committed configs under tests/data/hf_configs/ are the public config.json files of
the models named (fields copied as published). Their parameter counts are the exact
figures Hugging Face reports for those checkpoints; tests/test_hf_models.py checks the
same counts against the real transformers classes where transformers is installed.
"""

import json
from pathlib import Path

import pytest

from mlsysim_core import InvalidInputError, SparseTransformerWorkload, TransformerWorkload
from mlsysim_core.catalog import get_model
from mlsysim_core.hf import (SUPPORTED_MODEL_TYPES, HFArchitecture, architecture_of, from_hf_config,
                             load_hf_config)

CONFIGS = Path(__file__).parent / "data" / "hf_configs"

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
}


def load(name):
    return json.loads((CONFIGS / name).read_text())


def test_every_committed_config_is_covered():
    assert sorted(p.name for p in CONFIGS.glob("*.json")) == sorted(EXACT)


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_counts_of_published_configs(name):
    total, active, _ = EXACT[name]
    w = from_hf_config(CONFIGS / name)
    assert w.parameters == total
    assert w.architecture == load(name)["model_type"]
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
    # num_key_value_heads defaults to the head count
    mistral = {k: v for k, v in load("Mistral-7B-v0.1.json").items() if k != "num_key_value_heads"}
    assert from_hf_config(mistral).kv_heads == 32


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


@pytest.mark.parametrize("field", ["num_hidden_layers", "hidden_size", "num_attention_heads",
                                   "vocab_size", "intermediate_size"])
def test_missing_size_is_named(field):
    cfg = {k: v for k, v in load("Llama-3.2-1B.json").items() if k != field}
    with pytest.raises(InvalidInputError, match=f"config.{field}"):
        from_hf_config(cfg)


def test_missing_moe_fields_are_named():
    cfg = {k: v for k, v in load("Mixtral-8x7B-v0.1.json").items() if k != "num_local_experts"}
    with pytest.raises(InvalidInputError, match="config.num_local_experts"):
        from_hf_config(cfg)
    cfg = {k: v for k, v in load("Qwen1.5-MoE-A2.7B.json").items() if k != "moe_intermediate_size"}
    with pytest.raises(InvalidInputError, match="config.moe_intermediate_size"):
        from_hf_config(cfg)


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
