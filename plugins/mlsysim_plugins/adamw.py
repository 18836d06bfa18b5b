"""AdamW: Adam with decoupled weight decay. Same state as Adam, 12 B per trainable parameter."""

import functools

from mlsysim_core import OptimizerSpec, hookimpl

from . import adam


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="adamw", description="AdamW: fp32 master + m + v, 12 B/param",
                          state_terms=functools.partial(adam.state_terms, name="adamw"),
                          extensions={"measured.state_terms": functools.partial(adam.measured_state_terms,
                                                                                name="adamw"),
                                      "explain.why": "AdamW (Adam with decoupled weight decay) keeps the same state "
                                                     "as Adam: an fp32 master copy and two fp32 moments per trainable "
                                                     "parameter, 12 B each, kept for the whole run."},
                          step=adam.STEP)]
