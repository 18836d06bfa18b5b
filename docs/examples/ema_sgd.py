"""SGD with momentum plus an fp32 exponential moving average (EMA) of the weights, kept by
the optimizer. Select it with optimizer="myorg.ema-sgd"."""

from mlsysim_core import OPTIMIZER_STATE, PHASES, MemoryTerm, OptimizerSpec, hookimpl
from mlsysim_plugins.measured import optimizers as measured

EMA_BYTES = 4        # the EMA copy is fp32 whatever the regime


def state_terms(plan, placement, options):
    """Reference grade, in the reference's convention: fp32 master 4 + momentum 4 + EMA 4."""
    params, shards = placement.trainable_parameters_per_rank, placement.optimizer_state_shards
    return [MemoryTerm(component=OPTIMIZER_STATE, label="ema-sgd master + momentum + EMA (fp32)",
                       nbytes=params * 12 / shards,
                       formula=f"{params:,.0f} trainable params/rank x 12 B / {shards} shard(s)")]


def measured_state_terms(plan, placement, options):
    """Measured grade: a mixed regime's master copy, one momentum buffer in the regime's
    state dtype (the helpers), and the fp32 EMA, alive in every phase (written here)."""
    params = placement.trainable_parameters_per_rank / placement.optimizer_state_shards
    ema = MemoryTerm(component=OPTIMIZER_STATE, label="EMA of the weights (fp32)", phases=PHASES,
                     nbytes=params * EMA_BYTES, formula=f"{params:,.0f} trainable params/rank x 4 B")
    return [*measured.moment_terms(plan, placement, "ema-sgd", 1, step_counters=False), ema]


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="myorg.ema-sgd", description="SGD with momentum and an fp32 EMA of the weights",
                          state_terms=state_terms, extensions={"measured.state_terms": measured_state_terms})]
