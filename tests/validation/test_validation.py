"""Every input error: its type, and a message naming the parameter, the value and what is allowed."""

import math

import pytest

from mlsysim_core import (HardwareNode, InvalidInputError, InvalidInputTypeError, LayoutError,
                          SparseTransformerWorkload, TransformerWorkload)

MODEL = TransformerWorkload(name="m", parameters=1_000_000, layers=4, hidden_dim=64, heads=4)
GPU = HardwareNode(name="gpu", memory_capacity=2**30)


@pytest.mark.parametrize("kwargs,error,fragments", [
    ({"precision": "fp6"}, InvalidInputError, ["precision='fp6'", "bf16, fp16, fp32, fp8, int4, int8, tf32"]),
    ({"precision": 16}, InvalidInputTypeError, ["precision=16", "got int"]),
    ({"precision": "fp16 "}, InvalidInputError, ["precision='fp16 '"]),
    ({"optimizer": "mystery"}, InvalidInputError, ["optimizer='mystery'", "adam (mlsysim-core", "sgd ("]),
    ({"optimizer": None}, InvalidInputTypeError, ["optimizer=None"]),
    ({"activation_checkpointing": "Selectve"}, InvalidInputError,     # ("Selective" is selective)
     ["activation_checkpointing='Selectve'", "full (", "none (", "selective (", "did you mean 'selective'?"]),
    ({"activation_checkpointing": None}, InvalidInputTypeError, ["activation_checkpointing=None"]),
    ({"batch_size": 0}, InvalidInputError, ["batch_size=0", "an integer >= 1"]),
    ({"seq_len": -4}, InvalidInputError, ["seq_len=-4"]),
    ({"tp_size": 1.5}, InvalidInputError, ["tp_size=1.5", "not a whole number"]),
    ({"pp_size": True}, InvalidInputTypeError, ["pp_size=True", "bools are not counts"]),
    ({"dp_size": float("nan")}, InvalidInputError, ["dp_size=nan"]),
    ({"ep_size": "2"}, InvalidInputTypeError, ["ep_size='2'", "got str"]),
    ({"gradient_accumulation_steps": 0}, InvalidInputError, ["gradient_accumulation_steps=0"]),
    ({"trainable_fraction": 1.5}, InvalidInputError, ["trainable_fraction=1.5", "[0.0, 1.0]"]),
    ({"trainable_fraction": math.inf}, InvalidInputError, ["trainable_fraction=inf"]),
    ({"communication_buffer_fraction": -0.1}, InvalidInputError, ["communication_buffer_fraction=-0.1"]),
    ({"communication_buffer_fraction": False}, InvalidInputTypeError, ["communication_buffer_fraction=False"]),
    ({"zero_stage": 4}, InvalidInputError, ["zero_stage=4", "0, 1, 2 or 3"]),
    ({"zero_stage": True}, InvalidInputTypeError, ["zero_stage=True"]),
    ({"sequence_parallel": 1}, InvalidInputTypeError, ["sequence_parallel=1", "True or False"]),
    ({"pp_size": 5}, LayoutError, ["pp_size=5", "at most the model's 4 layers"]),
    ({"ep_size": 2}, LayoutError, ["ep_size=2", "1 for a dense model"]),
    ({"data_parallel": "zero9"}, InvalidInputError, ["data_parallel='zero9'", "zero0 (", "zero3 ("]),
    ({"data_parallel": "zero1", "zero_stage": 2}, InvalidInputError, ["zero_stage=2", "data_parallel"]),
    ({"sharding_rules": {"xp": "tp"}}, InvalidInputError, ["sharding_rules=", "keys among tp, cp, pp, ep"]),
    ({"sharding_rules": {"tp": "nope"}}, InvalidInputError, ["sharding_rules['tp']='nope'", "tp ("]),
    ({"plugin_options": {"adam": {"x": 1}}}, InvalidInputError, ["plugin_options['adam']", "declares no options"]),
    ({"plugin_options": {"lion": {}}}, InvalidInputError, ["plugin_options='lion'", "not selected"]),
    ({"include_plugins": ["nope"]}, InvalidInputError, ["include_plugins='nope'", "model_states"]),
    ({"profile": "measured-someday"}, InvalidInputError, ["profile='measured-someday'", "reference"]),
])
def test_solve_rejects(solver, kwargs, error, fragments):
    kwargs = dict(kwargs)
    batch = kwargs.pop("batch_size", 8)
    with pytest.raises(error) as info:
        solver.solve(MODEL, GPU, batch, **kwargs)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert info.value.parameter and info.value.allowed


def test_none_checkpointing_needs_heads(solver):
    headless = TransformerWorkload(name="ssm", parameters=1_000_000, layers=4, hidden_dim=64)
    with pytest.raises(InvalidInputError, match="heads=None") as info:
        solver.solve(headless, GPU, 8, activation_checkpointing="none")
    assert info.value.parameter == "activation_checkpointing"
    assert solver.solve(headless, GPU, 8, activation_checkpointing="full").activations > 0


def test_ep_larger_than_experts(solver):
    moe = SparseTransformerWorkload(name="moe", parameters=10**9, active_parameters=10**8, layers=4,
                                    hidden_dim=64, heads=4, experts=8)
    with pytest.raises(LayoutError, match=r"ep_size=16 is not allowed: at most the model's 8 experts"):
        solver.solve(moe, GPU, 8, ep_size=16)


def test_model_and_hardware_types(solver):
    with pytest.raises(InvalidInputTypeError, match="model=42 .*TransformerWorkload"):
        solver.solve(42, GPU, 8)
    with pytest.raises(InvalidInputTypeError, match="hardware=None .*HardwareNode"):
        solver.solve(MODEL, None, 8)
    with pytest.raises(InvalidInputError, match=r"model='llama9' .*one of: .*llama3-8b"):
        solver.solve("llama9", GPU, 8)
    with pytest.raises(InvalidInputError,
                       match=r"hardware='h1000' .*did you mean nvidia/h100-sxm5-80gb, .*mlsysim:h100"):
        solver.solve(MODEL, "h1000", 8)


def test_integral_floats_are_accepted_as_counts(solver):
    assert solver.solve(MODEL, GPU, 8.0, tp_size=2.0).to_json() == solver.solve(MODEL, GPU, 8, tp_size=2).to_json()


@pytest.mark.parametrize("kwargs,fragment", [
    ({"parameters": 0}, "TransformerWorkload.parameters=0"),
    ({"parameters": 1.5e9 + 0.5}, "TransformerWorkload.parameters=1500000000.5"),
    ({"layers": True}, "TransformerWorkload.layers=True"),
    ({"hidden_dim": -1}, "TransformerWorkload.hidden_dim=-1"),
    ({"heads": 4, "kv_heads": 8}, "TransformerWorkload.kv_heads=8"),
    ({"gated_mlp": "yes"}, "TransformerWorkload.gated_mlp='yes'"),
])
def test_workload_validation(kwargs, fragment):
    fields = {"name": "x", "parameters": 10**9, "layers": 2, **kwargs}
    with pytest.raises(InvalidInputError) as info:
        TransformerWorkload(**fields)
    assert fragment in str(info.value)


def test_sparse_and_hardware_validation():
    with pytest.raises(InvalidInputError, match="active_experts_per_token=4 is not allowed: at most experts=2"):
        SparseTransformerWorkload(name="m", parameters=10, active_parameters=5, layers=1, experts=2,
                                  active_experts_per_token=4)
    with pytest.raises(InvalidInputError, match="active_parameters=20 is not allowed: at most parameters=10"):
        SparseTransformerWorkload(name="m", parameters=10, active_parameters=20, layers=1, experts=2)
    with pytest.raises(InvalidInputError, match="HardwareNode.memory_capacity=0"):
        HardwareNode(name="x", memory_capacity=0)


def test_the_seed_constructions_work():
    """The keyword constructions the issue promises."""
    m = TransformerWorkload(name="x", parameters=8_030_000_000, layers=32, hidden_dim=4096, heads=32)
    s = SparseTransformerWorkload(name="m", parameters=46_700_000_000, active_parameters=12_900_000_000,
                                  layers=32, hidden_dim=4096, heads=32, experts=8, active_experts_per_token=2)
    h = HardwareNode(name="H100", memory_capacity=80 * 2**30)
    assert (m.parameters, s.experts, h.memory_capacity) == (8_030_000_000, 8, 85_899_345_920)
    assert not m.is_sparse and s.is_sparse
