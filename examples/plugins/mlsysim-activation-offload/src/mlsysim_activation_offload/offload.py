"""Activation offloading to host memory, as the checkpointing strategy
``offload.selective-offload``.

As in Transformer Engine's CPU offloading (``get_cpu_offload_context``) and Megatron-Core /
NeMo's ``cpu_offloading_num_layers``: activations are kept as with selective
recomputation (Korthikanti et al. 2023, Table 2: 34*s*b*h bytes per layer with 16-bit
activations), but during forward the activations of all but the last
``layers_on_device`` layers of the stage are copied to CPU memory, and copied back in
backward, one layer ahead. Per rank::

    per layer       = 34 * s * b * h * (bytes per value / 2) / activation_shards
    on the device   = layers_on_device x per layer             (the layers never offloaded)
                    + 1 x per layer                            (the layer being offloaded or prefetched)
    in host memory  = (layers_per_stage - layers_on_device) x per layer

``layers_on_device`` is capped at the stage's layers; with nothing to offload there is
no layer in flight.
"""

import attrs

from mlsysim_core import (ACTIVATIONS, BACKWARD, FORWARD, HOST, CheckpointingSpec, MemoryTerm,
                          hookimpl)

NAME = "offload.selective-offload"
PER_TOKEN_BYTES = 34      # Korthikanti Table 2: 16-bit activations, selective recompute


@attrs.frozen(kw_only=True)
class OffloadOptions:
    """``layers_on_device``: layers of a stage whose activations are never offloaded
    (at least 1, as NeMo's ``cpu_offloading_num_layers`` <= layers - 1)."""

    layers_on_device: int = attrs.field(
        default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)])


def activation_terms(plan, placement, options):
    s, mb, h, b = plan.seq_len, plan.microbatch, plan.hidden_dim, plan.bytes_per_value
    shards = placement.activation_shards
    per_layer = PER_TOKEN_BYTES * s * mb * h * (b / 2) / shards
    layers = placement.layers_per_stage
    kept = min(options.layers_on_device, layers)
    offloaded = layers - kept
    each = (f"34*s*b*h x {b}/2 B with s={s}, b={mb}, h={h}{plan.hidden_dim_note}"
            + (f" / {shards} (sequence parallel)" if shards != 1 else ""))
    terms = [MemoryTerm(
        component=ACTIVATIONS, label="activations kept on device (selective recompute)",
        nbytes=kept * per_layer, phases=(FORWARD, BACKWARD),
        formula=f"{kept} of {layers} layers (layers_on_device={options.layers_on_device}) x ({each})")]
    if offloaded:
        terms += [
            MemoryTerm(component=ACTIVATIONS, label="offload staging buffer (one layer in flight)",
                       nbytes=per_layer, phases=(FORWARD, BACKWARD),
                       formula=f"1 layer being offloaded or prefetched x ({each})"),
            MemoryTerm(component=ACTIVATIONS, label="activations offloaded to host memory",
                       nbytes=offloaded * per_layer, phases=(FORWARD, BACKWARD), tier=HOST,
                       formula=f"{offloaded} of {layers} layers x ({each})"),
        ]
    return terms


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name=NAME, activation_terms=activation_terms, options_type=OffloadOptions,
                              description="selective recompute; all but layers_on_device layers "
                                          "offloaded to host memory")]
