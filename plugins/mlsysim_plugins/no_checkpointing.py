"""No recomputation: every activation is stored, attention scores included,
34*s*b*h + 5*a*s^2*b bytes per layer (softmax 2 + dropout mask 1 + dropped probs 2)."""

from mlsysim_core import CheckpointingSpec, hookimpl

from ._korthikanti import activation_term

PER_TOKEN_BYTES = 34
SCORE_BYTES = 5


def activation_terms(plan, placement, options):
    s, mb, h, scale = plan.seq_len, plan.microbatch, plan.hidden_dim, plan.bytes_per_value / 2
    a = plan.model.heads
    per_layer = (PER_TOKEN_BYTES * s * mb * h + SCORE_BYTES * a * s * s * mb) * scale
    return [activation_term(plan, placement, per_layer, f"34*s*b*h + 5*a*s^2*b, a={a}",
                            "stored activations incl. attention scores (no recompute)")]


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="none", description="store everything; 34*s*b*h + 5*a*s^2*b B/layer",
                              activation_terms=activation_terms, requires_heads=True)]
