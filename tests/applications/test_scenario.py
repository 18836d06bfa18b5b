"""Scenario files: one solve written down, from Python and the CLI."""

import io
import json
from pathlib import Path

import pytest

from mlsysim_core import InvalidInputError
from mlsysim_core.cli import main
from mlsysim_core.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]


def test_scenario_solves_like_solve(solver, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "mlsysim:llama3-8b", "hardware": "mlsysim:h100", "batch_size": 8,
                                "seq_len": 1024}))
    result = Scenario.load(path).solve(solver)
    assert result.gb.total_memory == pytest.approx(165.790222016, rel=1e-12)


def test_toml_and_inline_model(solver, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('batch_size = 4\nseq_len = 100\nhardware = "h100"\nzero_stage = 3\ndp_size = 4\n'
                    '[model]\nname = "round"\nparameters = 1000000000\nlayers = 10\nhidden_dim = 1000\nheads = 10\n')
    result = Scenario.load(path).solve(solver)
    assert (result.weights, result.gradients, result.optimizer_state) == (5e8, 5e8, 3e9)


def test_round_trip_through_a_file(tmp_path):
    scenario = Scenario(model="mixtral-8x7b", hardware="h200", batch_size=64, tp_size=2, ep_size=4,
                        sharding_rules={"tp": "tp"}, include_plugins=["model_states"],
                        sequence_parallel=False)
    path = tmp_path / "out.json"
    scenario.dump(path)
    assert Scenario.load(path) == scenario


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_profile_options_round_trip_top_level(tmp_path, suffix):
    options = {"regime": "bf16", "lora": {"rank": 8, "target_modules": ["q_proj"], "quantization": "nf4"},
               "stage_layers": [20, 12], "offload": {"optimizer": "nvme"}, "runtime_overheads": False,
               "moe_capacity_factor": 1.25, "virtual_stages": 2, "pipeline_schedule": "interleaved-1f1b"}
    scenario = Scenario(model="llama3-8b", hardware="h100", batch_size=8, pp_size=2, profile_options=options)
    assert scenario.to_dict()["regime"] == "bf16" and "profile_options" not in scenario.to_dict()
    path = tmp_path / f"out{suffix}"
    scenario.dump(path)
    again = Scenario.load(path)
    assert again == scenario and again.profile_options == options and again.regime == "bf16"
    assert again.solve_kwargs()["lora"] == options["lora"]


@pytest.mark.parametrize("content,fragment", [
    ('{"model": "llama3-8b", "hardware": "h100"}', "batch_size"),
    ('{"model": "llama3-8b", "hardware": "h100", "batch_size": 8, "colour": 1}', "colour"),
    ('{"model": "llama3-8b", ', "valid JSON"),
    ('[1, 2]', "a table/object"),
])
def test_bad_files(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InvalidInputError, match=fragment):
        Scenario.load(path)


def test_values_are_checked_by_solve(solver, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": True}))
    with pytest.raises(InvalidInputError, match="batch_size=True"):
        Scenario.load(path).solve(solver)


def test_cli_scenario_with_flag_overrides(tmp_path, solver):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": 8, "seq_len": 1024,
                                "dp_size": 8}))
    out = io.StringIO()
    saved = tmp_path / "saved.json"
    assert main(["estimate", "--scenario", str(path), "--zero-stage", "3", "--json",
                 "--save-scenario", str(saved)], out=out) == 0
    data = json.loads(out.getvalue())
    # estimate's default profile is the measured one; the saved scenario says so
    expected = solver.solve("llama3-8b", "h100", 8, 1024, dp_size=8, zero_stage=3, profile="measured")
    assert data["total_memory"] == expected.total_memory and data["profile"] == "measured"
    assert Scenario.load(saved).zero_stage == 3 and Scenario.load(saved).dp_size == 8
    assert Scenario.load(saved).profile == "measured"


def test_hugging_face_config_as_the_model(solver, tmp_path):
    config = json.loads((ROOT / "tests" / "data" / "hf_configs" / "gpt2.json").read_text())
    scenario = Scenario.from_dict({"model": config, "hardware": "h100", "batch_size": 4, "seq_len": 512})
    result = scenario.solve(solver)
    assert result.weights == 124_439_808 * 2      # the exact count of GPT2LMHeadModel, fp16
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = io.StringIO()
    assert main(["estimate", "--model", str(path), "-b", "4", "-s", "512", "--json", "--profile", "reference"],
                out=out) == 0
    assert json.loads(out.getvalue())["weights"] == 124_439_808 * 2


def test_scenario_carries_the_measured_profile_options(tmp_path):
    """One file describes a whole run, regime and implementation choices included."""
    from mlsysim_core import TrainingMemoryModel
    path = tmp_path / "run.json"
    path.write_text(json.dumps({
        "model": "llama3-8b", "hardware": "h100", "batch_size": 2, "seq_len": 1024, "profile": "measured",
        "optimizer": "adamw", "activation_checkpointing": "full", "regime": "mixed-bf16",
        "optimizer_impl": "fused", "attention": "sdpa", "dropout": 0.0, "checkpointed_layers": 16,
        "runtime_overheads": {"cuda_context": 0, "allocator_fraction": 0.1}}))
    scenario = Scenario.load(path)
    result = scenario.solve()
    expected = TrainingMemoryModel().solve(
        "llama3-8b", "h100", 2, 1024, optimizer="adamw", activation_checkpointing="full", profile="measured",
        regime="mixed-bf16", optimizer_impl="fused", attention="sdpa", dropout=0.0, checkpointed_layers=16,
        runtime_overheads={"cuda_context": 0, "allocator_fraction": 0.1})
    assert result.total_memory == expected.total_memory and result.details["regime"] == "mixed-bf16"
    assert result.runtime_overheads == pytest.approx(2 * 32 * 2**20 + 0.1 * result.allocated_memory)  # 2 cuBLAS workspaces
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": 2, "profile": "measured",
                               "runtime_overheads": {"cuda_kontext": 1}}))
    with pytest.raises(InvalidInputError, match="runtime_overheads"):
        Scenario.load(bad).solve()
