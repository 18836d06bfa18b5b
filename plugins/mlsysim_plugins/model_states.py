"""Weights and gradients of one rank: parameters x bytes per value, as sharded.

Weights are never reduced by ``trainable_fraction`` (frozen weights are still stored);
gradients exist only for trainable parameters. Model-parallel rules have already split
the parameter count; data-parallel rules (ZeRO-3, ZeRO-2) divide these terms.
"""

from mlsysim_core import BACKWARD, BACKWARD_END, GRADIENTS, OPTIMIZER_STEP, WEIGHTS, MemoryTerm, hookimpl

from ._fmt import n, shard
from mlsysim_core.memo import memoize


@memoize
def weight_term(params, b, precision, shards, sharded_by):
    return MemoryTerm(
        component=WEIGHTS, label=f"parameters ({precision})", nbytes=params * b / shards,
        formula=f"{n(params)} params/rank x {b} B" + shard(shards, "weights sharded: " + ", ".join(sharded_by)))


@memoize
def gradient_term(params, b, precision, shards, sharded_by):
    return MemoryTerm(
        component=GRADIENTS, label=f"gradients ({precision})", nbytes=params * b / shards,
        phases=(BACKWARD, BACKWARD_END, OPTIMIZER_STEP),
        formula=f"{n(params)} trainable params/rank x {b} B"
                + shard(shards, "gradients sharded: " + ", ".join(sharded_by)))


@hookimpl
def mlsysim_weight_terms(plan, placement):
    return [weight_term(placement.parameters_per_rank, plan.bytes_per_value, plan.precision,
                        placement.weight_shards, placement.shard_sources["weight_shards"])]


@hookimpl
def mlsysim_gradient_terms(plan, placement):
    return [gradient_term(placement.trainable_parameters_per_rank, plan.bytes_per_value, plan.precision,
                          placement.gradient_shards, placement.shard_sources["gradient_shards"])]
