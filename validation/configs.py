"""The configurations the validation harness measures.

Every entry of ``CONFIGS`` is a plain dict (JSON-serialisable, no torch import needed):

``id``              unique name
``family``          ``gpt2`` | ``llama`` | ``llama-gqa`` | ``mixtral``
``model``           the shape the config copies (informational)
``hf_config``       the full keyword set for ``transformers.AutoConfig.for_model(**hf_config)``;
                    ``model_type`` is one of its keys. Random weights, nothing is downloaded.
``batch_size``      micro-batch, 1-16
``seq_len``         128-4096
``regime``          ``fp32`` | ``amp-bf16`` (fp32 weights, forward and loss under
                    ``torch.autocast("cpu", dtype=torch.bfloat16)``) | ``bf16`` (``model.to(bfloat16)``,
                    optimizer on the bf16 parameters)
``optimizer``       ``adamw`` | ``adam`` | ``sgd`` | ``sgd-momentum`` | ``adafactor``
``optimizer_impl``  ``foreach`` | ``fused`` | ``for-loop``
``checkpointing``   ``none`` | ``full`` (HF ``gradient_checkpointing_enable()``, non-reentrant)
``attention``       ``eager`` | ``sdpa`` (``attn_implementation=`` of ``from_config``)
``dropout``         dropout probability written into the HF config (0.0 unless stated)
``method``          ``real`` (real CPU tensors) | ``fake`` (``FakeTensorMode`` on the CPU device)
``sweep``           the sweep id for micro-batch sweeps (same config at 1, 2, 4, 8, 16), else ``None``

Every config's ``hf_config`` has ``use_cache`` False and every dropout field set from ``dropout``.
"""

from __future__ import annotations

import copy

# --------------------------------------------------------------------------- model shapes
# Full HF config keyword sets. Dropout fields and use_cache are filled in by ``_hf``.

GPT2_TINY = dict(  # ~16M (token embedding 12.9M, tied)
    model_type="gpt2", vocab_size=50257, n_positions=1024, n_embd=256, n_layer=4, n_head=4,
    n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
    tie_word_embeddings=True,
)
GPT2_SMALL = dict(  # GPT-2 124M
    model_type="gpt2", vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
    n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
    tie_word_embeddings=True,
)
GPT2_MEDIUM = dict(  # GPT-2 355M
    model_type="gpt2", vocab_size=50257, n_positions=1024, n_embd=1024, n_layer=24, n_head=16,
    n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
    tie_word_embeddings=True,
)
GPT2_XL = dict(  # GPT-2 1.5B
    model_type="gpt2", vocab_size=50257, n_positions=1024, n_embd=1600, n_layer=48, n_head=25,
    n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
    tie_word_embeddings=True,
)


def _llama(hidden, inter, layers, heads, kv, vocab, tie=False, rope_theta=10000.0, max_pos=4096,
           model_type="llama", **extra):
    d = dict(
        model_type=model_type, vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        hidden_act="silu", max_position_embeddings=max_pos, rms_norm_eps=1e-5,
        tie_word_embeddings=tie, rope_theta=rope_theta,
    )
    if model_type == "llama":
        d.update(attention_bias=False, mlp_bias=False)
    d.update(extra)
    return d


# Llama (multi-head attention, kv == heads)
LLAMA_TINY = _llama(256, 688, 4, 8, 8, 32000)                 # ~19M
LLAMA_SMALL = _llama(512, 1376, 8, 8, 8, 32000)               # ~59M
LLAMA_110M = _llama(768, 2048, 12, 12, 12, 32000)             # ~134M (llama2.c 110M-like, untied)
OPEN_LLAMA_3B = _llama(3200, 8640, 26, 32, 32, 32000)         # ~3.4B
LLAMA2_7B = _llama(4096, 11008, 32, 32, 32, 32000)            # ~6.7B
# Llama with grouped-query attention
GQA_TINY = _llama(256, 688, 4, 8, 2, 32000)                   # ~18M
GQA_SMALL = _llama(576, 1536, 10, 9, 3, 49152, tie=True)      # ~110M (SmolLM-135M-like, 10 layers)
TINYLLAMA_1B = _llama(2048, 5632, 22, 32, 4, 32000)           # ~1.1B
LLAMA32_1B = _llama(2048, 8192, 16, 32, 8, 128256, tie=True, rope_theta=500000.0)   # ~1.24B
LLAMA3_8B = _llama(4096, 14336, 32, 32, 8, 128256, rope_theta=500000.0)             # ~8.0B
MISTRAL_7B = _llama(4096, 14336, 32, 32, 8, 32000, model_type="mistral", sliding_window=None,
                    rope_theta=1000000.0)                                           # ~7.2B


def _mixtral(hidden, inter, layers, heads, kv, vocab, experts=8, top_k=2, **extra):
    d = dict(
        model_type="mixtral", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5,
        tie_word_embeddings=False, rope_theta=1000000.0, num_local_experts=experts,
        num_experts_per_tok=top_k, router_jitter_noise=0.0, output_router_logits=False,
        sliding_window=None,
    )
    d.update(extra)
    return d


MIXTRAL_TINY = _mixtral(256, 512, 4, 8, 2, 32000)             # ~29M
MIXTRAL_SMALL = _mixtral(1024, 3584, 8, 16, 4, 32000)         # ~0.77B
MIXTRAL_8X7B_L2 = _mixtral(4096, 14336, 2, 32, 8, 32000)      # Mixtral-8x7B shapes, 2 layers ~3.1B
MIXTRAL_8X7B_L4 = _mixtral(4096, 14336, 4, 32, 8, 32000)      # Mixtral-8x7B shapes, 4 layers ~5.9B

MODELS = {
    "gpt2-tiny": ("gpt2", GPT2_TINY),
    "gpt2-124m": ("gpt2", GPT2_SMALL),
    "gpt2-355m": ("gpt2", GPT2_MEDIUM),
    "gpt2-1.5b": ("gpt2", GPT2_XL),
    "llama-tiny": ("llama", LLAMA_TINY),
    "llama-small": ("llama", LLAMA_SMALL),
    "llama-110m": ("llama", LLAMA_110M),
    "open-llama-3b": ("llama", OPEN_LLAMA_3B),
    "llama-2-7b": ("llama", LLAMA2_7B),
    "gqa-tiny": ("llama-gqa", GQA_TINY),
    "gqa-small": ("llama-gqa", GQA_SMALL),
    "tinyllama-1.1b": ("llama-gqa", TINYLLAMA_1B),
    "llama-3.2-1b": ("llama-gqa", LLAMA32_1B),
    "llama-3-8b": ("llama-gqa", LLAMA3_8B),
    "mistral-7b": ("llama-gqa", MISTRAL_7B),
    "mixtral-tiny": ("mixtral", MIXTRAL_TINY),
    "mixtral-small": ("mixtral", MIXTRAL_SMALL),
    "mixtral-8x7b-2l": ("mixtral", MIXTRAL_8X7B_L2),
    "mixtral-8x7b-4l": ("mixtral", MIXTRAL_8X7B_L4),
}


def _hf(base: dict, dropout: float) -> dict:
    d = copy.deepcopy(base)
    d["use_cache"] = False
    if d["model_type"] == "gpt2":
        d.update(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, summary_first_dropout=dropout)
    else:
        d["attention_dropout"] = dropout
    return d


def _cfg(id, model, batch_size, seq_len, *, regime="fp32", optimizer="adamw", optimizer_impl="foreach",
         checkpointing="none", attention="sdpa", dropout=0.0, method="real", sweep=None):
    family, base = MODELS[model]
    return {
        "id": id,
        "family": family,
        "model": model,
        "hf_config": _hf(base, dropout),
        "batch_size": batch_size,
        "seq_len": seq_len,
        "regime": regime,
        "optimizer": optimizer,
        "optimizer_impl": optimizer_impl,
        "checkpointing": checkpointing,
        "attention": attention,
        "dropout": dropout,
        "method": method,
        "sweep": sweep,
    }


SWEEP_BATCHES = (1, 2, 4, 8, 16)

# Micro-batch sweeps: the same configuration at micro-batches 1, 2, 4, 8, 16.
SWEEPS = [
    # id,             model,             seq,  options
    ("sw-gpt2-tiny", "gpt2-tiny", 128, dict(method="real")),
    ("sw-gqa-tiny-amp", "gqa-tiny", 256, dict(method="real", regime="amp-bf16", optimizer_impl="fused")),
    ("sw-gpt2-124m-eager", "gpt2-124m", 1024, dict(method="fake", attention="eager")),
    ("sw-llama32-1b", "llama-3.2-1b", 2048, dict(method="fake")),
    ("sw-tinyllama-bf16-sgdm", "tinyllama-1.1b", 1024,
     dict(method="fake", regime="bf16", optimizer="sgd-momentum", attention="eager")),
    ("sw-gpt2-1.5b-amp", "gpt2-1.5b", 1024, dict(method="fake", regime="amp-bf16")),
    ("sw-llama2-7b-bf16-ckpt", "llama-2-7b", 2048,
     dict(method="fake", regime="bf16", optimizer_impl="fused", checkpointing="full")),
    ("sw-llama3-8b-amp-ckpt", "llama-3-8b", 4096, dict(method="fake", regime="amp-bf16", checkpointing="full")),
    ("sw-mistral-7b-bf16-adafactor", "mistral-7b", 1024, dict(method="fake", regime="bf16", optimizer="adafactor")),
    ("sw-mixtral-small-amp", "mixtral-small", 1024, dict(method="fake", regime="amp-bf16")),
    ("sw-mixtral-8x7b-bf16-ckpt", "mixtral-8x7b-4l", 2048,
     dict(method="fake", regime="bf16", optimizer="adam", optimizer_impl="fused", checkpointing="full")),
]

# Single configurations: the other axes, one or two changes at a time.
SINGLES = [
    # GPT-2 style
    _cfg("gpt2-tiny-fp32-adamw-loop-eager-b4-s512", "gpt2-tiny", 4, 512, optimizer_impl="for-loop", attention="eager"),
    _cfg("gpt2-tiny-fp32-adamw-foreach-eager-drop-b4-s512", "gpt2-tiny", 4, 512, attention="eager", dropout=0.1),
    _cfg("gpt2-tiny-amp-adamw-foreach-sdpa-ckpt-b8-s512", "gpt2-tiny", 8, 512, regime="amp-bf16", checkpointing="full"),
    _cfg("gpt2-124m-fp32-adamw-fused-sdpa-b2-s512", "gpt2-124m", 2, 512, optimizer_impl="fused"),
    _cfg("gpt2-124m-bf16-sgd-foreach-eager-b2-s256", "gpt2-124m", 2, 256, regime="bf16", optimizer="sgd",
         attention="eager"),
    _cfg("gpt2-355m-fp32-adam-foreach-sdpa-ckpt-b8-s1024", "gpt2-355m", 8, 1024, optimizer="adam",
         checkpointing="full", method="fake"),
    # Llama (MHA)
    _cfg("llama-tiny-fp32-adam-foreach-sdpa-b8-s256", "llama-tiny", 8, 256, optimizer="adam"),
    _cfg("llama-tiny-fp32-adam-foreach-eager-b8-s256", "llama-tiny", 8, 256, optimizer="adam", attention="eager"),
    _cfg("llama-tiny-bf16-adamw-fused-sdpa-b4-s512", "llama-tiny", 4, 512, regime="bf16", optimizer_impl="fused"),
    _cfg("llama-small-amp-adafactor-foreach-eager-b2-s1024", "llama-small", 2, 1024, regime="amp-bf16",
         optimizer="adafactor", attention="eager"),
    _cfg("llama-small-fp32-sgd-momentum-loop-sdpa-ckpt-b4-s512", "llama-small", 4, 512, optimizer="sgd-momentum",
         optimizer_impl="for-loop", checkpointing="full"),
    _cfg("llama-110m-fp32-adamw-foreach-sdpa-b1-s1024", "llama-110m", 1, 1024),
    _cfg("llama-110m-amp-adamw-fused-sdpa-ckpt-b2-s512", "llama-110m", 2, 512, regime="amp-bf16",
         optimizer_impl="fused", checkpointing="full"),
    _cfg("open-llama-3b-amp-adamw-foreach-eager-b2-s2048", "open-llama-3b", 2, 2048, regime="amp-bf16",
         attention="eager", method="fake"),
    _cfg("llama-2-7b-bf16-adafactor-loop-sdpa-b1-s4096", "llama-2-7b", 1, 4096, regime="bf16",
         optimizer="adafactor", optimizer_impl="for-loop", method="fake"),
    # Llama with GQA
    _cfg("gqa-tiny-fp32-adamw-foreach-eager-b4-s1024", "gqa-tiny", 4, 1024, attention="eager"),
    _cfg("gqa-tiny-bf16-sgd-fused-sdpa-ckpt-b16-s256", "gqa-tiny", 16, 256, regime="bf16", optimizer="sgd",
         optimizer_impl="fused", checkpointing="full"),
    _cfg("gqa-small-amp-adamw-foreach-sdpa-b2-s512", "gqa-small", 2, 512, regime="amp-bf16"),
    _cfg("gqa-small-fp32-adam-fused-eager-ckpt-b2-s512", "gqa-small", 2, 512, optimizer="adam",
         optimizer_impl="fused", attention="eager", checkpointing="full"),
    _cfg("tinyllama-1.1b-amp-adamw-fused-sdpa-ckpt-b4-s2048", "tinyllama-1.1b", 4, 2048, regime="amp-bf16",
         optimizer_impl="fused", checkpointing="full", method="fake"),
    _cfg("llama3-8b-bf16-adamw-foreach-sdpa-b1-s2048", "llama-3-8b", 1, 2048, regime="bf16", method="fake"),
    _cfg("llama3-8b-bf16-sgd-foreach-eager-ckpt-b2-s1024", "llama-3-8b", 2, 1024, regime="bf16", optimizer="sgd",
         attention="eager", checkpointing="full", method="fake"),
    _cfg("mistral-7b-amp-adamw-fused-sdpa-b1-s512", "mistral-7b", 1, 512, regime="amp-bf16",
         optimizer_impl="fused", method="fake"),
    _cfg("llama-3.2-1b-fp32-adafactor-foreach-eager-b1-s128", "llama-3.2-1b", 1, 128, optimizer="adafactor",
         attention="eager", method="fake"),
    # Mixtral style
    _cfg("mixtral-tiny-fp32-adamw-foreach-sdpa-b4-s256", "mixtral-tiny", 4, 256),
    _cfg("mixtral-tiny-amp-adamw-fused-eager-ckpt-b4-s256", "mixtral-tiny", 4, 256, regime="amp-bf16",
         optimizer_impl="fused", attention="eager", checkpointing="full"),
    _cfg("mixtral-tiny-bf16-adafactor-foreach-sdpa-b8-s128", "mixtral-tiny", 8, 128, regime="bf16",
         optimizer="adafactor"),
    _cfg("mixtral-8x7b-2l-fp32-adamw-foreach-sdpa-b1-s1024", "mixtral-8x7b-2l", 1, 1024, method="fake"),
    _cfg("mixtral-8x7b-2l-amp-sgd-momentum-foreach-eager-b2-s512", "mixtral-8x7b-2l", 2, 512, regime="amp-bf16",
         optimizer="sgd-momentum", attention="eager", method="fake"),
]

# The same configurations measured both ways: real and fake tensors must agree to the byte.
TWINS = [
    _cfg("twin-gpt2-tiny-fp32-eager-drop-b2-s256-real", "gpt2-tiny", 2, 256, attention="eager", dropout=0.1),
    _cfg("twin-gpt2-tiny-fp32-eager-drop-b2-s256-fake", "gpt2-tiny", 2, 256, attention="eager", dropout=0.1,
         method="fake"),
    _cfg("twin-gqa-tiny-amp-ckpt-b2-s256-real", "gqa-tiny", 2, 256, regime="amp-bf16", checkpointing="full"),
    _cfg("twin-gqa-tiny-amp-ckpt-b2-s256-fake", "gqa-tiny", 2, 256, regime="amp-bf16", checkpointing="full",
         method="fake"),
    _cfg("twin-mixtral-tiny-bf16-b2-s256-real", "mixtral-tiny", 2, 256, regime="bf16"),
    _cfg("twin-mixtral-tiny-bf16-b2-s256-fake", "mixtral-tiny", 2, 256, regime="bf16", method="fake"),
    _cfg("twin-mixtral-tiny-fp32-b2-s256-real", "mixtral-tiny", 2, 256),
    _cfg("twin-mixtral-tiny-fp32-b2-s256-fake", "mixtral-tiny", 2, 256, method="fake"),
    _cfg("twin-llama-tiny-bf16-adafactor-eager-b2-s256-real", "llama-tiny", 2, 256, regime="bf16",
         optimizer="adafactor", attention="eager"),
    _cfg("twin-llama-tiny-bf16-adafactor-eager-b2-s256-fake", "llama-tiny", 2, 256, regime="bf16",
         optimizer="adafactor", attention="eager", method="fake"),
    _cfg("twin-gqa-tiny-fp32-adafactor-loop-b2-s256-real", "gqa-tiny", 2, 256, optimizer="adafactor",
         optimizer_impl="for-loop"),
    _cfg("twin-gqa-tiny-fp32-adafactor-loop-b2-s256-fake", "gqa-tiny", 2, 256, optimizer="adafactor",
         optimizer_impl="for-loop", method="fake"),
]


def _sweep_configs() -> list[dict]:
    out = []
    for sweep_id, model, seq, opts in SWEEPS:
        for b in SWEEP_BATCHES:
            out.append(_cfg(f"{sweep_id}-b{b}-s{seq}", model, b, seq, sweep=sweep_id, **opts))
    return out


CONFIGS: list[dict] = _sweep_configs() + SINGLES + TWINS


def _check() -> None:
    ids = [c["id"] for c in CONFIGS]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for c in CONFIGS:
        assert c["family"] in ("gpt2", "llama", "llama-gqa", "mixtral"), c["id"]
        assert 1 <= c["batch_size"] <= 16 and 128 <= c["seq_len"] <= 4096, c["id"]
        assert c["regime"] in ("fp32", "amp-bf16", "bf16"), c["id"]
        assert c["optimizer"] in ("adamw", "adam", "sgd", "sgd-momentum", "adafactor"), c["id"]
        assert c["optimizer_impl"] in ("foreach", "fused", "for-loop"), c["id"]
        assert not (c["optimizer"] == "adafactor" and c["optimizer_impl"] == "fused"), c["id"]
        assert c["checkpointing"] in ("none", "full") and c["attention"] in ("eager", "sdpa"), c["id"]
        assert c["method"] in ("real", "fake"), c["id"]


_check()

if __name__ == "__main__":
    real = sum(c["method"] == "real" for c in CONFIGS)
    print(f"{len(CONFIGS)} configs: {real} real, {len(CONFIGS) - real} fake, {len(SWEEPS)} sweeps")
