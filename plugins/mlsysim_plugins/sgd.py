"""SGD: an fp32 master copy only (no momentum buffer), 4 bytes per trainable parameter."""

from mlsysim_core import MemoryTerm, OPTIMIZER_STATE, OptimizerSpec, hookimpl

from ._lazy import lazy_module
from .measured.optimizer_step import OPTIMIZER_IN_BACKWARD, OptimizerStep
from ._fmt import n, shard
from mlsysim_core.memo import memoize

measured = lazy_module(globals(), "measured", "mlsysim_plugins.measured.optimizers")

BYTES_PER_PARAMETER = 4.0   # fp32 master copy


@memoize
def state_term(params, shards, sharded_by):
    return MemoryTerm(
        component=OPTIMIZER_STATE, label="sgd master copy (fp32)",
        nbytes=params * BYTES_PER_PARAMETER / shards,
        formula=f"{n(params)} trainable params/rank x 4 B (fp32 master)"
                + shard(shards, "optimizer state sharded: " + ", ".join(sharded_by)))


def state_terms(plan, placement, options):
    return [state_term(placement.trainable_parameters_per_rank, placement.optimizer_state_shards,
                       placement.shard_sources["optimizer_state_shards"])]


def measured_state_terms(plan, placement, options):
    """No state (plain SGD updates the weights in place), only a master copy if the regime keeps one."""
    return measured.master_terms(plan, placement)


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="sgd", description="SGD without momentum: fp32 master, 4 B/param",
                          state_terms=state_terms, extensions={
                              "measured.state_terms": measured_state_terms,
                              "explain.why": "SGD without momentum keeps only an fp32 master copy of each trainable "
                                             "parameter (4 B each), which the update is applied to before it is cast "
                                             "back to the weights."},
                          step=OptimizerStep(moments=0, measured_with=(OPTIMIZER_IN_BACKWARD,)))]
