"""from_hf_config() against the real transformers classes: sum(p.numel()) of the model training uses.

Needs the validation extra (torch and transformers); skipped without it. Nothing is
downloaded: tiny configs are built with random weights on the CPU, and the full-size
committed configs on the meta device (no memory allocated).
"""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mlsysim_core.hf import from_hf_config  # noqa: E402

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"

_SMALL = dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, vocab_size=211,
              intermediate_size=96, max_position_embeddings=128)
_MLA = dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12)
_DS = dict(n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=20, n_group=2, topk_group=1)

# (model_type, overrides): each feature of each family at least once.
TINY = {
    "llama-gqa-untied": ("llama", dict(_SMALL, num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-biases-tied-head_dim": ("llama", dict(_SMALL, num_key_value_heads=1, head_dim=24,
                                                 attention_bias=True, mlp_bias=True,
                                                 tie_word_embeddings=True)),
    "mistral-sliding-head_dim": ("mistral", dict(_SMALL, num_key_value_heads=2, head_dim=32,
                                                 sliding_window=16)),
    "qwen2-bias-tied": ("qwen2", dict(_SMALL, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen2-bias-untied-sliding": ("qwen2", dict(_SMALL, num_key_value_heads=2, use_sliding_window=True,
                                                sliding_window=16, max_window_layers=1)),
    "qwen3-qknorm": ("qwen3", dict(_SMALL, num_key_value_heads=2, head_dim=40, attention_bias=True)),
    "gemma": ("gemma", dict(_SMALL, num_key_value_heads=1, head_dim=48)),
    "gemma-untied": ("gemma", dict(_SMALL, num_key_value_heads=4, head_dim=16, tie_word_embeddings=False)),
    "gemma2": ("gemma2", dict(_SMALL, num_key_value_heads=2, head_dim=32, sliding_window=16)),
    "gemma2-bias": ("gemma2", dict(_SMALL, num_key_value_heads=4, head_dim=16, attention_bias=True,
                                   tie_word_embeddings=False)),
    "gemma3_text": ("gemma3_text", dict(_SMALL, num_key_value_heads=2, head_dim=32)),
    "phi3": ("phi3", dict(_SMALL, num_key_value_heads=2, pad_token_id=0)),
    "phi3-tied": ("phi3", dict(_SMALL, num_key_value_heads=4, pad_token_id=0,
                               tie_word_embeddings=True)),
    "gpt2": ("gpt2", dict(n_layer=3, n_embd=64, n_head=4, vocab_size=211, n_positions=100)),
    "gpt2-n_inner-untied": ("gpt2", dict(n_layer=2, n_embd=48, n_head=3, vocab_size=97, n_positions=64,
                                         n_inner=80, tie_word_embeddings=False)),
    "gpt2-cross-attention": ("gpt2", dict(n_layer=2, n_embd=32, n_head=2, vocab_size=97, n_positions=64,
                                          add_cross_attention=True)),
    "gpt_neox": ("gpt_neox", dict(_SMALL)),
    "gpt_neox-nobias-tied-sequential": ("gpt_neox", dict(_SMALL, attention_bias=False, tie_word_embeddings=True,
                                                         use_parallel_residual=False)),
    "falcon-multi_query": ("falcon", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                          vocab_size=211, multi_query=True, parallel_attn=True)),
    "falcon-new-arch": ("falcon", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=8,
                                       num_kv_heads=2, vocab_size=211, new_decoder_architecture=True,
                                       ffn_hidden_size=100, tie_word_embeddings=False)),
    "falcon-new-arch-one-ln": ("falcon", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=8,
                                              num_kv_heads=2, vocab_size=211, new_decoder_architecture=True,
                                              num_ln_in_parallel_attn=1)),
    "falcon-sequential-bias-mha": ("falcon", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                  vocab_size=211, multi_query=False, parallel_attn=False,
                                                  bias=True)),
    "olmo": ("olmo", dict(_SMALL, num_key_value_heads=2, attention_bias=True)),
    "olmo2": ("olmo2", dict(_SMALL, num_key_value_heads=2)),
    "mixtral": ("mixtral", dict(_SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "mixtral-tied": ("mixtral", dict(_SMALL, num_key_value_heads=4, num_local_experts=3, num_experts_per_tok=1,
                                     head_dim=24, tie_word_embeddings=True)),
    "qwen2_moe": ("qwen2_moe", dict(_SMALL, num_key_value_heads=2, num_experts=6, num_experts_per_tok=2,
                                    moe_intermediate_size=24, shared_expert_intermediate_size=72)),
    "qwen2_moe-sparse-step-odd-shared": ("qwen2_moe", dict(_SMALL, num_hidden_layers=5, num_key_value_heads=4,
                                                           num_experts=4, num_experts_per_tok=1, moe_intermediate_size=24,
                                                           shared_expert_intermediate_size=50,
                                                           decoder_sparse_step=2, mlp_only_layers=[3],
                                                           qkv_bias=False, tie_word_embeddings=True)),
    "qwen2_moe-all-dense": ("qwen2_moe", dict(_SMALL, num_key_value_heads=1, num_experts=4,
                                              num_experts_per_tok=1, moe_intermediate_size=24, shared_expert_intermediate_size=48,
                                              mlp_only_layers=[0, 1, 2])),
    "qwen3_moe": ("qwen3_moe", dict(_SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=24,
                                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                                    mlp_only_layers=[0])),
    # issue 15 (each measured with transformers 5.23 when written)
    "deepseek_v3": ("deepseek_v3", dict(_SMALL, num_hidden_layers=4, **_MLA, **_DS, n_shared_experts=2,
                                        first_k_dense_replace=1)),
    "deepseek_v3-noq-bias-tied": ("deepseek_v3", dict(_SMALL, num_hidden_layers=4, **dict(_MLA, q_lora_rank=None),
                                                      **_DS, n_shared_experts=1, first_k_dense_replace=2,
                                                      attention_bias=True, tie_word_embeddings=True)),
    "deepseek_v3-all-dense": ("deepseek_v3", dict(_SMALL, **_MLA, **_DS, n_shared_experts=1, first_k_dense_replace=9)),
    "deepseek_v2": ("deepseek_v2", dict(_SMALL, num_hidden_layers=4, **_MLA, **_DS, n_shared_experts=2,
                                        first_k_dense_replace=1)),
    "deepseek_v2-noq-biases": ("deepseek_v2", dict(_SMALL, num_hidden_layers=4, **dict(_MLA, q_lora_rank=None), **_DS,
                                                   n_shared_experts=3, first_k_dense_replace=2, mlp_bias=True,
                                                   attention_bias=True)),
    "deepseek_v2-all-moe": ("deepseek_v2", dict(_SMALL, **_MLA, **_DS, n_shared_experts=2, first_k_dense_replace=0)),
    "glm4_moe": ("glm4_moe", dict(_SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=24, attention_bias=True,
                                  use_qk_norm=True, n_routed_experts=6, num_experts_per_tok=2,
                                  moe_intermediate_size=20, n_shared_experts=1, first_k_dense_replace=1)),
    "glm4_moe-all-moe-tied": ("glm4_moe", dict(_SMALL, num_key_value_heads=2, n_routed_experts=5, num_experts_per_tok=1,
                                               moe_intermediate_size=20, n_shared_experts=2, first_k_dense_replace=0,
                                               tie_word_embeddings=True)),
    "gpt_oss": ("gpt_oss", dict(_SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=24, num_local_experts=5,
                                num_experts_per_tok=2, sliding_window=16)),
    "gpt_oss-nobias-tied": ("gpt_oss", dict(_SMALL, num_hidden_layers=5, num_key_value_heads=1, head_dim=16,
                                            num_local_experts=4, num_experts_per_tok=1, attention_bias=False,
                                            tie_word_embeddings=True)),
    "llama4_text-interleaved": ("llama4_text", dict(_SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=24,
                                                    num_local_experts=4, num_experts_per_tok=1,
                                                    intermediate_size_mlp=80, interleave_moe_layer_step=2)),
    "llama4_text-all-moe-bias": ("llama4_text", dict(_SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=16,
                                                     num_local_experts=3, num_experts_per_tok=2,
                                                     intermediate_size_mlp=80, attention_bias=True)),
    "llama4_text-listed": ("llama4_text", dict(_SMALL, num_hidden_layers=4, num_key_value_heads=4, head_dim=16,
                                               num_local_experts=3, num_experts_per_tok=1, intermediate_size_mlp=80,
                                               moe_layers=[0, 3], use_qk_norm=False)),
    "ministral": ("ministral", dict(_SMALL, num_key_value_heads=2, head_dim=24, sliding_window=16)),
    "ministral3": ("ministral3", dict(_SMALL, num_key_value_heads=2, head_dim=24)),
}

_V = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40, image_size=28,
          patch_size=14)
# Multimodal configs: the count is the text model's, AutoModelForCausalLM.from_config(config.text_config)
NESTED = {
    "gemma3": ("gemma3", dict(text_config=dict(_SMALL, num_key_value_heads=2, head_dim=32), vision_config=_V)),
    "gemma3-untied": ("gemma3", dict(text_config=dict(_SMALL, num_key_value_heads=1, head_dim=16,
                                                      tie_word_embeddings=False), vision_config=_V)),
    "llama4": ("llama4", dict(text_config=dict(_SMALL, num_key_value_heads=2, head_dim=16, num_local_experts=3,
                                               num_experts_per_tok=1, intermediate_size_mlp=80,
                                               interleave_moe_layer_step=2),
                              vision_config=dict(_V, vision_output_dim=32, projector_input_dim=32,
                                                 projector_output_dim=32))),
    "mistral3": ("mistral3", dict(text_config=dict(_SMALL, model_type="mistral", num_key_value_heads=2, head_dim=24),
                                  vision_config=dict(_V, model_type="pixtral", head_dim=16))),
    "mistral3-ministral3": ("mistral3", dict(text_config=dict(_SMALL, model_type="ministral3", num_key_value_heads=2,
                                                              head_dim=24),
                                             vision_config=dict(_V, model_type="pixtral", head_dim=16))),
}


def numel(model):
    return sum(p.numel() for p in model.parameters())


def routed_expert_numel(model):
    """Parameters of the routed experts (not the shared expert, not the router)."""
    return sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)


def build(config, device="cpu"):
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(config)


def check(config, model):
    total = numel(model)
    for data in (config.to_dict(), config.to_diff_dict()):    # full and as save_pretrained writes it
        w = from_hf_config(data)
        assert w.parameters == total
        if w.is_sparse:
            routed = routed_expert_numel(model)
            skipped = routed * (w.experts - w.active_experts_per_token) // w.experts
            assert w.active_parameters == total - skipped
    assert from_hf_config(config).parameters == total               # a config object works too
    return total


@pytest.mark.parametrize("case", sorted(TINY))
def test_tiny_configs_match_the_real_model(case):
    model_type, overrides = TINY[case]
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    model = build(config)
    check(config, model)


@pytest.mark.parametrize("case", sorted(NESTED))
def test_nested_configs_count_the_text_model(case):
    model_type, kwargs = NESTED[case]
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    text = build(config.text_config)
    total = numel(text)
    for data in (config.to_dict(), config.to_diff_dict()):
        w = from_hf_config(data)
        assert w.parameters == total
        assert w.architecture == config.text_config.model_type


def test_mtp_layers_are_not_built():
    config = transformers.AutoConfig.for_model("deepseek_v3", **TINY["deepseek_v3"][1])
    with_mtp = transformers.AutoConfig.for_model("deepseek_v3", **dict(TINY["deepseek_v3"][1], num_nextn_predict_layers=2))
    assert numel(build(with_mtp)) == numel(build(config)) == from_hf_config(with_mtp.to_dict()).parameters


def test_cross_check_some_counts_by_name():
    # the tied case really shares the matrix, so it is counted once
    config = transformers.AutoConfig.for_model("qwen2", **dict(_SMALL, num_key_value_heads=4,
                                                                tie_word_embeddings=True))
    model = build(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert from_hf_config(config.to_dict()).tied_embeddings


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda p: p.stem)
def test_full_size_configs_on_the_meta_device(path):
    data = json.loads(path.read_text())
    config = transformers.AutoConfig.for_model(**data)
    if data["model_type"] in ("gemma3", "llama4", "mistral3"):
        config = config.text_config
    model = build(config, "meta")
    assert numel(model) == from_hf_config(path).parameters
    check(config, model)
