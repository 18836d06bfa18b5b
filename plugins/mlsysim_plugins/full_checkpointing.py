"""Full recomputation: keep only each layer's input, 2*s*b*h bytes per layer."""

from mlsysim_core import CheckpointingSpec, hookimpl

from ._lazy import lazy_module
from . import _korthikanti

checkpointing = lazy_module(globals(), "checkpointing", "mlsysim_plugins.measured.checkpointing")

LAYER_INPUT_BYTES = 2   # one fp16 copy of the layer input


def activation_terms(plan, placement, options):
    return _korthikanti.activation_terms(plan, placement, LAYER_INPUT_BYTES, 0,
                                         "layer inputs (full recompute)")


def measured_activation_terms(plan, placement, options):
    """Measured grade (torch.utils.checkpoint around each decoder layer, as HF's
    gradient_checkpointing_enable): a checkpointed layer keeps its input in the residual
    dtype, and the backward recomputes one layer at a time. ``checkpointed_layers=k``
    recomputes only k layers (block recompute); the others keep everything. The accounting
    of every ``recomputes="layers"`` strategy: ``measured.checkpointing.whole_layer_terms``."""
    return checkpointing.whole_layer_terms(plan, placement, options)


def recompute(plan):
    """The share of the forward the backward runs again (the planner's step time)."""
    from .checkpointing_policies import full_share
    return full_share(plan)


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="full", description="recompute every layer; 2*s*b*h B/layer",
                              activation_terms=activation_terms,
                              extensions={"measured.activation_terms": measured_activation_terms,
                                          "measured.saves_rank": 6,     # fit techniques' ladder: the most saving
                                          "explain.why": (
                                              "only the input of each layer",
                                              "2·s·b·h bytes per layer at 16 bit, kept for the backward pass; "
                                              "everything else is recomputed in the backward pass, trading extra "
                                              "compute for memory.")},
                              recompute=recompute, recomputes="layers")]
