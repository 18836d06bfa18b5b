"""Hostile and careless inputs (issue 23, item 4): contradictory inputs refused naming both;
every name a user gives resolved in one place (case and separators ignored, a near miss
named); one parser of sizes; files with a UTF-8 BOM or CRLF line ends; error messages that
list exactly what is allowed."""

from __future__ import annotations

import json
import re

import pytest

from clitools import error_of, run
from mlsysim_core import InvalidInputError, TrainingMemoryModel
from mlsysim_core.cli import main
from mlsysim_core.registry import name_key, resolve_name
from mlsysim_core.scenario import Scenario
from mlsysim_core.units import parse_bandwidth, parse_bytes

BOM = b"\xef\xbb\xbf"


@pytest.fixture(scope="module")
def measured():
    return TrainingMemoryModel(profile="measured")


def solve(solver, **kwargs):
    kwargs.setdefault("seq_len", 1024)
    return solver.solve("llama3-8b", "h100", kwargs.pop("batch_size", 8), **kwargs)


# --- contradictions -------------------------------------------------------------------------

@pytest.mark.parametrize("argv, named", [
    (["--regime", "bf16", "--precision", "fp32"], ["--precision='fp32'", "--regime='bf16'"]),
    (["--precision", "fp32", "--regime", "amp-bf16"], ["--precision='fp32'", "--regime='amp-bf16'"]),
    (["--regime", "mixed-bf16", "--precision", "fp16"], ["--precision='fp16'", "--regime='mixed-bf16'"]),
    (["--sequence-parallel", "--no-sequence-parallel", "--tp", "2"],
     ["--sequence-parallel (sequence_parallel=True)", "--no-sequence-parallel (sequence_parallel=False)"]),
    (["--no-sequence-parallel", "--sequence-parallel", "--tp", "2"],
     ["--no-sequence-parallel (sequence_parallel=False)", "--sequence-parallel (sequence_parallel=True)"]),
    (["--precision", "bf16", "--precision", "fp32"], ["--precision bf16", "--precision fp32"]),
    (["--tp", "2", "--tp-size", "4"], ["--tp 2", "--tp-size 4"]),
    (["--zero-stage", "0", "--data-parallel", "fsdp", "--dp", "2"], ["--zero-stage 0", "--data-parallel fsdp"]),
    (["--attention", "sdpa", "--attention", "eager"], ["--attention sdpa", "--attention eager"]),
])
def test_contradictory_flags_are_refused_naming_both(capsys, argv, named):
    code, err = error_of(capsys, "estimate", *argv)
    assert code == 2 and "contradict each other" in err
    for fragment in named:
        assert fragment in err


@pytest.mark.parametrize("argv", [["--regime", "mixed-bf16", "--precision", "bf16"],
                                  ["--regime", "fp32", "--precision", "tf32"],
                                  ["--regime", "Amp_BF16", "--precision", "BF16"],
                                  ["--tp", "2", "--tp-size", "2"],
                                  ["--sequence-parallel", "--sequence-parallel", "--tp", "2"]])
def test_agreeing_inputs_are_not_contradictions(argv):
    code, text = run("estimate", "--json", *argv)
    assert code == 0 and json.loads(text)["total_memory"] > 0


def test_search_refuses_a_switch_and_its_opposite(capsys):
    with pytest.raises(SystemExit) as info:
        main(["search", "-n", "8", "--global-batch", "8", "--progress", "--no-progress"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--progress (progress='always')" in err and "--no-progress" in err
    with pytest.raises(SystemExit) as info:
        main(["search", "-n", "8", "--global-batch", "8", "--regime", "bf16", "--precision", "fp32"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--precision='fp32'" in err and "--regime='bf16'" in err


def _scenario(tmp_path, name="s.json", **fields):
    path = tmp_path / name
    path.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": 8, **fields}))
    return path


def test_a_scenario_file_with_contradictory_fields_is_refused(capsys, tmp_path):
    path = _scenario(tmp_path, regime="bf16", precision="fp32")
    code, err = error_of(capsys, "estimate", "--scenario", str(path))
    assert code == 2 and "scenario s.json's precision='fp32'" in err and "scenario s.json's regime='bf16'" in err
    with pytest.raises(InvalidInputError) as info:
        Scenario.load(path)
    assert info.value.parameter == "scenario s.json's precision"
    with pytest.raises(InvalidInputError, match="regime='bf16' contradict"):
        Scenario.from_dict({"model": "llama3-8b", "hardware": "h100", "batch_size": 8, "regime": "bf16",
                            "precision": "fp32"})


def test_a_flag_that_contradicts_the_scenario_file_is_refused(capsys, tmp_path):
    path = _scenario(tmp_path, regime="bf16")
    code, err = error_of(capsys, "estimate", "--scenario", str(path), "--precision", "fp32")
    assert code == 2 and "--precision='fp32'" in err and "scenario s.json's regime='bf16'" in err
    # a flag that replaces the file's own value is an override, as documented, not a contradiction
    path = _scenario(tmp_path, "t.json", precision="fp32")
    code, text = run("estimate", "--scenario", str(path), "--precision", "bf16", "--json")
    assert code == 0 and json.loads(text)["run"]["precision"] == "bf16"


def test_a_saved_regime_scenario_loads_again(tmp_path):
    """to_dict leaves out the default precision its regime contradicts (it was not given)."""
    scenario = Scenario.from_dict({"model": "llama3-8b", "hardware": "h100", "batch_size": 8, "regime": "bf16"})
    assert "precision" not in scenario.to_dict()
    path = tmp_path / "saved.json"
    scenario.dump(path)
    assert Scenario.load(path) == scenario
    code, _ = run("estimate", "--regime", "bf16", "--save-scenario", str(tmp_path / "cli.json"))
    assert code == 0 and Scenario.load(tmp_path / "cli.json").regime == "bf16"


# --- names: one lookup, case and separators ignored, a near miss named --------------------------

@pytest.mark.parametrize("kwargs, meant", [
    ({"optimizer": "adamm"}, "adam"),
    ({"activation_checkpointing": "selectve"}, "selective"),
    ({"data_parallel": "fsdpp", "dp_size": 2}, "fsdp"),
    ({"sharding_rules": {"cp": "cp-ulyses"}, "cp_size": 2}, "cp-ulysses"),
    ({"profile": "measurd"}, "measured"),
    ({"regime": "amp-bf61"}, "amp-bf16"),
    ({"attention": "sdpaa"}, "sdpa"),
    ({"pipeline_schedule": "gpipee", "pp_size": 2}, "gpipe"),
    ({"optimizer_impl": "foreech"}, "foreach"),
    ({"precision": "bf61"}, "bf16"),
])
def test_a_near_miss_says_which_name_was_meant(measured, kwargs, meant):
    with pytest.raises(InvalidInputError) as info:
        solve(measured, **kwargs)
    assert f"did you mean {meant!r}" in str(info.value) or f"{meant!r} or" in str(info.value).split("did you")[1]
    assert meant in info.value.allowed     # the error lists the allowed names


@pytest.mark.parametrize("kwargs, canonical", [
    ({"optimizer": "AdamW"}, {"optimizer": "adamw"}),
    ({"optimizer": "SGD_Momentum"}, {"optimizer": "sgd-momentum"}),
    ({"activation_checkpointing": "SELECTIVE"}, {"activation_checkpointing": "selective"}),
    ({"activation_checkpointing": "Attention_Only"}, {"activation_checkpointing": "attention-only"}),
    ({"data_parallel": "FSDP", "dp_size": 2}, {"data_parallel": "fsdp", "dp_size": 2}),
    ({"data_parallel": "FSDP Grad Op", "dp_size": 2}, {"data_parallel": "fsdp-grad-op", "dp_size": 2}),
    ({"sharding_rules": {"cp": "CP_Ulysses"}, "cp_size": 2}, {"sharding_rules": {"cp": "cp-ulysses"}, "cp_size": 2}),
    ({"regime": "Mixed_BF16"}, {"regime": "mixed-bf16"}),
    ({"attention": "EAGER"}, {"attention": "eager"}),
    ({"pipeline_schedule": "Interleaved_1F1B", "pp_size": 2}, {"pipeline_schedule": "interleaved-1f1b", "pp_size": 2}),
    ({"pipeline_schedule": "ZB H1", "pp_size": 2}, {"pipeline_schedule": "zb-h1", "pp_size": 2}),
    ({"optimizer_impl": "For_Loop"}, {"optimizer_impl": "for-loop"}),
])
def test_names_ignore_case_and_separators(measured, kwargs, canonical):
    assert solve(measured, **kwargs).to_dict() == solve(measured, **canonical).to_dict()


def test_the_canonical_name_is_what_the_result_says(measured):
    r = solve(measured, optimizer="AdamW", regime="Mixed_BF16", profile="Measured")
    assert (r.optimizer, r.details["regime"], r.profile) == ("adamw", "mixed-bf16", "measured")
    assert TrainingMemoryModel().solve("llama3-8b", "h100", 8, profile="REFERENCE").profile == "reference"


def test_the_cli_takes_any_spelling_too():
    code, text = run("estimate", "--json", "--optimizer", "AdamW", "--checkpointing", "Full",
                     "--regime", "AMP_BF16")
    data = json.loads(text)
    assert code == 0 and data["run"]["regime"] == "amp-bf16"
    assert data["total_memory"] == json.loads(run("estimate", "--json", "--optimizer", "adamw", "--checkpointing",
                                                  "full", "--regime", "amp-bf16")[1])["total_memory"]


def test_surrounding_whitespace_is_not_ignored(measured):
    """As in the reference: " fp16" and "adam " are refused, with the name they probably meant."""
    for kwargs, meant in (({"optimizer": "adam "}, "adam"), ({"precision": " fp16"}, "fp16")):
        with pytest.raises(InvalidInputError, match=f"did you mean '{meant}'"):
            solve(measured, **kwargs)


def test_resolve_name_refuses_an_ambiguous_spelling():
    assert resolve_name("x", "a-b", ["a-b", "ab"]) == "a-b"      # exact: always that one
    with pytest.raises(InvalidInputError, match="ambiguous: it names 'a-b' and 'ab'"):
        resolve_name("x", "A_B", ["a-b", "ab"])
    assert name_key("Interleaved_1F1B") == name_key("interleaved-1f1b") == name_key("interleaved 1f1b")


def test_no_two_installed_names_are_one_spelling(measured):
    """Every installed name resolves on its own: no two differ only in case or separators."""
    registry = measured.registry
    tables = [registry.optimizers, registry.checkpointing, registry.sharding_rules, registry.profiles,
              *registry.extensions.values()]
    for table in tables:
        keys = [name_key(name) for name in table]
        assert len(keys) == len(set(keys)), sorted(table)


# --- sizes: one parser ----------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("24GiB", 24 * 2**30), ("24 GiB", 24 * 2**30), ("80GB", 80 * 10**9), ("80 GB", 80 * 10**9),
    ("1.5TB", 1_500_000_000_000), ("1.5KiB", 1536), ("512", 512), (512, 512), (2.0, 2), ("1e9", 10**9),
    ("80gb", 80 * 10**9), ("0", 0), ("3 MiB", 3 * 2**20), ("2PB", 2 * 10**15), ("1TiB", 2**40), ("7B", 7),
])
def test_parse_bytes_exact(text, expected):
    assert parse_bytes(text) == expected and type(parse_bytes(text)) is int


@pytest.mark.parametrize("text, why", [
    ("-1GB", "negative"), (-5, "negative"), ("nan", "not a finite number"), (float("nan"), "not a finite number"),
    ("infGB", "not a finite number"), ("12XB", "unknown unit 'XB'"), ("24G", "unknown unit 'G'"),
    ("1.1KiB", "not a whole number of bytes"), ("", "not a number"), ("GB", "not a number"),
])
def test_parse_bytes_refuses_naming_the_parameter(text, why):
    with pytest.raises(InvalidInputError) as info:
        parse_bytes(text, "hardware.memory_capacity")
    assert info.value.parameter == "hardware.memory_capacity" and why in str(info.value)
    assert "GiB" in info.value.allowed


def test_parse_bytes_refuses_other_types():
    for value in (True, None, [1]):
        with pytest.raises(InvalidInputError, match="got"):
            parse_bytes(value, "size")


def test_parse_bandwidth():
    assert parse_bandwidth("3.35TB/s") == 3_350_000_000_000
    assert parse_bandwidth("900 GB/s") == 900 * 10**9 == parse_bandwidth("900GB")
    assert parse_bandwidth("64GiB/s") == 64 * 2**30 and parse_bandwidth(10**12) == 10**12
    with pytest.raises(InvalidInputError, match="hardware.memory_bandwidth='3 TB/h'.*TB/s"):
        parse_bandwidth("3 TB/h", "hardware.memory_bandwidth")
    with pytest.raises(InvalidInputError, match="unknown unit 'XB'"):
        parse_bandwidth("3 XB/s", "hardware.memory_bandwidth")


def test_a_hardware_file_takes_sizes_with_units(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"name": "toy", "memory_capacity": "24GiB", "host_memory": "512 GB",
                                "memory_bandwidth": "3.35TB/s", "intra_node_bandwidth": "450GB/s"}))
    code, text = run("estimate", "--hardware", str(path), "--profile", "reference", "--json")
    assert code == 0
    from mlsysim_core.catalog.files import structure_hardware
    gpu = structure_hardware(json.loads(path.read_text()))
    assert (gpu.memory_capacity, gpu.host_memory) == (24 * 2**30, 512 * 10**9)
    assert (gpu.memory_bandwidth, gpu.intra_node_bandwidth) == (3_350_000_000_000, 450 * 10**9)
    assert json.loads(text)["hardware"] == "toy"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "toy", "memory_capacity": "24 GX"}))
    code, _ = run("estimate", "--hardware", str(bad))
    assert code == 2


def test_a_scenario_hardware_table_takes_units(tmp_path, capsys):
    path = _scenario(tmp_path, hardware={"name": "toy", "memory_capacity": "80 GB"})
    assert Scenario.load(path).resolve_hardware().memory_capacity == 80 * 10**9
    path = _scenario(tmp_path, "neg.json", hardware={"name": "toy", "memory_capacity": "-80 GB"})
    code, err = error_of(capsys, "estimate", "--scenario", str(path))
    assert code == 2 and "hardware.memory_capacity='-80 GB'" in err and "negative" in err


# --- a UTF-8 BOM, CRLF line ends ------------------------------------------------------------

def _hostile(text: str) -> bytes:
    return BOM + text.replace("\n", "\r\n").encode()


def test_scenario_files_with_a_bom_and_crlf(tmp_path):
    expected = json.loads(run("estimate", "--json", "--regime", "bf16", "-b", "4")[1])["total_memory"]
    toml = tmp_path / "s.toml"
    toml.write_bytes(_hostile('model = "llama3-8b"\nhardware = "h100"\nbatch_size = 4\nregime = "bf16"\n'))
    js = tmp_path / "s.json"
    js.write_bytes(_hostile('{\n  "model": "llama3-8b",\n  "hardware": "h100",\n  "batch_size": 4,\n'
                            '  "regime": "bf16"\n}\n'))
    for path in (toml, js):
        assert Scenario.load(path).regime == "bf16"
        code, text = run("estimate", "--scenario", str(path), "--json")
        assert code == 0 and json.loads(text)["total_memory"] == expected


def test_model_hardware_and_hf_files_with_a_bom_and_crlf(tmp_path):
    gpu = tmp_path / "gpu.json"
    gpu.write_bytes(_hostile('{\n "name": "toy",\n "memory_capacity": "80GiB"\n}\n'))
    model = tmp_path / "model.json"
    model.write_bytes(_hostile('{\n "name": "tiny", "parameters": 1000000, "layers": 2,\n'
                               ' "hidden_dim": 64, "heads": 4\n}\n'))
    code, text = run("estimate", "--model", str(model), "--hardware", str(gpu), "--profile", "reference", "--json")
    assert code == 0 and json.loads(text)["model"] == "tiny"
    hf = tmp_path / "ckpt"
    hf.mkdir()
    config = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
              "max_position_embeddings": 2048}
    (hf / "config.json").write_bytes(_hostile(json.dumps(config, indent=1)))
    code, text = run("estimate", "--model", str(hf), "--hardware", str(gpu), "-s", "512", "--json")
    assert code == 0 and json.loads(text)["total_memory"] > 0
    scenario = _scenario(tmp_path, model=str(hf / "config.json"), hardware=str(gpu))
    code, _ = run("estimate", "--scenario", str(scenario), "-s", "512")
    assert code == 0


# --- errors that list the allowed values list exactly those ---------------------------------

def _listed_offload_values(measured) -> list[str]:
    with pytest.raises(InvalidInputError) as info:
        solve(measured, offload="gpu")
    err = info.value
    assert err.parameter == "offload" and "'gpu'" in err.detail
    listed = err.allowed.split(" (names in any order")[0]
    return re.findall(r"'([^']+)'", listed)


def test_the_offload_error_lists_exactly_the_values_offload_takes(measured):
    listed = _listed_offload_values(measured)
    assert listed == ["optimizer", "optimizer+gradients", "optimizer+parameters",
                      "optimizer+gradients+parameters", "torchao", "torchao+gradients"]
    for value in listed:     # every listed value is accepted (torchao's: one device)
        layout = {} if value.startswith("torchao") else {"dp_size": 8, "zero_stage": 3}
        assert solve(measured, offload=value, optimizer="adamw", **layout).total_memory > 0, value
    for value in ("gpu", "gradients", "parameters", "gradients+parameters", "cpu", "nvme", "torchao+parameters",
                  "activations", "torchao+optimizer"):     # and values it does not list are refused
        for layout in ({}, {"dp_size": 8, "zero_stage": 3}):
            with pytest.raises(InvalidInputError):
                solve(measured, offload=value, optimizer="adamw", **layout)


def test_the_cli_offload_error_lists_the_same_values(capsys, measured):
    code, err = error_of(capsys, "estimate", "--offload", "gpu")
    assert code == 2
    for value in _listed_offload_values(measured):
        assert f"'{value}'" in err


# --- flags with fixed choices, and files read from Python or the user catalog ----------------

@pytest.mark.parametrize("argv, spelled", [(["--device", "CPU"], ["--device", "cpu"]),
                                           (["--lora-rank", "8", "--quantization", "NF4"],
                                            ["--lora-rank", "8", "--quantization", "nf4"])])
def test_a_choice_flag_takes_any_spelling_of_its_choice(argv, spelled):
    code, text = run("estimate", *argv, "--json")
    code_canonical, canonical = run("estimate", *spelled, "--json")
    assert code == code_canonical == 0 and json.loads(text) == json.loads(canonical)


def test_a_choice_flag_still_refuses_what_is_no_choice():
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "mlsysim_core", "estimate", "--device", "gpu"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--device: invalid choice: 'gpu' (choose from 'cuda', 'cpu')" in proc.stderr


def test_a_bom_in_an_hf_config_read_from_python(tmp_path):
    from mlsysim_core.hf import from_hf_config
    config = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 512, "vocab_size": 1000}
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(config, indent=2).replace("\n", "\r\n").encode())
    assert from_hf_config(str(path)).parameters == from_hf_config(config).parameters


def test_a_bom_in_a_user_catalog_file(tmp_path, monkeypatch):
    from mlsysim_core.catalog import clear_cache, find_hardware
    entry = {"schema": 1, "hardware": [{"key": "myorg/card", "name": "My card", "memory_capacity": 24 * 2**30}]}
    (tmp_path / "mine.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(entry).replace(",", ",\r\n").encode())
    monkeypatch.setenv("MLSYSIM_CATALOG_DIR", str(tmp_path))
    clear_cache()
    try:
        assert find_hardware("myorg/card").value.memory_capacity == 24 * 2**30
    finally:
        monkeypatch.delenv("MLSYSIM_CATALOG_DIR")
        clear_cache()


def test_a_regimes_precision_is_declared_not_read_from_its_name():
    """scenario.regime_precisions reads Regime.precision: a regime registered under a name that says no dtype
    agrees with the precision it declares only; one declaring none, with every precision of its compute bytes."""
    import attrs
    from mlsysim_core.scenario import regime_precisions
    from mlsysim_plugins.measured.regimes import REGIMES
    half = attrs.evolve(REGIMES["amp-fp16"], name="myorg.half")
    assert regime_precisions(half) == ("fp16",)
    assert regime_precisions(attrs.evolve(REGIMES["mixed-bf16"], name="myorg.mixed")) == ("bf16",)
    undeclared = attrs.evolve(half, precision="")
    assert set(regime_precisions(undeclared)) == {"bf16", "fp16"}
    assert set(regime_precisions(REGIMES["fp32"])) == {"fp32", "tf32"}


def test_a_string_for_a_tuple_option_is_refused_not_split_into_characters():
    """A third party's options field typed tuple (bare or tuple[X, ...], postponed annotations too) given a string:
    cattrs would make it a tuple of characters; refused, naming the field, under plugin_options and a named option."""
    import attrs
    from mlsysim_core.errors import InvalidInputTypeError
    from mlsysim_core.serialization import structure_options

    @attrs.frozen(kw_only=True)
    class Options:
        ops: "tuple" = ("mm",)
        sizes: "tuple[int, ...]" = (1,)

    assert structure_options("plugin_options", "mine", Options, {"ops": ["mm", "sdpa"], "sizes": [2]}) == \
        Options(ops=("mm", "sdpa"), sizes=(2,))
    for parameter, name, field in (("plugin_options", "mine", "ops"), ("mine", "mine", "sizes")):
        with pytest.raises(InvalidInputTypeError) as err:
            structure_options(parameter, name, Options, {field: "mm,sdpa"})
        where = f"plugin_options['mine'].{field}" if parameter != name else f"mine.{field}"
        assert str(err.value) == f"{where}='mm,sdpa' is not allowed: a list (got str)"
