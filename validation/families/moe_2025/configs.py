"""Qwen-MoE (qwen2_moe, qwen3_moe) and Llama 4 text (llama4_text) runs for
``validation/families/measure_families.py moe_2025``: tiny real runs (fp32, bf16, AMP; SDPA and eager;
checkpointing none and full) and FakeTensorMode runs at public shapes with fewer layers.

Public shapes (config.json values, checked against public copies):
* Qwen3-30B-A3B: hidden 2048, 32 heads, 4 KV heads, head_dim 128, 128 experts top-8, moe_intermediate_size
  768, vocab 151936, 48 layers, norm_topk_prob true (Megatron args of zyzshishui/slime
  scripts/models/qwen3-30B-A3B.sh: --hidden-size 2048 --num-attention-heads 32 --num-query-groups 4
  --kv-channels 128 --moe-ffn-hidden-size 768 --moe-router-topk 8 --num-experts 128 --vocab-size 151936);
  measured with 4 of its 48 layers.
* Llama-4-Scout-17B-16E text model: hidden 5120, 40 heads, 8 KV heads, head_dim 128, 16 experts top-1,
  intermediate_size 8192, intermediate_size_mlp 16384, vocab 202048, 48 layers, MoE every layer,
  no_rope_layer_interval 4, attention_chunk_size 8192 (transformers 5.23 Llama4TextConfig defaults, the
  Scout checkpoint's; also Shameerisb/llama-4-scout_Implementation_Pytorch configs/text_config.py);
  measured with 4 of its 48 layers (the 4th is a NoPE layer).
"""

from __future__ import annotations

import copy


def _qwen3_moe(hidden, layers, heads, kv, head_dim, vocab, experts, top_k, moe_inter, inter=None, **extra):
    d = dict(model_type="qwen3_moe", vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
             num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, hidden_act="silu",
             max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=1000000.0,
             num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=moe_inter,
             intermediate_size=inter or 3 * moe_inter, norm_topk_prob=True, decoder_sparse_step=1,
             mlp_only_layers=[], output_router_logits=False, use_sliding_window=False, sliding_window=None)
    d.update(extra)
    return d


def _qwen2_moe(hidden, layers, heads, kv, vocab, experts, top_k, moe_inter, shared, inter, **extra):
    d = dict(model_type="qwen2_moe", vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
             num_attention_heads=heads, num_key_value_heads=kv, hidden_act="silu", max_position_embeddings=8192,
             rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=1000000.0, num_experts=experts,
             num_experts_per_tok=top_k, moe_intermediate_size=moe_inter, shared_expert_intermediate_size=shared,
             intermediate_size=inter, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
             output_router_logits=False, use_sliding_window=False, sliding_window=None, qkv_bias=True)
    d.update(extra)
    return d


def _llama4(hidden, layers, heads, kv, head_dim, vocab, experts, inter, inter_mlp, step=1, **extra):
    d = dict(model_type="llama4_text", vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
             num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, hidden_act="silu",
             intermediate_size=inter, intermediate_size_mlp=inter_mlp, num_local_experts=experts,
             num_experts_per_tok=1, interleave_moe_layer_step=step, max_position_embeddings=131072,
             rms_norm_eps=1e-5, tie_word_embeddings=False, use_qk_norm=True, no_rope_layer_interval=4,
             attention_chunk_size=8192, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, output_router_logits=False,
             router_jitter_noise=0.0)
    d.update(extra)
    return d


QWEN3_TINY = _qwen3_moe(256, 4, 8, 2, 64, 8192, 8, 2, 128)
QWEN3_TINY_DENSE = _qwen3_moe(256, 4, 8, 2, 64, 8192, 8, 2, 128, inter=512, mlp_only_layers=[0])
QWEN3_30B_A3B_L4 = _qwen3_moe(2048, 4, 32, 4, 128, 151936, 128, 8, 768, inter=6144)
QWEN2_TINY = _qwen2_moe(256, 4, 8, 8, 8192, 8, 2, 128, 512, 512)
QWEN2_TINY_SPARSE2 = _qwen2_moe(256, 4, 8, 8, 8192, 8, 2, 128, 512, 384, decoder_sparse_step=2)
LLAMA4_TINY = _llama4(256, 4, 8, 2, 32, 8192, 4, 256, 512)
LLAMA4_TINY_INTERLEAVED = _llama4(256, 4, 8, 2, 32, 8192, 4, 256, 512, step=2)     # Maverick-like
LLAMA4_SCOUT_L4 = _llama4(5120, 4, 40, 8, 128, 202048, 16, 8192, 16384)

MODELS = {
    "qwen3-moe-tiny": ("qwen3_moe", QWEN3_TINY),
    "qwen3-moe-tiny-dense0": ("qwen3_moe", QWEN3_TINY_DENSE),
    "qwen3-30b-a3b-4l": ("qwen3_moe", QWEN3_30B_A3B_L4),
    "qwen2-moe-tiny": ("qwen2_moe", QWEN2_TINY),
    "qwen2-moe-tiny-step2": ("qwen2_moe", QWEN2_TINY_SPARSE2),
    "llama4-tiny": ("llama4_text", LLAMA4_TINY),
    "llama4-tiny-interleaved": ("llama4_text", LLAMA4_TINY_INTERLEAVED),
    "llama4-scout-4l": ("llama4_text", LLAMA4_SCOUT_L4),
}


def _cfg(id, model, batch_size, seq_len, *, regime="fp32", checkpointing="none", attention="sdpa", method="real"):
    family, base = MODELS[model]
    hf = copy.deepcopy(base)
    hf.update(use_cache=False, attention_dropout=0.0)
    return {"id": id, "family": family, "model": model, "hf_config": hf, "batch_size": batch_size,
            "seq_len": seq_len, "regime": regime, "optimizer": "adamw", "optimizer_impl": "foreach",
            "checkpointing": checkpointing, "attention": attention, "dropout": 0.0, "method": method, "sweep": None}


CONFIGS = [
    _cfg("qwen3-moe-tiny-fp32-sdpa", "qwen3-moe-tiny", 2, 256),
    _cfg("qwen3-moe-tiny-bf16-sdpa", "qwen3-moe-tiny", 2, 256, regime="bf16"),
    _cfg("qwen3-moe-tiny-bf16-eager", "qwen3-moe-tiny", 2, 256, regime="bf16", attention="eager"),
    _cfg("qwen3-moe-tiny-amp-sdpa", "qwen3-moe-tiny", 2, 256, regime="amp-bf16"),
    _cfg("qwen3-moe-tiny-fp32-full", "qwen3-moe-tiny", 2, 256, checkpointing="full"),
    _cfg("qwen3-moe-tiny-dense0-bf16-sdpa", "qwen3-moe-tiny-dense0", 2, 256, regime="bf16"),
    _cfg("qwen2-moe-tiny-fp32-sdpa", "qwen2-moe-tiny", 2, 256),
    _cfg("qwen2-moe-tiny-bf16-sdpa", "qwen2-moe-tiny", 2, 256, regime="bf16"),
    _cfg("qwen2-moe-tiny-fp32-eager", "qwen2-moe-tiny", 2, 256, attention="eager"),
    _cfg("qwen2-moe-tiny-amp-sdpa", "qwen2-moe-tiny", 2, 256, regime="amp-bf16"),
    _cfg("qwen2-moe-tiny-bf16-full", "qwen2-moe-tiny", 2, 256, regime="bf16", checkpointing="full"),
    _cfg("qwen2-moe-tiny-step2-fp32-sdpa", "qwen2-moe-tiny-step2", 2, 256),
    _cfg("llama4-tiny-fp32-sdpa", "llama4-tiny", 2, 256),
    _cfg("llama4-tiny-bf16-sdpa", "llama4-tiny", 2, 256, regime="bf16"),
    _cfg("llama4-tiny-bf16-eager", "llama4-tiny", 2, 256, regime="bf16", attention="eager"),
    _cfg("llama4-tiny-fp32-eager", "llama4-tiny", 2, 256, attention="eager"),
    _cfg("llama4-tiny-amp-sdpa", "llama4-tiny", 2, 256, regime="amp-bf16"),
    _cfg("llama4-tiny-fp32-full", "llama4-tiny", 2, 256, checkpointing="full"),
    _cfg("llama4-tiny-interleaved-bf16-sdpa", "llama4-tiny-interleaved", 2, 256, regime="bf16"),
    _cfg("qwen3-30b-a3b-4l-bf16-fake", "qwen3-30b-a3b-4l", 1, 2048, regime="bf16", method="fake"),
    _cfg("llama4-scout-4l-bf16-fake", "llama4-scout-4l", 1, 2048, regime="bf16", method="fake"),
    _cfg("llama4-scout-4l-bf16-full-fake", "llama4-scout-4l", 1, 2048, regime="bf16", checkpointing="full",
         method="fake"),
]
