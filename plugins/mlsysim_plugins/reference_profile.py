"""The reference profile: mlsysim 0.3.0's TrainingMemoryModel, number for number.

Model states come from ``model_states``, the gradient bucket from
``communication_buffers``; the selected optimizer, checkpointing strategy and sharding
rules do the rest, and every component is added up (no phases), as the textbook does.
"""

from mlsysim_core import ProfileSpec, hookimpl


@hookimpl
def mlsysim_profiles():
    return [ProfileSpec(name="reference",
                        description="mlsysim 0.3.0 reference model: first-order, everything summed",
                        component_plugins=("communication_buffers", "model_states"))]
