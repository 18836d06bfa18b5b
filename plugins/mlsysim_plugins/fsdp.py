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
reduce-scattered: ``"micro-batch"`` (the default: every micro-batch's backward) or ``"step"``
(FSDP2's ``set_requires_gradient_sync(False)`` on every micro-batch but the last, as the Llama 3
paper's FSDP, section 3.3.2: the unsharded gradients accumulated in fp32 and reduce-scattered in
fp32 once per step; the parameters still gathered for every micro-batch's forward and kept to its
backward).
"""

import attrs

from mlsysim_core import LayoutError, ShardingEffect, ShardingRuleSpec, hookimpl
from mlsysim_plugins.steptime_hookspecs import COLLECTIVES as STEPTIME_COLLECTIVES, Collective

from mlsysim_core.memo import memoize

from ._lazy import lazy_module
from ._deepspeed_buckets import FsdpGatherOptions, fsdp_note, fsdp_prefetch_terms

buffers = lazy_module(globals(), "buffers", "mlsysim_plugins.measured.buffers")


@attrs.frozen(kw_only=True)
class HybridOptions(FsdpGatherOptions):
    """``shard_group_size``: ranks that shard the model states among themselves (FSDP's
    intra-node group); ``None``: the devices of one node (``hardware.devices_per_node``,
    else 8), capped at the data-parallel size. And FSDP's all-gather limits
    (``FsdpGatherOptions``: ``prefetch_layers``, ``limit_all_gathers``)."""

    shard_group_size: int | None = attrs.field(
        default=None, validator=attrs.validators.optional([attrs.validators.instance_of(int),
                                                           attrs.validators.ge(1)]))


@memoize
def effect(shards, kind):
    notes = (f"FSDP ({kind}): parameters, gradients and optimizer state sharded over {shards} ranks.",) \
        if shards > 1 else ()
    return ShardingEffect(optimizer_state_shards=shards, gradient_shards=shards, weight_shards=shards, notes=notes)


def _noted(e, rule, options):
    """The effect with the all-gather limit's note, when one is given."""
    note = fsdp_note(rule, options) if options is not None else ()
    return attrs.evolve(e, notes=e.notes + note) if note else e


def full(plan, options):
    return _noted(effect(plan.dp_size * plan.cp_size, "FULL_SHARD"), "fsdp", options)


# Gradient accumulation without communication, as FSDP2 runs it (pytorch/pytorch torch/distributed/fsdp/_fully_shard at
# v2.13.0, cf30153c4c131c8164ee7798e5022d810682e2cb): _fully_shard.py set_requires_gradient_sync(False) sets each
# group's "reduce_grads = requires_gradient_sync"; _fsdp_param_group.py post_backward, "if not self.reduce_grads:
# if self.reshard_after_backward: self.reshard()" then "fsdp_param.to_accumulated_grad_if_needed()" and no
# reduce-scatter; _fsdp_param.py to_accumulated_grad_if_needed keeps "self.unsharded_accumulated_grad =
# unsharded_grad.to(self.reduce_dtype)" and accumulate_unsharded_grad_if_needed adds each later micro-batch's into
# it: an unsharded gradient of every parameter the rank holds (its tp x pp split), in reduce_dtype, from the first
# micro-batch's backward until the last micro-batch's post_backward reduce-scatters it ("if
# fsdp_param.unsharded_accumulated_grad is not None: ... unsharded_grads.append(...
# unsharded_accumulated_grad_data)") and drops it ("unsharded_accumulated_grad = None"). The Llama 3 paper (arXiv
# 2407.21783, section 3.3.2, 'Numerical stability'): "we use FP32 gradient accumulation during backward computation
# over multiple micro-batches and also reduce-scatter gradients in FP32 across data parallel workers in FSDP":
# reduce_dtype float32, 4 B.
ACCUMULATED_GRADIENT_BYTES = 4
GRADIENT_SYNC = ("micro-batch", "step")


@attrs.frozen(kw_only=True)
class GradOpOptions:
    """``gradient_sync``: when SHARD_GRAD_OP reduce-scatters the gradients: ``"micro-batch"`` (every
    micro-batch's backward) or ``"step"`` (FSDP2's ``set_requires_gradient_sync`` only on the last
    micro-batch: the unsharded gradients accumulated in fp32 over the micro-batches, reduce-scattered
    in fp32 once per step; the Llama 3 paper's FSDP)."""

    gradient_sync: str = attrs.field(default="micro-batch", validator=attrs.validators.in_(GRADIENT_SYNC))


def _per_step(plan, options) -> bool:
    """Gradients accumulated unsharded over more than one micro-batch (``gradient_sync="step"``)."""
    return options is not None and options.gradient_sync == "step" and plan.gradient_accumulation_steps > 1


def grad_op(plan, options):
    e = effect(plan.dp_size * plan.cp_size, "SHARD_GRAD_OP")
    if _per_step(plan, options) and e.weight_shards > 1:
        return attrs.evolve(e, notes=e.notes + (
            "FSDP (SHARD_GRAD_OP), gradient_sync='step': the unsharded gradients accumulated in fp32 over the "
            f"{plan.gradient_accumulation_steps} micro-batches, reduce-scattered once per step.",))
    return e


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
    return _noted(effect(shard_group(plan, options), "HYBRID_SHARD"), "hsdp", options)


def full_shard_buffers(plan, placement, options):
    """Measured grade: the root group stays gathered; each layer is gathered and its
    gradients reduce-scattered, one at a time; with an all-gather limit given (``prefetch_layers``,
    ``limit_all_gathers``), the layers gathered ahead of it too."""
    terms = buffers.fsdp_root(plan, placement) + buffers.layer_gather(plan, placement)
    if options is not None and placement.weight_shards > 1:
        terms = terms + fsdp_prefetch_terms(options, buffers.layer_parameters(plan, placement),
                                            placement.layers_per_stage, buffers.gathered_bytes(plan))
    return terms


def grad_op_buffers(plan, placement, options):
    """Measured grade: every gathered layer stays from its forward to its backward; with
    ``gradient_sync="step"`` and more than one micro-batch, the unsharded fp32 gradients accumulated
    over them (``accumulated_gradients``)."""
    terms = buffers.kept_unsharded(plan, placement)
    if _per_step(plan, options) and placement.weight_shards > 1:
        terms = terms + accumulated_gradients(plan, placement)
    return terms


def accumulated_gradients(plan, placement):
    """FSDP2's ``unsharded_accumulated_grad`` (the comment above GradOpOptions): every trainable parameter the
    rank holds before data-parallel sharding, in fp32, alive in the forward and backward of every micro-batch
    after the first (so at the peak of any run of more than one) and gone by the end of the last backward,
    reduce-scattered (a buffer of the rule's, as DDP's buckets are). (The sharded gradients are counted as accumulation counts them, alive throughout: here
    they exist only after that reduce-scatter, 1/dp of this buffer, an over-count in the forward and backward.)"""
    from mlsysim_core import BACKWARD, COMMUNICATION_BUFFERS, FORWARD, MemoryTerm, NotModelledError
    if plan.profile_options.lora is not None:
        raise NotModelledError("plugin_options['fsdp-grad-op'].gradient_sync", "step",
                               "'micro-batch' with LoRA (the adapters' accumulated gradients under FSDP are not "
                               "modelled)")
    params = placement.trainable_parameters_per_rank
    return [MemoryTerm(component=COMMUNICATION_BUFFERS,
                       label="FSDP's unsharded gradients accumulated over micro-batches (fp32)",
                       nbytes=params * ACCUMULATED_GRADIENT_BYTES, phases=(FORWARD, BACKWARD),
                       formula=f"{params:,.0f} params x {ACCUMULATED_GRADIENT_BYTES} B (FSDP2 "
                               "set_requires_gradient_sync(False): reduce_dtype fp32, reduce-scattered at the "
                               "last micro-batch)")]


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
# gradient_sync="step": the parameters gathered for every micro-batch's forward (kept to its backward), the fp32
# gradients reduce-scattered once per step, beside the last micro-batch's backward.
SHARD_GRAD_OP_PER_STEP = (SHARD_GRAD_OP[0],
                          _gather("dp", "step", "backward", kind="reduce-scatter",
                                  element_bytes=ACCUMULATED_GRADIENT_BYTES))


def grad_op_collectives(options):
    return SHARD_GRAD_OP_PER_STEP if options is not None and options.gradient_sync == "step" else SHARD_GRAD_OP


@hookimpl
def mlsysim_sharding_rules():
    return [
        ShardingRuleSpec(name="fsdp", axis="dp", apply=full, options_type=FsdpGatherOptions,
                         extensions={"measured.buffer_terms": full_shard_buffers, "explain.label": "FSDP (FULL_SHARD)",
                                     "explain.shards": ("optimizer_state", "gradients", "weights"),
                                     "search.unsharded_at_one_rank": True, STEPTIME_COLLECTIVES: FULL_SHARD},
                         description="FSDP FULL_SHARD: weights, gradients, optimizer state / dp; layers gathered one "
                                     "at a time"),
        ShardingRuleSpec(name="fsdp-grad-op", axis="dp", apply=grad_op, options_type=GradOpOptions,
                         extensions={"measured.buffer_terms": grad_op_buffers, "explain.label": "FSDP (SHARD_GRAD_OP)",
                                     "explain.shards": ("optimizer_state", "gradients", "weights"),
                                     "search.unsharded_at_one_rank": True,
                                     STEPTIME_COLLECTIVES: grad_op_collectives},
                         description="FSDP SHARD_GRAD_OP: as fsdp, gathered parameters kept from forward to backward"),
        ShardingRuleSpec(name="hsdp", axis="dp", apply=hybrid, options_type=HybridOptions,
                         extensions={"measured.buffer_terms": full_shard_buffers,
                                     "search.unsharded_at_one_rank": True, STEPTIME_COLLECTIVES: HYBRID_SHARD},
                         description="FSDP HYBRID_SHARD: fsdp inside a shard group (one node), replicated across"),
    ]
