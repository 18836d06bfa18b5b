"""Issue 27: the expert parameters' data-parallel collectives run over their expert-data-parallel group (the d / ep
ranks that hold the same experts, ep x tp ranks apart), the dense ones over dp x cp (plugins/mlsysim_plugins/
steptime.py's _seconds; Megatron-Core's DistributedDataParallel: expert buffers over intra_expt_dp_group). By hand."""

import attrs
import pytest

from mlsysim_core import SparseTransformerWorkload, TransformerWorkload
from mlsysim_plugins import steptime
from mlsysim_plugins.steptime_hookspecs import Collective

CAL = attrs.evolve(steptime.DEFAULT, latency=0.0, hop_intra=0.0, hop_inter=0.0, hop_tree_intra=0.0, nvls_latency=0.0)
HW = {"flops": 1e15, "fp8": 2e15, "intra": 400e9, "inter": 50e9, "memory": 3e12, "sms": None, "clock": 1.0}
# one reduce-scatter of the gradients a step, on the critical path: its seconds are the dp component
RULE = (Collective(kind="reduce-scatter", volume="gradients", group="dp", per="step", backward=1),)
RUN = dict(tp=1, cp=1, pp=1, dp=16, rule=RULE, recompute=0.0, sp=False, mb=1, gas=1, seq_len=4096, bytes_=2, node=8,
           optimizer_bytes=16.0)
MOE = SparseTransformerWorkload(name="m", parameters=2_000_000_000, active_parameters=500_000_000, layers=8,
                                hidden_dim=2048, heads=16, vocab_size=32000, ffn_dim=1024, gated_mlp=True, experts=32,
                                active_experts_per_token=2)
INTRA, INTER = 400e9 * CAL.intra_link, 50e9 * CAL.inter_link     # 300e9 and 40e9 B/s


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    fig = steptime.model_figures(MOE)
    experts = 8 * 32 * 3 * 2048 * 1024          # layers x experts x 3 matrices x hidden x ffn
    assert fig["expert_params"] == experts == 1_610_612_736
    dense, local_experts = 2_000_000_000 - experts, experts / 8
    parts = steptime.step_time(fig, HW, CAL, ep=8, **RUN)
    # dense: 16 ranks, 8 a node: min(NVLink 300e9, 8 rails x 40e9) = 300e9, (n-1)/n of the bf16 shard;
    # experts: the 16 / 8 = 2 ranks holding the same experts, 8 apart (one a node): one rail, 40e9
    assert parts["dp"] == pytest.approx(15 / 16 * dense * 2 / INTRA + 1 / 2 * local_experts * 2 / INTER, rel=1e-12)
    # the optimizer steps its dense shard of 16 and its experts' shard of 2
    assert parts["optimizer"] == pytest.approx((dense / 16 + local_experts / 2) * 16 / (CAL.memory * 3e12), rel=1e-12)


def test_without_expert_parallelism_every_parameter_shares_one_group():
    fig = steptime.model_figures(MOE)
    parts = steptime.step_time(fig, HW, CAL, ep=1, **RUN)
    assert parts["dp"] == pytest.approx(15 / 16 * 2_000_000_000 * 2 / INTRA, rel=1e-12)
    # every replica an expert-data-parallel group of one (ep = dp x cp): the experts are not reduced at all
    every = steptime.step_time(fig, HW, CAL, ep=16, **RUN)
    assert every["dp"] == pytest.approx(15 / 16 * 389_387_264 * 2 / INTRA, rel=1e-12)


def test_a_dense_model_is_timed_as_before():
    fig = steptime.model_figures(TransformerWorkload(name="t", parameters=1_000_000_000, layers=8, hidden_dim=2048,
                                                     heads=16, vocab_size=32000, ffn_dim=8192, gated_mlp=True))
    parts = steptime.step_time(fig, HW, CAL, ep=1, **RUN)
    assert parts["dp"] == pytest.approx(15 / 16 * 1_000_000_000 * 2 / INTRA, rel=1e-12)
