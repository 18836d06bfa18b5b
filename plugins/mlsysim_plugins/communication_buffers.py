"""The gradient all-reduce bucket: a fraction of this rank's (sharded) gradients.

The reference model sizes every communication bucket as
``communication_buffer_fraction`` (default 5 %) of the gradient bytes after ZeRO-2
sharding. Pipeline send/receive buffers belong to the pipeline rule. A selected rule whose
options declare ``replaces_communication_buffer_fraction`` (DeepSpeed's buckets given to a
ZeRO rule: ``deepspeed_buckets``) prices its own buckets instead, and this one is left out.
"""

from mlsysim_core import BACKWARD, BACKWARD_END, COMMUNICATION_BUFFERS, MemoryTerm, hookimpl

from mlsysim_core.memo import memoize


@memoize
def bucket_term(c, gradients):
    return MemoryTerm(component=COMMUNICATION_BUFFERS, label="gradient bucket", nbytes=gradients * c,
                      phases=(BACKWARD, BACKWARD_END), formula=f"{c} x {gradients:,.0f} B of gradients")


@hookimpl
def mlsysim_communication_buffer_terms(plan, placement, model_states):
    for options in plan.options.values():
        if getattr(options, "replaces_communication_buffer_fraction", False):
            return []
    return [bucket_term(plan.communication_buffer_fraction, model_states["gradients"])]
