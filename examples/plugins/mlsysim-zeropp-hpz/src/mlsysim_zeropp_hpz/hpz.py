"""ZeRO++ hierarchical partitioning, hpZ (Wang et al. 2023, arXiv:2306.10209), as the
data-parallel rule ``zeropp.hpz``.

hpZ is ZeRO-3 (weights, gradients and optimizer state sharded over all dp ranks: the
*primary* partition) plus a *secondary* copy of the 16-bit weights, sharded only over
the ``secondary_group`` ranks of one node. Forward all-gathers the primary partition
across nodes and keeps the secondary partition; backward all-gathers the secondary one
inside the node. Per rank (paper Sec. 3.2, Fig. 4: (2 + 2 + K) M / N + 2 M / alpha)::

    weights, gradients, optimizer state   / dp_size                    (as ZeRO-3)
    secondary weight partition            params/rank x B / secondary_group

The secondary partition is a ``ShardingEffect.buffer_terms`` entry, so it is reported
as a communication buffer: a rule can only add terms of that component.
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
    d = plan.dp_size
    g, why = secondary_group(plan, options)
    if d % g:      # also rejects g > d
        if options.secondary_group is not None:
            raise LayoutError(f"plugin_options[{NAME!r}].secondary_group", g,
                              f"a divisor of dp_size={d} (so at most {d})")
        raise LayoutError("dp_size", d, f"a multiple of the hpZ secondary group {g} ({why})",
                          f"or set --option {NAME}.secondary_group=N")
    notes = [f"ZeRO++ hpZ: optimizer state, gradients and primary weights sharded over {d} dp ranks (ZeRO-3)."]
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
        notes.append(f"ZeRO++ hpZ: secondary {plan.precision} weight partition over {g} ranks "
                     f"({why}), kept from forward to backward.")
    return ShardingEffect(optimizer_state_shards=d, gradient_shards=d, weight_shards=d,
                          buffer_terms=buffers, notes=notes)


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name=NAME, axis="dp", apply=apply, options_type=HpzOptions,
                             description="ZeRO++ hpZ: ZeRO-3 + 16-bit weights / secondary group (one node)")]
