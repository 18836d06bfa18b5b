"""Tensor parallelism (Megatron): every parameter split over tp ranks; with sequence
parallelism, activations too (Korthikanti Table 2: everything divides by t)."""

from mlsysim_core import ShardingEffect, ShardingRuleSpec, hookimpl
from mlsysim_plugins.steptime_hookspecs import COLLECTIVES as STEPTIME_COLLECTIVES, Collective

from mlsysim_core.memo import memoize


@memoize
def effect(t, sequence_parallel):
    return ShardingEffect(parameter_shards=t, tensor_shards=t,
                          activation_shards=t if t > 1 and sequence_parallel else 1)


def apply(plan, options):
    return effect(plan.tp_size, plan.sequence_parallel)


# Declared for the step time: two all-reduces of the hidden states per layer in each forward
# (recomputed ones too) and two in its backward, on the critical path; with sequence parallelism
# each is an all-gather + reduce-scatter pair, a ring's volume (no in-network reduction).
COLLECTIVES = tuple(Collective(kind="all-reduce", volume="activations", group="tp", per="layer", forward=2,
                               backward=2, in_network=not sp, sequence_parallel=sp) for sp in (False, True))


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="tp", axis="tp", apply=apply, extensions={STEPTIME_COLLECTIVES: COLLECTIVES},
                             description="parameters / tp; activations / tp with sequence parallelism")]
