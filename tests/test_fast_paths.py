"""Fast paths give byte-identical results to the plain path.

The built-in plugins memoise their terms and effects on exactly the numbers they read
(mlsysim_plugins._memo); the solver caches per-registry lookups. Turning every cache off
must not change a byte of any result.
"""

from hypothesis import HealthCheck, given, settings, strategies as st

import mlsysim_plugins._memo as memo
from mlsysim_core import HardwareNode, SparseTransformerWorkload, TransformerWorkload

GPU = HardwareNode(name="gpu", memory_capacity=80 * 2**30)


@st.composite
def configs(draw):
    sparse = draw(st.booleans())
    common = dict(name="m", parameters=draw(st.integers(10**6, 10**12)), layers=draw(st.integers(8, 96)),
                  hidden_dim=draw(st.sampled_from([None, 512, 4096])), heads=draw(st.sampled_from([8, 32])))
    model = (SparseTransformerWorkload(**common, active_parameters=common["parameters"] // 4, experts=8)
             if sparse else TransformerWorkload(**common))
    return model, dict(
        batch_size=draw(st.integers(1, 512)), seq_len=draw(st.sampled_from([128, 2048, 8192])),
        precision=draw(st.sampled_from(["fp32", "bf16", "int4"])),
        optimizer=draw(st.sampled_from(["adam", "adamw", "sgd", "none"])),
        activation_checkpointing=draw(st.sampled_from(["none", "selective", "full"])),
        tp_size=draw(st.sampled_from([1, 2, 8])), pp_size=draw(st.sampled_from([1, 2, 8])),
        dp_size=draw(st.sampled_from([1, 4, 64])), ep_size=draw(st.sampled_from([1, 2, 8])) if sparse else 1,
        zero_stage=draw(st.sampled_from([0, 1, 2, 3])),
        trainable_fraction=draw(st.sampled_from([1.0, 0.3])),
        sequence_parallel=draw(st.booleans()))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs())
def test_memoised_and_plain_results_are_byte_identical(solver, config):
    model, kwargs = config
    cached_first = solver.solve(model, GPU, **kwargs).to_json()
    cached_again = solver.solve(model, GPU, **kwargs).to_json()
    memo.ENABLED = False
    try:
        plain = solver.solve(model, GPU, **kwargs).to_json()
    finally:
        memo.ENABLED = True
    assert cached_first == cached_again == plain


def test_measured_profile_cache_gives_byte_identical_results():
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.measured import _cache
    solver = TrainingMemoryModel("measured")
    cases = [dict(batch_size=b, seq_len=s, activation_checkpointing=c, regime=r, optimizer=o)
             for b, s in ((1, 512), (8, 2048)) for c in ("none", "full") for r in ("fp32", "amp-bf16", "bf16")
             for o in ("adamw", "adafactor", "sgd-momentum")]
    cached = [solver.solve("llama3-8b", "h100", **c).to_json() for c in cases]
    cached_again = [solver.solve("llama3-8b", "h100", **c).to_json() for c in cases]
    _cache.ENABLED = False
    try:
        plain = [solver.solve("llama3-8b", "h100", **c).to_json() for c in cases]
    finally:
        _cache.ENABLED = True
    assert cached == cached_again == plain
