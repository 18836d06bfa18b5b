"""PyTorch FSDP (FSDP2's ``fully_shard``) as data-parallel rules: ``fsdp`` (FULL_SHARD,
``reshard_after_forward=True``: weights, gradients and optimizer state / dp, as ZeRO-3),
``fsdp-grad-op`` (SHARD_GRAD_OP, ``reshard_after_forward=False``: the same shards, but the
gathered parameters stay from the forward to the backward) and ``hsdp`` (HYBRID_SHARD:
FULL_SHARD inside a shard group of ``shard_group_size`` ranks, replicated across groups).

The shards are the same as ZeRO's; what differs is what is gathered when. The measured
profile prices that (each rule's ``measured_buffer_terms``): one layer's
all-gathered parameters and its prefetched successor, the reduce-scatter input, the
unsharded parameters SHARD_GRAD_OP keeps between forward and backward.
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


def grad_op(plan, options):
    return effect(plan.dp_size * plan.cp_size, "SHARD_GRAD_OP")


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
    """Measured grade: every gathered layer stays from its forward to its backward."""
    return buffers.kept_unsharded(plan, placement)


def _gather(group, per, overlaps, **more):
    return Collective(volume="gradients", group=group, per=per, overlaps=overlaps, **{overlaps: 1}, **more)


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


@hookimpl
def mlsysim_sharding_rules():
    return [
        ShardingRuleSpec(name="fsdp", axis="dp", apply=full, options_type=FsdpGatherOptions,
                         extensions={"measured.buffer_terms": full_shard_buffers, "explain.label": "FSDP (FULL_SHARD)",
                                     "explain.shards": ("optimizer_state", "gradients", "weights"),
                                     "search.unsharded_at_one_rank": True, STEPTIME_COLLECTIVES: FULL_SHARD},
                         description="FSDP FULL_SHARD: weights, gradients, optimizer state / dp; layers gathered one "
                                     "at a time"),
        ShardingRuleSpec(name="fsdp-grad-op", axis="dp", apply=grad_op,
                         extensions={"measured.buffer_terms": grad_op_buffers, "explain.label": "FSDP (SHARD_GRAD_OP)",
                                     "explain.shards": ("optimizer_state", "gradients", "weights"),
                                     "search.unsharded_at_one_rank": True, STEPTIME_COLLECTIVES: SHARD_GRAD_OP},
                         description="FSDP SHARD_GRAD_OP: as fsdp, gathered parameters kept from forward to backward"),
        ShardingRuleSpec(name="hsdp", axis="dp", apply=hybrid, options_type=HybridOptions,
                         extensions={"measured.buffer_terms": full_shard_buffers,
                                     "search.unsharded_at_one_rank": True, STEPTIME_COLLECTIVES: HYBRID_SHARD},
                         description="FSDP HYBRID_SHARD: fsdp inside a shard group (one node), replicated across"),
    ]
