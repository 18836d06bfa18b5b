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
no layer in flight. ``layers_on_device=0`` offloads every layer (PyTorch's
``torch.autograd.graph.save_on_cpu`` around the whole forward).

Measured grade (``measured_activation_terms``, for the ``measured`` profile), as
``save_on_cpu`` does it, checked against PyTorch (``validation/examples/``): the kept layers
keep what the measured profile's layers save (selective recompute); an offloaded layer's
saved tensors go to host memory, once per op that saves them, with the weights its matmuls
and norms save; in the backward they come back to the device, at most one layer's at a
time (``backward_end``). Exact for Llama-style layers in fp32 with SDPA on one device;
elsewhere the host bytes are the profile's saved bytes plus the weights (said in the
formula). The tensors outside the decoder layers (the loss region, the final norm, the
LM head's weight copy) stay where the profile counts them, on the device.
"""

import attrs

from mlsysim_core import (ACTIVATIONS, BACKWARD, BACKWARD_END, FORWARD, HOST, CheckpointingSpec,
                          MemoryTerm, hookimpl)

NAME = "offload.selective-offload"
PER_TOKEN_BYTES = 34      # Korthikanti Table 2: 16-bit activations, selective recompute


@attrs.frozen(kw_only=True)
class OffloadOptions:
    """``layers_on_device``: layers of a stage whose activations are never offloaded
    (default 1, as NeMo's ``cpu_offloading_num_layers`` <= layers - 1; 0 offloads every
    layer, as ``torch.autograd.graph.save_on_cpu`` around the whole forward does)."""

    layers_on_device: int = attrs.field(
        default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(0)])


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
        formula=f"{kept} of {layers} layers (layers_on_device={options.layers_on_device}) x ({each})")] if kept else []
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


# --- measured grade -----------------------------------------------------------------------
#
# The measured profile's building blocks (mlsysim_plugins.measured, the profile's plugin API)
# are imported on first use, so a reference-grade solve never loads them.

def _measured():
    from mlsysim_plugins.measured import buffers, kernels, model, shapes
    return buffers, kernels, model, shapes


def _exact(plan, placement) -> str:
    """Why the measured closed form of one offloaded layer does not apply ("" when it does:
    Llama-style layers as measured, fp32, SDPA without dropout, the whole layer on one device)."""
    _buffers, kernels, _model, shapes = _measured()
    o, shape = plan.profile_options, shapes.shape_of(plan)
    architecture = (plan.model.architecture or "").lower()
    regime = o.regime
    if shape.family.name != "llama" or (architecture and shape.family.approximation(architecture) is not None):
        return f"{shape.family.display}-style layers" + (f" ({plan.model.architecture})" if architecture else "")
    if (regime.weight, regime.compute, regime.residual, regime.autocast) != (4, 4, 4, False):
        return f"regime {regime.name}"
    if kernels.kernel_of(plan).name != "sdpa" or o.dropout:
        return f"attention {kernels.kernel_of(plan).name}" + (f" with dropout {o.dropout:g}" if o.dropout else "")
    if o.lora is not None:
        return "LoRA"
    in_flight = plan.rank.in_flight if plan.rank is not None else 1
    if placement.activation_shards != 1 or plan.tp_size != 1 or in_flight != 1:
        return "a split layer or several micro-batches in flight"
    return ""


def offloaded_layer_bytes(plan, placement, device_layer: float) -> tuple[float, str]:
    """Bytes ``save_on_cpu`` copies to the host for one decoder layer, and how.

    Llama-style fp32 layers with SDPA (measured to the byte, T = b x s tokens, e = 4 B): every
    op copies what it saves, so a tensor saved by several ops is copied several times, and
    the weights the matmuls and norms save are copied too::

        e x (11 T h + 3 T q + 2 T kv + T a + 4 T + 4 T f + 4 s d_rot) + e x P_layer

    (each RMSNorm 3 T h + 2 T and its weight; q, k, v each save the normed input; RoPE cos and
    sin for q and for k, batch-independent; SDPA q, k, v, output and the fp32 logsumexp;
    o_proj its input; the MLP 2 T h + 4 T f). Elsewhere: the profile's saved bytes of the layer
    (each tensor once) plus its weights on the rank, an approximation the formula names.
    """
    buffers, _kernels, _model, shapes = _measured()
    from mlsysim_plugins.measured import layers
    shape = shapes.shape_of(plan)
    why = _exact(plan, placement)
    if not why:
        T, s, h, q, kv, a, f = (plan.microbatch * plan.seq_len, plan.seq_len, shape.hidden, shape.q_dim,
                                shape.kv_dim, shape.heads, shape.ffn)
        elements = 11 * T * h + 3 * T * q + 2 * T * kv + T * a + 4 * T + 4 * T * f + 4 * s * shape.rotary_dim
        weights = shape.layer_parameters()
        return 4 * (elements + weights), (
            f"4 B x (11 T h + 3 T q + 2 T kv + T a + 4 T + 4 T f + 4 s d_rot = {elements:,} with T={T:,}, h={h}, "
            f"q={q}, kv={kv}, a={a}, f={f}, d_rot={shape.rotary_dim}; one copy per op that saves a tensor) "
            f"+ 4 B x {weights:,} layer weights (saved by the matmuls and norms) = {4 * (elements + weights):,.0f} B "
            "(save_on_cpu, measured to the byte: validation/examples)")
    regime = plan.profile_options.regime
    n = plan.rank.in_flight if plan.rank is not None else 1
    expert_tp = plan.profile_options.expert_tp_size or plan.tp_size
    split = {layers.TP: plan.tp_size, layers.REPLICATED: 1, layers.EXPERTS: plan.ep_size * expert_tp}
    weights = (buffers.layer_parameters(plan) + sum(w.elements / split[w.split] for w in shape.layer_weights() if w.bias)
               + shape.layer_norm_parameters)    # matrices and biases as each weight is split, the norms
    wb = 2 if regime.autocast else (regime.gather or regime.weight)
    total = device_layer + n * weights * wb
    return total, (f"{device_layer:,.0f} B saved by the layer (the measured profile's count) + "
                   + (f"{n:g} micro-batches x " if n != 1 else "") + f"{weights:,.0f} layer weights x {wb} B "
                   f"= {total:,.0f} B; approximation ({why}): save_on_cpu copies a tensor once per op that saves "
                   "it, measured only for Llama-style fp32 layers with SDPA on one device, where that is 1.32 x "
                   "the profile's count")


def measured_activation_terms(plan, placement, options):
    """``save_on_cpu``-style offload of the stage's first L - layers_on_device layers."""
    _buffers, _kernels, model, _shapes = _measured()
    stored = model.layer_terms(plan, placement, selective=True)
    layers = placement.layers_per_stage
    kept = min(options.layers_on_device, layers)
    offloaded = layers - kept
    if not offloaded:
        return stored
    device_layer = sum(t.nbytes for t in stored) / layers
    host_layer, how = offloaded_layer_bytes(plan, placement, device_layer)
    terms = []
    if kept:
        terms.append(MemoryTerm(
            component=ACTIVATIONS, label="activations kept on device (selective recompute)",
            nbytes=kept * device_layer, phases=(FORWARD, BACKWARD),
            formula=f"{kept} of {layers} layers (layers_on_device={options.layers_on_device}) x {device_layer:,.0f} B "
                    "(what the measured profile's layer saves, selective recompute)"))
    return terms + [
        MemoryTerm(component=ACTIVATIONS, label="activations offloaded to host memory",
                   nbytes=offloaded * host_layer, phases=(FORWARD, BACKWARD), tier=HOST,
                   formula=f"{offloaded} of {layers} layers x {how}"),
        MemoryTerm(component=ACTIVATIONS, label="offload staging buffer (one layer in flight)",
                   nbytes=host_layer, phases=(BACKWARD_END,),
                   formula=f"one offloaded layer's tensors copied back to the device in its backward, "
                           f"{host_layer:,.0f} B (an upper bound: autograd unpacks one op's tensors at a time; "
                           "none in the forward, whose copies are synchronous, nor at the loss)"),
    ]


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name=NAME, activation_terms=activation_terms, options_type=OffloadOptions,
                              extensions={"measured.activation_terms": measured_activation_terms},
                              description="selective recompute; all but layers_on_device layers "
                                          "offloaded to host memory")]
