"""ZeRO++ hpZ's numbers, derived by hand (see README.md), and the conformance kit.

Run with the package installed: ``pip install -e ".[test]" && pytest``.
"""

import pytest

from mlsysim_core import (HardwareNode, InvalidInputError, LayoutError, PluginManager,
                          TrainingMemoryModel, TransformerWorkload)
from mlsysim_core.testing import assert_plugin_conforms
from mlsysim_zeropp_hpz import hpz

NAME = "zeropp.hpz"
P70B = 70_600_000_000            # Llama-3.1-70B parameters
LAYOUT = dict(dp_size=64, activation_checkpointing="full")


@pytest.fixture
def model():
    pm = PluginManager()
    pm.load_entrypoints(third_party=False)
    pm.register(hpz, name="zeropp_hpz")
    return TrainingMemoryModel(plugin_manager=pm)


def _secondary(result):
    return [t for t in result.terms_of("communication_buffers") if t.label.startswith("hpZ")]


def test_zero3_plus_a_secondary_partition_per_node(model):
    r = model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME, **LAYOUT)
    zero3 = model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, zero_stage=3, **LAYOUT)
    # Primary partition: ZeRO-3 over all 64 dp ranks.
    assert r.weights == P70B * 2 / 64 == 2_206_250_000
    assert r.gradients == P70B * 2 / 64
    assert r.optimizer_state == P70B * 12 / 64 == 13_237_500_000
    # Secondary partition: fp16 weights over one node (the H100 entry gives no
    # devices_per_node, so 8).
    [term] = _secondary(r)
    assert term.nbytes == P70B * 2 / 8 == 17_650_000_000
    assert term.source == "zeropp_hpz"
    assert term.phases == ("forward", "backward")
    assert r.total_memory - zero3.total_memory == 17_650_000_000
    for field in ("weights", "gradients", "optimizer_state", "activations"):
        assert getattr(r, field) == getattr(zero3, field), field
    assert r.selected["dp_rule"] == NAME
    assert any("secondary fp16 weight partition over 8 ranks" in n for n in r.constraint_trace)


def test_the_group_comes_from_the_option_or_the_node(model):
    r = model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME,
                    plugin_options={NAME: {"secondary_group": 16}}, **LAYOUT)
    assert [t.nbytes for t in _secondary(r)] == [P70B * 2 / 16]
    node4 = HardwareNode(name="4-GPU node", memory_capacity=80 * 2**30, devices_per_node=4)
    r = model.solve("mlsysim:llama3-70b", node4, 64, 4096, data_parallel=NAME, **LAYOUT)
    assert [t.nbytes for t in _secondary(r)] == [P70B * 2 / 4]
    assert "devices_per_node of 4-GPU node" in _secondary(r)[0].formula


def test_model_parallelism_splits_the_secondary_partition(model):
    r = model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, tp_size=2, pp_size=2, data_parallel=NAME,
                    **LAYOUT)
    assert [t.nbytes for t in _secondary(r)] == [P70B / 4 * 2 / 8]
    assert r.weights == P70B / 4 * 2 / 64


def test_a_group_of_one_is_plain_zero3(model):
    r = model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME,
                    plugin_options={NAME: {"secondary_group": 1}}, **LAYOUT)
    zero3 = model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, zero_stage=3, **LAYOUT)
    assert _secondary(r) == []
    assert r.total_memory == zero3.total_memory


def test_the_papers_100b_illustration(model):
    """100B parameters on 1024 GPUs, secondary groups of 16, Adam (K = 12): ZeRO-3 model
    states (2 + 2 + 12) M / N = 1.5625 GB per GPU; hpZ adds 2 M / 16 = 12.5 GB."""
    w = TransformerWorkload(name="100B", parameters=100_000_000_000, layers=100)
    kw = dict(dp_size=1024, activation_checkpointing="full")
    zero3 = model.solve(w, "mlsysim:h100", 1024, 2048, zero_stage=3, **kw)
    r = model.solve(w, "mlsysim:h100", 1024, 2048, data_parallel=NAME,
                    plugin_options={NAME: {"secondary_group": 16}}, **kw)
    zero3_states = zero3.weights + zero3.gradients + zero3.optimizer_state
    hpz_states = r.weights + r.gradients + r.optimizer_state + sum(t.nbytes for t in _secondary(r))
    assert zero3_states == 1_562_500_000
    assert hpz_states == 14_062_500_000
    assert hpz_states / zero3_states == 9.0                        # about 9x ZeRO-3
    assert round(16 * 100_000_000_000 / hpz_states) == 114         # about 114x below plain DP


@pytest.mark.parametrize("group", [3, 128])
def test_the_group_must_divide_dp(model, group):
    with pytest.raises(LayoutError) as err:
        model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME,
                    plugin_options={NAME: {"secondary_group": group}}, **LAYOUT)
    assert err.value.parameter == f"plugin_options['{NAME}'].secondary_group"
    assert "a divisor of dp_size=64" in str(err.value)


def test_the_default_group_must_divide_dp(model):
    with pytest.raises(LayoutError, match="dp_size=12 is not allowed: a multiple of the hpZ secondary group 8"):
        model.solve("mlsysim:llama3-8b", "mlsysim:h100", 12, dp_size=12, data_parallel=NAME)


def test_the_data_parallel_group_is_dp_times_cp(model):
    """Context-parallel ranks hold the same weights and reduce the same gradients, so the
    primary partition is over dp x cp, as the built-in zero3 shards: dp 32 x cp 2 = 64 ranks."""
    kw = dict(dp_size=32, cp_size=2, activation_checkpointing="full")
    r = model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME, **kw)
    zero3 = model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, zero_stage=3, **kw)
    assert r.weights == r.gradients == P70B * 2 / 64 == zero3.weights       # was P70B * 2 / 32 (dp alone)
    assert r.optimizer_state == P70B * 12 / 64 == zero3.optimizer_state
    assert [t.nbytes for t in _secondary(r)] == [P70B * 2 / 8]
    assert r.total_memory - zero3.total_memory == 17_650_000_000
    assert any("sharded over 64 dp x cp ranks (32 x 2)" in n for n in r.constraint_trace)
    # the group divides dp x cp (16 divides 64 though not dp's 32) ...
    r16 = model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME,
                      plugin_options={NAME: {"secondary_group": 16}}, **kw)
    assert [t.nbytes for t in _secondary(r16)] == [P70B * 2 / 16]
    # ... and a group dp x cp cannot hold is refused naming both
    with pytest.raises(LayoutError) as err:
        model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME,
                    plugin_options={NAME: {"secondary_group": 128}}, **kw)
    assert err.value.parameter == f"plugin_options['{NAME}'].secondary_group"
    assert "a divisor of dp_size=32 x cp_size=2 = 64 (so at most 64)" in str(err.value)
    with pytest.raises(LayoutError, match=r"dp_size=3 is not allowed: dp x cp \(3 x 2 = 6\) a multiple of the hpZ "
                                          r"secondary group 8"):
        model.solve("mlsysim:llama3-8b", "mlsysim:h100", 12, dp_size=3, cp_size=2, data_parallel=NAME)


@pytest.mark.parametrize("bad", [0, True, 2.5, "eight"])
def test_bad_options_are_rejected(model, bad):
    with pytest.raises(InvalidInputError):
        model.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME,
                    plugin_options={NAME: {"secondary_group": bad}}, **LAYOUT)


# --- measured grade (FSDP2 reshard_after_forward=<group>, measured in PyTorch: validation/examples/) --

# One Llama-3.1-70B layer: q, o (8192 x 8192), k, v (8192 x 1024), gate, up, down (8192 x 28,672), 2 norms.
LAYER_70B = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28_672 + 2 * 8192


@pytest.fixture
def measured(model):
    return TrainingMemoryModel("measured", plugin_manager=model.plugin_manager)


@pytest.mark.parametrize("regime, precision, gathered", [("fp32", "fp32", 4), ("amp-bf16", "bf16", 4),
                                                         ("mixed-bf16", "bf16", 2), ("bf16", "bf16", 2)])
def test_measured_grade_every_layers_secondary_shard(measured, regime, precision, gathered):
    kw = dict(regime=regime, precision=precision, runtime_overheads=False, **LAYOUT)   # (the allocator's 5 %
    # of the peak would grow with it)
    r = measured.solve("llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME, **kw)
    zero3 = measured.solve("llama3-70b", "mlsysim:h100", 64, 4096, zero_stage=3, **kw)
    [term] = _secondary(r)
    assert LAYER_70B == 855_654_400
    assert term.nbytes == 80 * LAYER_70B / 8 * gathered          # the gathered dtype, not the precision
    assert term.phases == ("forward", "backward")
    extra = {phase: r.phase_totals[phase] - zero3.phase_totals[phase] for phase in r.phase_totals}
    assert extra == {"forward": term.nbytes, "backward": term.nbytes, "backward_end": 0, "optimizer_step": 0}


def test_measured_grade_pipeline_stages_hold_their_own_layers(measured):
    r = measured.solve("llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME, pp_size=4,
                       regime="fp32", precision="fp32", **LAYOUT)
    for rank in r.ranks:
        [term] = [t for t in rank.terms if t.label.startswith("hpZ")]
        assert term.nbytes == 20 * LAYER_70B / 8 * 4


def test_measured_grade_over_dp_times_cp(measured):
    kw = dict(dp_size=32, cp_size=2, regime="fp32", precision="fp32", runtime_overheads=False,
              activation_checkpointing="full")
    r = measured.solve("llama3-70b", "mlsysim:h100", 64, 4096, data_parallel=NAME, **kw)
    zero3 = measured.solve("llama3-70b", "mlsysim:h100", 64, 4096, zero_stage=3, **kw)
    assert (r.weights, r.gradients, r.optimizer_state) == (zero3.weights, zero3.gradients, zero3.optimizer_state)
    [term] = _secondary(r)
    assert term.nbytes == 80 * LAYER_70B / 8 * 4
    extra = {phase: r.phase_totals[phase] - zero3.phase_totals[phase] for phase in r.phase_totals}
    assert extra == {"forward": term.nbytes, "backward": term.nbytes, "backward_end": 0, "optimizer_step": 0}


@pytest.mark.parametrize("options", [{}, {NAME: {"secondary_group": 4}}])
def test_the_installed_plugin_conforms(options):
    report = assert_plugin_conforms("zeropp_hpz", options=options)
    assert [name for names in report.provides.values() for name in names] == [NAME]
    assert report.source == "mlsysim-zeropp-hpz 0.1.0"
