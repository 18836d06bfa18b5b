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


# --- fsdp-grad-op (SHARD_GRAD_OP): "step" (FSDP2) gathers every micro-batch, "no_sync" (FSDP1) once a step ---------

def test_grad_op_declarations():
    """SHARD_GRAD_OP gathers once per micro-batch (kept from its forward to its backward) and reduce-scatters after
    the backward. "step" (FSDP2's reshard_after_backward frees the parameters after every backward): the gather per
    micro-batch, the reduce-scatter once a step in the last micro-batch's backward. "no_sync" (FSDP1 keeps the
    gathered flat parameters to the last backward and FlatParamHandle.unshard gathers only when needs_unshard()):
    the gather once a step too (the first micro-batch's forward, hidden on its own). Both move what
    "micro-batch" moves (the gradients in the regime's reduce dtype)."""
    default = [(c.kind, c.per, c.last_micro_batch) for c in _declared_grad_op("micro-batch")]
    assert default == [("all-gather", "micro-batch", False), ("reduce-scatter", "micro-batch", False)]
    assert [(c.kind, c.per, c.last_micro_batch) for c in _declared_grad_op("step")] == [
        ("all-gather", "micro-batch", False), ("reduce-scatter", "step", True)]
    assert [(c.kind, c.per, c.last_micro_batch) for c in _declared_grad_op("no_sync")] == [
        ("all-gather", "step", False), ("reduce-scatter", "step", True)]
    for how in ("step", "no_sync"):
        assert [attrs.evolve(c, per="micro-batch", last_micro_batch=False) for c in _declared_grad_op(how)] == \
            list(_declared_grad_op("micro-batch"))


def _declared_grad_op(how):
    from mlsysim_plugins import fsdp
    return fsdp.grad_op_collectives(fsdp.GradOpOptions(gradient_sync=how))


def test_grad_op_four_micro_batches_by_hand():
    """The _dp figures (a gather 1.5 s, a reduce-scatter 3 s, the first layer's gather 0.15 s exposed), 4
    micro-batches, forward 1 s, backward 2 s. Per micro-batch: 4 x (0.5 + 1.0 + 0.15) = 6.6 s. "step": three
    micro-batches with only the gather (0.65 s), the last with the reduce-scatter (1.65 s): 3.6 s. "no_sync": one
    gather (0.65 s) and one reduce-scatter (1.0 s): 1.65 s. With the SM share (0.1; forward 10 s, backward 20 s):
    4 x (0.15 + 0.3 + 0.15) = 2.4 s; 3 x 0.3 + 0.6 = 1.5 s; 0.3 + 0.3 = 0.6 s."""
    assert _dp(_declared_grad_op("micro-batch"), 4, 1.0, 2.0) == pytest.approx(4 * (0.5 + 1.0 + 0.15))
    assert _dp(_declared_grad_op("step"), 4, 1.0, 2.0) == pytest.approx(3 * 0.65 + 1.65)
    assert _dp(_declared_grad_op("no_sync"), 4, 1.0, 2.0) == pytest.approx(0.65 + 1.0)
    cal = attrs.evolve(CAL, overlap_sm_share=0.1)
    assert _dp(_declared_grad_op("micro-batch"), 4, 10.0, 20.0, cal) == pytest.approx(2.4)
    assert _dp(_declared_grad_op("step"), 4, 10.0, 20.0, cal) == pytest.approx(1.5)
    assert _dp(_declared_grad_op("no_sync"), 4, 10.0, 20.0, cal) == pytest.approx(0.6)


@pytest.mark.parametrize("forward, backward", [(1.0, 2.0), (10.0, 20.0), (0.1, 0.2)])
def test_grad_op_without_accumulation(forward, backward):
    """One micro-batch: "step" the same bits as "micro-batch"; "no_sync" the same seconds summed in another order
    (its gather is a once-a-step call of its own: equal within a rounding)."""
    cal = attrs.evolve(CAL, overlap_sm_share=0.1)
    expected = _dp(_declared_grad_op("micro-batch"), 1, forward, backward, cal)
    assert _dp(_declared_grad_op("step"), 1, forward, backward, cal) == expected
    assert _dp(_declared_grad_op("no_sync"), 1, forward, backward, cal) == pytest.approx(expected, rel=1e-14)


def test_grad_op_time_plan_reads_the_option():
    """Llama-3-8B over 64 H100s (fsdp-bf16), fsdp-grad-op: one micro-batch, every option the same step (no_sync
    within a rounding); four, no_sync < step < micro-batch in the data-parallel part, nothing else moved."""
    one = {how: _time(how, 64, "fsdp-grad-op") for how in SYNCS}
    assert one["step"]["components"] == one["micro-batch"]["components"]
    assert one["no_sync"]["components"] == pytest.approx(one["micro-batch"]["components"], rel=1e-14)
    four = {how: _time(how, 256, "fsdp-grad-op") for how in SYNCS}
    base = four["micro-batch"]["components"]
    for how in ("step", "no_sync"):
        assert {k: v for k, v in four[how]["components"].items() if k not in ("dp", "step")} == \
            {k: v for k, v in base.items() if k not in ("dp", "step")}
        assert base["step"] - four[how]["components"]["step"] == pytest.approx(
            base["dp"] - four[how]["components"]["dp"])
    assert four["no_sync"]["components"]["dp"] < four["step"]["components"]["dp"] < base["dp"]
