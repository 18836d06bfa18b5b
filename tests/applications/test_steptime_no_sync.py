"""The step time under FSDP's accumulation without communication (issue 27 item 1, declared): the fsdp and
hsdp rules' ``gradient_sync="no_sync"`` (FSDP1's ``no_sync()``) and ``"step"`` (FSDP2's
``set_requires_gradient_sync(False)``) declare their reduce-scatter once per step, in the last micro-batch's
backward (``Collective.last_micro_batch``); the all-gathers stay per micro-batch (FULL_SHARD and HYBRID_SHARD
free their parameters after every backward: torch 2.13's _should_free_in_backward, FSDP2's
reshard_after_backward). A run without accumulation is timed as under ``"micro-batch"``, to the bit."""

import attrs
import pytest

from mlsysim_core.search import time_plan
from mlsysim_plugins import steptime
from mlsysim_plugins.steptime_hookspecs import collectives

CAL = attrs.evolve(steptime.DEFAULT, overlap_sm_share=0.0, intra_link=0.5, latency=0.0, hop_intra=0.0,
                   hop_inter=0.0, hop_tree_intra=0.0, nvls_latency=0.0)
SYNCS = ("micro-batch", "no_sync", "step")


def _declared(solver, name, how):
    rule = solver.registry.sharding_rules[name]
    return collectives(rule, rule.options_type(gradient_sync=how))


@pytest.mark.parametrize("name", ["fsdp", "hsdp"])
def test_the_reduce_scatter_is_declared_once_a_step_the_gathers_each_micro_batch(solver, name):
    default = _declared(solver, name, "micro-batch")
    assert default == collectives(solver.registry.sharding_rules[name])
    for how in ("no_sync", "step"):
        declared = _declared(solver, name, how)
        assert [(c.kind, c.per, c.last_micro_batch) for c in declared] == [
            (c.kind, "step" if c.kind == "reduce-scatter" else c.per, c.kind == "reduce-scatter") for c in default]
        # what it moves is unchanged: the gradients in the regime's reduce dtype (FSDP1 casts the accumulated
        # param_dtype gradient to reduce_dtype before its reduce-scatter; FSDP2 accumulates in reduce_dtype)
        assert [attrs.evolve(c, per="micro-batch", last_micro_batch=False) if c.kind == "reduce-scatter" else c
                for c in declared] == list(default)


def _dp(declared, gas, forward, backward, cal=CAL):
    """By hand: 1e9 local parameters gathered in 2 B and reduced in 4 B over 4 ranks at 1 GB/s (a gather
    1.5 s, a reduce-scatter 3 s), 10 layers (the first layer's gather exposed: 0.15 s)."""
    size = dict(groups={"dp": (4, 1), "dp-node": (4, 1), "dp-across": (1, 4)},
                volumes={"gradients": (1e9, 4), "parameters": (1e9, 2)}, node=8,
                hw={"intra": 2e9, "inter": 50e9}, cal=cal, sp=False)
    return steptime._data_parallel(declared, gas, 10, {"forward": forward, "backward": backward}, size)


@pytest.mark.parametrize("name", ["fsdp", "hsdp"])
@pytest.mark.parametrize("how", ["no_sync", "step"])
def test_four_micro_batches_one_reduce_scatter(solver, name, how):
    """4 micro-batches, forward 1 s, backward 2 s. Per micro-batch (4 reduce-scatters): each micro-batch's
    forward gather outlasts the forward by 0.5 s, its backward gather and reduce-scatter (4.5 s) the backward by
    2.5 s, plus the first layer's 0.15 s: 4 x 3.15 = 12.6 s. Once a step (1 reduce-scatter): three micro-batches
    with only the gathers (0.5 + 0 + 0.15 = 0.65 s) and the last with the reduce-scatter beside its backward
    gather (3.15 s): 5.1 s. (hsdp: one node, its across-node all-reduce over 1 rank: none.)"""
    assert _dp(_declared(solver, name, "micro-batch"), 4, 1.0, 2.0) == pytest.approx(4 * (0.5 + 2.5 + 0.15))
    assert _dp(_declared(solver, name, how), 4, 1.0, 2.0) == pytest.approx(3 * (0.5 + 0.15) + (0.5 + 2.5 + 0.15))
    # the collectives hidden behind a long compute cost the SMs they hold (overlap_sm_share 0.1 of each): forward
    # 10 s, backward 20 s: per micro-batch 4 x (0.15 + 0.45 + 0.15) = 3.0 s; once a step 4 x (0.15 + 0.15 + 0.15)
    # + 0.3 = 2.1 s: three reduce-scatters' 0.3 s fewer
    cal = attrs.evolve(CAL, overlap_sm_share=0.1)
    assert _dp(_declared(solver, name, "micro-batch"), 4, 10.0, 20.0, cal) == pytest.approx(3.0)
    assert _dp(_declared(solver, name, how), 4, 10.0, 20.0, cal) == pytest.approx(2.1)


@pytest.mark.parametrize("name", ["fsdp", "hsdp"])
@pytest.mark.parametrize("forward, backward", [(1.0, 2.0), (10.0, 20.0), (0.1, 0.2)])
def test_without_accumulation_the_same_bits(solver, name, forward, backward):
    cal = attrs.evolve(CAL, overlap_sm_share=0.1)
    expected = _dp(_declared(solver, name, "micro-batch"), 1, forward, backward, cal)
    for how in ("no_sync", "step"):
        assert _dp(_declared(solver, name, how), 1, forward, backward, cal) == expected


def _time(gradient_sync, global_batch, rule="fsdp"):
    return time_plan("llama3-8b", "h100", global_batch=global_batch, seq_len=4096, dp=64, microbatch=1,
                     data_parallel=rule, checkpointing="full", precision="bf16", optimizer="adamw", memory=False,
                     profile="measured", plugin_options={rule: {"gradient_sync": gradient_sync}})


@pytest.mark.parametrize("rule", ["fsdp", "hsdp"])
def test_time_plan_reads_the_option(rule):
    """Llama-3-8B over 64 H100s (8 nodes), fsdp-bf16: one micro-batch a step, every option the same
    step to the bit; four, the option's step shorter by what the data-parallel part saves, nothing else moved."""
    one = {how: _time(how, 64, rule) for how in SYNCS}
    assert one["no_sync"]["components"] == one["step"]["components"] == one["micro-batch"]["components"]
    four = {how: _time(how, 256, rule) for how in SYNCS}
    assert four["no_sync"]["components"] == four["step"]["components"]
    base, unsynced = four["micro-batch"]["components"], four["no_sync"]["components"]
    assert {k: v for k, v in unsynced.items() if k not in ("dp", "step")} == \
        {k: v for k, v in base.items() if k not in ("dp", "step")}
    assert unsynced["dp"] < base["dp"]
    assert base["step"] - unsynced["step"] == pytest.approx(base["dp"] - unsynced["dp"])
