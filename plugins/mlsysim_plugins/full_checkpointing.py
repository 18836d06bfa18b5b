"""Full recomputation: keep only each layer's input, 2*s*b*h bytes per layer."""

from mlsysim_core import CheckpointingSpec, hookimpl

from ._korthikanti import activation_term

LAYER_INPUT_BYTES = 2   # one fp16 copy of the layer input


def activation_terms(plan, placement, options):
    s, mb, h, scale = plan.seq_len, plan.microbatch, plan.hidden_dim, plan.bytes_per_value / 2
    per_layer = LAYER_INPUT_BYTES * s * mb * h * scale
    return [activation_term(plan, placement, per_layer, "2*s*b*h", "layer inputs (full recompute)")]


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="full", description="recompute every layer; 2*s*b*h B/layer",
                              activation_terms=activation_terms)]
