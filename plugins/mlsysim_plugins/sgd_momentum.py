"""SGD with momentum: one momentum buffer per parameter.

Reference grade: fp32 master 4 B + momentum 4 B = 8 B per trainable parameter, in the
reference model's convention (the master copy counted whatever the precision).
Measured grade: the momentum buffer in the regime's state dtype (created by the first
step as a copy of the gradient); foreach and fused steps update in place (no temporary),
the for-loop one neither.
"""

from mlsysim_core import OPTIMIZER_STATE, MemoryTerm, OptimizerSpec, hookimpl
from mlsysim_core.measured import optimizers as measured

from ._fmt import n, shard


def state_terms(plan, placement, options):
    params = placement.trainable_parameters_per_rank
    shards = placement.optimizer_state_shards
    return [MemoryTerm(component=OPTIMIZER_STATE, label="sgd-momentum master copy + momentum (fp32)",
                       nbytes=params * 8.0 / shards,
                       formula=f"{n(params)} trainable params/rank x 8 B (master 4 + momentum 4)"
                               + shard(shards, "optimizer state sharded: "
                                       + ", ".join(placement.shard_sources["optimizer_state_shards"])))]


def measured_state_terms(plan, placement, options):
    return measured.moment_terms(plan, placement, "sgd-momentum", 1, step_counters=False)


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="sgd-momentum", description="SGD with momentum: master + momentum, 8 B/param",
                          state_terms=state_terms, measured_state_terms=measured_state_terms)]
