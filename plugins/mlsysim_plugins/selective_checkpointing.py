"""Selective recomputation: recompute only the attention core; keep 34*s*b*h bytes per layer."""

from mlsysim_core import CheckpointingSpec, hookimpl

from ._lazy import lazy_module
from . import _korthikanti

model = lazy_module(globals(), "model", "mlsysim_plugins.measured.model")

PER_TOKEN_BYTES = 34   # Korthikanti Table 2, fp16, selective recompute


def activation_terms(plan, placement, options):
    return _korthikanti.activation_terms(plan, placement, PER_TOKEN_BYTES, 0,
                                         "stored activations (selective recompute)")


def measured_activation_terms(plan, placement, options):
    """Measured grade: every layer keeps what it saves except eager attention's s x s
    tensors (scores, probabilities, dropout mask), which are recomputed; with fused
    attention (sdpa) there are none, so this equals no recomputation."""
    return model.layer_terms(plan, placement, selective=True)


def recompute(plan):
    """The share of the forward the backward runs again (the planner's step time)."""
    from .checkpointing_policies import selective_share
    return selective_share(plan)


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="selective", description="recompute attention core; 34*s*b*h B/layer",
                              activation_terms=activation_terms,
                              extensions={"measured.activation_terms": measured_activation_terms,
                                          "explain.why": (
                                              "the tensors the forward pass saves for the backward pass",
                                              "34·s·b·h bytes per layer at 16 bit (Korthikanti et al. 2023); the "
                                              "attention core is recomputed in the backward pass instead of stored.")},
                              recompute=recompute, recomputes="part")]
