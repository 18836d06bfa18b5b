"""ZeRO stages 0-3 (Rajbhandari et al. 2020): shard model states over dp ranks.

Stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the
weights. ``zero_stage`` selects ``zero<stage>``; each stage is one data-parallel rule.
"""

from mlsysim_core import ShardingEffect, ShardingRuleSpec, hookimpl

from mlsysim_core.memo import memoize

from ._lazy import lazy_module

buffers = lazy_module(globals(), "buffers", "mlsysim_plugins.measured.buffers")

WHAT = {0: "nothing sharded (plain data parallelism)", 1: "optimizer state / dp",
        2: "optimizer state and gradients / dp", 3: "optimizer state, gradients and weights / dp"}


@memoize
def effect(stage, d):
    notes = (f"ZeRO-{stage}: data-parallel state sharding applied across {d} ranks.",) if stage else ()
    return ShardingEffect(optimizer_state_shards=d if stage >= 1 else 1,
                          gradient_shards=d if stage >= 2 else 1,
                          weight_shards=d if stage >= 3 else 1, notes=notes)


def make_apply(stage):
    def apply(plan, options):   # the distributed optimizer shards over dp x cp (Megatron-Core)
        return effect(stage, plan.dp_size * plan.cp_size)
    return apply


def ddp_buffers(plan, placement, options):
    """Measured grade, plain data parallelism: PyTorch DDP's gradient buckets, when the
    gradients are all-reduced over more than one replica (this rule's group, dp x cp)."""
    return buffers.ddp_buckets(plan, placement, plan.dp_size * plan.cp_size)


def zero3_buffers(plan, placement, options):
    """Measured grade, ZeRO-3: one layer gathered at a time, its gradients reduce-scattered."""
    return buffers.layer_gather(plan, placement)


MEASURED_BUFFERS = {0: ddp_buffers, 3: zero3_buffers}


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name=f"zero{stage}", axis="dp", apply=make_apply(stage),
                             description=f"ZeRO-{stage}: {WHAT[stage]}",
                             measured_buffer_terms=MEASURED_BUFFERS.get(stage)) for stage in range(4)]
