"""Routing imbalance for dropless MoE under expert parallelism (measured profile option
``moe_routing_imbalance``, plugins/mlsysim_plugins/measured/routing.py)."""

import math

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError
from mlsysim_plugins.measured.routing import expected_max_standard_normal, uniform_imbalance

from clitools import run as run_cli

SOLVE = dict(profile="measured", dp_size=8, ep_size=8, precision="bf16", activation_checkpointing="none",
             runtime_overheads=False)


def test_expected_maximum_of_standard_normals_matches_closed_forms():
    assert expected_max_standard_normal(1) == 0.0
    assert expected_max_standard_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)       # 0.5642
    assert expected_max_standard_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-9)     # 0.8463
    assert expected_max_standard_normal(8) == pytest.approx(1.4236003, abs=1e-6)   # tabulated (Harter 1961)


def test_uniform_routing_by_hand():
    # T = 4096 tokens per rank, top-2 of 8 experts, ep = 8: a rank's load has mean T k = 8192 and
    # variance T k (1 - 1/8) (8 - 2)/(8 - 1) = 8192 x 7/8 x 6/7 = 6144; the busiest of 8 ranks:
    # 8192 + sqrt(6144) x 1.4236003 = 8303.59, i.e. 1.0136215 x the mean.
    assert uniform_imbalance(4096, 2, 8, 8) == pytest.approx(1 + math.sqrt(6144) * 1.4236003 / 8192, rel=1e-7)
    assert uniform_imbalance(4096, 2, 8, 1) == 1.0        # one rank holds every expert


def _experts_part(result):
    terms = [t for t in result.ranks[0].terms if t.label == "decoder layers: saved for backward"]
    return terms[0].nbytes


def test_the_busiest_rank_carries_the_factor_on_its_experts_activations_and_receive_buffer():
    m = TrainingMemoryModel()
    base = m.solve("mixtral-8x7b", "h100", 8, 4096, **SOLVE)
    skew = m.solve("mixtral-8x7b", "h100", 8, 4096, moe_routing_imbalance=1.5, **SOLVE)
    # amp-bf16: the grouped-mm experts run in fp32: 4 B x top-2 x (2h + 4f) = 4 x 2 x (8192 + 57344)
    # = 524,288 B per token; T = 4096, 32 layers: x 0.5 more on the busiest rank.
    assert _experts_part(skew) - _experts_part(base) == pytest.approx(0.5 * 524_288 * 4096 * 32)
    # all-to-all: (1 + 1.5) instead of 2 x T x k x h x 2 B (bf16 compute)
    assert skew.communication_buffers - base.communication_buffers == pytest.approx(0.5 * 4096 * 2 * 4096 * 2)
    assert any("routing imbalance: the busiest expert-parallel rank computes 1.5000 x" in n for n in skew.notes)
    uniform = m.solve("mixtral-8x7b", "h100", 8, 4096, moe_routing_imbalance="uniform", **SOLVE)
    f = uniform_imbalance(4096, 2, 8, 8)
    assert _experts_part(uniform) - _experts_part(base) == pytest.approx((f - 1) * 524_288 * 4096 * 32)


def test_without_expert_parallelism_it_changes_nothing_and_says_so():
    m = TrainingMemoryModel()
    kw = dict(SOLVE, ep_size=1)
    base = m.solve("mixtral-8x7b", "h100", 8, 4096, **kw)
    skew = m.solve("mixtral-8x7b", "h100", 8, 4096, moe_routing_imbalance=2, **kw)
    assert skew.total_memory == base.total_memory
    assert any("changes nothing without expert parallelism" in n for n in skew.notes)


@pytest.mark.parametrize("model,value,extra,error,fragment", [
    ("llama3-8b", 1.5, {}, InvalidInputError, "None for a dense model"),
    ("mixtral-8x7b", 1.5, {"moe_capacity_factor": 1.25}, InvalidInputError, "None with moe_capacity_factor"),
    ("mixtral-8x7b", 0.5, {}, InvalidInputError, "moe_routing_imbalance=0.5"),
    ("mixtral-8x7b", "skewed", {}, InvalidInputError, "or 'uniform'"),
    ("mixtral-8x7b", True, {}, InvalidInputTypeError, "moe_routing_imbalance=True"),
])
def test_bad_values_are_refused_by_name(model, value, extra, error, fragment):
    with pytest.raises(error, match="moe_routing_imbalance") as info:
        TrainingMemoryModel().solve(model, "h100", 8, 4096, moe_routing_imbalance=value, **SOLVE, **extra)
    assert fragment in str(info.value)


def test_the_cli_flag():
    code, out = run_cli("estimate", "-m", "mixtral-8x7b", "--hardware", "h100", "-b", "8", "-s", "4096",
                        "--profile", "measured", "--dp", "8", "--ep", "8", "--moe-routing-imbalance", "uniform")
    assert code == 0, out
    assert "routing imbalance: the busiest expert-parallel rank computes 1.0136 x" in out
