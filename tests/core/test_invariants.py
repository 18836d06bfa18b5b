"""Properties that hold for every input (hypothesis)."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mlsysim_core import HardwareNode, SparseTransformerWorkload, TransformerWorkload, TrainingMemoryModel
from mlsysim_core.manager import PluginManager

COMPONENTS = ("weights", "gradients", "optimizer_state", "activations", "communication_buffers")
powers = st.sampled_from([1, 2, 4, 8])


@st.composite
def configs(draw):
    layers = draw(st.integers(1, 96))
    heads = draw(st.sampled_from([1, 8, 32, 64]))
    sparse = draw(st.booleans())
    common = dict(name="m", parameters=draw(st.integers(10**6, 10**12)), layers=layers,
                  hidden_dim=heads * draw(st.sampled_from([64, 128])), heads=heads)
    if sparse:
        experts = draw(st.sampled_from([8, 16, 64]))
        model = SparseTransformerWorkload(**common, active_parameters=common["parameters"] // 4,
                                          experts=experts, active_experts_per_token=2)
    else:
        model = TransformerWorkload(**common)
    pp = draw(powers.filter(lambda p: p <= layers))
    kwargs = dict(
        batch_size=draw(st.integers(1, 4096)), seq_len=draw(st.sampled_from([128, 1024, 4096, 32768])),
        precision=draw(st.sampled_from(["fp32", "bf16", "fp16", "fp8", "int4"])),
        optimizer=draw(st.sampled_from(["adam", "adamw", "sgd", "none"])),
        tp_size=draw(powers), pp_size=pp, dp_size=draw(powers),
        ep_size=draw(powers) if sparse else 1,
        gradient_accumulation_steps=draw(powers),
        trainable_fraction=draw(st.floats(0.0, 1.0)),
        communication_buffer_fraction=draw(st.floats(0.0, 1.0)),
        sequence_parallel=draw(st.booleans()))
    return model, kwargs


GPU = HardwareNode(name="gpu", memory_capacity=80 * 2**30)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(configs(), st.sampled_from(["none", "selective", "full"]), st.sampled_from([0, 1, 2, 3]))
def test_components_sum_to_total_and_utilization(solver, config, ckpt, zero):
    model, kwargs = config
    r = solver.solve(model, GPU, activation_checkpointing=ckpt, zero_stage=zero, **kwargs)
    parts = sum(getattr(r, c) for c in COMPONENTS)
    assert abs(parts - r.total_memory) <= 1e-12 * r.total_memory
    assert r.memory_utilization == (r.total_memory * 1e-9) / (r.available_memory * 1e-9)
    assert r.feasible == (r.total_memory * 1e-9 <= r.available_memory * 1e-9)
    assert all(t.nbytes >= 0 for t in r.terms)


@FAST
@given(configs(), st.sampled_from(["none", "selective", "full"]))
def test_higher_zero_stage_never_increases_memory(solver, config, ckpt):
    model, kwargs = config
    totals = [solver.solve(model, GPU, activation_checkpointing=ckpt, zero_stage=z, **kwargs).total_memory
              for z in range(4)]
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in zip(totals, totals[1:])), totals


@FAST
@given(configs(), st.sampled_from([0, 1, 2, 3]))
def test_full_le_selective_le_none(solver, config, zero):
    model, kwargs = config
    acts = [solver.solve(model, GPU, activation_checkpointing=c, zero_stage=zero, **kwargs).activations
            for c in ("full", "selective", "none")]
    assert acts[0] <= acts[1] <= acts[2], acts


def _builtin_modules(builtin_pm):
    return [(name, builtin_pm.get_plugin(name)) for name in sorted(builtin_pm.registry.plugins)]


@pytest.mark.long     # seconds of whole fits/searches/ladders: `pytest --long`, .ci/run
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs(), st.randoms(use_true_random=False))
def test_results_independent_of_registration_order(builtin_pm, config, rnd):
    model, kwargs = config
    modules = _builtin_modules(builtin_pm)
    outputs = set()
    for order in (modules, modules[::-1], rnd.sample(modules, len(modules))):
        pm = PluginManager()
        for name, module in order:
            pm.register(module, name=name, info=builtin_pm.info(name))
        outputs.add(TrainingMemoryModel(plugin_manager=pm).solve(model, GPU, **kwargs).to_json())
    assert len(outputs) == 1
