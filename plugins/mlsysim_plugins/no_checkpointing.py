"""No recomputation: every activation is stored, attention scores included,
34*s*b*h + 5*a*s^2*b bytes per layer (softmax 2 + dropout mask 1 + dropped probs 2)."""

from mlsysim_core import CheckpointingSpec, hookimpl

from ._lazy import lazy_module
from . import _korthikanti

model = lazy_module(globals(), "model", "mlsysim_plugins.measured.model")

PER_TOKEN_BYTES = 34
SCORE_BYTES = 5


def activation_terms(plan, placement, options):
    return _korthikanti.activation_terms(plan, placement, PER_TOKEN_BYTES, SCORE_BYTES,
                                         "stored activations incl. attention scores (no recompute)")


def measured_activation_terms(plan, placement, options):
    """Every layer keeps what its ops save for backward (op by op, measured grade)."""
    return model.layer_terms(plan, placement)


def recompute(plan):
    """The share of the forward the backward runs again (the planner's step time)."""
    from .checkpointing_policies import none_share
    return none_share(plan)


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="none", description="store everything; 34*s*b*h + 5*a*s^2*b B/layer",
                              activation_terms=activation_terms, requires_heads=True,
                              extensions={"measured.activation_terms": measured_activation_terms,
                                          "explain.label": "no activation checkpointing",
                                          "explain.why": (
                                              "every tensor the forward pass makes",
                                              "34·s·b·h + 5·a·s²·b bytes per layer at 16 bit, attention scores "
                                              "included, all kept for the backward pass. Nothing is recomputed: the "
                                              "most memory, growing with the square of the sequence length.")},
                              recompute=recompute, recomputes="nothing")]
