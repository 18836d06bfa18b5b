"""AdamW: Adam with decoupled weight decay. Same state as Adam, 12 B per trainable parameter."""

import functools

from mlsysim_core import OptimizerSpec, hookimpl

from . import adam


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="adamw", description="AdamW: fp32 master + m + v, 12 B/param",
                          state_terms=functools.partial(adam.state_terms, name="adamw"),
                          extensions={"measured.state_terms": functools.partial(adam.measured_state_terms,
                                                                                name="adamw")},
                          step=adam.STEP)]
