"""ZeRO++ hierarchical partitioning, hpZ (Wang et al. 2023, arXiv:2306.10209), as the
data-parallel rule ``zeropp.hpz``.

hpZ is ZeRO-3 (weights, gradients and optimizer state sharded over all data-parallel
ranks, dp x cp as the built-in ZeRO stages shard: the *primary* partition) plus a
*secondary* copy of the 16-bit weights, sharded only over the ``secondary_group`` ranks
of one node. Forward all-gathers the primary partition
across nodes and keeps the secondary partition; backward all-gathers the secondary one
inside the node. Per rank (paper Sec. 3.2, Fig. 4: (2 + 2 + K) M / N + 2 M / alpha)::

    weights, gradients, optimizer state   / (dp_size x cp_size)        (as ZeRO-3)
    secondary weight partition            params/rank x B / secondary_group

The secondary partition is a ``ShardingEffect.buffer_terms`` entry, so it is reported
as a communication buffer: a rule can only add terms of that component.

Measured grade (``measured_buffer_terms``, which replace ``buffer_terms`` under the
``measured`` profile), checked to the byte against PyTorch FSDP2's
``reshard_after_forward=<group>``, the same mechanism (``validation/examples/``): ZeRO-3's
buffers (one layer gathered at a time, its gradients reduce-scattered) plus, from each
layer's forward to its backward, its secondary shard::

    secondary = layers on the rank x one layer's parameters (matrices, norms, biases; on
                the rank after tensor/expert parallelism) / secondary_group x gathered bytes

in the regime's gathered dtype (``mixed-bf16``: bf16; fp32: 4 B), not the precision's.
The embedding, LM head and final norm get no secondary shard (FSDP2's root stays gathered).
"""

import attrs

from mlsysim_core import (BACKWARD, COMMUNICATION_BUFFERS, FORWARD, LayoutError, MemoryTerm,
                          ShardingEffect, ShardingRuleSpec, hookimpl)

NAME = "zeropp.hpz"
DEFAULT_GROUP = 8     # GPUs of a DGX/HGX node, when the hardware does not say


@attrs.frozen(kw_only=True)
class HpzOptions:
    """``secondary_group``: ranks sharing one secondary partition (DeepSpeed's
    ``zero_hpz_partition_size``). ``None``: the devices of one node
    (``hardware.devices_per_node``, else 8). 1 turns hpZ off, as in DeepSpeed."""

    secondary_group: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional([attrs.validators.instance_of(int),
                                             attrs.validators.ge(1)]))


def secondary_group(plan, options) -> tuple[int, str]:
    """The group size and where it came from."""
    if options.secondary_group is not None:
        return options.secondary_group, f"{NAME}.secondary_group"
    if plan.hardware.devices_per_node:
        return plan.hardware.devices_per_node, f"devices_per_node of {plan.hardware.name}"
    return DEFAULT_GROUP, f"{plan.hardware.name} gives no devices_per_node; {DEFAULT_GROUP} assumed"


def apply(plan, options, split):
    # The data-parallel group is dp x cp, as the built-in ZeRO and FSDP rules shard over:
    # context-parallel ranks hold the same weights and reduce the same gradients.
    dp, cp = plan.dp_size, plan.cp_size
    d = dp * cp
    group = f"dp_size={dp}" if cp == 1 else f"dp_size={dp} x cp_size={cp} = {d}"
    g, why = secondary_group(plan, options)
    if d % g:      # also rejects g > d
        if options.secondary_group is not None:
            raise LayoutError(f"plugin_options[{NAME!r}].secondary_group", g,
                              f"a divisor of {group} (so at most {d})")
        raise LayoutError("dp_size", dp, f"a multiple of the hpZ secondary group {g} ({why})" if cp == 1
                          else f"dp x cp ({dp} x {cp} = {d}) a multiple of the hpZ secondary group {g} ({why})",
                          f"or set --option {NAME}.secondary_group=N")
    ranks = f"{d} dp ranks" if cp == 1 else f"{d} dp x cp ranks ({dp} x {cp})"
    notes = [f"ZeRO++ hpZ: optimizer state, gradients and primary weights sharded over {ranks} (ZeRO-3)."]
    if g == 1:
        notes.append("ZeRO++ hpZ: secondary_group=1 turns hpZ off (as DeepSpeed's "
                     "zero_hpz_partition_size=1): plain ZeRO-3.")
        buffers = []
    else:
        # The model-parallel rules ran first: use their split (whichever rules they are).
        model_parallel = split.parameter_shards
        params = split.parameters_per_rank
        b = plan.bytes_per_value
        per_rank = f" / {model_parallel} (model-parallel split)" if model_parallel != 1 else ""
        buffers = [MemoryTerm(
            component=COMMUNICATION_BUFFERS, label=f"hpZ secondary weight partition ({plan.precision})",
            nbytes=params * b / g, phases=(FORWARD, BACKWARD),
            formula=f"{plan.model.parameters:,} params{per_rank} x {b} B / secondary group {g} ({why})")]
        regime = getattr(plan.profile_options, "regime", None)    # a measured-grade profile's dtypes
        dtype = plan.precision if regime is None else f"{regime.name} (gathered dtype)"
        notes.append(f"ZeRO++ hpZ: secondary {dtype} weight partition over {g} ranks "
                     f"({why}), kept from forward to backward.")
    return ShardingEffect(optimizer_state_shards=d, gradient_shards=d, weight_shards=d,
                          buffer_terms=buffers, notes=notes)


# --- measured grade -----------------------------------------------------------------------
#
# The measured profile's building blocks (mlsysim_plugins.measured, the profile's plugin API)
# are imported on first use, so a reference-grade solve never loads them.

def layer_parameters_on_rank(plan) -> float:
    """One decoder layer's parameters on a rank before data-parallel sharding: its matrices
    as the measured profile splits them (``buffers.layer_parameters``), its biases split as
    each weight says, and its norms (replicated by tensor parallelism)."""
    from mlsysim_plugins.measured import buffers, layers, shapes
    shape = shapes.shape_of(plan)
    expert_tp = plan.profile_options.expert_tp_size or plan.tp_size
    split = {layers.TP: plan.tp_size, layers.REPLICATED: 1, layers.EXPERTS: plan.ep_size * expert_tp}
    biases = sum(w.elements / split[w.split] for w in shape.layer_weights() if w.bias)
    return buffers.layer_parameters(plan) + biases + shape.layer_norm_parameters


def measured_buffer_terms(plan, placement, options):
    """ZeRO-3's layer gather and reduce-scatter, plus every layer's secondary shard."""
    from mlsysim_plugins.measured import buffers
    terms = buffers.layer_gather(plan, placement)
    g, why = secondary_group(plan, options)
    if g == 1:
        return terms
    layers = placement.layers_per_stage
    layer = layer_parameters_on_rank(plan)
    b = buffers.gathered_bytes(plan)
    regime = plan.profile_options.regime.name
    return terms + [MemoryTerm(
        component=COMMUNICATION_BUFFERS, label=f"hpZ secondary partition of the layers ({regime}, {b} B)",
        nbytes=layers * layer / g * b, phases=(FORWARD, BACKWARD),
        formula=f"{layers} layers x {layer:,.0f} params of one layer (matrices, norms, biases) / secondary "
                f"group {g} ({why}) x {b} B (gathered dtype of {regime}): each layer's shard from its forward to "
                "its backward; the embedding, LM head and final norm get none (FSDP2's root stays gathered)")]


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name=NAME, axis="dp", apply=apply, options_type=HpzOptions,
                             extensions={"measured.buffer_terms": measured_buffer_terms},
                             description="ZeRO++ hpZ: ZeRO-3 + 16-bit weights / secondary group (one node)")]
