"""PyTorch FSDP (FSDP2's ``fully_shard``) as data-parallel rules: ``fsdp`` (FULL_SHARD,
``reshard_after_forward=True``: weights, gradients and optimizer state / dp, as ZeRO-3),
``fsdp-grad-op`` (SHARD_GRAD_OP, ``reshard_after_forward=False``: the same shards, but the
gathered parameters stay from the forward to the backward) and ``hsdp`` (HYBRID_SHARD:
FULL_SHARD inside a shard group of ``shard_group_size`` ranks, replicated across groups).

The shards are the same as ZeRO's; what differs is what is gathered when. The measured
profile prices that (each rule's ``measured_buffer_terms``): one layer's
all-gathered parameters and its prefetched successor, the reduce-scatter input, the
unsharded parameters SHARD_GRAD_OP keeps between forward and backward.

``fsdp-grad-op``'s option ``gradient_sync`` (``GradOpOptions``) says when the gradients are
reduce-scattered: ``"micro-batch"`` (the default: every micro-batch's backward), ``"no_sync"`` (FSDP1's
``no_sync()``: the gathered parameters and the unsharded gradients kept to the last micro-batch, so gathered once
and reduce-scattered once per step) or ``"step"``
(FSDP2's ``set_requires_gradient_sync(False)`` on every micro-batch but the last, as the Llama 3
paper's FSDP, section 3.3.2: the unsharded gradients accumulated in ``reduce_dtype`` (the paper's fp32) and
reduce-scattered once per step; the parameters still gathered for every micro-batch's forward and kept to its
backward).
"""

from typing import ClassVar

import attrs

from mlsysim_core import LayoutError, ShardingEffect, ShardingRuleSpec, hookimpl
from mlsysim_plugins.steptime_hookspecs import COLLECTIVES as STEPTIME_COLLECTIVES, Collective

from mlsysim_core.memo import memoize

from ._lazy import lazy_module
from ._deepspeed_buckets import FsdpGatherOptions, fsdp_note, fsdp_prefetch_terms

buffers = lazy_module(globals(), "buffers", "mlsysim_plugins.measured.buffers")
lora = lazy_module(globals(), "lora", "mlsysim_plugins.measured.lora")


@memoize
def effect(shards, kind):
    notes = (f"FSDP ({kind}): parameters, gradients and optimizer state sharded over {shards} ranks.",) \
        if shards > 1 else ()
    return ShardingEffect(optimizer_state_shards=shards, gradient_shards=shards, weight_shards=shards, notes=notes)


def _noted(e, rule, options):
    """The effect with the all-gather limit's note, when one is given."""
    note = fsdp_note(rule, options) if options is not None else ()
    return attrs.evolve(e, notes=e.notes + note) if note else e


# FSDP1's no_sync() (pytorch/pytorch v2.13.0, cf30153c4c131c8164ee7798e5022d810682e2cb; read in the validation venv's
# torch 2.13.0): fully_sharded_data_parallel.py lines 1033-1071, no_sync() sets every FSDP instance's _sync_gradients
# = False ("This likely results in higher memory usage because FSDP will accumulate the full model gradients (instead
# of gradient shards) until the eventual sync"). _runtime_utils.py _post_backward_hook (lines 701-790): the flat
# parameter's .grad is "the unsharded gradient for the local batch"; "if not state._sync_gradients: ... return"
# after _post_backward_reshard (line 743), so the unsharded .grad stays; _should_free_in_backward (lines 811-828)
# still frees the FULL_SHARD parameters ("state._sync_gradients or ... in RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES").
# _post_backward_final_callback (lines 1084-, 1192): "if not state._sync_gradients: ... `.grad` remains the unsharded
# gradient from prior `no_sync()` iterations": alive in the next micro-batch's forward and backward, every flat
# parameter's (every unit's). _flat_param.py prepare_gradient_for_backward (lines 1614-1677) keeps an unsharded
# .grad of the padded unsharded size, into which autograd accumulates the next micro-batch's. The synchronizing
# micro-batch's _reduce_grad (_runtime_utils.py lines 831-887, line 846): "unsharded_grad = flat_param.grad.data;
# flat_param.grad = None", reduce_scatter_single into a new shard (_get_reduce_scatter_tensors: torch.empty_like of
# one chunk), so each unit's accumulated gradient is the reduce-scatter's input and dies after its unit's hook,
# during the last backward. Its dtype: the unsharded flat parameter's, MixedPrecision's param_dtype (cast to
# reduce_dtype only there, line 764, at the sync); so the parameters' gathered dtype (buffers.gathered_bytes).
NO_SYNC = ("micro-batch", "no_sync", "step")


# Which FSDP generation's forward the rule follows (FullShardOptions.fsdp_version). Both keep the root unit (embedding,
# LM head, final norm) gathered from its forward to the backward and gather one decoder layer at a time; they differ
# in what is still gathered when the forward ends (its peak: the loss, every activation saved), measured in
# validation/fsdp_no_sync (FSDP1 and FSDP2, FULL_SHARD and HYBRID_SHARD, one rank of a fake process group, torch
# 2.13.0 CPU):
# - 1: FSDP1 (FullyShardedDataParallel). torch/distributed/fsdp/_runtime_utils.py (pytorch/pytorch v2.13.0,
#   cf30153c4c131c8164ee7798e5022d810682e2cb) _post_forward calls _post_forward_reshard, which frees every unit's
#   gathered flat parameter after its own forward ("free_unsharded_flat_param = not state._is_root and
#   handle._sharding_strategy in RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES"): only the root stays. At the forward's end
#   no decoder layer is gathered (measured: the profile's one gathered layer over by exactly that layer's bytes).
# - 2 (the default): FSDP2 (fully_shard), as the profile was derived and measured: one layer's gathered parameters
#   still alive at the forward's end (the FSDP2 runs, every phase to the byte).
# The backward and the step are the same in both (measured within 0.001 %).
FSDP_VERSIONS = (1, 2)

# How FSDP1 wraps a LoRA model (the options' lora_wrap; only with fsdp_version=1: FSDP2 shards every parameter on its
# own), measured in validation/lora_fsdp1 (docs/validation.md "LoRA under FSDP1"):
# - "adapters" (the default): peft's fsdp_auto_wrap_policy, each lora_A / lora_B linear a unit of its own beside the
#   decoder layers, what HF Trainer hands accelerate for a PEFT model (transformers 5.23.0 update_fsdp_plugin_peft).
# - "layer": the decoder layers alone (accelerate's transformer policy from _no_split_modules, a script preparing a
#   PEFT model itself). torch 2.13 _flat_param.py (pytorch/pytorch v2.13.0 cf30153c4c131c8164ee7798e5022d810682e2cb):
#   _validate_tensors_to_flatten makes the layer's FlatParameter requires_grad when any of its tensors does
#   ("flat_param_requires_grad = flat_param_requires_grad or tensor.requires_grad", mixed requires_grad permitted
#   with use_orig_params); in the forward _use_unsharded_flat_param calls _use_unsharded_views(as_params=False) ("We
#   use `Tensor` views in the forward so that they are tracked by autograd"), so every weight of the layer is a view
#   of a tensor that requires grad: the frozen base behaves as trainable inside the layer (lora_layer_wrap_terms).
LORA_WRAPS = ("adapters", "layer")


# Which of the root's own modules are fully_shard'ed as units of their own (FullShardOptions.separate_units): torchtune
# 0.6.1's custom_sharded_layers: ['tok_embeddings', 'output'] (training.shard_model with get_shard_conditions(
# names_to_match=...), torchtune/training/_distributed.py: fully_shard on every module it names, bottom-up, then on the
# model): the root unit keeps the final norm, the embedding is gathered only around its own forward and backward, the
# output projection only around the LM head's (buffers.fsdp_root, fsdp_separate_units). Measured:
# validation/compile/measure_blocks_fsdp_custom.py (the -custom runs against their twins).
SEPARATE_UNITS = ("embedding", "lm_head")


def _separate_units(value):
    """A list or tuple of SEPARATE_UNITS' names (YAML and JSON give lists): a sorted tuple, each once."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        return value        # (the validator names it)
    return tuple(sorted(set(value), key=lambda v: (SEPARATE_UNITS.index(v) if v in SEPARATE_UNITS else 99, str(v))))


def _check_separate_units(instance, attribute, value):
    if not isinstance(value, tuple) or any(v not in SEPARATE_UNITS for v in value):
        from mlsysim_core.errors import InvalidInputError
        raise InvalidInputError(f"plugin_options['{instance.rule}'].separate_units", value,
                                f"a list of {', '.join(map(repr, SEPARATE_UNITS))} (the root's modules fully_shard'ed "
                                "as units of their own: torchtune's custom_sharded_layers tok_embeddings, output)")
    if value and getattr(instance, "fsdp_version", 2) != 2:
        from mlsysim_core.errors import InvalidInputError
        raise InvalidInputError(f"plugin_options['{instance.rule}'].separate_units", value,
                                "() unless fsdp_version=2 (measured with FSDP2's fully_shard, torchtune's shard_model)")


@attrs.frozen(kw_only=True)
class FullShardOptions(FsdpGatherOptions):
    """``gradient_sync``: when FULL_SHARD reduce-scatters the gradients under gradient accumulation:
    ``"micro-batch"`` (every micro-batch's backward, the default), ``"no_sync"`` (FSDP1's ``no_sync()`` on every
    micro-batch but the last: each rank keeps its unsharded gradients, in ``param_dtype``, from the first backward
    to the last) or ``"step"`` (FSDP2's ``set_requires_gradient_sync(False)``: the same, in ``reduce_dtype``).
    ``fsdp_version``: whose forward the rule follows (the comment above FSDP_VERSIONS): ``2`` (FSDP2's
    ``fully_shard``, the default: one layer's gathered parameters alive at the forward's end) or ``1`` (FSDP1's
    ``FullyShardedDataParallel``: every unit but the root freed after its forward, none at the forward's end).
    ``lora_wrap``: how FSDP1 wraps a LoRA model (the comment above LORA_WRAPS): ``"adapters"`` (peft's
    ``fsdp_auto_wrap_policy``, the default) or ``"layer"`` (the decoder layers alone; ``fsdp_version=1`` only).
    ``separate_units`` (FSDP2): the root's modules ``fully_shard``'ed as units of their own (the comment above
    SEPARATE_UNITS): ``()`` (the default: embedding, LM head and final norm one root unit), ``("embedding",
    "lm_head")`` (torchtune's ``custom_sharded_layers: ['tok_embeddings', 'output']``), or either alone.
    And FSDP's all-gather limits (``FsdpGatherOptions``: ``prefetch_layers``, ``limit_all_gathers``)."""

    gradient_sync: str = attrs.field(default="micro-batch", validator=attrs.validators.in_(NO_SYNC))
    fsdp_version: int = attrs.field(default=2, validator=attrs.validators.in_(FSDP_VERSIONS))
    lora_wrap: str = attrs.field(default="adapters", validator=attrs.validators.in_(LORA_WRAPS))
    # FSDP2's root given reshard_after_forward=True itself (the comment above full_shard_buffers): torchtune's shard_model
    root_reshard_after_forward: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    separate_units: tuple[str, ...] = attrs.field(default=(), converter=_separate_units,
                                                 validator=_check_separate_units)
    rule: ClassVar[str] = "fsdp"       # the rule these options are given to (its name in messages)


@attrs.frozen(kw_only=True)
class HybridOptions(FullShardOptions):
    """``shard_group_size``: ranks that shard the model states among themselves (FSDP's
    intra-node group); ``None``: the devices of one node (``hardware.devices_per_node``,
    else 8), capped at the data-parallel size. And FULL_SHARD's (``FullShardOptions``): ``gradient_sync``
    (HYBRID_SHARD frees its parameters after the forward and the backward as FULL_SHARD does, and under
    ``no_sync()`` keeps the unsharded gradients the same way: _should_free_in_backward and _post_backward_hook,
    the comment above NO_SYNC; measured in validation/fsdp_no_sync, the hsdp runs), ``prefetch_layers``,
    ``limit_all_gathers``."""

    shard_group_size: int | None = attrs.field(
        default=None, validator=attrs.validators.optional([attrs.validators.instance_of(int),
                                                           attrs.validators.ge(1)]))
    rule: ClassVar[str] = "hsdp"


def _unsynced(plan, options) -> bool:
    """FULL_SHARD accumulating unsharded gradients over more than one micro-batch."""
    return (getattr(options, "gradient_sync", "micro-batch") != "micro-batch"
            and plan.gradient_accumulation_steps > 1)


def _check_layer_wrap(plan, options):
    """``lora_wrap="layer"`` where it was measured (validation/lora_fsdp1): FSDP1 (``fsdp_version=1``; FSDP2 has no
    flat parameter), plain LoRA on every linear of a Llama-style layer (a frozen linear's input would be saved for its
    weight's gradient too, not measured), no recomputation, no tensor or pipeline split."""
    if getattr(options, "lora_wrap", "adapters") != "layer":
        return
    from mlsysim_core.errors import InvalidInputError, NotModelledError
    where = f"plugin_options['{options.rule}'].lora_wrap"
    if options.fsdp_version != 1:
        raise InvalidInputError(where, "layer", "'adapters' unless fsdp_version=1 (FSDP2 shards each parameter on its "
                                "own: there is no flat parameter to share)")
    config = getattr(plan.profile_options, "lora", None)
    if config is None:
        return
    why = "lora_wrap='layer' is measured for plain LoRA on every linear of a Llama-style decoder layer, without " \
          "recomputation, tensor or pipeline parallelism (validation/lora_fsdp1)"
    from .measured.lora import _adapted
    from .measured.shapes import shape_of
    family = shape_of(plan).family
    strategy = getattr(plan.profile_options, "checkpointing", None)
    # every linear adapted: the adapted linears' weights are the whole layer's matrices
    every = sum(i * o for i, o in _adapted(plan).values()) == buffers.layer_parameters(plan)
    if (config.quantization or config.use_dora or config.modules_to_save or config.dropout
            or plan.tp_size != 1 or plan.pp_size != 1 or family.sparse or not family.gated_mlp
            or (strategy is not None and strategy.recomputes != "nothing") or not every):
        raise NotModelledError(where, "layer", "'adapters' (peft's fsdp_auto_wrap_policy)", why)


def full(plan, options):
    _check_layer_wrap(plan, options)
    return _fsdp1_lora_noted(_unsynced_noted(_noted(effect(plan.dp_size * plan.cp_size, "FULL_SHARD"), "fsdp",
                                                    options), plan, options, "FULL_SHARD"), plan, options)


def _fsdp1_lora_noted(e, plan, options):
    """LoRA under FSDP1 (``fsdp_version=1``), sharded: says which wrapping is priced. Measured in validation/lora_fsdp1
    (docs/validation.md "LoRA under FSDP1"): peft's fsdp_auto_wrap_policy, each adapter a unit of its own (what HF
    Trainer hands accelerate for a PEFT model), within 0.19 %; the decoder layers alone (accelerate's own
    transformer policy outside the Trainer) put the frozen base in a requires_grad flat parameter and hold more:
    ``lora_wrap="layer"`` (lora_layer_wrap_terms)."""
    if (getattr(options, "fsdp_version", 2) != 1 or e.weight_shards == 1
            or getattr(plan.profile_options, "lora", None) is None):
        return e
    if options.lora_wrap == "layer":
        return attrs.evolve(e, notes=e.notes + (
            "LoRA under FSDP1 with lora_wrap='layer': the adapters share their decoder layer's requires_grad flat "
            "parameter, so the frozen base's gradients are computed and kept as the flat parameter's (which rank "
            "holds more of the adapters is not modelled: an even split).",))
    return attrs.evolve(e, notes=e.notes + (
        "LoRA under FSDP1: priced with the adapters wrapped apart from the base (peft's fsdp_auto_wrap_policy, as HF "
        "Trainer sets it); the decoder layers wrapped alone (accelerate's own policy outside the Trainer) put the "
        "frozen base in a requires_grad flat parameter: lora_wrap='layer' prices that (docs/validation.md, 'LoRA "
        "under FSDP1').",))


def _unsynced_noted(e, plan, options, kind):
    """The effect with gradient_sync's note, when it acts."""
    if _unsynced(plan, options) and e.weight_shards > 1:
        how = ("FSDP1 no_sync(): in param_dtype" if options.gradient_sync == "no_sync"
               else "FSDP2 set_requires_gradient_sync(False): in reduce_dtype")
        return attrs.evolve(e, notes=e.notes + (
            f"FSDP ({kind}), gradient_sync={options.gradient_sync!r}: every rank keeps its unsharded gradients "
            f"({how}) over the {plan.gradient_accumulation_steps} micro-batches, reduce-scattered in the last "
            "micro-batch's backward."
            + (" Under LoRA the adapters' unsharded gradients are approximated (in their gradient dtype; not "
               "measured)." if getattr(plan.profile_options, "lora", None) is not None
               and options.gradient_sync == "step" else ""),))
    return e


# Gradient accumulation without communication, as FSDP2 runs it (pytorch/pytorch torch/distributed/fsdp/_fully_shard at
# v2.13.0, cf30153c4c131c8164ee7798e5022d810682e2cb): _fully_shard.py set_requires_gradient_sync(False) sets each
# group's "reduce_grads = requires_gradient_sync"; _fsdp_param_group.py post_backward, "if not self.reduce_grads:
# if self.reshard_after_backward: self.reshard()" then "fsdp_param.to_accumulated_grad_if_needed()" and no
# reduce-scatter; _fsdp_param.py to_accumulated_grad_if_needed keeps "self.unsharded_accumulated_grad =
# unsharded_grad.to(self.reduce_dtype)" and accumulate_unsharded_grad_if_needed adds each later micro-batch's into
# it: an unsharded gradient of every parameter the rank holds (its tp x pp split), in reduce_dtype, from the first
# micro-batch's backward until the last micro-batch's post_backward reduce-scatters it ("if
# fsdp_param.unsharded_accumulated_grad is not None: ... unsharded_grads.append(...
# unsharded_accumulated_grad_data)") and drops it ("unsharded_accumulated_grad = None"); without a reduce_dtype
# (or one equal to the gradient's) to_accumulated_grad_if_needed returns early and the unsharded parameter's own .grad
# accumulates, in its dtype: either way the regime's reduce bytes (Regime.reduce, else its gradient's), as FULL_SHARD's
# "step" (unsynced_gradients). The rank's gradient shard exists only after that reduce-scatter, so the forward and
# backward hold the unsharded gradient less the shard the gradient terms count (measured: validation/fsdp_no_sync's
# gradop2 runs, FSDP2 reshard_after_forward=False, fp32 and bf16: what 4 micro-batches add over 1 to the byte; priced
# before at a fixed 4 B plus the shard, +4.2 % (fp32) and +15.8 % (bf16) over). The Llama 3 paper (arXiv 2407.21783,
# section 3.3.2, 'Numerical stability'): "we use FP32 gradient accumulation during backward computation over multiple
# micro-batches and also reduce-scatter gradients in FP32 across data parallel workers in FSDP": reduce_dtype float32
# (the regime's reduce, e.g. fsdp-bf16's 4 B).
# FSDP1's SHARD_GRAD_OP under no_sync() (the comment above NO_SYNC for the source): _should_free_in_backward is
# "state._sync_gradients or handle._sharding_strategy in RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", False for
# SHARD_GRAD_OP inside no_sync(), so the gathered parameters kept from the forward stay after the backward too, into
# the next micro-batch's forward (nothing gathered again) and backward, until the synchronizing micro-batch's
# backward frees them unit by unit; the unsharded gradients are kept as FULL_SHARD's (in param_dtype). Measured in
# validation/fsdp_no_sync (the gradop1 runs).
GRADIENT_SYNC = ("micro-batch", "no_sync", "step")


@attrs.frozen(kw_only=True)
class GradOpOptions:
    """``gradient_sync``: when SHARD_GRAD_OP reduce-scatters the gradients: ``"micro-batch"`` (every
    micro-batch's backward), ``"no_sync"`` (FSDP1's ``no_sync()`` on every micro-batch but the last: the unsharded
    gradients in ``param_dtype`` and the gathered parameters kept from the first forward to the last backward; the
    comment above GRADIENT_SYNC) or ``"step"`` (FSDP2's ``set_requires_gradient_sync`` only on the last
    micro-batch: the unsharded gradients accumulated in ``reduce_dtype`` over the micro-batches, reduce-scattered
    once per step; the Llama 3 paper's FSDP, in fp32: the comment above GRADIENT_SYNC's)."""

    gradient_sync: str = attrs.field(default="micro-batch", validator=attrs.validators.in_(GRADIENT_SYNC))
    # which FSDP generation runs it: under SHARD_GRAD_OP both keep every gathered unit from its forward to its
    # backward (the same bytes); 1 (FSDP1) matters under LoRA with a MixedPrecision param_dtype (the adapters'
    # input copies, lora.fsdp1_adapter_input_cast)
    fsdp_version: int = attrs.field(default=2, validator=attrs.validators.in_(FSDP_VERSIONS))
    lora_wrap: str = attrs.field(default="adapters", validator=attrs.validators.in_(LORA_WRAPS))
    rule: ClassVar[str] = "fsdp-grad-op"


def _per_step(plan, options) -> bool:
    """Gradients accumulated unsharded over more than one micro-batch (``gradient_sync="step"``)."""
    return options is not None and options.gradient_sync == "step" and plan.gradient_accumulation_steps > 1


def _grad_op_no_sync(plan, options) -> bool:
    """FSDP1's SHARD_GRAD_OP accumulating under ``no_sync()`` over more than one micro-batch."""
    return options is not None and options.gradient_sync == "no_sync" and plan.gradient_accumulation_steps > 1


def grad_op(plan, options):
    if options is not None:
        _check_layer_wrap(plan, options)
    e = effect(plan.dp_size * plan.cp_size, "SHARD_GRAD_OP")
    if (_per_step(plan, options) or _grad_op_no_sync(plan, options)) and e.weight_shards > 1:
        e = _unsynced_noted(e, plan, options, "SHARD_GRAD_OP")
    return _fsdp1_lora_noted(e, plan, options)


def shard_group(plan, options) -> int:
    d = plan.dp_size * plan.cp_size
    if options.shard_group_size is not None:
        g = options.shard_group_size
        if d % g:
            raise LayoutError("plugin_options['hsdp'].shard_group_size", g,
                              f"a divisor of the data-parallel size dp x cp = {d}")
        return g
    g = min(d, plan.hardware.devices_per_node or 8)
    while d % g:
        g -= 1
    return g


def hybrid(plan, options):
    return _unsynced_noted(_noted(effect(shard_group(plan, options), "HYBRID_SHARD"), "hsdp", options), plan,
                           options, "HYBRID_SHARD")


def full_shard_buffers(plan, placement, options):
    """Measured grade: the root group stays gathered; each layer is gathered and its
    gradients reduce-scattered, one at a time; with an all-gather limit given (``prefetch_layers``,
    ``limit_all_gathers``), the layers gathered ahead of it too.

    ``root_reshard_after_forward`` (FSDP2): the root's ``fully_shard`` given ``reshard_after_forward=True`` itself, as
    torchtune 0.6.1's ``training.shard_model`` passes it to every ``fully_shard`` (torchtune/training/_distributed.py)
    where torchtitan leaves the root's out: torch 2.13 _fully_shard.py keeps the root gathered after its forward only
    when the argument is not given (``auto_reshard_after_forward = reshard_after_forward is None``, and
    _fsdp_state.py ``if self._auto_reshard_after_forward: ... post_forward_mesh_info = None``), so the root group and
    the last gathered layer are freed when the model's forward returns (before the loss, which the recipe computes
    outside the model) and gathered again for the backward. Measured: validation/qlora_fsdp2 (nothing gathered at
    the forward's end)."""
    layer = buffers.layer_gather(plan, placement)
    root = buffers.fsdp_root(plan, placement) + buffers.fsdp_separate_units(plan, placement)
    if getattr(options, "fsdp_version", 2) == 1:
        layer = [_freed_after_forward(t) for t in layer]
    elif getattr(options, "root_reshard_after_forward", False):
        layer = [_freed_after_forward(t, "root_reshard_after_forward=True: the root resharded after the model's "
                                         "forward too (torchtune's shard_model)") for t in layer]
        root = [_freed_after_forward(t, "root_reshard_after_forward=True: freed when the model's forward returns, "
                                        "gathered again for the backward") for t in root]
    terms = root + layer
    if options is not None and placement.weight_shards > 1:
        terms = terms + fsdp_prefetch_terms(options, buffers.layer_parameters(plan, placement),
                                            placement.layers_per_stage, buffers.gathered_bytes(plan))
    if _unsynced(plan, options) and placement.weight_shards > 1:
        terms = terms + unsynced_gradients(plan, placement, options.gradient_sync, options.rule)
    if getattr(options, "fsdp_version", 2) == 2:     # FSDP2 around eager checkpointed layers (compiled: compile.py's)
        terms = terms + buffers.fsdp2_eager_checkpointed(plan, placement)
    return terms + lora_layer_wrap_terms(plan, placement, options)


def layer_wrapped(plan, options) -> bool:
    """LoRA under FSDP1 with ``lora_wrap="layer"``: the adapters in their decoder layer's flat parameter."""
    return getattr(options, "lora_wrap", "adapters") == "layer" and getattr(plan.profile_options, "lora", None) is not None


def lora_layer_wrap_terms(plan, placement, options):
    """``lora_wrap="layer"`` (the comment above LORA_WRAPS): what the frozen base adds once it sits in a requires_grad
    flat parameter, measured in validation/lora_fsdp1 (the ``layer`` runs, by hand over gqa-tiny's 692,736 frozen
    parameters a layer, 2 ranks):
    - the norms' inputs, saved for their weights' gradients (``weight * hidden.to(input_dtype)``): 2 x h a token a
      layer in the residual stream's dtype (fp32: +4,194,304 B), in the forward and backward;
    - the backward's gradient of the whole flat parameter: the reduce-scatter input holds the layer's frozen
      parameters too, in param_dtype (_post_backward_hook's ``flat_param.grad``), at the backward's end;
    - its reduced shard, the flat parameter's dtype (``_cast_grad_to_param_dtype``), kept as ``flat_param.grad``
      for every layer until the next forward's root pre-forward (``_reset_flat_param_grad_info_if_needed``, after
      ``zero_grad(set_to_none=True)``): the frozen parameters / shards x their stored bytes, at the backward's end
      and the step (+5,541,888 B in fp32);
    - under no_sync(), every layer's whole unsharded flat gradient (``_use_unsharded_grad_views``), its frozen part
      in param_dtype in the forward and backward (+11,083,776 B in fp32).
    Not modelled (said, not priced): which rank holds more of the adapters (each layer's flat parameter is split in
    registration order: rank 0 held 41,728 of a layer's 71,936 adapter parameters, its optimizer state 184,256 B
    above an even split)."""
    # (a rule's measured.buffer_terms are communication buffers by contract: each term's label says what it holds)
    from mlsysim_core import BACKWARD, BACKWARD_END, COMMUNICATION_BUFFERS, FORWARD, OPTIMIZER_STEP, MemoryTerm
    if not layer_wrapped(plan, options) or placement.weight_shards == 1:
        return []
    from .measured.shapes import shape_of
    regime = plan.profile_options.regime
    shape = shape_of(plan)
    layers, shards = placement.layers_per_stage, placement.weight_shards
    root = shape.embedding_parameters * (1 if shape.tied else 2) + shape.hidden
    frozen = (plan.model.parameters - root) / plan.model.layers         # one layer's frozen parameters, norms too
    norms = frozen - buffers.layer_parameters(plan, placement)           # the layer's non-matrix (norm) weights
    stored = lora.base_weight_bytes(regime)
    gathered = lora.frozen_gather_bytes(plan)
    tokens = plan.microbatch * plan.seq_len
    terms = [
        MemoryTerm(component=COMMUNICATION_BUFFERS, label="norms' inputs saved for the layer flat parameter's gradient",
                   nbytes=layers * tokens * norms * regime.residual, phases=(FORWARD, BACKWARD),
                   formula=f"{layers} layers x {tokens:,} tokens x {norms:,.0f} norm weights x {regime.residual} B "
                           "(lora_wrap='layer': the frozen norm weights are views of a requires_grad flat parameter)"),
        MemoryTerm(component=COMMUNICATION_BUFFERS, label="reduce-scatter input: the layer's frozen parameters' part",
                   nbytes=frozen * gathered, phases=(BACKWARD_END,),
                   formula=f"{frozen:,.0f} frozen params of one layer x {gathered} B (lora_wrap='layer': the gradient of "
                           "the whole flat parameter)"),
        MemoryTerm(component=COMMUNICATION_BUFFERS, label="sharded flat gradients: the frozen parameters' part",
                   nbytes=layers * frozen / shards * stored, phases=(BACKWARD_END, OPTIMIZER_STEP),
                   formula=f"{layers} layers x {frozen:,.0f} frozen params / {shards} x {stored} B (lora_wrap='layer': "
                           "kept as flat_param.grad until the next forward)")]
    if _unsynced(plan, options) and options.gradient_sync == "no_sync":
        terms.append(MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="FSDP's unsharded flat gradients accumulated over micro-batches: "
            "the frozen parameters' part", nbytes=layers * frozen * gathered, phases=(FORWARD, BACKWARD),
            formula=f"{layers} layers x {frozen:,.0f} frozen params x {gathered} B (lora_wrap='layer', FSDP1 "
                    "no_sync(): param_dtype)"))
    return terms


def _freed_after_forward(term, why="fsdp_version=1: backward only, FSDP1 frees every unit but the root after its "
                                   "forward (_post_forward_reshard)"):
    """FSDP1's forward: the gathered layer is freed after its own forward (the comment above FSDP_VERSIONS), so not
    alive at the forward's end (the forward phase); the backward gathers it again. (FSDP2 with the root resharded
    too: ``full_shard_buffers``.)"""
    from mlsysim_core import FORWARD
    if FORWARD not in term.phases:
        return term
    return attrs.evolve(term, phases=tuple(p for p in term.phases if p != FORWARD), formula=term.formula + "; " + why)


def unsynced_gradients(plan, placement, how, rule="fsdp"):
    """FULL_SHARD's unsharded gradients under ``no_sync()`` / ``set_requires_gradient_sync(False)`` (the comment
    above NO_SYNC): every trainable parameter the rank holds before data-parallel sharding, alive in the forward
    and backward of every micro-batch after the first, and reduce-scattered unit by unit in the last backward (by
    its end only the shards remain). The gradient terms count the rank's shard alive throughout, as accumulation
    counts it; under no_sync the shard is born only at that reduce-scatter, so what the forward and backward
    hold beyond the counted shard is the unsharded gradient less the shard: ``params x b - params / shards x g``
    (b: the accumulation's bytes, g: the shard's, ``regime.gradient``)."""
    from mlsysim_core import BACKWARD, COMMUNICATION_BUFFERS, FORWARD, GRADIENTS, MemoryTerm, NotModelledError
    regime = plan.profile_options.regime
    if regime.main_grad and not regime.gradient:
        raise NotModelledError(f"plugin_options['{rule}'].gradient_sync", how,
                               f"'micro-batch' under the {regime.name} regime (its gradients go to an fp32 main-grad "
                               "buffer, which FSDP's no_sync does not keep)")
    shards = placement.gradient_shards
    api = "FSDP1 no_sync(): param_dtype" if how == "no_sync" else "FSDP2 set_requires_gradient_sync(False): reduce_dtype"
    if plan.profile_options.lora is not None:
        shard = sum(t.nbytes for t in lora.gradient_terms(plan, placement) if t.component == GRADIENTS)
        if how == "no_sync":
            return lora_no_sync_gradients(plan, placement, shard)
        # FSDP2's set_requires_gradient_sync(False): the adapters' unsharded gradients, in their gradient dtype, are
        # the shards the LoRA gradient terms count x the shards (approximated: not measured under LoRA).
        return [MemoryTerm(component=COMMUNICATION_BUFFERS,
                           label="FSDP's unsharded LoRA adapter gradients accumulated over micro-batches, less the "
                                 "shard (approximated)",
                           nbytes=shard * (shards - 1), phases=(FORWARD, BACKWARD),
                           formula=f"the adapters' gradient shard {shard:,.0f} B x ({shards} - 1) ({api}; the "
                                   "adapters' own gradient dtype assumed, not measured)")]
    b = buffers.gathered_bytes(plan) if how == "no_sync" else (regime.reduce or regime.gradient)
    params = placement.trainable_parameters_per_rank
    shard = params / shards * regime.gradient
    return [MemoryTerm(component=COMMUNICATION_BUFFERS,
                       label=f"FSDP's unsharded gradients accumulated over micro-batches ({b} B), less the shard",
                       nbytes=params * b - shard, phases=(FORWARD, BACKWARD),
                       formula=f"{params:,.0f} params x {b} B ({api}; reduce-scattered in the last micro-batch's "
                               f"backward) - the rank's shard {params / shards:,.0f} x {regime.gradient} B, counted "
                               "with the gradients")]


def lora_no_sync_gradients(plan, placement, shard):
    """FSDP1's no_sync() under LoRA (measured: validation/lora_fsdp1, peft's fsdp_auto_wrap_policy, FULL_SHARD and
    SHARD_GRAD_OP, fp32 and accelerate's bf16 MixedPrecision: what 2 micro-batches add over 1, to the byte). Each
    adapter's flat parameter keeps its unsharded ``.grad`` in the unsharded flat parameter's dtype, MixedPrecision's
    param_dtype (_post_backward_hook returns before the cast to reduce_dtype, the comment above NO_SYNC): every
    adapter parameter of the rank before sharding x the adapters' gathered bytes, less the shard the LoRA gradient
    terms count alive under accumulation (born only at the synchronizing reduce-scatter). In fp32 that is the
    shard x (shards - 1); under a 2-byte param_dtype over fp32 adapters the unsharded bf16 gradient is no larger
    than the fp32 shard counted (2 ranks: 0 B more; priced before as fp32 shards x (shards - 1), +575,488 B)."""
    from mlsysim_core import BACKWARD, COMMUNICATION_BUFFERS, FORWARD, MemoryTerm
    regime = plan.profile_options.regime
    b = regime.gather or regime.weight      # the adapters' gathered (param_dtype) bytes, lora.Walk's ab
    adapters = placement.trainable_parameters_per_rank
    # offloaded gradients (CPUOffload(offload_params=True)): the shard lives on the host, the unsharded gradient of
    # no_sync() on the device (_post_backward_hook returns before the offload), so nothing of it is counted there
    offloaded = "gradients" in dict(plan.profile_options.offload or ())
    less = 0 if offloaded else shard
    return [MemoryTerm(component=COMMUNICATION_BUFFERS,
                       label="FSDP's unsharded LoRA adapter gradients accumulated over micro-batches, less the shard",
                       nbytes=max(adapters * b - less, 0), phases=(FORWARD, BACKWARD),
                       formula=f"{adapters:,.0f} adapter params x {b} B (FSDP1 no_sync(): the unsharded flat "
                               "parameters' param_dtype)" + (" (the shard offloaded to the host: none subtracted)"
                               if offloaded else f" - the rank's shard {shard:,.0f} B, counted with the gradients"))]


def grad_op_buffers(plan, placement, options):
    """Measured grade: every gathered layer stays from its forward to its backward; with
    ``gradient_sync="no_sync"`` or ``"step"`` and more than one micro-batch, the unsharded gradients accumulated
    over them, less the shard the gradient terms count (``unsynced_gradients``: in param_dtype under FSDP1's
    no_sync(), in reduce_dtype under FSDP2's set_requires_gradient_sync(False); the comments above GRADIENT_SYNC
    and GradOpOptions)."""
    terms = buffers.kept_unsharded(plan, placement)
    if (_per_step(plan, options) or _grad_op_no_sync(plan, options)) and placement.weight_shards > 1:
        if options.gradient_sync == "step" and plan.profile_options.lora is not None:
            from mlsysim_core import NotModelledError
            raise NotModelledError("plugin_options['fsdp-grad-op'].gradient_sync", "step",
                                   "'micro-batch' with LoRA (the adapters' accumulated gradients under FSDP2's "
                                   "SHARD_GRAD_OP are not modelled)")
        terms = terms + unsynced_gradients(plan, placement, options.gradient_sync, "fsdp-grad-op")
    return terms + lora_layer_wrap_terms(plan, placement, options)


def _gather(group, per, overlaps, **more):
    # an all-gather moves the parameters (in the regime's gather dtype), a reduction their gradients
    volume = "parameters" if more.get("kind") == "all-gather" else "gradients"
    return Collective(volume=volume, group=group, per=per, overlaps=overlaps, **{overlaps: 1}, **more)


# What each rule communicates, declared for the step time (per micro-batch, each hidden behind the
# compute it overlaps): FULL_SHARD gathers a layer's parameters for the forward (the first layer's
# not hidden) and again for the backward, and reduce-scatters its gradients; SHARD_GRAD_OP gathers
# once (kept to the backward); HYBRID_SHARD does FULL_SHARD's inside a node and all-reduces the
# reduced shard across the nodes once per step.
FULL_SHARD = (_gather("dp", "micro-batch", "forward", kind="all-gather", first_layer_exposed=True),
              _gather("dp", "micro-batch", "backward", kind="all-gather"),
              _gather("dp", "micro-batch", "backward", kind="reduce-scatter"))
SHARD_GRAD_OP = (_gather("dp", "micro-batch", "forward", kind="all-gather", first_layer_exposed=True),
                 _gather("dp", "micro-batch", "backward", kind="reduce-scatter"))
HYBRID_SHARD = (*(attrs.evolve(c, group="dp-node") for c in FULL_SHARD),
                _gather("dp-across", "step", "backward", kind="all-reduce", shard="dp-node", in_network=False))
# fsdp's and hsdp's gradient_sync="no_sync"/"step" (the comment above NO_SYNC, and FSDP2's above
# GRADIENT_SYNC): the gradients reduce-scattered once per step, in the last micro-batch's backward, hidden
# with its all-gathers (last_micro_batch: a run without accumulation is timed as under "micro-batch"); in the
# regime's reduce dtype, the "gradients" volume's (FSDP1 casts the accumulated param_dtype gradient
# "flat_param.grad.to(handle._reduce_dtype)" in _post_backward_hook before _reduce_grad; FSDP2 accumulates in
# reduce_dtype). The parameters are still freed after each backward (FSDP1's _should_free_in_backward for FULL_SHARD
# and HYBRID_SHARD; FSDP2's reshard_after_backward, which set_requires_gradient_sync leaves True), so gathered
# again every micro-batch. HYBRID_SHARD's all-reduce follows the reduce-scatter (_reduce_grad), already once a step.
FULL_SHARD_PER_STEP = (*FULL_SHARD[:2], attrs.evolve(FULL_SHARD[2], per="step", last_micro_batch=True))
HYBRID_SHARD_PER_STEP = (*HYBRID_SHARD[:2], attrs.evolve(HYBRID_SHARD[2], per="step", last_micro_batch=True),
                         *HYBRID_SHARD[3:])


def full_shard_collectives(options):
    return FULL_SHARD if options.gradient_sync == "micro-batch" else FULL_SHARD_PER_STEP


def hybrid_collectives(options):
    return HYBRID_SHARD if options.gradient_sync == "micro-batch" else HYBRID_SHARD_PER_STEP


# fsdp-grad-op's gradient_sync="step" (FSDP2, the comment above GRADIENT_SYNC): the parameters gathered for every
# micro-batch's forward (kept to its backward; reshard_after_backward, which set_requires_gradient_sync leaves True,
# frees them after it), the gradients reduce-scattered once per step in the last micro-batch's backward
# (last_micro_batch), in the regime's reduce dtype (the "gradients" volume's; FSDP2 accumulates in reduce_dtype: the
# Llama 3 paper's fp32 is a regime reducing in 4 B).
SHARD_GRAD_OP_PER_STEP = (SHARD_GRAD_OP[0], attrs.evolve(SHARD_GRAD_OP[1], per="step", last_micro_batch=True))
# gradient_sync="no_sync" (FSDP1, the comment above GRADIENT_SYNC): the gathered parameters stay from the first
# micro-batch's forward to the last one's backward, so the later forwards gather nothing: FlatParamHandle.unshard
# (torch/distributed/fsdp/_flat_param.py, pytorch/pytorch v2.13.0 cf30153c4c131c8164ee7798e5022d810682e2cb, lines
# 1359-1393) all-gathers only "if not self.needs_unshard()" is False, needs_unshard being "not already_unsharded"
# (the padded unsharded flat parameter's storage still allocated). One all-gather per step, behind the first
# micro-batch's forward (its first layer's share exposed; no other data-parallel call beside it: per="step",
# hidden on its own), and one reduce-scatter, in the last micro-batch's backward, of the param_dtype gradients cast
# to reduce_dtype (_post_backward_hook, the comment above FULL_SHARD_PER_STEP). Without accumulation the same
# seconds as "micro-batch"'s (summed in another order: equal to within a rounding, not to the bit).
SHARD_GRAD_OP_NO_SYNC = (attrs.evolve(SHARD_GRAD_OP[0], per="step"),
                         attrs.evolve(SHARD_GRAD_OP[1], per="step", last_micro_batch=True))


def grad_op_collectives(options):
    how = "micro-batch" if options is None else options.gradient_sync
    return {"step": SHARD_GRAD_OP_PER_STEP, "no_sync": SHARD_GRAD_OP_NO_SYNC}.get(how, SHARD_GRAD_OP)


# What the measured profile's regimes may ask of the rule (measured/regimes.py, Regime.requires): FSDP's mixed
# precision, the shards kept as stored and each unit all-gathered cast to the policy's param_dtype (buffers.py's
# gathered bytes, the regime's ``gather``).
MEASURED_PROVIDES = ("fsdp-mixed-precision",)


@hookimpl
def mlsysim_sharding_rules():
    return [
        ShardingRuleSpec(name="fsdp", axis="dp", apply=full, options_type=FullShardOptions,
                         extensions={"measured.buffer_terms": full_shard_buffers, "explain.label": "FSDP (FULL_SHARD)",
                                     "measured.provides": MEASURED_PROVIDES,
                                     "explain.shards": ("optimizer_state", "gradients", "weights"),
                                     "search.unsharded_at_one_rank": True,
                                     STEPTIME_COLLECTIVES: full_shard_collectives},
                         description="FSDP FULL_SHARD: weights, gradients, optimizer state / dp; layers gathered one "
                                     "at a time"),
        ShardingRuleSpec(name="fsdp-grad-op", axis="dp", apply=grad_op, options_type=GradOpOptions,
                         extensions={"measured.buffer_terms": grad_op_buffers, "explain.label": "FSDP (SHARD_GRAD_OP)",
                                     "measured.provides": MEASURED_PROVIDES,
                                     "explain.shards": ("optimizer_state", "gradients", "weights"),
                                     "search.unsharded_at_one_rank": True,
                                     STEPTIME_COLLECTIVES: grad_op_collectives},
                         description="FSDP SHARD_GRAD_OP: as fsdp, gathered parameters kept from forward to backward"),
        ShardingRuleSpec(name="hsdp", axis="dp", apply=hybrid, options_type=HybridOptions,
                         extensions={"measured.buffer_terms": full_shard_buffers, "measured.provides": MEASURED_PROVIDES,
                                     "search.unsharded_at_one_rank": True,
                                     STEPTIME_COLLECTIVES: hybrid_collectives},
                         description="FSDP HYBRID_SHARD: fsdp inside a shard group (one node), replicated across"),
    ]
