"""Adafactor (Shazeer & Stern 2018; ``torch.optim.Adafactor``): no first moment, the
second moment factored into a row and a column vector per matrix.

Reference grade: fp32 master 4 B per parameter plus the factored moment, which is
negligible next to it (the textbook's "about 4 B/param").
Measured grade: row + column vectors from the architecture's matrix shapes (full vectors
for 1-D parameters) in the parameters' dtype, a 4-byte step tensor per parameter tensor;
the foreach step allocates one parameter-sized temporary, the for-loop one keeps the
previous parameter's update alive with the current one's.
"""

from mlsysim_core import OptimizerSpec, hookimpl
from ._lazy import lazy_module
from ._flat_state import flat_state_terms

measured = lazy_module(globals(), "measured", "mlsysim_plugins.measured.optimizers")


def state_terms(plan, placement, options):
    return flat_state_terms(placement, "adafactor master copy (fp32)", 4.0, "4 B (factored moments neglected)")


def measured_state_terms(plan, placement, options):
    if plan.profile_options.optimizer_impl == "fused":
        from mlsysim_core import InvalidInputError
        raise InvalidInputError("optimizer_impl", "fused", "foreach or for-loop for adafactor",
                                "torch.optim.Adafactor has no fused implementation")
    return [*measured.adafactor_terms(plan, placement),
            *measured.step_transient(plan, placement, "adafactor", foreach=1, loop_current=1, loop_previous=1,
                                     element_bytes=plan.profile_options.regime.weight)]


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="adafactor", description="Adafactor: factored second moment, ~4 B/param",
                          state_terms=state_terms, extensions={"measured.state_terms": measured_state_terms})]
