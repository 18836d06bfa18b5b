"""ZeRO-3 with prefetch: the same shards as ZeRO-3, but while one layer runs the next one
is already being gathered, so two layers' parameters are unsharded at once.
Select it with data_parallel="myorg.zero3-prefetch"."""

from mlsysim_core import (BACKWARD, COMMUNICATION_BUFFERS, FORWARD, MemoryTerm, ShardingEffect, ShardingRuleSpec,
                          hookimpl)
from mlsysim_plugins.measured import buffers

GATHERED_LAYERS = 2      # the running layer and the prefetched one


def apply(plan, options, split):
    """Shards as ZeRO-3 (over dp x cp, as the built-in rules); the reference-grade buffer:
    two layers of this rank's parameters at the training precision."""
    d = plan.dp_size * plan.cp_size
    layers = split.layers_per_stage or plan.model.layers
    layer = split.parameters_per_rank / layers            # the rules before this one split it already
    gathered = MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="all-gathered parameters (2 layers)",
        nbytes=GATHERED_LAYERS * layer * plan.bytes_per_value, phases=(FORWARD, BACKWARD),
        formula=f"2 x {layer:,.0f} params of one layer x {plan.bytes_per_value} B")
    return ShardingEffect(optimizer_state_shards=d, gradient_shards=d, weight_shards=d,
                          buffer_terms=(gathered,) if d > 1 else (),
                          notes=(f"ZeRO-3 with prefetch: model states / {d}, two layers gathered at a time.",))


def measured_buffer_terms(plan, placement, options):
    """Measured grade: ZeRO-3's own buffers (one gathered layer, one layer's gradients being
    reduce-scattered), plus the prefetched layer, in the regime's gathered dtype."""
    terms = buffers.layer_gather(plan, placement)       # [] when nothing is sharded
    if terms:
        layer, b = buffers.layer_parameters(plan, placement), buffers.gathered_bytes(plan)
        terms.append(MemoryTerm(component=COMMUNICATION_BUFFERS, label="prefetched parameters of the next layer",
                                nbytes=layer * b, phases=(FORWARD, BACKWARD),
                                formula=f"{layer:,.0f} params of one layer x {b} B"))
    return terms


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="myorg.zero3-prefetch", axis="dp", apply=apply,
                             extensions={"measured.buffer_terms": measured_buffer_terms},
                             description="ZeRO-3, the next layer prefetched while one runs")]
