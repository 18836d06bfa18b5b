"""gpt-oss family runs (issue 15): gpt-oss-20b / gpt-oss-120b ("gpt_oss", GptOssForCausalLM in
transformers 5.23). Schema: validation/configs.py. Tiny real runs cover every mechanism: attention
sinks (a learned per-head logit concatenated to the eager scores), alternating sliding-window and
full layers (window 64 < s), q/k/v/o biases, head_dim x heads != hidden, GQA, YaRN rotary, a router
with a bias, biased experts with the clamped SwiGLU (grouped_mm, the default experts
implementation); fp32, bf16 and AMP, checkpointing none and full. FakeTensorMode runs at the
public shapes with their layers reduced (bf16, b=1, s=2048): gpt-oss-20b at 2 of its 24 layers and at
4 with full checkpointing, gpt-oss-120b (128 experts) at 2 of its 36.

Only eager attention: GptOssPreTrainedModel has _supports_sdpa = False (SDPA has no sinks), so
attn_implementation="sdpa" raises ValueError; flex_attention and the hub flash kernels are not
measured (no CPU kernel here) and the family refuses them.

gpt-oss-20b's shape (its config.json: 24 layers, hidden 2880, 64 heads, 8 KV heads, head_dim 64,
32 local experts, 4 per token, intermediate 2880, vocab 201088, sliding_window 128, layer_types
alternating sliding/full, YaRN factor 32 over 4096, rope_theta 150000, attention_bias true), as
copied e.g. in https://huggingface.co/descript/mouse-20b/blob/main/config.json and the Megatron
arguments of https://gitcode.com/Ascend/slime-ascend/blob/main/scripts/models/gpt-oss-20B.sh.
"""

from __future__ import annotations

import copy


def _gpt_oss(hidden, inter, layers, heads, kv, head_dim, vocab, experts, top_k, window, **extra):
    d = dict(model_type="gpt_oss", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
             num_local_experts=experts, num_experts_per_tok=top_k, sliding_window=window,
             layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
             max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
             rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                              "truncate": False, "original_max_position_embeddings": 4096, "rope_theta": 150000.0},
             attention_bias=True, swiglu_limit=7.0, router_aux_loss_coef=0.9, output_router_logits=False,
             hidden_act="silu", pad_token_id=0)
    d.update(extra)
    return d


# Tiny: q_dim = 8 x 48 = 384 != hidden 256, 4 query heads per KV head, window 64 < s.
GPT_OSS_TINY = _gpt_oss(256, 192, 4, 8, 2, 48, 4096, 8, 2, 64)
# openai/gpt-oss-20b with 2 of its 24 layers (one sliding, one full).
GPT_OSS_20B_2L = _gpt_oss(2880, 2880, 2, 64, 8, 64, 201088, 32, 4, 128)
GPT_OSS_20B_4L = _gpt_oss(2880, 2880, 4, 64, 8, 64, 201088, 32, 4, 128)
# openai/gpt-oss-120b (36 layers, 128 experts, otherwise as 20b) with 2 of its 36 layers.
GPT_OSS_120B_2L = _gpt_oss(2880, 2880, 2, 64, 8, 64, 201088, 128, 4, 128)

MODELS = {"gpt-oss-tiny": GPT_OSS_TINY, "gpt-oss-20b-2L": GPT_OSS_20B_2L, "gpt-oss-20b-4L": GPT_OSS_20B_4L,
          "gpt-oss-120b-2L": GPT_OSS_120B_2L}


def _cfg(id, model, batch_size, seq_len, *, regime="fp32", checkpointing="none", method="real"):
    hf = copy.deepcopy(MODELS[model])
    hf.update(use_cache=False, attention_dropout=0.0)
    return {"id": id, "family": "gpt_oss", "model": model, "hf_config": hf, "batch_size": batch_size,
            "seq_len": seq_len, "regime": regime, "optimizer": "adamw", "optimizer_impl": "foreach",
            "checkpointing": checkpointing, "attention": "eager", "dropout": 0.0, "method": method, "sweep": None}


CONFIGS = [
    _cfg("gpt-oss-tiny-fp32-eager", "gpt-oss-tiny", 2, 256),
    _cfg("gpt-oss-tiny-bf16-eager", "gpt-oss-tiny", 2, 256, regime="bf16"),
    _cfg("gpt-oss-tiny-amp-eager", "gpt-oss-tiny", 2, 256, regime="amp-bf16"),
    _cfg("gpt-oss-tiny-fp32-eager-ckpt", "gpt-oss-tiny", 2, 256, checkpointing="full"),
    _cfg("gpt-oss-tiny-bf16-eager-ckpt", "gpt-oss-tiny", 2, 256, regime="bf16", checkpointing="full"),
    _cfg("gpt-oss-20b-2L-bf16-eager-fake", "gpt-oss-20b-2L", 1, 2048, regime="bf16", method="fake"),
    _cfg("gpt-oss-20b-4L-bf16-eager-ckpt-fake", "gpt-oss-20b-4L", 1, 2048, regime="bf16", checkpointing="full",
         method="fake"),
    _cfg("gpt-oss-120b-2L-bf16-eager-fake", "gpt-oss-120b-2L", 1, 2048, regime="bf16", method="fake"),
]


# gpt-oss under transformers' flex_attention with the sinks through the log-sum-exp (measure_flex_sinks.py: the
# profiler's memory timeline, real tensors only; flex_sinks_measurements.json). The tiny shape with a 32,768-token
# vocabulary: the loss's moments (b x s x V logits) set the phases' peaks, not the fp32 scores that the CPU's
# uncompiled flex_attention materialises as temporaries (a GPU's fused kernels do not), so every phase measures
# the bytes the layers keep.
GPT_OSS_TINY_V32K = dict(GPT_OSS_TINY, vocab_size=32768)
MODELS["gpt-oss-tiny-v32k"] = GPT_OSS_TINY_V32K


def _flex(id, *args, **kw):
    cfg = _cfg(id, *args, **kw)
    cfg["attention"] = "flex_attention"
    return cfg


FLEX_SINKS_CONFIGS = [
    _flex("gpt-oss-tiny-v32k-fp32-flex", "gpt-oss-tiny-v32k", 2, 256),
    _flex("gpt-oss-tiny-v32k-bf16-flex", "gpt-oss-tiny-v32k", 2, 256, regime="bf16"),
    _flex("gpt-oss-tiny-v32k-amp-flex", "gpt-oss-tiny-v32k", 2, 256, regime="amp-bf16"),
    _flex("gpt-oss-tiny-v32k-fp32-flex-ckpt", "gpt-oss-tiny-v32k", 2, 256, checkpointing="full"),
    _flex("gpt-oss-tiny-v32k-bf16-flex-ckpt", "gpt-oss-tiny-v32k", 2, 256, regime="bf16", checkpointing="full"),
]
