"""The gradient all-reduce bucket: a fraction of this rank's (sharded) gradients.

The reference model sizes every communication bucket as
``communication_buffer_fraction`` (default 5 %) of the gradient bytes after ZeRO-2
sharding. Pipeline send/receive buffers belong to the pipeline rule.
"""

from mlsysim_core import BACKWARD, COMMUNICATION_BUFFERS, MemoryTerm, hookimpl


@hookimpl
def mlsysim_communication_buffer_terms(plan, placement, model_states):
    c = plan.communication_buffer_fraction
    gradients = model_states["gradients"]
    return [MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="gradient bucket", nbytes=gradients * c,
        phases=(BACKWARD,),
        formula=f"{c} x {gradients:,.0f} B of gradients")]
