"""Activation-checkpointing policies measured on Hugging Face Llama and Mixtral models (tiny, two
sizes each). Schema of ``validation/configs.py`` plus ``policy`` (the checkpointing strategy the
measured profile names: op-sac, every-k, mlp-only, attention-only, save-list) and ``policy_options``
(its plugin options: ``k`` for every-k, ``ops`` for save-list)."""

from __future__ import annotations


def _llama(hidden, inter, layers, heads, kv, vocab):
    return dict(model_type="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, hidden_act="silu",
                max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=10000.0,
                attention_bias=False, mlp_bias=False, use_cache=False, attention_dropout=0.0)


def _mixtral(hidden, inter, layers, heads, kv, vocab, experts=8, top_k=2):
    return dict(model_type="mixtral", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, hidden_act="silu",
                max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=1e6,
                num_local_experts=experts, num_experts_per_tok=top_k, router_jitter_noise=0.0,
                output_router_logits=False, use_cache=False, attention_dropout=0.0)


MODELS = {
    "llama-tiny": ("llama", _llama(256, 688, 4, 8, 8, 8000)),
    "llama-small": ("llama", _llama(384, 1024, 6, 6, 2, 12000)),      # GQA
    "mixtral-tiny": ("mixtral", _mixtral(256, 512, 4, 8, 2, 8000)),
    "mixtral-small": ("mixtral", _mixtral(320, 640, 6, 8, 4, 12000)),
}

POLICIES = {
    "op-sac": {},
    "every-k": {"k": 2},
    "mlp-only": {},
    "attention-only": {},
    "save-list": {"ops": ["mm", "sdpa"]},
}


def _cfg(model, policy, *, regime="fp32", attention="sdpa", batch_size=2, seq_len=256, options=None):
    family, hf = MODELS[model]
    opts = dict(POLICIES[policy] if options is None else options)
    tag = "" if options is None else "-" + "-".join(f"{k}{'+'.join(v) if isinstance(v, list) else v}"
                                                   for k, v in opts.items())
    return {"id": f"{model}-{policy}{tag}-{regime}-{attention}-b{batch_size}s{seq_len}", "family": family,
            "model": model, "hf_config": dict(hf), "batch_size": batch_size, "seq_len": seq_len, "regime": regime,
            "optimizer": "adamw", "optimizer_impl": "foreach", "checkpointing": policy, "policy_options": opts,
            "attention": attention, "dropout": 0.0, "method": "real", "sweep": None}


CONFIGS = [
    *(_cfg(m, p) for m in MODELS for p in POLICIES),
    *(_cfg("llama-tiny", p, regime="amp-bf16") for p in ("op-sac", "mlp-only", "attention-only")),
    *(_cfg("mixtral-tiny", p, regime="amp-bf16") for p in ("op-sac", "attention-only")),
    _cfg("llama-small", "op-sac", regime="bf16"),
    _cfg("mixtral-small", "mlp-only", regime="bf16"),
    _cfg("llama-tiny", "op-sac", attention="eager"),
    _cfg("llama-small", "every-k", options={"k": 3}),
]
