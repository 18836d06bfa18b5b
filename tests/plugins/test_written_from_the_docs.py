"""One plugin world, from the docs alone (issue 24, a plugin author's first hour): the built-ins
re-implemented as docs/writing-plugins.md and docs/hooks.md write them give the built-ins' bytes
under both profiles, and their step time. Each spec below is the docs' code; what the docs left out
before helper AUTHORQA's pass is named in the test that needs it:

- hooks.md's tensor-parallel rule "in full" declared no ``tensor_shards``: under the measured
  profile every rank kept the whole model (llama3-8b, tp 4: 32.1 GB of weights where ``tp`` gives 8.0);
- writing-plugins.md's ZeRO variant sharded over ``plan.dp_size``, where the built-ins shard over
  dp x cp (dp 4 x cp 2, ZeRO-3: 51.9 GB where ``zero3`` gives 37.4);
- the whole-layer strategy declared no ``recompute``, so the planner timed it as recomputing nothing.
"""

from __future__ import annotations

import types

import pytest

from mlsysim_core import (ACTIVATIONS, BACKWARD, FORWARD, OPTIMIZER_STATE, CheckpointingSpec, MemoryTerm,
                          OptimizerSpec, ShardingEffect, ShardingRuleSpec, TrainingMemoryModel, hookimpl)
from mlsysim_core.manager import PluginManager
from mlsysim_core.search import time_plan
from mlsysim_plugins.measured import buffers, checkpointing, optimizers
from mlsysim_plugins.measured.optimizer_step import OPTIMIZER_IN_BACKWARD, TORCHAO_OFFLOAD, OptimizerStep


# --- the docs' code -------------------------------------------------------------------------------------------

def tp(plan, options):                       # hooks.md, mlsysim_sharding_rules
    t = plan.tp_size
    return ShardingEffect(parameter_shards=t, tensor_shards=t,
                          activation_shards=t if t > 1 and plan.sequence_parallel else 1)


def ddp(plan, options):                      # writing-plugins.md, "A ZeRO stage written from scratch"
    return ShardingEffect()


def zero2(plan, options):
    d = plan.dp_size * plan.cp_size
    return ShardingEffect(optimizer_state_shards=d, gradient_shards=d)


def zero3(plan, options):
    d = plan.dp_size * plan.cp_size
    return ShardingEffect(optimizer_state_shards=d, gradient_shards=d, weight_shards=d)


def ddp_buckets(plan, placement, options):
    return buffers.ddp_buckets(plan, placement)


def gathered_layer(plan, placement, options):
    return buffers.layer_gather(plan, placement)


def fsdp_buffers(plan, placement, options):       # FULL_SHARD: the root module's parameters stay gathered
    return buffers.fsdp_root(plan, placement) + buffers.layer_gather(plan, placement)


STEP = OptimizerStep(moments=2, step_counters=True, foreach=1, loop_current=2, loop_previous=1,
                     measured_with=(OPTIMIZER_IN_BACKWARD, TORCHAO_OFFLOAD), update="adam")


def adamw_state(plan, placement, options):   # reference grade: 12 B per trainable parameter
    params, shards = placement.trainable_parameters_per_rank, placement.optimizer_state_shards
    return [MemoryTerm(component=OPTIMIZER_STATE, label="adamw master + m + v (fp32)", nbytes=params * 12 / shards,
                       formula=f"{params:,.0f} x 12 B / {shards}")]


def adamw_measured(plan, placement, options):    # writing-plugins.md, "An optimizer's measured state"
    return [*optimizers.moment_terms(plan, placement, "myorg.adamw", STEP.moments, step_counters=STEP.step_counters),
            *optimizers.step_transient(plan, placement, "myorg.adamw", foreach=STEP.foreach,
                                       loop_current=STEP.loop_current, loop_previous=STEP.loop_previous)]


def adafactor_measured(plan, placement, options):    # a factored second moment, from the helpers table
    share, matrices = optimizers.tensor_share(plan, placement), optimizers.trainable_matrices(plan)
    elements = sum(rows + cols if cols else rows for rows, cols in matrices)
    return [*optimizers.master_terms(plan, placement),
            MemoryTerm(component=OPTIMIZER_STATE, label="factored second moment", formula="rows + cols per matrix",
                       nbytes=round(elements * share) * plan.profile_options.regime.state),
            MemoryTerm(component=OPTIMIZER_STATE, label="step counters", formula="4 B per tensor",
                       nbytes=round(len(matrices) * share) * 4),
            *optimizers.step_transient(plan, placement, "myorg.adafactor", foreach=1, loop_current=1, loop_previous=1,
                                       element_bytes=plan.profile_options.regime.weight)]


def layer_inputs(plan, placement, options):   # a whole-layer strategy's reference-grade terms
    s, b, h, layers = plan.seq_len, plan.microbatch, plan.hidden_dim, placement.layers_per_stage
    return [MemoryTerm(component=ACTIVATIONS, label="layer inputs", phases=(FORWARD, BACKWARD),
                       nbytes=layers * s * b * h * 2 / placement.activation_shards, formula="2*s*b*h per layer")]


def _plugin(name, **hooks):
    module = types.ModuleType(name)
    for hook, specs in hooks.items():
        impl = hookimpl(lambda specs=specs: list(specs))
        impl.__name__ = hook
        setattr(module, hook, impl)
    return module


def _specs(recompute=True):
    whole = dict(recompute=lambda plan: 1.0) if recompute else {}
    return _plugin(
        "myorg_docs",
        mlsysim_sharding_rules=[
            ShardingRuleSpec(name="myorg.tp", axis="tp", apply=tp),
            ShardingRuleSpec(name="myorg.ddp", axis="dp", apply=ddp, extensions={"measured.buffer_terms": ddp_buckets}),
            ShardingRuleSpec(name="myorg.zero2", axis="dp", apply=zero2),
            ShardingRuleSpec(name="myorg.zero3", axis="dp", apply=zero3,
                             extensions={"measured.buffer_terms": gathered_layer}),
            ShardingRuleSpec(name="myorg.fsdp", axis="dp", apply=zero3,
                             extensions={"measured.buffer_terms": fsdp_buffers,
                                         "measured.provides": ("fsdp-mixed-precision",)})],
        mlsysim_optimizers=[OptimizerSpec(name="myorg.adamw", state_terms=adamw_state, step=STEP,
                                          extensions={"measured.state_terms": adamw_measured}),
                            OptimizerSpec(name="myorg.adafactor", state_terms=adamw_state,
                                          extensions={"measured.state_terms": adafactor_measured})],
        mlsysim_checkpointing_strategies=[CheckpointingSpec(
            name="myorg.recompute-layers", recomputes="layers", activation_terms=layer_inputs, **whole,
            extensions={"measured.activation_terms": checkpointing.whole_layer_terms, "measured.saves_rank": 6})])


@pytest.fixture(scope="module")
def manager():
    pm = PluginManager.from_environment(autoload=False)
    pm.register(_specs(), name="myorg_docs")
    return pm


def _bytes(result):
    return (result.weights, result.gradients, result.optimizer_state, result.activations,
            result.communication_buffers, result.total_memory, result.host_memory)


LAYOUTS = [dict(dp_size=8), dict(dp_size=4, cp_size=2), dict(dp_size=4, tp_size=2), dict(dp_size=8, regime="fsdp-bf16"),
           dict(dp_size=4, pp_size=2, gradient_accumulation_steps=4), dict(dp_size=8, regime="mixed-bf16"),
           dict(dp_size=8, lora={"rank": 8})]
PAIRS = [({"data_parallel": "myorg.ddp"}, {"data_parallel": "zero0"}),
         ({"data_parallel": "myorg.zero2"}, {"data_parallel": "zero2"}),
         ({"data_parallel": "myorg.zero3"}, {"data_parallel": "zero3"}),
         ({"data_parallel": "myorg.fsdp"}, {"data_parallel": "fsdp"}),
         ({"optimizer": "myorg.adamw"}, {"optimizer": "adamw"}),
         ({"optimizer": "myorg.adafactor"}, {"optimizer": "adafactor"}),
         ({"activation_checkpointing": "myorg.recompute-layers"}, {"activation_checkpointing": "full"}),
         ({"sharding_rules": {"tp": "myorg.tp"}}, {})]


@pytest.mark.parametrize("profile", ["measured", "reference"])
@pytest.mark.parametrize(("mine", "builtin"), PAIRS, ids=lambda kw: str(kw))
def test_the_docs_code_gives_the_builtins_bytes(manager, profile, mine, builtin):
    solver = TrainingMemoryModel(profile, plugin_manager=manager)
    for layout in LAYOUTS:
        if profile == "reference" and ("regime" in layout or "lora" in layout):
            continue                                    # measured-profile options
        if layout.get("regime") == "fsdp-bf16":         # the regime requires an FSDP rule (others: refused)
            if "data_parallel" not in mine:
                layout = {**layout, "data_parallel": "fsdp"}
            elif "fsdp" not in mine["data_parallel"]:
                continue
        if profile == "reference" and mine.get("optimizer") == "myorg.adafactor":
            continue                                    # (its reference terms are AdamW's: not the point)
        for model in ("llama3-8b", "mixtral-8x7b"):
            a = solver.solve(model, "h100", 16, 1024, **layout, **mine)
            b = solver.solve(model, "h100", 16, 1024, **layout, **builtin)
            assert _bytes(a) == _bytes(b), (model, layout)


def test_a_tp_rule_that_declares_no_tensor_shards_keeps_the_whole_model_under_measured():
    """What hooks.md's example was: parameter_shards alone is the reference profile's count only."""
    undeclared = _plugin("myorg_tp_old", mlsysim_sharding_rules=[ShardingRuleSpec(
        name="myorg.tp-old", axis="tp", apply=lambda plan, options: ShardingEffect(parameter_shards=plan.tp_size))])
    pm = PluginManager.from_environment(autoload=False)
    pm.register(undeclared, name="myorg_tp_old")
    measured = TrainingMemoryModel("measured", plugin_manager=pm)
    old = measured.solve("llama3-8b", "h100", 1, 1024, tp_size=4, sharding_rules={"tp": "myorg.tp-old"})
    builtin = measured.solve("llama3-8b", "h100", 1, 1024, tp_size=4)
    assert (old.weights, builtin.weights) == (32_121_045_504, 8_031_060_480)    # 8,030,261,248 x 4 B (+ RoPE), / 4
    reference = TrainingMemoryModel("reference", plugin_manager=pm)
    assert reference.solve("llama3-8b", "h100", 1, 1024, tp_size=4, sharding_rules={"tp": "myorg.tp-old"}).weights \
        == reference.solve("llama3-8b", "h100", 1, 1024, tp_size=4).weights


def test_a_zero_rule_over_dp_alone_keeps_twice_the_state_at_cp_2(manager):
    """The docs' hpZ sharded over plan.dp_size; the built-ins shard over dp x cp."""
    over_dp = _plugin("myorg_zero3_dp", mlsysim_sharding_rules=[ShardingRuleSpec(
        name="myorg.zero3-dp", axis="dp", apply=lambda plan, options: ShardingEffect(
            optimizer_state_shards=plan.dp_size, gradient_shards=plan.dp_size, weight_shards=plan.dp_size),
        extensions={"measured.buffer_terms": gathered_layer})])
    pm = PluginManager.from_environment(autoload=False)
    pm.register(over_dp, name="myorg_zero3_dp")
    solver = TrainingMemoryModel("measured", plugin_manager=pm)
    kw = dict(dp_size=4, cp_size=2)
    mine = solver.solve("llama3-8b", "h100", 16, 1024, data_parallel="myorg.zero3-dp", **kw)
    builtin = solver.solve("llama3-8b", "h100", 16, 1024, data_parallel="zero3", **kw)
    assert mine.weights == 2 * builtin.weights - 512      # the RoPE buffers' 512 B are not sharded
    assert (round(mine.total_memory / 1e9, 1), round(builtin.total_memory / 1e9, 1)) == (51.9, 37.4)


@pytest.mark.parametrize("recompute", [True, False])
def test_the_whole_layer_strategy_is_timed_as_full_when_it_declares_recompute(recompute):
    pm = PluginManager.from_environment(autoload=False)
    pm.register(_specs(recompute=recompute), name="myorg_docs")
    solver = TrainingMemoryModel("measured", plugin_manager=pm)
    kw = dict(global_batch=8, seq_len=2048, memory=False, solver=solver)
    mine = time_plan("llama3-8b", "h100", checkpointing="myorg.recompute-layers", **kw)
    full = time_plan("llama3-8b", "h100", checkpointing="full", **kw)
    none = time_plan("llama3-8b", "h100", checkpointing="none", **kw)
    assert mine["step_s"] == (full["step_s"] if recompute else none["step_s"])
    assert full["step_s"] > none["step_s"]
