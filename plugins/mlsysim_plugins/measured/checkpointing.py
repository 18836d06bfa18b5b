"""What the selected checkpointing strategy declares, as the measured physics asks it.

The physics never compares ``plan.activation_checkpointing`` to a name: it reads the selected
``CheckpointingSpec``'s declaration (``recomputes``: ``"nothing"``, ``"layers"`` or ``"part"``;
``recomputes_first_layer(plan)``), which ``prepare`` puts in ``plan.profile_options.checkpointing``.
A third-party strategy declaring what a built-in declares gets the built-in's bytes.

``whole_layer_terms`` is the decoder-layer accounting of a ``recomputes="layers"`` strategy (the
built-in ``full``'s), public so that a third party declaring whole-layer recompute can return it.
``recompute_module_terms`` is the ``selective`` strategy's with Megatron-Core's ``recompute_modules``.
"""

from __future__ import annotations

import attrs

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


def recompute_module_terms(plan, placement, modules):
    """Megatron-Core's selective recompute with its ``recompute_modules`` (the ``selective`` strategy's
    ``modules``): ``core_attn`` is the profile's selective recompute (the parts ``recomputed_by_selective``);
    every other module releases what the family declares (``ArchitectureFamily.megatron_recompute_modules``, per
    token, split as the layer's parts: ``parallel.rank_layer_saved``) from every layer's saved tensors, and one
    layer's worth is rebuilt in that layer's backward (``CheckpointWithoutOutput``'s recompute from a gradient
    hook, alive until the module's backward has run)."""
    from mlsysim_core.errors import NotModelledError
    from mlsysim_core.terms import ACTIVATIONS, BACKWARD, BACKWARD_END, MemoryTerm
    from . import model, parallel
    from . import term_keys as K
    from .layers import EXPERTS, LayerBytes
    from .shapes import shape_of
    others = tuple(m for m in modules if m != "core_attn")
    terms = model.layer_terms(plan, placement, selective="core_attn" in modules)
    if not others:
        return terms
    o = plan.profile_options
    given = list(modules)
    if not model.megatron(o.regime):
        raise NotModelledError("plugin_options['selective'].modules", given, "['core_attn'] under this regime",
                               "recompute modules other than core_attn are Megatron-Core's (a regime with main_grad)")
    for name in ("lora", "compile", "activation_offload"):
        if getattr(o, name, None):
            raise NotModelledError("plugin_options['selective'].modules", given, f"['core_attn'] with {name}",
                                   f"Megatron-Core's recompute modules were not derived with {name}")
    shape = shape_of(plan)
    declared = shape.family.megatron_recompute_modules
    if declared is None:
        raise NotModelledError("plugin_options['selective'].modules", given, f"['core_attn'] for family "
                               f"{shape.family.name!r}", "the family declares no Megatron-Core recompute modules "
                               "(ArchitectureFamily.megatron_recompute_modules)")
    ctx = model.context(plan, placement)
    imbalance = 1.0
    if o.moe_capacity_factor is not None:
        imbalance = o.moe_capacity_factor
    elif plan.rank is not None and ctx.experts > 1:
        from .routing import imbalance_factor      # (as model.layer_bytes scales the experts' parts)
        imbalance = imbalance_factor(plan, ctx)
    parts = tuple(attrs.evolve(p, nbytes=p.nbytes * ctx.tokens * (imbalance if p.split == EXPERTS else 1))
                  for p in declared(others, hidden=shape.hidden, ffn=shape.ffn, experts=shape.experts,
                                    top_k=shape.top_k))
    released = LayerBytes(saved=sum(p.nbytes for p in parts), output=0, output_saved_by_next=False, parts=parts)
    if plan.rank is not None:
        per_layer, _, n = parallel.rank_layer_saved(plan, ctx, released, False)
    else:
        per_layer, n = released.saved / ctx.shards, 1
    what = ", ".join(others)
    out = []
    for t in terms:
        if t.key == K.LAYERS_SAVED:
            less = ctx.layers * per_layer * n
            t = attrs.evolve(t, nbytes=t.nbytes - less,
                             formula=t.formula + f"; less what the recompute modules {what} release ({ctx.layers} "
                                                 f"layers x {per_layer:,.0f} B" + (f" x {n:g}" if n != 1 else "")
                                                 + f" = {less:,.0f} B)")
        out.append(t)
    out.append(MemoryTerm(component=ACTIVATIONS, label=f"recompute modules {what}: one layer's rebuilt in its backward",
                          nbytes=per_layer, phases=(BACKWARD, BACKWARD_END),
                          formula=f"{' + '.join(p.name for p in parts)}: {per_layer:,.0f} B (one layer)"))
    return out
