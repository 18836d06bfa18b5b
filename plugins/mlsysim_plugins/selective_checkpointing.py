"""Selective recomputation: recompute only the attention core; keep 34*s*b*h bytes per layer."""

from mlsysim_core import CheckpointingSpec, hookimpl

from ._korthikanti import activation_term

PER_TOKEN_BYTES = 34   # Korthikanti Table 2, fp16, selective recompute


def activation_terms(plan, placement, options):
    s, mb, h, scale = plan.seq_len, plan.microbatch, plan.hidden_dim, plan.bytes_per_value / 2
    per_layer = PER_TOKEN_BYTES * s * mb * h * scale
    return [activation_term(plan, placement, per_layer, "34*s*b*h", "stored activations (selective recompute)")]


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="selective", description="recompute attention core; 34*s*b*h B/layer",
                              activation_terms=activation_terms)]
