"""torchtune 0.6.1's builders for the catalog's Gemma 1, Qwen2, Qwen2.5-3B and Phi-4 (issue 26): the real recipe configs
under tests/data/launch/torchtune/{gemma,phi4,qwen2,qwen2_5}/ read end to end, each an answer or a refusal naming
``model._component_``; what the builder's fields became, by hand from the builders (pytorch/torchtune v0.6.1
torchtune/models/*/_model_builders.py, _component_builders.py; the parameter counts and buffers checked by building
each builder on the meta device with torchtune 0.6.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlsysim_core.errors import NotModelledError
from mlsysim_core.scenario import from_launch

DATA = Path(__file__).resolve().parents[1] / "data" / "launch" / "torchtune"
NEW = sorted(p for d in ("gemma", "phi4", "qwen2") for p in (DATA / d).glob("*.yaml")) + sorted(
    DATA / "qwen2_5" / f for f in ("3B_full_single_device.yaml", "3B_lora_single_device.yaml",
                                   "7B_lora_single_device.yaml"))
REFUSED = {"phi4/14B_full.yaml": "separate nn.Linear", "phi4/14B_lora_single_device.yaml": "separate nn.Linear",
           "qwen2/0.5B_full.yaml": "no catalog model"}
GiB = 2**30


def _read(rel, **kw):
    path = DATA / rel
    return from_launch([path], gpus=None if "single_device" in path.stem else 8, seq_len=2048, **kw)


def _fields(launch):
    return {f.field: f for r in launch.readings for f in r.fields if f.key == "model._component_"}


@pytest.mark.parametrize("path", NEW, ids=lambda p: str(p.relative_to(DATA)))
def test_each_new_config_answers_or_is_refused_naming_the_builder(path):
    rel = str(path.relative_to(DATA))
    if rel in REFUSED:
        with pytest.raises(NotModelledError) as err:
            _read(rel)
        assert err.value.parameter == "model._component_" and REFUSED[rel] in str(err.value)
        return
    result = _read(rel).scenario.solve()
    assert result.total_memory > result.weights > 0


def test_gemma_2b_lora_weights_by_hand():
    """lora_gemma_2b, rank 64 on q, v, output_proj and the MLP: 18 layers, h 2,048, q 8 x 256, kv 1 x 256, f 16,384.
    Adapters r (in + out) each: 64 x ((2048 + 2048) + (2048 + 256) + (2048 + 2048) + 3 x (2048 + 16384)) a layer
    (torchtune on the meta device: lora_gemma_2b with q, v at rank 8 has 921,600 = 18 x 8 x 6,400 more than
    gemma_2b's 2,506,172,416). bf16 base and adapters (the recipe's dtype), the RoPE cache (gemma_2b max_seq_len
    8,192 x head_dim/2 128 x (cos, sin), fp32) and theta (128 fp32) in each of the 18 layers (lora_gemma_self_attention
    builds its own: 18 RotaryPositionalEmbeddings on the meta device), and the gemma family's 0-d embed_scale (2 B)."""
    launch = _read("gemma/2B_lora_single_device.yaml")
    po = launch.scenario.profile_options
    adapters = 18 * 64 * ((2048 + 2048) + (2048 + 256) + (2048 + 2048) + 3 * (2048 + 16384))
    assert adapters == 75_792_384
    cache = 8192 * 128 * 2 * 4 + 128 * 4
    assert po["rope_cache"] == 8192 and "rope_cache_layout" not in po
    # one key/value head: expand + flatten is a view, nothing expanded is saved
    assert "kv_expanded" not in po
    notes = [n for r in launch.readings for n in r.notes]
    assert any("num_kv_heads=1" in n and "view" in n for n in notes)
    assert any("embed_scale" in n and "2 B" in n for n in notes)
    # lora_gemma_self_attention builds a rope module (cache and theta) in each of the 18 layers
    assert po["rope_cache_per_layer"] is True
    assert launch.scenario.solve().weights == 2 * 2_506_172_416 + 2 * adapters + 18 * cache + 2


def test_gemma_7b_full_is_exact_and_multi_head():
    """gemma_7b: 16 key/value heads of 16: nothing expanded; the full builder's one rope shared (not approximated)."""
    launch = _read("gemma/7B_full.yaml")
    po = launch.scenario.profile_options
    assert po["rope_cache"] == 8192 and "kv_expanded" not in po and "rope_cache_per_layer" not in po
    assert launch.scenario.model == "google/gemma-7b"


def test_qwen2_5_3b_full_weights_by_hand():
    """qwen2_5_3b (max_seq_len 32,768: qwen2_5/_model_builders.py line 127): 3,085,938,688 bf16 parameters (the
    catalog's, and torchtune's on the meta device), Qwen2's concatenated cache 32,768 x 2 x 128 fp32 and theta (64
    fp32); 2 key/value heads of 16: k and v expanded (copies)."""
    launch = _read("qwen2_5/3B_full_single_device.yaml")
    po = launch.scenario.profile_options
    assert (po["rope_cache"], po["rope_cache_layout"], po["kv_expanded"]) == (32768, "concatenated", True)
    assert launch.scenario.solve().weights == 2 * 3_085_938_688 + 32768 * 256 * 4 + 64 * 4


def test_qwen2_builders_and_the_instruct_rows():
    """qwen2_1_5b and qwen2_7b (max_seq_len 32,768: qwen2/_model_builders.py lines 91, 38) answer as the catalog's
    Qwen2 instruct entries; qwen2_5_7b_instruct's cache is 32,768 rows (line 180), not _base's 131,072."""
    full = _read("qwen2/1.5B_full_single_device.yaml")
    assert full.scenario.model == "qwen/qwen2-1.5b-instruct"
    assert full.scenario.profile_options["rope_cache"] == 32768
    assert full.scenario.solve().weights == 2 * 1_543_714_304 + 32768 * 256 * 4 + 64 * 4
    assert _read("qwen2/7B_lora.yaml").scenario.model == "qwen/qwen2-7b-instruct"
    assert _read("qwen2_5/7B_full.yaml").scenario.profile_options["rope_cache"] == 32768


def test_per_layer_rope_of_the_lora_builders():
    """lora_qwen2_self_attention (qwen2/_component_builders.py line 393) builds a rope module per layer: 28 caches of
    32,768 x 256 x 4 + 64 x 4 B for Qwen2 1.5B (28 Qwen2RotaryPositionalEmbeddings on the meta device; the full
    builder one); lora_llama3_2 passes one Llama3ScaledRoPE to every layer (one cache)."""
    one = 32768 * 256 * 4 + 64 * 4
    lora = _read("qwen2/1.5B_lora_single_device.yaml")
    assert lora.scenario.profile_options["rope_cache_per_layer"] is True
    assert "line 393" in _fields(lora)["rope_cache_per_layer"].note
    assert [t.nbytes for t in lora.scenario.solve().terms if t.key == "rope_cache"] == [28 * one]
    full = _read("qwen2/1.5B_full_single_device.yaml").scenario
    assert "rope_cache_per_layer" not in full.profile_options
    assert [t.nbytes for t in full.solve().terms if t.key == "rope_cache"] == [one]
    assert "rope_cache_per_layer" not in _read("llama3_2/3B_lora_single_device.yaml").scenario.profile_options
    assert _read("llama3/8B_dora.yaml").scenario.profile_options["rope_cache_per_layer"] is True


def test_phi4_refused_and_m_replaces_it():
    """phi4_14b is torchtune's phi3 component builder: separate q/k/v and w1/w3 (not Hugging Face's fused Phi-3 layer
    the phi3 family describes): refused naming model._component_; -m replaces the builder, as for one not in the
    catalog."""
    with pytest.raises(NotModelledError) as err:
        _read("phi4/14B_full.yaml")
    assert err.value.parameter == "model._component_" and err.value.value == "torchtune.models.phi4.phi4_14b"
    assert "fused qkv_proj" in str(err.value) and "rope_base 10,000" in str(err.value)
    launch = _read("phi4/14B_full.yaml", model="microsoft/phi-4")
    assert launch.scenario.model == "microsoft/phi-4" and "rope_cache" not in launch.scenario.profile_options
