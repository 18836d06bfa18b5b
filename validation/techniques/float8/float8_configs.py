"""float8 training runs (torchao ``convert_to_float8_training``), measured by ``measure_float8.py``.

Same schema as ``validation/configs.py`` plus ``float8`` (the torchao recipe: "tensorwise" or
"rowwise"; None: the same run without float8, for reference). Every nn.Linear of the decoder
layers is converted; the LM head is filtered out (``module_filter_fn``: torchtitan's converter
leaves the output projection in high precision). Small vocabularies make the cast temporaries
set the forward and backward peaks; larger ones leave the loss's moments on top.
"""

_LLAMA_A = dict(model_type="llama", hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=128, use_cache=False,
                attention_dropout=0.0, tie_word_embeddings=False)
_LLAMA_B = dict(_LLAMA_A, hidden_size=384, intermediate_size=1536, num_hidden_layers=3, num_attention_heads=6,
                num_key_value_heads=2, vocab_size=4096)
_LLAMA_C = dict(_LLAMA_A, hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                num_key_value_heads=4, vocab_size=256)
_MIXTRAL_A = dict(model_type="mixtral", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                  vocab_size=128, use_cache=False, attention_dropout=0.0, router_jitter_noise=0.0,
                  tie_word_embeddings=False)
_MIXTRAL_B = dict(_MIXTRAL_A, hidden_size=512, intermediate_size=768, num_local_experts=8, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=2048)
# Wide attention, narrow experts: the o_proj casts set the peaks.
_MIXTRAL_C = dict(_MIXTRAL_A, hidden_size=512, intermediate_size=128, num_local_experts=2, num_experts_per_tok=1,
                  num_attention_heads=8, num_key_value_heads=8)
# Public shapes (FakeTensorMode), a few layers: Llama-3.1-8B and Mixtral-8x7B.
_LLAMA_8B = dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, use_cache=False,
                 attention_dropout=0.0, tie_word_embeddings=False, rope_theta=500000.0)
_MIXTRAL_8X7B = dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=1,
                     num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                     vocab_size=32000, use_cache=False, attention_dropout=0.0, router_jitter_noise=0.0,
                     tie_word_embeddings=False)


def _run(id, family, model, hf, regime, float8, b, s, method="real", checkpointing="none", filter=None):
    out = dict(id=id, family=family, model=model, hf_config=hf, batch_size=b, seq_len=s, regime=regime,
               optimizer="adamw", optimizer_impl="foreach", checkpointing=checkpointing, attention="sdpa",
               dropout=0.0, method=method, sweep=None, float8=float8)
    if filter:      # "accelerate": its default module filter (layer 0's q_proj and the LM head kept), measure_float8.py
        out["filter"] = filter
    return out


CONFIGS = [
    # accelerate's torchao backend (axolotl's fp8: true): layer 0's q_proj left in high precision too (FP8READ)
    _run("llama-a-bf16-tensorwise-accelerate", "llama", "llama-tiny-a", _LLAMA_A, "bf16", "tensorwise", 2, 128,
         filter="accelerate"),
    _run("llama-c-bf16-tensorwise-accelerate", "llama", "llama-tiny-c", _LLAMA_C, "bf16", "tensorwise", 1, 128,
         filter="accelerate"),
    _run("llama-b-bf16-tensorwise-accelerate", "llama", "llama-tiny-b", _LLAMA_B, "bf16", "tensorwise", 2, 256,
         filter="accelerate"),
    _run("llama-a-bf16-none", "llama", "llama-tiny-a", _LLAMA_A, "bf16", None, 2, 128),
    _run("llama-a-bf16-tensorwise", "llama", "llama-tiny-a", _LLAMA_A, "bf16", "tensorwise", 2, 128),
    _run("llama-a-bf16-rowwise", "llama", "llama-tiny-a", _LLAMA_A, "bf16", "rowwise", 2, 128),
    _run("llama-a-fp32-tensorwise", "llama", "llama-tiny-a", _LLAMA_A, "fp32", "tensorwise", 2, 128),
    _run("llama-c-bf16-tensorwise", "llama", "llama-tiny-c", _LLAMA_C, "bf16", "tensorwise", 1, 128),
    _run("llama-c-bf16-rowwise", "llama", "llama-tiny-c", _LLAMA_C, "bf16", "rowwise", 4, 64),
    _run("llama-b-bf16-tensorwise", "llama", "llama-tiny-b", _LLAMA_B, "bf16", "tensorwise", 2, 256),
    _run("llama-b-bf16-rowwise", "llama", "llama-tiny-b", _LLAMA_B, "bf16", "rowwise", 2, 256),
    _run("llama-b-fp32-rowwise", "llama", "llama-tiny-b", _LLAMA_B, "fp32", "rowwise", 2, 256),
    _run("mixtral-a-bf16-none", "mixtral", "mixtral-tiny-a", _MIXTRAL_A, "bf16", None, 2, 128),
    _run("mixtral-a-bf16-tensorwise", "mixtral", "mixtral-tiny-a", _MIXTRAL_A, "bf16", "tensorwise", 2, 128),
    _run("mixtral-a-bf16-rowwise", "mixtral", "mixtral-tiny-a", _MIXTRAL_A, "bf16", "rowwise", 2, 128),
    _run("mixtral-a-fp32-tensorwise", "mixtral", "mixtral-tiny-a", _MIXTRAL_A, "fp32", "tensorwise", 2, 128),
    _run("mixtral-b-bf16-tensorwise", "mixtral", "mixtral-tiny-b", _MIXTRAL_B, "bf16", "tensorwise", 2, 128),
    _run("mixtral-b-bf16-rowwise", "mixtral", "mixtral-tiny-b", _MIXTRAL_B, "bf16", "rowwise", 2, 128),
    _run("mixtral-c-bf16-tensorwise", "mixtral", "mixtral-tiny-c", _MIXTRAL_C, "bf16", "tensorwise", 1, 64),
    _run("mixtral-c-bf16-rowwise", "mixtral", "mixtral-tiny-c", _MIXTRAL_C, "bf16", "rowwise", 2, 64),
    _run("mixtral-c-fp32-tensorwise", "mixtral", "mixtral-tiny-c", _MIXTRAL_C, "fp32", "tensorwise", 1, 64),
    _run("llama3-8b-2l-bf16-tensorwise-fake", "llama", "llama-3.1-8b (2 layers)", _LLAMA_8B, "bf16", "tensorwise",
         1, 2048, method="fake"),
    _run("llama3-8b-2l-bf16-rowwise-fake", "llama", "llama-3.1-8b (2 layers)", _LLAMA_8B, "bf16", "rowwise",
         1, 2048, method="fake"),
    _run("mixtral-8x7b-1l-bf16-tensorwise-fake", "mixtral", "mixtral-8x7b (1 layer)", _MIXTRAL_8X7B, "bf16",
         "tensorwise", 1, 2048, method="fake"),
]
