"""Llama-variant families (issue 15): Qwen2 (q/k/v biases), Qwen3 (per-head QK-norm),
OLMo 2 (full-width QK-norm, post-norms), Phi-3 (fused qkv_proj and gate_up_proj).

Small real runs (b=2, s=256, random weights) in every regime, SDPA and eager, checkpointing
none and full; one FakeTensorMode run per architecture at its public shape (bf16, b=1, s=2048).
Public shapes: Qwen3-1.7B (hidden 2048, 28 layers, 16 heads, 8 KV heads of 128, MLP 6144, vocab
151936, tied, rope_theta 1e6; huggingface.co/Qwen/Qwen3-1.7B config.json, restated at
apxml.com/models/qwen3-1-7b), OLMo-2-0425-1B (hidden 2048, 16 layers, 16 heads, MLP 8192, vocab
100352, untied, rope_theta 5e5, context 4096; model card at huggingface.co/allenai/OLMo-2-0425-1B),
Phi-3-mini-4k-instruct and Qwen2.5-0.5B (tests/data/hf_configs/).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

_DATA = Path(__file__).resolve().parents[3] / "tests" / "data" / "hf_configs"
_DROP = ("_name_or_path", "architectures", "torch_dtype", "transformers_version", "bos_token_id",
         "eos_token_id", "pad_token_id", "initializer_range", "use_mrope")


def _public(name: str) -> dict:
    data = json.loads((_DATA / f"{name}.json").read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if k not in _DROP}


def _base(model_type, hidden, inter, layers, heads, kv, vocab, tie=False, **extra):
    d = dict(model_type=model_type, vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, hidden_act="silu",
             max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=tie, rope_theta=10000.0)
    d.update(extra)
    return d


QWEN2_TINY = _base("qwen2", 256, 688, 4, 8, 2, 8192, use_sliding_window=False)
QWEN3_TINY = _base("qwen3", 256, 688, 4, 8, 2, 8192, tie=True, head_dim=64, attention_bias=False,
                   use_sliding_window=False)
OLMO2_TINY = _base("olmo2", 256, 688, 4, 8, 8, 8192, attention_bias=False)
OLMO2_GQA_TINY = _base("olmo2", 256, 688, 4, 8, 2, 8192, attention_bias=False)
# (Phi3Config's default pad_token_id 32000 lies outside a small vocabulary: none.)
PHI3_TINY = _base("phi3", 256, 688, 4, 8, 8, 8192, sliding_window=None, pad_token_id=None)
PHI3_GQA_TINY = _base("phi3", 256, 688, 4, 8, 2, 8192, sliding_window=None, pad_token_id=None)
PHI3_PARTIAL_TINY = _base("phi3", 256, 688, 4, 8, 2, 8192, sliding_window=None, partial_rotary_factor=0.75,
                          pad_token_id=None)

QWEN3_1_7B = _base("qwen3", 2048, 6144, 28, 16, 8, 151936, tie=True, head_dim=128, attention_bias=False,
                   use_sliding_window=False, rope_theta=1000000.0, max_position_embeddings=40960)
OLMO2_1B = _base("olmo2", 2048, 8192, 16, 16, 16, 100352, attention_bias=False, rope_theta=500000.0)
PHI3_MINI = _public("Phi-3-mini-4k-instruct")
QWEN25_0_5B = _public("Qwen2.5-0.5B")

MODELS = {
    "qwen2-tiny": QWEN2_TINY, "qwen3-tiny": QWEN3_TINY, "olmo2-tiny": OLMO2_TINY,
    "olmo2-gqa-tiny": OLMO2_GQA_TINY, "phi3-tiny": PHI3_TINY, "phi3-gqa-tiny": PHI3_GQA_TINY,
    "phi3-partial-tiny": PHI3_PARTIAL_TINY,
    "qwen3-1.7b": QWEN3_1_7B, "olmo2-1b": OLMO2_1B, "phi3-mini": PHI3_MINI, "qwen2.5-0.5b": QWEN25_0_5B,
}


def _hf(model: str, dropout: float) -> dict:
    d = copy.deepcopy(MODELS[model])
    d["use_cache"] = False
    d["attention_dropout"] = dropout
    if d["model_type"] == "phi3":
        d.update(resid_pdrop=dropout, embd_pdrop=dropout)
    return d


def _cfg(model, regime, attention="sdpa", checkpointing="none", *, b=2, s=256, method="real",
         optimizer="adamw", optimizer_impl="foreach"):
    ck = "-ckpt" if checkpointing == "full" else ""
    impl = "" if optimizer_impl == "foreach" else f"-{optimizer_impl}"
    return {"id": f"{model}-{regime}-{attention}{ck}{impl}-b{b}-s{s}" + ("-fake" if method == "fake" else ""),
            "family": MODELS[model]["model_type"], "model": model, "hf_config": _hf(model, 0.0),
            "batch_size": b, "seq_len": s, "regime": regime, "optimizer": optimizer,
            "optimizer_impl": optimizer_impl, "checkpointing": checkpointing, "attention": attention,
            "dropout": 0.0, "method": method, "sweep": None}


# In the order measured (the public shapes early: a 2-core machine shared with other work). Per
# architecture at least: fp32 SDPA, bf16 SDPA with full checkpointing, AMP eager.
CONFIGS = (
    [_cfg("qwen3-tiny", "fp32"), _cfg("qwen3-tiny", "bf16"), _cfg("qwen3-tiny", "amp-bf16"),
     _cfg("qwen3-tiny", "fp32", "eager"), _cfg("qwen3-tiny", "bf16", checkpointing="full"),
     _cfg("olmo2-tiny", "fp32"),
     _cfg("qwen3-1.7b", "bf16", b=1, s=2048, method="fake"), _cfg("olmo2-1b", "bf16", b=1, s=2048, method="fake"),
     _cfg("olmo2-tiny", "bf16", checkpointing="full"), _cfg("olmo2-tiny", "amp-bf16", "eager"),
     _cfg("qwen2-tiny", "fp32"), _cfg("qwen2-tiny", "bf16", checkpointing="full"), _cfg("qwen2-tiny", "amp-bf16", "eager"),
     _cfg("phi3-tiny", "fp32"), _cfg("phi3-tiny", "bf16", checkpointing="full"), _cfg("phi3-tiny", "amp-bf16", "eager"),
     _cfg("qwen2.5-0.5b", "bf16", b=1, s=2048, method="fake"), _cfg("phi3-mini", "bf16", b=1, s=2046, method="fake"),
     _cfg("olmo2-tiny", "bf16"), _cfg("olmo2-gqa-tiny", "amp-bf16"), _cfg("phi3-gqa-tiny", "bf16", "eager"),
     _cfg("phi3-tiny", "fp32", "eager", b=1, s=512), _cfg("phi3-partial-tiny", "fp32"),
     _cfg("qwen2-tiny", "fp32", optimizer_impl="for-loop"), _cfg("qwen3-tiny", "amp-bf16", "eager", "full"),
     _cfg("phi3-gqa-tiny", "amp-bf16"), _cfg("phi3-tiny", "bf16", b=1, s=512)]
)
