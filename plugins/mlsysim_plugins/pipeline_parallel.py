"""Pipeline parallelism: parameters split evenly over pp stages, ceil(layers/pp) layers on
a stage, and one send plus one receive buffer of a boundary activation (2*b*s*h values)."""

import math

from mlsysim_core import (BACKWARD, COMMUNICATION_BUFFERS, FORWARD, LayoutError, MemoryTerm,
                          ShardingEffect, ShardingRuleSpec, hookimpl)
from mlsysim_plugins.steptime_hookspecs import COLLECTIVES as STEPTIME_COLLECTIVES, Collective

from mlsysim_core.memo import memoize


@memoize
def effect(p, layers, mb, s, h, b, note):
    buffers = ()
    if p > 1:
        buffers = (MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="pipeline send + receive buffers",
            nbytes=2 * mb * s * h * b, phases=(FORWARD, BACKWARD),
            formula=f"2 x b={mb} x s={s} x h={h} x {b} B{note}"),)
    return ShardingEffect(parameter_shards=p, pipeline_stages=p, layers_per_stage=max(1, math.ceil(layers / p)),
                          buffer_terms=buffers)


def apply(plan, options):
    p, layers = plan.pp_size, plan.model.layers
    if p > layers:
        raise LayoutError("pp_size", p, f"at most the model's {layers} layers",
                          f"a pipeline stage needs at least one layer of {plan.model.name!r}")
    if p == 1:   # the boundary buffers do not exist: the effect depends on the layer count only
        return effect(1, layers, 0, 0, 0, 0, "")
    return effect(p, layers, plan.microbatch, plan.seq_len, plan.hidden_dim, plan.bytes_per_value,
                  plan.hidden_dim_note)


# Declared for the step time: the stage boundary's activation sent forward and its gradient sent
# back, per micro-batch (and model chunk), on the critical path.
COLLECTIVES = (Collective(kind="send-recv", volume="activations", group="pp", per="micro-batch", forward=1,
                          backward=1),)


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="pp", axis="pp", apply=apply, extensions={STEPTIME_COLLECTIVES: COLLECTIVES},
                             description="parameters / pp; ceil(layers/pp) layers per stage; p2p buffers")]
