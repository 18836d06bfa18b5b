"""Tensor parallelism (Megatron): every parameter split over tp ranks; with sequence
parallelism, activations too (Korthikanti Table 2: everything divides by t)."""

from mlsysim_core import ShardingEffect, ShardingRuleSpec, hookimpl

from mlsysim_core.memo import memoize


@memoize
def effect(t, sequence_parallel):
    return ShardingEffect(parameter_shards=t, tensor_shards=t,
                          activation_shards=t if t > 1 and sequence_parallel else 1)


def apply(plan, options):
    return effect(plan.tp_size, plan.sequence_parallel)


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="tp", axis="tp", apply=apply,
                             description="parameters / tp; activations / tp with sequence parallelism")]
