"""The 'none' optimizer: no optimizer state (e.g. to see weights and activations alone)."""

from mlsysim_core import OptimizerSpec, hookimpl


def state_terms(plan, placement, options):
    return []


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="none", description="no optimizer state, 0 B/param",
                          state_terms=state_terms, extensions={
                              "measured.state_terms": state_terms,
                              "explain.why": "No optimizer is selected, so no state is kept between steps (useful to "
                                             "see the weights and activations alone)."})]
