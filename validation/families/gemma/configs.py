"""Gemma family runs (issue 15): Gemma 1 ("gemma"), Gemma 2 ("gemma2"), the Gemma 3 text model
("gemma3_text", Gemma3ForCausalLM). Schema: validation/configs.py. Tiny real runs cover every
mechanism (fp32 (1 + w) RMSNorms, four norms per layer, sqrt(hidden) embedding scale, GeGLU,
final and attention logit soft-capping, sliding windows shorter than the sequence, QK-norm, two
rotary embeddings, head_dim x heads != hidden, multi-query attention); FakeTensorMode runs at
the public Gemma-2-2B and Gemma-3-1B shapes (bf16, b=1, s=2048).

Gemma 2 runs only with eager attention: transformers 5.23's Gemma2PreTrainedModel has
_supports_sdpa = False (SDPA has no soft-capping), so attn_implementation="sdpa" raises.
"""

from __future__ import annotations

import copy


def _gemma(hidden, inter, layers, heads, kv, head_dim, vocab, **extra):
    d = dict(model_type="gemma", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
             hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
             rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=10000.0, attention_bias=False,
             pad_token_id=0, bos_token_id=2, eos_token_id=1)
    d.update(extra)
    return d


def _gemma2(hidden, inter, layers, heads, kv, head_dim, vocab, window, **extra):
    d = _gemma(hidden, inter, layers, heads, kv, head_dim, vocab, model_type="gemma2", sliding_window=window,
               query_pre_attn_scalar=head_dim, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
               layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)])
    d.update(extra)
    return d


def _gemma3(hidden, inter, layers, heads, kv, head_dim, vocab, window, **extra):
    d = _gemma(hidden, inter, layers, heads, kv, head_dim, vocab, model_type="gemma3_text", sliding_window=window,
               query_pre_attn_scalar=head_dim, attn_logit_softcapping=None, final_logit_softcapping=None,
               layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)],
               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
               use_bidirectional_attention=False)
    d.pop("rope_theta")
    d.update(extra)
    return d


# Tiny shapes: q_dim = heads x head_dim != hidden, as in the public models.
GEMMA_TINY = _gemma(256, 1024, 2, 4, 1, 96, 4096)                    # multi-query, like Gemma-2B
GEMMA2_TINY = _gemma2(256, 768, 4, 4, 2, 128, 4096, 64)              # window 64 < s
GEMMA3_TINY = _gemma3(256, 768, 6, 4, 1, 128, 4096, 64)              # 5 sliding : 1 full, multi-query
# Public shapes
GEMMA2_2B = _gemma2(2304, 9216, 26, 8, 4, 256, 256000, 4096)         # google/gemma-2-2b
GEMMA3_1B = _gemma3(1152, 6912, 26, 4, 1, 256, 262144, 512, max_position_embeddings=32768)   # google/gemma-3-1b-pt

MODELS = {"gemma-tiny": GEMMA_TINY, "gemma2-tiny": GEMMA2_TINY, "gemma3-tiny": GEMMA3_TINY,
          "gemma-2-2b": GEMMA2_2B, "gemma-3-1b": GEMMA3_1B}


def kernel_note(model: str, attention: str, seq_len: int, method: str) -> str:
    """Which attention kernel the run exercised (checked with a TorchDispatchMode logging aten ops)."""
    hf = MODELS[model]
    on = "FakeTensorMode on the CPU device (the CPU dispatch, meta kernels)" if method == "fake" else "CPU"
    mqa = hf["num_key_value_heads"] == 1
    if attention == "eager" or hf["model_type"] == "gemma2":
        note = (f"{on}: eager attention (matmul, softmax, matmul; k and v repeated by repeat_kv"
                + (", a stride-0 view for one KV head, materialized by the matmul" if mqa else "") + "); additive (b, 1, s, s) masks")
        if hf["model_type"] == "gemma2":
            note += " for the full and the sliding layers; tanh logit soft-capping"
        return note
    window = hf.get("sliding_window")
    if hf["model_type"] == "gemma3_text" and window and seq_len >= window:
        return (f"{on}: full layers: _scaled_dot_product_flash_attention_for_cpu, no mask, enable_gqa (k, v at "
                "one head); sliding layers (s >= window): the same flash kernel with the (b, 1, s, s) bool mask, "
                "which SDPA converts to an additive mask in the query's dtype and saves; k, v repeated by repeat_kv "
                "as stride-0 views (one KV head; AMP's bf16 cast of k materializes it). No math-kernel fallback.")
    return f"{on}: _scaled_dot_product_flash_attention_for_cpu, no mask (is_causal), enable_gqa (k, v at one head)"


def _cfg(id, model, batch_size, seq_len, *, regime="fp32", checkpointing="none", attention="sdpa", method="real"):
    hf = copy.deepcopy(MODELS[model])
    hf.update(use_cache=False, attention_dropout=0.0)
    return {"kernel_note": kernel_note(model, attention, seq_len, method), "id": id, "family": "gemma",
            "model": model, "hf_config": hf, "batch_size": batch_size,
            "seq_len": seq_len, "regime": regime, "optimizer": "adamw", "optimizer_impl": "foreach",
            "checkpointing": checkpointing, "attention": attention, "dropout": 0.0, "method": method, "sweep": None}


CONFIGS = [
    _cfg("gemma-tiny-fp32-sdpa", "gemma-tiny", 2, 256),
    _cfg("gemma-tiny-bf16-sdpa", "gemma-tiny", 2, 256, regime="bf16"),
    _cfg("gemma-tiny-amp-sdpa", "gemma-tiny", 2, 256, regime="amp-bf16"),
    _cfg("gemma-tiny-fp32-eager", "gemma-tiny", 2, 256, attention="eager"),
    _cfg("gemma-tiny-bf16-eager", "gemma-tiny", 2, 256, regime="bf16", attention="eager"),
    _cfg("gemma-tiny-fp32-sdpa-full", "gemma-tiny", 2, 256, checkpointing="full"),
    _cfg("gemma2-tiny-fp32-eager", "gemma2-tiny", 2, 256, attention="eager"),
    _cfg("gemma2-tiny-bf16-eager", "gemma2-tiny", 2, 256, regime="bf16", attention="eager"),
    _cfg("gemma2-tiny-amp-eager", "gemma2-tiny", 2, 256, regime="amp-bf16", attention="eager"),
    _cfg("gemma2-tiny-fp32-eager-full", "gemma2-tiny", 2, 256, attention="eager", checkpointing="full"),
    _cfg("gemma3-tiny-fp32-sdpa", "gemma3-tiny", 2, 256),
    _cfg("gemma3-tiny-bf16-sdpa", "gemma3-tiny", 2, 256, regime="bf16"),
    _cfg("gemma3-tiny-amp-sdpa", "gemma3-tiny", 2, 256, regime="amp-bf16"),
    _cfg("gemma3-tiny-fp32-eager", "gemma3-tiny", 2, 256, attention="eager"),
    _cfg("gemma3-tiny-bf16-eager", "gemma3-tiny", 2, 256, regime="bf16", attention="eager"),
    _cfg("gemma3-tiny-bf16-sdpa-full", "gemma3-tiny", 2, 256, regime="bf16", checkpointing="full"),
    _cfg("gemma-2-2b-bf16-eager-fake", "gemma-2-2b", 1, 2048, regime="bf16", attention="eager", method="fake"),
    _cfg("gemma-3-1b-bf16-sdpa-fake", "gemma-3-1b", 1, 2048, regime="bf16", method="fake"),
]
