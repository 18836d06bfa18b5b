"""The catalog: reference numbers, lookups, and data-file integrity."""

import pytest

from mlsysim_core import InvalidInputError
from mlsysim_core.catalog import find_model, get_hardware, get_model, list_hardware, list_models

# Spec §12 of the reference: every language model and every Cloud/Workstation accelerator.
REFERENCE_MODELS = {
    "bert-base": 110_000_000, "bert-large": 340_000_000, "deepseek-v3": 671_000_000_000,
    "gpt2": 1_500_000_000, "gpt2-small": 124_000_000, "gpt3": 175_000_000_000,
    "gpt4": 1_760_000_000_000, "llama2-13b": 13_000_000_000, "llama2-70b": 70_000_000_000,
    "llama2-7b": 7_000_000_000, "llama3-405b": 405_000_000_000, "llama3-70b": 70_600_000_000,
    "llama3-8b": 8_030_000_000, "mixtral-8x7b": 46_700_000_000, "opt-13b": 13_000_000_000,
    "palm-540b": 540_000_000_000,
}
REFERENCE_HARDWARE_GIB = {
    "a100": 80, "a100-40gb": 40, "b200": 180, "h100": 80, "h100-pcie": 80, "h200": 141, "mi300x": 192,
    "mi325x": 256, "mi250x": 128, "gaudi2": 96, "gaudi3": 128, "t4": 16, "v100": 32, "tpuv5p": 95,
    "dgx-spark": 128, "gtx580": 3, "macbook-m3-max": 128,
}


def test_every_reference_model_is_present_with_its_numbers():
    keys = {e.key: e.value for e in list_models()}
    assert set(keys) == set(REFERENCE_MODELS)
    for key, params in REFERENCE_MODELS.items():
        assert keys[key].parameters == params


def test_hardware_capacities_in_bytes():
    assert len(list_hardware()) == 34
    for key, gib in REFERENCE_HARDWARE_GIB.items():
        assert get_hardware(key).memory_capacity == gib * 2**30
    assert get_hardware("gb200-nvl72").memory_capacity == int(13.5 * 2**40)
    assert get_hardware("groq-lpu").memory_capacity == 230 * 2**20


@pytest.mark.parametrize("name", ["llama3-8b", "LLAMA3-8B", "llama3_8b", "Llama-3.1-8B", " llama3-8b "])
def test_lookup_is_case_insensitive(name):
    assert get_model(name).parameters == 8_030_000_000


def test_mixtral_is_sparse_with_architecture_detail():
    m = get_model("mixtral-8x7b")
    assert m.is_sparse and (m.experts, m.active_experts_per_token) == (8, 2)
    assert m.active_parameters == 12_900_000_000
    assert (m.kv_heads, m.vocab_size, m.ffn_dim) == (8, 32000, 14336)
    llama = get_model("llama3-8b")
    assert (llama.kv_heads, llama.vocab_size, llama.ffn_dim, llama.gated_mlp) == (8, 128256, 14336, True)


def test_entries_name_their_sources():
    entry = find_model("llama3-8b")
    assert any("mlsysim 0.3.0" in source for source in entry.sources.values())


def test_unknown_name_suggests():
    with pytest.raises(InvalidInputError, match="did you mean llama3-8b"):
        get_model("llama3-8")
    with pytest.raises(InvalidInputError, match="hardware=3"):
        get_hardware(3)
