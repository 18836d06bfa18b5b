"""LoRA and QLoRA fine-tuning under the measured profile (peft 0.21 over transformers 5.23).

``solve(..., profile="measured", lora=LoRAConfig(...))`` replaces the weight, gradient and
activation terms of ``model.py`` with these. The counts are ``mlsysim_core.finetune``'s
(exact, checked against peft and bitsandbytes); the activations were derived op by op and
checked against PyTorch's ``MemTracker`` on CPU (``validation/measure_lora.py``,
``validation/lora_measurements.json``).

What changes against full training
==================================

* **Weights**: the frozen base in its dtype (4 B in ``fp32`` and ``amp-*``, 2 B in the
  16-bit regimes); under QLoRA every linear of the decoder blocks is replaced by its
  bitsandbytes storage (packed 4-bit or int8 weights; absmax, code tables and nested
  statistics, int8 row scales), while embeddings, norms, biases and ``lm_head`` stay in
  the base dtype (the LM head quantized too where the loss implementation declares its recipe converts it:
  ``quantized_lm_head``, LitGPT's QLoRA). The adapters: peft creates ``lora_A`` (r x in) and ``lora_B`` (out x r)
  and, with its default ``autocast_adapter_dtype=True``, keeps them in **fp32 over a
  bf16/fp16 base** (it casts 16-bit adapters up); over a fp32 base they are fp32. Under the
  Megatron-style ``mixed-*`` regimes the adapters are taken in the regime's 16-bit weight
  dtype with its fp32 master copy. ``lora_option`` records this as the plan's
  regime: the regime of the *trainable* parameters (``lora_regime``).
* **Gradients and optimizer state**: only the adapters' (``placement.trainable_parameters_per_rank``
  is the adapter count). The optimizer's per-tensor quantities (Adam's ``step`` tensors,
  the for-loop step's temporaries, Adafactor's row and column vectors, 8-bit Adam's blocks)
  follow the adapter matrices (``adapter_matrices``): two per adapted linear and layer. Accumulated over
  ``gradient_accumulation_steps`` > 1 micro-batches the gradients are alive in every phase (``_accumulating``;
  validation/lora_accumulation/measure.py, measurements.json).
* **Activations**: a frozen linear does not save its input (autograd saves ``x`` of
  ``x @ W.T`` only to compute ``W``'s gradient); it does need ``W`` for the input's
  gradient, which costs nothing in fp32 and bf16 (the parameter itself) but under autocast
  is a fresh 16-bit cast of the weight: autocast caches casts of leaf tensors that
  require grad only, so every frozen linear whose input requires grad saves its own copy
  (2 B per weight element, biases not). Nothing requires grad before the first adapter:
  the embedding output and the first layer's norm keep nothing, and the backward stops at
  the first adapter (no embedding gradient). Per adapted linear, peft computes
  ``lora_B(lora_A(dropout(x.to(adapter dtype)))) * scaling``: ``lora_A`` saves its input
  (the same tensor the rest of the layer uses when the dtypes agree; a copy when the
  adapters are fp32 over a 16-bit base (4 B x in); under autocast always a fresh bf16
  cast, 2 B x in, one per adapted linear: peft first casts a bf16 input up to the fp32
  adapters' dtype, then autocast casts it down again); ``lora_B`` saves the r-wide
  intermediate (adapter compute dtype); the scaling multiply and the sum save nothing.
  Under autocast the adapters' own 16-bit casts are cached and saved (2 B per adapter
  parameter). ``lora_dropout > 0`` (not modelled here; peft's default is 0) would add a mask
  and a copy of each adapted linear's input.
* **QLoRA**: bitsandbytes' ``MatMul4Bit`` saves only the packed weight (a parameter): the
  activations are those of LoRA over a base in the compute dtype (measured: identical to
  the byte). Each 4-bit matmul dequantizes its weight to the compute dtype, in the forward
  inside the kernel and in the backward (``dequantize_4bit`` then a matmul): a transient of
  one linear's weight (``dequantized weight (transient)``), alive while that linear runs.

Variants (``validation/measure_lora_variants.py``, ``validation/lora_variant_measurements.json``):

* **DoRA** (``use_dora``): a magnitude vector per adapted linear (trainable, counted with the adapters);
  per adapted linear and token the base result and the LoRA result saved by the magnitude's products, per
  linear three out-sized vectors (``dora_parts``, ``dora_vectors``); the weight norm's transient in every
  forward (``dora_transient``), counted where it exceeds the loss's moment.
* **modules_to_save**: trainable copies of the embedding / LM head (the family's ``embedding_module``,
  ``lm_head_module``), their gradients and optimizer state; the LM head's input kept, the backward down to a
  trainable embedding (``model_activation_terms``).
* **a loss implementation that allows LoRA** (torchtune's ``chunked``): its terms with a frozen LM head
  (``loss.loss_terms(..., lm_head_trainable=False)``).
* **an adapted LM head** (``lm_head`` in ``target_modules``; validation/lora_head, torchtune's ``LoRALinear``
  output): its ``r (h + V)`` parameters once (``FineTuneCounts.head_modules``, two more optimizer tensors), the saved
  ``c T (h + r)`` and the forward's sum ``3 c t V`` beyond the loss's moment (``_lm_head_adapter_saved``,
  ``_lm_head_adapter_transient``); where it was not measured, refused (``_check_head``, ``_check_head_options``).

Pipeline parallelism (``stage_of``; validation/lora_parallel/measure_lora_pp.py, pp_measurements.json):

* each stage holds its own decoder layers' frozen weights (QLoRA: their packed codes and quantization state) and
  adapters, the frozen embedding on the first stage, the final norm and frozen LM head on the last (the rules'
  placement: ``parallel.rank_parameters``); the adapters' gradients and optimizer state are the stage's
  (``stage_trainable``, ``adapter_matrices`` per stage), accumulated over the m micro-batches: alive in the
  forwards that follow the stage's first backward (m > the micro-batches it holds);
* activations per micro-batch in flight (the schedule's ``in_flight``): the layers' saved tensors, a later
  stage's received input (``requires_grad=True``: NVIDIA/Megatron-LM 2fd6e2b74efca73a1f2d27b89bb5419384b4d3bf
  megatron/core/pipeline_parallel/p2p_communication.py ``_communicate``, ``create_tensor_recv_prev``), which makes
  every layer of that stage keep its input's gradient path, the stage's output where no layer keeps it, the RoPE
  tables; the gradients received and sent once (``_stage_activation_terms``). The order of forwards and
  backwards is Megatron-LM's 1F1B (4dabc62385799f8256fb05ccf3dfd4a7218781bd megatron/core/pipeline_parallel/
  schedules.py ``forward_backward_pipelining_without_interleaving``: min(p - stage - 1, m) warm-up forwards).
* refused (``_check_pipeline``, ``stage_of``): interleaved model chunks (a ``chunked`` schedule), whole-layer
  recomputation (measured: a checkpointed stage before the last peaks inside a layer that runs without saving,
  13 % above the prediction), DoRA, ``modules_to_save`` and a loss implementation other than the cross-entropy
  under pp (not measured). A stage before the last peaks inside its top layer: the model's forward holds its input
  and position ids, the backward starts with the top layer's MLP activation gradients; the top linear's output
  transients in that forward are not modelled (-1.3 % to -6.0 % measured).

Tensor parallelism (``_check_tensor``; validation/lora_parallel/measure_lora_tp.py, tp_measurements.json):
Megatron-Bridge's ``ParallelLinearAdapter`` (NVIDIA-NeMo/Megatron-Bridge 067f987df03b8355b03192d88d70f1709fedf51a
src/megatron/bridge/peft/utils.py), r (in + out) / tp parameters per adapted linear and rank (``stage_trainable``), in
the base's dtype; the frozen base as the rule places it; each layer walked over the split widths with whole r-wide
intermediates (``_layer``); the LM head's fp32 logits all-gathered as in full training. With sequence parallelism
(validation/lora_parallel/measure_lora_sp.py, sp_measurements.json; Megatron-Bridge with Transformer Engine >= 1.5:
``get_adapter_attributes_from_linear`` has the column base return its norm output all-gathered and turns the column
adapter's own sequence gather off; a row adapter's output is scattered back, ``scatter_to_sequence_parallel_region``):
the residual stream's parts on s / tp tokens (``Walk.add_residual``, ``_Layer.sequence``), the column adapters'
gathered input whole, the final norm on s / tp tokens, its output held to the loss, in fp32 the LM head's gathered
input at the logits' all-gather. With pipeline parallelism (validation/lora_parallel/measure_lora_tp_pp.py,
tp_pp_measurements.json): each stage's adapters / tp (``stage_trainable``), its activations the stage's
(``_stage_activation_terms``) over the split widths and the rank's tokens, and a stage before the last's forward peak
inside its top layer's MLP (``_top_mlp_moment``). ``lora_dropout`` (Megatron-Bridge's ``dropout_position="pre"``)
is the walk's, measured with and without SP (not over tp + pp stages). With data parallelism
(validation/lora_parallel/measure_lora_tp_dp.py, tp_dp_measurements.json): Megatron-Bridge's own training, the regime
``mixed-bf16-main-grad`` under a data-parallel rule whose options lay out Megatron-Core's main-grad buffer
(``mcore-distopt``, ``mcore-ddp``: ``main_grad_terms``): the buffer over the rank's adapter shards, whole, the fp32
main parameters and Adam state over dp (``optimizers.master_terms``). The rest is refused by name.

The norms' other saved tensors follow from the same rule: RMSNorm's ``w * normalized``
keeps ``normalized`` only for ``w``'s gradient (frozen: not kept), ``rsqrt`` is kept when
the input requires grad (and, in bf16, the fp32 copy of the input); LayerNorm keeps mean
and rstd. The attention kernels save what ``layers.py`` says once any of q, k, v
requires grad (eager attention: ``q @ k.T`` keeps k for q's gradient and q for k's).
"""

from __future__ import annotations


import attrs

from mlsysim_core import finetune
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.memo import memoize

from mlsysim_core.terms import (ACTIVATIONS, BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, OPTIMIZER_STEP, WEIGHTS,
                     MemoryTerm)
from ._cache import cached_terms
from . import rope
from . import term_keys as K
from .kv_expand import kernel_for     # (the plan's attention kernel, k/v expanded where declared)
from .layers import REPLICATED, Part
from .shapes import shape_of

ALL = (FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP)
SAVED = (FORWARD, BACKWARD)


def _n(x) -> str:
    return f"{x:,.0f}"


# --- regimes ------------------------------------------------------------------------------------

def base_weight_bytes(regime) -> int:
    """The frozen base's bytes per element: what the regime declares (``regime.frozen``: ``lora_regime`` keeps the
    16-bit base's bytes there when it lifts the adapters to fp32), else fp32 in fp32 and autocast regimes, and under
    FSDP2's mixed precision (fp32 sharded parameters, gathered in 16 bits: ``regime.gather``), else 16-bit."""
    if regime.frozen:
        return regime.frozen
    return 4 if regime.compute == 4 or regime.autocast or regime.gather else 2


def lora_regime(regime, config=None):
    """The regime of the trainable parameters (the adapters). peft keeps adapters in fp32 over a
    pure bf16/fp16 base (``autocast_adapter_dtype=True``), so their gradients and optimizer state
    are fp32 too; every other regime is unchanged (mixed-*: 16-bit adapters, fp32 master)."""
    if config is not None and config.adapter_dtype == "base":
        return attrs.evolve(regime, description=regime.description + "; LoRA adapters in the base's dtype "
                            "(peft's autocast_adapter_dtype=False)")
    if regime.compute == 2 and not regime.autocast and not regime.master and regime.weight == 2:
        return attrs.evolve(regime, weight=4, gradient=4, state=4, frozen=regime.weight,
                            description=regime.description + "; LoRA adapters, their gradients and "
                            "optimizer state in fp32 (peft's autocast_adapter_dtype)")
    return regime


def lora_option(plan, value, registry):
    """The ``lora=`` option of a measured solve (the profile's ``prepare`` calls it): a
    ``LoRAConfig`` or a dict of its fields, checked against the model (its linears must be
    countable); a quantized checkpoint's quantization applied (``checkpoint_quantization``); the
    registered implementation ``quant_implementation`` names kept as the internal option ``quant_spec``."""
    config, quantized = finetune.checkpoint_quantization(plan.model, finetune._config(value))
    sizes = {"ep_size": plan.ep_size, "cp_size": plan.cp_size}
    parallel = {k: v for k, v in sizes.items() if v != 1}
    if parallel:
        raise NotModelledError("lora", config, "data-parallel layouts, pipeline stages and tensor parallelism (ep and "
                                "cp sizes of 1; any dp with DDP, ZeRO-1/2/3 or FSDP; any pp with one model chunk per "
                                "stage; tp alone, with or without sequence parallelism, with Megatron-Bridge's adapters)",
                                "LoRA/QLoRA split by expert or context parallelism is not modelled by the "
                                "measured profile yet: " + ", ".join(f"{k}={v}" for k, v in parallel.items()))
    if plan.tp_size != 1:
        _check_tensor(plan, config)
    if plan.pp_size != 1:
        _check_pipeline(plan, config)
    if plan.trainable_fraction != 1.0:
        raise InvalidInputError("trainable_fraction", plan.trainable_fraction, "1.0 with lora=",
                                "the adapters are what trains; lora= sets the trainable count")
    _check_variants(plan, config)
    _check_head(plan, config)
    plan = attrs.evolve(plan, profile_options=attrs.evolve(plan.profile_options,
                                                           quant_spec=_check_implementation(plan, config, registry)))
    notes = ()
    if generic(plan):
        return _generic_option(plan, config, quantized)
    if config.target_modules is None:       # said, never silent: which modules the default means
        config = config.for_model(plan.model)
        gpt2 = config.target_modules == finetune._GPT2_DEFAULT_TARGETS
        notes = (f"lora.target_modules not given: the attention projections "
                 f"{', '.join(config.target_modules)}"
                 + (" (GPT-2 fuses Q, K and V into c_attn; peft's default for gpt2)" if gpt2 else ""),)
    try:
        counts = finetune.lora_counts(plan.model, config)   # a clear error now if the model cannot be adapted
    except InvalidInputError as e:
        if e.parameter.startswith(("lora.", "model.")) or isinstance(e, NotModelledError):
            raise     # already names the LoRA or model field
        raise InvalidInputError("lora", config, "a LoRA configuration this model can take", str(e)) from e
    regime = lora_regime(plan.profile_options.regime, config)
    options = attrs.evolve(plan.profile_options, lora=config, regime=regime)
    return attrs.evolve(plan, profile_options=options, notes=plan.notes + quantized + notes,
                        trainable_fraction=finetune._exact_fraction(_uniform_trainable(counts, regime),
                                                                    plan.model.parameters))


def _check_pipeline(plan, config):
    """LoRA under pipeline parallelism where it was measured (validation/lora_parallel/measure_lora_pp.py): plain
    LoRA / QLoRA, one model chunk per stage. The rest is refused, naming the field, its value and what is
    modelled."""
    o = plan.profile_options
    why = f"pp_size={plan.pp_size}: "
    strategy = getattr(o, "checkpointing", None)
    if strategy is not None and strategy.recomputes == "layers":
        # (measured: a fully checkpointed stage before the last peaks in the forward inside a layer that runs
        # without saving, 13 % above the stages' saved inputs; the last stage is exact: pp_measurements.json)
        raise NotModelledError("activation_checkpointing", plan.activation_checkpointing,
                               "a strategy that recomputes no whole layers (none, selective) with lora and "
                               "pp_size > 1",
                               why + "the forward working set of a recomputed layer on a stage before the last is not "
                               "modelled under LoRA (measured 13 % above the prediction)")
    if config.use_dora:
        raise NotModelledError("lora.use_dora", True, "False with pp_size > 1",
                               why + "DoRA's weight norms per pipeline stage are not measured")
    if config.modules_to_save:
        raise NotModelledError("lora.modules_to_save", config.modules_to_save,
                               "none (no modules to save) with pp_size > 1",
                               why + "trainable copies of the embedding / LM head on the first / last stage are not "
                               "measured")
    # (a loss of its own on the last stage under LoRA: refused by loss._refuse)


def _chosen_loss(plan):
    """The loss implementation the options chose, or None for the default cross-entropy (one that declares no
    terms of its own: loss.loss_terms keeps the default's)."""
    impl = getattr(plan.profile_options, "loss_implementation", None)
    return None if impl is None or impl.terms is None else impl


def _check_tensor(plan, config):
    """LoRA under tensor parallelism where it was measured (validation/lora_parallel/measure_lora_tp.py): Megatron-
    Bridge's adapters (``ParallelLinearAdapter``) over a Llama-style model split by the tensor-parallel rule alone,
    with or without sequence parallelism (measure_lora_sp.py; ``seq_len`` a multiple of tp), plain LoRA in fp32 or pure 16 bits with the adapters in the base's dtype (Megatron-
    Bridge casts them to the model's bf16/fp16), no recomputation, the default loss; with dp > 1 (measure_lora_tp_dp.py)
    Megatron-Core's grad buffer and (distributed) optimizer over the adapters, as Megatron-Bridge trains them (regime
    ``mixed-bf16-main-grad``, a rule declaring ``main_grad_terms``; not over pp stages), and there Megatron's unfused
    vocab-parallel cross-entropy on the rank's V/tp logits (measure_lora_tp_loss.py).
    The rest is refused, naming the field, its value and what is modelled."""
    o = plan.profile_options
    why = f"tp_size={plan.tp_size}: "
    allowed = ("plain LoRA with tp_size > 1 (measured: Megatron-Bridge's adapters over a Llama-style model, tensor "
               "parallelism alone)")
    regime = o.regime
    # Megatron-Bridge's own training (validation/lora_parallel/measure_lora_tp_dp.py, tp_dp_measurements.json):
    # Megatron-Core's grad buffer over the adapters' tp shards, whole on every data-parallel rank, and its
    # (distributed) optimizer: a regime with the main-grad buffer under a data-parallel rule that lays it out
    # (its options declare ``main_grad_terms``: optimizers.master_terms)
    megatron = bool(regime.main_grad) and getattr(plan.options.get(plan.rules.get("dp")), "main_grad_terms",
                                                  None) is not None
    if plan.dp_size != 1 and regime.main_grad and not megatron:
        raise NotModelledError("data_parallel", plan.rules.get("dp"), "a rule that lays out Megatron-Core's main-grad "
                               "buffer (mcore-distopt, mcore-ddp) with lora, tp_size > 1 and dp_size > 1",
                               why + "the main-grad buffer over the adapters' tp shards is measured under Megatron-Core's "
                               "DDP and distributed optimizer only")
    if plan.dp_size != 1 and not megatron:
        raise NotModelledError("dp_size", plan.dp_size, "1 with lora and tp_size > 1, or any dp_size with "
                               "Megatron-Core's data-parallel rules (mcore-distopt, mcore-ddp) and "
                               "regime='mixed-bf16-main-grad' (Megatron-Bridge's LoRA training)",
                               why + "LoRA over tensor parallelism combined with data parallelism (DDP buckets, ZeRO or "
                               "FSDP sharding of the adapters' tp shards) is not measured")
    family = shape_of(plan).family
    from .families import SEPARATE_QKV
    if (generic(plan) or family.lora_layer is None or family.sparse or not family.gated_mlp
            or family.attention_layout != SEPARATE_QKV):     # (what the measured Llama layer declares)
        raise NotModelledError("lora", config, allowed, why + f"the {family.display} layers (declared: sparse="
                               f"{family.sparse}, gated_mlp={family.gated_mlp}, attention_layout="
                               f"{family.attention_layout!r}) under LoRA and tensor parallelism are not measured")
    if config.quantization is not None:
        raise NotModelledError("lora.quantization", config.quantization, "None with tp_size > 1",
                               why + "a quantized base split by tensor parallelism is not measured")
    # (lora_dropout: Megatron-Bridge's dropout_position="pre", each adapter dropping its own input, the column
    # adapters' whole, the row adapters' shard: the walk's, measured in measure_lora_tp.py / measure_lora_sp.py)
    if config.dropout and plan.pp_size != 1:
        raise NotModelledError("lora.dropout", config.dropout, "0.0 with tp_size > 1 and pp_size > 1",
                               why + "lora_dropout over the stages of a tensor-parallel model (its copies inside the "
                               "top layer's MLP moment) is not measured")
    for field, value, ok in (("lora.use_dora", config.use_dora, "False"),
                             ("lora.modules_to_save", config.modules_to_save, "none (no modules to save)")):
        if value:
            raise NotModelledError(field, value, f"{ok} with tp_size > 1", why + "not measured under tensor "
                                   "parallelism")
    if regime.autocast or regime.gather or ((regime.master or regime.main_grad) and not megatron):
        raise NotModelledError("regime", regime.name, "fp32 or a pure 16-bit regime with lora and tp_size > 1, or "
                               "'mixed-bf16-main-grad' under Megatron-Core's data-parallel rules (mcore-distopt, "
                               "mcore-ddp)", why + "Megatron-Bridge's adapters are measured in fp32, pure bf16 and "
                               "under Megatron-Core's main-grad buffer and (distributed) optimizer only")
    if megatron and plan.pp_size != 1:
        raise NotModelledError("regime", regime.name, "fp32 or a pure 16-bit regime with lora, tp_size > 1 and "
                               "pp_size > 1", why + "Megatron-Core's grad buffer and optimizer over the stages of a "
                               "tensor-parallel LoRA model are not measured")
    if regime.compute == 2 and config.adapter_dtype != "base":
        raise NotModelledError("lora.adapter_dtype", config.adapter_dtype, "'base' with a 16-bit base and "
                               "tp_size > 1", why + "Megatron-Bridge casts its adapters to the model's 16-bit dtype "
                               "(ParallelLinearAdapter: self.bfloat16()); peft's fp32 adapters under TP are not "
                               "modelled")
    if config.rank % plan.tp_size:
        raise InvalidInputError("lora.rank", config.rank, f"a multiple of tp_size={plan.tp_size}",
                                "Megatron-Bridge splits the column adapters' in-projection over the rank")
    if plan.sequence_parallel and plan.seq_len % plan.tp_size:
        # (NVIDIA/Megatron-LM 2fd6e2b74efca73a1f2d27b89bb5419384b4d3bf megatron/core/tensor_parallel/mappings.py
        # _split_along_first_dim: "First dimension of the tensor should be divisible by tensor parallel size")
        raise InvalidInputError("seq_len", plan.seq_len, f"a multiple of tp_size={plan.tp_size} with lora and "
                                "sequence parallelism", "Megatron-Core splits the sequence evenly over the "
                                "tensor-parallel ranks (the row adapters' scatter_to_sequence_parallel_region)")
    strategy = getattr(o, "checkpointing", None)
    if strategy is not None and strategy.recomputes != "nothing":
        raise NotModelledError("activation_checkpointing", plan.activation_checkpointing,
                               "none with lora and tp_size > 1", why + "recomputation under LoRA and tensor "
                               "parallelism is not measured")
    # Megatron-Core's unfused vocab-parallel cross-entropy on the frozen LM head's V/tp logits (never all-gathered),
    # as Megatron-Bridge trains LoRA (cross_entropy_loss_fusion=False): measured with Megatron-Core's grad buffer and
    # optimizer, with and without sequence parallelism (validation/lora_parallel/measure_lora_tp_loss.py,
    # tp_loss_measurements.json)
    # (the loss: loss._refuse lets through under LoRA and tp only an implementation declaring "lora_tensor_parallel")
    if getattr(o, "loss_parallel", False):
        raise NotModelledError("loss_parallel", True, "False with lora and tp_size > 1",
                               why + "LoRA with loss-parallel logits is not measured")
    if getattr(o, "compile", None):
        raise NotModelledError("compile", o.compile, "False with lora and tp_size > 1", why + "not measured")


def _check_variants(plan, config):
    """DoRA and ``modules_to_save`` where they were measured (validation/measure_lora_variants.py, and DoRA
    under FSDP2: validation/parallel/measure_lora_parallel.py): DoRA over a dense or 4-bit base without
    lora_dropout, on one device or under the data-parallel rules (its magnitude vectors are parameters like the
    adapters); ``modules_to_save`` on one device (copies in another dtype than the adapters: ``mixed_copies``).
    The rest is refused, naming the field, its value and what is modelled. (A loss implementation is checked by
    the loss technique: one that allows LoRA gets the LM head's trainability, ``loss.loss_terms``.)"""
    dora, saved = config.use_dora, config.modules_to_save
    if not (dora or saved):
        return
    if saved and plan.dp_size != 1:
        raise NotModelledError("lora.modules_to_save", saved,
                               "none (no modules to save) with dp_size > 1 (validated on one device)",
                               f"modules_to_save is validated on one device only; dp_size={plan.dp_size}: the copies' "
                               "gathers and gradient reduction under the data-parallel rules are not modelled")
    if dora and config.dropout > 0 and config.quantization is not None and plan.profile_options.regime.autocast:
        raise NotModelledError("lora.dropout", config.dropout, "0.0 with lora.use_dora over a quantized base under "
                               "autocast", "QDoRA with lora_dropout under autocast (the dequantized weight recomputed "
                               "on the dropped input and cast by autocast) is not measured")
    if dora and config.quantization == "int8":
        raise NotModelledError("lora.quantization", "int8", "None, 'nf4' or 'fp4' with lora.use_dora",
                               "DoRA over LLM.int8 weights (peft dequantizes Int8Params in every forward) is not "
                               "measured")


def adapts_lm_head(config) -> bool:
    """Does ``target_modules`` name the LM head (``finetune.LM_HEAD``: torchtune's ``apply_lora_to_output``, LitGPT's
    ``lora_head``, peft's ``lm_head``)?"""
    return finetune.LM_HEAD in (config.target_modules or ())


def _check_head(plan, config):
    """An adapter on the LM head where it was measured (validation/lora_head: torchtune 0.6.1's ``LoRALinear`` output
    projection, untied, over a frozen fp32 or bf16 base with the adapters in the base's dtype, eager, one device, no
    dropout): the rest is refused, naming the field. (The loss, ``compile``, offload and ``optimizer_in_backward``,
    chosen later: ``_check_head_options``.)"""
    if not adapts_lm_head(config):
        return
    head = f"{finetune.LM_HEAD!r} in lora.target_modules"
    measured = "measured on one device over a frozen fp32 or bf16 base (validation/lora_head)"
    family = shape_of(plan).family
    if generic(plan):
        raise NotModelledError("lora.target_modules", config.target_modules, f"decoder-layer targets (without "
                               f"{finetune.LM_HEAD!r}) for the {family.display} layers",
                               f"an adapter on the LM head is {measured}, on families with a LoRA walk of their own; "
                               f"the {family.display} LoRA is derived from its description")
    layout = {"dp_size": plan.dp_size, "tp_size": plan.tp_size, "pp_size": plan.pp_size}
    for field, value in layout.items():
        if value != 1:
            raise NotModelledError(field, value, f"1 with {head}", f"an adapter on the LM head is {measured}: its "
                                   "sharding, gathers and stages are not modelled")
    for field, value, ok, why in (
            ("lora.quantization", config.quantization, "None", "QLoRA with an adapted LM head (torchtune's qlora_ "
             "builders keep the output projection unquantized, LitGPT's BitsandbytesPrecision converts it)"),
            ("lora.use_dora", config.use_dora, "False", "DoRA's magnitude and weight norm on the LM head"),
            ("lora.dropout", config.dropout, "0.0", "the head adapter's dropout mask and dropped input"),
            ("lora.modules_to_save", config.modules_to_save, "none (no modules to save)", "a trainable embedding "
             "beside an adapted LM head")):
        if value:
            raise NotModelledError(field, value, f"{ok} with {head}", f"{why} is not measured")
    regime = plan.profile_options.regime
    if regime.autocast or regime.master or regime.main_grad or regime.gather:
        raise NotModelledError("regime", regime.name, f"fp32 or a pure 16-bit regime with {head}",
                               f"an adapter on the LM head is {measured}")
    if regime.compute == 2 and config.adapter_dtype != "base":
        raise NotModelledError("lora.adapter_dtype", config.adapter_dtype, f"'base' with a 16-bit base and {head}",
                               "the head adapter in fp32 over a 16-bit base (peft's autocast_adapter_dtype: its input "
                               "and output cast) is not measured; torchtune's adapters in the base's dtype are")


def _check_head_options(plan):
    """What is chosen after ``lora_option`` (the loss technique's stage and the others) with an adapted LM head: a
    loss implementation that declares it was measured so (``allows`` ``"lora_head"``: the default cross-entropy,
    torchtune's ``chunked``), eager, no offload, no optimizer step in the backward."""
    o = plan.profile_options
    head = f"{finetune.LM_HEAD!r} in lora.target_modules"
    impl = getattr(o, "loss_implementation", None)
    if impl is not None and "lora_head" not in impl.allows:
        raise NotModelledError("loss", impl.name, f"a loss implementation measured with {head} (allows "
                               "'lora_head': cross_entropy, chunked)", f"{impl.name} with an adapter on the LM head "
                               "is not measured")
    for field in ("compile", "offload", "activation_offload", "optimizer_in_backward", "cpu_offload_optimizer"):
        value = getattr(o, field, None)
        if value:
            raise NotModelledError(field, value, f"off with {head}", "an adapter on the LM head is measured eager, "
                                   "without offload or an optimizer step in the backward (validation/lora_head)")


def _check_implementation(plan, config, registry):
    """The registered 4-bit implementation the config names (quantizations.py; None without a quantized base),
    where it was measured: one that stores its own layout (``stored``) on one device (its FSDP gathers and
    tensor-parallel splits are not measured), every quantized linear one it can quantize (its ``check``); none
    named without a quantized base."""
    from . import quantizations
    if config.quantization is None:
        default = attrs.fields(type(config)).quant_implementation.default
        if config.quant_implementation != default:
            raise InvalidInputError("lora.quant_implementation", config.quant_implementation,
                                    f"the default {default!r} unless quantization is set", "no quantized base to implement")
        return None
    impl = quantizations.of(config, registry)
    if impl.stored is None:
        return impl
    # data parallelism where the implementation declares its split (``shards``: torchao's NF4 under FSDP2,
    # validation/qlora_fsdp2; quantized_sharding.py); tensor and pipeline splits are not measured
    if plan.tp_size * plan.pp_size != 1 or (plan.dp_size != 1 and impl.shards is None):
        counted = [repr(n) for n, q in quantizations.registered(registry).items() if q.stored is None]
        counted = " or ".join(counted) or "an implementation of finetune's counted layout (stored=None)"
        fsdp = " (data parallelism alone where the implementation declares its split: shards)"
        raise NotModelledError("lora.quant_implementation", impl.name, f"{counted} under a parallel layout" + fsdp,
                               f"{impl.name}'s 4-bit base split or gathered over ranks is not measured (dp="
                               f"{plan.dp_size}, tp={plan.tp_size}, pp={plan.pp_size})")
    if impl.check is not None:
        for _, i, o in _quantized_linears(plan):
            impl.check(i * o)
    return impl


def quantized_bytes(plan, c) -> tuple[int, int]:
    """(weight bytes, constant bytes) of the quantized base linears: as ``counts`` has them (bitsandbytes' layout),
    or what the chosen implementation declares it stores (``stored``), per linear of each layer, in the dtype the
    model was built in."""
    cfg = plan.profile_options.lora
    from . import quantizations
    impl = quantizations.chosen(plan.profile_options)
    if impl.stored is None:
        return c.quantized_weight_bytes, c.quantization_constant_bytes
    base = base_weight_bytes(plan.profile_options.regime)
    w = k = 0
    for _, i, o in _quantized_linears(plan):
        wb, kb = impl.stored(i * o, o, cfg, base)
        w, k = w + wb, k + kb
    return plan.model.layers * w, plan.model.layers * k


def _generic_option(plan, config, quantized):
    """``lora_option`` for a family whose LoRA is derived from its description."""
    shape = shape_of(plan)
    family = shape.family
    notes = list(quantized)
    if config.target_modules is None:
        config = attrs.evolve(config, target_modules=family_default_targets(shape))
        notes.append(f"lora.target_modules not given: the attention projections of the {family.display} layers, "
                     f"{', '.join(config.target_modules)}")
    _check_alike(shape, config)
    c = generic_counts(shape, config)
    if c.adapted_linear_parameters > plan.model.parameters:
        raise InvalidInputError("model.parameters", plan.model.parameters, f"at least {c.adapted_linear_parameters}",
                                "the adapted linear layers alone hold more parameters")
    notes.append(f"LoRA of the {family.display} layers derived from the family's description: its linears "
                 + ", ".join(f"{m} {i}x{o}" for m, i, o, _ in c.per_module) + f" adapted (rank {config.rank}); "
                 "the layers keep what full training keeps but the tensors the family marks as kept only for a "
                 "frozen weight's gradient, plus the adapters' own (an upper bound where the family marks none)")
    regime = lora_regime(plan.profile_options.regime, config)
    options = attrs.evolve(plan.profile_options, lora=config, regime=regime)
    return attrs.evolve(plan, profile_options=options, notes=plan.notes + tuple(notes),
                        trainable_fraction=finetune._exact_fraction(_uniform_trainable(c, regime),
                                                                    plan.model.parameters))


def copy_bytes(regime) -> int:
    """Bytes per element of a ``modules_to_save`` copy: the base's dtype (peft casts the adapters, not the
    copies)."""
    return base_weight_bytes(regime)


def mixed_copies(regime, counts) -> bool:
    """Are the ``modules_to_save`` copies in another dtype than the adapters (a 16-bit base with peft's fp32
    adapters)? Then the optimizer steps tensors of two dtypes: the regime's terms cover the adapters, the
    copies' own terms (``gradient_terms``) the rest."""
    return bool(counts.saved_modules) and copy_bytes(regime) != regime.weight and not regime.master


def _uniform_trainable(counts, regime) -> int:
    """The trainable parameters the regime's dtypes describe (the plan's ``trainable_fraction``): all of
    them, but the copies when they are in another dtype (``mixed_copies``)."""
    if mixed_copies(regime, counts):
        return counts.trainable_parameters - sum(n for _, n in counts.saved_modules)
    return counts.trainable_parameters


def _check_alike(shape, config):
    """A family may describe a mean layer (weights averaged over layers that differ: ``"q_proj x 1/4"``,
    ``"dense mlp x 1/27: gate_proj"``): adapters on such a weight cannot be placed, and are refused
    naming ``lora`` (not silently left out of ``all-linear``)."""
    linears, excluded = family_linears(shape)
    mean = {}
    for module in [lin.module for lin in linears] + [m for m, _ in excluded]:
        if " x " in module:
            mean[module] = module.rsplit(":", 1)[-1].strip().split(" ")[0].rsplit(".", 1)[-1]
    targets = config.target_modules
    hit = [m for m, name in mean.items() if targets == (finetune.ALL_LINEAR,) or name in targets]
    if hit:
        raise NotModelledError("lora", config, "targets on linears every decoder layer has",
                               f"the {shape.family.name!r} family describes a mean layer ({', '.join(hit)}): which "
                               "layers hold these linears is not described, so their adapters cannot be placed")


def _kind(regime) -> str:
    if regime.autocast:
        return "amp-bf16"
    return "fp32" if regime.compute == 4 else "bf16"


@memoize
def _counts(model, config):
    return finetune.lora_counts(model, config)


def generic(plan) -> bool:
    """Is the plan's LoRA derived from its family's description (``family_linears``,
    ``generic_layer``)? Every family without a LoRA walk of its own (``lora_layer``), and every
    mixture of experts (transformers 5's fused experts: the built-in Mixtral walk treated them as
    one MLP)."""
    return shape_of(plan).family.lora_layer is None or bool(plan.model.is_sparse)


def counts(plan):
    if generic(plan):
        return generic_counts(shape_of(plan), plan.profile_options.lora)
    return _counts(plan.model, plan.profile_options.lora)


# --- the adapters from the family's description ---------------------------------------------------

@attrs.frozen
class FamilyLinear:
    """One linear of a decoder layer, as the family describes it: ``module`` (the layer weight's
    name without ``.weight``), ``in_features``, ``out_features``; ``weight`` the ``LayerWeight``."""

    module: str
    in_features: int
    out_features: int
    weight: object

    def selected_by(self, target: str) -> bool:
        """peft's match: the module's dotted name is the target or ends with ``.<target>``."""
        return self.module == target or self.module.endswith("." + target)


def _names_it(key: str, module: str) -> bool:
    """A ``lora_excluded`` key names a module: itself, its last dotted components, or either followed by a
    space (a weight averaged over the layers, ``"router x 4/4"``)."""
    return any(m == key or m.startswith(key + " ") for m in (module, module.rsplit(".", 1)[-1])) or \
        module.endswith("." + key) or (" " in module and module.split(" ", 1)[0].endswith("." + key))


def _vector_name(name: str) -> bool:
    return name.endswith(("bias", "sinks")) or "," in name


@memoize
def family_linears(shape) -> tuple[tuple[FamilyLinear, ...], tuple[tuple[str, str], ...]]:
    """``(linears, excluded)``: the matrices of one decoder layer that LoRA may adapt, in
    registration order, and ``(module, why)`` for those it cannot (the family's ``lora_excluded``;
    weights split over the experts: transformers 5's 3-D expert parameters, which peft's
    ``target_modules`` does not reach). Derived from the family's own description: its
    ``layer_weights`` (names, elements, how they split) and, for each weight's (out, in) shape,
    its ``LayerWeight.shape`` or else the first layer's matrices in ``matrix_shapes`` (the next
    2-D entry, in registration order, with the weight's element count). Never from the family's
    name."""
    family = shape.family
    said = dict(family.lora_excluded)
    weights = [w for w in shape.layer_weights() if w.elements and not w.bias and not _vector_name(w.name)]
    matrices = [m for m in shape.matrix_shapes()[1:] if m[1]]     # after the embedding; 2-D only
    at = 0
    linears, excluded = [], []
    for w in weights:
        module = w.name[:-len(".weight")] if w.name.endswith(".weight") else w.name
        why = next((why for key, why in said.items() if _names_it(key, module.lower())), None)
        if why is not None:
            excluded.append((module, why))
            continue
        if w.split == "experts":
            excluded.append((module, "an expert weight: transformers 5 fuses the experts into 3-D parameters, "
                                     "which peft's target_modules does not reach (its target_parameters LoRA is "
                                     "not modelled)"))
            continue
        if w.shape is not None:
            out_f, in_f = w.shape
        else:
            for k in range(at, len(matrices)):
                if matrices[k][0] * matrices[k][1] == w.elements:
                    out_f, in_f = matrices[k]
                    at = k + 1
                    break
            else:
                excluded.append((module, "its (out, in) shape is not in the family's description (no "
                                         "LayerWeight.shape, no matrix of its size in matrix_shapes)"))
                continue
        if int(w.elements) != w.elements:
            excluded.append((module, "not a whole matrix in every layer"))
            continue
        linears.append(FamilyLinear(module, int(in_f), int(out_f), w))
    return tuple(linears), tuple(excluded)


def family_default_targets(shape) -> tuple[str, ...]:
    """The family's ``lora_default_targets`` (those the model has), else its attention projections:
    the adaptable linears whose sides are the hidden, q, kv or fused q + 2 kv widths, one of them
    not the hidden width."""
    linears, _ = family_linears(shape)
    if shape.family.lora_default_targets is not None:     # those of them the model has
        return tuple(t for t in shape.family.lora_default_targets if any(lin.selected_by(t) for lin in linears))
    q, kv = shape.q_dim, shape.kv_dim
    attention = {shape.hidden, q, kv, q + 2 * kv}
    out = []
    for lin in linears:
        sides = {lin.in_features, lin.out_features}
        if sides <= attention and sides & {q, kv, q + 2 * kv}:
            out.append(lin.module.rsplit(".", 1)[-1].split(" ")[0])      # (a mean layer's "q_proj x 1/4": q_proj)
    return tuple(out)


def _selected(shape, config) -> list[FamilyLinear]:
    linears, excluded = family_linears(shape)
    targets = config.target_modules
    if targets is None:
        targets = family_default_targets(shape)
    if targets == (finetune.ALL_LINEAR,):
        return list(linears)
    chosen = []
    for t in targets:
        hit = [lin for lin in linears if lin.selected_by(t)]
        if not hit:
            why = [w for m, w in excluded if m == t or m.endswith("." + t)]
            have = sorted({lin.module.rsplit(".", 1)[-1] for lin in linears}) + [finetune.ALL_LINEAR]
            if why:
                raise NotModelledError("lora.target_modules", t, f"one of {', '.join(have)} for the "
                                       f"{shape.family.name!r} family", f"{t}: {why[0]}")
            if t in finetune.TARGET_MODULES:      # another layout's name: a part of a fused matrix (LitGPT)
                raise NotModelledError("lora.target_modules", t, f"one of {', '.join(have)} for the "
                                       f"{shape.family.name!r} family",
                                       f"its layers have no {t} of their own (LoRA on a part of a fused matrix, as "
                                       "LitGPT's lora_query on a fused qkv, is not modelled)")
            raise InvalidInputError("lora.target_modules", t, f"a module of the {shape.family.name!r} family's "
                                    f"layers: {', '.join(have)}", f"{shape.model.name!r} has no {t}")
        chosen += [lin for lin in hit if lin not in chosen]
    return [lin for lin in linears if lin in chosen]


@memoize
def generic_counts(shape, config) -> finetune.FineTuneCounts:
    """``FineTuneCounts`` from the family's linears (``family_linears``): per adapted linear
    ``r x (in + out)`` per layer; under QLoRA every adaptable linear stored by bitsandbytes
    (``finetune._tensor_bytes``; bitsandbytes replaces ``nn.Linear`` modules, not the fused
    3-D expert parameters nor the families' excluded weights)."""
    adapted = _selected(shape, config)
    linears, _ = family_linears(shape)
    layers, r = shape.layers, config.rank
    finetune._check_rank_fits(r, [finetune._Linear(lin.module, lin.in_features, lin.out_features, 1, frozenset())
                                  for lin in adapted])
    per_module = tuple((lin.module, lin.in_features, lin.out_features,
                        finetune.adapter_parameters(lin, r, config)) for lin in adapted)
    saved = finetune.saved_modules(shape.model, config, shape.family.embedding_module, shape.family.lm_head_module)
    quantized = weight_bytes = constant_bytes = 0
    if config.quantization is not None:
        for lin in linears:
            n = lin.in_features * lin.out_features
            w, c = finetune._tensor_bytes(n, lin.out_features, config)
            quantized += layers * n
            weight_bytes += layers * w
            constant_bytes += layers * c
    return finetune.FineTuneCounts(
        trainable_parameters=layers * sum(row[3] for row in per_module) + sum(n for _, n in saved),
        frozen_parameters=shape.model.parameters, saved_modules=saved,
        adapted_linear_parameters=layers * sum(lin.in_features * lin.out_features for lin in adapted),
        quantized_parameters=quantized, quantized_weight_bytes=weight_bytes,
        quantization_constant_bytes=constant_bytes, per_module=per_module)


def _adapted(plan) -> dict[str, tuple[int, int]]:
    """{module: (in, out)} of the adapted linears of one layer, in registration order."""
    return {m: (i, o) for m, i, o, _ in counts(plan).per_module}


def adapter_matrices(plan) -> list[tuple[int, int]]:
    """(rows, cols) of every trainable tensor in the order the optimizer sees them (cols 0 for a
    vector): per layer, per adapted linear, ``lora_A`` (r x in) then ``lora_B`` (out x r), with DoRA
    its magnitude vector (out); the ``modules_to_save`` copies (vocab x hidden) where the model
    registers them: the embedding's before the layers, the LM head's after."""
    config = plan.profile_options.lora
    r = config.rank
    block = []
    for _, (i, o) in _adapted(plan).items():
        block += [(r, i), (o, r)] + ([(o, 0)] if config.use_dora else [])
    embedding, _ = _saved_roles(plan)
    head, tail = [], []
    for module, n in counts(plan).saved_modules:
        (head if module == embedding else tail).append((shape_of(plan).vocab, n // shape_of(plan).vocab))
    for _, i, o, _ in counts(plan).head_modules:      # the LM head's adapter, registered after the layers
        tail += [(r, i), (o, r)]
    layers = plan.rank.layers if plan.rank is not None else plan.model.layers    # this rank's stage's layers
    return head + block * layers + tail


def _saved_roles(plan) -> tuple[str, str]:
    """The names the model's token embedding and LM head go by (``modules_to_save``): the family's
    declaration (the built-in GPT-2 walk's ``wte``)."""
    family = shape_of(plan).family
    return family.embedding_module, family.lm_head_module


def trains_embedding(plan) -> bool:
    """A ``modules_to_save`` copy of the token embedding trains: the first layer's input requires grad."""
    return _saved_roles(plan)[0] in plan.profile_options.lora.modules_to_save


def trains_lm_head(plan) -> bool:
    """A ``modules_to_save`` copy of the LM head trains: it keeps its input for its weight's gradient."""
    return _saved_roles(plan)[1] in plan.profile_options.lora.modules_to_save


def quantized_lm_head(plan) -> bool:
    """Is the frozen LM head stored quantized? Under QLoRA when the chosen loss implementation declares that its
    recipe's quantization converts it (``quantizes_lm_head``: LitGPT's ``BitsandbytesPrecision`` replaces every
    ``nn.Linear``); peft's QLoRA keeps it in the base's dtype."""
    from .loss import chosen
    impl = chosen(plan.profile_options)
    return plan.profile_options.lora.quantization is not None and impl is not None and impl.quantizes_lm_head


# --- pipeline stages ---------------------------------------------------------------------------------

@attrs.frozen
class Stage:
    """This rank's pipeline stage under LoRA: ``first`` holds the frozen embedding, ``last`` the final norm, the
    frozen LM head and the loss; ``layers`` its decoder layers (each with its own frozen weights and adapters);
    ``in_flight`` the micro-batches whose activations it holds at its peak (the schedule's); ``split``: the model
    is split into stages at all (pp > 1), else the whole model (one device, data parallelism)."""

    first: bool
    last: bool
    layers: int
    in_flight: float
    split: bool


def stage_of(plan, placement) -> Stage:
    """The stage of the rules' placement this plan's rank holds (``plan.rank``: its class). A schedule that
    places more than one model chunk on a rank (declared ``chunked``) is refused: a non-first chunk on the first
    stage receives its input, which this does not model (not measured)."""
    rank = plan.rank
    if rank is None or placement.pipeline_stages == 1:
        return Stage(True, True, placement.layers_per_stage, 1, False)
    schedule = plan.profile_options.pipeline_schedule
    if getattr(schedule, "chunked", False):
        raise NotModelledError("pipeline_schedule", schedule.name, "a schedule with one model chunk per stage "
                               "(chunked=False) with lora", f"pp_size={plan.pp_size}: LoRA over interleaved model "
                               "chunks is not measured (validation/lora_parallel/measure_lora_pp.py runs 1F1B)")
    return Stage(rank.first, rank.last, rank.layers, rank.in_flight, True)


def _layer_adapters(plan) -> int:
    """The trainable parameters of one decoder layer: its adapters (with DoRA their magnitude vectors)."""
    return sum(row[3] for row in counts(plan).per_module)


def stage_trainable(plan, layers: int, tensor: int = 1) -> int:
    """The trainable parameters of a pipeline stage of ``layers`` decoder layers: their adapters (the frozen
    embedding and LM head train nothing; ``modules_to_save`` is refused under pp). Split by ``tensor``
    tensor-parallel ranks: Megatron-Bridge's ``ParallelLinearAdapter`` keeps r/tp x in + out/tp x r of a
    column-parallel base's adapter and r x in/tp + out/tp x r of a row-parallel one's, r (in + out) / tp either way
    (NVIDIA-NeMo/Megatron-Bridge 067f987df03b8355b03192d88d70f1709fedf51a src/megatron/bridge/peft/utils.py
    ``ParallelLinearAdapter.__init__``; r is a multiple of tp, the widths of the rule's split: exact)."""
    return layers * _layer_adapters(plan) // tensor


def _accumulating(plan, stage: Stage) -> bool:
    """Do the adapters' gradients exist while a forward of the stage's peak runs? The m =
    gradient_accumulation_steps micro-batches accumulate into them from the first backward on (PyTorch's
    AccumulateGrad: the first gradient becomes ``.grad``, later ones are added into it; peft's adapters are
    ordinary parameters); a forward follows a backward on this stage when m exceeds the micro-batches it holds.
    Off pipelines the whole model is one stage holding one micro-batch: every micro-batch after the first runs
    its forward and backward with them (measured: validation/lora_accumulation/measurements.json, the second
    micro-batch's forward and backward peaks are the first's plus the adapters' gradients, to the byte). Under a
    pipeline 1F1B's stage i runs min(p - i - 1, m) warm-up forwards, then one forward and one backward each;
    GPipe every forward first."""
    return plan.gradient_accumulation_steps > stage.in_flight


# --- weights and gradients -------------------------------------------------------------------

def _weight_shards(placement) -> int:
    """What the data-parallel rule shards every parameter over (FSDP, ZeRO-3: the placement's
    ``weight_shards``; DDP, ZeRO-1/2: 1), frozen or not: FSDP2 shards each parameter on its own
    (requires_grad or not), FSDP1 with ``use_orig_params`` shards the flat parameters it is given."""
    from .parallel import weight_divisor
    return weight_divisor(placement)


def _gradient_shards(placement) -> int:
    from .parallel import gradient_divisor
    return gradient_divisor(placement)


def _per_rank(n, shards):
    return n if shards == 1 else n / shards


@cached_terms
def weight_terms(plan, placement) -> list[MemoryTerm]:
    c = counts(plan)
    cfg = plan.profile_options.lora
    base_b = base_weight_bytes(plan.profile_options.regime)
    ab = plan.profile_options.regime.weight
    shape = shape_of(plan)
    d = _weight_shards(placement)
    per = "" if d == 1 else f" / {d} (sharded)"
    stage = stage_of(plan, placement)
    quantized = c.quantized_parameters
    q_bytes, q_constants = quantized_bytes(plan, c) if cfg.quantization else (0, 0)
    split = None        # (weight, constants, formula) this rank keeps of a base whose implementation declares its split
    if cfg.quantization:
        from . import quantized_sharding as qs
        qs.check_replicated(plan, d)
        if d > 1 and qs.declared(plan) is not None:
            w, ks, kw = qs.per_rank(plan, d)
            split = (w, ks + kw, f" (this rank's rows: {_n(ks)} B of constants split over {d} ranks + {_n(kw)} B "
                                 "kept whole by every rank, quantized_sharding.py)")
    plain = c.frozen_parameters - c.quantized_parameters
    adapters = c.trainable_parameters - sum(n for _, n in c.saved_modules)
    what = "embeddings, norms, biases, lm_head" if cfg.quantization else "the whole base model"
    head = ""
    if quantized_lm_head(plan):
        # the LM head's own Linear4bit (V x h): packed codes and its quantization state; a tied head is a copy
        # the conversion makes (the embedding keeps the base's dtype), an untied one leaves the plain weights
        V, h = shape.vocab, shape.hidden
        w, k = finetune._tensor_bytes(V * h, V, cfg)
        quantized, q_bytes, q_constants = quantized + V * h, q_bytes + w, q_constants + k
        plain = c.frozen_parameters - quantized + (V * h if plan.model.tied_embeddings else 0)
        what, head = "embeddings, norms, biases", " (the LM head's too: the loss's recipe converts it)"
    t = placement.tensor_shards
    if t > 1 and not stage.split:
        # tensor parallelism (validation/lora_parallel/measure_lora_tp.py): the frozen base as the rule splits it
        # (its placement), the adapters r (in + out) / tp each (``stage_trainable``)
        plain = placement.parameters_per_rank
        plain = int(plain) if float(plain).is_integer() else plain     # (bytes stay exact ints)
        adapters = stage_trainable(plan, plan.model.layers, t)
        what = f"this rank's share of the base model, tp={t}"
    if stage.split:
        # A pipeline stage: its own layers' frozen weights (quantized linears as stored) and adapters, the frozen
        # embedding on the first stage, the final norm and LM head on the last (the rules' placement counts them)
        L, layers = stage.layers, plan.model.layers
        quantized, q_bytes, q_constants = (quantized * L // layers, q_bytes * L // layers,
                                           q_constants * L // layers)
        plain = placement.parameters_per_rank - quantized
        adapters = stage_trainable(plan, L, t)
        what = (f"this stage's {L} layers" + (f" / tp={t}" if t > 1 else "") + (" (norms, biases)" if cfg.quantization else "")
                + (", embedding" if stage.first else "") + (", final norm, lm_head" if stage.last else ""))
    terms = [MemoryTerm(component=WEIGHTS, label=f"frozen base parameters ({base_b} B)", phases=ALL,
                        nbytes=_per_rank(plain * base_b, d), formula=f"{_n(plain)} params ({what}) x {base_b} B" + per)]
    if cfg.quantization:
        kind = "int8" if cfg.quantization == "int8" else f"4-bit {cfg.quantization}"
        terms.append(MemoryTerm(component=WEIGHTS, label=f"quantized base linears ({kind})", phases=ALL,
                                nbytes=split[0] if split else _per_rank(q_bytes, d),
                                formula=f"{_n(quantized)} params x "
                                        + ("1 B" if cfg.quantization == "int8" else "1/2 B (two codes a byte)")
                                        + head + per))
        from . import quantizations
        impl = quantizations.chosen(plan.profile_options)
        how = ("one fp32 scale per output row" if cfg.quantization == "int8" else
               f"absmax per {cfg.quant_blocksize}-element block"
               + (" (8-bit, double quant) + nested statistics" if cfg.double_quant else " (fp32)")
               + " + code tables, per weight") if impl.stored is None else impl.layout.format(b=base_b)
        terms.append(MemoryTerm(component=WEIGHTS, label="quantization constants", phases=ALL,
                                nbytes=split[1] if split else q_constants, key=K.QUANTIZATION_STATE,
                                formula=how + (split[2] if split else "" if d == 1 else
                                               " (QuantState tensors are module attributes, not "
                                               "parameters: every rank keeps them whole)")))
    copies = sum(n for _, n in c.saved_modules)
    terms.append(MemoryTerm(component=WEIGHTS, label=f"LoRA adapters (rank {cfg.rank}, {ab} B)", phases=ALL,
                            nbytes=_per_rank(adapters * ab, d),
                            formula=f"{_n(adapters)} params = " + ("this stage's " if stage.split else "")
                                    + "layers x r x (in + out) per adapted linear"
                                    + (f" / tp={t} (Megatron-Bridge's ParallelLinearAdapter)" if t > 1 else "")
                                    + (" + layers x out (DoRA's magnitude vectors)" if cfg.use_dora else "")
                                    + (" + r x (h + V) (the LM head's adapter)" if c.head_modules else "")
                                    + f", x {ab} B" + per))
    if copies:
        cb = copy_bytes(plan.profile_options.regime)
        terms.append(MemoryTerm(component=WEIGHTS, label=f"modules_to_save: trainable copies ({cb} B)", phases=ALL,
                                nbytes=_per_rank(copies * cb, d),
                                formula=" + ".join(f"{m} {_n(n)}" for m, n in c.saved_modules)
                                        + f" params x {cb} B (peft's ModulesToSaveWrapper: the original stays, frozen; "
                                          "the base's dtype)" + per))
    from .model import rope_buffer_terms      # (model imports this module)
    terms += rope_buffer_terms(shape)
    if generic(plan):       # the family's own buffers (Gemma's embedding scale, a second rotary)
        return shape.family.adjusted("weights", plan, placement, terms)
    return rope.stored("weights", plan, terms)      # (the RoPE storage: adjusted applies it too)


@cached_terms
def gradient_terms(plan, placement) -> list[MemoryTerm]:
    """Only the adapters have gradients, from the end of the backward through the step; accumulated over
    micro-batches (``_accumulating``) alive throughout, as full training's (``model.gradient_terms``)."""
    regime = plan.profile_options.regime
    b = regime.gradient
    if not b:
        return []   # mixed-*-main-grad: accumulated in the fp32 main-grad buffer (optimizer state)
    c = counts(plan)
    params = _uniform_trainable(c, regime)
    d = _gradient_shards(placement)
    stage = stage_of(plan, placement)
    phases, how = (BACKWARD_END, OPTIMIZER_STEP), ""
    if stage.split:
        params = stage_trainable(plan, stage.layers, placement.tensor_shards)
        how = f" (this stage's {stage.layers} layers" + (f", / tp={placement.tensor_shards}" if
                                                         placement.tensor_shards > 1 else "") + ")"
    elif placement.tensor_shards > 1:
        params = stage_trainable(plan, stage.layers, placement.tensor_shards)
        how = f" (this rank's adapter shards: / tp={placement.tensor_shards})"
    if _accumulating(plan, stage):
        # (the text names no m: these terms are memoised per layout, keyed by m > 1 only: _cache.Layout)
        phases = ALL
        how += ("; accumulated over the m micro-batches, alive in the forwards that follow the stage's first "
                f"backward (m > {stage.in_flight:g} in flight)" if stage.split else
                " (accumulated over the micro-batches: alive in every forward and backward after the first)")
    terms = [MemoryTerm(component=GRADIENTS, label=f"LoRA adapter gradients ({b} B)", nbytes=_per_rank(params * b, d),
                        phases=phases,
                        formula=f"{_n(params)} adapter params x {b} B (the frozen base has none)" + how
                                + ("" if d == 1 else f" / {d} (reduce-scattered: sharded)"))]
    if mixed_copies(regime, c):
        terms += [t if phases != ALL else attrs.evolve(t, phases=ALL, formula=t.formula + " (accumulated over the "
                  "micro-batches: alive throughout)") for t in _mixed_copy_terms(plan, c) if t.component == GRADIENTS]
    return terms


def relocate(plan, weights, gradients, optimizer_state):
    """The LoRA technique's ``relocate``: the ``modules_to_save`` copies' optimizer state and step temporaries in
    their own dtype beside the fp32 adapters' (``mixed_copies``; the optimizer's terms cover the adapters)."""
    c = counts(plan)
    if not mixed_copies(plan.profile_options.regime, c):
        return weights, gradients, optimizer_state
    extra = [t for t in _mixed_copy_terms(plan, c) if t.component != GRADIENTS]
    return weights, gradients, list(optimizer_state) + extra


def _mixed_copy_terms(plan, c) -> list[MemoryTerm]:
    """The ``modules_to_save`` copies' gradients and optimizer state in their own (16-bit) dtype, beside the
    fp32 adapters (``mixed_copies``): the optimizer's declared moments per element; torch's foreach step groups
    its tensors by dtype and keeps one group's temporaries bound while the next group's are made (adam.py
    ``_multi_tensor_adam``: no ``del`` of ``exp_avg_sq_sqrt``), so its declared temporaries add up over the
    groups. The step counters are counted with the adapters' (one per tensor)."""
    from mlsysim_core.terms import OPTIMIZER_STATE
    from .optimizer_step import step_of
    o = plan.profile_options
    copies = sum(n for _, n in c.saved_modules)
    cb = copy_bytes(o.regime)
    step = step_of(o.optimizer_spec)
    value = c.saved_modules and tuple(m for m, _ in c.saved_modules)
    if step is None or step.moments is None:
        raise NotModelledError("lora.modules_to_save", value,
                               "none (no modules to save) with this optimizer, or lora.adapter_dtype='base'",
                               f"optimizer {plan.optimizer!r} declares no parameter-shaped moments: its state over "
                               f"copies in {cb} B beside fp32 adapters is not modelled")
    if o.optimizer_impl == "for-loop":
        raise NotModelledError("lora.modules_to_save", value, "none (no modules to save) with "
                               "optimizer_impl='for-loop', or "
                               "lora.adapter_dtype='base'",
                               "the for-loop step's temporaries over tensors of two dtypes are not modelled")
    what = " + ".join(m for m, _ in c.saved_modules)
    terms = [MemoryTerm(component=GRADIENTS, label=f"modules_to_save: the copies' gradients ({cb} B)",
                        nbytes=copies * cb, phases=(BACKWARD_END, OPTIMIZER_STEP),
                        formula=f"{_n(copies)} params ({what}) x {cb} B (the base's dtype, beside fp32 adapters)")]
    if step.moments:
        terms.append(MemoryTerm(component=OPTIMIZER_STATE, label=f"modules_to_save: the copies' optimizer state "
                                f"({step.moments} x {cb} B)", nbytes=copies * step.moments * cb,
                                phases=(FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP),
                                formula=f"{_n(copies)} params x {step.moments} moments x {cb} B (torch keeps an "
                                        "optimizer's state in its parameter's dtype)"))
    if o.optimizer_impl == "foreach" and step.foreach:
        terms.append(MemoryTerm(component=OPTIMIZER_STATE, label="modules_to_save: the copies' foreach step "
                                "temporaries", nbytes=copies * step.foreach * cb, phases=(OPTIMIZER_STEP,),
                                formula=f"{step.foreach} x {_n(copies)} params x {cb} B (their dtype's group, still "
                                        "bound while the adapters' group steps)"))
    return terms


# --- data-parallel sharding (ZeRO-3, FSDP): what the rules' buffers gather --------------------------

def frozen_gather_bytes(plan) -> int:
    """Bytes of one gathered frozen parameter: the regime's gather dtype (FSDP2's mixed precision),
    else the base's own dtype (not the adapters')."""
    regime = plan.profile_options.regime
    return regime.gather or base_weight_bytes(regime)


def gathered_layer(plan, layer_params) -> list[MemoryTerm]:
    """ZeRO-3 / FSDP under LoRA: one layer's frozen matrices gathered in the base's dtype and its
    adapters in theirs for the forward and backward; the reduce-scatter's input is the adapters'
    gradients only (the frozen base has none: FSDP2 reduce-scatters the parameters that have a
    gradient; FSDP1 needs the adapters wrapped apart from the base, as peft's
    ``fsdp_auto_wrap_policy`` does, else its flat gradient covers the frozen parameters too).

    QLoRA: the quantized linears are gathered as stored, their packed codes (Params4bit keeps
    ``quantize_4bit``'s packed output as its data, viewed as ``quant_storage``: 1/2 B per parameter;
    int8: 1 B), not in the base's dtype; their quantization state is no parameter (a module attribute
    that ``Linear4bit.forward`` restores onto the gathered weight, ``fix_4bit_weight_quant_state_from_module``:
    "the quant state got lost when the parameter got converted. This happens for example for fsdp"), so
    it is not gathered: every rank keeps it whole (the weights' term). bitsandbytes-foundation/bitsandbytes
    005a63c2badadd7fb2c45a4b67c1dcbabb72b297 bitsandbytes/nn/modules.py (Params4bit._quantize, Linear4bit)."""
    from mlsysim_core.terms import COMMUNICATION_BUFFERS
    regime = plan.profile_options.regime
    c = counts(plan)
    adapters = sum(row[3] for row in c.per_module)
    frozen_b, adapter_b = frozen_gather_bytes(plan), regime.gather or regime.weight
    grad_b = regime.gradient or 4
    q = c.quantized_parameters // plan.model.layers if plan.profile_options.lora.quantization else 0
    q_bytes = quantized_bytes(plan, c)[0] // plan.model.layers if q else 0
    plain = max(layer_params - q, 0)
    codes = (f"{_n(q)} quantized params of one layer as stored ({_n(q_bytes)} B of packed codes; the quantization "
             f"state stays whole on every rank, not gathered) + " if q else "")
    if q:
        from . import quantized_sharding as qs
        if qs.declared(plan) is not None:       # what the implementation's all-gather rebuilds (its codes and scalers)
            q_bytes = qs.gathered_layer_bytes(plan)
            codes = (f"{_n(q)} quantized params of one layer as all-gathered ({_n(q_bytes)} B: codes and the "
                     "constants split with them; the rest whole on every rank, quantized_sharding.py) + ")
    return [
        MemoryTerm(component=COMMUNICATION_BUFFERS, label="all-gathered parameters of one layer",
                   nbytes=plain * frozen_b + q_bytes + adapters * adapter_b, phases=(FORWARD, BACKWARD),
                   formula=codes + f"{_n(plain)} frozen params of one layer x {frozen_b} B + {_n(adapters)} adapter "
                           f"params x {adapter_b} B (one layer at a time)"),
        MemoryTerm(component=COMMUNICATION_BUFFERS, label="reduce-scatter input: one layer's unsharded gradients",
                   nbytes=adapters * grad_b, phases=(BACKWARD_END,),
                   formula=f"{_n(adapters)} adapter params of one layer x {grad_b} B (the frozen base has no gradients)")]


def fsdp1_adapter_input_cast(plan) -> bool:
    """FSDP1 (a data-parallel rule whose options declare ``fsdp_version=1``) with peft's adapters wrapped apart
    (peft's ``fsdp_auto_wrap_policy``, as HF Trainer hands it to accelerate) and a MixedPrecision ``param_dtype``
    narrower than the adapters' stored dtype (``regime.gather`` below the LoRA regime's ``weight``): peft's
    ``Linear.forward`` casts each adapter's input to ``lora_A.weight.dtype`` (peft 0.22.0 tuners/lora/layer.py,
    ``x = self._cast_input_dtype(x, lora_A.weight.dtype)``), read before the ``lora_A`` unit's own forward
    gathers it, so the sharded fp32 original parameter's dtype (``use_orig_params=True``: torch 2.13
    _flat_param.py ``_use_sharded_views``); the fp32 copy is transient and autocast (accelerate's bf16 forward:
    without it the bf16 unit cannot take the fp32 input, "expected m1 and m2 to have the same dtype") casts it
    down again, a fresh 16-bit copy that lora_A saves, one per adapted linear, as under amp (``Walk.lora_in``).
    Measured: validation/lora_fsdp1 (the peft accel-bf16 runs: 4 x 256 B x 2 a token a layer more than the
    shared inputs, q/k/v's and gate/up's shared norm outputs and o's kernel-shared attention output each copied)."""
    options = plan.options.get(plan.rules.get("dp"))
    if getattr(options, "fsdp_version", None) != 1 or getattr(options, "lora_wrap", "adapters") != "adapters":
        return False        # (lora_wrap="layer": the adapters gathered with their layer, bf16 when peft reads them)
    regime = plan.profile_options.regime
    return bool(regime.gather) and regime.gather < regime.weight and not regime.autocast


# --- the decoder layers -----------------------------------------------------------------------------

@attrs.frozen
class _Layer:
    parts: tuple            # Part objects, bytes per token
    constant: tuple         # (name, bytes per layer)
    output: int             # bytes per token of the layer's output
    output_saved: bool      # the next layer / final norm keeps it
    grad_out: bool          # the output requires grad
    recomputable: int = 0   # bytes per layer selective recompute drops beyond the parts' (derived layers)
    tagged: bool = True     # derived layers: the family marks its linears' inputs (else an upper bound)
    sequence: int = 1       # sequence parallelism: the residual stream's parts (split REPLICATED) on tokens / tp
    held: tuple = ()        # (name, bytes per token): inputs a 4-bit implementation keeps past checkpointing (Walk.hold_input)

    def saved(self, tokens: int) -> int:
        if self.sequence == 1:
            return sum(p.nbytes for p in self.parts) * tokens + sum(n for _, n in self.constant)
        local = sum(p.nbytes for p in self.parts if p.split == REPLICATED)
        return ((sum(p.nbytes for p in self.parts) - local) * tokens + local * tokens // self.sequence
                + sum(n for _, n in self.constant))

    def kept_output(self, tokens: int) -> int:
        """The layer's output kept by the next layer / final norm (0 when not kept), on this rank's tokens."""
        if not self.output_saved:
            return 0
        return self.output * tokens if self.sequence == 1 else self.output * tokens // self.sequence

    def held_bytes(self, tokens: int) -> int:
        """What the layer's 4-bit linears keep of their inputs until the backward ends, checkpointed or not."""
        return sum(n for _, n in self.held) * tokens


class Walk:
    """One decoder layer's walk under LoRA: the regime's dtypes, the adapted linears, and
    the parts saved so far. A family's ``lora_layer(walk, grad_in, attention)`` walks its
    layer with it (``gpt2_layer``, ``llama_layer``); ``attention(grads)`` is the kernel's
    saved parts per token given which of q, k, v require grad."""

    def __init__(self, plan, shape):
        kind = _kind(plan.profile_options.regime)
        self.shape = shape
        self.kind = kind
        self.amp, self.bf16 = kind == "amp-bf16", kind == "bf16"
        self.c = 4 if kind == "fp32" else 2                 # matmul outputs
        self.res = 2 if self.bf16 else 4                    # residual stream
        # the adapters' dtype in the forward (bytes): FSDP2's mixed precision gathers them in 16 bits too
        self.ab = plan.profile_options.regime.gather or plan.profile_options.regime.weight
        self.a_c = 2 if self.amp else self.ab               # the adapters' compute dtype
        self.r = plan.profile_options.lora.rank
        self.adapted = _adapted(plan)
        self.dropout = plan.profile_options.dropout > 0
        self.lora_dropout = plan.profile_options.lora.dropout > 0     # peft's lora_dropout
        self.dora = plan.profile_options.lora.use_dora                # peft's use_dora
        self.base = base_weight_bytes(plan.profile_options.regime)    # the frozen base's bytes per element
        self.quantized = plan.profile_options.lora.quantization is not None
        # its saved mask: CUDA's fused native_dropout keeps a bool mask; the CPU's dropout multiplies by a
        # bernoulli noise tensor in the input's dtype (the adapters', peft casting x first) and keeps that
        self.mask = 1 if (plan.profile_options.device or "cuda") == "cuda" else self.ab
        self.fsdp1_cast = fsdp1_adapter_input_cast(plan)     # every lora_A keeps its own 16-bit input copy
        # a 4-bit implementation that declares it keeps each quantized linear's input (``saves_input``: bitsandbytes
        # < 0.43.2's MatMul4Bit, quant_bnb_legacy.py) and the linears it quantizes
        impl = plan.profile_options.quant_spec if self.quantized else None
        self.holds_input = bool(getattr(impl, "saves_input", False))
        self.quantized_modules = {m for m, _, _ in _quantized_linears(plan)} if self.holds_input else set()
        self.held: list = []
        self.sequence = 1       # sequence parallelism: the residual stream split over the tp ranks (``_layer``)
        self.parts: list = []
        self.constant: list = []

    def add(self, name, n):
        if n:
            self.parts.append(Part(name, n))

    def add_residual(self, name, n):
        """A part of the residual stream (the norms' saved tensors): on the rank's sequence chunk under
        sequence parallelism (``Part.split`` REPLICATED: divided by ``sequence``), whole otherwise."""
        if n:
            self.parts.append(Part(name, n, split=REPLICATED))

    def add_attention(self, parts) -> set:
        """The kernel's saved parts, but what only the (frozen) out-projection would keep for
        its weight's gradient; returns {"x"} when the kernel keeps the attention output the
        out-projection reads (its adapter then shares it), else an empty set."""
        self.parts.extend(p for p in parts if p.nbytes and not p.weight_gradient_only)
        return set() if any(p.weight_gradient_only for p in parts) else {"x"}

    def lora_in(self, module, width, dtype_bytes, shared_with: set, grad: bool = True):
        """lora_A saves its input: the tensor itself when the dtypes agree, else a cast copy
        (one per adapted linear). ``grad``: the input requires grad (else a dropout keeps no mask)."""
        if module not in self.adapted:
            return
        if self.lora_dropout and grad:
            self.add(f"{module} LoRA dropout mask ({self.mask} B)", self.mask * width)
        if self.amp or self.fsdp1_cast:
            # peft casts a bf16 input up to the fp32 adapters' dtype (a transient), autocast casts
            # that (or an fp32 input) down again: lora_A saves a fresh bf16 copy either way (under FSDP1's
            # MixedPrecision the fp32 dtype is the sharded adapter's: fsdp1_adapter_input_cast)
            own, b = True, 2
        else:
            own = dtype_bytes != self.ab        # peft casts the input to the adapters' dtype
            b = self.ab
        if own:
            self.add(f"{module} LoRA input ({'bf16 cast' if self.amp else f'{b} B copy'})", b * width)
        elif self.lora_dropout:     # lora_A reads the dropout's output, a tensor of its own
            self.add(f"{module} LoRA input (dropout output)", b * width)
        elif "x" not in shared_with:
            shared_with.add("x")
            self.add(f"{module} LoRA input", b * width)
        self.add(f"{module} LoRA intermediate (r={self.r})", self.a_c * self.r)
        if self.dora:
            o = self.adapted[module][1]
            for name, n in dora_parts(self, o):
                self.add(f"{module} {name}", n)
            self.constant.append((f"{module} DoRA scale vectors", dora_vectors(self, o, grad)))
            copy = dora_dropout_weight(self, width, o, grad)
            if copy:
                self.constant.append((f"{module} DoRA: weight saved by its dropped-input matmul", copy))

    def hold_input(self, module, width, dtype_bytes, shared: set, grad: bool):
        """A 4-bit linear whose implementation declares ``saves_input`` keeps its input while the graph lives
        (bitsandbytes < 0.43.2: ``ctx.tensors = (A, B)``, a node attribute no saved-tensor hook sees): ``A`` is what
        ``Linear4bit.forward`` passes, ``x.to(compute_dtype)`` (the matmuls' dtype, ``c``): the tensor itself when
        it is in that dtype already (one for the linears reading it: q/k/v, gate/up), else a cast of its own per
        linear. Only where the input requires grad (``ctx.needs_input_grad``). Counted in ``held`` (kept under
        checkpointing too) and, where no other part keeps that tensor (``"x"`` in ``shared``: an adapter's lora_A
        or the attention kernel), as a part of the layer's saved set."""
        if not (self.holds_input and grad and module in self.quantized_modules):
            return
        if dtype_bytes == self.c:
            if "held" in shared:
                return
            shared.add("held")
            self.held.append((f"{module} input (4-bit matmul's ctx.tensors)", self.c * width))
            if "x" not in shared:
                shared.add("x")
                self.add(f"{module} input (kept by the 4-bit matmul)", self.c * width)
            return
        self.held.append((f"{module} input cast (4-bit matmul's ctx.tensors)", self.c * width))
        self.add(f"{module} input cast (kept by the 4-bit matmul)", self.c * width)

    def frozen_copy(self, module, params, input_grad):
        # autocast casts a frozen weight afresh (no cache) and the matmul saves the cast for the
        # input's gradient; adapted modules' adapters are cached and saved (2 B per adapter param)
        if self.amp and input_grad:
            self.constant.append((f"{module} weight 16-bit copy (autocast, frozen)", 2 * params))
        if self.amp and module in self.adapted:
            i, o = self.adapted[module]
            self.constant.append((f"{module} adapter 16-bit copies (autocast cache)", 2 * self.r * (i + o)))

    def layer(self, output_saved: bool, grad_out: bool) -> _Layer:
        return _Layer(tuple(self.parts), tuple(self.constant), self.res * self.shape.hidden, output_saved, grad_out,
                      sequence=self.sequence, held=tuple(self.held))


# --- DoRA (peft 0.21.2 tuners/lora/dora.py DoraLinearLayer.forward, variants.py DoraLinearVariant) ---------------

def dora_parts(walk: Walk, out_features: int) -> tuple[tuple[str, int], ...]:
    """What one DoRA linear saves per token beyond LoRA's: ``result_dora = (m / ||W + s B A|| - 1) *
    base_result + (m / ||.||) * lora_B(lora_A(x)) * s`` keeps both products' tensor operands for the
    magnitude's gradient: the base layer's output (the matmul's dtype, ``walk.c``) and the LoRA result
    (the adapters' compute dtype). With lora_dropout the base result is DoRA's own ``F.linear`` of the
    dropped input (already in the adapters' dtype; 16-bit under autocast)."""
    base = (2 if walk.amp else walk.ab) if walk.lora_dropout else walk.c
    return (("DoRA: base result (saved by the magnitude's product)", base * out_features),
            ("DoRA: LoRA result (saved by the magnitude's product)", walk.a_c * out_features))


def dora_dropout_weight(walk: Walk, in_features: int, out_features: int, grad: bool) -> int:
    """With lora_dropout DoRA recomputes the base layer on the dropped input, ``F.linear(dropout(x),
    W.to(x.dtype))``, which keeps its weight for the input's gradient (when the input requires grad): a copy
    of W in the adapters' dtype over a 16-bit base (fp32 adapters), a fresh 16-bit cast under autocast (a
    frozen weight is not cached), the dequantized weight (in that dtype) over a 4-bit base, nothing where W
    itself is in that dtype."""
    if not (walk.dora and walk.lora_dropout and grad):
        return 0
    if walk.amp:
        return 2 * in_features * out_features
    return walk.ab * in_features * out_features if walk.base != walk.ab or walk.quantized else 0


def dora_vectors(walk: Walk, out_features: int, grad: bool) -> int:
    """Per DoRA linear and layer: the detached weight norm (saved by ``m / norm``), ``m / norm`` (saved by the
    LoRA result's product) and, when the input requires grad, ``m / norm - 1`` (saved by the base result's
    product): out_features each, in the magnitude's dtype."""
    return (3 if grad else 2) * out_features * walk.ab


def dora_transient(plan) -> tuple[int, str]:
    """DoRA's weight norm, computed in every forward (``get_lora_weight``, ``get_weight_norm``): ``lora_B(
    lora_A(eye(in)))`` (the identity saved by lora_A while the product lives: in x in; its 16-bit cast under
    autocast), lora_A's output (in x r), the product (in x out, cast to the input's dtype under autocast), the
    base weight in the input's dtype (a copy when the base's dtype differs: a 16-bit base under fp32
    adapters, a dequantized 4-bit weight), ``s x lora_weight`` and ``W + s x lora_weight`` (out x in each),
    all freed once the norm is taken (the norm is detached). The largest over the adapted linears, and how."""
    walk = Walk(plan, shape_of(plan))
    cfg = plan.profile_options.lora
    xb = walk.ab                                      # peft casts x to the adapters' dtype
    eye = 2 if walk.amp else walk.ab
    base = base_weight_bytes(plan.profile_options.regime)
    cast = bool(cfg.quantization) or base != xb
    best, how = 0, ""
    for module, (i, o) in _adapted(plan).items():
        n = i * i * eye + i * walk.r * walk.a_c + o * i * xb * (3 + int(cast))
        if n > best:
            best = n
            how = (f"{module}: in^2 x {eye} (eye) + in x r x {walk.a_c} + (3{' + 1 (W cast)' if cast else ''}) "
                   f"x out x in x {xb}, in={i}, out={o}")
    return best, how


def _layer(plan, grad_in: bool, placement=None) -> _Layer:
    """One decoder layer's saved tensors under LoRA, walking which tensors require grad
    (the family's own walk)."""
    shape = shape_of(plan)
    family = shape.family
    if generic(plan):
        return generic_layer(plan, shape, grad_in, placement)
    if family.lora_layer is None:
        from .families import BUILTIN_FAMILIES
        modelled = sorted({a for f in BUILTIN_FAMILIES.values() if f.lora_layer is not None for a in f.architectures})
        raise NotModelledError("lora", plan.profile_options.lora,
                               f"None for the {family.name!r} architecture family; LoRA/QLoRA is modelled for "
                               f"architectures {', '.join(modelled)} (one device)",
                               f"the {family.name!r} family's layers under LoRA are not modelled")
    t = placement.tensor_shards if placement is not None else 1
    if t > 1:
        # One tensor-parallel rank (validation/lora_parallel/measure_lora_tp.py): the column-parallel q/k/v and
        # gate/up keep heads / tp and ffn / tp, the row-parallel o and down read those shards; the adapters' r-wide
        # intermediates are whole on every rank (Megatron-Bridge's column adapter all-gathers its r / tp output
        # before linear_out, the row adapter all-reduces its partial r) and a column base's adapter keeps the
        # whole (replicated) layer input: the walk over the split widths with the whole r
        shape = attrs.evolve(shape, heads=shape.heads // t, kv_heads=shape.kv_heads // t, ffn=shape.ffn // t)
    walk = Walk(plan, shape)
    if t > 1:
        # Sequence parallelism (validation/lora_parallel/measure_lora_sp.py): the residual stream and the norms'
        # saved tensors on the rank's s / tp tokens (``Walk.add_residual``); the column adapters read the layer's
        # all-gathered norm output, whole as without SP (Megatron-Bridge with Transformer Engine: the base returns
        # it gathered, ``return_layernorm_output_gathered``), which their lora_A saves (the frozen base does not)
        from .parallel import residual_shards
        walk.sequence = residual_shards(placement)
    kernel = kernel_for(plan)      # (k/v at the query heads' width where the attention expands them: kv_expand.py)

    def attention(grads):
        return kernel.saved(family.attention_layout, kind=walk.kind, dropout=walk.dropout, heads=shape.heads,
                            q_dim=shape.q_dim, kv_dim=shape.kv_dim, hidden=shape.hidden, seq_len=plan.seq_len,
                            tokens=1, grads=grads)
    return family.lora_layer(walk, grad_in, attention)


def generic_layer(plan, shape, grad_in: bool, placement) -> _Layer:
    """One layer under LoRA, derived from the family's own full-training layer (``family.layer``)
    and its linears (``family_linears``). Each part of the full layer (or, where the family gives
    them, its ``lora`` sub-parts) is kept, but:

    * a part ``weight_gradient_only`` (kept only for a frozen weight's gradient: a norm's normalized
      tensor, a linear's input) is dropped, unless it is the input (``inputs_of``) of an adapted
      linear whose lora_A saves the same tensor: in fp32 (the adapters' dtype), and under autocast,
      where such a part is the linears' 16-bit casts (one per linear: the adapted ones' share kept,
      lora_A's own cast being the same size);
    * in pure 16-bit training over fp32 adapters (peft's ``autocast_adapter_dtype``) every adapted
      linear's lora_A saves a 4 B copy of its input, and the 16-bit input kept only for the frozen
      weight goes;
    * an adapted linear whose input no part names keeps it anyway (a tensor kept by another op, the
      attention kernel's output): lora_A shares it in fp32, saves its own cast under autocast (2 B)
      or its 4 B copy in pure 16-bit;
    * every adapted linear adds lora_B's r-wide input; under autocast every frozen linear its
      16-bit weight cast (autocast caches only leaves that require grad) and the adapted ones their
      adapters' cached casts.

    A family that marks no part as some linear's input (``inputs_of``) gets the upper bound: full
    training's parts but the ``weight_gradient_only`` ones, plus the adapters' (said in a note).
    Whole per layer (``constant``); ``recomputable``: what selective recompute drops."""
    from .model import context, layer_bytes
    walk = Walk(plan, shape)
    if walk.holds_input:
        impl = plan.profile_options.quant_spec
        raise NotModelledError("lora.quant_implementation", impl.name, "an implementation that keeps no input "
                               f"(bitsandbytes, torchao) for the {shape.family.display} layers",
                               f"{impl.name} declares saves_input (each 4-bit linear keeps its input): read by the "
                               "LoRA walks of their own (Llama-style, GPT-2), not by the layer derived from the "
                               f"{shape.family.display} description")
    lb = layer_bytes(plan, context(plan, placement))
    T = plan.microbatch * plan.seq_len
    linears, _ = family_linears(shape)
    adapted = [lin for lin in linears if lin.module in walk.adapted]
    parts = [q for p in lb.parts for q in (p.lora or (p,))]
    tagged = any(q.inputs_of for q in parts)
    copy16 = not walk.amp and walk.ab != walk.c          # pure 16-bit base, fp32 adapters

    def reads(q):
        return [lin for lin in adapted if any(lin.selected_by(n) for n in q.inputs_of)]

    constant, recomputable, covered = [], 0, set()
    for q in parts:
        keep = q.nbytes
        if q.inputs_of:
            mine = reads(q)
            covered.update(lin.module for lin in mine)
            if q.weight_gradient_only:
                if copy16 or not mine or (walk.lora_dropout and not walk.amp):   # lora_A reads another tensor
                    keep = 0
                elif walk.amp:
                    keep = q.nbytes * len(mine) / len(q.inputs_of)
            elif walk.amp:
                constant += [(f"{lin.module} LoRA input (bf16 cast)", 2 * lin.in_features * T) for lin in mine]
        elif q.weight_gradient_only:
            keep = 0
        if keep:
            constant.append((q.name, keep))
            if q.recomputed_by_selective:
                recomputable += keep
    # the first layer's input requires no grad: the linears reading it (the first part naming its readers)
    # keep no dropout mask (the multiply by the noise saves it only for its input's gradient)
    first_readers = next((q.inputs_of for q in parts if q.inputs_of), ()) if not grad_in else ()
    for lin in adapted:
        no_grad = any(lin.selected_by(n) for n in first_readers)
        if walk.lora_dropout and not no_grad:    # peft: lora_A(dropout(x)): the mask, and lora_A reads the output
            constant.append((f"{lin.module} LoRA dropout mask ({walk.mask} B)", walk.mask * lin.in_features * T))
        if copy16:
            constant.append((f"{lin.module} LoRA input ({walk.ab} B copy)", walk.ab * lin.in_features * T))
        elif tagged and walk.amp and lin.module not in covered:
            constant.append((f"{lin.module} LoRA input (bf16 cast)", 2 * lin.in_features * T))
        elif walk.lora_dropout and not walk.amp:
            constant.append((f"{lin.module} LoRA input (dropout output)", walk.ab * lin.in_features * T))
        constant.append((f"{lin.module} LoRA intermediate (r={walk.r})", walk.a_c * walk.r * T))
        if walk.dora:
            constant += [(f"{lin.module} {name}", n * T) for name, n in dora_parts(walk, lin.out_features)]
            constant.append((f"{lin.module} DoRA scale vectors", dora_vectors(walk, lin.out_features, not no_grad)))
            copy = dora_dropout_weight(walk, lin.in_features, lin.out_features, not no_grad)
            if copy:
                constant.append((f"{lin.module} DoRA: weight saved by its dropped-input matmul", copy))
    if walk.amp:
        for lin in linears:
            if lin.weight.autocast:
                constant.append((f"{lin.module} weight 16-bit copy (autocast, frozen)",
                                 2 * lin.in_features * lin.out_features))
        for lin in adapted:
            constant.append((f"{lin.module} adapter 16-bit copies (autocast cache)",
                             2 * walk.r * (lin.in_features + lin.out_features)))
    return _Layer((), tuple(constant), lb.output / T if T else 0, lb.output_saved_by_next, True,
                  recomputable=recomputable, tagged=tagged)


def gpt2_layer(walk: Walk, g: bool, attention) -> _Layer:
    """GPT-2 under LoRA: c_attn, attn.c_proj, c_fc, mlp.c_proj."""
    h, f = walk.shape.hidden, walk.shape.ffn
    c, res, adapted, add = walk.c, walk.res, walk.adapted, walk.add
    ln = 2 * (2 if walk.bf16 else 4)
    n_dtype = 2 if walk.bf16 else 4             # LayerNorm output: fp32 except in bf16
    if g:
        add("ln_1 (mean, rstd)", ln)
    shared: set = set()
    walk.lora_in("c_attn", h, n_dtype, shared, g)
    walk.hold_input("c_attn", h, n_dtype, shared, g)
    walk.frozen_copy("c_attn", 3 * h * h, g)
    qkv_grad = g or "c_attn" in adapted
    attn_shared: set = set()
    if qkv_grad:
        attn_shared = walk.add_attention(attention((True, True, True)))
        if walk.dropout:
            add("resid dropout noise (attention)", c * h)
    walk.lora_in("attn.c_proj", h, c, attn_shared, qkv_grad)
    walk.hold_input("attn.c_proj", h, c, attn_shared, qkv_grad)
    walk.frozen_copy("attn.c_proj", h * h, qkv_grad)
    mid_grad = g or qkv_grad or "attn.c_proj" in adapted
    if mid_grad:
        add("mid residual (ln_2 input)", res * h)
        add("ln_2 (mean, rstd)", ln)
    fc_shared: set = set()
    walk.lora_in("c_fc", h, n_dtype, fc_shared, mid_grad)
    walk.hold_input("c_fc", h, n_dtype, fc_shared, mid_grad)
    walk.frozen_copy("c_fc", h * f, mid_grad)
    fc_grad = mid_grad or "c_fc" in adapted
    if fc_grad:
        add("mlp gelu_new (4 f-sized tensors)", 4 * c * f)
    proj_shared: set = set()
    walk.lora_in("mlp.c_proj", f, c, proj_shared, fc_grad)
    walk.hold_input("mlp.c_proj", f, c, proj_shared, fc_grad)
    walk.frozen_copy("mlp.c_proj", f * h, fc_grad)
    out_grad = fc_grad or "mlp.c_proj" in adapted
    if out_grad and walk.dropout:
        add("resid dropout noise (mlp)", c * h)
    return walk.layer(out_grad, out_grad)


def llama_layer(walk: Walk, g: bool, attention) -> _Layer:
    """Llama style under LoRA: q/k/v/o and gate/up/down (Mixtral's experts walked as one
    gated MLP of the expert width)."""
    shape = walk.shape
    h, f, q, kv = shape.hidden, shape.ffn, shape.q_dim, shape.kv_dim
    c, adapted, add = walk.c, walk.adapted, walk.add
    n_dtype = 2 if walk.bf16 else 4             # RMSNorm output (fp32 weight under AMP)
    if g:
        walk.add_residual("input norm (rsqrt" + (", fp32 copy of the input)" if walk.bf16 else ")"),
                          4 + (4 * h if walk.bf16 else 0))
    shared = set()
    for m, width in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
        walk.lora_in(m, h, n_dtype, shared, g)
        walk.hold_input(m, h, n_dtype, shared, g)
        walk.frozen_copy(m, h * width, g)
    q_grad, k_grad, v_grad = (g or m in adapted for m in ("q_proj", "k_proj", "v_proj"))
    any_grad = q_grad or k_grad or v_grad
    attn_shared: set = set()
    if any_grad:
        attn_shared = walk.add_attention(attention((q_grad, k_grad, v_grad)))
    walk.lora_in("o_proj", q, c, attn_shared, any_grad)
    walk.hold_input("o_proj", q, c, attn_shared, any_grad)
    walk.frozen_copy("o_proj", q * h, any_grad)
    mid_grad = g or any_grad or "o_proj" in adapted
    if mid_grad:
        walk.add_residual("mid residual + post-attention norm (rsqrt)", 4 * h + 4)
    shared = set()
    for m in ("gate_proj", "up_proj"):
        walk.lora_in(m, h, n_dtype, shared, mid_grad)
        walk.hold_input(m, h, n_dtype, shared, mid_grad)
        walk.frozen_copy(m, h * f, mid_grad)
    gate_grad = mid_grad or "gate_proj" in adapted
    up_grad = mid_grad or "up_proj" in adapted
    add("mlp (gate out, silu out, up out)", c * f * (int(gate_grad) + int(up_grad) + int(gate_grad)))
    prod_grad = gate_grad or up_grad
    down_shared: set = set()
    walk.lora_in("down_proj", f, c, down_shared, prod_grad)
    walk.hold_input("down_proj", f, c, down_shared, prod_grad)
    walk.frozen_copy("down_proj", f * h, prod_grad)
    out_grad = prod_grad or "down_proj" in adapted
    return walk.layer(out_grad and not walk.bf16, out_grad)


def _layers(plan, placement=None):
    """The first layer (its input requires no grad, unless the embedding trains: ``modules_to_save``) and
    the others (derived layers: the same)."""
    first = _layer(plan, trains_embedding(plan), placement)
    return first, _layer(plan, first.grad_out, placement)


@cached_terms
def layer_terms(plan, placement, *, kept_layers: int | None = None, selective: bool = False) -> list[MemoryTerm]:
    if getattr(plan.profile_options, "compile", None):      # compile.py: the compiled blocks' saved set
        from .compile import lora_layer_terms
        return lora_layer_terms(plan, placement)
    L = placement.layers_per_stage
    T = plan.microbatch * plan.seq_len
    kept = L if kept_layers is None else min(kept_layers, L)
    first, other = _layers(plan, placement)
    stage = stage_of(plan, placement)
    n = stage.in_flight
    if not stage.first:      # a later stage's received input requires grad: every layer is like the model's others
        first = _layer(plan, True, placement)

    def saved(layer):
        n = layer.saved(T)
        if selective:
            n -= T * sum(p.nbytes for p in layer.parts if p.recomputed_by_selective) + layer.recomputable
        return n + layer.kept_output(T)

    terms = []
    flying = f" x {n:g} micro-batches in flight" if n != 1 else ""
    if kept:
        total = saved(first) + (kept - 1) * saved(other)
        parts = ", ".join(f"{p.name} {_n(p.nbytes)}" for p in other.parts)
        consts = ", ".join(f"{name} {_n(b)}" for name, b in other.constant)
        why = "its input needs no gradient" if stage.first else "its received input requires grad"
        layers = f"first layer {_n(saved(first))} B ({why}) + {kept - 1} layers x {_n(saved(other))} B"
        terms.append(MemoryTerm(
            component=ACTIVATIONS, key=K.LAYERS_SAVED,
            label="decoder layers: saved for backward (LoRA)", nbytes=total * n if n != 1
            else total, phases=SAVED,
            formula=(f"({layers}){flying}" if flying else layers) + f"; per token: {parts}"
                    + (f"; per layer: {consts}" if consts else "")
                    + (f"; output {_n(other.output)}" if other.output_saved else "")))
    checkpointed = L - kept
    if first.held or other.held:
        # a 4-bit implementation's held inputs (``Walk.hold_input``): a node attribute, not a saved tensor, so a
        # checkpoint does not drop it and the backward does not free it: alive until the graph is freed (after the
        # backward's end). The kept layers' are among their saved parts (where nothing else keeps the tensor)
        per = ", ".join(f"{name} {_n(b)}" for name, b in other.held) + " per token"
        every = first.held_bytes(T) + (L - 1) * other.held_bytes(T)
        if checkpointed:
            held = (first.held_bytes(T) if not kept else 0) + (checkpointed - (0 if kept else 1)) * other.held_bytes(T)
            terms.append(MemoryTerm(
                component=ACTIVATIONS, label="checkpointed layers: inputs the 4-bit matmuls keep (ctx.tensors)",
                nbytes=held * n, phases=SAVED,
                formula=(f"first layer {_n(first.held_bytes(T))} B + " if not kept else "")
                        + f"{checkpointed - (0 if kept else 1)} layers x {_n(other.held_bytes(T))} B ({per}; not "
                        "dropped by the checkpoint)" + flying))
        terms.append(MemoryTerm(
            component=ACTIVATIONS, label="inputs the 4-bit matmuls keep (ctx.tensors), at the backward's end",
            nbytes=every * n, phases=(BACKWARD_END,),
            formula=f"first layer {_n(first.held_bytes(T))} B + {L - 1} layers x {_n(other.held_bytes(T))} B ({per}; "
                    "not freed by the backward: alive until the graph is freed)" + flying))
    if checkpointed:
        res = plan.profile_options.regime.residual
        h = shape_of(plan).hidden
        terms.append(MemoryTerm(
            component=ACTIVATIONS, key=K.CHECKPOINTED_INPUTS, label="checkpointed layers: their inputs",
            nbytes=checkpointed * res * T * h * n if n != 1 else checkpointed * res * T * h,
            phases=SAVED, formula=f"{checkpointed} layers x T x h x {res} B{flying}"))
        s = shape_of(plan)
        c = plan.profile_options.regime.compute
        work = other.saved(T) + other.output * T + 2 * T * s.ffn * c
        how = f"one layer recomputed in the backward, with its MLP's activation gradients (2 x T x ffn x {c} B): {_n(work)} B"
        if not stage.split and _top_layer_moments(plan, placement) and not generic(plan) \
                and _every_layer_checkpointed(plan, placement):
            # the bottom layer's backward, as the top layer's moment (its own saved set: its input needs no grad)
            work, how = _bottom_layer_backward(plan, first, T, h, c)
        terms.append(MemoryTerm(
            component=ACTIVATIONS, key=K.RECOMPUTE_WORKING_SET,
            label="recompute working set (one layer)", nbytes=work, phases=(BACKWARD_END,), formula=how))
    return terms


def _bottom_layer_backward(plan, first: _Layer, T, h, c) -> tuple[int, str]:
    """The backward's end under eager full checkpointing where the top layer's moments apply (``_top_layer_moments``):
    the bottom layer's backward holds what the top layer's does (``_layer_backward``: the larger of its recompute, at
    down_proj's dequantization over a 4-bit base, and its MLP's backward after it, its output's gradient beside)
    with its own saved set. A 4-bit base's dequantized weight is its own term at the backward's end
    (``_dequantized_weight``); it is alive in the recompute, not in the MLP's backward (3a or 2a: down_proj's input
    gradient and the product's two, before up and gate dequantize again, by when the product's saved operands are
    gone), so this term is the moment less it. (Before: the saved set, the output and 2a beside that weight, which
    counted the transient and the MLP's gradients together: every linear adapted +1.8 %, fp32 +2.8 % on torchtune's
    eager QLoRA; the bottom layer's checkpointed input is not counted, as before.)"""
    held, how = _layer_backward(plan, first, T, h, c)
    n = max(i * o for _, i, o in _quantized_linears(plan))
    transient = _dequantization(plan, n, c, forward=False)[0]
    if not transient:
        return held, f"the bottom layer's backward: {how}"
    return held - transient, (f"the bottom layer's backward: {how} - {_n(transient)} B (the dequantized weight, its "
                              "own term)")


# --- activations outside the decoder layers -------------------------------------------------------

@cached_terms
def model_activation_terms(plan, placement, *, recompute: bool) -> list[MemoryTerm]:
    """Token ids, RoPE tables, the final norm, logits and cross-entropy (as in full training:
    the frozen LM head's input requires grad), AMP's copy of the LM head; no embedding output
    (nothing needs its gradient) and no embedding gradient at the backward's end.

    ``modules_to_save``: a trainable LM head keeps its input (the final norm's output, in the matmul's
    dtype) for its weight's gradient; a trainable embedding makes its output require grad (the first
    norm saves it, as in full training) and the backward runs to it (the embedding output's gradient at
    the backward's end; its weight's gradient is with the others). DoRA: the weight norm's transient
    in the forward, where it exceeds the loss's moment (``dora_transient``). A loss implementation
    that declares LoRA (``allows``) replaces the cross-entropy's terms (``loss.loss_terms``, the LM head
    frozen unless ``modules_to_save`` trains it). An adapted LM head (``target_modules`` naming ``lm_head``):
    ``_lm_head_adapter_terms``."""
    if adapts_lm_head(plan.profile_options.lora):
        _check_head_options(plan)
    if getattr(plan.profile_options, "compile", None) is True:     # compile.py: the whole peft model compiled
        from .compile import whole_lora_terms
        return whole_lora_terms(plan, placement)
    stage = stage_of(plan, placement)
    if stage.split:
        return _stage_activation_terms(plan, placement, stage)
    shape = shape_of(plan)
    regime = plan.profile_options.regime
    kind = _kind(regime)
    T = plan.microbatch * plan.seq_len
    h, V = shape.hidden, shape.vocab
    c = regime.compute
    terms = [MemoryTerm(component=ACTIVATIONS, key=K.TOKEN_IDS,
                        label="input token ids (int64)", nbytes=8 * T, phases=ALL,
                        formula=f"T={_n(T)} x 8 B")]
    add = terms.append
    if shape.family.positions == "rotary":
        b = 4 if regime.residual == 4 else 2
        add(MemoryTerm(component=ACTIVATIONS, key=K.ROPE_TABLES, label="RoPE cos/sin tables", phases=SAVED,
                       nbytes=2 * plan.seq_len * shape.rotary_dim * b, formula=f"2 x s x head_dim x {b} B"))
    if trains_embedding(plan):
        if shape.family.norm.saves_input_in_16bit or not regime.pure_16bit:
            add(MemoryTerm(component=ACTIVATIONS, key=K.EMBEDDING_OUTPUT,
                           label="embedding output (saved by the first norm)",
                           nbytes=regime.residual * T * h, phases=SAVED,
                           formula=f"T x h x {regime.residual} B (modules_to_save: the embedding trains)"))
        add(MemoryTerm(component=ACTIVATIONS, label="gradient of the embedding output", phases=(BACKWARD_END,),
                       nbytes=regime.residual * T * h,
                       formula=f"T x h x {regime.residual} B (the backward runs to the trainable embedding)"))
    through_layers = {id(t) for t in terms}      # alive while the layers run (the rest: at the loss)
    final, how = shape.family.norm.lora_final_saved(kind, T, h)
    if trains_lm_head(plan):
        final += c * T * h
        how += f" + the LM head's input ({c} x T x h: its trainable copy's weight gradient)"
    from .parallel import residual_shards
    sp = residual_shards(placement) if placement.tensor_shards > 1 else 1
    if sp != 1:     # sequence parallelism: the final norm on the rank's s / tp tokens (modules_to_save refused)
        final //= sp
        how += f" / sp={sp}"
    add(MemoryTerm(component=ACTIVATIONS, key=K.FINAL_NORM,
                   label="final norm", nbytes=final, phases=SAVED, formula=f"{how} = {_n(final)} B"))
    head = _lm_head_adapter_saved(plan, T, h, c)
    terms += head
    before_loss = {id(t) for t in terms}      # alive at the LM head's moment and at the loss's
    add(MemoryTerm(component=ACTIVATIONS, key=K.LOG_SOFTMAX, label="log-softmax of the logits (fp32)", nbytes=4 * T * V,
                   phases=SAVED, formula=f"4 x T x V = 4 x {_n(T)} x {_n(V)}"))
    add(MemoryTerm(component=ACTIVATIONS, key=K.SHIFTED_LABELS,
                   label="shifted labels (int64)", nbytes=8 * T, phases=SAVED,
                   formula="T x 8 B (saved by nll_loss)"))
    logits = c * T * V + (4 * T * V if c != 4 else 0)
    add(MemoryTerm(component=ACTIVATIONS, key=K.LOGITS,
                   label="logits" + (" + their fp32 copy" if c != 4 else "") + " (at the loss)",
                   nbytes=logits, phases=(FORWARD,),
                   formula=f"{c} x T x V" + (" + 4 x T x V" if c != 4 else "") + " (freed once the loss is computed)"))
    add(MemoryTerm(component=ACTIVATIONS, key=K.CE_BACKWARD,
                   label="cross-entropy backward temporaries (fp32)", nbytes=8 * T * V,
                   phases=(BACKWARD,), formula="nll_loss_backward + _log_softmax_backward_data: 2 x 4 x T x V"))
    t = placement.tensor_shards
    if t > 1:
        terms += _tensor_lm_head_terms(T, h, V, c, t, sp)
        if sp == 1 and _chosen_loss(plan) is not None:
            # Megatron's vocab-parallel loss (the only one _check_tensor lets through): the final norm's output, which
            # the frozen LM head does not save, is held by Megatron's GPTModel._postprocess (its hidden_states
            # argument) until the loss returns (validation/lora_parallel/measure_lora_tp_loss.py; with sequence
            # parallelism _tensor_lm_head_terms has it already)
            add(MemoryTerm(component=ACTIVATIONS, key=K.FINAL_NORM_OUTPUT,
                           label="final norm output (held until the loss)", nbytes=c * T * h,
                           phases=(FORWARD,), formula=f"{c} x T x h (the frozen LM head saves none of it)"))
    if regime.autocast:
        add(MemoryTerm(component=ACTIVATIONS, key=K.LM_HEAD_AUTOCAST_COPY, label="autocast 16-bit copy of the "
                       + ("LM head's trainable copy" if trains_lm_head(plan) else "frozen LM head"),
                       nbytes=2 * shape.embedding_parameters, phases=SAVED,
                       formula=f"{_n(shape.embedding_parameters)} params x 2 B (saved by the LM head matmul)"))
        if recompute:
            r = plan.profile_options.lora.rank
            adapters = counts(plan).trainable_parameters - sum(n for _, n in counts(plan).saved_modules)
            add(MemoryTerm(component=ACTIVATIONS, label="autocast 16-bit copies of the adapters",
                           nbytes=2 * adapters, phases=(FORWARD,),
                           formula=f"{_n(adapters)} adapter params (rank {r}) x 2 B (cached until autocast exits)"))
            through_layers.add(id(terms[-1]))
    if plan.profile_options.lora.quantization in ("nf4", "fp4") and not getattr(plan.profile_options, "compile", None):
        add(_dequantized_weight(plan, c))       # (compiled blocks: their saved set, compile.dequantized_saved)
    if _chosen_loss(plan) is not None:   # loss.py: chunked or fused
        from .loss import loss_terms
        from .model import context
        terms = loss_terms(plan, context(plan, placement), terms, lm_head_trainable=trains_lm_head(plan))
        if getattr(plan.profile_options, "compile", None):     # compile.py: torchtune's compiled chunked loss
            from .compile import lora_loss_terms
            terms = lora_loss_terms(plan, placement, terms)
    if head:
        at_loss = sum(t.nbytes for t in terms if FORWARD in t.phases and id(t) not in before_loss)
        terms.append(_lm_head_adapter_transient(plan, T, V, c, at_loss))
    if plan.profile_options.lora.use_dora:
        transient, how = dora_transient(plan)
        at_loss = sum(t.nbytes for t in terms if FORWARD in t.phases and id(t) not in through_layers)
        add = terms.append
        add(MemoryTerm(component=ACTIVATIONS, label="DoRA weight norm (transient), beyond the loss's moment",
                       nbytes=max(0, transient - at_loss), phases=(FORWARD,),
                       formula=f"max(0, {_n(transient)} B ({how}) - {_n(at_loss)} B (what the forward's end holds "
                               "beyond the layers: final norm, logits, loss))"))
    if (recompute and _top_layer_moments(plan, placement) and not getattr(plan.profile_options, "compile", None)
            and _every_layer_checkpointed(plan, placement)):
        # (over a plain base a moment the loss's covers adds no term: those predictions keep their terms)
        keep = (lambda t: True) if plan.profile_options.lora.quantization else (lambda t: t.nbytes > 0)
        at_loss = sum(t.nbytes for t in terms if FORWARD in t.phases and id(t) not in through_layers)
        terms += filter(keep, [_dequantized_in_forward(plan, placement, T, h, c, at_loss)])
        if not generic(plan):       # derived on the Llama walk's gate/up/down MLP (not a family's own, nor experts)
            at_loss = sum(t.nbytes for t in terms if BACKWARD in t.phases and id(t) not in through_layers)
            terms += filter(keep, [_top_layer_backward(plan, placement, T, h, c, at_loss)])
    if generic(plan):       # the family's own terms outside the layers (soft-capped logits, tables)
        return shape.family.adjusted("model_activations", plan, placement, terms)
    return rope.stored("model_activations", plan, terms)


def _lm_head_adapter_saved(plan, T, h, c) -> list[MemoryTerm]:
    """An adapted LM head's saved tensors (validation/lora_head): ``lora_a`` keeps its input, the final norm's
    output (c T h, which the frozen head's matmul does not keep), ``lora_b`` its r-wide input (c T r); the scaling and
    the sum save nothing (torchtune 0.6.1 modules/peft/lora.py ``LoRALinear.forward``). Per chunk where the model
    applies the head per loss chunk: views of one final norm output, the same bytes."""
    if not counts(plan).head_modules:
        return []
    r = plan.profile_options.lora.rank
    return [MemoryTerm(component=ACTIVATIONS, label="the LM head adapter's saved input and r-wide output",
                       nbytes=c * T * (h + r), phases=SAVED,
                       formula=f"{c} x T x h (lora_a's input: the final norm's output) + {c} x T x r (lora_b's "
                               f"input) = {c} x {_n(T)} x ({_n(h)} + {r})")]


def _lm_head_adapter_transient(plan, T, V, c, at_loss) -> MemoryTerm:
    """The adapted LM head's forward moment beyond the loss's: at the sum of the frozen projection's output and the
    adapter's scaled output, three c t V (the base output, the scaled ``lora_b`` output, their sum; ``lora_b``'s own
    output freed by the scaling), t the tokens one call of the head takes (the loss's chunk where the model applies
    the head per chunk, ``lm_head_chunks``: torchtune's chunked output; else T), beside the earlier chunks' outputs
    c (T - t) V; against ``at_loss``, what the loss's forward holds beyond what both moments hold (logits,
    log-softmax, labels). Measured (validation/lora_head): fp32 cross-entropy 12 T V against the loss's 8 T V."""
    from .loss import chunk_tokens
    impl = getattr(plan.profile_options, "loss_implementation", None)
    t, n = T, plan.profile_options.loss_chunks
    if impl is not None and impl.lm_head_chunks:      # a count of chunks, or tokens per chunk (the sequence's split)
        t = min(T, chunk_tokens(plan, n) if impl.chunk_unit == "chunks" else plan.microbatch * min(n, plan.seq_len))
    moment = c * V * (T - t) + 3 * c * t * V
    how = (f"{c} x (T - t) x V (the earlier chunks' outputs) + 3 x {c} x t x V, t = {_n(t)}" if t != T else
           f"3 x {c} x T x V")
    return MemoryTerm(component=ACTIVATIONS, label="the LM head adapter's output sum (transient), beyond the loss's "
                      "moment", nbytes=max(0, moment - at_loss), phases=(FORWARD,),
                      formula=f"max(0, {how} (the base output, the scaled lora_b output, their sum) = {_n(moment)} B "
                              f"- {_n(at_loss)} B (the loss's forward: logits, log-softmax, labels))")


def _every_layer_checkpointed(plan, placement) -> bool:
    """Does every decoder layer run its forward under a whole-layer checkpoint (full checkpointing, no block
    recompute keeping some)?"""
    from .checkpointing import LAYERS, spec_of
    n = plan.profile_options.checkpointed_layers
    return spec_of(plan).recomputes == LAYERS and (n is None or n >= placement.layers_per_stage)


def _top_layer_moments(plan, placement) -> bool:
    """Are the top layer's checkpointed moments (``_dequantized_in_forward``, ``_top_layer_backward``) derived for this
    run? A 4-bit base (nf4/fp4, as measured on torchtune + torchao and HF + bitsandbytes), or a plain (16-bit or fp32)
    base on a dense gated MLP walked by the family's own LoRA walk, on one tensor-parallel rank, without DoRA
    (torchtune's eager LoRA and HF + peft, validation/lora_ckpt_compare.py): the same moments with no dequantization;
    under autocast the frozen weights' fresh 16-bit casts in its place (a transient in the checkpointed forward; the
    recompute saves them, and down_proj's backward releases its own before the MLP's gradients)."""
    cfg = plan.profile_options.lora
    if cfg.quantization in ("nf4", "fp4"):
        return True
    family = shape_of(plan).family
    return (cfg.quantization is None and not generic(plan)
            and family.gated_mlp and not family.sparse and not cfg.use_dora and placement.tensor_shards == 1)


def _dequantization(plan, n, c, forward: bool = True) -> tuple[int, str]:
    """One dequantization of an ``n``-element linear to ``c`` bytes (the chosen 4-bit implementation's transient),
    0 over a plain base (its matmuls read the stored weight); under autocast a plain base's fresh 16-bit cast of the
    frozen weight, c x n, in the checkpointed forward (the recompute saves it: the saved set has it)."""
    if plan.profile_options.lora.quantization is None:
        if plan.profile_options.regime.autocast and forward:
            return c * n, f"autocast's {c}-byte cast of the frozen weight, {c} x {_n(n)}"
        return 0, "none: the base is not quantized"
    from . import quantizations
    return quantizations.chosen(plan.profile_options).transient(n, c)


def _over_base(plan) -> str:
    return " over the 4-bit base" if plan.profile_options.lora.quantization is not None else ""


def _fsdp2_in_layer(plan, placement) -> tuple[int, str, int, str]:
    """What FSDP2 holds inside a checkpointed layer beyond the data-parallel rule's terms, for the top layer's moments
    (``_dequantized_in_forward``, ``_top_layer_backward``): (forward bytes, how, backward bytes, how). Read from what
    the rule declares: weights sharded (``placement.weight_shards``) by a rule whose options follow FSDP2
    (``fsdp_version=2``), its gathered layer and root (``buffers``), whether the root is resharded after the model's
    forward (``root_reshard_after_forward``) and an all-gather limit it prices itself (``prefetch_layers``,
    ``limit_all_gathers``). Measured: validation/qlora_fsdp2 (torch 2.13 ``_fsdp_param_group.py``, torchtune 0.6.1's
    ``shard_model``), the events at each peak:

    * the forward: the top layer's all-gather output, kept after its copy-out until the next all-gather
      (``comm_ctx.all_gather_state``; freed by the root's post-forward, so not at the loss), and, where the rule frees
      the root and the last layer when the model's forward returns (its terms in the backward only), those gathered
      parameters, which the layer's moment, inside the model's forward, still holds (G + G + root);
    * the backward: a checkpointed layer's backward holds the layer below's all-gather, prefetched by its pre-backward
      hook (one more gathered layer G, with >= 2 layers on the rank; none where the rule prices its own prefetch).

    (0, "", 0, "") elsewhere: no weight sharding, FSDP1's or another rule's gathers (not measured checkpointed)."""
    if placement.weight_shards == 1:
        return 0, "", 0, ""
    options = plan.options.get(plan.rules.get("dp")) if plan.rules else None
    if getattr(options, "fsdp_version", None) != 2:
        return 0, "", 0, ""
    from .._deepspeed_buckets import prefetched_layers
    from .buffers import _layer_gather, fsdp_root
    G = _layer_gather(plan, placement)[0].nbytes
    root = sum(t.nbytes for t in fsdp_root(plan, placement))
    resharded = bool(getattr(options, "root_reshard_after_forward", False))
    forward = G + (G + root if resharded else 0)
    fhow = (f"FSDP2: {_n(G)} B (the layer's all-gather output, kept until the next all-gather)"
            + (f" + {_n(G)} B + {_n(root)} B (the gathered layer and root, which the rule frees when the model's "
               "forward returns: root_reshard_after_forward)" if resharded else ""))
    L = placement.layers_per_stage
    backward = G if L >= 2 and not prefetched_layers(options, L) else 0
    bhow = f"FSDP2: {_n(G)} B (the layer below's all-gather, prefetched by the pre-backward hook)" if backward else ""
    return forward, fhow, backward, bhow


def _dequantized_in_forward(plan, placement, T, h, c, at_loss) -> MemoryTerm:
    """A 4-bit base under full checkpointing: the top layer's forward, which saves nothing, dequantizes each linear
    again (the implementation's ``transient``) inside its MLP. Measured, torchtune 0.6.1 eager QLoRA
    (validation/compile/measure_blocks_qlora.py --events, the forward's peak): beyond the checkpointed layers'
    inputs the layer holds its attention output (the ``attn_out`` local), the residual ``h = attn_out + x`` and the
    MLP norm's output (T x h each), and in the MLP, with a = c x T x ffn, the largest of: silu(gate) (a) and
    up_proj's ``get_original_weight`` at its peak (bf16, 128-256 tokens); silu(gate), up_proj's output and its
    dequantized weight (2a + c n); silu(gate), up's output and their product (3a: fp32, 1,024 tokens); the product and
    down_proj's dequantization (a + the transient again); with up_proj adapted (torchtune's LoRALinear: ``out +
    scale x lora_b(lora_a(x))``, the adapters in the base's dtype), silu(gate), up's output, lora_b's output and its
    scaled copy and lora_a's output (4a + c T r: fp32, every linear adapted); with gate_proj adapted, 3a + c T r.
    That moment and the loss's are apart: the term is what
    it holds beyond the loss's moment (as DoRA's weight norm). Over a plain base (``_top_layer_moments``) the same
    moments with no dequantization: 3a, or 4a + c T r with up_proj adapted. Under FSDP2 the moment, inside the model's
    forward, holds what ``_fsdp2_in_layer`` says (the layer's kept all-gather output; the root and the gathered layer
    where the rule frees them when the model's forward returns). Not priced: the CPU's fp32 output of a 16-bit ``mm``
    (T x out x 4, freed at the cast), which the profiler's timeline sees (validation/qlora_fsdp2) and a dispatch-level
    tracker does not (validation/lora_ckpt_compare.py's runs)."""
    ffn = shape_of(plan).ffn
    res = plan.profile_options.regime.residual
    n = max(i * o for _, i, o in _quantized_linears(plan))
    transient, how = _dequantization(plan, n, c)
    plain_cast = plan.profile_options.regime.autocast and not plan.profile_options.lora.quantization
    fresh_weight = plan.profile_options.lora.quantization is not None or plain_cast   # a dequantized or cast weight
    a = c * T * ffn
    # an adapted linear adds lora_a's output (T x r) beside lora_b's and its scaled copy (T x ffn each) before the sum,
    # in the adapters' compute dtype: the base's (torchtune's LoRALinear, peft's adapter_dtype="base"), or fp32 where
    # peft keeps fp32 adapters over a 16-bit base (autocast_adapter_dtype), which also casts the adapter's input, the
    # MLP norm's output, to fp32 (``_cast_input_dtype``: T x h x 4, alive through the adapter); autocast computes
    # them in 16 bits (the Walk's ``a_c``)
    regime = plan.profile_options.regime
    ab = regime.gather or regime.weight
    a_c = 2 if regime.autocast else ab
    w = a_c * T * ffn
    cast = ab * T * h if ab != c and not regime.autocast else 0
    if plain_cast:      # lora_A's 16-bit cast of the fp32 norm output
        cast = 2 * T * h
    lora = a_c * T * plan.profile_options.lora.rank + cast
    adapted = set(_adapted(plan)) if not generic(plan) else set()
    mlp = max(a + transient, 2 * a + (c * n if fresh_weight else 0), 3 * a,
              a + 2 * w + lora if "gate_proj" in adapted else 0, 2 * a + 2 * w + lora if "up_proj" in adapted else 0)
    # the attention output (c), the residual (res) and the MLP norm's output: in c, fp32 under autocast (HF's RMSNorm
    # returns the input's dtype, the fp32 residual's; the Walk's n_dtype)
    norm_out = 4 if plain_cast else c
    fsdp, fsdp_how = _fsdp2_in_layer(plan, placement)[:2]
    held = (c + norm_out + res) * T * h + mlp + fsdp
    deq = (f"a + the largest linear's {'cast' if plain_cast else 'dequantization'}, 2a + {c} x {_n(n)}, "
           if fresh_weight else "")
    path = (f"2a + 2 x {a_c} x T x ffn + {a_c} x T x r" + (f" + {_n(cast // (T * h))} x T x h (the adapter's input cast to its dtype)"
                                                            if cast else "")) if a_c != c or cast else f"4a + {c} x T x r"
    return MemoryTerm(component=ACTIVATIONS, label=f"a checkpointed layer's forward{_over_base(plan)}, beyond the "
                      "loss's moment", nbytes=max(0, held - at_loss), phases=(FORWARD,),
                      formula=f"max(0, {_n(held)} B (the top layer: attention output, residual, norm output "
                              f"({c + norm_out + res} x T x h), and its MLP's max({deq}"
                              f"3a, {path} where the MLP's linears are adapted) with "
                              f"a = {c} x T x ffn = {_n(a)}; the dequantization: {how}"
                              + (f"; {fsdp_how}" if fsdp else "") + ") "
                              f"- {_n(at_loss)} B (what the loss's moment holds beyond the layers))")


def _top_layer_backward(plan, placement, T, h, c, at_loss) -> MemoryTerm:
    """A 4-bit base under full checkpointing, eager: the backward's peak inside the top layer, before any adapter
    gradient exists (every layer's checkpointed input and the layer output's gradient alive beside it). Measured,
    torchtune 0.6.1 eager QLoRA (validation/compile/measure_blocks_qlora.py --events, the backward's peak), the
    larger of two moments beyond the layer output's gradient (res x T x h):

    * the recompute, at down_proj's dequantization (the implementation's ``transient``): the layer's saved set
      (all of it made by then), its locals (the attention output, c x T x h; the residual h where the MLP norm saves
      an fp32 copy of it, not h itself; the MLP norm's output where no gate/up adapter saves it) and the product
      silu(gate) x up (a = c x T x ffn) where no down adapter saves it (bf16 q/v, 128 tokens); with down_proj
      adapted, its adapter's scaled output gradient (c x T x h, made before the recompute), less the adapter's
      intermediate (c x T x r, saved after the base's op: bf16, every linear adapted);
    * the MLP's backward after the recompute: the saved set, down's input gradient (a) and the product's backward's
      two gradients (2a), less the product that down's adapter saved and released in its backward (fp32, 1,024
      tokens: q/v 3a, every linear 2a).

    The term is what that moment holds beyond the loss's backward moment (as the forward's term). Priced on the
    models with a LoRA walk of their own (``generic`` ones, a family's fused MLP or experts, keep the backward's end
    moment alone: not derived). Over a plain base (``_top_layer_moments``) the same two moments with no
    dequantization in the recompute. Under FSDP2 the layer below's prefetched all-gather beside them
    (``_fsdp2_in_layer``)."""
    first, other = _layers(plan, placement)
    held, how = _layer_backward(plan, other if placement.layers_per_stage > 1 else first, T, h, c)
    prefetch, fsdp_how = _fsdp2_in_layer(plan, placement)[2:]
    if prefetch:
        held += prefetch
        how += f" + {fsdp_how}"
    return MemoryTerm(component=ACTIVATIONS, label=f"the top layer's backward{_over_base(plan)} (checkpointed), "
                      "beyond the loss's moment", nbytes=max(0, held - at_loss), phases=(BACKWARD,),
                      formula=f"max(0, {how} - {_n(at_loss)} B (what the loss's backward holds beyond the layers))")


def _layer_backward(plan, layer: _Layer, T, h, c) -> tuple[int, str]:
    """What one checkpointed layer's backward holds at its peak (``_top_layer_backward``'s two moments, and with peft's
    fp32 adapters over a 16-bit base the recompute at up_proj's adapter), its output's gradient included, and how:
    (bytes, formula)."""
    saved = layer.saved(T)
    regime = plan.profile_options.regime
    res = regime.residual
    a = c * T * shape_of(plan).ffn
    n = max(i * o for _, i, o in _quantized_linears(plan))
    transient, how = _dequantization(plan, n, c, forward=False)
    adapted = set(_adapted(plan))
    norm_in = "gate_proj" in adapted or "up_proj" in adapted
    down = "down_proj" in adapted
    # the MLP norm computes in fp32: from a 16-bit residual it saves an fp32 copy, from an fp32 one h itself
    locals_ = c * T * h + (res * T * h if res != 4 else 0) + (0 if norm_in else c * T * h) + (0 if down else a)
    # an adapted down_proj: its adapter's scaled output gradient (c x T x h: ``lora_out * scaling``'s backward, which
    # needs no saved tensor) is made before the recompute and held through it; at the base's dequantization the
    # adapter has not saved its intermediate (c x T x r) yet
    lora = c * T * h - c * T * plan.profile_options.lora.rank if down else 0
    ab = regime.gather or regime.weight
    if regime.autocast and not plan.profile_options.lora.quantization and down and ab != 2:
        # autocast over a plain base: peft casts down_proj's 16-bit input (the product, a local beside the copies)
        # up to the fp32 adapters' dtype before autocast casts it down again for lora_A (which saves that), after the
        # base's output (c x T x h): the recompute's moment at down_proj's adapter (validation/lora_ckpt_trace.py)
        transient = ab * T * shape_of(plan).ffn + a + c * T * h
        how = (f"at its adapter under autocast: peft's {ab}-byte copy of its input, {ab} x T x ffn, beside the input "
               f"itself (a) and the base's output ({c} x T x h)")
    recompute = saved + locals_ + lora + transient
    # under autocast a plain base's frozen down_proj saved its weight's 16-bit cast (in the saved set), which its
    # backward releases before the product's gradients are made
    cast = c * h * shape_of(plan).ffn if regime.autocast and not plan.profile_options.lora.quantization else 0
    mlp_backward = saved + 3 * a - (a if down else 0) - cast
    # peft's fp32 adapters over a 16-bit base with up_proj adapted: the recompute's moment at up_proj's adapter
    # (validation/lora_ckpt_trace.py): lora_B's output and its scaled copy in fp32 (2 x ab x T x ffn) beside up's base
    # output (a) and the saved set made so far, the saved set less up's output (the product's operand, a) and what
    # down_proj's adapter saves after it (its input's fp32 copy and its intermediate)
    a_c = 2 if regime.autocast else ab
    r = plan.profile_options.lora.rank
    at_up = 0
    if "up_proj" in adapted and a_c != c:
        later = a + ((ab * T * shape_of(plan).ffn if ab != c else 0) + ab * T * r if down else 0)
        up_locals = c * T * h + (res * T * h if res != 4 else 0) + (0 if norm_in else c * T * h) + (c * T * h if down else 0)
        at_up = saved - later + up_locals + a + 2 * a_c * T * shape_of(plan).ffn
    held = res * T * h + max(recompute, mlp_backward, at_up)
    return held, (f"{res} x T x h (the layer output's gradient) + max({_n(saved)} B saved + {_n(locals_ + lora)} B "
                  f"locals + {_n(transient)} B (down_proj's dequantization: {how}) in the recompute, {_n(saved)} B saved "
                  f"+ {3 if not down else 2} x {c} x T x ffn in the MLP's backward"
                  + (f", {_n(at_up)} B at up_proj's fp32 adapter in the recompute" if at_up else "") + f") = {_n(held)} B")


def _stage_activation_terms(plan, placement, stage: Stage) -> list[MemoryTerm]:
    """``model_activation_terms`` of one pipeline stage (validation/lora_parallel/measure_lora_pp.py), with n
    micro-batches in flight (each its own graph, RoPE tables and autocast casts):

    * the token ids on the first stage (the embedding's input) and the last (the labels), one tensor;
    * the RoPE cos/sin tables of each micro-batch (every stage computes them in its forward, its layers save them);
    * a later stage's received input (``requires_grad=True``, as Megatron-LM's ``p2p_communication._communicate``
      allocates it), kept by the schedule until its backward (``input_tensors``), x n; at the backward's end the
      gradient it sends back (T x h in the residual stream's dtype);
    * a stage before the last: its output kept by the schedule until its backward (``output_tensors``) where no
      next layer saves it (a 16-bit residual stream), x n; the gradient it receives, alive through its backward;
    * the last stage: the final norm, log-softmax and labels (x n), the logits and the cross-entropy's backward
      temporaries (one micro-batch at a time), under autocast the frozen LM head's 16-bit cast (x n);
    * QLoRA: the dequantized weight of the stage's largest 4-bit linear while the backward runs."""
    shape = shape_of(plan)
    regime = plan.profile_options.regime
    kind = _kind(regime)
    T = plan.microbatch * plan.seq_len
    h, V = shape.hidden, shape.vocab
    c, res = regime.compute, regime.residual
    n = stage.in_flight
    x = f" x {n:g} micro-batches in flight" if n != 1 else ""
    # Under tensor parallelism too (validation/lora_parallel/measure_lora_tp_pp.py): the residual stream on this
    # rank, whole without sequence parallelism, on its s / tp tokens with (what a receive allocates and sends), the
    # MLP's activation gradients over ffn / tp
    t = placement.tensor_shards
    from .parallel import residual_shards
    sp = residual_shards(placement) if t > 1 else 1
    Tr = T // sp
    on_sp = f" / sp={sp}" if sp != 1 else ""

    def times_n(b):
        return b * n if n != 1 else b
    terms = []
    add = terms.append
    if stage.first or stage.last:
        add(MemoryTerm(component=ACTIVATIONS, key=K.TOKEN_IDS,
                       label="input token ids (int64)", nbytes=8 * T, phases=ALL,
                       formula=f"T={_n(T)} x 8 B (" + ("the embedding's input" if stage.first else "the labels") + ")"))
    if shape.family.positions == "rotary":
        b = 4 if res == 4 else 2
        add(MemoryTerm(component=ACTIVATIONS, key=K.ROPE_TABLES, label="RoPE cos/sin tables", phases=SAVED,
                       nbytes=times_n(2 * plan.seq_len * shape.rotary_dim * b), formula=f"2 x s x head_dim x {b} B{x}"))
    if not stage.first:
        add(MemoryTerm(component=ACTIVATIONS, key=K.STAGE_INPUT,
                       label="stage input (received; kept for its backward)", phases=SAVED,
                       nbytes=times_n(res * Tr * h), formula=f"T x h x {res} B{on_sp}{x} (requires grad: every "
                                                              "layer's adapters and inputs keep their gradient path)"))
        add(MemoryTerm(component=ACTIVATIONS, label="gradient of the stage input (sent to the previous stage)",
                       nbytes=res * Tr * h, phases=(BACKWARD_END,), formula=f"T x h x {res} B{on_sp}"))
    if not stage.last:
        # The stage's forward and backward peaks are inside its last layer, not at a loss: the model's forward
        # keeps its input bound until it returns (transformers' LlamaModel.forward: ``inputs_embeds``; on the
        # first stage the embedding's output, which no layer saves) and its position ids; the backward starts
        # with the top layer's MLP backward, its activation gradients (2 x T x ffn, as the recompute working set
        # counts them). Not modelled: the top linear's output transients in the forward (-1 % to -4 % there).
        if stage.first:
            add(MemoryTerm(component=ACTIVATIONS, label="embedding output (held by the model's forward)",
                           nbytes=res * Tr * h, phases=(FORWARD,),
                           formula=f"T x h x {res} B{on_sp} (no layer saves it: the forward's peak is in the stage's last "
                                   "layer, not at a loss)"))
        add(MemoryTerm(component=ACTIVATIONS, label="position ids (int64, during the forward)", nbytes=8 * plan.seq_len,
                       phases=(FORWARD,), formula="s x 8 B"))
        add(MemoryTerm(component=ACTIVATIONS, label="top layer's MLP backward: activation gradients",
                       nbytes=2 * T * (shape.ffn // t) * c, phases=(BACKWARD,),
                       formula=f"2 x T x ffn{f' / tp={t}' if t > 1 else ''} x {c} B (the backward's first moment, "
                               "before any saved tensor is freed)"))
        other = _layers(plan, placement)[1]
        if not other.output_saved:
            add(MemoryTerm(component=ACTIVATIONS, label="stage output (kept by the schedule until its backward)",
                           phases=SAVED, nbytes=times_n(res * Tr * h),
                           formula=f"T x h x {res} B{on_sp}{x} (no next layer on this stage saves it)"))
        add(MemoryTerm(component=ACTIVATIONS, label="gradient of the stage output (received)", nbytes=res * Tr * h,
                       phases=(BACKWARD, BACKWARD_END), formula=f"T x h x {res} B{on_sp} (the backward starts from it)"))
        if t > 1:
            add(_top_mlp_moment(plan, placement, other, T, sp))
    else:
        final, how = shape.family.norm.lora_final_saved(kind, T, h)
        if sp != 1:
            final //= sp
        add(MemoryTerm(component=ACTIVATIONS, key=K.FINAL_NORM, label="final norm", nbytes=times_n(final), phases=SAVED,
                       formula=f"{how}{on_sp} = {_n(final)} B{x}"))
        add(MemoryTerm(component=ACTIVATIONS, key=K.LOG_SOFTMAX,
                       label="log-softmax of the logits (fp32)", nbytes=times_n(4 * T * V),
                       phases=SAVED, formula=f"4 x T x V = 4 x {_n(T)} x {_n(V)}{x}"))
        add(MemoryTerm(component=ACTIVATIONS, key=K.SHIFTED_LABELS,
                       label="shifted labels (int64)", nbytes=times_n(8 * T), phases=SAVED,
                       formula=f"T x 8 B (saved by nll_loss){x}"))
        logits = c * T * V + (4 * T * V if c != 4 else 0)
        add(MemoryTerm(component=ACTIVATIONS, key=K.LOGITS, label="logits" + (" + their fp32 copy" if c != 4 else "")
                       + " (at the loss)", nbytes=logits, phases=(FORWARD,),
                       formula=f"{c} x T x V" + (" + 4 x T x V" if c != 4 else "") + " (freed once the loss is computed)"))
        add(MemoryTerm(component=ACTIVATIONS, key=K.CE_BACKWARD,
                       label="cross-entropy backward temporaries (fp32)", nbytes=8 * T * V,
                       phases=(BACKWARD,), formula="nll_loss_backward + _log_softmax_backward_data: 2 x 4 x T x V"))
        if t > 1:       # as model_activation_terms under tp (one micro-batch at the loss at a time)
            terms += _tensor_lm_head_terms(T, h, V, c, t, sp)
        if regime.autocast:
            add(MemoryTerm(component=ACTIVATIONS, label="autocast 16-bit copy of the frozen LM head",
                           nbytes=times_n(2 * shape.embedding_parameters), phases=SAVED,
                           formula=f"{_n(shape.embedding_parameters)} params x 2 B (saved by the LM head matmul){x}"))
    if plan.profile_options.lora.quantization in ("nf4", "fp4"):
        add(_dequantized_weight(plan, c))
    if generic(plan):
        return shape.family.adjusted("model_activations", plan, placement, terms)
    return rope.stored("model_activations", plan, terms)


def _top_mlp_moment(plan, placement, other: _Layer, T: int, sp: int) -> MemoryTerm:
    """A tensor-parallel stage before the last: its forward's peak is inside its top layer's MLP, at the down
    projection of the micro-batch running (validation/lora_parallel/measure_lora_tp_pp.py, every tensor alive there
    listed on the fp32 and bf16 stages). Beside the saved tensors the stage's terms count, alive then: the layer's
    input where no norm saves it (a 16-bit residual stream, the layer not the stage's first), the 16-bit mid residual
    (the norm saves its fp32 copy), the post-attention norm's output on the rank's tokens under SP (the MLP reads
    its all-gathered copy), the MLP's input where no gate/up adapter saves it, the product where no down adapter
    does; then a frozen down projection's partial output and its all-reduced (SP: reduce-scattered) copy, or, with a
    down adapter, at its all-gather (the moment after the base's): the base's reduced output, the adapter's out / tp
    shard, the gather's (tp x ...) buffer and the concatenated whole. Less the running micro-batch's layer output,
    which the stage's terms count and which is not made yet."""
    shape = shape_of(plan)
    t = placement.tensor_shards
    regime = plan.profile_options.regime
    c, res, h = regime.compute, regime.residual, shape.hidden
    f = shape.ffn // t
    Tr = T // sp
    adapted = _adapted(plan)
    parts = []
    if placement.layers_per_stage > 1 and not other.output_saved:
        parts.append(("the layer's input", res * Tr * h))
    if res == 2:
        parts.append(("the 16-bit mid residual", res * Tr * h))
    if sp != 1:
        parts.append(("the post-attention norm's output on the rank's tokens", c * Tr * h))
    if "gate_proj" not in adapted and "up_proj" not in adapted:
        parts.append(("the MLP's input" + (" (all-gathered)" if sp != 1 else ""), c * T * h))
    if "down_proj" not in adapted:
        parts.append(("the product (down's input)", c * T * f))
        parts += [("down's partial output", c * T * h), ("its reduced copy", c * Tr * h)]
    else:
        parts += [("down's reduced output", c * Tr * h), ("down adapter's out / tp", c * T * h // t),
                  ("its all-gather buffer", c * T * h), ("the gathered whole", c * T * h)]
    out = res * Tr * h
    return MemoryTerm(component=ACTIVATIONS, label="top layer's MLP forward: its transients (tensor parallel)",
                      nbytes=sum(n for _, n in parts) - out, phases=(FORWARD,),
                      formula=" + ".join(f"{name} {_n(n)}" for name, n in parts)
                      + f" - the running micro-batch's output, not made yet, {_n(out)}")


def _tensor_lm_head_terms(T, h, V, c, t, sp) -> list[MemoryTerm]:
    """The forward's moment at the LM head of a tensor-parallel rank, beyond one device's."""
    terms = []
    if c == 4:
        # as full training's (model.model_activation_terms): the fp32 logits all-gathered by the column-parallel
        # LM head with no later copy, the forward's peak at the gather (its local shard beside the whole)
        terms.append(MemoryTerm(component=ACTIVATIONS, label="LM head all-gather: the local logits shard (fp32)",
                                nbytes=4 * T * V // t, phases=(FORWARD,), formula=f"4 x T x V / tp={t}"))
    if sp != 1:
        # sequence parallelism (validation/lora_parallel/measure_lora_sp.py): the final norm's output, on the rank's
        # tokens, held by the base model's output until the loss; in fp32 the forward's peak is the logits'
        # all-gather, inside the LM head, whose input (all-gathered from the sequence shards, whole; the frozen head
        # saves none of it) is alive there too
        terms.append(MemoryTerm(component=ACTIVATIONS, key=K.FINAL_NORM_OUTPUT,
                                label="final norm output (held until the loss; sequence "
                                "parallel)", nbytes=c * T * h // sp, phases=(FORWARD,), formula=f"{c} x T x h / sp={sp}"))
        if c == 4:
            terms.append(MemoryTerm(component=ACTIVATIONS, label="LM head input, all-gathered (during the LM head)",
                                    nbytes=c * T * h, phases=(FORWARD,), formula=f"{c} x T x h (the sequence shards "
                                    "gathered; freed with the head's forward)"))
    return terms


def _dequantized_weight(plan, c) -> MemoryTerm:
    """The backward's transient: the largest 4-bit linear dequantized to c bytes, as the chosen implementation
    declares it (``quantizations.py``: bitsandbytes' dequantize_4bit, the weight alone; torchao's
    get_original_weight, its int64 codes and intermediates too)."""
    from . import quantizations
    largest = max(i * o for _, i, o in _quantized_linears(plan))
    nbytes, how = quantizations.chosen(plan.profile_options).transient(largest, c)
    return MemoryTerm(component=ACTIVATIONS, label="dequantized weight (transient, one 4-bit linear)",
                      nbytes=nbytes, phases=(BACKWARD_END,), formula=f"the largest quantized linear, {how}")


def _quantized_linears(plan):
    if generic(plan):
        return [(lin.module, lin.in_features, lin.out_features) for lin in family_linears(shape_of(plan))[0]]
    arch = finetune._check_model(plan.model)
    return [(lin.module, lin.in_features, lin.out_features)
            for lin in finetune._attention(plan.model, arch) + finetune._mlp(plan.model, arch)]
