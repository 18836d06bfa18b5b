"""torchtune's persistent RoPE cache (rope_cache=, rope.py) against Hugging Face's per-forward tables (the default):
hand-derived bytes, what moves, refusals. No torch."""

from __future__ import annotations

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.types import HardwareNode
from mlsysim_plugins.measured import rope

BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 704,
       "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1024,
       "tie_word_embeddings": True, "head_dim": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
       "hidden_act": "silu"}


def _solve(regime="fp32", **kw):
    return TrainingMemoryModel().solve(from_hf_config(CFG, name="rope-tiny"), BIG, 2, 512, regime, "adamw", "none",
                                       profile="measured", regime=regime, attention="sdpa", device="cpu",
                                       runtime_overheads=False, **kw)


def _key(result, key):
    return sum(t.nbytes for t in result.terms if t.key == key)


def test_cache_bytes_by_hand():
    # Llama 3.1 8B under torchtune: max_seq_len 131,072 (llama3_1 builders), head_dim 128, fp32: 131,072 x 64 x 2
    # x 4 B = 67,108,864 B (64 MiB), theta 64 x 4 = 256 B
    assert rope.cache_bytes(131_072, 128) == (67_108_864, 256)
    # the tiny model cast to bf16 after init: 512 x 16 x 2 x 2 B, theta 16 x 2 B
    assert rope.cache_bytes(512, 32, "bf16") == (32_768, 32)


def test_the_cache_replaces_the_buffers_and_the_tables():
    hf, tt = _solve(), _solve(rope_cache=512)
    assert _key(hf, "rope_buffers") == 2 * 16 * 4                 # inv_freq, original_inv_freq (fp32)
    assert _key(hf, "rope_tables") == 2 * 512 * 32 * 4            # cos, sin: 2 x s x head_dim x 4 B, per forward
    assert _key(tt, "rope_cache") == 512 * 16 * 2 * 4 + 16 * 4    # one cache and one theta, every phase
    assert _key(tt, "rope_buffers") == _key(tt, "rope_tables") == 0
    # every phase holds the cache; the forward's tables are gone: weights +65,472 B, end of forward -65,600 B
    weights = [sum(t.nbytes for t in r.terms if t.component == "weights") for r in (hf, tt)]
    assert weights[1] - weights[0] == 65_536 + 64 - 128
    assert tt.phase_totals["optimizer_step"] - hf.phase_totals["optimizer_step"] == 65_472


def test_concatenated_layout_by_hand():
    # torchtune's Qwen2/Phi-3 RoPE: cat([cos(f), sin(f)]) with f = cat([theta, theta]): max_seq_len x 2 head_dim values;
    # Qwen2.5 7B (qwen2_5_7b: max_seq_len 131,072, head_dim 128): 131,072 x 256 x 4 B = 134,217,728 B (128 MiB)
    assert rope.cache_bytes(131_072, 128, "fp32", "concatenated") == (134_217_728, 256)
    tt = _solve(rope_cache=512, rope_cache_layout="concatenated")
    assert _key(tt, "rope_cache") == 512 * 64 * 4 + 16 * 4


def test_bf16_cast_cache():
    tt = _solve("bf16", rope_cache=512, rope_cache_dtype="bf16")
    assert _key(tt, "rope_cache") == 512 * 32 * 2 + 16 * 2


def test_a_parameter_offload_leaves_the_cache_on_the_device():
    # buffers, not parameters (term_keys.NOT_PARAMETERS): torchtune's distributed recipe builds them with rope_init()
    # on the device after sharding; FSDP's CPU offload moves the parameters only
    from mlsysim_core.terms import ACCELERATOR
    r = _solve(rope_cache=512, offload="optimizer+gradients+parameters", data_parallel="fsdp", dp_size=2)
    cache = [t for t in r.terms if t.key == "rope_cache"]
    assert [(t.nbytes, t.tier) for t in cache] == [(65_536 + 64, ACCELERATOR)]


def test_default_is_unchanged():
    assert _solve().terms == _solve(rope_cache=None).terms


@pytest.mark.parametrize("kw, parameter, says", [
    (dict(rope_cache=0), "rope_cache", "a whole number of positions"),
    (dict(rope_cache=256), "rope_cache", "at least the sequence length 512"),
    (dict(rope_cache_dtype="bf16"), "rope_cache_dtype", "None unless rope_cache is set"),
    (dict(rope_cache_layout="pairs"), "rope_cache_layout", "None unless rope_cache is set"),
])
def test_refused_by_name(kw, parameter, says):
    with pytest.raises(InvalidInputError, match=says) as e:
        _solve(**kw)
    assert e.value.parameter == parameter
