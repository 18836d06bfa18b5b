"""The data-parallel collectives' bytes per element, as the run's regime declares them (issue 27): the
parameters all-gathered in the regime's gather dtype, the gradients reduced in its reduce dtype; the
reference profile (no regime) keeps the precision's bytes."""

import attrs
import pytest

from mlsysim_core import TrainingMemoryModel, hookimpl
from mlsysim_core.manager import PluginManager
from mlsysim_core.search import time_plan
from mlsysim_plugins import steptime
from mlsysim_plugins.measured.regimes import REGIMES
from mlsysim_plugins.steptime_hookspecs import collectives

CAL = attrs.evolve(steptime.DEFAULT, overlap_sm_share=0.0, intra_link=0.5, latency=0.0, hop_intra=0.0,
                   hop_inter=0.0, hop_tree_intra=0.0, nvls_latency=0.0)


@pytest.mark.parametrize("name, gathered, reduced", [
    ("fsdp-bf16", 2, 4),               # FSDP2 param_dtype bf16, reduce_dtype fp32 (torchtitan)
    ("amp-bf16", 4, 4),                # autocast: the fp32 parameters gathered, fp32 gradients reduced
    ("bf16", 2, 2), ("mixed-bf16", 2, 2), ("fp32", 4, 4),
    ("mixed-bf16-main-grad", 2, 4),    # Megatron's grad_reduce_in_fp32: the fp32 main grads reduced
])
def test_each_regime_declares_its_collective_bytes(name, gathered, reduced):
    assert REGIMES[name].collective_bytes() == {"parameters": gathered, "gradients": reduced}


def test_all_gathers_move_parameters_and_reductions_gradients(solver):
    """Every built-in data-parallel rule declares its all-gathers as parameters and its reductions as
    gradients: timed by hand with 1e9 local parameters gathered in 2 B and reduced in 4 B over 4 ranks at
    1 GB/s (a gather 1.5 s, a reduce-scatter 3 s, an all-reduce 6 s; forward 1 s, backward 2 s, 3
    micro-batches, 10 layers)."""
    rules = solver.registry.sharding_rules
    for name in ("zero0", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "hsdp", "mcore-distopt", "mcore-ddp"):
        for c in collectives(rules[name]):
            assert c.volume == ("parameters" if c.kind == "all-gather" else "gradients"), (name, c)

    def dp(name):
        size = dict(groups={"dp": (4, 1), "dp-node": (4, 1), "dp-across": (1, 4)},
                    volumes={"gradients": (1e9, 4), "parameters": (1e9, 2)}, node=8,
                    hw={"intra": 2e9, "inter": 50e9}, cal=CAL, sp=False)
        return steptime._data_parallel(collectives(rules[name]), 3, 10, {"forward": 1.0, "backward": 2.0}, size)
    gather, reduce = 3 / 4 * 2e9 / 1e9, 3 / 4 * 4e9 / 1e9
    assert dp("zero0") == pytest.approx(2 * reduce - 2.0)
    assert dp("zero1") == pytest.approx((reduce - 2.0) + (gather - 1.0))
    assert dp("zero2") == pytest.approx(3 * (reduce - 2.0) + (gather - 1.0))
    assert dp("fsdp") == pytest.approx(3 * ((gather - 1.0) + (gather + reduce - 2.0) + gather / 10))
    assert dp("fsdp-grad-op") == pytest.approx(3 * ((gather - 1.0) + (reduce - 2.0) + gather / 10))


def _run(**kw):
    return time_plan("llama3-8b", "h100", global_batch=64, seq_len=4096, tp=1, cp=1, pp=1, dp=64, microbatch=1,
                     checkpointing="full", precision="bf16", optimizer="adamw", memory=False, **kw)


def test_the_step_time_reads_the_regime():
    """FSDP over 64 ranks (8 nodes): the reference profile and the measured profile's pure bf16 regime both
    move 2 B per element, the same data-parallel time; fsdp-bf16 reduces in 4 B (slower); amp-bf16 also
    gathers in 4 B (slower still). A regime's bytes are what a run's timing assumes."""
    reference = _run(profile="reference", data_parallel="fsdp")
    pure = _run(profile="measured", regime="bf16", data_parallel="fsdp")
    torchtitan = _run(profile="measured", regime="fsdp-bf16", data_parallel="fsdp")
    autocast = _run(profile="measured", data_parallel="fsdp")
    assert reference["components"]["dp"] == pure["components"]["dp"]
    assert pure["components"]["dp"] < torchtitan["components"]["dp"] < autocast["components"]["dp"]
    assert not any(k.startswith("data_parallel_bytes") for k in reference["assumptions"])
    assert torchtitan["assumptions"]["data_parallel_bytes.gradients"] == 4
    assert torchtitan["assumptions"]["data_parallel_bytes.parameters"] == 2


def test_a_registered_regime_is_read_by_what_it_declares():
    """A regime a third party registers under another name, with fsdp-bf16's bytes, is timed as fsdp-bf16;
    the same with its gradients declared reduced in 2 B, as the pure bf16 regime."""
    class Regimes:
        @hookimpl
        def mlsysim_measured_regimes(self):
            return [attrs.evolve(REGIMES["fsdp-bf16"], name="test.fsdp-fp32-reduce"),
                    attrs.evolve(REGIMES["fsdp-bf16"], name="test.fsdp-bf16-reduce", reduce=2)]
    pm = PluginManager.from_environment()
    pm.register(Regimes(), name="test_regimes")
    solver = TrainingMemoryModel("measured", plugin_manager=pm)
    same = _run(profile="measured", regime="test.fsdp-fp32-reduce", data_parallel="fsdp", solver=solver)
    pure = _run(profile="measured", regime="test.fsdp-bf16-reduce", data_parallel="fsdp", solver=solver)
    assert same["components"]["dp"] == _run(profile="measured", regime="fsdp-bf16", data_parallel="fsdp")["components"]["dp"]
    assert pure["components"]["dp"] == _run(profile="measured", regime="bf16", data_parallel="fsdp")["components"]["dp"]
