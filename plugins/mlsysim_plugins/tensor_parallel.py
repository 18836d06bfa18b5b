"""Tensor parallelism (Megatron): every parameter split over tp ranks; with sequence
parallelism, activations too (Korthikanti Table 2: everything divides by t)."""

from mlsysim_core import ShardingEffect, ShardingRuleSpec, hookimpl


def apply(plan, options):
    t = plan.tp_size
    return ShardingEffect(parameter_shards=t,
                          activation_shards=t if t > 1 and plan.sequence_parallel else 1)


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="tp", axis="tp", apply=apply,
                             description="parameters / tp; activations / tp with sequence parallelism")]
