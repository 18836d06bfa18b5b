"""The torchtune reader's weights against what torchtune 0.6.1's builders put on the device at model init
(validation/torchtune_builders/builders_measurements.json: each builder built on the meta device under
set_default_dtype(bf16), as the recipes build it; torch 2.13.0, torchtune 0.6.1). Each builder is read through
qwen2_5/3B_full_single_device.yaml or 3B_lora_single_device.yaml with ``model._component_`` overridden (the LoRA
arguments the measurement used: q, v, output_proj and the MLP at rank 8). No torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core.scenario import from_launch

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "launch" / "torchtune"
RUNS = json.loads((ROOT / "validation" / "torchtune_builders" / "builders_measurements.json").read_text())
BUILDERS = {b["builder"]: b for b in RUNS["builders"]}


def _read(component: str):
    config = "3B_lora_single_device.yaml" if component.rsplit(".", 1)[-1].startswith("lora_") else \
        "3B_full_single_device.yaml"
    return from_launch([DATA / "qwen2_5" / config], seq_len=2048, overrides=[f"model._component_={component}"])


@pytest.mark.parametrize("component", sorted(BUILDERS))
def test_weights_are_the_builders_bytes(component):
    """Every byte of the model at init: bf16 parameters (base and adapters) and the fp32 rope buffers (one cache and
    theta, or one per layer for the LoRA builders that build a rope module in each layer's attention). The gemma
    family counts Hugging Face's 0-d embed_scale buffer (2 B in bf16), which torchtune does not register (said in a
    note)."""
    measured = BUILDERS[component]
    assert measured["lora"] in (None, {"lora_attn_modules": ["q_proj", "v_proj", "output_proj"],
                                       "apply_lora_to_mlp": True, "lora_rank": 8, "lora_alpha": 16,
                                       "lora_dropout": 0.0})
    launch = _read(component)
    tt = sum(measured["parameter_bytes"].values()) + sum(measured["buffer_bytes"].values())
    extra = 2 if ".gemma." in component else 0
    assert launch.scenario.solve().weights - tt == extra
    rope = [t.nbytes for t in launch.scenario.solve().terms if t.key == "rope_cache"]
    assert rope == [measured["buffer_bytes"]["float32"]]
    assert measured["rope_modules"] == (measured["layers"] if measured["lora"] else 1)


def test_one_key_value_head_is_not_copied():
    """torchtune's MultiHeadAttention with one key/value head hands SDPA a stride-0 view of k (its storage k_proj's
    output, 2 x 8 x 16 x 2 B = 512 B), and the saved tensors hold it so; with 2 key/value heads an expanded copy at
    the 4 query heads' width (2,048 B): the reader sets kv_expanded for the second and not the first."""
    one, two, four = RUNS["saved_kv"]
    assert one["sdpa_input"]["k_stride"][1] == 0 and one["sdpa_input"]["k_storage"] == 2 * 8 * 1 * 16 * 2
    assert two["sdpa_input"]["k_storage"] == 2 * 8 * 4 * 16 * 2
    # what autograd saves of k and v is that storage: two 512 B storages (k, v at one head), none wider for them
    assert one["saved_storage_bytes"].count(512) == 2 and four["saved_storage_bytes"].count(512) == 0
    assert one["sdpa_input"]["v_storage"] == 512 and four["sdpa_input"]["k_storage"] == 2048
    assert "kv_expanded" not in _read("torchtune.models.gemma.gemma_2b").scenario.profile_options
    assert _read("torchtune.models.qwen2.qwen2_1_5b").scenario.profile_options["kv_expanded"] is True
