"""Parallel-residual families (GPT-NeoX / Pythia, Falcon): the runs measured for
``plugins/mlsysim_plugins/measured/architectures/parallel_residual.py``.

Tiny real runs (CPU, random weights) of the three layouts: GPT-NeoX with partial rotary
(rotary_pct 0.25) and parallel residual; Falcon-7B-style (multi-query, one shared LayerNorm,
parallel attention); Falcon-40B-style (new_decoder_architecture, 2 KV heads, ln_attn and
ln_mlp). FakeTensorMode runs at the public shapes of Pythia-1.4B and Falcon-7B (bf16, b=1,
s=2048). Each run says which attention kernel it exercised (``kernel_note``).

Public shapes: Pythia-1.4B (EleutherAI/pythia-1.4b config.json: hidden_size 2048, 24 layers,
16 heads, intermediate_size 8192, vocab_size 50304, rotary_pct 0.25, hidden_act gelu,
use_parallel_residual true, tie_word_embeddings false); Falcon-7B (tiiuae/falcon-7b
config.json: hidden_size 4544, 32 layers, 71 heads, multi_query true,
new_decoder_architecture false, parallel_attn true, bias false, alibi false, vocab_size 65024,
no tie_word_embeddings key: FalconConfig's default, tied).
"""

from __future__ import annotations

COMMON = dict(optimizer="adamw", optimizer_impl="foreach", dropout=0.0, sweep=None)

NEOX_TINY = dict(model_type="gpt_neox", vocab_size=8192, hidden_size=256, intermediate_size=1024,
                 num_hidden_layers=4, num_attention_heads=4, rotary_pct=0.25, rotary_emb_base=10000,
                 use_parallel_residual=True, max_position_embeddings=2048, hidden_act="gelu",
                 layer_norm_eps=1e-5, tie_word_embeddings=False, attention_dropout=0.0,
                 hidden_dropout=0.0, use_cache=False)
PYTHIA_1_4B = dict(NEOX_TINY, vocab_size=50304, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                   num_attention_heads=16)
FALCON7_TINY = dict(model_type="falcon", vocab_size=8192, hidden_size=256, num_hidden_layers=4,
                    num_attention_heads=8, multi_query=True, new_decoder_architecture=False, parallel_attn=True,
                    bias=False, alibi=False, layer_norm_epsilon=1e-5, attention_dropout=0.0, hidden_dropout=0.0,
                    use_cache=False)
FALCON7B = dict(FALCON7_TINY, vocab_size=65024, hidden_size=4544, num_hidden_layers=32, num_attention_heads=71)
FALCON40_TINY = dict(FALCON7_TINY, new_decoder_architecture=True, num_kv_heads=2)

# Which kernel each layout's attention runs on CPU (torch 2.13, transformers 5.23).
NEOX_SDPA = ("CPU flash SDPA (is_causal, no mask): q, k (rotary cat outputs), the qkv storage holding v, "
             "output + fp32 logsumexp; the output's transpose(1, 2).contiguous() is a copy dense saves")
EAGER = "eager: q @ k^T, softmax kept for backward (s x s scores)"
F7_SDPA = ("CPU math SDPA (fallback): q has all heads, k and v one (multi-query, no enable_gqa), which "
           "torch's check_batch_size_and_num_heads_dense refuses for every fused backend (CUDA too); the "
           "math kernel upcasts bf16 to fp32 and keeps fp32 q, k, v and the fp32 s x s probabilities")
F40_SDPA = ("CPU flash SDPA with the materialized causal mask (Falcon builds it with "
            "allow_is_causal_skip=False): k and v broadcast to all heads (flatten copies), output + fp32 "
            "logsumexp; the kernel saves the mask (one per model; under AMP a bf16 cast per layer)")


def _run(id, model, hf, regime, attention, checkpointing="none", method="real", b=2, s=256, note=None, **extra):
    family = hf["model_type"]
    return dict(id=id, family=family, model=model, hf_config=dict(hf), batch_size=b, seq_len=s, regime=regime,
                attention=attention, checkpointing=checkpointing, method=method, kernel_note=note, **COMMON,
                **extra)


CONFIGS = [
    _run("neox-tiny-fp32-sdpa", "gpt_neox tiny", NEOX_TINY, "fp32", "sdpa", note=NEOX_SDPA),
    _run("neox-tiny-bf16-sdpa", "gpt_neox tiny", NEOX_TINY, "bf16", "sdpa", note=NEOX_SDPA),
    _run("neox-tiny-amp-sdpa", "gpt_neox tiny", NEOX_TINY, "amp-bf16", "sdpa", note=NEOX_SDPA),
    _run("neox-tiny-fp32-eager", "gpt_neox tiny", NEOX_TINY, "fp32", "eager", note=EAGER),
    _run("neox-tiny-bf16-eager-full", "gpt_neox tiny", NEOX_TINY, "bf16", "eager", "full", note=EAGER),
    _run("neox-tiny-fp32-sdpa-full", "gpt_neox tiny", NEOX_TINY, "fp32", "sdpa", "full", note=NEOX_SDPA),
    _run("neox-tiny-sequential-bf16-sdpa", "gpt_neox tiny, use_parallel_residual False",
         dict(NEOX_TINY, use_parallel_residual=False), "bf16", "sdpa", note=NEOX_SDPA),
    _run("falcon7-tiny-fp32-sdpa", "falcon-7b-style tiny", FALCON7_TINY, "fp32", "sdpa", note=F7_SDPA),
    _run("falcon7-tiny-bf16-sdpa", "falcon-7b-style tiny", FALCON7_TINY, "bf16", "sdpa", note=F7_SDPA),
    _run("falcon7-tiny-amp-sdpa", "falcon-7b-style tiny", FALCON7_TINY, "amp-bf16", "sdpa", note=F7_SDPA),
    _run("falcon7-tiny-bf16-eager", "falcon-7b-style tiny", FALCON7_TINY, "bf16", "eager", note=EAGER),
    _run("falcon7-tiny-fp32-eager-full", "falcon-7b-style tiny", FALCON7_TINY, "fp32", "eager", "full", note=EAGER),
    _run("falcon7-tiny-bf16-sdpa-full", "falcon-7b-style tiny", FALCON7_TINY, "bf16", "sdpa", "full", note=F7_SDPA),
    _run("falcon40-tiny-fp32-sdpa", "falcon-40b-style tiny", FALCON40_TINY, "fp32", "sdpa", note=F40_SDPA),
    _run("falcon40-tiny-bf16-sdpa", "falcon-40b-style tiny", FALCON40_TINY, "bf16", "sdpa", note=F40_SDPA),
    _run("falcon40-tiny-amp-sdpa", "falcon-40b-style tiny", FALCON40_TINY, "amp-bf16", "sdpa", note=F40_SDPA),
    _run("falcon40-tiny-bf16-eager", "falcon-40b-style tiny", FALCON40_TINY, "bf16", "eager", note=EAGER),
    _run("falcon40-tiny-bf16-sdpa-full", "falcon-40b-style tiny", FALCON40_TINY, "bf16", "sdpa", "full", note=F40_SDPA),
    _run("pythia-1.4b-fake-bf16-sdpa", "Pythia-1.4B", PYTHIA_1_4B, "bf16", "sdpa", method="fake", b=1, s=2048,
         note=NEOX_SDPA),
    _run("falcon-7b-fake-bf16-sdpa", "Falcon-7B", FALCON7B, "bf16", "sdpa", method="fake", b=1, s=2048,
         note=F7_SDPA),
]
