"""What the selected checkpointing strategy declares, as the measured physics asks it.

The physics never compares ``plan.activation_checkpointing`` to a name: it reads the selected
``CheckpointingSpec``'s declaration (``recomputes``: ``"nothing"``, ``"layers"`` or ``"part"``;
``recomputes_first_layer(plan)``), which ``prepare`` puts in ``plan.profile_options.checkpointing``.
A third-party strategy declaring what a built-in declares gets the built-in's bytes.

``whole_layer_terms`` is the decoder-layer accounting of a ``recomputes="layers"`` strategy (the
built-in ``full``'s), public so that a third party declaring whole-layer recompute can return it.
"""

from __future__ import annotations

NOTHING, LAYERS, PART = "nothing", "layers", "part"


def spec_of(plan):
    """The selected ``CheckpointingSpec``: the one ``prepare`` chose, else the process's registry's."""
    spec = getattr(plan.profile_options, "checkpointing", None)
    if spec is None:
        from mlsysim_core.manager import get_plugin_manager
        spec = get_plugin_manager().registry.checkpointing[plan.activation_checkpointing]
    return spec


def recomputes(plan) -> str:
    """What the selected strategy declares it recomputes: "nothing", "layers" or "part"."""
    return spec_of(plan).recomputes


def keeps_everything(plan) -> bool:
    """No recompute: every layer keeps all it saves (the built-in ``none``)."""
    return spec_of(plan).recomputes == NOTHING


def whole_layers(plan) -> bool:
    """Whole-layer recompute: every layer (or the first ``checkpointed_layers``) keeps only its
    input (the built-in ``full``)."""
    return spec_of(plan).recomputes == LAYERS


def recomputes_first_layer(plan) -> bool:
    """Is layer 0 (or a module of it) recomputed at the end of the backward? Then its gradients are
    born after the recompute (``model.gradient_terms(first_layer_late=True)``) and AMP's cached weight
    copies die with the forward. "layers": unless ``checkpointed_layers=0``; "nothing": no; "part":
    what the strategy's ``recomputes_first_layer(plan)`` says (None: no)."""
    spec = spec_of(plan)
    if spec.recomputes == LAYERS:
        return plan.profile_options.checkpointed_layers != 0
    if spec.recomputes == NOTHING or spec.recomputes_first_layer is None:
        return False
    return bool(spec.recomputes_first_layer(plan))


def plain_one_device(plan) -> bool:
    """One device, full training, no technique that reshapes the backward's end (offload, the step
    in the backward, float8, another loss)."""
    o = plan.profile_options
    if plan.rank is not None or o.lora is not None or o.regime.main_grad or o.dropout:
        return False
    return not any(getattr(o, name, None) for name in ("optimizer_in_backward", "activation_offload", "offload",
                                                       "cpu_offload_optimizer", "float8", "compile")) \
        and _default_loss(o)


def _default_loss(options) -> bool:
    from .loss import chosen
    return chosen(options) is None


def whole_layer_terms(plan, placement, options=None):
    """Whole-layer recompute (torch.utils.checkpoint around each decoder layer, as HF's
    gradient_checkpointing_enable): a checkpointed layer keeps its input in the residual dtype, and
    the backward recomputes one layer at a time. ``checkpointed_layers=k`` recomputes only k layers
    (block recompute); the others keep everything. On one device, with every layer checkpointed and
    a family whose parts name their ops, the backward's end is the larger of layer 0's recomputed
    MLP backward and the embedding's backward (``checkpointing_policies.last_moments``)."""
    from . import model
    layers = placement.layers_per_stage
    blocks = plan.profile_options.checkpointed_layers
    k = layers if blocks is None else min(blocks, layers)
    terms = model.layer_terms(plan, placement, kept_layers=layers - k)
    if k != layers or not plain_one_device(plan):
        return terms
    ctx = model.context(plan, placement)
    lb = model.layer_bytes(plan, ctx)
    if not all(part.op for part in lb.parts):      # a family whose parts do not name their ops
        return terms
    # The backward's end: the larger of layer 0's recomputed MLP backward and the embedding's
    # backward, never both (checkpointing_policies.last_moments, derived op by op and measured).
    from mlsysim_core.terms import BACKWARD_END
    from ..checkpointing_policies import _autocast_copies, last_moments
    terms = [t for t in terms if tuple(t.phases) != (BACKWARD_END,)]
    return terms + [last_moments(plan, placement, ctx, lb, kept=_autocast_copies(ctx), unborn_layers=1)]
