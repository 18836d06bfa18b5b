"""The curated models added for issue 26 (models that launch configs name, and much-used open models the
catalog lacked): each entry is exactly ``from_hf_config`` of the config.json copy committed under
tests/data/catalog_configs/ (the repository, path and commit are in the entry's sources), its count is
the one transformers builds (measured, written out here) and, where one is published, keras-hub's; every
name the launch files use finds it; and the measured profile models it with a family of its own (an
architecture no family claims is refused, never answered as another)."""

import json
from pathlib import Path

import attrs
import pytest

import mlsysim_core
from mlsysim_core.catalog import alias_note, find_model, get_model
from mlsysim_core.hf import from_hf_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "catalog_configs"

# file -> (catalog key, sum(p.numel()) of transformers 5.23 AutoModelForCausalLM.from_config(config) on the
# meta device, measured for each file, architecture family)
ENTRIES = {
    "SmolLM2-135M.json": ("huggingfacetb/smollm2-135m", 134_515_008, "llama"),
    "SmolLM2-360M.json": ("huggingfacetb/smollm2-360m", 361_821_120, "llama"),
    "SmolLM2-1.7B.json": ("huggingfacetb/smollm2-1.7b", 1_711_376_384, "llama"),
    "TinyLlama-1.1B-Chat-v1.0.json": ("tinyllama/tinyllama-1.1b-chat-v1.0", 1_100_048_384, "llama"),
    "gemma-2b.json": ("google/gemma-2b", 2_506_172_416, "gemma"),
    "gemma-7b.json": ("google/gemma-7b", 8_537_680_896, "gemma"),
    "Qwen2-1.5B-Instruct.json": ("qwen/qwen2-1.5b-instruct", 1_543_714_304, "qwen2"),
    "Qwen2-7B-Instruct.json": ("qwen/qwen2-7b-instruct", 7_615_616_512, "qwen2"),
    "Qwen2.5-3B.json": ("qwen/qwen2.5-3b", 3_085_938_688, "qwen2"),
    "phi-4.json": ("microsoft/phi-4", 14_659_507_200, "phi3"),
    "Mistral-Nemo-Base-2407.json": ("mistralai/mistral-nemo-base-2407", 12_247_782_400, "mistral"),
}

# keras-hub's published exact counts (keras_hub/src/models/*/..._presets.py "params", keras-team/keras-hub
# at 71453d08f59edc90d276e999319fc51e61cbf82c): gemma_2b_en, gemma_7b_en, qwen2.5_3b_en.
KERAS_HUB = {"google/gemma-2b": 2_506_172_416, "google/gemma-7b": 8_537_680_896, "qwen/qwen2.5-3b": 3_085_938_688}

# The names the launch files under tests/data/launch give (and the sibling checkpoints), -> key.
NAMES = {
    "HuggingFaceTB/SmolLM2-1.7B": "huggingfacetb/smollm2-1.7b",               # alignment-handbook smollm2
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": "huggingfacetb/smollm2-1.7b",
    "huggingfacetb/smollm2-135m-instruct": "huggingfacetb/smollm2-135m",
    "SmolLM2-360M": "huggingfacetb/smollm2-360m",                               # without the owner
    "google/gemma-7b": "google/gemma-7b",                                       # zephyr-7b-gemma
    "google/gemma-2b": "google/gemma-2b",                                       # LitGPT gemma-2b
    "GOOGLE/GEMMA-2B": "google/gemma-2b",
    "tiny-llama-1.1b": "tinyllama/tinyllama-1.1b-chat-v1.0",    # LitGPT pretrain/tinyllama
    "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T": "tinyllama/tinyllama-1.1b-chat-v1.0",
    "Qwen/Qwen2-1.5B-Instruct": "qwen/qwen2-1.5b-instruct",                     # LLaMA-Factory muon, adam_mini
    "Qwen/Qwen2-7B-Instruct": "qwen/qwen2-7b-instruct",
    "Qwen/Qwen2.5-3B-Instruct": "qwen/qwen2.5-3b",
    "microsoft/phi-4": "microsoft/phi-4",
    "phi-4": "microsoft/phi-4",
    "mistralai/Mistral-Nemo-Base-2407": "mistralai/mistral-nemo-base-2407",
    "meta-llama/Llama-3.3-70B-Instruct": "meta-llama/llama-3.1-70b",
    "llama-3.3-70b": "meta-llama/llama-3.1-70b",
}


def test_every_committed_copy_has_its_entry():
    assert sorted(p.name for p in CONFIGS.glob("*.json")) == sorted(ENTRIES)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_entry_is_from_hf_config_of_its_copy(name):
    key, count, architecture = ENTRIES[name]
    entry = find_model(key)
    w = from_hf_config(CONFIGS / name, name=entry.value.name)
    assert attrs.asdict(w) == attrs.asdict(entry.value)
    assert dict(w.details) == dict(entry.value.details)
    assert (entry.value.parameters, entry.value.architecture) == (count, architecture)
    assert entry.origin == "curated" and entry.value.name == entry.extra["hf_repo"]
    assert f"tests/data/catalog_configs/{name}" in " ".join(entry.sources.values())
    assert json.loads((CONFIGS / name).read_text())["model_type"] == architecture


@pytest.mark.parametrize("key,count", sorted(KERAS_HUB.items()))
def test_counts_equal_keras_hubs_published_presets(key, count):
    assert get_model(key).parameters == count
    assert "keras-hub" in find_model(key).sources["parameters"]


def test_shapes_as_the_sources_give_them():
    nemo = get_model("mistralai/Mistral-Nemo-Base-2407")
    assert (nemo.hidden_dim, nemo.heads, nemo.kv_heads, nemo.head_dim, nemo.ffn_dim, nemo.vocab_size) == (
        5120, 32, 8, 128, 14336, 131072)                           # head_dim is not 5120 / 32
    g7, g2 = get_model("google/gemma-7b"), get_model("google/gemma-2b")
    assert (g7.layers, g7.hidden_dim, g7.heads, g7.kv_heads, g7.head_dim, g7.ffn_dim) == (28, 3072, 16, 16, 256, 24576)
    assert (g2.layers, g2.hidden_dim, g2.heads, g2.kv_heads, g2.head_dim, g2.ffn_dim) == (18, 2048, 8, 1, 256, 16384)
    assert g7.tied_embeddings and g7.details["embedding_scale"]
    phi4 = get_model("microsoft/phi-4")
    assert (phi4.layers, phi4.hidden_dim, phi4.heads, phi4.kv_heads, phi4.ffn_dim, phi4.vocab_size,
            phi4.context_length) == (40, 5120, 40, 10, 17920, 100352, 16384)
    assert find_model("qwen/qwen2-7b-instruct").extra["counting"] == {"qkv_bias": True}
    # base and Instruct share the shapes (LitGPT builds both from one dict): one entry answers to both
    assert get_model("HuggingFaceTB/SmolLM2-1.7B-Instruct") is get_model("HuggingFaceTB/SmolLM2-1.7B")


@pytest.mark.parametrize("name,key", sorted(NAMES.items()))
def test_the_names_launch_files_use_resolve(name, key):
    assert find_model(name).key == key


def test_llama_3_3_70b_is_llama_3_1_70b_by_its_shapes_and_says_so():
    m = get_model("meta-llama/Llama-3.3-70B-Instruct")
    # oumi-ai/oumi configs/recipes/llama3_3/README.md (bd18cd68): the Llama 3.3 70B model info table
    assert (m.vocab_size, m.hidden_dim, m.ffn_dim, m.layers, m.heads, m.kv_heads, m.tied_embeddings,
            m.context_length) == (128_256, 8192, 28_672, 80, 64, 8, False, 131_072)
    note = alias_note("model", "meta-llama/llama-3.3-70b-instruct")
    assert note.startswith("'meta-llama/Llama-3.3-70B-Instruct' is Llama 3.3 70B Instruct, answered with Llama 3.1 "
                           "70B's entry") and "config.json was not read" in note
    assert alias_note("model", "meta-llama/llama-3.1-70b") is None


def test_tiny_llama_base_names_carry_their_note():
    assert alias_note("model", "tiny-llama-1.1b").startswith(
        "'tiny-llama-1.1b' is the 3T base checkpoint TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T (LitGPT's "
        "'tiny-llama-1.1b'), answered with TinyLlama-1.1B-Chat-v1.0's entry")
    assert "answered with" in alias_note("model", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T")
    assert alias_note("model", "TinyLlama/TinyLlama-1.1B-Chat-v1.0") is None


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_the_measured_profile_models_each_with_its_own_family(builtin_pm, name):
    from mlsysim_plugins.measured.families import HOOK, family_for
    key, count, architecture = ENTRIES[name]
    families = {f.name: f for fs in getattr(builtin_pm.hook, HOOK)() for f in fs}
    family, notes = family_for(get_model(key), families)
    assert architecture in family.architectures and notes == ()        # claimed as it is: no fallback note
    if family.count_parameters is not None:           # (Llama's and Mistral's count is the counting helper's)
        assert family.count_parameters(get_model(key)) == count
    r = mlsysim_core.estimate(key, "h100", batch_size=1, seq_len=256)
    assert r.profile == "measured" and r.total_memory > r.weights > 0
