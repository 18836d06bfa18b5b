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

HF_DIR = Path(__file__).parent / "data" / "hf_configs"


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
