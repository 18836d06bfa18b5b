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
    memo.set_enabled(False)
    try:
        plain = solver.solve(model, GPU, **kwargs).to_json()
    finally:
        memo.set_enabled(True)
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


def _every_fast_path(enabled: bool) -> None:
    from mlsysim_core import solver
    from mlsysim_core.measured import _cache
    memo.set_enabled(enabled)
    _cache.ENABLED = solver.FAST_PATHS = enabled


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs(), st.sampled_from(["reference", "measured"]))
def test_every_fast_path_off_gives_byte_identical_results(solver, config, profile):
    """The solver's own caches (checked plans, placements), the plugins' memos and the
    measured profile's term cache, all off at once: not a byte changes, in either profile."""
    from mlsysim_core import MlsysimError
    model, kwargs = config
    if profile == "measured":
        model = TransformerWorkload(name="m", parameters=model.parameters, layers=model.layers, hidden_dim=4096,
                                    heads=32, vocab_size=32000, kv_heads=8, ffn_dim=14336)
        kwargs = {**kwargs, "ep_size": 1, "precision": "bf16", "optimizer": "adamw"}

    def run():
        try:
            return solver.solve(model, GPU, **kwargs, profile=profile).to_json()
        except MlsysimError as err:
            return repr(err)
    fast, again = run(), run()
    _every_fast_path(False)
    try:
        plain = run()
    finally:
        _every_fast_path(True)
    assert fast == again == plain


def test_a_cached_plan_never_hides_a_check(solver):
    """A plan checked once is reused only for the same values of exactly the same types."""
    import pytest
    from mlsysim_core import InvalidInputError
    solver.solve("llama3-8b", "h100", 8, 1024, tp_size=1)
    with pytest.raises(InvalidInputError, match="batch_size"):
        solver.solve("llama3-8b", "h100", True, 1024)               # True == 1, but not a count
    from mlsysim_core.catalog import get_hardware, get_model
    m, h = get_model("llama3-8b"), get_hardware("h100")
    one = solver.solve(m, h, 8, 1024, trainable_fraction=1.0)
    solver.solve(m, h, 8, 1024, trainable_fraction=0.5)
    as_int = solver.solve(m, h, 8, 1024, trainable_fraction=1)       # 1 == 1.0: still checked on its own
    assert as_int.total_memory == one.total_memory
    with pytest.raises(InvalidInputError, match="sequence_parallel"):
        solver.solve(m, h, 8, 1024, tp_size=2, sequence_parallel=1)
    assert solver.solve(m, h, 8.0, 1024).to_json() == solver.solve(m, h, 8, 1024).to_json()


def test_reused_measured_plans_give_byte_identical_results():
    """Measured-grade options checked once are reused for the same checked plan and the same
    option values of the same types; errors are raised every time."""
    import pytest
    from mlsysim_core import MlsysimError, TrainingMemoryModel
    solver = TrainingMemoryModel("measured")
    cases = [dict(), dict(regime="bf16"), dict(attention="eager", optimizer_impl="fused"),
             dict(activation_checkpointing="full", checkpointed_layers=4), dict(runtime_overheads=False),
             dict(dropout=0.1), dict(pipeline_schedule="gpipe"), dict(offload="optimizer"),
             dict(tp_size=2, dp_size=2), dict(activation_checkpointing="full", checkpointed_layers=True)]

    def run(case):
        try:
            return solver.solve("llama3-8b", "h100", 8, 1024, **case).to_json()
        except MlsysimError as err:
            return repr(err)
    fast = [run(c) for c in cases]
    again = [run(c) for c in cases]
    _every_fast_path(False)
    try:
        plain = [run(c) for c in cases]
    finally:
        _every_fast_path(True)
    assert fast == again == plain
    with pytest.raises(MlsysimError, match="checkpointed_layers"):
        solver.solve("llama3-8b", "h100", 8, 1024, checkpointed_layers=4)     # not 'full': checked again


def test_loading_the_plugins_imports_no_measured_module():
    """The measured profile's modules are imported on first use, not when plugins load."""
    import subprocess
    import sys
    code = ("import sys; from mlsysim_core.manager import get_plugin_manager; get_plugin_manager().registry; "
            "print(sorted(m for m in sys.modules if m.startswith('mlsysim_core.measured.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_memo_switch_really_bypasses_the_caches():
    """The byte-identity tests above compare against plain computation only if turning the
    memo off rebinds every memoised function to its uncached self."""
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_plugins import model_states, tensor_parallel
    solver = TrainingMemoryModel()
    memo.set_enabled(False)
    try:
        assert not hasattr(tensor_parallel.effect, "cache_info")
        assert not hasattr(model_states.weight_term, "cache_info")
        solver.solve("llama3-8b", "h100", 8, tp_size=2)
    finally:
        memo.set_enabled(True)
    assert tensor_parallel.effect.cache_info().currsize == 0      # nothing was cached while off
    solver.solve("llama3-8b", "h100", 8, tp_size=2)
    solver.solve("llama3-8b", "h100", 8, tp_size=2)
    assert tensor_parallel.effect.cache_info().currsize >= 1
