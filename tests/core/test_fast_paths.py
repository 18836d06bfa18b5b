"""The one cache (``mlsysim_core.memo``) gives byte-identical results to the plain path.

The solver memoises whole solves and the built-in plugins their terms and effects, all
through ``mlsysim_core.memo``, keyed on every argument and its type. Turning it off
(``memo.set_enabled(False)``, one switch) must not change a byte of any result.
"""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mlsysim_core import HardwareNode, InvalidInputError, MlsysimError, SparseTransformerWorkload, TransformerWorkload
from mlsysim_core import memo

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


def _three_ways(run):
    """(first, again: memoised, plain: with the memo off)."""
    first, again = run(), run()
    memo.set_enabled(False)
    try:
        plain = run()
    finally:
        memo.set_enabled(True)
    return first, again, plain


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs(), st.sampled_from(["reference", "measured"]))
def test_memo_off_gives_byte_identical_results(solver, config, profile):
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
    first, again, plain = _three_ways(run)
    assert first == again == plain


def test_measured_options_memoised_give_byte_identical_results():
    from mlsysim_core import TrainingMemoryModel
    solver = TrainingMemoryModel("measured")
    cases = [dict(), dict(regime="bf16"), dict(attention="eager", optimizer_impl="fused"),
             dict(activation_checkpointing="full", checkpointed_layers=4), dict(runtime_overheads=False),
             dict(dropout=0.1), dict(pipeline_schedule="gpipe"), dict(offload="optimizer"),
             dict(tp_size=2, dp_size=2), dict(activation_checkpointing="full", checkpointed_layers=True),
             dict(regime="fp32", optimizer="adafactor"), dict(regime="amp-bf16", optimizer="sgd-momentum",
                                                              activation_checkpointing="none")]

    def run():
        out = []
        for case in cases:
            try:
                out.append(solver.solve("llama3-8b", "h100", 8, 1024, **case).to_json())
            except MlsysimError as err:
                out.append(repr(err))
        return out
    first, again, plain = _three_ways(run)
    assert first == again == plain
    with pytest.raises(MlsysimError, match="checkpointed_layers"):
        solver.solve("llama3-8b", "h100", 8, 1024, checkpointed_layers=4)     # not 'full': checked again


def test_a_memoised_solve_never_hides_a_check(solver):
    """Equal values of another type are another key: True == 1 but is not a count."""
    solver.solve("llama3-8b", "h100", 1, 1024)
    with pytest.raises(InvalidInputError, match="batch_size"):
        solver.solve("llama3-8b", "h100", True, 1024)
    from mlsysim_core.catalog import get_hardware, get_model
    m, h = get_model("llama3-8b"), get_hardware("h100")
    one = solver.solve(m, h, 8, 1024, trainable_fraction=1.0)
    assert solver.solve(m, h, 8, 1024, trainable_fraction=1).total_memory == one.total_memory
    solver.solve(m, h, 8, 1024, tp_size=2, sequence_parallel=True)
    with pytest.raises(InvalidInputError, match="sequence_parallel"):
        solver.solve(m, h, 8, 1024, tp_size=2, sequence_parallel=1)
    assert solver.solve(m, h, 8.0, 1024).to_json() == solver.solve(m, h, 8, 1024).to_json()
    from mlsysim_core import TrainingMemoryModel
    measured = TrainingMemoryModel("measured")
    measured.solve(m, h, 8, 1024, activation_checkpointing="full", checkpointed_layers=1)
    with pytest.raises(InvalidInputError, match="checkpointed_layers"):
        measured.solve(m, h, 8, 1024, activation_checkpointing="full", checkpointed_layers=True)


def test_unhashable_arguments_are_solved_not_memoised(solver):
    """A dict of options cannot be a key: the call runs, with the same answer."""
    from mlsysim_core import TrainingMemoryModel
    measured = TrainingMemoryModel("measured")
    by_dict = measured.solve("llama3-8b", "h100", 8, 1024, runtime_overheads={"cuda_context": 0})
    again = measured.solve("llama3-8b", "h100", 8, 1024, runtime_overheads={"cuda_context": 0})
    assert by_dict.to_json() == again.to_json() and by_dict is not again


def test_loading_the_plugins_imports_no_measured_physics():
    """The measured profile's physics is imported on first use, not when plugins load."""
    import subprocess
    import sys
    code = ("import sys; from mlsysim_core.manager import get_plugin_manager; get_plugin_manager().registry; "
            "print(sorted(m for m in sys.modules if m.startswith('mlsysim_plugins.measured.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(eval(out))
    physics = {f"mlsysim_plugins.measured.{m}" for m in ("model", "parallel", "lora", "optimizers", "buffers")}
    assert loaded and not loaded & physics, loaded


def test_the_switch_really_bypasses_every_memo(solver):
    from mlsysim_core.memo import _memos
    memo.set_enabled(False)
    try:
        solver.solve("llama3-8b", "h100", 8, tp_size=2)
        assert all(not table for table in _memos)       # nothing was kept while off
    finally:
        memo.set_enabled(True)
    solver.solve("llama3-8b", "h100", 8, tp_size=2)
    assert any(table for table in _memos)
