"""Regression tests for the second round of core QA findings (issue 13: errors name the
input; nothing silently accepted; no tracebacks)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel, TrainingMemoryResult
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError, NotModelledError
from mlsysim_core.hf import from_hf_config

HF_DIR = Path(__file__).parents[1] / "data" / "hf_configs"


def _config(name="Llama-3.2-1B.json"):
    return json.loads((HF_DIR / name).read_text(encoding="utf-8"))


# --- 1. HF configs: wrong types and oversized shapes name the config key ------------------

@pytest.mark.parametrize("bad", [["qwen2"], {"a": 1}, 3.5])
def test_hf_model_type_of_the_wrong_type(bad):
    config = dict(_config(), model_type=bad)
    with pytest.raises(InvalidInputTypeError) as info:
        from_hf_config(config)
    assert info.value.parameter == "config.model_type"
    assert "a string" in str(info.value)


def test_hf_model_type_list_through_the_cli(tmp_path, capsys):
    from mlsysim_core import cli
    (tmp_path / "config.json").write_text(json.dumps(dict(_config(), model_type=["qwen2"])), encoding="utf-8")
    try:
        code = cli.main(["estimate", "-m", str(tmp_path / "config.json")])
    except InvalidInputError as err:       # (cli.main may raise or print and exit 2)
        assert err.parameter == "config.model_type"
    else:
        assert code == 2
        assert "config.model_type" in capsys.readouterr().err


def test_hf_name_or_path_of_the_wrong_type():
    with pytest.raises(InvalidInputTypeError) as info:
        from_hf_config(dict(_config(), _name_or_path={"a": 1}))
    assert info.value.parameter == "config._name_or_path"
    # an empty one (a config made from scratch) still falls back to the model type
    assert from_hf_config(dict(_config(), _name_or_path="")).name == "llama"


@pytest.mark.parametrize("key", ["head_dim", "intermediate_size", "num_hidden_layers", "hidden_size",
                                 "vocab_size", "num_attention_heads", "max_position_embeddings"])
def test_hf_oversized_size_names_its_key(key):
    with pytest.raises(InvalidInputError) as info:
        from_hf_config(dict(_config(), **{key: 2**40}))
    assert info.value.parameter == f"config.{key}"
    assert "too large" in str(info.value)


@pytest.mark.parametrize("name, key, value", [
    ("Llama-3.2-1B.json", "num_hidden_layers", 2**28),
    ("Mixtral-8x7B-v0.1.json", "num_local_experts", 2**30),
    ("Mixtral-8x7B-v0.1.json", "hidden_size", 2**24),
])
def test_hf_sizes_whose_product_overflows_name_the_key(name, key, value):
    """Each key within bounds, their parameter count beyond 2**53: blame the key, not the
    derived TransformerWorkload.parameters."""
    with pytest.raises(InvalidInputError) as info:
        from_hf_config(dict(_config(name), **{key: value}))
    assert info.value.parameter == f"config.{key}"
    assert "parameters" in str(info.value)


# --- 2. from_json checks every rank -----------------------------------------------------

@pytest.fixture(scope="module")
def parallel_json():
    r = TrainingMemoryModel("measured").solve("llama3-8b", "h100", 8, 1024, tp_size=2, pp_size=2, dp_size=2)
    assert TrainingMemoryResult.from_json(r.to_json()) == r
    return json.loads(r.to_json())


def _set(*path_value):
    *path, value = path_value

    def edit(d):
        for step in path[:-1]:
            d = d[step]
        if value is _DELETE:
            del d[path[-1]]
        else:
            d[path[-1]] = value
    return edit


_DELETE = object()


@pytest.mark.parametrize("edit, parameter, words", [
    (_set("ranks", 1, "total_memory", -1), "result.ranks[1].total_memory", ">= 0"),
    (_set("ranks", 1, "weights", float("nan")), "result.ranks[1].weights", ">= 0"),
    (_set("ranks", 1, "weights", 1.0), "result.ranks[1].total_memory", "sum of the components"),
    (_set("ranks", 1, "terms", _DELETE), "result.ranks[1].terms", "missing"),
    (_set("ranks", 1, "terms", "x"), "result.ranks[1].terms", "to_json"),
    (_set("ranks", 1, "terms", []), "result.ranks[1].terms", "non-empty"),
    (_set("ranks", 1, "terms", 0, "component", "zzz"), "result.ranks[1].terms[0]", "component"),
    (_set("ranks", 0, "stages", []), "result.ranks[0].stages", "non-empty"),
    (_set("ranks", 1, "peak_phase", "zzz"), "result.ranks[1].peak_phase", "optimizer_step"),
    (_set("ranks", 1, "feasible", False), "result.ranks[1].feasible", "as the totals say"),
    (_set("ranks", 1, "ranks", 0), "result.ranks[1].ranks", ">= 1"),
    (_set("selected", "optimizer", "x"), "result.selected.optimizer", "adam"),
    (_set("selected", "dp_rule", "x"), "result.selected.dp_rule", "zero0"),
    (_set("selected", "tp_rule", _DELETE), "result.selected.tp_rule", "missing"),
    (_set("selected", _DELETE), "result.selected", "missing"),
    (_set("heaviest_rank", "nope"), "result.heaviest_rank", "last stage"),
    (_set("parallelism", "tp", 0), "result.parallelism.tp", ">= 1"),
])
def test_from_json_checks_each_rank(parallel_json, edit, parameter, words):
    data = copy.deepcopy(parallel_json)
    edit(data)
    with pytest.raises(InvalidInputError) as info:
        TrainingMemoryResult.from_json(json.dumps(data))
    assert info.value.parameter == parameter, str(info.value)
    assert words in str(info.value)


def test_from_json_without_schema_version_is_an_old_file(parallel_json):
    data = copy.deepcopy(parallel_json)
    del data["schema_version"]
    result = TrainingMemoryResult.from_json(json.dumps(data))
    assert result.explain()
    assert "schema_version" in TrainingMemoryResult.from_json.__doc__


# --- 3. the reference's communication_buffer_fraction under the measured profile ----------

def test_measured_refuses_communication_buffer_fraction():
    m = TrainingMemoryModel("measured")
    with pytest.raises(NotModelledError) as info:
        m.solve("llama3-8b", "h100", 8, dp_size=8, communication_buffer_fraction=0.9)
    assert info.value.parameter == "communication_buffer_fraction"
    assert "sharding rules' own buckets" in str(info.value)
    assert "reference profile's knob" in str(info.value)
    m.solve("llama3-8b", "h100", 8, dp_size=8, communication_buffer_fraction=0.05)      # the default
    ref = TrainingMemoryModel("reference")     # still the reference's knob there
    assert ref.solve("llama3-8b", "h100", 8, dp_size=8, communication_buffer_fraction=0.9).total_memory > \
        ref.solve("llama3-8b", "h100", 8, dp_size=8).total_memory


def test_measured_honours_trainable_fraction():
    m = TrainingMemoryModel("measured")
    assert m.solve("llama3-8b", "h100", 8, dp_size=8, trainable_fraction=0.1).total_memory < \
        m.solve("llama3-8b", "h100", 8, dp_size=8).total_memory


# --- 4/5. LoRA defaults and names ---------------------------------------------------------

def test_lora_default_targets_on_gpt2_are_c_attn():
    m = TrainingMemoryModel("measured")
    r = m.solve("gpt2-small", "h100", 8, 512, lora={"rank": 8})
    assert r.total_memory == m.solve("gpt2-small", "h100", 8, 512,
                                     lora={"rank": 8, "target_modules": ["c_attn"]}).total_memory
    assert any("lora.target_modules not given" in n and "c_attn" in n for n in r.notes)
    r = m.solve("llama3-8b", "h100", 1, 512, lora={"rank": 8})
    assert any("q_proj, k_proj, v_proj, o_proj" in n for n in r.notes)


def test_lora_fields_are_named_lora():
    from mlsysim_core.finetune import LoRAConfig, default_target_modules
    from mlsysim_core.catalog import get_model
    with pytest.raises(InvalidInputError) as info:
        TrainingMemoryModel("measured").solve("gpt2-small", "h100", 8, 512,
                                              lora={"rank": 8, "target_modules": ["q_proj"]})
    assert info.value.parameter == "lora.target_modules"
    assert "c_attn" in str(info.value)
    for kwargs, parameter in (({"rank": 0}, "lora.rank"), ({"quantization": "nf8"}, "lora.quantization"),
                              ({"target_modules": ("q_proj", "q_proj")}, "lora.target_modules")):
        with pytest.raises(InvalidInputError) as info:
            LoRAConfig(**kwargs)
        assert info.value.parameter == parameter
    assert LoRAConfig().target_modules is None
    assert default_target_modules(get_model("gpt2-small")) == ("c_attn",)
    assert LoRAConfig().for_model(get_model("llama3-8b")).target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")


@pytest.mark.parametrize("model, field", [("gpt4", "model.gated_mlp"), ("palm-540b", "model.ffn_dim")])
def test_all_linear_without_mlp_shapes_is_not_modelled(model, field):
    from mlsysim_core.catalog import get_model
    from mlsysim_core.finetune import trainable_fraction
    lora = {"rank": 16, "target_modules": "all-linear"}
    with pytest.raises(NotModelledError):
        TrainingMemoryModel("measured").solve(model, "h100", 8, lora=lora)
    with pytest.raises(NotModelledError) as info:      # the CLI's reference stand-in
        trainable_fraction(get_model(model), lora)
    assert info.value.parameter == field
    assert "needed to size the linear layers" in str(info.value)
    assert trainable_fraction(get_model(model), {"rank": 16}) > 0     # attention only: known


# --- 6/7. inverse searches over layouts a rule constrains ---------------------------------

@pytest.mark.parametrize("profile", ["reference", "measured"])
def test_fewest_devices_skips_dp_the_shard_group_does_not_divide(profile):
    from mlsysim_core import inverse
    options = {"hsdp": {"shard_group_size": 4}}
    a = inverse.fewest_devices("llama3-8b", "h100", 64, solver=TrainingMemoryModel(profile),
                               data_parallel="hsdp", plugin_options=options)
    assert a.value is not None and a.details["dp"] % 4 == 0
    smaller = [d for d in (4, 8, 16, 32) if d < a.details["dp"]]
    for d in smaller:
        assert not TrainingMemoryModel(profile).solve("llama3-8b", "h100", 64, dp_size=d, data_parallel="hsdp",
                                                      plugin_options=options).feasible
    b = inverse.fewest_devices("llama3-8b", "h100", 64, solver=TrainingMemoryModel(profile),
                               data_parallel="hsdp", plugin_options=options, powers_of_two=False)
    assert b.value is not None and b.details["dp"] % 4 == 0 and b.details["dp"] <= a.details["dp"]


def test_fewest_devices_with_no_dp_the_rule_accepts_names_the_rule():
    from mlsysim_core import inverse
    from mlsysim_core.errors import LayoutError
    with pytest.raises(LayoutError) as info:
        inverse.fewest_devices("llama3-8b", "h100", 64, data_parallel="hsdp",
                               plugin_options={"hsdp": {"shard_group_size": 3}})
    assert info.value.parameter == "plugin_options['hsdp'].shard_group_size"


def test_longest_sequence_searches_multiples_of_cp():
    from mlsysim_core import inverse
    m = TrainingMemoryModel("measured")
    model = from_hf_config(_config())      # Llama-3.2-1B: fits one H100
    a = inverse.longest_sequence(model, "h100", 1, solver=m, cp_size=2)
    assert a.value is not None and a.value % 2 == 0
    b = inverse.longest_sequence(model, "h100", 1, solver=m, cp_size=3, multiple_of=128)
    assert b.value is not None and b.value % 384 == 0
    assert inverse.sequence_unit(128, 3) == 384
    with pytest.raises(InvalidInputError) as info:
        inverse.longest_sequence("llama3-8b", "h100", 1, solver=m, cp_size=0)
    assert info.value.parameter == "cp_size"


# --- 8. expert_tp_size on a dense model ------------------------------------------------------

@pytest.mark.parametrize("etp", [1, 2])
def test_expert_tp_size_on_a_dense_model_is_refused(etp):
    with pytest.raises(InvalidInputError) as info:
        TrainingMemoryModel("measured").solve("llama3-8b", "h100", 8, tp_size=2, expert_tp_size=etp)
    assert info.value.parameter == "expert_tp_size"
    assert "None for a dense model" in str(info.value)


# --- 9. offload strings, lists and dicts --------------------------------------------------

@pytest.mark.parametrize("offload, words", [
    ("optimizer++gradients", "empty name"), ("optimizer+", "empty name"), ("+optimizer", "empty name"),
    ("", "empty name"), ("optimizer+optimizer", "named twice"), (["optimizer", "optimizer"], "named twice"),
    ({"optimizer": "cpu", "OPTIMIZER": "nvme"}, "named twice (to 'cpu' and 'nvme')"),
    (["gradients", "Gradients"], "named twice"),
])
def test_offload_refuses_empty_parts_and_duplicates(offload, words):
    with pytest.raises(InvalidInputError) as info:
        TrainingMemoryModel("measured").solve("llama3-8b", "h100", 8, 1024, offload=offload)
    assert info.value.parameter == "offload"
    assert words in str(info.value)


def test_offload_valid_forms_still_work():
    m = TrainingMemoryModel("measured")
    a = m.solve("llama3-8b", "h100", 8, 1024, offload="optimizer + gradients")
    assert a.total_memory == m.solve("llama3-8b", "h100", 8, 1024, offload=["gradients", "optimizer"]).total_memory
