"""``torch.compile`` (Inductor, default options) around the model: what AOTAutograd's partitioner saves for
the backward and what Inductor's fused kernels hold (issue 25, item 1; the technique ``compile``,
``compile=True``, ``--compile``).

Derived from torch 2.13's source and measured with the profiler's memory timeline (a harness that never
runs compiled code under a dispatch mode: validation/compile/). Notation: T = b x s tokens, h hidden,
V vocabulary, f MLP width, c bytes of the compute dtype (fp32 4, bf16 2; the residual stream is in it
too), L layers.

**What the forward saves** (``torch/_functorch/partitioners.py``, ``min_cut_rematerialization_partition``
with Inductor's defaults: ``ban_if_not_in_allowlist``, ``ban_if_materialized_backward``,
``ban_if_reduction``): the joint forward-backward graph is cut at the cheapest set of tensors from which
the backward can be computed, where

* compute-intensive ops (``mm``, ``bmm``, SDPA: not in the recomputable allow-list) are never recomputed:
  each declared op output of a layer (``ArchitectureFamily.op_outputs``: q, k, v, the attention's output
  and fp32 log-sum-exp, o, gate, up, down) is saved at its own size, as the op's output or a same-sized
  pointwise result of it (RoPE's q and k, the residual sums after o and down);
* a pointwise result that a non-fusible backward op reads is "materialized in the backward" and banned
  from recompute: each norm's output (the next matmuls' input, read by their weight gradients: c x h per
  token per norm) and the input of a row-parallel linear that follows another matmul (SiLU(gate) x up, the
  down projection's input: the preceding op's size);
* a reduction whose output is 4x smaller than its input is saved rather than recomputed: each norm's fp32
  ``rsqrt`` (4 B per token);
* everything else pointwise is recomputed in the backward from these: RMSNorm's fp32 copies and
  normalized x, SiLU's output, RoPE's cos/sin tables (from the fp32 ``inv_freq`` buffer), dropout-free
  casts. The residual stream entering each layer is saved (the norm's backward reads it), so every
  layer's input (the embedding output for the first) is kept in every regime.

Grouped-query attention: with the mask materialized (below) Hugging Face's ``sdpa_attention_forward``
passes no ``enable_gqa`` and repeats k and v to every query head; SDPA saves the repeated copies (k and v
at the query's width: 2 c (q - kv) more per token than the declared k and v).

Per layer: ``sum(op outputs) + norms x (c h + 4) + c f`` per token (Llama: the eager layer's normalized
x (4h per norm in fp32), SiLU's output (c f) and, in bf16, RMSNorm's fp32 copies are gone).

**The loss** (Hugging Face's ``ForCausalLMLoss`` traced into the same graph): the logits (c T V, the
LM head's ``mm`` output and a graph output) are saved; ``logits.float()``, ``log_softmax`` and
``nll_loss`` are fused into reductions that keep only the per-token max and log-sum-exp (2 x 4 T) and the
padded labels (``pad(labels, (0, 1))``: 8 b (s + 1)); no fp32 copy and no fp32 log-softmax exist. The
backward's top is its first kernel: the logits' tangent (``torch.compile`` returns the logits, a graph
output that needs a gradient input: the autograd engine materializes zeros, c T V), the fused kernel's
gradient of the logits (c T V) and a per-token fp32 buffer (4 T + 4), beside everything saved.

**The attention mask**: Hugging Face's ``sdpa_mask`` does not skip the causal mask while tracing: the
mask is materialized once per forward as ``where(mask, 0, -inf)`` in the compute dtype, (b, 1, s, s),
and saved for SDPA's backward (c b s^2; kernels that declare ``computes="sdpa"``).

**Full checkpointing** (``torch.utils.checkpoint`` around each layer, HF's
``gradient_checkpointing_enable``): the checkpointed regions' nodes are ``MUST_RECOMPUTE``; the forward
keeps each layer's input (c T h), the mask, and on the CPU each layer's RNG state (``torch.get_rng_state()``,
5,056 B: the CPU generator's; a CUDA run keeps that on the host); the last layer's output is recomputed
with it (not saved), the final norm's output and statistic, the loss's part are saved as without
checkpointing. The top layer's forward (its MLP) and the backward's recomputation of a layer (its compiled
set, with its backward's data gradients alive while the weight-gradient matmuls wait) are approximate: they
follow Inductor's schedule and buffer reuse inside one graph (a note says so).

**The backward's end**: ``embedding_dense_backward`` decomposes into ``new_zeros`` in the computation dtype
(fp32 for 16-bit gradients), an accumulating ``index_put`` and a cast: V h (4 + g) at the cast, beside the
first layer's input gradient being assembled (5 c T h: the residual's, q, k, v's input gradients, their sum).

Not modelled (refused, naming the parameter and what is allowed): autocast and Megatron regimes, other
checkpointing strategies than none and full (every layer), other loss implementations than the default
cross-entropy, attention kernels that do not compute SDPA, families whose declared layer ops include
others than mm and SDPA (routers, grouped mms), dropout, parallel layouts, and the techniques that reshape
the backward (offload, the optimizer step in the backward, activation offload, float8; LoRA but plain). What
is asked is declared, never named: a loss implementation's compiled form (``compiled_blocks``), a checkpointing
strategy's ``recomputes`` and ``measured.compiled_blocks`` extension, a technique's ``with_compile``.

With peft's LoRA (``compile=True``: Hugging Face's ``torch_compile``, ``torch.compile(peft_model)``, one graph):
the layers' saved set with frozen base weights (``lora_layer_saved``, peft's fp32 adapters' fp32 copies), the
mask, the final norm's rsqrt, the compiled loss; no embedding output or gradient (``whole_lora_terms``);
``lora_dropout`` on the matmuls reading a norm's output (each adapter's dropout output and mask).
Measured: validation/compile/measure_lora_whole.py. Refused: QLoRA, DoRA, ``modules_to_save``, checkpointing,
dropout on an adapted row-parallel linear, and in 16 bits an adapted row-parallel linear and adapters in
the base's dtype.

``compile="blocks"`` (docs/compile.md, "Per-block compile"): each decoder block compiled apart, as torchtune
0.6.1 (``training.compile_model``) and torchtitan (``apply_compile``) do: the blocks' saved set as above with
no mask (SDPA ``is_causal``) and k, v expanded to the query heads (torchtune attention.py:285-291), the first
block's input saved; the embedding, final norm (torchtune's ``F.rms_norm(x.float(), ...)``: fused in fp32,
composite in 16 bits), LM head and loss eager, the loss as the eager profile prices it (torchtune's recipe
discards ``compile_loss``'s return value) or, with ``loss="chunked"``, torchtune's compiled
``compute_cross_entropy`` (each chunk's logits and a per-token max and log-sum-exp saved, no fp32
log-softmax); op-SAC inside the compiled blocks keeps the policy's saved set (the eager op-SAC term: the
partitioner honours the SAC tags); full checkpointing in torchtitan's order (``compile_checkpoint="inside"``, the
default without LoRA; ``blocks_full_terms``: the checkpoint inside each compiled block, its recompute in the
block's backward graph) or in torchtune's (``compile_checkpoint="outside"``; ``blocks_outside_full_terms``: each
compiled block wrapped in the checkpoint, the top block's whole saved set made in the forward, the recompute
outside the backward graph; validation/compile/measure_blocks_order.py); data-parallel layouts allowed (the rules' parts unchanged), and pipeline
stages (each block's graph as on one device: a stage holds its blocks' sets per micro-batch in flight;
validation/compile/measure_blocks_pp.py), full checkpointing under data parallelism in torchtune's and torchtitan's
orders (FSDP2's buffers beside the compiled blocks: ``fsdp2_around_blocks``; validation/compile/measure_blocks_fsdp.py),
and
tensor parallelism without sequence parallelism (torchtune's plan:
each op's output in the saved set split as the family declares, ``layer_saved(..., tp)``; measured on rank 0 of
2 of the fake process group). With LoRA
(torchtune's LoRA recipes with ``compile: True``: plain adapters in the model's dtype): the
blocks' saved set on a joint graph whose base weights need no gradient (``lora_layer_saved``: a frozen matmul's
input is not saved; the first block's input needs no gradient). Measured on torchtune's builders:
validation/compile/measure_blocks.py. With full checkpointing in torchtune's order (``compile_model``, then
``set_activation_checkpointing``: the checkpoint outside the compiled graph; ``lora_full_terms``): the layers'
inputs, the top block's compiled forward with its whole saved set before the checkpoint drops it, and its
recompute and MLP backward (validation/compile/measure_blocks_extra.py). With QLoRA (torchtune's NF4 base, one
device): each frozen NF4 linear whose input needs a gradient saves its dequantized weight (``dequantized_saved``;
validation/compile/measure_blocks_qlora.py).

``compile="blocks+loss"``: the blocks as above and torchtitan's loss function compiled apart
(``build_cross_entropy_loss``'s ``torch.compile(loss_fn)``, "loss" in ``compile.components``;
``compiled_loss_terms``): the logits it is given and a per-token max and log-sum-exp saved, no fp32 copy or
log-softmax, the logits' gradient in their dtype in the backward (validation/compile/measure_blocks_extra.py).

CPU and CUDA lowering (docs/compile.md): the saved set is chosen on device-independent graphs and
transfers; the transient peaks are measured on the CPU's Inductor (C++ kernels) and may differ on CUDA
(Triton kernels, SDPA's flash or memory-efficient backend and its log-sum-exp padding): every result says so.
"""

from __future__ import annotations

import attrs

from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import ACTIVATIONS, BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP, MemoryTerm

from . import term_keys as K
from .loss import chosen as chosen_loss

SAVED = (FORWARD, BACKWARD)
COMPUTE_INTENSIVE = ("mm", "bmm", "sdpa")   # the declared op kinds the partitioner never recomputes
                                           # (partitioners.py get_default_op_list: compute_intensive_ops)
CPU_RNG_STATE = 5056                       # torch.get_rng_state() on the CPU: the generator's state, bytes
NOTE = ("compile=True: torch.compile (Inductor, default options) modelled from AOTAutograd's min-cut partitioner "
        "(what the forward saves: device-independent) and validated on the CPU (torch 2.13); the backward's "
        "transients (the loss's first kernel, a recomputed layer) follow the CPU's Inductor lowering and may "
        "differ under CUDA's Triton kernels and SDPA backends (docs/compile.md)")

APPROXIMATE = ("compile=True with full checkpointing: approximate moments: the top layer's forward and the first "
               "layer's recompute in the compiled backward follow Inductor's schedule and buffer reuse inside one "
               "graph (measured on the CPU: the forward peak 0.0 to -6.1 %, the backward peak +0.1 to +3.5 % where the "
               "layers set them; exact where the loss does)")


def _n(x) -> str:
    return f"{x:,.0f}"


def on(plan) -> bool:
    """Is ``compile`` on in this plan (True or "blocks"; None and False are off)?"""
    return bool(getattr(plan.profile_options, "compile", None))


BLOCKS = "blocks"       # compile="blocks": each decoder block compiled apart (torchtune, torchtitan)
BLOCKS_NOTE = ("compile='blocks': each decoder block torch.compile'd apart (torchtune compile_model, torchtitan "
               "apply_compile): the blocks' saved set is the partitioner's (no mask: SDPA is_causal; k and v expanded "
               "to the query heads as torchtune's and torchtitan's attention do); the embedding, final norm, LM head "
               "and loss run eagerly and are priced as eager (validation/compile/measure_blocks.py, torchtune 0.6.1)")


BLOCKS_FULL = ("compile='blocks' with full checkpointing: torchtitan's order (apply_ac, then apply_compile: the "
               "checkpoint inside each compiled block, its recompute in the block's backward graph). torchtune's "
               "recipes compile each layer, then wrap it in checkpoint_wrapper: measured on a 3-layer cell, their "
               "forward peak is 10 % above this (the compiled block's whole saved set before the checkpoint drops "
               "it) and their backward peak 6.5 % below (docs/compile.md)")


INSIDE, OUTSIDE = "inside", "outside"    # compile_checkpoint: torchtitan's order, torchtune's
BLOCKS_FULL_OUTSIDE = ("compile='blocks' with full checkpointing, compile_checkpoint='outside': torchtune's order "
                       "(full_finetune_single_device _setup_model: compile_model, then set_activation_checkpointing "
                       "wraps each compiled layer): the top block's compiled forward makes its whole saved set before "
                       "the checkpoint drops it; each block's backward re-runs the compiled forward, then the block's "
                       "backward graph (compile.blocks_outside_full_terms; validation/compile/measure_blocks_order.py)")


BLOCKS_FULL_FSDP2 = ("compile='blocks' with full checkpointing under data parallelism (torchtune's distributed order: "
                     "compile_model, set_activation_checkpointing, then shard_model's fully_shard on each wrapped "
                     "layer; or torchtitan's: apply_ac, apply_compile, apply_fsdp); with weight sharding FSDP2's "
                     "held all-gather output, prefetched all-gather and held "
                     "reduce-scatter input beside the compiled blocks are priced (compile.fsdp2_around_blocks; "
                     "validation/compile/measure_blocks_fsdp.py)")


BLOCKS_LOSS = "blocks+loss"     # each decoder block and the loss function compiled apart (torchtitan's default
                                # compile.components ["model", "loss"])
LOSS_NOTE = ("compile='blocks+loss': the loss function torch.compile'd apart too, not eager (torchtitan's build_cross_entropy_loss "
             "with \"loss\" in compile.components): its graph saves the logits it is given (c T V) and a per-token max "
             "and log-sum-exp, no fp32 copy or log-softmax; its backward writes the logits' gradient in their dtype "
             "(validation/compile/measure_blocks_extra.py)")


BLOCKS_FULL_LORA = ("compile='blocks' with LoRA and full checkpointing: torchtune's order (lora_finetune_single_device "
                    "_setup_model: compile_model, then set_activation_checkpointing wraps each compiled layer): the top "
                    "block's compiled forward makes its whole saved set before the checkpoint drops it, and its backward "
                    "re-runs the compiled forward before the block's backward graph (compile.lora_full_terms; measured "
                    "with the MLP wholly adapted or frozen, validation/compile/measure_blocks_extra.py)")


def blocks(plan) -> bool:
    """Is the plan's compile per block (``compile="blocks"``, or ``"blocks+loss"`` with the loss compiled too)?"""
    return getattr(plan.profile_options, "compile", None) in (BLOCKS, BLOCKS_LOSS)


def compiled_loss(plan) -> bool:
    """Is the loss function compiled apart (``compile="blocks+loss"``: torchtitan's ``torch.compile(loss_fn)``)?"""
    return getattr(plan.profile_options, "compile", None) == BLOCKS_LOSS


# --- what is refused ---------------------------------------------------------------------------

COMPILED_BLOCKS = "measured.compiled_blocks"
"""A ``CheckpointingSpec.extensions`` key: true when the strategy, recomputing part of a layer, keeps its eager saved
set inside a block compiled apart (its per-op SAC tags honoured by the partitioner: torchtitan's op-SAC, measured in
validation/compile/measure_blocks.py); a strategy without it is refused with ``compile="blocks"``."""


def _on(technique, plan) -> bool:
    """Is a technique on in this plan: what its ``active`` says, else any of its options set (not None or False)."""
    if technique.active is not None:
        return bool(technique.active(plan))
    o = plan.profile_options
    return any(getattr(o, name, None) not in (None, False) for name in technique.options)


def _set_option(technique, plan) -> tuple[str, object]:
    """The technique's first option that is set (name, value): what a refusal names."""
    o = plan.profile_options
    for name in technique.options:
        if getattr(o, name, None) not in (None, False):
            return name, getattr(o, name)
    name = next(iter(technique.options))
    return name, getattr(o, name, None)


def _check_techniques(plan, value, registry):
    """Every technique that owns options and is on asks its declaration of how it combines with compile
    (``Technique.with_compile``: a callable that refuses what is not measured, or the reason it is not modelled
    with compile); one declaring nothing is refused naming its option (a third party's reshaping of the compiled
    backward is not known)."""
    from .techniques import registered
    techniques = plan.profile_options.techniques or (registered(registry) if registry is not None else ())
    for technique in sorted(techniques, key=lambda t: (t.order, t.name)):
        if not technique.options or not _on(technique, plan):
            continue
        declared = technique.with_compile
        if callable(declared):
            declared(plan, value)
            continue
        name, set_value = _set_option(technique, plan)
        why = declared or (f"technique {technique.name!r} declares nothing of how it combines with compile "
                           "(Technique.with_compile)")
        raise NotModelledError(name, set_value, f"{name} off with compile=True", why)


def _compiled_losses(registry) -> list[str]:
    """The registered loss implementations declaring a compiled form under compile="blocks" (``compiled_blocks``)."""
    from .loss_implementations import registered
    return sorted(n for n, impl in (registered(registry) if registry is not None else {}).items()
                  if impl.compiled_blocks is not None)


REFUSED = "a technique that reshapes the compiled backward is not modelled with it"
"""Why the built-ins that reshape the backward are refused with compile (``Technique.with_compile``)."""


def lora_with_compile(plan, value):
    """LoRA's declaration (``Technique.with_compile``): what is modelled with it (``_check_lora``)."""
    _check_lora(plan, value)


def accepted_with_compile(plan, value):
    """A technique checked elsewhere with compile (the loss: its implementation's ``compiled_blocks``; compile)."""


def optimizer_in_backward_with_compile(plan, value):
    """The step in the backward with compiled blocks: measured with torchtune's full checkpointing in its order
    (validation/compile/measure_blocks_order.py, the -oib- runs); else refused by name."""
    from .parallel import is_parallel
    o = plan.profile_options
    if value in (BLOCKS, BLOCKS_LOSS) and o.lora is None:
        from .checkpointing import LAYERS, spec_of
        if spec_of(plan).recomputes == LAYERS and outside(plan) and not is_parallel(plan):
            return
        raise NotModelledError("optimizer_in_backward", o.optimizer_in_backward, f"off with compile={value!r}, or on "
                               "with full checkpointing in torchtune's order (compile_checkpoint='outside') on one "
                               "device", "the step in the backward with compiled blocks is measured with torchtune's "
                               "full checkpointing on one device only (under FSDP2 its hooks beside the reduce-"
                               "scatters are not measured)")
    raise NotModelledError("optimizer_in_backward", o.optimizer_in_backward, "optimizer_in_backward off with "
                           "compile=True", REFUSED)


def offload_with_compile(plan, value):
    """Parameter, gradient and optimizer offload (FSDP2's ``CPUOffloadPolicy``, torchtune's ``fsdp_cpu_offload``)
    around compiled blocks under data parallelism without LoRA: it moves the sharded parameters, the reduce-scattered
    gradients and the optimizer step to the host and leaves each block's graph alone (the unsharded parameters are
    copied in before the all-gather, as without it; no saved activation moves): measured, the compiled-minus-eager
    difference equals the one without offload in every phase (validation/compile/measure_blocks_fsdp.py's
    ``-offload-`` runs). Else refused by name."""
    from .parallel import _offload
    o = plan.profile_options
    every = dict(_offload(o.offload)) == {"optimizer": "cpu", "gradients": "cpu", "parameters": "cpu"}
    if (value in (BLOCKS, BLOCKS_LOSS) and every and o.lora is None and not o.cpu_offload_optimizer
            and plan.dp_size > 1 and plan.tp_size * plan.pp_size * plan.cp_size * plan.ep_size == 1):
        return
    raise NotModelledError("offload", o.offload, f"offload off with compile=True; 'optimizer+gradients+parameters' "
                           f"(to the host: FSDP2's CPUOffloadPolicy) with compile={BLOCKS!r} or {BLOCKS_LOSS!r} under "
                           "data parallelism alone, no LoRA",
                           "other offloads around a compiled model (one part on the host, NVMe, torchao's "
                           "CPUOffloadOptimizer's gradient hooks, a whole compiled model, LoRA, tensor or pipeline "
                           "layouts) are not measured (validation/compile/measure_blocks_fsdp.py)")


def activation_offload_with_compile(plan, value):
    """torchtune's offload around compiled blocks: its own checks (offload_activations); else refused by name."""
    from .parallel import is_parallel
    o = plan.profile_options
    if value in (BLOCKS, BLOCKS_LOSS) and not is_parallel(plan):
        return      # torchtune's, around compiled blocks: offload_activations' own checks
    if value in (BLOCKS, BLOCKS_LOSS):
        raise NotModelledError("activation_offload", o.activation_offload, f"None with compile={value!r} under a "
                               "parallel layout", "offloading the inputs of compiled blocks beside FSDP2's gathers and "
                               "reduce-scatters is not measured (one device: validation/lora_offload, "
                               "validation/offload_full)")
    raise NotModelledError("activation_offload", o.activation_offload, "activation_offload off with compile=True",
                           REFUSED)


def prepare(plan, registry=None):
    """``compile``: checked against what is modelled (the module docstring), the note added; off: the plan."""
    o = plan.profile_options
    value = o.compile
    if value is None or value is False:
        if o.compile_checkpoint is not None:
            raise NotModelledError("compile_checkpoint", o.compile_checkpoint, f"None without compile (it says where "
                                   f"the checkpoint sits relative to each block compiled by compile={BLOCKS!r})",
                                   "no block is compiled")
        return plan
    if o.compile_checkpoint not in (None, INSIDE, OUTSIDE):
        raise NotModelledError("compile_checkpoint", o.compile_checkpoint, f"{INSIDE!r} (torchtitan's order) or "
                               f"{OUTSIDE!r} (torchtune's)", "the checkpoint sits inside or outside a compiled block")
    if value is not True and value not in (BLOCKS, BLOCKS_LOSS):
        raise NotModelledError("compile", value, f"True (the whole model), {BLOCKS!r} (each decoder block), "
                               f"{BLOCKS_LOSS!r} (each decoder block and the loss function) or False",
                               "torch.compile with its default options (mode, backend and options other than "
                               "Inductor's defaults are not modelled)")
    from .checkpointing import LAYERS, NOTHING, spec_of
    from .kernels import kernel_of
    from .model import megatron
    from .shapes import shape_of
    regime = o.regime
    if megatron(regime) or regime.autocast:
        raise NotModelledError("regime", regime.name, "a pure fp32 or bf16 regime with compile=True",
                               "the compiled graph under autocast or Megatron-Core's layers is not modelled")
    from .parallel import is_parallel
    if value == BLOCKS_LOSS:
        _check_compiled_loss(plan)
    if value in (BLOCKS, BLOCKS_LOSS):
        # Data parallelism (DDP, FSDP/FSDP2, ZeRO) leaves each block's graph as on one device: the block's
        # forward and backward see gathered parameters and the rank's micro-batch; the rules price the
        # rest (shards, gathers, buckets). Context, expert and sequence parallelism change the graph.
        # Pipeline parallelism (torchtitan compiles each block of each stage's model chunk) leaves each block's
        # graph as on one device too: the stage holds its blocks' saved sets for each micro-batch in flight.
        # Tensor parallelism without sequence parallelism (torchtune's plan: column-parallel q, k, v, gate, up,
        # row-parallel o, down, each output all-reduced; then each block compiled): the partitioner's set of the
        # rank's DTensor graph is the single-device one with each op's output split as the op declares
        # (layer_saved(..., tp)); measured on rank 0 of 2 of the fake process group.
        other = {k: getattr(plan, k) for k in ("cp_size", "ep_size") if getattr(plan, k) > 1}
        if other:
            name, size = next(iter(other.items()))
            raise NotModelledError(name, size, f"1 with compile={BLOCKS!r} (data, pipeline and tensor parallelism "
                                   "without sequence parallelism: dp_size, data_parallel, pp_size, tp_size)",
                                   "a compiled block under context or expert parallelism (its collectives and "
                                   "DTensor graphs) is not modelled")
        if plan.tp_size > 1 and plan.sequence_parallel:
            raise NotModelledError("sequence_parallel", True, f"False with compile={BLOCKS!r} and tp_size > 1",
                                   "sequence parallelism inside a compiled block (torchtitan's TP plan, always "
                                   "sequence-parallel) is not measured: the partitioner sees the all-gathers before "
                                   "attention and the MLP and the reduce-scatters after them as functional "
                                   "collectives, outside its recomputable allow-list, so whether the gathered "
                                   "inputs are saved (eager keeps them) or re-gathered is its choice; and torch "
                                   "2.13 fails the backward of a vocabulary-parallel embedding feeding a compiled "
                                   "block on the CPU (DTensor's redistribute receives a plain tensor)")
        own_loss = chosen_loss(o) is not None
        checkpointed = spec_of(plan).recomputes != NOTHING      # declared, not named
        if plan.tp_size > 1 and (o.lora is not None or own_loss or checkpointed):
            name = "lora" if o.lora is not None else "loss" if own_loss else "activation_checkpointing"
            value = o.lora if name == "lora" else o.loss if name == "loss" else plan.activation_checkpointing
            raise NotModelledError(name, value, f"the default with compile={BLOCKS!r} and tp_size > 1",
                                   "compiled blocks under tensor parallelism are measured without LoRA, a chunked "
                                   "loss and checkpointing")
        if plan.pp_size > 1 and (o.lora is not None or checkpointed):
            name = "lora" if o.lora is not None else "activation_checkpointing"
            raise NotModelledError(name, getattr(o, name, None) if name == "lora" else plan.activation_checkpointing,
                                   f"{'None' if name == 'lora' else 'none'} with compile={BLOCKS!r} and pp_size > 1",
                                   "compiled blocks under pipeline parallelism are measured without LoRA and "
                                   "checkpointing (validation/compile/measure_blocks_pp.py)")
    elif plan.rank is not None or is_parallel(plan):
        raise NotModelledError("compile", value, f"compile=True on one device (no parallel layout; {BLOCKS!r} "
                               "allows data parallelism)",
                               "a compiled run's per-rank graphs (collectives, FSDP's hooks) are not modelled")
    _check_techniques(plan, value, registry)
    if o.dropout:
        raise NotModelledError("dropout", o.dropout, "0 with compile=True",
                               "dropout's functionalized RNG under the partitioner is not modelled")
    loss = chosen_loss(o)
    if loss is not None and not (value == BLOCKS and loss.compiled_blocks is not None):
        raise NotModelledError("loss", o.loss, "cross_entropy with compile=True (" + " or ".join(
                                   ["cross_entropy", *_compiled_losses(registry)]) + f" with compile={BLOCKS!r})",
                               "the compiled forms of the other loss implementations are not modelled")
    spec = spec_of(plan)
    per_block = value in (BLOCKS, BLOCKS_LOSS)
    if per_block and spec.recomputes != NOTHING and not spec.extensions.get(COMPILED_BLOCKS) and not (
            spec.recomputes == LAYERS and o.checkpointed_layers in (None, plan.model.layers)
            and (not is_parallel(plan) or _data_parallel_full(plan))):
        raise NotModelledError("activation_checkpointing", plan.activation_checkpointing,
                               f"none, op-sac or full (every layer) with compile={BLOCKS!r}: on one device, or under "
                               "data parallelism alone (FSDP2's forward, no extra prefetch, gradients synced every "
                               "micro-batch)",
                               "a block checkpointed in part, or under a parallel layout, compiled apart: its "
                               "recompute is measured for full checkpointing on one device and under FSDP2 in "
                               "torchtune's and torchtitan's orders (validation/compile/measure_blocks_fsdp.py); "
                               "FSDP1, extra prefetch, unsynced gradients and tensor, pipeline, context and expert "
                               "layouts are not measured with it (docs/compile.md)")
    blocks = o.checkpointed_layers
    if spec.recomputes not in (NOTHING, LAYERS) and not per_block:
        raise NotModelledError("activation_checkpointing", plan.activation_checkpointing,
                               "none or full (every layer) with compile=True",
                               f"{plan.activation_checkpointing!r} recomputes part of a layer: its compiled "
                               "recompute schedule is not modelled")
    if spec.recomputes == LAYERS and blocks is not None and blocks < plan.model.layers:
        raise NotModelledError("checkpointed_layers", blocks, f"None or {plan.model.layers} (every layer) with "
                               "compile=True", "some layers checkpointed and some not: not modelled compiled")
    kernel = kernel_of(plan)
    if not kernel.sdpa:
        raise NotModelledError("attention", kernel.name, "an attention kernel that computes SDPA with compile=True",
                               "eager attention's softmax and scores under the partitioner are not modelled")
    shape = shape_of(plan)
    _ops(shape, regime, kernel, plan.seq_len)
    if shape.family.adjust_terms is not None:
        raise NotModelledError("compile", True, "a family that adjusts none of the measured terms (adjust_terms)",
                               f"family {shape.family.name!r} adjusts the eager terms (its masks, scales): their "
                               "compiled counterparts are not modelled")
    window = (getattr(plan.model, "details", None) or {}).get("sliding_window")
    if window:
        raise NotModelledError("compile", True, "a model without sliding-window attention",
                               f"sliding_window={window}: the masks Hugging Face materializes per layer type while "
                               "tracing are not modelled (one causal mask is)")
    extra = undeclared_layer_parameters(shape)
    if extra:
        raise NotModelledError("compile", True, "a family whose layer parameters are its declared linears and "
                               "norms (layer_weights, layer_norms)",
                               f"family {shape.family.name!r} has {_n(extra)} more parameters per model in its layers "
                               "(a QK-norm, biases outside the linears): their ops' compiled saved tensors are not "
                               "declared")
    notes = (BLOCKS_NOTE,) if per_block else (NOTE,)
    if value == BLOCKS_LOSS:
        notes += (LOSS_NOTE,)
    _check_order(plan, per_block and spec.recomputes == LAYERS)
    if per_block and o.lora is not None and _compiled_quantization(o):
        notes += (QLORA_NOTE,)
    if spec.recomputes == LAYERS:
        notes += (BLOCKS_FULL_LORA if o.lora is not None else BLOCKS_FULL_OUTSIDE if outside(plan) else BLOCKS_FULL,
                  ) if per_block else (APPROXIMATE,)
        if per_block and is_parallel(plan):
            notes += (BLOCKS_FULL_FSDP2,)
    return attrs.evolve(plan, notes=plan.notes + notes)


def _data_parallel_full(plan) -> bool:
    """Full checkpointing around compiled blocks under data parallelism alone, in torchtune's order (its distributed
    recipes: compile_model, set_activation_checkpointing, then shard_model's fully_shard on each wrapped layer) or
    torchtitan's (apply_ac, apply_compile, apply_fsdp: the checkpoint inside the compiled block): each block's graph
    and its checkpoint see the gathered parameters and the rank's micro-batch, as on one device
    (validation/compile/measure_blocks_fsdp.py, FSDP2 on ranks of 2 and 4), with FSDP2's forward, no extra prefetch
    and gradients reduce-scattered every micro-batch (the rule's own options)."""
    opts = _dp_options(plan)        # the rule's own options: FSDP2's forward, no extra prefetch, synced gradients
    measured = (getattr(opts, "fsdp_version", 2) == 2 and not getattr(opts, "prefetch_layers", None)
                and getattr(opts, "gradient_sync", "micro-batch") == "micro-batch")
    return plan.tp_size * plan.pp_size * plan.cp_size * plan.ep_size == 1 and measured


def outside(plan) -> bool:
    """compile="blocks" with full checkpointing in torchtune's order (``compile_checkpoint="outside"``, the default
    with LoRA): each compiled block wrapped in the checkpoint, not the checkpoint compiled inside the block."""
    where = getattr(plan.profile_options, "compile_checkpoint", None)
    return where == OUTSIDE or (where is None and plan.profile_options.lora is not None)


def _check_order(plan, full_blocks: bool):
    """``compile_checkpoint``: only with compiled blocks and full checkpointing; "inside" not with LoRA (measured in
    torchtune's order only); else refused by name."""
    where = plan.profile_options.compile_checkpoint
    if where is None:
        return
    if not full_blocks:
        raise NotModelledError("compile_checkpoint", where, f"None unless compile={BLOCKS!r} (or {BLOCKS_LOSS!r}) runs "
                               "with full checkpointing", "there is no checkpoint around a compiled block to place")
    if where == INSIDE and plan.profile_options.lora is not None:
        raise NotModelledError("compile_checkpoint", where, f"{OUTSIDE!r} or None with LoRA (torchtune's order)",
                               "LoRA with the checkpoint inside each compiled block (torchtitan's order) is not "
                               "measured")


def _check_compiled_loss(plan):
    """``compile="blocks+loss"``: torchtitan's compiled ``cross_entropy_loss`` on one device or under data
    parallelism (the loss outside FSDP's units sees the rank's logits), no LoRA; else refused by name."""
    o = plan.profile_options
    what = f"with compile={BLOCKS_LOSS!r}"
    if chosen_loss(o) is not None:
        raise NotModelledError("loss", o.loss, f"cross_entropy {what} (torchtitan v0.2.2's cross_entropy_loss)",
                               "a compiled chunked or fused loss (torchtitan's ChunkedLossWrapper around the "
                               "compiled loss_fn) is not measured")
    if o.lora is not None:
        raise NotModelledError("lora", o.lora, f"None {what}", "torchtitan's compiled loss with LoRA adapters is not "
                               "measured")
    why = {"tp_size": "under tensor parallelism torchtitan computes the loss inside loss_parallel() on the LM head's "
                      "vocabulary-split DTensor logits (each rank's V / tp columns; the max and the sum of exponentials "
                      "all-reduced): the compiled graph of that DTensor cross-entropy is not measured (measured: the "
                      "whole logits of one rank, validation/compile/measure_blocks_extra.py); torchtitan's tensor "
                      "parallelism is sequence-parallel too, which compiled blocks refuse (sequence_parallel)",
           "pp_size": "on a pipeline's last stage torchtitan hands the compiled loss to the schedule, which calls it "
                      "per micro-batch inside its step and keeps each stage output until its backward: the compiled "
                      "loss there is not measured (compiled blocks on a stage are: compile='blocks', "
                      "validation/compile/measure_blocks_pp.py)",
           "cp_size": "under context parallelism the logits are sequence-split and the compiled loss's graph sees "
                      "the rank's shard inside context_parallel(): not measured",
           "ep_size": "expert parallelism with compiled blocks is not modelled"}
    for name in ("pp_size", "tp_size", "cp_size", "ep_size"):
        if getattr(plan, name) > 1:
            raise NotModelledError(name, getattr(plan, name), f"1 {what} (data parallelism only; compile='blocks' "
                                   "with the loss eager takes pipeline stages and tensor parallelism without "
                                   "sequence parallelism)", why[name])


def _check_lora(plan, value):
    """LoRA with compile: per block (torchtune's LoRA and QLoRA recipes with ``compile: True``), plain LoRA adapters
    in the model's dtype over a base in it or in torchao's NF4 (one device), no checkpointing or full; else refused
    by name."""
    from .parallel import is_parallel
    config = plan.profile_options.lora
    if value is True:
        _check_whole_lora(plan, config)
        return
    field, why = (("quant_implementation", f"a {config.quantization} base inside the compiled block is not measured "
                   f"({config.quant_implementation}'s; torchtune's QLoRA is torchao's NF4: quantization='nf4', "
                   "quant_implementation='torchao' on one device, validation/compile/measure_blocks_qlora.py, or under "
                   "data parallelism alone with full checkpointing in torchtune's order, "
                   "validation/compile/measure_blocks_qlora_fsdp.py)")
                  if config.quantization and (not _compiled_quantization(plan.profile_options) or (
                      is_parallel(plan) and not _sharded_quantization(plan)))
                  else ("use_dora", "DoRA's magnitude and weight norm inside the compiled block are not modelled")
                  if config.use_dora else
                  ("dropout", "the adapters' dropout (functionalized RNG under the partitioner) is not modelled")
                  if config.dropout else
                  ("modules_to_save", "trainable copies of the embedding or LM head with compiled blocks are not "
                   "modelled") if config.modules_to_save else (None, None))
    if why:     # (the field that takes it out, named with its value: never the whole LoRAConfig)
        raise NotModelledError(f"lora.{field}", getattr(config, field), f"plain LoRA or QLoRA over torchao's NF4 (one device, or "
                               "FSDP2 with full checkpointing) "
                               f"(quantization='nf4', quant_implementation='torchao'; no DoRA, dropout or modules_to_save) with compile={BLOCKS!r}",
                               why)
    if config.quantization and getattr(plan.profile_options, "activation_offload", None):
        raise NotModelledError("activation_offload", plan.profile_options.activation_offload, f"None with QLoRA and "
                               f"compile={BLOCKS!r}", "offloading the inputs of compiled QLoRA blocks (their "
                               "dequantized weights' moments beside the offload streams) is not measured")
    regime = plan.profile_options.regime
    if regime.compute != 4 and config.adapter_dtype != "base":
        raise NotModelledError("lora.adapter_dtype", config.adapter_dtype, f"'base' in a 16-bit regime with "
                               f"compile={BLOCKS!r} (torchtune's adapters, in the model's dtype)",
                               "peft's fp32 adapters over a 16-bit base (their input's casts) inside a compiled "
                               "block are not measured")
    from .checkpointing import LAYERS, NOTHING, spec_of
    if spec_of(plan).recomputes != NOTHING:
        if spec_of(plan).recomputes != LAYERS:
            raise NotModelledError("activation_checkpointing", plan.activation_checkpointing,
                                   f"none or full with LoRA and compile={BLOCKS!r}",
                                   "a LoRA block checkpointed in part and compiled apart is not modelled")
        _lora_full_mlp(plan)


def _lora_full_mlp(plan):
    """The MLP's ops and whether they are adapted, for LoRA with full checkpointing and compiled blocks: measured
    with every MLP matmul adapted (torchtune's ``apply_lora_to_mlp: True``) or none; else refused by name."""
    from .kernels import kernel_of
    from .lora import _adapted
    from .shapes import shape_of
    ops = _ops(shape_of(plan), plan.profile_options.regime, kernel_of(plan), plan.seq_len)
    mlp = [op for op in ops if op.module == ops[-1].module]
    names = {op.name for op in mlp if op.op == "mm"}
    adapted = names & set(_adapted(plan))
    if adapted and adapted != names or not any(op.reduced for op in mlp) or any(op.op != "mm" for op in mlp):
        raise NotModelledError("lora.target_modules", plan.profile_options.lora.target_modules,
                               f"every MLP linear ({', '.join(sorted(names))}) or none, with full checkpointing and "
                               f"compile={BLOCKS!r} (torchtune's apply_lora_to_mlp)",
                               f"{', '.join(sorted(adapted))} adapted: the compiled MLP backward's buffers are measured "
                               "with the whole MLP adapted or frozen")
    return mlp, bool(adapted)


def _check_whole_lora(plan, config):
    """``compile=True`` with peft's LoRA (Hugging Face Trainer's ``torch_compile``): plain adapters, no
    checkpointing; else refused by name."""
    why = ("bitsandbytes' 4-bit or int8 base inside the compiled model is not modelled (measured, nf4 over bf16, "
           "bitsandbytes 0.50.2 on the CPU: one graph, the end of the forward and the backward peak equal to plain "
           "LoRA's, the forward peak 179,200 B above it: a dequantizing transient not derived)"
           if config.quantization else
           "DoRA's magnitude and weight norm inside the compiled model are not measured" if config.use_dora else
           "trainable copies of the embedding or LM head (the partitioner then saves their inputs) are not measured"
           if config.modules_to_save else None)
    if why:
        raise NotModelledError("lora", config, "plain LoRA (no quantization, DoRA or modules_to_save) with "
                               "compile=True", why)
    regime = plan.profile_options.regime
    if config.dropout:
        from .kernels import kernel_of
        from .lora import _adapted
        from .shapes import shape_of
        ops = _ops(shape_of(plan), regime, kernel_of(plan), plan.seq_len)
        rows = sorted({op.name for op in ops if op.reduced} & set(_adapted(plan)))
        if rows:
            raise NotModelledError("lora.dropout", config.dropout, "0 with compile=True, or > 0 with no adapted "
                                   f"row-parallel linear ({', '.join(rows)} adapted)",
                                   "the adapters' dropout inside the compiled model is measured on the matmuls "
                                   "that read a norm's output (q, k, v, gate, up): each dropout output and bool "
                                   "mask saved")
    if regime.compute != 4:
        if config.adapter_dtype != "fp32":
            raise NotModelledError("lora.adapter_dtype", config.adapter_dtype, "'fp32' in a 16-bit regime with "
                                   "compile=True (peft's default, autocast_adapter_dtype=True)",
                                   "adapters in the base's 16-bit dtype inside the whole compiled peft model are "
                                   "not measured")
        from .kernels import kernel_of
        from .lora import _adapted
        from .shapes import shape_of
        ops = _ops(shape_of(plan), regime, kernel_of(plan), plan.seq_len)
        rows = sorted({op.name for op in ops if op.reduced} & set(_adapted(plan)))
        if rows:
            raise NotModelledError("lora.target_modules", config.target_modules, "in a 16-bit regime with "
                                   "compile=True, no adapted row-parallel linear (" + ", ".join(
                                       op.name for op in ops if op.reduced) + ")",
                                   f"{', '.join(rows)} adapted: the fp32 copies peft casts of their inputs (SDPA's "
                                   "output, the gated product) are saved as modelled, but Inductor's transients "
                                   "around them in the top layer's forward and in the backward are not (measured "
                                   "bf16 all-linear: forward peak -5.3 %, backward peak -8.0 % without them)")
    from .checkpointing import NOTHING, spec_of
    if spec_of(plan).recomputes != NOTHING:
        raise NotModelledError("activation_checkpointing", plan.activation_checkpointing,
                               "none with LoRA and compile=True",
                               "Hugging Face's gradient checkpointing of a peft model calls requires_grad_() on "
                               "the embedding output (enable_input_require_grads' hook), where Dynamo breaks the "
                               "graph: measured 3 graphs, the compiled step's backward peak 7.7 % above the eager "
                               "one (validation/compile/lora_whole_measurements.json); the pieces are not modelled")


def undeclared_layer_parameters(shape) -> int:
    """Parameters in the layers beyond the declared linears and ``layer_norms`` norms (a QK-norm's vectors):
    0 for a family whose layers the compiled saved set describes whole."""
    outside = (shape.embedding_parameters * (1 if shape.tied else 2) + shape.family.norm.parameters * shape.hidden
               + shape.learned_positions * shape.hidden)
    return sum(shape.parameter_tensors()) - outside - shape.layers * shape.layer_parameters()


def _ops(shape, regime, kernel, seq_len):
    """The family's declared op outputs of one layer, every one compute-intensive; else refused by name."""
    family = shape.family
    if family.op_outputs is None:
        raise NotModelledError("compile", True, "a family that declares its layer ops (op_outputs)",
                               f"family {family.name!r} declares no op outputs: what the partitioner saves is "
                               "derived from them")
    ops = tuple(family.op_outputs(shape, "fp32" if regime.compute == 4 else "bf16", kernel, seq_len))
    other = sorted({op.op for op in ops} - set(COMPUTE_INTENSIVE))
    if other:
        raise NotModelledError("compile", True, f"a family whose declared layer ops are {', '.join(COMPUTE_INTENSIVE)}",
                               f"family {family.name!r} declares {', '.join(other)} (a router, grouped mms, eager "
                               "softmax): their compiled saved set is not modelled")
    return ops


# --- the bytes ---------------------------------------------------------------------------------

def layer_saved(shape, regime, kernel, seq_len, tp: int = 1) -> tuple[float, str]:
    """Bytes per token one compiled layer saves (its input, the previous layer's output, not included:
    counted as the residual the reduced op makes), and how. Under tensor parallelism (``tp`` ranks, no
    sequence parallelism) the rank's graph saves the same tensors, each op's output split as it declares
    (``OpOutput.split``: the column-parallel outputs and SDPA's / tp, the all-reduced outputs of the
    row-parallel ops and the norms whole), the matmul-fed products as the op they follow."""
    from .layer_ops import TP
    c = regime.compute
    ops = _ops(shape, regime, kernel, seq_len)

    def share(op):
        return op.nbytes / tp if op.split == TP else op.nbytes
    declared = sum(share(op) for op in ops)
    norms = shape.family.layer_norms * (c * shape.hidden + 4)
    # The input of a row-parallel (reduced) linear that follows another matmul is a fused pointwise
    # product of matmul outputs (SiLU(gate) x up; GELU(fc)): materialized, the preceding op's size.
    products = sum(share(prev) for prev, op in zip(ops, ops[1:]) if op.reduced and prev.op == "mm")
    # With the mask materialized (below), Hugging Face's sdpa_attention_forward does not pass enable_gqa
    # (use_gqa_in_sdpa needs attention_mask None): k and v are repeated to every query head (repeat_kv) and
    # SDPA saves the repeated copies, at the query's width.
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    repeated = 2 * c * (q - kv) / tp if kernel.sdpa else 0
    how = (f"op outputs {_n(declared)} ({', '.join(op.name for op in ops)}) + {shape.family.layer_norms} norms x "
           f"(c h + 4) {_n(norms)} + matmul-fed products {_n(products)}"
           + (f" + k, v repeated to the {shape.heads} query heads {_n(repeated)}" if repeated else "")
           + (f"; tp={tp} splits the column-parallel outputs, norms and residual stream whole" if tp > 1 else ""))
    return declared + norms + products + repeated, how


def lora_layer_saved(plan, shape, regime, kernel, grad_in: bool) -> tuple[float, float, str]:
    """Bytes per token one compiled block saves under LoRA (torchtune's ``LoRALinear``:
    ``F.linear(x, W) + (alpha / r) * lora_b(lora_a(x))``, adapters in the model's dtype), its input not
    included, and the block's output, saved by its reader when the output requires grad; and how.

    The partitioner's rules as in full training, on a joint graph where the base weights need no gradient
    (torch/_functorch/partitioners.py: only what the backward reads is saved): a frozen matmul's input is
    read only by its weight's gradient, so it is not saved; the input gradient needs the weight, a
    parameter. Walking each module (attention, then MLP) in the family's declared op order, with ``g``:
    does the residual stream entering it require grad (the first block's input does not: the embedding is
    frozen; after any adapter it does):

    * the module's norm: its fp32 rsqrt (4 B) when ``g`` (the input's gradient), its output (c h) when one
      of the matmuls that read it is adapted (lora_a's weight gradient);
    * the module's inner tensors (q, k, v expanded to the query heads and SDPA's output and log-sum-exp; gate
      and up) when a gradient flows through them: ``g``, or one of its first matmuls adapted;
    * the row-parallel matmul's input (SDPA's output, the gated product) when it is adapted and not already
      saved; every adapted matmul's r-wide lora_a output (c r, lora_b's weight gradient);
    * the residual sum after the module when it requires grad (the next norm's input gradient): the
      attention's here, the MLP's as the block's output (the next block's saved input, or the final norm's).

    Measured: validation/compile/saved_for_backward-style probe of torchtune 0.6.1's ``lora_llama3_2``
    (docs/compile.md, "Per-block compile with LoRA")."""
    from .lora import _adapted
    c, h = regime.compute, shape.hidden
    r = plan.profile_options.lora.rank
    ops = _ops(shape, regime, kernel, plan.seq_len)
    adapted = set(_adapted(plan))
    named = {op.name for op in ops if op.op == "mm"}
    if not adapted <= named:
        raise NotModelledError("lora", plan.profile_options.lora, f"target modules among the declared layer ops "
                               f"({', '.join(sorted(named))}) with compile={BLOCKS!r}",
                               f"{', '.join(sorted(adapted - named))}: adapted linears the family's declared ops do "
                               "not name")
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    # The adapters' dtype: peft's fp32 adapters over a 16-bit base (compile=True) cast their input to fp32
    # (``Linear.forward``: ``x = self._cast_input_dtype(x, lora_A.weight.dtype)``); the partitioner saves the
    # fp32 copy of a norm's output, of an adapted row-parallel matmul's input (SDPA's output, the gated
    # product; beside the saved 16-bit SDPA output) and lora_a's fp32 output (measured, the bf16 runs of
    # validation/compile/measure_lora_whole.py). In the model's dtype (torchtune's) both are c bytes.
    a = 4 if plan.profile_options.lora.adapter_dtype == "fp32" else c
    p = plan.profile_options.lora.dropout      # (compile=True, no adapted row-parallel linear: _check_whole_lora)
    g, total, parts = grad_in, 0.0, []

    def add(name, n):
        nonlocal total
        if n:
            total += n
            parts.append(f"{name} {_n(n)}")
    modules = list(dict.fromkeys(op.module for op in ops))
    output = 0.0
    for i, module in enumerate(modules):
        mops = [op for op in ops if op.module == module]
        first = [op for op in mops if op.op == "mm" and not op.reduced]
        rest = [op for op in mops if op.op != "mm"]
        last = [op for op in mops if op.reduced]
        if g:
            add(f"{module} norm rsqrt", 4)
        n_first = sum(1 for op in first if op.name in adapted)
        if n_first and p:
            # peft's lora_dropout (compile=True): each adapter draws its own mask on the norm's output; the
            # partitioner saves each dropout output (lora_a's input) and, where the norm's output needs a
            # gradient (g), each bool mask; not the norm's output (measured, fp32 q/v)
            add(f"{module} dropout outputs (lora_a's inputs)", n_first * a * h)
            if g:
                add(f"{module} dropout masks (bool)", n_first * h)
        elif n_first:
            add(f"{module} norm output (lora_a's input)", a * h)
        inner = g or any(op.name in adapted for op in first)
        if inner:
            add(f"{module} " + ", ".join(op.name for op in first), sum(op.nbytes for op in first))
            add(", ".join(op.name for op in rest), sum(op.nbytes for op in rest))
            if rest and kernel.sdpa:
                add("k, v expanded to the query heads", 2 * c * (q - kv))
        for op in last:
            if op.name not in adapted:
                continue
            # its input in the model's dtype: SDPA's output (its op output less the log-sum-exp) or the product
            src = rest[0].nbytes - 4 * shape.heads if rest else first[-1].nbytes
            if not (inner and rest):      # (SDPA's output is saved when inner)
                add(f"{op.name}'s input (lora_a's)", src * a / c)
            elif a != c:                  # the fp32 copy peft casts for lora_a, beside SDPA's saved output
                add(f"{op.name}'s input in the adapters' dtype (lora_a's)", src * a / c)
        add(f"{module} lora_a outputs", a * r * sum(1 for op in mops if op.name in adapted))
        g = g or any(op.name in adapted for op in mops)
        if g:
            if i < len(modules) - 1:
                add(f"residual after {module}", sum(op.nbytes for op in last))
            else:
                output = sum(op.nbytes for op in last)
    return total, output, "; ".join(parts)


def _compiled_quantization(options) -> bool:
    """A quantized base whose implementation declares its compiled form (quantizations.py ``compiled_blocks``:
    torchao's NF4Tensor, torchtune's QLoRA, the reader's quantization='nf4', quant_implementation='torchao')."""
    if not options.lora.quantization:
        return False
    from .quantizations import chosen
    return chosen(options).compiled_blocks

def _sharded_quantization(plan) -> bool:
    """QLoRA with compiled blocks under data parallelism alone, full checkpointing in torchtune's order, over an
    implementation that declares its split over data-parallel ranks (quantizations.py ``shards``: torchao's NF4 under
    FSDP2, torchtune's distributed QLoRA): each compiled block sees the gathered NF4 weight and saves its dequantized
    copies as on one device (validation/compile/measure_blocks_qlora_fsdp.py)."""
    from .checkpointing import LAYERS, spec_of
    from .quantizations import chosen
    return (getattr(chosen(plan.profile_options), "shards", None) is not None and spec_of(plan).recomputes == LAYERS
            and _data_parallel_full(plan))


QLORA_NOTE = ("compile='blocks' with QLoRA (torchtune's qlora_* builders: torchao's NF4 base, linear_nf4): the "
              "partitioner saves each frozen NF4 linear's dequantized weight (c x out x in) where the backward needs "
              "it, not the 4-bit codes: torchao's dequantization (a gather from the NF4 table) is outside its "
              "recomputable allow-list; measured on torchtune 0.6.1 with the base frozen before compile_model, as "
              "the recipes order them (validation/compile/measure_blocks_qlora.py)")


def dequantized_saved(plan, shape, regime, kernel, grad_in: bool) -> tuple[float, str]:
    """Bytes of dequantized base weights one compiled QLoRA block saves (0 without an NF4 base), and how.

    torchao's ``LinearNF4`` (torchtune's ``linear_nf4``) computes ``F.linear(x, W.to(dtype))`` and, in the
    backward, the input's gradient ``g @ W.to(dtype)``. Traced into the block's joint graph, the dequantization
    (``get_original_weight``: shifts, a gather from the 16-entry table, the scalers' products) is a chain whose
    gather (``aten.index``) is outside the partitioner's recomputable allow-list (``ban_if_not_in_allowlist``),
    so the cut falls after it: the dequantized weight (the compute dtype, out x in) is saved for every linear
    whose input needs a gradient, and never recomputed from the codes. With ``grad_in`` (the block's input
    requires grad) that is every linear; in the first block (a frozen embedding below) the attention's first
    matmuls' inputs need none, so only the linears after an adapter (o_proj when q, k or v is adapted, the MLP
    after any attention adapter) save theirs (lora_layer_saved's walk). Measured: the partitioner's outputs of
    torchtune 0.6.1's ``lora_llama3_2(quantize_base=True)`` blocks (the plain LoRA set, each frozen weight
    placeholder replaced by its dequantized copy; validation/compile/measure_blocks_qlora.py)."""
    config = plan.profile_options.lora
    if not _compiled_quantization(plan.profile_options):
        return 0, ""
    from .lora import _adapted, _quantized_linears
    elements = {m: i * o for m, i, o in _quantized_linears(plan)}
    ops = _ops(shape, regime, kernel, plan.seq_len)
    adapted = set(_adapted(plan))
    g, names = grad_in, []
    for module in dict.fromkeys(op.module for op in ops):
        mops = [op for op in ops if op.module == module]
        first = [op for op in mops if op.op == "mm" and not op.reduced]
        inner = g or any(op.name in adapted for op in first)
        names += [op.name for op in mops if op.op == "mm" and (g if not op.reduced else inner)]
        g = g or any(op.name in adapted for op in mops)
    missing = [n for n in names if n not in elements]
    if missing:
        raise NotModelledError("lora.quantization", config.quantization, f"None with compile={BLOCKS!r} for family "
                               f"{shape.family.name!r}", f"{', '.join(missing)}: linears whose quantized weight "
                               "the family's linears do not describe")
    c = regime.compute
    total = c * sum(elements[n] for n in names)
    return total, f"{c} B x ({' + '.join(f'{n} {_n(elements[n])}' for n in names)}) dequantized" if names else ""


def lora_layer_terms(plan, placement) -> list[MemoryTerm]:
    """compile="blocks" with LoRA: every block's compiled saved set (``lora_layer_saved``): the first block's
    input needs no gradient (a frozen embedding), the others' does; each block's output saved by the next
    block (its input) or, after the last, by the final norm (its fused kernel's input). With full
    checkpointing: ``lora_full_terms``."""
    if blocks(plan) and _full(plan):
        return lora_full_terms(plan, placement)
    ctx, kernel = _context(plan, placement)
    s, regime, T = ctx.shape, ctx.regime, ctx.tokens
    L = placement.layers_per_stage
    first, out1, how1 = lora_layer_saved(plan, s, regime, kernel, False)
    other, out, how = lora_layer_saved(plan, s, regime, kernel, True)
    # The last block's output is the eager final norm's input: torchtune's RMSNorm (F.rms_norm(x.float(), ...))
    # saves it in fp32 (the fused kernel) and keeps its fp32 copy instead in 16 bits (the composite: lora.py's
    # final norm term), as without LoRA (layer_terms).
    # compile=True (the whole peft model): the final norm is inside the graph, whose partitioner saves its input
    # (the last block's output) and rsqrt in every dtype (whole_lora_terms).
    last = (out if L > 1 else out1) if regime.compute != 4 and blocks(plan) else 0
    total = (first + out1 + (L - 1) * (other + out) - last) * T
    w1, whow1 = dequantized_saved(plan, s, regime, kernel, False)
    w, whow = dequantized_saved(plan, s, regime, kernel, True)
    weights = [MemoryTerm(component=ACTIVATIONS, label="decoder layers: dequantized NF4 weights saved for backward "
                          "(QLoRA, compiled)", nbytes=w1 + (L - 1) * w, phases=SAVED,
                          formula=f"first block {_n(w1)} B ({whow1 or 'none'}) + {L - 1} blocks x {_n(w)} B ({whow})")
               ] if w else []
    return weights + [MemoryTerm(component=ACTIVATIONS, key=K.LAYERS_SAVED,
                       label="decoder layers: saved for backward (LoRA, compiled)",
                       nbytes=total, phases=SAVED,
                       formula=f"T={_n(T)} x (first block {_n(first + out1)} B ({how1}; output {_n(out1)}) + {L - 1} "
                               f"blocks x {_n(other + out)} B ({how}; output {_n(out)})"
                               + (f" - {_n(last)} B (the last block's output: the 16-bit final norm keeps its fp32 "
                                  "copy, not it)" if last else "") + ") (the partitioner's saved set, base weights "
                               "frozen)")]


def lora_full_terms(plan, placement) -> list[MemoryTerm]:
    """compile="blocks", LoRA and full checkpointing in torchtune's order (recipes/lora_finetune_single_device.py
    ``_setup_model``, torchtune 0.6.1: ``training.compile_model(model)``, then ``training.set_activation_checkpointing``
    wraps each compiled layer in a non-reentrant ``checkpoint_wrapper``, ``preserve_rng_state`` on): the checkpoint
    is outside the compiled graph, so the compiled forward makes the block's whole saved set and the checkpoint's
    hooks drop it; the backward re-runs the compiled forward (the recompute) and then the block's compiled
    backward graph. Read event by event from the profiler's timeline (validation/compile/measure_blocks_extra.py,
    fp32 and bf16, q/v and every linear, MHA and GQA) and derived from the LoRA saved set (``lora_layer_saved``,
    per token: S without the block's output, P the gated product's size, r the rank):

    * **kept**: each layer's input (c T h) and on the CPU its RNG state, and in fp32 the last block's output
      (the fused final norm's input; in 16 bits its fp32 copy, the LoRA final norm's term);
    * **the forward's top**, the top block's compiled forward: the layers' inputs and T x (S + the transients at
      its MLP): with a frozen MLP the product (not saved: the frozen down projection keeps no input) and the
      down projection's output (the block's output); with the MLP adapted, when the product is written, each
      adapted gate/up's lora_b output (P each; down's r-wide lora_a output not yet), or at the down projection
      its base and lora_b outputs (2 c h), the larger. Priced beyond the loss's forward terms, which do not
      exist yet at that moment;
    * **the backward's top**, the top block's recompute and MLP backward (a late-backward moment): the layers'
      inputs (the top one's RNG state freed), the block output's gradient (c T h), the recomputed set T x S and
      the MLP backward's buffers: with a frozen MLP two of the product's size (gate's and up's gradients); with
      the MLP adapted five, the product and down's lora_a output freed (its adapters' weight gradients
      computed) and those two gradients born, r (P / c + h) x g; the other adapters' gradients not born (with
      gradient accumulation they are alive: counted with the gradients);
    * **a lower block's moment**, the same recompute and MLP backward with each upper block's input and RNG state
      freed and its adapters' gradients born: the highest of the top block's, block 1's and block 0's (block 0's
      saved set the first block's) is the backward's peak (validation/lora_offload's rank-64 twin: block 0's,
      +0.77 %, where the top block's alone was -5.88 %);
    * **QLoRA** (torchtune's NF4 base): each moment inside a block holds its dequantized weights
      (``dequantized_saved``: written at the block's start), the MLP backward's all but the down projection's;
      with the MLP frozen, on the CPU in 16 bits, the matmuls' fp32 outputs move the peaks to up's matmul (the
      forward) and the down projection's input gradient (the backward; validation/compile/measure_blocks_qlora.py)."""
    from . import lora as lora_mod
    ctx, kernel = _context(plan, placement)
    s, regime, T, L = ctx.shape, ctx.regime, ctx.tokens, placement.layers_per_stage
    c, h, g = regime.compute, s.hidden, regime.gradient or 4
    r = plan.profile_options.lora.rank
    rng = _rng(plan)
    other, out, how = lora_layer_saved(plan, s, regime, kernel, True)
    mlp, adapted = _lora_full_mlp(plan)
    down = next(op for op in mlp if op.reduced)
    product = mlp[-2].nbytes          # the down projection's input: the op before it (the gated product's size)
    firsts = [op for op in mlp if op.op == "mm" and not op.reduced]
    if adapted:
        at_product = other - c * r + sum(op.nbytes for op in firsts)
        at_down = other + 2 * down.nbytes
        forward, fhow = max(at_product, at_down), (
            f"S {_n(other)} + max({_n(sum(op.nbytes for op in firsts))} (each adapted {', '.join(op.name for op in firsts)}"
            f"'s lora_b output, when the product is written) - {_n(c * r)} (down's lora_a output, not yet), "
            f"{_n(2 * down.nbytes)} (the down projection's base and lora_b outputs))")
        work = other - product - c * r + 5 * product
        down_grads = r * (product / c + h) * g
        bhow = (f"S {_n(other)} - {_n(product)} (the product, freed) - {_n(c * r)} (down's lora_a output, freed) + 5 x "
                f"{_n(product)} (the MLP backward's product-sized buffers)")
    else:
        forward = other + product + out
        fhow = f"S {_n(other)} + {_n(product)} (the product, not saved) + {_n(out)} (the down projection's output)"
        work, down_grads = other + 2 * product, 0
        bhow = f"S {_n(other)} + 2 x {_n(product)} (gate's and up's gradients)"
    last = c * T * h if c == 4 else 0
    inputs = L * (c * T * h + rng)
    terms = [MemoryTerm(component=ACTIVATIONS, key=K.CHECKPOINTED_INPUTS,
                        label="checkpointed layers: their inputs (compiled, LoRA)",
                        nbytes=inputs + last, phases=SAVED,
                        formula=f"{L} layers x (T x h x {c} B" + (f" + {rng:,} B CPU RNG state)" if rng else ")")
                                + (" + T x h x 4 (the last block's output, the fused final norm's input)" if last
                                   else ""))]
    model_terms = lora_mod.model_activation_terms(plan, placement, recompute=True)
    during = (K.TOKEN_IDS, *K.ROPE_TABLE_KEYS)       # alive while the layers run
    loss_side = sum(t.nbytes for t in model_terms if FORWARD in t.phases and t.key not in during)
    # QLoRA: a block's saved set holds its dequantized NF4 weights too (dequantized_saved), made by the top block's
    # compiled forward and by each block's recompute
    wq, whow = dequantized_saved(plan, s, regime, kernel, True)
    if wq:
        # QLoRA: the compiled block dequantizes every NF4 weight at its start (Inductor schedules the dequantizing
        # kernels first: measured, seven weight-sized buffers before the first matmul), so the forward's moments
        # hold them all (wq) and the MLP backward's, after the down projection's input gradient, all but the down
        # projection's (freed). With the MLP frozen, on the CPU in 16 bits, each matmul over a dequantized weight
        # first writes its output in fp32 (4 B x T x out + 128, freed at the cast; the CPU's lowering, not
        # priced elsewhere): the forward's peak is at up's matmul (the saved set, gate's and up's outputs among
        # it, and that fp32 output, T x f x 4), the backward's at the down projection's input gradient (the
        # recomputed saved set, every weight, the product's gradient and its fp32 copy).
        from .lora import _quantized_linears
        n_down = next(i * o for m, i, o in _quantized_linears(plan) if m == down.name)
        wd = c * n_down
        x = 4 * product / c if c != 4 and (plan.profile_options.device or "cuda") == "cpu" and not adapted else 0
        if x and other + x > forward:
            forward, fhow = other + x, f"S {_n(other)} + {_n(x)} (up's output in fp32, the CPU's 16-bit matmul)"
    else:
        wd = x = 0
    held, fsdp = fsdp2_around_blocks(plan, placement, c * T * h, rng, L)
    excess = forward * T + wq + held - last - loss_side
    if excess > 0:
        terms.append(MemoryTerm(component=ACTIVATIONS, label="the top compiled block's forward (its saved set before "
                                "the checkpoint drops it)", nbytes=excess, phases=(FORWARD,),
                                formula=f"T x ({fhow}) = T x {_n(forward)} B"
                                        + (f" + {_n(wq)} B ({whow})" if wq else "")
                                        + (f" + {_n(held)} B (FSDP2: the last all-gather's output, kept until the next "
                                           "all-gather" + (", and the block's and the root's gathered parameters, "
                                                           "resharded after the forward in the rule's terms"
                                                           if _root_resharded(plan) else "") + ")"
                                           if held else "") + ", beyond what the end of the forward "
                                        f"holds in its place (the loss's forward terms {_n(loss_side)} B"
                                        + (", the last block's output" if last else "") + ")"))
    # The adapters' gradients are the gradient terms' (BACKWARD_END): at this moment only down's exist, unless
    # accumulation keeps every one alive.
    accumulating = plan.gradient_accumulation_steps > 1
    # (the gradient terms hold the adapters' gradients as the rules shard them: FSDP2's reduce-scattered shards)
    shards = placement.gradient_shards if fsdp else 1
    unborn = 0 if accumulating else lora_mod.stage_trainable(plan, L) * g / shards - down_grads
    rope = K.rope_table_bytes(model_terms)    # on the device (SAVED: not in BACKWARD_END)
    at_down = (other + product + x) * T + wq      # the frozen MLP's down projection's input gradient (CPU, 16 bits)
    if x and at_down > work * T + wq - wd:
        block, bhow = at_down, (f"T x (S {_n(other)} + {_n(product)} (the product's gradient) + {_n(x)} (its fp32 "
                                f"copy, the CPU's 16-bit matmul)) + {_n(wq)} ({whow})")
    else:
        block = work * T + wq - wd
        bhow = f"T x ({bhow}) = T x {_n(work)}" + (f" + {_n(wq - wd)} (the block's dequantized NF4 weights but the "
                                                   "down projection's, freed)" if wq else "")
    moment = inputs - rng + c * T * h + block + rope - unborn
    formula = (f"{L} layers' inputs {_n(inputs - rng)} (the top one's RNG state freed) + T x h x {c} (the block "
               f"output's gradient) + {bhow}"
               + (f" + {_n(rope)} (the RoPE tables)" if rope else "")
               + (f" - {_n(unborn)} (the adapters' gradients not born yet: all but down's {_n(down_grads)})"
                  if unborn else ""))
    label = "the top block's compiled recompute and MLP backward"
    # Each lower block's moment is the same recompute and MLP backward with the inputs of the blocks above freed
    # (each checkpoint's saved input and RNG state released after its block's backward: c T h + the RNG state
    # each) and their adapters' gradients born (each block's adapters x g, none more with accumulation: alive
    # throughout); the first block's saved set is smaller (its input needs no gradient, lora_layer_saved). Linear
    # in the block's index between the top and block 1: the peak is the top's, block 1's or block 0's (measured:
    # validation/lora_offload's rank-64 twin without offloading, block 0's). activation_offload moves the inputs
    # to the host and compares every block's moment from the top's (offload_activations.lora_terms): the top's.
    # Under FSDP2 (fsdp2_around_blocks) each block's moment holds its gathered parameters and the root's, the block
    # below's prefetched all-gather (not block 0's), the blocks above's adapter gradients as reduce-scattered shards
    # (/ W) and, below the top, the last reduce-scatter's input (the rule's term; none at the top block yet).
    gathered = 0
    if fsdp is not None:
        from .buffers import _layer_gather, fsdp_root
        gather, scatter = _layer_gather(plan, placement)[:2]
        gathered = gather.nbytes
        at_top = (2 if L > 1 else 1) * gathered + sum(t.nbytes for t in fsdp_root(plan, placement)) - scatter.nbytes
        if L == 1:
            moment += at_top
            formula += f"; FSDP2: + {_n(at_top)} (its gathered parameters and the root's; no reduce-scatter input yet)"
    if L > 1 and not getattr(plan.profile_options, "activation_offload", None):
        grow = 0 if accumulating else lora_mod.stage_trainable(plan, 1) * g / (placement.gradient_shards if fsdp
                                                                                else 1)
        step = grow - c * T * h - rng          # one block lower
        first = lora_layer_saved(plan, s, regime, kernel, False)[0]
        moments = {"top": at_top if fsdp else 0}
        lower = at_top + scatter.nbytes if fsdp else 0       # below the top: the reduce-scatter input held
        if L > 2:
            moments["block 1"] = lower + (L - 2) * step
        moments["block 0"] = lower - gathered + (L - 1) * step - (other - first) * T - (
            wq - dequantized_saved(plan, s, regime, kernel, False)[0])
        which = max(moments, key=moments.get)
        if fsdp is not None and which == "top":
            moment += moments[which]
            label = "the top block's compiled recompute and MLP backward (FSDP2)"
            formula += (f"; FSDP2: + {_n(moments['top'])} (its gathered parameters and the root's, the block below's "
                        f"prefetched all-gather, {_n(gathered)} B each layer; no reduce-scatter input yet; moments: "
                        + ", ".join(f"{k} {_n(v)}" for k, v in moments.items()) + ")")
        elif moments[which] > 0:
            moment += moments[which]
            label = f"the compiled recompute and MLP backward of {which} (the highest block's moment)"
            formula += (f"; at {which}: {'+' if moments[which] >= 0 else ''}{_n(moments[which])} (per block lower: "
                        f"{_n(grow)} B of adapter gradients born - {_n(c * T * h)} B input"
                        + (f" - {_n(rng)} B RNG state" if rng else "") + " freed"
                        + (f"; block 0's saved set {_n(moments['block 0'] - (L - 1) * step)} B" if which == "block 0"
                           else "")
                        + f"; moments: {', '.join(f'{k} {_n(v)}' for k, v in moments.items())})")
    terms.append(MemoryTerm(component=ACTIVATIONS, label=label, nbytes=moment, phases=(BACKWARD_END,),
                            formula=formula))
    return terms


def _context(plan, placement):
    from .kernels import kernel_of
    from .model import context
    ctx = context(plan, placement)
    return ctx, kernel_of(plan)


def _full(plan) -> bool:
    from .checkpointing import whole_layers
    return whole_layers(plan)


def _rng(plan) -> int:
    return CPU_RNG_STATE if (plan.profile_options.device or "cuda") == "cpu" else 0


def layer_terms(plan, placement) -> list[MemoryTerm]:
    """The decoder layers, compiled: every layer's saved set, or under full checkpointing their inputs."""
    ctx, kernel = _context(plan, placement)
    s, regime, T, L = ctx.shape, ctx.regime, ctx.tokens, ctx.layers
    c = regime.compute
    if not _full(plan):
        per_token, how = layer_saved(s, regime, kernel, plan.seq_len, ctx.tensor)
        # A pipeline stage (compile="blocks"): its blocks' sets for each micro-batch in flight.
        n = plan.rank.in_flight if plan.rank is not None else 1
        flying = f" x {n:g} micro-batches in flight" if n != 1 else ""
        out = [MemoryTerm(component=ACTIVATIONS, key=K.LAYERS_SAVED,
                          label="decoder layers: saved for backward (compiled)",
                          nbytes=L * per_token * T * n, phases=SAVED,
                          formula=f"{L} layers x T={_n(T)} x {_n(per_token)} B ({how}; the partitioner's "
                                  "saved set)" + flying)]
        if blocks(plan):
            # The first block's input (the embedding output, on a later pipeline stage the received activation)
            # is a graph input the block saves for its norm's backward: the eager terms count it where the eager
            # norm saves its input (fp32: model_activation_terms, "saved by the first norm"); in 16 bits they do
            # not (Hugging Face's norm keeps an fp32 copy instead) and it is counted here. On the last stage the
            # last block's output is the eager final norm's input, which torchtune's RMSNorm in 16 bits does not
            # keep (final_norm_term: its fp32 copy instead): freed, counted in the blocks' set. A non-last stage's
            # output is kept for its backward (the schedule's).
            norm = s.family.norm
            counted = norm.saves_input_in_16bit or not regime.pure_16bit
            on_last = plan.rank is None or plan.rank.last
            last = c * T * s.hidden if c != 4 and on_last else 0
            what = "embedding output" if plan.rank is None or plan.rank.first else "stage input"
            if not counted:
                out.append(MemoryTerm(
                    component=ACTIVATIONS, label=f"{what} (the first block's input, saved)",
                    nbytes=(c * T * s.hidden - last) * n, phases=SAVED,
                    formula=f"(T x h x {c} B (saved by the first compiled block for its norm's backward)"
                            + (f" - T x h x {c} B (the last block's output, counted in the blocks' set: the eager "
                               "final norm keeps its fp32 copy, not it)" if last else "") + ")" + flying))
        return out
    if blocks(plan):
        return blocks_outside_full_terms(plan, placement) if outside(plan) else blocks_full_terms(plan, placement)
    rng = _rng(plan)
    h, b, seq = s.hidden, plan.microbatch, plan.seq_len
    per_token, how = layer_saved(s, regime, kernel, seq)
    ops = _ops(s, regime, kernel, seq)
    product = max((prev.nbytes for prev, op in zip(ops, ops[1:]) if op.reduced and prev.op == "mm"), default=0)
    mask = c * b * seq * seq
    # The top layer's forward inside its checkpoint: nothing of it is saved; at its MLP the mid residual, the
    # norm's output and the two matmul outputs of the gated product are alive (Inductor frees each at its last use).
    mlp_in = sum(op.nbytes for op, nxt in zip(ops, ops[1:] + ops[:1]) if op.op == "mm" and not op.reduced
                 and op.module == ops[-1].module)
    # Beyond the end of the forward, where the final norm, the logits and the loss's part exist instead:
    forward = max(0.0, (2 * c * h + mlp_in) * T - _loss_side(plan, s, c))
    # The backward recomputes one checkpointed layer at a time inside the one compiled backward graph: the
    # recomputation regenerates the partitioner's per-layer set (everything a compiled layer saves) and the
    # layer's backward adds the gradient of its residual and two of the gated product's size (its gradient
    # and a matmul output's); Inductor reuses these buffers from layer to layer.
    # The recomputation also keeps what the partitioner's set holds once: rotary q and k before RoPE beside
    # their rotated copies, o's output beside the residual sum it makes.
    rotary = c * (s.heads + s.kv_heads) * s.head_dim if s.family.positions == "rotary" else 0
    # Its backward's data gradients, alive together while the weight-gradient matmuls wait for them: the
    # residual's, the gated MLP's three (the product's, gate's, up's) and SDPA's three input gradients (q, and
    # k and v at the query's width).
    sdpa_grads = 3 * c * s.heads * s.head_dim if kernel.sdpa else 0
    work = (per_token + rotary + c * h + c * h + 3 * product + sdpa_grads) * T
    inputs = L * (c * T * h + rng)
    return [t for t in (MemoryTerm(component=ACTIVATIONS, key=K.CHECKPOINTED_INPUTS,
                                   label="checkpointed layers: their inputs (compiled)",
                       nbytes=inputs, phases=SAVED,
                       formula=f"{L} layers x (T x h x {c} B" + (f" + {rng:,} B CPU RNG state)" if rng else ")")),
            MemoryTerm(component=ACTIVATIONS, label="compiled checkpointed forward: the top layer's MLP",
                       nbytes=forward, phases=(FORWARD,),
                       formula=f"T x (2 x h x {c} (the mid residual, the norm's output) + {_n(mlp_in)} (the MLP's "
                               "first matmul outputs)) beyond what the end of the forward holds in their place (the "
                               "final norm, the logits, the loss's part); approximate: Inductor's buffer reuse"),
            _backward_end(plan, placement, recompute=(
                c * T * h + rng + mask + work,
                f"the first layer's recompute and backward: its input T x h x {c} + {rng:,} (RNG state) + mask "
                f"{_n(mask)} + T x ({_n(per_token)} (the layer's compiled saved set, recomputed) + {_n(rotary)} (q, k "
                f"before RoPE) + h x {c} (o's output beside the residual) + h x {c} (the residual's gradient) + 3 x "
                f"{_n(product)} (the gradients of the gated product, gate and up) + {_n(sdpa_grads)} (SDPA's input "
                "gradients)); approximate: Inductor's schedule of the recomputation inside one backward graph")))
            if t.nbytes or FORWARD not in t.phases or BACKWARD in t.phases]     # (no forward excess: no term)


def blocks_full_terms(plan, placement) -> list[MemoryTerm]:
    """compile="blocks" with full checkpointing, in torchtitan's order (parallelize_llama.py: ``apply_ac`` wraps
    each block in ``checkpoint_wrapper``, then ``apply_compile`` compiles the wrapped block: the checkpoint
    inside the graph). The partitioner makes the checkpointed region's nodes ``MUST_RECOMPUTE``: the forward
    keeps each block's input, as eager full checkpointing does (measured: the end of the forward equal to
    eager's to the byte). The backward graph of a block recomputes its forward and runs its backward in
    Inductor's order; its peak is the MLP's backward: the recomputed set (the block's compiled saved set,
    ``layer_saved``, but its output, which is not recomputed) with the gated product's three gradients
    (the product's, gate's and up's: 3 x T x the product's size) alive, no weight gradient of the block born
    yet (measured event by event on the 3-layer cell: every block's segment the same). The backward's end is
    eager's structure (``checkpointing_policies.last_moments``: the other layers' gradients, layer 0's input
    and output gradient, the RoPE tables, or the embedding's backward, the larger) with this set in place of
    the eager recompute's."""
    from . import model
    from ..checkpointing_policies import _mlp_backward_peak, last_moments
    ctx, kernel = _context(plan, placement)
    s, regime, T, L = ctx.shape, ctx.regime, ctx.tokens, ctx.layers
    per_token, how = layer_saved(s, regime, kernel, plan.seq_len, ctx.tensor)
    ops = _ops(s, regime, kernel, plan.seq_len)
    product = max((prev.nbytes for prev, op in zip(ops, ops[1:]) if op.reduced and prev.op == "mm"), default=0)
    output = ops[-1].nbytes if ops[-1].reduced else 0
    work = (per_token - output + 3 * product) * T
    lb = model.layer_bytes(plan, ctx)
    eager_mlp, _ = _mlp_backward_peak(ctx, lb, regime, plan.gradient_accumulation_steps > 1)
    end = last_moments(plan, placement, ctx, attrs.evolve(lb, saved=work - eager_mlp), kept=0, unborn_layers=1)
    r = regime.residual
    # FSDP2 (torchtitan's apply_fsdp after apply_compile): block i's backward graph, its recompute inside, holds what
    # fsdp2_around_blocks says (torchtitan's checkpoint keeps no RNG state: preserve_rng_state=False); the forward's
    # peak is the loss's, after the blocks, where the rule's terms price FSDP2 (measured: validation/compile/
    # measure_blocks_fsdp.py, the -full-in- runs)
    _, fsdp = fsdp2_around_blocks(plan, placement, r * T * s.hidden, 0, L)
    return [*([fsdp] if fsdp else []), MemoryTerm(component=ACTIVATIONS, key=K.CHECKPOINTED_INPUTS,
                       label="checkpointed layers: their inputs", nbytes=L * r * T * s.hidden,
                       phases=SAVED, formula=f"{L} layers x T x h x {r} B (the compiled checkpointed blocks' inputs)"),
            attrs.evolve(end, formula=f"layer 0's compiled recompute: T x ({_n(per_token)} (the block's compiled "
                                      f"set: {how}) - {_n(output)} (its output, not recomputed) + 3 x {_n(product)} "
                                      f"(the gated product's, gate's and up's gradients)) = {_n(work)} B in place of "
                                      "the eager recompute; " + end.formula)]


def blocks_outside_full_terms(plan, placement) -> list[MemoryTerm]:
    """compile="blocks" with full checkpointing in torchtune's order (``compile_checkpoint="outside"``;
    recipes/full_finetune_single_device.py ``_setup_model``, torchtune 0.6.1: ``training.compile_model(model)``, then
    ``training.set_activation_checkpointing`` wraps each compiled layer in a non-reentrant ``checkpoint_wrapper``,
    ``preserve_rng_state`` on): the checkpoint is outside the compiled graph. Read event by event from the profiler's
    timeline (validation/compile/measure_blocks_order.py ``--events``; fp32 and bf16, MHA and GQA, torchtune's
    chunked loss) and derived from the compiled saved set S (``layer_saved``, per token), P the gated product's size:

    * **kept**: each layer's input, as in torchtitan's order (the end of the forward is eager's), and on the CPU
      each layer's RNG state (``torch.get_rng_state()``, freed at its recompute);
    * **the forward's top**, the top block's compiled forward: every layer's input and RNG state and the block's
      whole saved set T x S (its output included) before the checkpoint's hooks drop it, before the final norm,
      the logits and the loss exist (measured to the byte on the 3-layer fp32 cell);
    * **the backward's top**, layer 0's recompute and MLP backward (``last_moments``' structure: the other layers'
      gradients, layer 0's input and its output's gradient): the recompute re-runs the compiled forward outside the
      backward graph (T x S, its output freed at once); the block's backward graph then writes the down projection's
      weight gradient (f x h x g), frees the product and writes two of its size (gate's and up's gradients): T x
      (S - out + P) + f h g, where torchtitan's order holds T x (S - out + 3 P). With tied embeddings the LM head's
      weight gradient (V x h x g) waits in the shared weight's gradient buffer from the LM head's backward on
      (measured: the 1,024-token tied cells)."""
    from . import model
    from ..checkpointing_policies import _mlp_backward_peak, last_moments
    ctx, kernel = _context(plan, placement)
    s, regime, T, L = ctx.shape, ctx.regime, ctx.tokens, ctx.layers
    c, h, g, r = regime.compute, s.hidden, regime.gradient or 4, regime.residual
    rng = _rng(plan)
    per_token, how = layer_saved(s, regime, kernel, plan.seq_len, ctx.tensor)
    ops = _ops(s, regime, kernel, plan.seq_len)
    product = max((prev.nbytes for prev, op in zip(ops, ops[1:]) if op.reduced and prev.op == "mm"), default=0)
    output = ops[-1].nbytes if ops[-1].reduced else 0
    down = product // c * h * g           # the down projection's weight gradient: it reads the product (f wide)
    accumulating = plan.gradient_accumulation_steps > 1      # (every gradient alive already: last_moments)
    tied = s.embedding_parameters * g if s.tied and not accumulating else 0
    work = (per_token - output + product) * T + down + tied
    lb = model.layer_bytes(plan, ctx)
    eager_mlp, _ = _mlp_backward_peak(ctx, lb, regime, accumulating)
    end = last_moments(plan, placement, ctx, attrs.evolve(lb, saved=work - eager_mlp), kept=0, unborn_layers=1)
    inputs = MemoryTerm(component=ACTIVATIONS, key=K.CHECKPOINTED_INPUTS,
                        label="checkpointed layers: their inputs", nbytes=L * r * T * h,
                        phases=SAVED, formula=f"{L} layers x T x h x {r} B (the checkpointed compiled blocks' inputs)")
    # The top block's forward: beyond the end of the forward's terms that do not exist yet (the final norm, the
    # logits, the loss's part) and, in fp32, the top block's output counted as the final norm's input.
    during = (K.TOKEN_IDS, *K.ROPE_TABLE_KEYS, K.EMBEDDING_OUTPUT)
    later = sum(t.nbytes for t in model.model_activation_terms(plan, placement, recompute=True)
                if FORWARD in t.phases and t.key not in during)
    last = c * T * h if c == 4 else 0
    held, fsdp = fsdp2_around_blocks(plan, placement, r * T * h, rng, L)
    excess = per_token * T + L * rng + held - later - last
    terms = [inputs]
    if excess > 0:
        terms.append(MemoryTerm(
            component=ACTIVATIONS, label="the top compiled block's forward (its saved set before the checkpoint "
                                         "drops it)", nbytes=excess, phases=(FORWARD,),
            formula=f"T x {_n(per_token)} B ({how}; the block's whole compiled set)"
                    + (f" + {L} x {rng:,} B (CPU RNG states)" if rng else "")
                    + (f" + {_n(held)} B (FSDP2: the last all-gather's output, kept until the next all-gather"
                       + (", and the block's and the root's gathered parameters, which the rule's forward terms leave "
                          "out with the root resharded after the forward" if _root_resharded(plan) else "") + ")"
                       if held else "") + f" - {_n(later)} B (the final norm's, "
                    "the logits' and the loss's forward terms, not yet)" + (" - T x h x 4 (the top block's output, "
                                                                           "counted as the final norm's input)"
                                                                           if last else "")))
    if getattr(plan.profile_options, "optimizer_in_backward", None):
        # torchtune's optimizer_in_bwd: every gradient stepped and freed by its post-accumulate-grad hook, so the
        # first block's backward (the top one: every layer's input still alive) is the layers' largest moment, its
        # output's gradient and work as above (validation/compile/measure_blocks_order.py, -oib- runs); the end
        # terms that do not exist yet (the embedding output's gradient, the tied partials) are set against it
        acts = model.model_activation_terms(plan, placement, recompute=True)
        end_only = sum(t.nbytes for t in acts if tuple(t.phases) == (BACKWARD_END,))
        rope = K.rope_table_bytes(acts)
        top = L * r * T * h + (L - 1) * rng + r * T * h + rope + work - end_only
        if top > end.nbytes:
            return terms + [MemoryTerm(
                component=ACTIVATIONS, label="the top block's compiled recompute and MLP backward (optimizer in "
                                             "backward: no other gradient alive)", nbytes=top, phases=(BACKWARD_END,),
                formula=f"{L} layers' inputs T x h x {r} + {L - 1} x {rng:,} B (RNG states; the top one's freed) + T x "
                        f"h x {r} (its output's gradient) + {_n(rope)} (RoPE) + {_n(work)} (its recompute and MLP "
                        f"backward: {_n(per_token)} - {_n(output)} + {_n(product)} per token, the down projection's "
                        f"weight gradient" + (", the tied LM head's gradient waiting" if tied else "")
                        + f") - {_n(end_only)} (the end-of-backward terms, not yet); larger than layer 0's moment "
                        f"({_n(end.nbytes)})")]
    if fsdp:
        terms.append(fsdp)
    terms.append(attrs.evolve(end, formula=f"layer 0's recompute outside its backward graph, then the graph: T x "
                                           f"({_n(per_token)} (the block's compiled set: {how}) - {_n(output)} (its "
                                           f"output, freed) + {_n(product)} (the product freed, gate's and up's "
                                           f"gradients)) + {_n(down)} (the down projection's weight gradient)"
                                           + (f" + {_n(tied)} (tied: the LM head's weight gradient, waiting)" if tied
                                              else "") + f" = {_n(work)} B in place of the eager recompute; "
                                           + end.formula))
    return terms


def _dp_options(plan):
    """The data-parallel rule's options object (what it declares of itself), or None."""
    rule = plan.rules.get("dp") if plan.rules else None
    return plan.options_for(rule) if rule else None


def _root_resharded(plan) -> bool:
    return bool(getattr(_dp_options(plan), "root_reshard_after_forward", False))


def fsdp2_around_blocks(plan, placement, block_input: float, rng: int, L: int,
                        what: str = "the compiled blocks'") -> tuple[float, MemoryTerm | None]:
    """What FSDP2 (``fully_shard`` on each checkpoint-wrapped compiled layer and on the root: torchtune's
    ``shard_model``, ``reshard_after_forward=True``) holds around the compiled blocks beyond the data-parallel rule's
    buffers (one gathered layer and the root's parameters in the forward and backward, one layer's reduce-scatter
    input at the backward's end), read event by event from validation/compile/measure_blocks_fsdp.py's timelines
    (torch 2.13 ``_fsdp_param_group.py``):

    * **the forward**: each layer's all-gather output is kept after its copy-out until the next all-gather
      (``comm_ctx.all_gather_state``, "defer free to allow for overlap of this copy-out with next all-gather"): one
      layer's gathered bytes G beside the top block's forward;
    * **the backward**: block i's recompute and MLP backward hold its gathered parameters (G) and the root's, the
      all-gather of block i - 1 prefetched (G, for i >= 1), the reduce-scatter input of block i + 1 (kept until the
      next reduce-scatter, ``reduce_scatter_states``; none at the top block) and the reduce-scattered gradient
      shards of the blocks above (R / W each); from block to block upward one more input (and RNG state) is alive
      and one gradient shard less: the moment of block i is block 0's + G (the prefetch) + i x (input + RNG - R / W)
      (- R at the top), the highest of them priced. Nothing without weight sharding.

    Returns the forward's held bytes (G; with the root resharded after the forward, the rule's options say so, G +
    the root's more: the rule's forward terms leave them out) for the caller's top-block forward moment (torchtune's
    order; in torchtitan's, blocks_full_terms, the forward's peak is the loss's and only the backward's term is
    used) and the backward's term (BACKWARD_END). Gradient accumulation (not measured): no shard is born per block.
    ``what`` names the layers in the term's label: the eager twins share the mechanism (buffers.fsdp2_eager_checkpointed)."""
    if placement.weight_shards == 1 or L < 1:
        return 0, None
    from .buffers import _layer_gather, fsdp_root
    gather, scatter = _layer_gather(plan, placement)[:2]
    G, R, W = gather.nbytes, scatter.nbytes, placement.weight_shards
    root = sum(t.nbytes for t in fsdp_root(plan, placement))
    # A rule whose options say the root is resharded after the model's forward (torchtune's shard_model; the
    # torchtune reader sets it) leaves the gathered layer and the root out of its forward terms (the forward's end);
    # the top block's forward, inside the model's, holds them: counted here then.
    held = G + (G + root if _root_resharded(plan) else 0)
    # (with gradient accumulation every block's shard exists from the first micro-batch on: none is born per block)
    shard = R / W if plan.gradient_accumulation_steps == 1 else 0
    step = block_input + rng - shard
    moments = {0: 0.0}
    for i in sorted({1, L - 2, L - 1} & set(range(1, L))):
        moments[i] = G + i * step - (R if i == L - 1 else 0)
    top = max(moments, key=lambda i: (moments[i], -i))
    extra = moments[top]
    return held, MemoryTerm(component=ACTIVATIONS, label=f"FSDP2 around {what} recompute and backward",
                   nbytes=G + root + extra, phases=(BACKWARD_END,),
                   formula=f"{_n(G)} B (the block's gathered parameters) + {_n(root)} B (the root's, gathered) + "
                           f"{_n(extra)} B at block {top} (block 0's moment + {_n(G)} B, the block below's prefetched "
                           f"all-gather, + i x ({_n(block_input)} B input" + (f" + {rng:,} B RNG state" if rng else "")
                           + f" - {_n(shard)} B gradient shard) per block up, - {_n(R)} B (no reduce-scatter input "
                           f"yet) at the top; moments above block 0: "
                           + ", ".join(f"block {i} {_n(v)}" for i, v in moments.items()) + ")")


def _backward_end(plan, placement, recompute=None) -> MemoryTerm:
    """The compiled backward's end: the embedding's gradient, or under full checkpointing the larger of it
    (with the first layer's gradients, born after its recomputation) and the first layer's recompute.

    ``embedding_dense_backward`` decomposes (torch/_decomp/decompositions.py) into ``new_zeros`` in the
    computation dtype (fp32 for 16-bit gradients: ``elementwise_dtypes``), an accumulating index_put and a
    cast to the gradient's dtype: E x 4 + E x g alive at the cast (E x g alone in fp32). Beside it the first
    layer's input gradient is still being assembled: the residual's gradient, the input gradients of the
    matmuls that read the first norm's output (q, k, v: each T x h) and their sum, in the compute dtype."""
    ctx, kernel = _context(plan, placement)
    s, regime, T = ctx.shape, ctx.regime, ctx.tokens
    c, g, E = regime.compute, regime.gradient or 4, s.embedding_parameters
    ops = _ops(s, regime, kernel, plan.seq_len)
    readers = sum(1 for op in ops if op.op == "mm" and not op.reduced and op.module == ops[0].module)
    accumulator = 4 * E if g != 4 else 0
    embedding = E * g + accumulator + (2 + readers) * c * T * s.hidden
    how = (f"V x h x {g} (the embedding's gradient)" + (" + V x h x 4 (its fp32 accumulator)" if accumulator else "")
           + f" + {2 + readers} x T x h x {c} (the residual's gradient, {readers} matmuls' input gradients, their sum)")
    deferred = 0
    if s.tied:
        # One weight: Inductor computes the LM head's weight gradient last, beside the lookup's, so the logits'
        # gradient (c T V) and the LM head's input (c T h) stay alive through the backward; at the end the
        # LM head's partial, the fp32 accumulator and the logits' gradient (measured: llama-tiny tied, s = 64).
        deferred = c * T * s.vocab + c * T * s.hidden
        embedding = E * g + 4 * E + c * T * s.vocab + (2 + readers) * c * T * s.hidden
        how = (f"V x h x {g} (tied: the LM head's partial) + V x h x 4 (the lookup's fp32 accumulator) + {c} x T x V "
               f"(the logits' gradient, kept for the LM head's weight gradient computed last) + {2 + readers} x T x h "
               f"x {c} (the first layer's input gradient being assembled)")
    if recompute is not None:
        first = s.layer_parameters() * g      # the first layer's gradients (gradient_terms: born last)
        if deferred:
            recompute = (recompute[0] + deferred, recompute[1] + f" + {_n(deferred)} (tied: the logits' gradient and "
                                                                  "the LM head's input, kept for its weight gradient)")
        if embedding + first >= recompute[0]:
            return MemoryTerm(component=ACTIVATIONS, label="compiled backward's end: the embedding's gradient",
                              nbytes=embedding + first, phases=(BACKWARD_END,),
                              formula=how + f" + {_n(first)} B (the first layer's gradients); the larger than "
                                            f"{recompute[1]}")
        return MemoryTerm(component=ACTIVATIONS, label="compiled recompute of the first layer and its backward",
                          nbytes=recompute[0], phases=(BACKWARD_END,), formula=recompute[1])
    return MemoryTerm(component=ACTIVATIONS, label="compiled backward's end: the embedding's gradient",
                      nbytes=embedding, phases=(BACKWARD_END,), formula=how)


_CHUNKED_EAGER = (K.CHUNKS_LOG_SOFTMAX, K.CHUNKS_LOGITS, K.CHUNKS_BACKWARD)    # loss.py's chunked terms


def lora_loss_terms(plan, placement, terms: list[MemoryTerm]) -> list[MemoryTerm]:
    """LoRA's terms outside the blocks (lora.model_activation_terms) with compile="blocks": torchtune's LoRA
    recipes run ``compile_loss`` too, which compiles the chunked loss's ``compute_cross_entropy`` in place
    (``compiled_chunked_terms``, the LM head frozen); the other losses are priced as eager (as without LoRA)."""
    loss = chosen_loss(plan.profile_options)
    if not blocks(plan) or loss is None or loss.compiled_blocks is None or (plan.rank is not None and
                                                                          not plan.rank.last):
        return terms
    from .lora import trains_lm_head
    return loss.compiled_blocks(plan, placement, terms, trainable=trains_lm_head(plan))


def compiled_chunked_terms(plan, placement, terms: list[MemoryTerm], trainable: bool = True) -> list[MemoryTerm]:
    """compile="blocks" with loss="chunked": torchtune's ``compile_loss`` compiles the chunked loss's
    ``compute_cross_entropy`` (``F.cross_entropy(logits.float(), labels, reduction="sum")``, one graph per
    chunk; torchtune/training/_compile.py:76-79). Its partitioner saves each chunk's logits (the graph's
    input, in the compute dtype: the upcast is recomputed) and the per-token max and log-sum-exp (2 x 4 B per
    token), not the fp32 log-softmax; its backward writes one chunk's logits gradient (c t V) and a per-token
    fp32 buffer; the LM head's backward (loss.py's moments: every chunk's logits gradient waiting, the
    weight-gradient partials and their sum) then runs with every chunk's saved logits freed (c T V) where
    the eager loss frees every log-softmax (4 T V). The larger of the two is the backward's top. A frozen LM head
    (LoRA, ``trainable`` False) has no weight-gradient partials: its moment is the logits' gradients and one
    chunk's input gradient, below the chunk's cross-entropy backward (loss.py's frozen moment)."""
    from .loss import chunk_tokens
    ctx, _ = _context(plan, placement)
    T, h, V, c = ctx.tokens, ctx.shape.hidden, ctx.shape.vocab, ctx.regime.compute
    n = plan.profile_options.loss_chunks or 8
    t = chunk_tokens(plan, n)
    eager = [x for x in terms if x.key in _CHUNKED_EAGER]
    if len(eager) != 3:      # never silently: the chunked loss's three terms are what is replaced
        raise RuntimeError(f"compile='blocks', loss='chunked': expected the chunked loss's three terms, found "
                           f"{[x.label for x in eager]}")
    out = [x for x in terms if x not in eager]
    out.append(MemoryTerm(component=ACTIVATIONS, label="every chunk's logits, saved by the compiled cross-entropy",
                          nbytes=c * T * V + 8 * T, phases=SAVED,
                          formula=f"{c} x T x V (each chunk's logits, the compiled graph's input) + 2 x 4 x T (the "
                                  "per-token max and log-sum-exp)"))
    ce = c * t * V + 4 * t
    if not trainable:
        # A frozen LM head keeps no input: the final norm's output (c T h) is alive while the chunks' logits are
        # written and freed after the last, before the labels (8 T) and the per-token max and log-sum-exp (8 T)
        # exist (measured, fp32: the forward's top, to the byte but 12 B of scalars)
        out.append(MemoryTerm(component=ACTIVATIONS, label="final norm output at the chunked LM head (frozen: "
                              "transient)", nbytes=c * T * h - 16 * T, phases=(FORWARD,),
                              formula=f"T x h x {c} (the frozen LM head's input, alive while every chunk's logits are "
                                      "written) - 2 x 8 x T (the labels and the per-token max and log-sum-exp, not "
                                      "yet)"))
    # loss.py's moments of the LM head's backward (the chunks' logits gradients waiting, the weight-gradient
    # partials and their out-of-place sum), here with every chunk's saved logits freed (c T V) in place of
    # the eager log-softmax (4 T V)
    g = ctx.regime.gradient or 4
    moments = [c * T * V + (V * h * g if trainable else 0) + c * t * h]
    if n >= 2 and trainable:
        moments += [c * T * V * (n - 1) / n + 2 * V * h * g + 2 * c * t * h,
                    c * T * V * (n - 2) / n + 3 * V * h * g + 2 * c * t * h]
    head = max(moments) - c * T * V
    if head > ce:
        k = moments.index(max(moments))
        out.append(MemoryTerm(component=ACTIVATIONS, label="LM head backward: the chunks' logits gradients and the "
                              "weight gradient partials (compiled loss)", nbytes=head, phases=(BACKWARD,),
                              formula=f"{c} x T x V x {n - k}/{n} (logits gradients left) + {k + 1} x V x h x {g} "
                                      f"(weight gradient partials{', their sum' if k == 2 else ''}) + {min(k + 1, 2)} x "
                                      f"t x h x {c} (input gradients) - {c} x T x V (every chunk's saved logits freed)"))
    else:
        out.append(MemoryTerm(component=ACTIVATIONS, label="compiled cross-entropy backward, one chunk", nbytes=ce,
                              phases=(BACKWARD,), formula=f"{c} x t x V + 4 x t, t = {_n(t)} tokens of {n} chunks "
                                                          "(the chunk's logits gradient, a per-token fp32 buffer)"))
    return out


_EAGER_CE = (K.LOG_SOFTMAX, K.CE_BACKWARD, K.LOGITS)    # model.py's eager cross-entropy terms


def compiled_loss_terms(plan, placement, terms: list[MemoryTerm]) -> list[MemoryTerm]:
    """compile="blocks+loss": torchtitan v0.2.2's ``cross_entropy_loss`` (``F.cross_entropy(pred.flatten(0,
    1).float(), labels.flatten(0, 1), reduction="sum")``, torchtitan/components/loss.py at 73a0e69) wrapped in
    ``torch.compile`` by ``build_cross_entropy_loss`` when "loss" is in ``compile.components``, called by
    ``forward_backward_step`` (train.py: ``del pred`` before the backward). The eager cross-entropy's terms (the
    logits and their fp32 copy at the loss, the fp32 log-softmax, the backward's two fp32 temporaries) are
    replaced by what the compiled graph holds, read from the profiler's timeline
    (validation/compile/measure_blocks_extra.py): the partitioner saves the graph's input, the logits in the
    compute dtype (c T V: the upcast and log-softmax are fused into the backward's kernel, recomputed there),
    the per-token max and log-sum-exp (2 x 4 T, fp32) and the labels (the eager "shifted labels" term); the
    backward's first kernel writes a per-token fp32 buffer (4 T) and the logits' gradient in their dtype
    (c T V) beside everything saved, then frees the saved logits. The LM head's backward (the weight's
    gradient V h c and the input's c T h beside the logits' gradient, the saved logits and per-token tensors
    freed) is the backward's top where it is larger (measured on the bf16 1,024-token cell: to 4 B)."""
    ctx, _ = _context(plan, placement)
    T, h, V, c = ctx.tokens, ctx.shape.hidden, ctx.shape.vocab, ctx.regime.compute
    eager = [x for x in terms if x.key in _EAGER_CE]
    if len(eager) != 3:      # never silently: the eager cross-entropy's three terms are what is replaced
        raise RuntimeError(f"compile={BLOCKS_LOSS!r}: expected the eager cross-entropy's three terms, found "
                           f"{[x.label for x in eager]}")
    out = [x for x in terms if x not in eager]
    out.append(MemoryTerm(component=ACTIVATIONS, label="logits (saved by the compiled loss)", nbytes=c * T * V,
                          phases=SAVED, formula=f"{c} x T x V = {c} x {_n(T)} x {_n(V)} (the compiled loss's input, "
                                                "saved; no fp32 copy, no log-softmax)"))
    out.append(MemoryTerm(component=ACTIVATIONS, label="compiled cross-entropy: per-token max and log-sum-exp (fp32)",
                          nbytes=8 * T, phases=SAVED, formula="2 x 4 x T"))
    kernel = c * T * V + 4 * T
    # (the weight's gradient as the LM head's matmul writes it: in the compute dtype, before FSDP's reduce-scatter
    # or the cast to a wider gradient; equal to the gradient's dtype in the pure regimes measured)
    head = V * h * c + c * T * h - 16 * T
    if head > kernel:
        out.append(MemoryTerm(component=ACTIVATIONS, label="LM head backward after the compiled loss",
                              nbytes=head, phases=(BACKWARD,),
                              formula=f"V x h x {c} (the weight's gradient) + T x h x {c} (the input's gradient), "
                                      f"beside the logits' gradient, which replaces the saved logits (c T V), - 2 x 8 "
                                      "x T (the per-token max and log-sum-exp, the labels: freed)"))
    else:
        out.append(MemoryTerm(component=ACTIVATIONS, label="compiled cross-entropy backward: the logits' gradient",
                              nbytes=kernel, phases=(BACKWARD,),
                              formula=f"{c} x T x V (the logits' gradient, in their dtype) + 4 x T (a per-token fp32 "
                                      "buffer), beside the saved logits"))
    return out


def final_norm_term(plan, placement) -> MemoryTerm:
    """compile="blocks": the eager final norm of torchtune 0.6.1 (torchtune/modules/rms_norm.py:38-43:
    ``F.rms_norm(x.float(), normalized_shape, weight=self.scale, eps).to(x.dtype)``). On the CPU ATen runs the
    composite in fp32 too (its saved tensors, read with ``saved_tensors_hooks``: the input, rsqrt and the
    normalized fp32 product the weight's multiply keeps): the input is the last block's output (counted with
    the blocks), the normalized product h x 4 and rsqrt per token, the output the LM head's input. In 16 bits
    the weight's dtype differs ("Mismatch dtype between input and weight ... Cannot dispatch to fused
    implementation") and the composite runs on the fp32 copy: the copy, rsqrt, the normalized fp32 product
    and the 16-bit output. Measured: validation/compile/measure_blocks.py, measure_blocks_pp.py."""
    ctx, _ = _context(plan, placement)
    T, h, c = ctx.tokens, ctx.shape.hidden, ctx.regime.compute
    if c == 4:
        return MemoryTerm(component=ACTIVATIONS, key=K.FINAL_NORM,
                          label="final norm", nbytes=(8 * h + 4) * T, phases=SAVED,
                          formula="T x (h x 4 (normalized x, saved by the weight's multiply) + h x 4 (the output, "
                                  "the LM head's input) + 4 (rsqrt)) (torchtune's RMSNorm: F.rms_norm's composite "
                                  "on the CPU; its input is the last block's output)")
    return MemoryTerm(component=ACTIVATIONS, key=K.FINAL_NORM,
                      label="final norm", nbytes=(8 * h + c * h + 4) * T, phases=SAVED,
                      formula=f"T x (h x 4 (fp32 copy) + h x 4 (normalized x scale, fp32) + h x {c} (the output, the "
                              "LM head's input) + 4 (rsqrt)) (torchtune's RMSNorm: F.rms_norm's composite, the weight's "
                              "dtype differing from x.float()'s)")


def _loss_side(plan, shape, c) -> float:
    """What the end of the forward holds after the layers: the final norm's part, the logits, the loss's."""
    T, b, seq = plan.microbatch * plan.seq_len, plan.microbatch, plan.seq_len
    return (c * shape.hidden + 4) * T + c * T * shape.vocab + 8 * T + 8 * b * (seq + 1) + 8


def model_terms(plan, placement, terms: list[MemoryTerm]) -> list[MemoryTerm]:
    """Outside the layers, compiled: the eager terms that are the same (the input ids, the end of the
    backward's embedding gradient) and the compiled forward's saved set and the loss's backward."""
    if blocks(plan):      # compile="blocks": the embedding, final norm, LM head and loss run eagerly
        if plan.profile_options.lora is None:     # (LoRA: the frozen LM head keeps no input; lora.py's norm)
            terms = [final_norm_term(plan, placement) if t.key == K.FINAL_NORM else t for t in terms]
        loss = chosen_loss(plan.profile_options)     # its compiled form, declared (torchtune's compile_loss)
        if loss is not None and loss.compiled_blocks is not None and (plan.rank is None or plan.rank.last):
            terms = loss.compiled_blocks(plan, placement, terms)
        if compiled_loss(plan) and (plan.rank is None or plan.rank.last):
            terms = compiled_loss_terms(plan, placement, terms)
        return terms
    ctx, kernel = _context(plan, placement)
    s, regime, T = ctx.shape, ctx.regime, ctx.tokens
    h, V, c = s.hidden, s.vocab, regime.compute
    b, seq = plan.microbatch, plan.seq_len
    keep = [t for t in terms if BACKWARD_END in t.phases and FORWARD in t.phases]     # the input ids (every phase)
    out = list(keep)
    add = out.append
    if not _full(plan):       # (under full checkpointing: layer_terms' end, the larger of two moments)
        add(_backward_end(plan, placement))
    if not _full(plan):
        add(MemoryTerm(component=ACTIVATIONS, label="embedding output (the first layer's input, compiled)",
                       nbytes=c * T * h, phases=SAVED, formula=f"T x h x {c} B (saved for the first norm's backward)"))
    add(MemoryTerm(component=ACTIVATIONS, label="attention mask (materialized under compile)", nbytes=c * b * seq * seq,
                   phases=SAVED, formula=f"b x s x s x {c} B (Hugging Face's sdpa_mask while tracing: (b, 1, s, s), "
                                         "saved for SDPA's backward)"))
    add(MemoryTerm(component=ACTIVATIONS, label="final norm (compiled: output and fp32 statistic)",
                   nbytes=(c * h + 4) * T, phases=SAVED, formula=f"T x (h x {c} + 4) B"))
    add(MemoryTerm(component=ACTIVATIONS, label="logits (saved by the compiled loss)", nbytes=c * T * V, phases=SAVED,
                   formula=f"{c} x T x V = {c} x {_n(T)} x {_n(V)} (the LM head's output; no fp32 copy, no log-softmax)"))
    add(MemoryTerm(component=ACTIVATIONS, label="fused cross-entropy: per-token max and log-sum-exp, padded labels",
                   nbytes=8 * T + 8 * b * (seq + 1) + 8, phases=SAVED,
                   formula="2 x 4 x T (fp32) + 8 x b x (s + 1) (pad(labels, (0, 1)), int64) + 2 x 4 (the loss, a scalar)"))
    add(MemoryTerm(component=ACTIVATIONS, label="compiled loss backward: the logits' tangent and gradient",
                   nbytes=2 * c * T * V + 4 * T + 4, phases=(BACKWARD,),
                   formula=f"2 x {c} x T x V (zeros for the returned logits' gradient, the fused kernel's gradient) "
                           "+ 4 x T + 4 (fp32 per-token buffer)"))
    if not _full(plan):
        top = _top_layer_backward(plan, s, regime, kernel, T, b, seq) - (2 * c * T * V + 4 * T + 4)
        if top > 0:
            add(MemoryTerm(component=ACTIVATIONS, label="compiled backward: the top layer's MLP, beyond the loss's "
                                                        "first kernel", nbytes=top, phases=(BACKWARD,),
                           formula="the LM head's, the final norm's and the down projection's weight gradients, the "
                                   "residual's gradient and two of the gated product's size (its gradient, gate's; "
                                   "up's in place of up's output), the logits, the loss's part, the final norm's "
                                   "saved tensors, the top layer's output and product freed: larger than the loss's "
                                   "first kernel by this"))
    return out


def _loss_terms(plan, T, V, c) -> list[MemoryTerm]:
    """The compiled ``ForCausalLMLoss``: the logits it saves, its fused reductions' per-token tensors and the
    padded labels, and its backward's first kernel (the returned logits' tangent, the fused gradient)."""
    b, seq = plan.microbatch, plan.seq_len
    return [MemoryTerm(component=ACTIVATIONS, label="logits (saved by the compiled loss)", nbytes=c * T * V,
                       phases=SAVED, formula=f"{c} x T x V = {c} x {_n(T)} x {_n(V)} (the LM head's output; no fp32 "
                                             "copy, no log-softmax)"),
            MemoryTerm(component=ACTIVATIONS, label="fused cross-entropy: per-token max and log-sum-exp, padded labels",
                       nbytes=8 * T + 8 * b * (seq + 1) + 8, phases=SAVED,
                       formula="2 x 4 x T (fp32) + 8 x b x (s + 1) (pad(labels, (0, 1)), int64) + 2 x 4 (the loss, a "
                               "scalar)"),
            MemoryTerm(component=ACTIVATIONS, label="compiled loss backward: the logits' tangent and gradient",
                       nbytes=2 * c * T * V + 4 * T + 4, phases=(BACKWARD,),
                       formula=f"2 x {c} x T x V (zeros for the returned logits' gradient, the fused kernel's gradient) "
                               "+ 4 x T + 4 (fp32 per-token buffer)")]


def whole_lora_terms(plan, placement) -> list[MemoryTerm]:
    """compile=True with peft's LoRA (Hugging Face's ``torch_compile``: ``torch.compile(peft_model)``, one graph,
    no graph break: peft's ``Linear.forward`` traces). Outside the blocks (``lora_layer_terms``) the joint graph
    with a frozen embedding, final norm weight and LM head saves: the causal mask (Hugging Face's ``sdpa_mask``
    while tracing, for SDPA's backward), the final norm's fp32 rsqrt (its input, the last block's output, counted
    with the blocks; its output is read only by the frozen LM head's weight gradient: not saved) and the compiled
    loss's logits and per-token tensors; no embedding output (the first block's input needs no gradient) and no
    embedding gradient at the backward's end. The backward's top is the loss's first kernel."""
    ctx, _ = _context(plan, placement)
    s, regime, T = ctx.shape, ctx.regime, ctx.tokens
    c, b, seq = regime.compute, plan.microbatch, plan.seq_len
    out = [MemoryTerm(component=ACTIVATIONS, key=K.TOKEN_IDS, label="input token ids (int64)", nbytes=8 * T,
                      phases=(FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP), formula=f"T={_n(T)} x 8 B")]
    out.append(MemoryTerm(component=ACTIVATIONS, label="attention mask (materialized under compile)",
                          nbytes=c * b * seq * seq, phases=SAVED,
                          formula=f"b x s x s x {c} B (Hugging Face's sdpa_mask while tracing: (b, 1, s, s), saved "
                                  "for SDPA's backward)"))
    out.append(MemoryTerm(component=ACTIVATIONS, label="final norm (compiled, frozen LM head: fp32 statistic)",
                          nbytes=4 * T, phases=SAVED, formula="T x 4 B (rsqrt; the output, the frozen LM head's "
                                                               "input, is not saved)"))
    out += _loss_terms(plan, T, s.vocab, c)
    # The forward's top: the LM head writes the logits while its input (the final norm's output, c T h) is
    # alive, before the loss's reductions and padded labels exist; the input is freed after the matmul.
    loss_part = 8 * T + 8 * b * (seq + 1) + 8
    lm_in = c * T * s.hidden - loss_part
    if lm_in > 0:
        out.append(MemoryTerm(component=ACTIVATIONS, label="final norm output at the LM head (transient)",
                              nbytes=lm_in, phases=(FORWARD,),
                              formula=f"T x h x {c} (the frozen LM head's input, alive while it writes the logits) "
                                      f"- {_n(loss_part)} (the loss's per-token tensors and padded labels, not yet "
                                      "allocated)"))
    return out


def _top_layer_backward(plan, shape, regime, kernel, T, b, seq) -> float:
    """The top layer's MLP backward above the end of the forward (no checkpointing), in Inductor's order: the
    LM head's weight gradient (V h g) and input gradient, the final norm's backward (its weight gradient h g,
    the residual's gradient c T h, the top layer's output freed), the down projection's weight gradient (its
    input, the product, freed after it) and input gradient (the product's size), then SiLU x up's backward:
    gate's gradient (the product's size; up's written over up's output), beside everything else saved."""
    c, g, h, V = regime.compute, regime.gradient or 4, shape.hidden, shape.vocab
    ops = _ops(shape, regime, kernel, seq)
    pairs = [(prev, op) for prev, op in zip(ops, ops[1:]) if op.reduced and prev.op == "mm"]
    if not pairs:
        return 0.0
    prev, down = pairs[-1]
    product = prev.nbytes * T                             # the gated product (the down projection's input)
    down_weight = (prev.nbytes / c) * (down.nbytes / c) * g
    born = V * h * g + h * g + c * T * h + down_weight + 2 * product
    freed = _loss_side(plan, shape, c) + c * T * h + product
    if shape.tied:      # the LM head's weight gradient is computed last: its inputs stay, its partial waits
        born += c * T * V - V * h * g
        freed -= c * T * h
    return born - freed
