"""Activation offloading to host memory (``activation_offload``), measured grade.

What it stands for, placed as torchtune's recipes place it (``full_finetune_single_device.py``:
``with self.activations_handling_ctx: logits = self._model(**batch)``, the loss computed outside, and
``get_act_offloading_ctx_manager`` wrapping the output head in a ``NoOpManager``): the saved-tensor
hooks run around the base model (embedding, decoder layers, final norm); the LM head and the loss
keep their tensors on the device.

* ``save_on_cpu``: ``torch.autograd.graph.save_on_cpu`` (``torch/autograd/graph.py``): the pack hook
  copies every tensor autograd saves to host memory, once per save, parameters included; the device
  copy is freed once the forward drops it; the unpack hook copies it back for the node that uses it.
* ``torchtune``: torchtune 0.6.1's ``OffloadActivations`` (``torchtune/training/_activation_offloading.py``):
  only tensors of at least ``min_offload_size`` = 1024 bytes that are not ``nn.Parameter`` /
  buffers are copied (lines 150-153), so weights stay on the device and are not copied; with
  ``use_streams`` (the default) the last ``max_fwd_stash_size`` = 5 packed tensors stay referenced on
  the device until a later pack (lines 155-163, ``fwd_stash``), and in the backward the tensors
  brought back for a node are freed only after the next node runs (``bwd_tensor_stash``, lines
  263-338): derived from the source (its streams need CUDA), **unvalidated**.

Device (every phase): the base model's saved tensors leave the device (the decoder layers, the
embedding output, RoPE's tables, the final norm's own saved tensors); its output, which the LM head
saves, stays. Host memory (``result.host_memory``, tier ``host``): what was copied, per rank.
Measured with a simulated GPU (``validation/techniques/offload/``, the pack hook's host copies made
outside the tracker).

Combined with activation checkpointing (torchtune's ``enable_activation_checkpointing`` and
``enable_activation_offloading`` together): a checkpointed layer saves only its input, so that input
is what goes to the host; the recomputed layer's tensors are saved outside the hooks' scope of the
forward and stay on the device (its working set).
"""

from __future__ import annotations

import attrs

from mlsysim_core import _checks
from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, HOST, MemoryTerm

from . import term_keys as K

OPTION = "activation_offload"
MODES = ("save_on_cpu", "torchtune")
SAVED = (FORWARD, BACKWARD)
# Terms of the base model (outside the decoder layers) whose saved tensors the hooks move (their keys).
BASE_MODEL = (K.EMBEDDING_OUTPUT, K.ROPE_TABLES)
LAYERS = (K.LAYERS_SAVED, K.CHECKPOINTED_INPUTS)
MIN_OFFLOAD_BYTES = 1024        # torchtune's min_offload_size
FWD_STASH = 5                   # torchtune's max_fwd_stash_size


def prepare_option(plan, value):
    """Check ``activation_offload`` (``options.prepare``): the plan with it set, and its notes."""
    value = _checks.name(OPTION, value, MODES)
    o = plan.profile_options
    if plan.rank is not None or plan.pp_size * plan.tp_size * plan.cp_size > 1:
        raise NotModelledError(OPTION, value, "no tensor, pipeline or context parallelism",
                               "offloading under model-parallel layouts (several micro-batches in flight, "
                               "split layers) is not measured")
    if o.lora is not None:
        raise NotModelledError(OPTION, value, "no LoRA", "offloading the adapters' saved tensors is not measured")
    if o.regime.main_grad:
        raise NotModelledError(OPTION, value, "a PyTorch regime", "Megatron-Core's layers are not offloaded here")
    notes = []
    if value == "torchtune":
        notes.append("activation_offload=torchtune is derived from torchtune 0.6.1's OffloadActivations source "
                     "(tensors >= 1 KiB that are not parameters; streams need CUDA): unvalidated")
    from .checkpointing import recomputes
    if recomputes(plan) not in ("nothing", "layers"):     # declared, not named: none and full measured
        notes.append(f"activation_offload with {plan.activation_checkpointing!r} checkpointing: the strategy's "
                     "saved tensors are offloaded as counted (measured with none only)")
    plan = attrs.evolve(plan, profile_options=attrs.evolve(o, activation_offload=value),
                        notes=plan.notes + tuple(notes))
    return plan


def _host(term, nbytes, how) -> MemoryTerm:
    return attrs.evolve(term, tier=HOST, nbytes=nbytes, label=f"{term.label} (offloaded to host memory)",
                        formula=f"{term.formula}; {how}")


def offload_terms(plan, terms, where: str) -> list[MemoryTerm]:
    """``terms`` of the decoder layers (``where="layers"``) or outside them (``"model"``) with the
    base model's saved tensors in host memory."""
    out = []
    for t in terms:
        moved = (where == "layers" and t.key in LAYERS) or (where == "model" and t.key in BASE_MODEL)
        if moved and tuple(t.phases) == SAVED and t.key == K.LAYERS_SAVED:
            nbytes, how = host_layers(plan, t.nbytes)
            out.append(_host(t, nbytes, how))
        elif moved and tuple(t.phases) == SAVED:
            if where == "model" and _exact(plan):
                continue        # copied by the first layer's norm and each layer's rotary: in the layers' count
            out.append(_host(t, t.nbytes, "copied by the pack hook, freed on the device"))
        elif where == "model" and t.key == K.FINAL_NORM and tuple(t.phases) == SAVED:
            # The final norm's output is the LM head's input, saved by the LM head outside the hooks.
            regime = plan.profile_options.regime
            kept = regime.compute * plan.microbatch * plan.seq_len * _hidden(plan)
            out.append(attrs.evolve(t, label="final norm output (saved by the LM head, on the device)",
                                    key=K.FINAL_NORM_OUTPUT,
                                    nbytes=kept, formula=f"c x T x h = {kept:,.0f} B"))
            if _exact(plan):    # the norm's 3 T h + 2 T (and its weight) and the embedding's int64 ids, per save
                T, h = plan.microbatch * plan.seq_len, _hidden(plan)
                w = h if plan.profile_options.activation_offload == "save_on_cpu" else 0
                out.append(_host(t, 4 * (3 * T * h + 2 * T + w) + 8 * T,
                                 f"4 x (3 T h + 2 T{' + h' if w else ''}) (the final norm, per save) + 8 T (the "
                                 "embedding's int64 ids) copied by the pack hook"))
            else:
                out.append(_host(t, t.nbytes - kept, "the norm's own saved tensors, copied by the pack hook"))
        else:
            out.append(t)
    return out


def _exact(plan) -> bool:
    """fp32 layers of a family that declares its per-save copies (``ArchitectureFamily.pack_hook_copies``:
    Llama's) with a kernel that declares it computes SDPA, no dropout, no recompute: the per-save host
    count measured to the byte (validation/techniques/offload, and validation/examples for save_on_cpu
    around the whole model). Declarations, never a family's or a kernel's name."""
    from .kernels import kernel_of
    from .shapes import shape_of
    from .checkpointing import keeps_everything
    o, shape = plan.profile_options, shape_of(plan)
    architecture = (plan.model.architecture or "").lower()
    regime = o.regime
    return (shape.family.pack_hook_copies is not None
            and not (architecture and shape.family.approximation(architecture))
            and (regime.weight, regime.compute, regime.residual, regime.autocast) == (4, 4, 4, False)
            and kernel_of(plan).sdpa and not o.dropout and keeps_everything(plan))


def host_layers(plan, device_bytes) -> tuple[float, str]:
    """Host bytes of the decoder layers' copies, and how. The pack hook copies a tensor once per op
    that saves it, and ``save_on_cpu`` copies the weights the matmuls and norms save too (torchtune's
    OffloadActivations skips parameters). Llama-style fp32 SDPA layers, per layer (T = b x s)::

        4 B x (11 T h + 3 T q + 2 T kv + T a + 4 T + 4 T f + 4 s d_rot)  [+ 4 B x P_layer, save_on_cpu]

    (each RMSNorm 3 T h + 2 T; q, k, v each save the normed input; RoPE cos and sin for q and for k;
    SDPA q, k, v, output, the fp32 logsumexp; o_proj its input; the MLP 2 T h + 4 T f): the formula of
    the example package mlsysim-activation-offload, measured to the byte again here. Elsewhere the
    profile's count (each tensor once) plus the weights, an approximation the formula says."""
    from .shapes import shape_of
    shape, L = shape_of(plan), plan.model.layers
    weights = shape.layer_parameters() if plan.profile_options.activation_offload == "save_on_cpu" else 0
    wb = plan.profile_options.regime.weight
    if _exact(plan):
        elements = shape.family.pack_hook_copies(shape, plan.microbatch * plan.seq_len, plan.seq_len)
        total = L * 4 * (elements + weights)
        return total, (f"{L} layers x 4 B x ({elements:,} saved elements, one copy per save"
                       + (f" + {weights:,} weights" if weights else "") + f") = {total:,.0f} B on the host")
    total = device_bytes + L * weights * wb
    return total, (f"{device_bytes:,.0f} B (the profile's count, each tensor once)"
                   + (f" + {L} x {weights:,} weights x {wb} B" if weights else "")
                   + f" = {total:,.0f} B on the host; approximation: the per-save copies are measured only for "
                   "Llama-style fp32 SDPA layers (about 1.3 x the profile's count there)")


def _hidden(plan) -> int:
    from .shapes import shape_of
    return shape_of(plan).hidden


def added_step_time(plan, hardware_flops=None, host_link_bytes_per_s=None):
    """Seconds the offload adds to a step, and how: the bytes copied to the host in the forward and
    back in the backward, over the host link, ``2 x host bytes / host_link_bytes_per_s``; exposed in
    full (the copies are assumed not overlapped with compute: an upper bound; torchtune's streams hide
    part of it). ``(None, why)`` without a link bandwidth."""
    if host_link_bytes_per_s is None:
        return None, "activation offload: needs the host link's bandwidth (bytes/s)"
    host = offloaded_bytes(plan)
    seconds = 2 * host / host_link_bytes_per_s
    return seconds, (f"activation offload: 2 x {host:,.0f} B (to the host in the forward, back in the backward) / "
                     f"{host_link_bytes_per_s:,.0f} B/s, not overlapped with compute (an upper bound; torchtune's "
                     "second stream hides part of it behind compute)")


def offloaded_bytes(plan) -> float:
    """The bytes the hooks copy to the host in one step of a prepared one-device plan: every decoder
    layer's saved tensors (a checkpointed layer's input), the embedding output and RoPE's tables."""
    from . import model
    from .shapes import shape_of
    shape, regime = shape_of(plan), plan.profile_options.regime
    T = plan.microbatch * plan.seq_len
    ctx = model.Context(shape=shape, tokens=T, seq_len=plan.seq_len, layers=plan.model.layers, shards=1,
                        regime=regime)
    lb = model.layer_bytes(plan, ctx)
    from .checkpointing import whole_layers
    per_layer = (regime.residual * T * shape.hidden if whole_layers(plan)
                 else lb.saved + (lb.output if lb.output_saved_by_next else 0))
    rope = 2 * plan.seq_len * shape.rotary_dim * (4 if regime.residual == 4 else 2)
    return plan.model.layers * per_layer + regime.residual * T * shape.hidden + rope


def optimizer_offload_step_time(plan, host_memory_bytes_per_s=None, host_link_bytes_per_s=None):
    """Seconds the ``offload`` option's host-side optimizer step adds, and how (DeepSpeed
    ZeRO-Offload, torchao's CPUOffloadOptimizer): the CPU step streams the state through host memory,
    ``state bytes / host_memory_bytes_per_s`` (read and written once: x 2), and the gradients go
    down and the updated parameters come up over the host link, ``(g + w) x params /
    host_link_bytes_per_s``; assumed not overlapped with compute (an upper bound: torchao copies each
    gradient as soon as it is ready). ``(None, why)`` without the bandwidths."""
    if not plan.profile_options.offload or host_memory_bytes_per_s is None or host_link_bytes_per_s is None:
        return None, "optimizer offload: needs offload and the host memory and host link bandwidths (bytes/s)"
    regime = plan.profile_options.regime
    params = plan.model.parameters
    state = params * ((regime.master or 0) + 2 * regime.state)        # master copy and Adam's two moments
    link = params * ((regime.gradient or 4) + regime.weight)
    seconds = 2 * state / host_memory_bytes_per_s + link / host_link_bytes_per_s
    return seconds, (f"optimizer offload: 2 x {state:,.0f} B of state through host memory / "
                     f"{host_memory_bytes_per_s:,.0f} B/s + {link:,.0f} B of gradients down and parameters up / "
                     f"{host_link_bytes_per_s:,.0f} B/s, not overlapped (Adam-style state assumed)")
