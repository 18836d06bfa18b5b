"""DeepSeek family runs (issue 15): DeepSeek-V2 ("deepseek_v2") and DeepSeek-V3 ("deepseek_v3";
Kimi K2 is a DeepSeek-V3: its config.json says model_type "kimi_k2", which transformers 5.23 does
not know, so it is measured as deepseek_v3). Schema: validation/configs.py.

Tiny real runs cover every mechanism: multi-head latent attention with and without q_lora_rank,
qk head dim (nope + rope) != v head dim, one dense first layer then MoE layers with shared experts,
V2 softmax routing (greedy and group_limited_greedy), V3 sigmoid group-limited routing with
norm_topk_prob and routed_scaling_factor; fp32 and bf16, sdpa and eager, checkpointing none and
full, amp-bf16 (autocast) too, batch 1 and 2 (at batch > 1 the batched matmul copies v instead of keeping a view of
kv_b_proj's output). The experts run with transformers' default experts_implementation
"grouped_mm" (measured: DeepseekV3Experts is decorated with use_experts_implementation).

``kernel_note`` per run says which attention kernel ran: on CPU, SDPA with unequal q/k and v head
dims takes the fp32 math kernel (a GPU would take the memory-efficient kernel: not measured here).

The FakeTensorMode run copies DeepSeek-V2-Lite's public shape (deepseek-ai/DeepSeek-V2-Lite
config.json: hidden 2048, 27 layers, 16 heads, intermediate 10944, kv_lora_rank 512,
q_lora_rank null, qk_nope 128, qk_rope 64, v_head 128, 64 routed experts top-6, 2 shared,
moe_intermediate 1408, first_k_dense_replace 1, vocab 102400; as in the Megatron-style
DeepSeek-V2-Lite config found with the search tools: num_layers 27, hidden_size 2048,
ffn_hidden_size 10944, num_attention_heads 16, q_lora_rank null, kv_lora_rank 512, qk_head_dim
128, qk_pos_emb_head_dim 64, v_head_dim 128, moe_layer_freq [0]*1+[1]*26, num_experts 64,
moe_ffn_hidden_size 1408, moe_shared_expert_intermediate_size 2816), all 27 layers (1 dense, 26 MoE).
"""

from __future__ import annotations

import copy


def _v2(hidden, inter, moe_inter, layers, heads, vocab, *, q_lora, kv_lora, nope, rope, v, experts, top_k, shared,
        first_k, **extra):
    d = dict(model_type="deepseek_v2", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
             moe_intermediate_size=moe_inter, num_hidden_layers=layers, num_attention_heads=heads,
             num_key_value_heads=heads, q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope_head_dim=nope,
             qk_rope_head_dim=rope, v_head_dim=v, n_routed_experts=experts, num_experts_per_tok=top_k,
             n_shared_experts=shared, first_k_dense_replace=first_k, topk_method="greedy", n_group=None,
             topk_group=None, norm_topk_prob=False, routed_scaling_factor=1.0, hidden_act="silu",
             max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
             mlp_bias=False)
    d.update(extra)
    return d


def _v3(hidden, inter, moe_inter, layers, heads, vocab, *, q_lora, kv_lora, nope, rope, v, experts, top_k, shared,
        first_k, n_group, topk_group, **extra):
    d = _v2(hidden, inter, moe_inter, layers, heads, vocab, q_lora=q_lora, kv_lora=kv_lora, nope=nope, rope=rope, v=v,
            experts=experts, top_k=top_k, shared=shared, first_k=first_k, model_type="deepseek_v3", n_group=n_group,
            topk_group=topk_group, norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True)
    for key in ("topk_method", "mlp_bias"):
        d.pop(key)
    d.update(extra)
    return d


# Tiny shapes: q/k head 48 (32 + 16) != v head 40; 1 dense layer then 2 MoE layers.
V2_TINY = _v2(256, 512, 128, 3, 8, 2048, q_lora=None, kv_lora=96, nope=32, rope=16, v=40, experts=8, top_k=2,
              shared=2, first_k=1)
V2_TINY_GROUPS = dict(V2_TINY, topk_method="group_limited_greedy", n_group=4, topk_group=2)
V3_TINY = _v3(256, 512, 128, 3, 8, 2048, q_lora=128, kv_lora=96, nope=32, rope=16, v=40, experts=8, top_k=2,
              shared=1, first_k=1, n_group=4, topk_group=2)
LAYERS_LITE = 27
V2_LITE = _v2(2048, 10944, 1408, LAYERS_LITE, 16, 102400, q_lora=None, kv_lora=512, nope=128, rope=64, v=128,
              experts=64, top_k=6, shared=2, first_k=1)

MODELS = {"deepseek-v2-tiny": V2_TINY, "deepseek-v2-tiny-groups": V2_TINY_GROUPS, "deepseek-v3-tiny": V3_TINY,
          "deepseek-v2-lite": V2_LITE}

CPU_MATH = "sdpa on CPU: the math kernel (unequal q/k and v head dims), fp32 q/k/v and s x s probabilities"
EAGER = "eager: q @ k^T, fp32 softmax (+ bf16 copy), weights @ v"


def _cfg(id_, model, batch, seq, *, regime="fp32", attention="sdpa", checkpointing="none", method="real"):
    hf = copy.deepcopy(MODELS[model])
    hf.update(use_cache=False, attention_dropout=0.0)
    return dict(id=id_, family="deepseek", model=model, hf_config=hf, batch_size=batch, seq_len=seq, regime=regime,
                optimizer="adamw", optimizer_impl="foreach", checkpointing=checkpointing, attention=attention,
                dropout=0.0, method=method, sweep=None, kernel_note=CPU_MATH if attention == "sdpa" else EAGER)


CONFIGS = [
    _cfg("deepseek-v2-tiny-fp32-sdpa", "deepseek-v2-tiny", 1, 256),
    _cfg("deepseek-v2-tiny-bf16-sdpa", "deepseek-v2-tiny", 1, 256, regime="bf16"),
    _cfg("deepseek-v2-tiny-fp32-eager", "deepseek-v2-tiny", 1, 256, attention="eager"),
    _cfg("deepseek-v2-tiny-bf16-eager", "deepseek-v2-tiny", 1, 256, regime="bf16", attention="eager"),
    _cfg("deepseek-v2-tiny-fp32-sdpa-full", "deepseek-v2-tiny", 1, 256, checkpointing="full"),
    _cfg("deepseek-v2-tiny-groups-bf16-sdpa-b2", "deepseek-v2-tiny-groups", 2, 128, regime="bf16"),
    _cfg("deepseek-v3-tiny-fp32-sdpa", "deepseek-v3-tiny", 1, 256),
    _cfg("deepseek-v3-tiny-bf16-sdpa", "deepseek-v3-tiny", 1, 256, regime="bf16"),
    _cfg("deepseek-v3-tiny-fp32-eager-b2", "deepseek-v3-tiny", 2, 128, attention="eager"),
    _cfg("deepseek-v3-tiny-bf16-eager", "deepseek-v3-tiny", 1, 256, regime="bf16", attention="eager"),
    _cfg("deepseek-v3-tiny-fp32-sdpa-b2", "deepseek-v3-tiny", 2, 128),
    _cfg("deepseek-v3-tiny-bf16-sdpa-full", "deepseek-v3-tiny", 1, 256, regime="bf16", checkpointing="full"),
    _cfg("deepseek-v3-tiny-fp32-eager-full", "deepseek-v3-tiny", 1, 256, attention="eager", checkpointing="full"),
    _cfg("deepseek-v2-tiny-amp-sdpa", "deepseek-v2-tiny", 1, 256, regime="amp-bf16"),
    _cfg("deepseek-v3-tiny-amp-sdpa", "deepseek-v3-tiny", 1, 256, regime="amp-bf16"),
    _cfg("deepseek-v2-lite-bf16-sdpa-fake", "deepseek-v2-lite", 1, 2048, regime="bf16", method="fake"),
]
