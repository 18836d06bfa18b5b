"""GLM-4.5 ("glm4_moe"), Ministral ("ministral") and Ministral 3 ("ministral3") family runs (issue 15).
Schema: validation/configs.py.

Tiny real runs cover every mechanism the families model:
* glm4_moe: GQA with q/k/v biases (attention_bias), per-head QK-norm (use_qk_norm, GLM-4.5) and
  without it (GLM-4.5-Air), partial rotary (partial_rotary_factor 0.5), one dense first layer then
  MoE layers (first_k_dense_replace), routed experts (grouped_mm) with a shared expert, sigmoid
  group-limited routing (n_group, topk_group), norm_topk_prob, routed_scaling_factor;
* ministral: Ministral-8B's interleaved layer types (one full-attention layer, then three sliding-
  window ones: the model card's "Ragged (128k,32k,32k,32k)"), with seq_len past the window (SDPA gets
  a mask in the sliding layers) and below it (no mask);
* ministral3: Llama attention with the Llama-4 attention scale on q (rope_parameters
  llama_4_scaling_beta), without a sliding window (the default) and with one (every layer masked).
fp32, bf16 and amp-bf16; sdpa and eager; checkpointing none and full; batch 1 and 2.

FakeTensorMode runs at public shapes (bf16, b 1, s 2048):
* GLM-4.5-Air, reduced to 4 layers (1 dense + 3 MoE): hidden 4096, 96 heads, 8 KV heads, head_dim 128,
  intermediate 10944, 128 routed experts top-8 of moe_intermediate 1408, 1 shared expert,
  first_k_dense_replace 1, n_group 1, topk_group 1, norm_topk_prob, routed_scaling_factor 1.0,
  partial_rotary_factor 0.5, attention_bias true, use_qk_norm false, vocab 151552, untied: as
  slime's Megatron arguments for GLM-4.5-Air (zianglih/miles scripts/models/glm4.5-106B-A12B.sh @
  85956cff: 96 heads, 8 query groups, kv-channels 128, hidden 4096, ffn 10944, add-qkv-bias, rotary-percent
  0.5, vocab 151552, moe-ffn 1408, shared 1408, topk 8, 128 experts, [0]*1+[1]*45, no qk-layernorm)
  and a printed Glm4MoeConfig of zai-org/GLM-4.5-Air found with the search tools (the same values
  plus n_group 1, topk_group 1, norm_topk_prob true, routed_scaling_factor 1.0, use_qk_norm false).
* Ministral-8B-Instruct-2410, all 36 layers: hidden 4096, 32 heads, 8 KV heads, head_dim 128,
  intermediate 12288, vocab 131072, untied, sliding window 32768 in three of every four layers (the
  model card's architecture table, e.g. huggingface.co/QuantFactory/Ministral-8B-Instruct-2410-GGUF:
  8,019,808,256 parameters, which these shapes give exactly). s 2048 < 32768: no mask.
* Ministral 3 8B (transformers 5.23's Ministral3Config defaults, its docstring's
  mistralai/Ministral-3-8B-Base-2512: hidden 4096, 32 heads, 8 KV heads, head_dim 128, intermediate
  14336, vocab 131072), reduced to 4 of its 34 layers.
"""

from __future__ import annotations

import copy


def _glm(hidden, inter, moe_inter, layers, heads, kv_heads, head_dim, vocab, *, experts, top_k, shared, first_k,
         n_group, topk_group, qk_norm, scaling=2.5, **extra):
    d = dict(model_type="glm4_moe", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
             moe_intermediate_size=moe_inter, num_hidden_layers=layers, num_attention_heads=heads,
             num_key_value_heads=kv_heads, head_dim=head_dim, n_routed_experts=experts, num_experts_per_tok=top_k,
             n_shared_experts=shared, first_k_dense_replace=first_k, n_group=n_group, topk_group=topk_group,
             norm_topk_prob=True, routed_scaling_factor=scaling, partial_rotary_factor=0.5, attention_bias=True,
             use_qk_norm=qk_norm, hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5,
             tie_word_embeddings=False, num_nextn_predict_layers=0)
    d.update(extra)
    return d


def _ministral(hidden, inter, layers, heads, kv_heads, vocab, *, window, head_dim=None, **extra):
    types = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(layers)]
    d = dict(model_type="ministral", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
             # MinistralConfig's head_dim defaults to None, which MinistralAttention takes as is: say it
             head_dim=head_dim or hidden // heads,
             hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
             sliding_window=window, layer_types=types)
    d.update(extra)
    return d


def _ministral3(hidden, inter, layers, heads, kv_heads, head_dim, vocab, *, window=None, **extra):
    d = dict(model_type="ministral3", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
             hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
             sliding_window=window, pad_token_id=None,
             # Ministral3Config's default yarn rope with the Llama-4 scale, a short original context so
             # that positions past it get a scale > 1
             rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 64.0,
                              "original_max_position_embeddings": 64, "max_position_embeddings": 4096,
                              "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                              "llama_4_scaling_beta": 0.1})
    d.update(extra)
    return d


# Tiny shapes: 1 dense layer then 2 MoE layers; head_dim 32 x 8 heads, 2 KV heads; 8 experts in 2 groups.
GLM_TINY = _glm(256, 512, 128, 3, 8, 2, 32, 2048, experts=8, top_k=2, shared=1, first_k=1, n_group=2, topk_group=1,
                qk_norm=True)
GLM_AIR_TINY = _glm(256, 512, 128, 3, 8, 2, 48, 2048, experts=8, top_k=2, shared=2, first_k=1, n_group=1, topk_group=1,
                    qk_norm=False, scaling=1.0)
GLM_AIR = _glm(4096, 10944, 1408, 4, 96, 8, 128, 151552, experts=128, top_k=8, shared=1, first_k=1, n_group=1,
               topk_group=1, qk_norm=False, scaling=1.0, max_position_embeddings=131072)
MINISTRAL_TINY = _ministral(256, 512, 4, 8, 2, 2048, window=64)
MINISTRAL_TINY_WIDE = _ministral(256, 512, 4, 8, 2, 2048, window=256)     # window past seq_len: no mask
MINISTRAL_8B = _ministral(4096, 12288, 36, 32, 8, 131072, window=32768, head_dim=128, max_position_embeddings=32768)
MINISTRAL3_TINY = _ministral3(256, 512, 3, 8, 2, 32, 2048)
MINISTRAL3_TINY_WINDOW = _ministral3(256, 512, 3, 8, 2, 32, 2048, window=64)
MINISTRAL3_8B = _ministral3(4096, 14336, 4, 32, 8, 128, 131072)

MODELS = {"glm45-tiny": GLM_TINY, "glm45-air-tiny": GLM_AIR_TINY, "glm45-air-4l": GLM_AIR,
          "ministral-tiny": MINISTRAL_TINY, "ministral-tiny-wide": MINISTRAL_TINY_WIDE, "ministral-8b": MINISTRAL_8B,
          "ministral3-tiny": MINISTRAL3_TINY, "ministral3-tiny-window": MINISTRAL3_TINY_WINDOW,
          "ministral3-8b-4l": MINISTRAL3_8B}

SDPA = "sdpa on CPU: the flash kernel (enable_gqa without a mask; with a mask k, v repeated and the mask saved)"
EAGER = "eager: q @ k^T, fp32 softmax (+ bf16 copy), weights @ v"


def _cfg(id_, model, batch, seq, *, regime="fp32", attention="sdpa", checkpointing="none", method="real"):
    hf = copy.deepcopy(MODELS[model])
    hf.update(use_cache=False, attention_dropout=0.0)
    return dict(id=id_, family=hf["model_type"], model=model, hf_config=hf, batch_size=batch, seq_len=seq,
                regime=regime, optimizer="adamw", optimizer_impl="foreach", checkpointing=checkpointing,
                attention=attention, dropout=0.0, method=method, sweep=None,
                kernel_note=SDPA if attention == "sdpa" else EAGER)


CONFIGS = [
    _cfg("glm45-tiny-fp32-sdpa", "glm45-tiny", 1, 128),
    _cfg("glm45-tiny-bf16-sdpa", "glm45-tiny", 1, 128, regime="bf16"),
    _cfg("glm45-tiny-fp32-eager", "glm45-tiny", 1, 128, attention="eager"),
    _cfg("glm45-tiny-bf16-eager", "glm45-tiny", 1, 128, regime="bf16", attention="eager"),
    _cfg("glm45-tiny-fp32-sdpa-full", "glm45-tiny", 1, 128, checkpointing="full"),
    _cfg("glm45-tiny-bf16-sdpa-full", "glm45-tiny", 1, 128, regime="bf16", checkpointing="full"),
    _cfg("glm45-tiny-amp-sdpa", "glm45-tiny", 1, 128, regime="amp-bf16"),
    _cfg("glm45-air-tiny-fp32-sdpa-b2", "glm45-air-tiny", 2, 64),
    _cfg("glm45-air-tiny-bf16-eager", "glm45-air-tiny", 1, 128, regime="bf16", attention="eager"),
    _cfg("glm45-air-tiny-bf16-eager-full", "glm45-air-tiny", 1, 128, regime="bf16", attention="eager",
         checkpointing="full"),
    _cfg("glm45-air-4l-bf16-sdpa-fake", "glm45-air-4l", 1, 2048, regime="bf16", method="fake"),
    _cfg("ministral-tiny-fp32-sdpa", "ministral-tiny", 1, 128),
    _cfg("ministral-tiny-bf16-sdpa", "ministral-tiny", 1, 128, regime="bf16"),
    _cfg("ministral-tiny-fp32-eager", "ministral-tiny", 1, 128, attention="eager"),
    _cfg("ministral-tiny-bf16-eager", "ministral-tiny", 1, 128, regime="bf16", attention="eager"),
    _cfg("ministral-tiny-fp32-sdpa-full", "ministral-tiny", 1, 128, checkpointing="full"),
    _cfg("ministral-tiny-bf16-sdpa-full", "ministral-tiny", 1, 128, regime="bf16", checkpointing="full"),
    _cfg("ministral-tiny-bf16-sdpa-b2", "ministral-tiny", 2, 128, regime="bf16"),
    _cfg("ministral-tiny-amp-sdpa", "ministral-tiny", 1, 128, regime="amp-bf16"),
    _cfg("ministral-tiny-wide-bf16-sdpa", "ministral-tiny-wide", 1, 128, regime="bf16"),
    _cfg("ministral-8b-bf16-sdpa-fake", "ministral-8b", 1, 2048, regime="bf16", method="fake"),
    _cfg("ministral3-tiny-fp32-sdpa", "ministral3-tiny", 1, 128),
    _cfg("ministral3-tiny-bf16-sdpa", "ministral3-tiny", 1, 128, regime="bf16"),
    _cfg("ministral3-tiny-fp32-eager", "ministral3-tiny", 1, 128, attention="eager"),
    _cfg("ministral3-tiny-bf16-eager", "ministral3-tiny", 1, 128, regime="bf16", attention="eager"),
    _cfg("ministral3-tiny-fp32-sdpa-full", "ministral3-tiny", 1, 128, checkpointing="full"),
    _cfg("ministral3-tiny-bf16-sdpa-full", "ministral3-tiny", 1, 128, regime="bf16", checkpointing="full"),
    _cfg("ministral3-tiny-amp-sdpa", "ministral3-tiny", 1, 128, regime="amp-bf16"),
    _cfg("ministral3-tiny-window-bf16-sdpa", "ministral3-tiny-window", 1, 128, regime="bf16"),
    _cfg("ministral3-tiny-window-fp32-sdpa-b2", "ministral3-tiny-window", 2, 128),
    _cfg("ministral3-8b-4l-bf16-sdpa-fake", "ministral3-8b-4l", 1, 2048, regime="bf16", method="fake"),
]
