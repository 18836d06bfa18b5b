"""No recomputation: every activation is stored, attention scores included,
34*s*b*h + 5*a*s^2*b bytes per layer (softmax 2 + dropout mask 1 + dropped probs 2)."""

from mlsysim_core import CheckpointingSpec, hookimpl

from . import _korthikanti

PER_TOKEN_BYTES = 34
SCORE_BYTES = 5


def activation_terms(plan, placement, options):
    return _korthikanti.activation_terms(plan, placement, PER_TOKEN_BYTES, SCORE_BYTES,
                                         "stored activations incl. attention scores (no recompute)")


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="none", description="store everything; 34*s*b*h + 5*a*s^2*b B/layer",
                              activation_terms=activation_terms, requires_heads=True)]
