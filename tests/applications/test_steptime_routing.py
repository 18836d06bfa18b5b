"""Issue 27: a routed layer's token permutation as memory-bound traffic (steptime.routing_copies: Megatron-Core's
permute / unpermute, Transformer Engine's fused kernels; each kernel's input and output once). By hand."""

import pytest

from mlsysim_core import SparseTransformerWorkload
from mlsysim_plugins import steptime

HW = {"flops": 1e15, "fp8": 2e15, "intra": 400e9, "inter": 50e9, "memory": 2e12, "sms": None, "clock": 1.0}
MOE = SparseTransformerWorkload(name="m", parameters=2_000_000_000, active_parameters=500_000_000, layers=8,
                                hidden_dim=2048, heads=16, vocab_size=32000, ffn_dim=1024, gated_mlp=True, experts=32,
                                active_experts_per_token=2)
RUN = dict(cp=1, pp=1, dp=8, ep=8, rule="zero1", mb=2, gas=1, seq_len=4096, bytes_=2, node=8, optimizer_bytes=16.0)


def test_permute_and_unpermute_copy_each_token_once_per_expert():
    # k = 2: forward [T, h] -> [2T, h] and [2T, h] -> [T, h]: 6 elements a token and hidden unit; backward
    # [T, h] + [2T, h] -> [2T, h] and [2T, h] -> [T, h]: 8
    assert steptime.routing_copies(2) == (6, 8)
    assert steptime.routing_copies(8) == (18, 26)


@pytest.mark.parametrize("tp, sp, r", [(1, False, 0.0), (1, False, 1.0), (2, True, 0.0), (2, False, 0.0)])
def test_the_memory_term_pays_them_per_layer_pass(tp, sp, r):
    fig = steptime.model_figures(MOE)
    routed = steptime.step_time(fig, HW, steptime.DEFAULT, tp=tp, sp=sp, recompute=r, **RUN)
    unrouted = steptime.step_time(dict(fig, experts=1), HW, steptime.DEFAULT, tp=tp, sp=sp, recompute=r, **RUN)
    tokens = 2 * 4096 / (tp if sp else 1)      # a micro-batch's tokens a rank permutes (split by tp under SP)
    # 8 layers x 2048 wide x 2 B: forward 6 x (1 + r) (a full recompute permutes again), backward 8
    expected = tokens * 2048 * 2 * 8 * (6 * (1 + r) + 8) / (steptime.DEFAULT.memory * 2e12)
    assert routed["memory"] - unrouted["memory"] == pytest.approx(expected, rel=1e-9)
