"""Weights and gradients of one rank: parameters x bytes per value, as sharded.

Weights are never reduced by ``trainable_fraction`` (frozen weights are still stored);
gradients exist only for trainable parameters. Model-parallel rules have already split
the parameter count; data-parallel rules (ZeRO-3, ZeRO-2) divide these terms.
"""

from mlsysim_core import BACKWARD, GRADIENTS, OPTIMIZER_STEP, WEIGHTS, MemoryTerm, hookimpl

from ._fmt import n, shard


@hookimpl
def mlsysim_weight_terms(plan, placement):
    b = plan.bytes_per_value
    nbytes = placement.parameters_per_rank * b / placement.weight_shards
    return [MemoryTerm(
        component=WEIGHTS, label=f"parameters ({plan.precision})", nbytes=nbytes,
        formula=f"{n(placement.parameters_per_rank)} params/rank x {b} B"
                + shard(placement.weight_shards, "weights sharded: " + ", ".join(placement.shard_sources["weight_shards"])))]


@hookimpl
def mlsysim_gradient_terms(plan, placement):
    b = plan.bytes_per_value
    nbytes = placement.trainable_parameters_per_rank * b / placement.gradient_shards
    return [MemoryTerm(
        component=GRADIENTS, label=f"gradients ({plan.precision})", nbytes=nbytes,
        phases=(BACKWARD, OPTIMIZER_STEP),
        formula=f"{n(placement.trainable_parameters_per_rank)} trainable params/rank x {b} B"
                + shard(placement.gradient_shards, "gradients sharded: " + ", ".join(placement.shard_sources["gradient_shards"])))]
