"""Runs of the low-bit and new optimizers (schema of validation/configs.py; ``optimizer`` is
the mlsysim optimizer name). Tiny real models: torchao's AdamW8bit fails under FakeTensorMode."""


def _llama(hidden, inter, layers, heads, kv, vocab):
    return dict(model_type="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                rope_theta=10000.0, attention_dropout=0.0, use_cache=False)


def _mixtral(hidden, inter, layers, heads, kv, vocab, experts=4, top_k=2):
    return dict(model_type="mixtral", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                rope_theta=1000000.0, num_local_experts=experts, num_experts_per_tok=top_k,
                router_jitter_noise=0.0, output_router_logits=False, sliding_window=None,
                attention_dropout=0.0, use_cache=False)


MODELS = {
    # (hf_config, batch, seq, regime)
    "llama-s": (_llama(128, 256, 2, 4, 2, 1024), 2, 64, "fp32"),
    "llama-m": (_llama(256, 512, 2, 8, 4, 2048), 2, 64, "bf16"),
    "mixtral-s": (_mixtral(128, 256, 2, 4, 2, 1024), 2, 64, "fp32"),
    "mixtral-m": (_mixtral(256, 384, 2, 8, 4, 2048), 2, 64, "bf16"),
}
OPTIMIZERS = ("adamw-8bit-torchao", "adamw-4bit-torchao", "adamw-fp8-torchao", "adamw-8bit-bnb", "adam-8bit", "muon",
              "adamw-32bit-bnb", "adamw-8bit-bnb-hf", "lion-32bit-bnb")

CONFIGS = [
    dict(id=f"{m}-{o}", family=h["model_type"], model=m, hf_config=h, batch_size=b, seq_len=s, regime=r,
         optimizer=o, optimizer_impl="foreach", checkpointing="none", attention="sdpa", dropout=0.0,
         method="real", sweep=None)
    for m, (h, b, s, r) in MODELS.items() for o in OPTIMIZERS
] + [
    # Muon's AdamW part fused (no temporaries): the step's transient is the Newton-Schulz peak
    dict(id=f"{m}-muon-fused", family=h["model_type"], model=m, hf_config=h, batch_size=b, seq_len=s, regime=r,
         optimizer="muon", optimizer_impl="fused", checkpointing="none", attention="sdpa", dropout=0.0,
         method="real", sweep=None)
    for m, (h, b, s, r) in MODELS.items()
]
