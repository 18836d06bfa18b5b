"""Full recomputation: keep only each layer's input, 2*s*b*h bytes per layer."""

from mlsysim_core import CheckpointingSpec, hookimpl

from ._lazy import lazy_module
from . import _korthikanti

model = lazy_module(globals(), "model", "mlsysim_plugins.measured.model")

LAYER_INPUT_BYTES = 2   # one fp16 copy of the layer input


def activation_terms(plan, placement, options):
    return _korthikanti.activation_terms(plan, placement, LAYER_INPUT_BYTES, 0,
                                         "layer inputs (full recompute)")


def measured_activation_terms(plan, placement, options):
    """Measured grade (torch.utils.checkpoint around each decoder layer, as HF's
    gradient_checkpointing_enable): a checkpointed layer keeps its input in the residual
    dtype, and the backward recomputes one layer at a time. ``checkpointed_layers=k``
    recomputes only k layers (block recompute); the others keep everything."""
    layers = placement.layers_per_stage
    k = layers if plan.profile_options.checkpointed_layers is None else min(plan.profile_options.checkpointed_layers, layers)
    terms = model.layer_terms(plan, placement, kept_layers=layers - k)
    if k != layers or not _plain_one_device(plan):
        return terms
    ctx = model.context(plan, placement)
    lb = model.layer_bytes(plan, ctx)
    if not all(part.op for part in lb.parts):      # a family whose parts do not name their ops
        return terms
    # The backward's end: the larger of layer 0's recomputed MLP backward and the embedding's
    # backward, never both (checkpointing_policies.last_moments, derived op by op and measured).
    from mlsysim_core.terms import BACKWARD_END
    from .checkpointing_policies import _autocast_copies, last_moments
    terms = [t for t in terms if tuple(t.phases) != (BACKWARD_END,)]
    return terms + [last_moments(plan, placement, ctx, lb, kept=_autocast_copies(ctx), unborn_layers=1)]


def _plain_one_device(plan) -> bool:
    """One device, full training, no technique that reshapes the backward's end (offload, the step
    in the backward, float8, another loss)."""
    o = plan.profile_options
    if plan.rank is not None or o.lora is not None or o.regime.main_grad or o.dropout:
        return False
    return not any(getattr(o, name, None) for name in ("optimizer_in_backward", "activation_offload", "offload",
                                                       "cpu_offload_optimizer", "float8")) \
        and getattr(o, "loss", None) in (None, "cross_entropy")


def recompute(plan):
    """The share of the forward the backward runs again (the planner's step time)."""
    from .checkpointing_policies import recompute_share
    return recompute_share(plan)


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="full", description="recompute every layer; 2*s*b*h B/layer",
                              activation_terms=activation_terms,
                              measured_activation_terms=measured_activation_terms,
                              recompute=recompute)]
