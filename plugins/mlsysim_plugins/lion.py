"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): one momentum
buffer, updates by its sign.

Reference grade: fp32 master 4 B + momentum 4 B = 8 B per trainable parameter.
Measured grade: the momentum in the regime's state dtype; a foreach step (lucidrains'
``lion-pytorch`` style: interpolate, sign, update) holds one parameter-sized temporary,
a fused kernel none, the for-loop one per parameter.
"""

from mlsysim_core import OptimizerSpec, hookimpl
from ._lazy import lazy_module
from .measured.optimizer_step import OPTIMIZER_IN_BACKWARD, OptimizerStep
from ._flat_state import flat_state_terms

measured = lazy_module(globals(), "measured", "mlsysim_plugins.measured.optimizers")


def state_terms(plan, placement, options):
    return flat_state_terms(placement, "lion master copy + momentum (fp32)", 8.0, "8 B (master 4 + momentum 4)")


# One momentum, no step tensor; one temporary per step (foreach over all tensors, the for-loop per tensor).
STEP = OptimizerStep(moments=1, foreach=1, loop_current=1, loop_previous=0, measured_with=(OPTIMIZER_IN_BACKWARD,))


def measured_state_terms(plan, placement, options):
    return [*measured.moment_terms(plan, placement, "lion", STEP.moments, step_counters=STEP.step_counters),
            *measured.step_transient(plan, placement, "lion", foreach=STEP.foreach, loop_current=STEP.loop_current,
                                     loop_previous=STEP.loop_previous)]


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="lion", description="Lion: master + one momentum, 8 B/param",
                          state_terms=state_terms, extensions={"measured.state_terms": measured_state_terms},
                          step=STEP)]
