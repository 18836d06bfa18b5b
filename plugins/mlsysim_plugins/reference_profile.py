"""The reference profile: mlsysim 0.3.0's TrainingMemoryModel, number for number.

Model states come from ``model_states``, the gradient bucket from
``communication_buffers``; the selected optimizer, checkpointing strategy and sharding
rules do the rest, and every component is added up (no phases), as the textbook does.
"""

import attrs

from mlsysim_core import ProfileSpec, hookimpl


def prepare(plan, registry):
    """Nothing read silently ignored: a model imported from a quantized checkpoint
    (``details["quantization"]``, which mlsysim 0.3.0 never reads) is costed at the run's
    precision, and a note says so."""
    quantization = plan.model.details.get("quantization")
    if not quantization:
        return plan
    said = " ".join(str(quantization.get(k)) for k in ("method", "quantization") if quantization.get(k))
    note = (f"approximation: the checkpoint's quantization_config ({said}) is not read by the reference profile: "
            f"its weights count at {plan.precision}, as an unquantized model's")
    return attrs.evolve(plan, notes=plan.notes + (note,))


@hookimpl
def mlsysim_profiles():
    return [ProfileSpec(name="reference",
                        description="mlsysim 0.3.0 reference model: first-order, everything summed",
                        component_plugins=("communication_buffers", "model_states"), prepare=prepare)]
