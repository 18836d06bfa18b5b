"""The catalog: reference numbers, curated numbers against their sources, lookups, integrity."""

import re

import attrs
import pytest

from mlsysim_core import InvalidInputError
from mlsysim_core.catalog import (NAMESPACE, CatalogEntry, CatalogError, alias_note, count_parameters,
                                  count_workload_parameters, find_hardware, find_model, get_hardware, get_model,
                                  list_hardware, list_models, normalise, provenance_notes)

GiB = 2**30

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


# Reference short key -> the curated entry describing the same model or card, which answers
# to the short key (the reference's data stays under mlsysim:<key>).
COUNTERPARTS = {
    "deepseek-v3": "deepseek-ai/deepseek-v3", "gpt2": "openai-community/gpt2-xl",
    "gpt2-small": "openai-community/gpt2", "gpt3": "openai/gpt-3-175b",
    "llama2-7b": "meta-llama/llama-2-7b-hf", "llama2-13b": "meta-llama/llama-2-13b-hf",
    "llama2-70b": "meta-llama/llama-2-70b-hf", "llama3-8b": "meta-llama/llama-3.1-8b",
    "llama3-70b": "meta-llama/llama-3.1-70b", "llama3-405b": "meta-llama/llama-3.1-405b",
    "mixtral-8x7b": "mistralai/mixtral-8x7b-v0.1",
    "a100": "nvidia/a100-sxm4-80gb", "a100-40gb": "nvidia/a100-sxm4-40gb", "b200": "nvidia/b200",
    "h100": "nvidia/h100-sxm5-80gb", "h100-pcie": "nvidia/h100-pcie-80gb", "h200": "nvidia/h200-sxm-141gb",
    "gaudi2": "intel/gaudi2", "gaudi3": "intel/gaudi3", "mi250x": "amd/mi250x", "mi300x": "amd/mi300x",
    "mi325x": "amd/mi325x", "t4": "nvidia/t4", "tpuv4": "google/tpu-v4", "tpuv5p": "google/tpu-v5p",
    "tpuv6e": "google/tpu-v6e", "v100": "nvidia/v100-sxm2-32gb", "trainium2": "aws/trainium2",
}


def by_origin(entries, origin):
    return {e.key: e for e in entries if e.origin == origin}


def find(name):
    try:
        return find_model(name)
    except InvalidInputError:
        return find_hardware(name)


# --- the reference entries: unchanged ------------------------------------------------------

def test_every_reference_model_is_present_with_its_numbers():
    keys = {k: e.value for k, e in by_origin(list_models(plugins=False), "reference").items()}
    assert set(keys) == {NAMESPACE + key for key in REFERENCE_MODELS}
    for key, params in REFERENCE_MODELS.items():
        assert keys[NAMESPACE + key].parameters == params
        assert get_model(NAMESPACE + key) is keys[NAMESPACE + key]


def test_hardware_capacities_in_bytes():
    assert len(by_origin(list_hardware(plugins=False), "reference")) == 34
    for key, gib in REFERENCE_HARDWARE_GIB.items():
        assert get_hardware(NAMESPACE + key).memory_capacity == gib * 2**30
        assert get_hardware(key).memory_capacity == gib * 2**30      # the curated card where there is one
    assert get_hardware("gb200-nvl72").memory_capacity == int(13.5 * 2**40)
    assert get_hardware("groq-lpu").memory_capacity == 230 * 2**20


@pytest.mark.parametrize("name", ["mlsysim:llama3-8b", "MLSYSIM:LLAMA3-8B", "mlsysim:llama3_8b",
                                  "mlsysim:Llama-3.1-8B", " mlsysim:llama3-8b "])
def test_lookup_is_case_insensitive(name):
    assert get_model(name).parameters == 8_030_000_000


@pytest.mark.parametrize("name", ["llama3-8b", "LLAMA3-8B", "llama3_8b", "Llama-3.1-8B", "llama3.1-8b",
                                  " llama3-8b ", "meta-llama/Llama-3.1-8B"])
def test_short_and_display_names_find_the_curated_entry(name):
    entry = find_model(name)
    assert (entry.key, entry.origin, entry.value.parameters) == ("meta-llama/llama-3.1-8b", "curated", 8_030_261_248)


def test_mixtral_is_sparse_with_architecture_detail():
    m = get_model("mlsysim:mixtral-8x7b")
    assert m.is_sparse and (m.experts, m.active_experts_per_token) == (8, 2)
    assert m.active_parameters == 12_900_000_000
    assert (m.kv_heads, m.vocab_size, m.ffn_dim) == (8, 32000, 14336)
    llama = get_model("mlsysim:llama3-8b")
    assert (llama.kv_heads, llama.vocab_size, llama.ffn_dim, llama.gated_mlp) == (8, 128256, 14336, True)
    curated = get_model("mixtral-8x7b")
    assert (curated.parameters, curated.active_parameters, curated.expert_ffn_dim) == (
        46_702_792_704, 12_879_925_248, 14336)


def test_entries_name_their_sources():
    entry = find_model("mlsysim:llama3-8b")
    assert any("mlsysim 0.3.0" in source for source in entry.sources.values())
    assert entry.origin == "reference" and "models.json" in entry.provided_by


def test_unknown_name_suggests():
    with pytest.raises(InvalidInputError, match=r"did you mean meta-llama/llama-3\.1-8b, mlsysim:llama3-8b\?"):
        get_model("llama3-8")
    with pytest.raises(InvalidInputError, match="hardware=3"):
        get_hardware(3)


@pytest.mark.parametrize("name,suggested", [
    ("l40", "nvidia/l40s"), ("mi250x-gcd1", "amd/mi250x-gcd"), ("mlsysim:l40s", "nvidia/l40s"),
    ("h10", "nvidia/h100-sxm5-80gb"), ("rtx4009", "nvidia/rtx-4090"), ("H1000", "nvidia/h100-sxm5-80gb"),
    ("a10", "nvidia/a100-sxm4-80gb"), ("rtx-6000", "nvidia/rtx-6000-ada"), ("tpu-v5", "google/tpu-v5e"),
])
def test_a_near_miss_hardware_name_suggests_the_closest_first(name, suggested):
    """A name that begins a name, or is a typo of one, is refused with the closest names first
    (``mlsysim:l40s`` asks for reference data that does not exist: it is not taken as ``l40s``)."""
    with pytest.raises(InvalidInputError, match=rf"hardware='{name}' is not allowed: did you mean {suggested}[,?]"):
        get_hardware(name)


@pytest.mark.parametrize("name,suggested", [
    ("lama3-8b", "meta-llama/llama-3.1-8b"), ("deepsek-v3", "deepseek-ai/deepseek-v3"),
    ("qwen2.5-7", "qwen/qwen2.5-7b"), ("meta-llama/llama-3.1-8c", "meta-llama/llama-3.1-8b"),
    ("mixtral-8x22", "mistralai/mixtral-8x22b-v0.1"), ("gemma-2-9", "google/gemma-2-9b"),
])
def test_a_near_miss_model_name_suggests_the_closest_first(name, suggested):
    with pytest.raises(InvalidInputError, match=rf"model='{re.escape(name)}' is not allowed: did you mean "
                                                rf"{re.escape(suggested)}[,?]"):
        get_model(name)


def test_a_suggestion_lists_the_candidates_a_prefix_begins():
    with pytest.raises(InvalidInputError) as err:
        get_hardware("h10")
    hint = str(err.value).split("did you mean ", 1)[1].split("?", 1)[0].split(", ")
    assert {"nvidia/h100-sxm5-80gb", "nvidia/h100-pcie-80gb", "nvidia/h100-nvl"} <= set(hint)
    assert hint.index("nvidia/h100-sxm5-80gb") < hint.index("mlsysim:h100")     # curated before reference
    with pytest.raises(InvalidInputError, match=r"did you mean google/tpu-v5e, google/tpu-v5p[,?]"):
        get_hardware("tpu-v5")


# The names people type for the accelerators they rent, and what each means.
SHORT_HARDWARE_NAMES = {
    "rtx-4090": "nvidia/rtx-4090", "4090": "nvidia/rtx-4090", "RTX4090": "nvidia/rtx-4090",
    "rtx_4090": "nvidia/rtx-4090", "NVIDIA GeForce RTX 4090": "nvidia/rtx-4090", "nvidia rtx 4090": "nvidia/rtx-4090",
    "rtx-5090": "nvidia/rtx-5090", "5090": "nvidia/rtx-5090", "RTX 5090": "nvidia/rtx-5090",
    "h100-80gb": "nvidia/h100-sxm5-80gb", "H100 80GB": "nvidia/h100-sxm5-80gb", "NVIDIA H100 80GB HBM3": "nvidia/h100-sxm5-80gb",
    "h100-sxm": "nvidia/h100-sxm5-80gb", "h100_sxm": "nvidia/h100-sxm5-80gb", "h100": "nvidia/h100-sxm5-80gb",
    "h100-pcie": "nvidia/h100-pcie-80gb", "h100-nvl": "nvidia/h100-nvl", "H100 NVL": "nvidia/h100-nvl",
    "l40s": "nvidia/l40s", "L40S": "nvidia/l40s", "l4": "nvidia/l4", "a10g": "nvidia/a10g", "A10G": "nvidia/a10g",
    "h200": "nvidia/h200-sxm-141gb", "gh200": "nvidia/gh200", "b200": "nvidia/b200", "gb200": "nvidia/gb200",
    "mi300x": "amd/mi300x", "MI300X": "amd/mi300x", "mi325x": "amd/mi325x", "mi355x": "amd/mi355x",
    "a6000": "nvidia/rtx-a6000", "RTX A6000": "nvidia/rtx-a6000", "rtx-6000-ada": "nvidia/rtx-6000-ada",
    "RTX 6000 Ada": "nvidia/rtx-6000-ada", "tpu-v5e": "google/tpu-v5e", "tpu v5p": "google/tpu-v5p",
    "TPU_v6e": "google/tpu-v6e", "gaudi3": "intel/gaudi3", "Gaudi 3": "intel/gaudi3", "aws/trn2": "aws/trainium2",
    "nvidia/rtx4090": "nvidia/rtx-4090", "amd/mi-300x": "amd/mi300x",
}


@pytest.mark.parametrize("name,key", sorted(SHORT_HARDWARE_NAMES.items()))
def test_the_short_names_people_type_find_the_card(name, key):
    assert find_hardware(name).key == key


@pytest.mark.parametrize("name,key", [
    ("qwen2.5-7b", "qwen/qwen2.5-7b"), ("Gemma-2-9B", "google/gemma-2-9b"), ("mixtral-8x22b", "mistralai/mixtral-8x22b-v0.1"),
    ("llama-3.2-1b", "meta-llama/llama-3.2-1b"), ("Llama3_8B", "meta-llama/llama-3.1-8b"), ("phi-3-mini-4k-instruct",
    "microsoft/phi-3-mini-4k-instruct"), ("meta-llama-3-8b", "meta-llama/meta-llama-3-8b"), ("qwen/qwen2.5 7b", "qwen/qwen2.5-7b"),
])
def test_a_model_is_found_without_its_owner_and_separators(name, key):
    assert find_model(name).key == key


@pytest.mark.parametrize("kind,name,candidates", [
    ("model", "gpt-2", ("openai-community/gpt2", "openai-community/gpt2-xl (as 'gpt2')")),
])
def test_an_ambiguous_name_is_refused_naming_the_candidates(kind, name, candidates):
    """``gpt-2`` is ``gpt2`` (GPT-2 XL) without its hyphen and ``openai-community/gpt2`` (124M)
    without its owner: neither is taken."""
    find = find_model if kind == "model" else find_hardware
    with pytest.raises(InvalidInputError) as err:
        find(name)
    message = str(err.value)
    assert message.startswith(f"{kind}={name!r} is not allowed: a name that means one entry; {name!r} could be any of: ")
    assert all(c in message for c in candidates) and message.endswith("give one of those names")


def test_an_ambiguous_name_between_user_entries_is_refused(tmp_path, monkeypatch):
    import json
    rows = [{"key": "vendor-a/card-1", "memory_capacity": 8 * GiB}, {"key": "vendor-b/card-1", "memory_capacity": 16 * GiB}]
    (tmp_path / "cards.json").write_text(json.dumps({"schema": 1, "hardware": rows}), encoding="utf-8")
    monkeypatch.setenv("MLSYSIM_CATALOG_DIR", str(tmp_path))
    with pytest.raises(InvalidInputError, match=r"'card-1' could be any of: vendor-a/card-1, vendor-b/card-1"):
        get_hardware("card-1")
    assert get_hardware("vendor-b/card 1").memory_capacity == 16 * GiB     # separators differ: still one entry


# --- one model, one answer: short names are the curated entries, mlsysim: the reference's data --

@pytest.mark.parametrize("short,curated", sorted(COUNTERPARTS.items()))
def test_short_names_are_the_curated_entry_and_mlsysim_names_the_reference(short, curated):
    entry, reference = find(short), find(NAMESPACE + short)
    assert (entry.key, entry.origin) == (curated, "curated")
    assert (reference.key, reference.origin) == (NAMESPACE + short, "reference")
    assert reference.extra["curated_counterpart"] == curated
    # Every name of the reference entry is namespaced; its plain names belong to the curated one.
    assert all(normalise(n).startswith(NAMESPACE) for n in reference.names)
    for name in reference.names:
        assert find(name) is reference
        assert find(name[len(NAMESPACE):]) is entry
    # The same model or card: shapes (models) or memory (hardware) equal, only counts differ.
    if entry.kind == "model":
        for field in ("layers", "hidden_dim", "experts", "active_experts_per_token"):
            assert getattr(entry.value, field, None) == getattr(reference.value, field, None), field
        assert abs(entry.value.parameters / reference.value.parameters - 1) < 0.04
    else:
        assert entry.value.memory_capacity == reference.value.memory_capacity


def test_deepseek_v3_short_name_is_the_config_not_the_reference_numbers():
    """The issue's example: `deepseek-v3` gave the reference's 56 heads and no expert width."""
    v3, ref = get_model("deepseek-v3"), get_model("mlsysim:deepseek-v3")
    # transformers 5.23 keeps e_score_correction_bias as a buffer: 58 x 256 fewer than the
    # checkpoint's remote code counted (671,026,419,200)
    assert (v3.heads, v3.expert_ffn_dim, v3.parameters) == (128, 2048, 671_026_404_352)
    assert (ref.heads, ref.expert_ffn_dim, ref.parameters) == (56, None, 671_000_000_000)


def test_reference_entries_without_a_curated_counterpart_keep_their_short_names():
    for entry in list_models(plugins=False) + list_hardware(plugins=False):
        if entry.origin == "reference" and "curated_counterpart" not in entry.extra:
            short = entry.key[len(NAMESPACE):]
            assert short not in COUNTERPARTS and short in entry.aliases
            assert find(short) is entry and find(entry.key) is entry
    assert find_model("bert-base").key == "mlsysim:bert-base"
    assert find_hardware("gb200-nvl72").key == "mlsysim:gb200-nvl72"


def test_the_counterparts_are_recorded_in_the_data_and_the_dump_tool():
    from scripttools import load_script
    recorded = {e.key[len(NAMESPACE):]: e.extra["curated_counterpart"]
                for e in list_models(plugins=False) + list_hardware(plugins=False)
                if e.origin == "reference" and "curated_counterpart" in e.extra}
    assert recorded == COUNTERPARTS
    tool = load_script("tools/dump_reference_catalog.py")      # (mlsysim itself is imported only when it dumps)
    assert tool.COUNTERPARTS == COUNTERPARTS


def test_notes_name_reference_data_and_nothing_else():
    ref, gpu = get_model("mlsysim:llama3-8b"), get_hardware("mlsysim:h100")
    assert provenance_notes(ref, gpu) == (
        "model: mlsysim:llama3-8b is mlsysim 0.3.0's reference catalog data (textbook numbers); "
        "`llama3-8b` is the curated meta-llama/llama-3.1-8b",
        "hardware: mlsysim:h100 is mlsysim 0.3.0's reference catalog data; "
        "`h100` is the curated nvidia/h100-sxm5-80gb")
    assert provenance_notes(get_model("bert-base")) == (
        "model: mlsysim:bert-base is mlsysim 0.3.0's reference catalog data (textbook numbers)",)
    assert provenance_notes(get_model("llama3-8b"), get_hardware("h100")) == ()       # curated
    assert provenance_notes(attrs.evolve(ref), attrs.evolve(gpu)) == ()     # equal, but built by hand


def test_alias_notes_say_what_a_misleading_short_name_means():
    assert alias_note("model", "gpt2") == (
        "'gpt2' is GPT-2 XL (1.5B parameters, openai-community/gpt2-xl), as in mlsysim 0.3.0; the 124M GPT-2 "
        "(Hugging Face's 'gpt2') is 'gpt2-small' (openai-community/gpt2)")
    assert alias_note("model", "GPT2") == alias_note("model", "gpt2")          # any case
    assert find_model("gpt2").value.parameters == 1_557_611_200 and find_model("gpt2-small").value.parameters == 124_439_808
    assert "Mixtral 8x22B is 'mixtral-8x22b'" in alias_note("model", "mixtral")
    assert "'h100-pcie'" in alias_note("hardware", "H100-80GB")
    assert "'a100-40gb'" in alias_note("hardware", "a100") and "mi250x-gcd" in alias_note("hardware", "mi250x")
    # names that mean what they say carry none
    for kind, name in (("model", "gpt2-xl"), ("model", "openai-community/gpt2"), ("model", "meta-llama/llama-3.1-8b"),
                       ("hardware", "nvidia/h100-sxm5-80gb"), ("hardware", "rtx-4090"), ("hardware", "mlsysim:h100"),
                       ("model", "llama3-8b"), ("hardware", "h100")):     # (the defaults: the header names them)
        assert alias_note(kind, name) is None, name
    with pytest.raises(InvalidInputError, match="model='gpt-5' is not allowed"):
        alias_note("model", "gpt-5")
    with pytest.raises(InvalidInputError, match="kind='gpu' is not allowed: 'model' or 'hardware'"):
        alias_note("gpu", "h100")


def test_alias_notes_must_name_the_entry():
    row = {"key": "myorg/card", "aliases": ["card"], "memory_capacity": GiB}
    assert CatalogEntry.from_dict({**row, "alias_notes": {"Card": "the 1 GiB card"}}).extra["alias_notes"] == {
        "Card": "the 1 GiB card"}
    with pytest.raises(CatalogError, match=r"field 'alias_notes' names 'other', which is not a name of this entry"):
        CatalogEntry.from_dict({**row, "alias_notes": {"other": "a note"}})
    with pytest.raises(CatalogError, match=r"field 'alias_notes' must map names of the entry to notes"):
        CatalogEntry.from_dict({**row, "alias_notes": ["card"]})


# --- the counting helper ----------------------------------------------------------------------

def test_counting_helper_gpt2_small():
    """GPT-2 124M: the count Hugging Face reports for openai-community/gpt2."""
    count = count_parameters(layers=12, hidden_dim=768, heads=12, vocab_size=50257, ffn_dim=3072,
                             gated_mlp=False, tied_embeddings=True, norm="layer", qkv_bias=True,
                             attention_out_bias=True, mlp_bias=True, position_embeddings=1024)
    assert count.total == count.active == 124_439_808


def test_counting_helper_llama_3_1_8b():
    count = count_parameters(layers=32, hidden_dim=4096, heads=32, kv_heads=8, vocab_size=128256,
                             ffn_dim=14336)
    assert count.total == 8_030_261_248
    # by hand: embeddings + lm_head, 32 x (attention + SwiGLU + 2 norms), final norm
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert count.total == 2 * 128256 * 4096 + 32 * per_layer + 4096


def test_counting_helper_mixture_of_experts():
    count = count_parameters(layers=32, hidden_dim=4096, heads=32, kv_heads=8, vocab_size=32000,
                             experts=8, active_experts_per_token=2, expert_ffn_dim=14336)
    assert (count.total, count.active) == (46_702_792_704, 12_879_925_248)
    assert count.total - count.active == 32 * 6 * 3 * 4096 * 14336     # the 6 experts a token skips


def test_counting_helper_rejects_incomplete_configs():
    with pytest.raises(ValueError, match="ffn_dim"):
        count_parameters(layers=2, hidden_dim=8, heads=2, vocab_size=10)
    with pytest.raises(ValueError, match="norm="):
        count_parameters(layers=2, hidden_dim=8, heads=2, vocab_size=10, ffn_dim=16, norm="batch")


# --- the curated entries against their sources ------------------------------------------------

# Exact counts as Hugging Face reports them (model pages, num_parameters()), written out here
# independently of the counting helper.
EXACT_COUNTS = {
    "openai-community/gpt2": 124_439_808,
    "openai-community/gpt2-medium": 354_823_168,
    "openai-community/gpt2-large": 774_030_080,
    "openai-community/gpt2-xl": 1_557_611_200,
    "meta-llama/llama-2-7b-hf": 6_738_415_616,
    "meta-llama/llama-2-13b-hf": 13_015_864_320,
    "meta-llama/llama-2-70b-hf": 68_976_648_192,
    "meta-llama/meta-llama-3-8b": 8_030_261_248,
    "meta-llama/llama-3.1-8b": 8_030_261_248,
    "meta-llama/meta-llama-3-70b": 70_553_706_496,
    "meta-llama/llama-3.1-405b": 405_853_388_800,
    "meta-llama/llama-3.2-1b": 1_235_814_400,
    "meta-llama/llama-3.2-3b": 3_212_749_824,
    "mistralai/mistral-7b-v0.1": 7_241_732_096,
    "mistralai/mixtral-8x7b-v0.1": 46_702_792_704,
    "qwen/qwen2.5-0.5b": 494_032_768,
    "qwen/qwen2.5-7b": 7_615_616_512,
    "qwen/qwen2.5-72b": 72_706_203_648,
    "qwen/qwen1.5-moe-a2.7b": 14_315_784_192,
    "google/gemma-2-2b": 2_614_341_888,
    "google/gemma-2-9b": 9_241_705_984,
    "google/gemma-2-27b": 27_227_128_320,
    "microsoft/phi-3-mini-4k-instruct": 3_821_079_552,
    "tiiuae/falcon-7b": 6_921_720_704,
    "allenai/olmo-7b-hf": 6_888_095_744,
    # sum(p.numel()) of transformers 5.23 AutoModelForCausalLM.from_config(config) on the meta
    # device, measured for each committed config.json copy (tests/data/hf_configs/)
    "qwen/qwen3-0.6b": 596_049_920,
    "qwen/qwen3-1.7b": 1_720_574_976,
    "qwen/qwen3-4b": 4_022_468_096,
    "qwen/qwen3-8b": 8_190_735_360,
    "qwen/qwen3-14b": 14_768_307_200,
    "qwen/qwen3-32b": 32_762_123_264,
    "qwen/qwen3-30b-a3b": 30_532_122_624,
    "qwen/qwen3-235b-a22b-instruct-2507": 235_093_634_560,
    "google/gemma-3-1b-it": 999_885_952,
    "deepseek-ai/deepseek-v2-lite": 15_706_484_224,
    "deepseek-ai/deepseek-v3": 671_026_404_352,
    "openai/gpt-oss-20b": 20_914_757_184,
    "openai/gpt-oss-120b": 116_829_156_672,
    "allenai/olmo-2-1124-7b": 7_298_617_344,
    "allenai/olmo-2-1124-13b": 13_716_198_400,
    "meta-llama/llama-4-maverick-17b-128e": 400_711_848_960,
    "mistralai/ministral-8b-instruct-2410": 8_019_808_256,
    # issue 26 (tests/data/catalog_configs/): measured the same way
    "huggingfacetb/smollm2-135m": 134_515_008,
    "huggingfacetb/smollm2-360m": 361_821_120,
    "huggingfacetb/smollm2-1.7b": 1_711_376_384,
    "tinyllama/tinyllama-1.1b-chat-v1.0": 1_100_048_384,
    "google/gemma-2b": 2_506_172_416,            # keras-hub's gemma_2b_en "params" too
    "google/gemma-7b": 8_537_680_896,            # keras-hub's gemma_7b_en "params" too
    "qwen/qwen2-1.5b-instruct": 1_543_714_304,
    "qwen/qwen2-7b-instruct": 7_615_616_512,
    "qwen/qwen2.5-3b": 3_085_938_688,            # keras-hub's qwen2.5_3b_en "params" too
    "microsoft/phi-4": 14_659_507_200,
    "mistralai/mistral-nemo-base-2407": 12_247_782_400,
}

# Active parameters of the mixtures of experts, measured as total minus the routed experts'
# parameters a token skips ((experts - top_k) / experts of the ".experts." tensors).
EXACT_ACTIVE = {
    "qwen/qwen3-30b-a3b": 3_353_032_704,
    "qwen/qwen3-235b-a22b-instruct-2507": 22_190_763_520,
    "deepseek-ai/deepseek-v2-lite": 2_661_150_208,
    "deepseek-ai/deepseek-v3": 37_552_282_624,
    "openai/gpt-oss-20b": 4_187_440_704,
    "openai/gpt-oss-120b": 5_711_982_912,
    "meta-llama/llama-4-maverick-17b-128e": 17_184_691_200,
}

# Rounded figures the publishers state: (total in billions, active in billions, digits).
PUBLISHED_ROUNDED = {
    "meta-llama/llama-3.1-70b": (70.6, None, 1),
    "mistralai/mistral-7b-v0.3": (7.25, None, 2),
    "mistralai/mixtral-8x7b-v0.1": (46.7, 12.9, 1),
    "mistralai/mixtral-8x22b-v0.1": (141, 39, 0),
    "qwen/qwen2.5-1.5b": (1.54, None, 2),
    "qwen/qwen2.5-72b": (72.7, None, 1),
    "qwen/qwen1.5-moe-a2.7b": (14.3, 2.7, 1),
    "deepseek-ai/deepseek-v2-lite": (15.7, None, 1),
    "deepseek-ai/deepseek-v3": (671, None, 0),
    "microsoft/phi-3-medium-4k-instruct": (14, None, 0),
    "allenai/olmo-2-1124-7b": (7.3, None, 1),
    "openai/gpt-3-175b": (175, None, 0),
}

# Gemma 2 report (arXiv:2408.00118), Table 2: non-embedding parameters.
GEMMA2_NON_EMBEDDING = {"google/gemma-2-2b": 2_024_517_888, "google/gemma-2-9b": 8_324_201_984,
                        "google/gemma-2-27b": 26_047_480_320}


def curated_models():
    return by_origin(list_models(plugins=False), "curated")


def curated_hardware():
    return by_origin(list_hardware(plugins=False), "curated")


def test_curated_model_families_are_all_there():
    keys = set(curated_models())
    assert len(keys) == 62
    for needle in ["llama-2-7b", "llama-2-13b", "llama-2-70b", "meta-llama-3-8b", "meta-llama-3-70b",
                   "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.2-3b",
                   "mistral-7b-v0.1", "mistral-7b-v0.3", "mixtral-8x7b", "mixtral-8x22b",
                   "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b",
                   "qwen2.5-72b", "qwen1.5-moe-a2.7b", "gemma-2-2b", "gemma-2-9b", "gemma-2-27b",
                   "deepseek-v2-lite", "deepseek-v3", "phi-3-mini", "phi-3-medium", "olmo",
                   "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt-3-175b", "falcon-7b", "falcon-40b",
                   "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "qwen3-30b-a3b",
                   "qwen3-235b-a22b", "gemma-3-1b", "gpt-oss-20b", "gpt-oss-120b", "olmo-2-1124-13b", "llama-4-maverick",
                   "ministral-8b", "smollm2-135m", "smollm2-360m", "smollm2-1.7b", "tinyllama-1.1b", "gemma-2b",
                   "gemma-7b", "qwen2-1.5b", "qwen2-7b", "qwen2.5-3b", "phi-4", "mistral-nemo"]:
        assert any(needle in key for key in keys), needle


@pytest.mark.parametrize("key,count", sorted(EXACT_COUNTS.items()))
def test_curated_exact_counts(key, count):
    assert get_model(key).parameters == count


@pytest.mark.parametrize("key,active", sorted(EXACT_ACTIVE.items()))
def test_curated_exact_active_counts(key, active):
    assert get_model(key).active_parameters == active


@pytest.mark.parametrize("key,published", sorted(PUBLISHED_ROUNDED.items()))
def test_curated_counts_round_to_the_published_figures(key, published):
    total, active, digits = published
    model = get_model(key)
    assert round(model.parameters / 1e9, digits) == total
    if active is not None:
        assert round(model.active_parameters / 1e9, digits) == active


def test_gemma2_non_embedding_counts_match_the_report():
    for key, non_embedding in GEMMA2_NON_EMBEDDING.items():
        m = get_model(key)
        assert m.parameters - m.vocab_size * m.hidden_dim == non_embedding


def test_every_curated_count_recomputes_from_its_config():
    for key, entry in curated_models().items():
        count = count_workload_parameters(entry.value, entry.extra.get("counting"))
        assert count.total == entry.value.parameters, key
        if entry.value.is_sparse:
            assert count.active == entry.value.active_parameters, key


def test_curated_architecture_details():
    m = get_model("meta-llama/Llama-3.1-8B")      # the HF repo id, any case
    ref = get_model("mlsysim:llama3-8b")
    assert (m.parameters, ref.parameters) == (8_030_261_248, 8_030_000_000)
    fields = ("layers", "hidden_dim", "heads", "kv_heads", "vocab_size", "ffn_dim", "gated_mlp",
              "tied_embeddings", "context_length")
    assert [getattr(m, f) for f in fields] == [getattr(ref, f) for f in fields]
    assert get_model("meta-llama/Meta-Llama-3.1-8B") is m                  # the pre-rename repo id
    gemma = get_model("google/gemma-2-9b")
    assert (gemma.head_dim, gemma.heads, gemma.kv_heads, gemma.tied_embeddings) == (256, 16, 8, True)
    v3 = get_model("deepseek-ai/DeepSeek-V3")
    assert v3.is_sparse and (v3.experts, v3.active_experts_per_token, v3.shared_experts) == (256, 8, 1)
    # MLA: every head has its own keys and values (kv_b_proj), keys qk_nope + qk_rope = 192 wide
    assert (v3.expert_ffn_dim, v3.kv_lora_rank, v3.qk_rope_head_dim, v3.kv_heads, v3.head_dim) == (
        2048, 512, 64, 128, 192)
    assert find_model("deepseek-ai/deepseek-v3").extra["counting"]["dense_layers"] == 3
    assert (v3.details["mla"], v3.details["v_head_dim"], v3.details["first_k_dense_replace"],
            v3.details["mtp_layers_not_built"], v3.details["scoring_func"]) == (True, 128, 3, 1, "sigmoid")
    falcon = get_model("tiiuae/falcon-7b")
    assert (falcon.heads, falcon.kv_heads, falcon.gated_mlp) == (71, 1, False)


NUMERIC_MODEL_FIELDS = ("parameters", "layers", "hidden_dim", "heads", "kv_heads", "head_dim", "vocab_size",
                        "ffn_dim", "gated_mlp", "tied_embeddings", "context_length", "kv_lora_rank",
                        "qk_rope_head_dim", "active_parameters", "experts", "active_experts_per_token",
                        "shared_experts", "expert_ffn_dim", "architecture")


def sourced_fields(entry):
    return {f.strip() for fields in entry.sources for f in fields.split(",")}


def test_every_curated_number_has_a_source():
    for key, entry in {**curated_models(), **curated_hardware()}.items():
        present = {f.name for f in attrs.fields(type(entry.value))
                   if getattr(entry.value, f.name) not in (None, {}) and f.name not in ("name", "vendor")}
        missing = present - sourced_fields(entry)
        assert not missing, f"{key}: no source for {sorted(missing)}"
        assert all(len(text) > 20 for text in entry.sources.values()), key


def test_curated_models_cite_a_public_source():
    for key, entry in curated_models().items():
        text = " ".join(entry.sources.values())
        assert entry.extra.get("hf_repo") and f"huggingface.co/{entry.extra['hf_repo']}" in text \
            or "arXiv:" in text, key
        if entry.extra.get("hf_repo"):
            assert normalise(entry.extra["hf_repo"]) == entry.key and entry.value.name == entry.extra["hf_repo"]


# Vendor figures: (bytes of memory, bytes/s of bandwidth, devices per node).
HARDWARE = {
    "nvidia/a100-sxm4-40gb": (40 * GiB, 1_555_000_000_000, 8),
    "nvidia/a100-sxm4-80gb": (80 * GiB, 2_039_000_000_000, 8),
    "nvidia/a100-pcie-80gb": (80 * GiB, 1_935_000_000_000, None),
    "nvidia/h100-sxm5-80gb": (85_899_345_920, 3_350_000_000_000, 8),
    "nvidia/h100-pcie-80gb": (80 * GiB, 2_000_000_000_000, None),
    "nvidia/h200-sxm-141gb": (141 * GiB, 4_800_000_000_000, 8),
    "nvidia/b200": (180 * GiB, 8_000_000_000_000, 8),
    "nvidia/gb200": (186 * GiB, 8_000_000_000_000, 4),
    "nvidia/l4": (24 * GiB, 300_000_000_000, None),
    "nvidia/l40s": (48 * GiB, 864_000_000_000, None),
    "nvidia/rtx-4090": (24 * GiB, 1_008_000_000_000, 8),                # a renter's 8-card server
    "nvidia/t4": (16 * GiB, 320_000_000_000, None),
    "nvidia/v100-sxm2-16gb": (16 * GiB, 900_000_000_000, 8),
    "nvidia/v100-sxm2-32gb": (32 * GiB, 900_000_000_000, 8),
    "amd/mi250x": (128 * GiB, 3_276_800_000_000, 4),
    "amd/mi250x-gcd": (64 * GiB, 1_638_400_000_000, 8),
    "amd/mi300x": (192 * GiB, 5_300_000_000_000, 8),
    "amd/mi325x": (256 * GiB, 6_000_000_000_000, 8),
    "intel/gaudi2": (96 * GiB, 2_450_000_000_000, 8),
    "intel/gaudi3": (128 * GiB, 3_700_000_000_000, 8),
    "google/tpu-v4": (32 * GiB, 1_200_000_000_000, 4),
    "google/tpu-v5e": (16 * GiB, 819_000_000_000, 8),
    "google/tpu-v5p": (95 * GiB, 2_765_000_000_000, 4),
    "google/tpu-v6e": (32 * GiB, 1_638_000_000_000, 8),
    # issue 15: cited by page address (see each entry's sources)
    "amd/mi355x": (288 * GiB, 8_000_000_000_000, 8),
    "nvidia/h20": (96 * GiB, 4_000_000_000_000, None),
    "nvidia/rtx-a6000": (48 * GiB, 768_000_000_000, None),
    "nvidia/rtx-5090": (32 * GiB, 1_792_000_000_000, None),
    # issue 23: the accelerators people rent
    "nvidia/a10g": (24 * GiB, 600_000_000_000, 8),
    "nvidia/rtx-6000-ada": (48 * GiB, 960_000_000_000, None),
    "nvidia/h100-nvl": (94 * GiB, 3_930_000_000_000, None),
    "nvidia/gh200": (96 * GiB, None, None),
    "aws/trainium2": (96 * GiB, 2_900_000_000_000, 16),
}


def test_curated_hardware_numbers():
    assert set(curated_hardware()) == set(HARDWARE)
    for key, (capacity, bandwidth, per_node) in HARDWARE.items():
        hw = get_hardware(key)
        assert (hw.memory_capacity, hw.memory_bandwidth, hw.devices_per_node) == (capacity, bandwidth, per_node), key
        assert hw.vendor in ("NVIDIA", "AMD", "Intel", "Google", "AWS"), key
        stated = find_hardware(key).extra["memory_capacity_stated"]
        assert re.match(rf"{capacity // GiB} ?Gi?B", stated), (key, stated)   # the vendor's figure, as GiB


def test_curated_hardware_extras():
    h100 = find_hardware("NVIDIA/H100")                                 # an alias
    assert h100.key == "nvidia/h100-sxm5-80gb"
    assert h100.extra["memory_capacity_reported"] == 85_520_809_984     # nvidia-smi: 81,559 MiB
    assert h100.value.host_memory == 2 * 2**40
    assert get_hardware("google/tpu-v6e").host_memory == 1536 * GiB
    assert get_hardware("google/tpu-v5e").host_memory == 512 * GiB
    assert find_hardware("nvidia/rtx-4090").extra["tier"] == "workstation"


# Planner figures (issue 17): dense peak FLOP/s and per-device, one-direction bandwidths are
# HardwareNode fields, each with its own quoted source; what has no field stays in extra.
TOPOLOGY = {
    "nvidia/h100-sxm5-80gb": (989e12, 1979e12, 450e9, 50e9),       # NVLink 4: 900 GB/s both ways; 8 x 400 Gb/s NICs
    "nvidia/h200-sxm-141gb": (989e12, 1979e12, 450e9, 50e9),
    "nvidia/b200": (2.25e15, 4.5e15, 900e9, 50e9),                 # NVLink 5: 1.8 TB/s both ways
    "nvidia/a100-sxm4-80gb": (312e12, None, 300e9, None),          # NVLink 3: 600 GB/s both ways
    "google/tpu-v5p": (459e12, 459e12, 600e9, 6.25e9),
}
FIELDS = ("peak_bf16_flops", "peak_fp8_flops", "intra_node_bandwidth", "inter_node_bandwidth")


# Issue 23: planner figures of the cards people rent; None = no citable figure (docs/catalog.md
# lists them). (bf16 dense, fp8 dense, intra-node, inter-node, devices per node)
RENTED = {
    "nvidia/rtx-4090": (165.2e12, None, 32e9, 312.5e6, 8),       # BF16 165.2 dense (330.3 sparse); PCIe Gen4; 2 x 10GbE / 8
    "nvidia/a10g": (None, None, None, 1.5625e9, 8),              # g5.48xlarge: 8 GPUs, 100 Gb/s
    "nvidia/l4": (121e12, 242e12, 32e9, None, None),             # 242 / 485 TFLOPS sparse, halved
    "nvidia/l40s": (362e12, 733e12, 32e9, None, None),
    "nvidia/rtx-a6000": (154.8e12, None, 32e9, None, None),
    "nvidia/rtx-5090": (None, None, 64e9, None, None),           # PCIe Gen5: 128 GB/s both ways
    "nvidia/rtx-6000-ada": (None, None, 32e9, None, None),
    "nvidia/h100-pcie-80gb": (756e12, 1513e12, 64e9, None, None),
    "nvidia/h100-nvl": (None, None, 64e9, None, None),
    "nvidia/gh200": (None, None, None, None, None),
    "aws/trainium2": (667e12, 1299e12, None, None, 16),          # sparse 2,563 listed apart
    "amd/mi355x": (None, None, None, None, 8),
}


@pytest.mark.parametrize("key", sorted(RENTED))
def test_rented_cards_planner_figures_are_quoted_and_converted(key):
    entry = find_hardware(key)
    assert tuple(getattr(entry.value, f) for f in (*FIELDS, "devices_per_node")) == RENTED[key]
    for field in (*FIELDS, "devices_per_node", "memory_capacity", "memory_bandwidth"):
        if getattr(entry.value, field) is None:
            continue
        source = entry.sources[field]
        assert re.search(r"https?://|\w\.(com|org)\b|datasheet|documentation|whitepaper|same (page|table|SPECS)",
                         source), (key, field)                                              # names its page
        if field in FIELDS:
            assert "'" in source, (key, field)                                          # and quotes it
        if field.endswith("bandwidth") and field != "memory_bandwidth":
            assert "one direction" in source, (key, field)            # the field is one direction per device
        if field.startswith("peak_"):
            assert "sparse" in source.lower() or "sparsity" in source.lower(), (key, field)  # says which it is
    if entry.value.intra_node_bandwidth is not None and "nvlink" not in entry.sources["intra_node_bandwidth"].lower():
        assert "PCIe" in entry.sources["intra_node_bandwidth"]


def test_curated_hardware_topology_is_sourced():
    for key, values in TOPOLOGY.items():
        node = get_hardware(key)
        assert tuple(getattr(node, f) for f in FIELDS) == values, key
    for key, entry in curated_hardware().items():
        for name in FIELDS:
            if getattr(entry.value, name) is not None:
                assert len(entry.sources.get(name, "")) > 20, (key, name)
        assert set(entry.extra.get("performance", {})) <= {"nvlink_domain_devices", "peak_int8_ops"}, key
    assert find_hardware("nvidia/gb200").extra["performance"]["nvlink_domain_devices"] == 72
    assert get_hardware("google/tpu-v6e").host_memory == 1536 * GiB
    assert "docs.cloud.google.com/tpu/docs/v6e" in find_hardware("google/tpu-v6e").sources["host_memory"]


def test_every_name_finds_its_entry():
    """No name is shadowed: every key, alias and display name finds its own entry."""
    for entry in list_models(plugins=False) + list_hardware(plugins=False):
        for name in entry.names:
            found = find_model(name) if entry.kind == "model" else find_hardware(name)
            assert found is entry
        assert entry.key.startswith(NAMESPACE) == (entry.origin == "reference")


# --- integrity -------------------------------------------------------------------------------

def test_names_are_unique_and_entries_are_stamped():
    for entries in (list_models(plugins=False), list_hardware(plugins=False)):
        keys = [e.key for e in entries]
        assert len(keys) == len(set(keys))
        assert all(e.key == e.key.strip().lower() for e in entries)
        assert {e.origin for e in entries} == {"reference", "curated"}
        assert all(e.provided_by.startswith("mlsysim-core built-in catalog") for e in entries)


def test_entries_round_trip_through_dicts():
    for entry in list_models(plugins=False) + list_hardware(plugins=False):
        again = CatalogEntry.from_dict(entry.to_dict())
        assert again.value == entry.value and again.key == entry.key and again.aliases == entry.aliases
        assert dict(again.sources) == dict(entry.sources)
        assert dict(again.extra) == dict(entry.extra)


def test_the_catalog_page_lists_every_curated_entry_with_its_numbers():
    from pathlib import Path
    page = (Path(__file__).resolve().parents[2] / "docs" / "catalog.md").read_text(encoding="utf-8")
    for key, entry in curated_models().items():
        assert f"| `{key}` | {entry.value.parameters:,} |" in page, key
    for key, entry in curated_hardware().items():
        assert f"| `{key}` | {entry.value.memory_capacity:,} |" in page, key


# --- the user catalog directory: looked up on every lookup, re-read when it changes ------------

_USER_ROW = {"key": "myorg/tiny-lm", "aliases": ["tinylm"], "parameters": 1_000_000, "layers": 2,
             "hidden_dim": 64, "heads": 4}


def _write(directory, name, rows):
    import json
    path = directory / name
    path.write_text(json.dumps({"schema": 1, "models": rows}), encoding="utf-8")
    return path


def test_user_catalog_directory_created_during_the_process_is_noticed(tmp_path, monkeypatch):
    monkeypatch.delenv("MLSYSIM_CATALOG_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(InvalidInputError):
        get_model("tinylm")                     # no directory yet
    directory = tmp_path / "mlsysim-core" / "catalog"
    directory.mkdir(parents=True)
    _write(directory, "mine.json", [_USER_ROW])
    assert get_model("tinylm").layers == 2


def test_user_catalog_files_added_edited_and_removed_are_noticed(tmp_path, monkeypatch):
    import os
    monkeypatch.setenv("MLSYSIM_CATALOG_DIR", str(tmp_path))
    assert list_models(plugins=False)           # an empty directory: the built-ins
    os.utime(tmp_path, ns=(10**18, 10**18))      # an old listing, reused while the directory is unchanged
    with pytest.raises(InvalidInputError):
        get_model("tinylm")
    path = _write(tmp_path, "a.json", [_USER_ROW])   # adding a file changes the directory's mtime
    assert get_model("tinylm").layers == 2
    os.utime(tmp_path, ns=(10**18, 10**18))
    get_model("tinylm")
    _write(tmp_path, "a.json", [dict(_USER_ROW, layers=3)])   # edited in place: the directory is unchanged
    os.utime(path, ns=(1, 1))
    assert get_model("tinylm").layers == 3
    path.unlink()
    with pytest.raises(InvalidInputError):
        get_model("tinylm")


def test_user_catalog_environment_changes_are_noticed(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _write(a, "m.json", [_USER_ROW])
    _write(b, "m.json", [dict(_USER_ROW, layers=5)])
    monkeypatch.setenv("MLSYSIM_CATALOG_DIR", str(a))
    assert get_model("tinylm").layers == 2
    monkeypatch.setenv("MLSYSIM_CATALOG_DIR", str(b))
    assert get_model("tinylm").layers == 5
    monkeypatch.delenv("MLSYSIM_CATALOG_DIR")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "nothing-here"))
    with pytest.raises(InvalidInputError):
        get_model("tinylm")


# --- one model, one answer, from the command line ---------------------------------------------

def _cli_json(*argv):
    import io
    import json
    from mlsysim_core.cli import main
    out = io.StringIO()
    assert main(["estimate", *argv, "--json"], out=out) == 0
    return json.loads(out.getvalue())


def test_short_and_curated_names_give_the_same_answer_from_the_cli():
    """The issue: `-m deepseek-v3` and `-m deepseek-ai/deepseek-v3` answered differently, silently."""
    layout = ("-b", "64", "--tp", "8", "--pp", "8", "--dp", "8", "--ep", "8", "--zero-stage", "1")
    short, curated = _cli_json("-m", "deepseek-v3", *layout), _cli_json("-m", "deepseek-ai/deepseek-v3", *layout)
    assert short["total_memory"] == curated["total_memory"] and short["model"] == "deepseek-ai/DeepSeek-V3"
    assert not any("reference catalog data" in line for line in short["constraint_trace"])
    # the reference data has no architecture: only the reference profile answers for it (0483e5f)
    reference = _cli_json("-m", "mlsysim:deepseek-v3", *layout, "--profile", "reference")
    short_reference = _cli_json("-m", "deepseek-v3", *layout, "--profile", "reference")
    assert reference["model"] == "mlsysim:DeepSeek-V3" and short_reference["model"] == "deepseek-ai/DeepSeek-V3"
    assert reference["total_memory"] != short_reference["total_memory"]     # the reference's 56 heads, not 128
    assert ("model: mlsysim:deepseek-v3 is mlsysim 0.3.0's reference catalog data (textbook numbers); "
            "`deepseek-v3` is the curated deepseek-ai/deepseek-v3") in reference["constraint_trace"]
    assert not any("MoERoutingModel" in line for r in (short, reference) for line in r["constraint_trace"])
    assert "MoE memory approximation: total expert parameters are evenly sharded by expert parallelism." \
        in short["constraint_trace"]


def test_the_estimate_header_says_when_the_reference_data_is_used():
    import io
    from mlsysim_core.cli import main
    out = io.StringIO()
    assert main(["estimate", "-m", "mlsysim:llama3-8b", "-g", "mlsysim:h100", "--profile", "reference"], out=out) == 0
    notes = [line for line in out.getvalue().splitlines() if line.startswith("note ")]
    assert any("mlsysim:llama3-8b is mlsysim 0.3.0's reference catalog data" in n for n in notes)
    assert any("mlsysim:h100 is mlsysim 0.3.0's reference catalog data" in n for n in notes)
    out = io.StringIO()
    assert main(["estimate", "--profile", "reference"], out=out) == 0          # the default: curated entries
    assert "reference catalog data" not in out.getvalue()
    assert "meta-llama/Llama-3.1-8B on NVIDIA H100 SXM5 80GB" in out.getvalue()


def test_an_unknown_hardware_name_from_the_cli_suggests_the_curated_card(capsys):
    from mlsysim_core.cli import main
    assert main(["estimate", "-g", "l40"]) == 2
    assert "hardware='l40' is not allowed: did you mean nvidia/l40s, nvidia/l4?" in capsys.readouterr().err


@pytest.mark.long     # a whole search and fit techniques from the CLI: `pytest --long`, .ci/run
def test_search_and_fit_techniques_work_on_an_rtx_4090(capsys):
    """The issue: `-g rtx-4090` was refused, and the card had no FLOP/s or topology, so `search`
    refused it and `fit techniques` printed unknown times."""
    import json
    from mlsysim_core.cli import main
    assert main(["search", "-m", "qwen3-0.6b", "-g", "rtx-4090", "-n", "16", "--global-batch", "16", "-s", "512",
                 "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    text = json.dumps(found)
    assert "NVIDIA GeForce RTX 4090 24GB" in text and "no peak_bf16_flops" not in text
    assert main(["fit", "techniques", "-m", "qwen3-0.6b", "-g", "4090", "-b", "8", "-s", "2048"]) == 0
    out = capsys.readouterr().out
    assert "hardware FLOP/s: 1.652e+14 (catalog: peak_bf16_flops)" in out
    assert "- fits" in out and "recomputed forward FLOPs" in out and "added unknown" not in out


def test_trainium2_is_the_curated_entry():
    # mlsysim 0.3.0's trainium2 (memory only) is mlsysim:trainium2; the short names are the
    # curated aws/trainium2, which carries the planner's figures
    for name in ("trainium2", "trn2", "trainium-2", "Trainium 2"):
        assert find_hardware(name).key == "aws/trainium2", name
    assert find_hardware("mlsysim:trainium2").origin == "reference"
