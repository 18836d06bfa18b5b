"""Adam: an fp32 master copy plus two fp32 moments, 12 bytes per trainable parameter.

The reference model counts these 12 B regardless of the training precision (so fp32
training counts the master copy twice; see its known weaknesses, §13.6).
"""

from mlsysim_core import MemoryTerm, OPTIMIZER_STATE, OptimizerSpec, hookimpl

from ._lazy import lazy_module
from .measured.optimizer_step import OPTIMIZER_IN_BACKWARD, TORCHAO_OFFLOAD, OptimizerStep
from ._fmt import n, shard
from mlsysim_core.memo import memoize

measured = lazy_module(globals(), "measured", "mlsysim_plugins.measured.optimizers")

BYTES_PER_PARAMETER = 12.0   # fp32 master 4 + momentum 4 + variance 4
WHY = ("Adam keeps an fp32 master copy of every trainable parameter and two fp32 moments "   # (explain)
       "(momentum and variance): 12 B per trainable parameter, kept for the whole run.")

# What torch.optim.Adam/AdamW keep and allocate (torch/optim/adamw.py): two moments and a step tensor
# per parameter tensor; foreach one temporary (_foreach_sqrt of the second moment), the for-loop two
# for the current tensor (sqrt and division) and the previous one's denom, fused none.
STEP = OptimizerStep(moments=2, step_counters=True, foreach=1, loop_current=2, loop_previous=1,
                     measured_with=(OPTIMIZER_IN_BACKWARD, TORCHAO_OFFLOAD), update="adam")


@memoize
def state_term(name, params, shards, sharded_by):
    return MemoryTerm(
        component=OPTIMIZER_STATE, label=f"{name} master copy + 2 moments (fp32)",
        nbytes=params * BYTES_PER_PARAMETER / shards,
        formula=f"{n(params)} trainable params/rank x 12 B (master 4 + m 4 + v 4)"
                + shard(shards, "optimizer state sharded: " + ", ".join(sharded_by)))


def state_terms(plan, placement, options, *, name="adam"):
    return [state_term(name, placement.trainable_parameters_per_rank, placement.optimizer_state_shards,
                       placement.shard_sources["optimizer_state_shards"])]


def measured_state_terms(plan, placement, options, *, name="adam"):
    """Two moments in the regime's state dtype and a 4-byte step tensor per parameter
    tensor; the step: foreach allocates one parameter-sized temporary (``_foreach_sqrt`` of
    the second moment), the for-loop two per parameter plus the previous one's ``denom``."""
    return [*measured.moment_terms(plan, placement, name, STEP.moments, step_counters=STEP.step_counters),
            *measured.step_transient(plan, placement, name, foreach=STEP.foreach, loop_current=STEP.loop_current,
                                     loop_previous=STEP.loop_previous)]


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="adam", description="Adam: fp32 master + m + v, 12 B/param",
                          state_terms=state_terms, extensions={"measured.state_terms": measured_state_terms,
                                                                "explain.why": WHY},
                          step=STEP)]
