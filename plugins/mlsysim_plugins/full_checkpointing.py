"""Full recomputation: keep only each layer's input, 2*s*b*h bytes per layer."""

from mlsysim_core import CheckpointingSpec, hookimpl

from . import _korthikanti

LAYER_INPUT_BYTES = 2   # one fp16 copy of the layer input


def activation_terms(plan, placement, options):
    return _korthikanti.activation_terms(plan, placement, LAYER_INPUT_BYTES, 0,
                                         "layer inputs (full recompute)")


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="full", description="recompute every layer; 2*s*b*h B/layer",
                              activation_terms=activation_terms)]
