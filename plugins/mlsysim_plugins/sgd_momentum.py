"""SGD with momentum: one momentum buffer per parameter.

Reference grade: fp32 master 4 B + momentum 4 B = 8 B per trainable parameter, in the
reference model's convention (the master copy counted whatever the precision).
Measured grade: the momentum buffer in the regime's state dtype (created by the first
step as a copy of the gradient); foreach and fused steps update in place (no temporary),
the for-loop one neither.
"""

from mlsysim_core import OptimizerSpec, hookimpl
from ._lazy import lazy_module
from .measured.optimizer_step import OPTIMIZER_IN_BACKWARD, OptimizerStep
from ._flat_state import flat_state_terms

measured = lazy_module(globals(), "measured", "mlsysim_plugins.measured.optimizers")


def state_terms(plan, placement, options):
    return flat_state_terms(placement, "sgd-momentum master copy + momentum (fp32)", 8.0, "8 B (master 4 + momentum 4)")


STEP = OptimizerStep(moments=1, measured_with=(OPTIMIZER_IN_BACKWARD,))   # one momentum, updated in place


def measured_state_terms(plan, placement, options):
    return measured.moment_terms(plan, placement, "sgd-momentum", STEP.moments, step_counters=STEP.step_counters)


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="sgd-momentum", description="SGD with momentum: master + momentum, 8 B/param",
                          state_terms=state_terms, extensions={"measured.state_terms": measured_state_terms},
                          step=STEP)]
