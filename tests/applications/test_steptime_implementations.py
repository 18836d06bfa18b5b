"""Implementation choices a sharding rule declares for the step time (issue 27): the ring
attention's (context_parallel.ContextParallelOptions.ring: PyTorch's, Transformer Engine's P2P
ring), each timed by hand from its declarations; the memory the same either way."""

import attrs
import pytest

from mlsysim_core import InvalidInputError, TrainingMemoryModel, TransformerWorkload
from mlsysim_core.search import time_plan
from mlsysim_plugins import context_parallel, steptime
from mlsysim_plugins.steptime_hookspecs import collectives, traffic

CAL = attrs.evolve(steptime.DEFAULT, intra_link=0.5, inter_link=0.8, latency=0.0, hop_intra=0.0, hop_inter=0.0,
                   hop_tree_intra=0.0, nvls_latency=0.0)
HW = {"flops": 1e15, "intra": 400e9, "inter": 50e9, "memory": 3e12}
FIG = steptime.model_figures(TransformerWorkload(name="t", parameters=1_000_000_000, layers=8, hidden_dim=2048,
                                                 heads=16, vocab_size=32000, ffn_dim=8192, gated_mlp=True))
RUN = dict(tp=1, cp=4, pp=1, dp=1, ep=1, rule="zero0", recompute=0.0, sp=False, mb=1, gas=1, seq_len=8192,
           bytes_=2, node=8, optimizer_bytes=36.0)
TE = context_parallel.ContextParallelOptions(ring="transformer-engine")


def _rules(options=None):
    axes, _ = steptime.declarations(options=options)
    return axes


def test_the_default_ring_is_pytorchs():
    spec = context_parallel.mlsysim_sharding_rules()[0]
    assert collectives(spec) == context_parallel.RING and traffic(spec) == context_parallel.TRAFFIC
    assert collectives(spec, TE) == context_parallel.TE_RING and traffic(spec, TE) == context_parallel.TE_TRAFFIC
    assert _rules()["cp"] == context_parallel.RING
    assert _rules({"cp": TE})["cp"] == context_parallel.TE_RING


def test_transformer_engines_p2p_ring_by_hand():
    # T = 8192 / 4 tokens per rank; each step computes 1/4 of the layer's attention
    te = steptime.step_time(FIG, HW, CAL, rules=_rules({"cp": TE}), **RUN)
    T, hq, hkv, n = 2048, FIG["h_q"], FIG["h_kv"], 4
    attn_pass = 2 * T * 8192 * hq / (CAL.attention * 1e15)
    fstep, bstep = attn_pass / n, attn_pass * 2.5 / CAL.attention_backward / n
    send = T * 2 * hkv * 2 / (400e9 * 0.5)              # one bf16 K/V (or dK/dV) buffer to the next rank
    comm = ((n - 1) * steptime.hidden(send, fstep, CAL)               # forward: n - 1 K/V sends, one per step
            + 2 * (n - 1) * steptime.hidden(send, bstep, CAL))        # backward: n - 1 K/V and n - 1 dK/dV sends
    q, kv = T * hq, T * 2 * hkv
    bytes_ = (n - 1) * 6 * q + 8 * q + 4 * kv + (n - 1) * (6 * q + 6 * kv) + 4 * q + 8 * kv
    kernels = (n - 1) * 3 + 6 + (n - 1) * 5 + 3
    assert te["cp"] == pytest.approx(FIG["layers"] * (comm + bytes_ / (CAL.memory * 3e12)
                                                      + kernels * CAL.kernel_overhead))
    # no send is waited for after the loop: a ring whose sends outlast no step exposes only their SM share
    pytorch = steptime.step_time(FIG, HW, CAL, rules=_rules(), **RUN)
    assert te["cp"] < pytorch["cp"]
    assert {k: v for k, v in te.items() if k not in ("cp", "step")} == \
        {k: v for k, v in pytorch.items() if k not in ("cp", "step")}


def test_the_ring_is_a_time_choice_the_memory_does_not_see():
    solver = TrainingMemoryModel("measured")
    run = dict(batch_size=2, seq_len=8192, precision="bf16", optimizer="adamw", activation_checkpointing="full",
               cp_size=2, dp_size=1, tp_size=1, pp_size=1, data_parallel="zero1")
    default = solver.solve("llama3-8b", "h100", **run)
    te = solver.solve("llama3-8b", "h100", plugin_options={"cp": {"ring": "transformer-engine"}}, **run)
    assert te.total_memory == default.total_memory
    with pytest.raises(InvalidInputError, match=r"plugin_options\['cp'\]"):
        solver.solve("llama3-8b", "h100", plugin_options={"cp": {"ring": "nccl"}}, **run)


def test_time_plan_times_the_ring_the_run_chooses():
    run = dict(global_batch=4, seq_len=65536, tp=1, cp=2, pp=1, dp=4, data_parallel="fsdp", checkpointing="full",
               microbatch=1, precision="bf16", optimizer="adamw", profile="measured", memory=False)
    default = time_plan("llama3-8b", "h100", **run)
    te = time_plan("llama3-8b", "h100", plugin_options={"cp": {"ring": "transformer-engine"}}, **run)
    pytorch = time_plan("llama3-8b", "h100", plugin_options={"cp": {"ring": "pytorch"}}, **run)
    assert pytorch["components"] == default["components"]
    assert te["components"]["cp"] < default["components"]["cp"]
    assert {k: v for k, v in te["components"].items() if k not in ("cp", "step")} == \
        {k: v for k, v in default["components"].items() if k not in ("cp", "step")}
