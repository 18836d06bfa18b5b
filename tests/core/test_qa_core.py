"""QA findings on issue 13 (library side): every error names the input, nothing is silently
accepted, no exception from outside the library. Each test asserts the error's type, its
``parameter`` and its message."""

from __future__ import annotations

import io
import json

import pytest

from mlsysim_core import TrainingMemoryModel, TransformerWorkload, cli, inverse
from mlsysim_core import catalog as catalog_module
from mlsysim_core.errors import (InvalidInputError, InvalidInputTypeError, LayoutError, PluginError)
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.hf import from_hf_config
from mlsysim_core.result import TrainingMemoryResult
from mlsysim_core.search import search_plans

MEASURED = TrainingMemoryModel("measured")
REFERENCE = TrainingMemoryModel()
MAX = "an integer in [1, 9,007,199,254,740,992]"


def raises(kind, call, parameter, *fragments):
    with pytest.raises(kind) as info:
        call()
    err = info.value
    assert not isinstance(err, PluginError)
    assert err.parameter == parameter, str(err)
    for fragment in fragments:
        assert fragment in str(err), str(err)
    return err


def cli_error(*argv) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as info:
        cli.main([*argv, "--debug"], out=io.StringIO())
    return info.value


# --- 1. huge counts ----------------------------------------------------------------------------

@pytest.mark.parametrize("solver", [REFERENCE, MEASURED])
@pytest.mark.parametrize("field,value", [("seq_len", 10**400), ("seq_len", 1e308), ("batch_size", 2**53 + 1),
                                         ("tp_size", 10**30), ("gradient_accumulation_steps", 2**64)])
def test_huge_counts_name_the_input(solver, field, value):
    kwargs = {"batch_size": 8, field: value}
    err = raises(InvalidInputError, lambda: solver.solve("llama3-8b", "h100", **kwargs), field, MAX)
    assert err.value == value


def test_counts_up_to_the_bound_are_exact():
    r = REFERENCE.solve("llama3-8b", "h100", 2**53, 1024)
    assert r.microbatch == 2**53
    assert raises(InvalidInputError, lambda: TransformerWorkload(name="x", parameters=2**60, layers=2),
                  "TransformerWorkload.parameters", MAX)


def test_the_reference_grid_and_catalog_are_within_the_bound(reference_grid):
    for case in reference_grid:
        for value in (*case["kwargs"].values(), *case["model"].values()):
            if type(value) is int:
                assert value <= 2**53
    catalog_module.list_models()     # every entry still builds
    catalog_module.list_hardware()


# --- 2. include_plugins -----------------------------------------------------------------------------

@pytest.mark.parametrize("solver", [REFERENCE, MEASURED])
@pytest.mark.parametrize("plugin", ["measured_profile", "reference_profile", "model_states", "adam"])
def test_include_plugins_refuses_profile_plugins(solver, plugin):
    err = raises(InvalidInputError, lambda: solver.solve("llama3-8b", "h100", 8, 1024, include_plugins=(plugin,)),
                 "include_plugins", "a plugin whose component hooks the profile does not already run")
    assert err.value == plugin


def test_include_plugin_from_the_cli_is_an_input_error():
    for profile in ("measured", "reference"):
        err = cli_error("estimate", "--include-plugin", "measured_profile", "--profile", profile)
        assert err.parameter == "include_plugins" and "provides a profile" in str(err)


# --- 3. tp under the reference profile --------------------------------------------------------------

def test_reference_tp_beyond_the_hidden_size():
    raises(LayoutError, lambda: REFERENCE.solve("llama3-8b", "h100", 8, 1024, tp_size=99999999999),
           "tp_size", "at most the model's hidden size 4096")
    raises(InvalidInputError, lambda: inverse.fewest_devices("llama3-8b", "h100", 8, tp_size=10**30),
           "tp_size", MAX)
    raises(LayoutError, lambda: inverse.fewest_devices("llama3-8b", "h100", 8, tp_size=8192), "tp_size")


def test_reference_keeps_the_grid_tp_sizes(reference_grid):
    """mlsysim 0.3.0 accepted tp=16 on 12 heads (and tp=3 on 32): the grid records such runs, so
    the reference profile checks only tp <= hidden size, which no grid case exceeds."""
    cases = [c for c in reference_grid if c["model"].get("heads") and c["kwargs"]["tp_size"] > c["model"]["heads"]]
    assert cases
    for case in reference_grid:
        assert case["kwargs"]["tp_size"] <= (case["model"].get("hidden_dim") or 4096)


# --- 4, 5. measured layouts ------------------------------------------------------------------------

def test_every_stage_needs_a_layer():
    raises(LayoutError, lambda: MEASURED.solve("llama3-8b", "h100", 8, 1024, pp_size=2, stage_layers=[32, 0]),
           "stage_layers", "at least 1 layer on every pipeline stage")
    err = cli_error("estimate", "--pp", "2", "--stage-layers", "32,0")
    assert err.parameter == "stage_layers"


@pytest.mark.parametrize("tp", [7, 14])
def test_tp_must_fit_the_kv_heads(tp):
    err = raises(LayoutError, lambda: MEASURED.solve("qwen/qwen2.5-7b", "h100", 8, 1024, tp_size=tp),
                 "tp_size", "1, 2, 4, 28")
    assert err.value == tp
    assert cli_error("estimate", "-m", "qwen/qwen2.5-7b", "--tp", str(tp)).parameter == "tp_size"


def test_tp_beyond_the_kv_heads_replicates():
    """28 heads, 4 KV heads: tp=28 replicates each KV head 7 times (Megatron, vLLM)."""
    MEASURED.solve("qwen/qwen2.5-7b", "h100", 8, 1024, tp_size=28, dp_size=1)
    MEASURED.solve("qwen/qwen2.5-7b", "h100", 8, 1024, tp_size=4)


# --- 6. context length -----------------------------------------------------------------------------

def test_learned_positions_cap_seq_len():
    model = catalog_module.get_model("gpt2")
    assert model.context_length == 1024
    raises(InvalidInputError, lambda: MEASURED.solve("gpt2", "h100", 1, 4096), "seq_len",
           "at most 1,024, the model's context length", "learned position embeddings")
    MEASURED.solve("gpt2", "h100", 1, 1024)
    assert cli_error("estimate", "-m", "gpt2", "-s", "4096").parameter == "seq_len"


def test_longest_sequence_stops_at_the_position_table():
    answer = inverse.longest_sequence("gpt2", "h200", 1, solver=MEASURED)
    assert answer.value == 1024 and not answer.at_search_limit
    assert "capped at the model's context length 1,024" in answer.describe()


def test_rope_past_the_context_length_is_a_note():
    r = MEASURED.solve("llama3-8b", "h200", 1, 200_000)
    assert any(n.startswith("seq_len 200,000 exceeds the model's context length 131,072") for n in r.notes)
    assert not any("context length" in n for n in MEASURED.solve("llama3-8b", "h200", 1, 4096).notes)


# --- 7. exceptions from outside the library ----------------------------------------------------------

def test_python_api_types():
    raises(InvalidInputTypeError, lambda: TrainingMemoryModel(plugin_manager="x"), "plugin_manager", "PluginManager")
    for solver in ("x", 0, "", []):
        raises(InvalidInputTypeError, lambda: inverse.largest_batch("llama3-8b", "h100", solver=solver),
               "solver", "a TrainingMemoryModel")
        raises(InvalidInputTypeError,
               lambda: search_plans("llama3-8b", "h100", devices=8, global_batch=8, solver=solver), "solver")
    raises(InvalidInputError, lambda: inverse.largest_batch("llama3-8b", "h100", bogus=1), "bogus",
           "a keyword of solve", "seq_len", "tp_size")
    raises(InvalidInputError, lambda: inverse.longest_sequence("llama3-8b", "h100", 8, bogus=1), "bogus")
    raises(InvalidInputTypeError, lambda: catalog_module.normalise(None), "name")
    raises(InvalidInputTypeError, lambda: catalog_module.read_catalog_file(None), "path")


@pytest.mark.parametrize("kwargs,parameter,kind", [
    ({"max_tp": 1.5}, "max_tp", InvalidInputError), ({"max_tp": "x"}, "max_tp", InvalidInputTypeError),
    ({"max_tp": -1}, "max_tp", InvalidInputError), ({"max_tp": 0}, "max_tp", InvalidInputError),
    ({"max_tp": ""}, "max_tp", InvalidInputTypeError),
    ({"context_parallel": 2}, "context_parallel", InvalidInputTypeError),
    ({"context_parallel": [3]}, "context_parallel", InvalidInputError),
    ({"context_parallel": [4096]}, "context_parallel", InvalidInputError),
    ({"context_parallel": []}, "context_parallel", InvalidInputError),
    ({"recompute": "x"}, "recompute", InvalidInputTypeError),
    ({"recompute": {"full": -1}}, "recompute['full']", InvalidInputError),
    ({"progress": "x"}, "progress", InvalidInputTypeError),
    ({"assume_monotone": 1}, "assume_monotone", InvalidInputTypeError),
])
def test_search_arguments(kwargs, parameter, kind):
    raises(kind, lambda: search_plans("llama3-8b", "h100", devices=8, global_batch=8, seq_len=2048, **kwargs),
           parameter)


def test_search_cp_that_never_works_exits_2(capsys):
    assert cli.main(["search", "-n", "8", "--global-batch", "8", "--cp", "3"], out=io.StringIO()) == 2
    assert "context_parallel=3" in capsys.readouterr().err


def test_hf_config_files(tmp_path):
    cases = {"utf": b'{"model_type": "llama", "name": "\xff\xfe"}', "deep": b"[" * 100_000,
             "digits": b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}"}
    for name, content in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_bytes(content)
        raises(InvalidInputError, lambda: from_hf_config(folder), "config", "a JSON document")


def test_from_json_malformed_numbers():
    raises(InvalidInputError, lambda: TrainingMemoryResult.from_json('{"total_memory": ' + "9" * 5000 + "}"),
           "text", "valid JSON")
    raises(InvalidInputError, lambda: TrainingMemoryResult.from_json("[" * 100_000), "text")


@pytest.mark.parametrize("content,fragment", [(b"\xff\xfe{}", "not UTF-8"), (b"[" * 100_000, "nested too deeply"),
                                              (b'{"schema": ' + b"1" * 5000 + b"}", "not valid JSON")])
def test_user_catalog_files_that_cannot_be_read(tmp_path, monkeypatch, content, fragment):
    (tmp_path / "a.json").write_bytes(content)
    monkeypatch.setenv("MLSYSIM_CATALOG_DIR", str(tmp_path))
    catalog_module.clear_cache()
    try:
        with pytest.raises(catalog_module.CatalogError) as info:
            catalog_module.get_model("llama3-8b")
        assert "a.json" in str(info.value) and fragment in str(info.value)
        assert "a.json" in info.value.parameter
    finally:
        monkeypatch.delenv("MLSYSIM_CATALOG_DIR")
        catalog_module.clear_cache()


# --- 8. falsy wrong types -----------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("sharding_rules", 0), ("sharding_rules", []), ("sharding_rules", ""), ("sharding_rules", False),
    ("plugin_options", []), ("plugin_options", 0), ("plugin_options", ""),
    ("include_plugins", 0), ("include_plugins", False), ("include_plugins", {}),
])
@pytest.mark.parametrize("solver", [REFERENCE, MEASURED])
def test_falsy_wrong_types_are_errors(solver, field, value):
    solver.solve("llama3-8b", "h100", 8, 1024)     # (a cached plan must not let them through)
    raises(InvalidInputTypeError, lambda: solver.solve("llama3-8b", "h100", 8, 1024, **{field: value}), field)


@pytest.mark.parametrize("value", [[], False, ""])
def test_offload_falsy_forms(value):
    raises(InvalidInputError, lambda: MEASURED.solve("llama3-8b", "h100", 8, 1024, offload=value), "offload")


def test_documented_empty_forms_still_work():
    base = REFERENCE.solve("llama3-8b", "h100", 8, 1024)
    for kwargs in ({"sharding_rules": {}}, {"plugin_options": {}}, {"include_plugins": ()},
                   {"include_plugins": []}, {"sharding_rules": None}):
        assert REFERENCE.solve("llama3-8b", "h100", 8, 1024, **kwargs).total_memory == base.total_memory
    MEASURED.solve("llama3-8b", "h100", 8, 1024, offload={})


@pytest.mark.parametrize("name,value", [("powers_of_two", 1), ("exact_batch", "x")])
def test_inverse_flags(name, value):
    raises(InvalidInputTypeError, lambda: inverse.fewest_devices("llama3-8b", "h100", 8, **{name: value}), name,
           "True or False")


# --- 9. LoRA without a rank -------------------------------------------------------------------------------

@pytest.mark.parametrize("lora", [{}, {"quantization": "nf4"}])
def test_lora_dict_needs_a_rank(lora):
    raises(InvalidInputError, lambda: MEASURED.solve("llama3-8b", "h100", 8, 1024, lora=lora), "lora.rank",
           "the adapters' rank")


def test_lora_config_default_rank_is_kept():
    assert LoRAConfig().rank == 16
    MEASURED.solve("llama3-8b", "h100", 8, 1024, lora=LoRAConfig(rank=16))
    MEASURED.solve("llama3-8b", "h100", 8, 1024, lora={"rank": 8})


# --- 10. results read back --------------------------------------------------------------------------------

@pytest.mark.parametrize("change,parameter", [
    ({"total_memory": -1}, "result.total_memory"), ({"total_memory": float("nan")}, "result.total_memory"),
    ({"schema_version": "x"}, "result.schema_version"), ({"schema_version": 99}, "result.schema_version"),
    ({"schema_version": True}, "result.schema_version"),
    ({"weights": 1.0}, "result.total_memory"),
])
def test_from_json_refuses_impossible_results(change, parameter):
    data = json.loads(REFERENCE.solve("llama3-8b", "h100", 8, 1024).to_json())
    data.update(change)
    raises(InvalidInputError, lambda: TrainingMemoryResult.from_json(json.dumps(data)), parameter)


def test_from_json_refuses_a_flipped_verdict():
    r = REFERENCE.solve("llama3-8b", "h100", 8, 1024)
    data = json.loads(r.to_json())
    data["feasible"] = not data["feasible"]
    raises(InvalidInputError, lambda: TrainingMemoryResult.from_json(json.dumps(data)), "result.feasible",
           "as the totals say")
    assert TrainingMemoryResult.from_json(r.to_json()) == r
    parallel = MEASURED.solve("llama3-8b", "h100", 16, 1024, tp_size=2, pp_size=2, dp_size=2)
    assert TrainingMemoryResult.from_json(parallel.to_json()).total_memory == parallel.total_memory
