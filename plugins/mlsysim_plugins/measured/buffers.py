"""Communication buffers, measured grade: what a data-parallel, expert-parallel or offload
mechanism keeps alive beside the model states, phase by phase, in the regime's dtypes.

These are building blocks: a sharding rule's ``measured_buffer_terms`` (``zero``, ``fsdp``,
``ep``, or a third party's ZeRO variant) returns the ones its mechanism has, so the buffers
belong to the rule that causes them, never to a list of built-in rule names. Each takes
the plan and placement the rule's callable receives.
"""

from __future__ import annotations

from mlsysim_core.terms import (BACKWARD, BACKWARD_END, COMMUNICATION_BUFFERS, FORWARD, PHASES as ALL_PHASES,
                                MemoryTerm)

from ._cache import cached_terms, per_layout
from .parallel import layer_parameters_on_rank, residual_shards


def _fmt(x) -> str:
    return f"{x:,.0f}"


def gathered_bytes(plan) -> int | float:
    """Bytes of one gathered (unsharded) parameter: FSDP2's mixed precision gathers in bf16."""
    regime = plan.profile_options.regime
    return regime.gather or regime.weight


def layer_parameters(plan, placement=None) -> float:
    """One decoder layer's matrix parameters on a rank, as the rules split them (pass the
    ``placement`` the rule's callable receives), before data-parallel sharding."""
    return layer_parameters_on_rank(plan, placement)


@per_layout
def ddp_buckets(plan, placement, replicas: int | None = None) -> list[MemoryTerm]:
    """PyTorch DDP copies every gradient into its flat buckets (gradient_as_bucket_view=False),
    when ``replicas`` (the ranks the gradient all-reduce spans: the data-parallel rule's group;
    by default the layout's dp x cp ranks) is more than one."""
    regime = plan.profile_options.regime
    if replicas is None:
        replicas = plan.dp_size * plan.cp_size      # the layout's data-parallel group (the collective's span)
    if replicas == 1 or not regime.gradient:
        return []
    params = placement.trainable_parameters_per_rank
    return [MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="DDP gradient buckets", nbytes=params * regime.gradient,
        phases=ALL_PHASES, formula=f"{_fmt(params)} params x {regime.gradient} B: PyTorch DDP copies every "
                                   "gradient into its flat buckets (gradient_as_bucket_view=False)")]


@per_layout
def layer_gather(plan, placement) -> list[MemoryTerm]:
    """ZeRO-3 / FSDP gather one layer's parameters for its forward and backward, and
    reduce-scatter its unsharded gradients during its backward."""
    if placement.weight_shards == 1:
        return []
    return _layer_gather(plan, placement)


def _layer_gather(plan, placement) -> list[MemoryTerm]:
    regime = plan.profile_options.regime
    layer, gathered = layer_parameters(plan, placement), gathered_bytes(plan)
    if plan.profile_options.lora is not None:      # a frozen base and its adapters (lora.py)
        from .lora import gathered_layer
        return gathered_layer(plan, layer)
    return [
        MemoryTerm(component=COMMUNICATION_BUFFERS, label="all-gathered parameters of one layer",
                   nbytes=layer * gathered, phases=(FORWARD, BACKWARD),
                   formula=f"{_fmt(layer)} params of one layer x {gathered} B (one layer at a time, as PyTorch "
                           "measures on the CPU; a GPU's prefetch can hold the next one too)"),
        MemoryTerm(component=COMMUNICATION_BUFFERS, label="reduce-scatter input: one layer's unsharded gradients",
                   nbytes=layer * (regime.gradient or 4), phases=(BACKWARD_END,),
                   formula=f"{_fmt(layer)} params x {regime.gradient or 4} B (during each layer's backward)")]


def separate_units(plan) -> tuple:
    """The root's modules the data-parallel rule's options say are ``fully_shard``'ed as units of their own
    (``separate_units``: ``"embedding"``, ``"lm_head"``; torchtune's ``custom_sharded_layers``), or ()."""
    rule = plan.rules.get("dp") if plan.rules else None
    options = plan.options_for(rule) if rule else None
    return tuple(getattr(options, "separate_units", ()) or ())


def _root_shape(plan, placement):
    """(the shape, the embedding's parameters on the rank, the separated units): a tied model's output projection is
    the embedding's weight, no module of its own (torchtune's TiedLinear), so it cannot be a unit apart."""
    from .shapes import shape_of
    shape = shape_of(plan)
    units = separate_units(plan)
    if units and shape.tied:
        from mlsysim_core.errors import NotModelledError
        rule = plan.rules.get("dp")
        raise NotModelledError(f"plugin_options['{rule}'].separate_units", list(units), "() with tied embeddings",
                               "a tied output projection shares the embedding's weight (torchtune's TiedLinear is no "
                               "module of its own to fully_shard); measured untied (validation/compile/"
                               "measure_blocks_fsdp_custom.py)")
    return shape, shape.embedding_parameters / placement.tensor_shards, units


def _root_gathered(plan) -> int | float:
    if plan.profile_options.lora is not None:      # frozen: gathered in the base's dtype (lora.py)
        from .lora import frozen_gather_bytes
        return frozen_gather_bytes(plan)
    return gathered_bytes(plan)


@per_layout
def fsdp_root(plan, placement) -> list[MemoryTerm]:
    """fully_shard on the model: its own parameters (embedding, LM head, final norm) stay
    gathered from the forward to the backward. With ``separate_units`` (the rule's options; torchtune's
    ``custom_sharded_layers``) the named modules are units of their own, not the root's: the root keeps the final norm
    and the rest (``fsdp_separate_units`` prices the separated ones where they run). Every layer's moment that counts
    the root (compile.fsdp2_around_blocks, lora._fsdp2_in_layer) then holds only that."""
    if placement.weight_shards == 1:
        return []
    shape, emb, units = _root_shape(plan, placement)
    gathered = _root_gathered(plan)
    if units:
        parts = {"embedding": emb, "lm_head": 0 if shape.tied else emb}
        kept = [name for name in parts if name not in units]
        root = sum(parts[name] for name in kept) + shape.hidden
        names = {"embedding": "embedding", "lm_head": "LM head"}
        what = ", ".join([names[k] for k in kept] + ["final norm"])
        return [MemoryTerm(
            component=COMMUNICATION_BUFFERS, label=f"root group unsharded ({what}; "
                                                   + " and ".join(names[u] for u in units) + " units of their own)",
            nbytes=root * gathered, phases=(FORWARD, BACKWARD),
            formula=f"{_fmt(root)} params x {gathered} B (fully_shard on the model: its own parameters, the "
                    f"separate_units {', '.join(units)} fully_shard'ed apart, stay gathered from the forward to the "
                    "backward)")]
    root = emb * (1 if shape.tied else 2) + shape.hidden
    return [MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="root group unsharded (embedding, LM head, final norm)",
        nbytes=root * gathered, phases=(FORWARD, BACKWARD),
        formula=f"{_fmt(root)} params x {gathered} B (fully_shard on the model: its own parameters stay "
                "gathered from the forward to the backward)")]


@per_layout
def fsdp_separate_units(plan, placement) -> list[MemoryTerm]:
    """The root's modules ``fully_shard``'ed apart (``separate_units``; torchtune 0.6.1's ``shard_model`` with
    ``custom_sharded_layers``, every unit ``reshard_after_forward=True``): each gathered only around its own forward
    and backward (torch 2.13 ``_fsdp_param_group.py``: pre_forward unshards, post_forward reshards; pre_backward
    unshards again, post_backward reshards and reduce-scatters). The LM head's is alive in its backward, the first
    (the loss's backward: the phase BACKWARD); in its forward it is what the root held there before, beside the
    logits being computed (not a peak: the loss's forward terms follow it). The embedding's is alive in its
    backward, the last (its gradient's moment; not the peak measured, not priced), and not in the layers' moments.
    Under torchtune's chunked loss the projection is called once per chunk, and its unit gathered and freed around
    each call (measure_blocks_fsdp_custom.py --gathers: 8 all-gathers in the forward, 8 in the backward): one copy
    alive at a time, the same bytes.
    Measured (validation/compile/measure_blocks_fsdp_custom.py, untied fp32 and bf16, 2 and 4 ranks, against the
    twins without it): the forward's peak lower by both gathered copies (2 V h b), the backward's by those and, the
    LM head's gradient reduce-scattered after its own backward rather than in the root's at the backward's end, V h
    g (1 - 1/W) (2.5 and 2.75 V h x 4 B at 2 and 4 ranks): that gradient was not priced with the root whole, so
    nothing is taken off for it."""
    if placement.weight_shards == 1:
        return []
    shape, emb, units = _root_shape(plan, placement)
    if "lm_head" not in units:
        return []
    gathered = _root_gathered(plan)
    return [MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="LM head's unit unsharded (its backward)", nbytes=emb * gathered,
        phases=(BACKWARD,),
        formula=f"{_fmt(emb)} params x {gathered} B (separate_units lm_head: fully_shard'ed apart, gathered around its "
                "forward and again for its backward, the first)")]


@per_layout
def kept_unsharded(plan, placement) -> list[MemoryTerm]:
    """SHARD_GRAD_OP (reshard_after_forward=False): every gathered layer stays until its backward."""
    if placement.weight_shards == 1:
        return []
    params, gathered = placement.parameters_per_rank, gathered_bytes(plan)
    if plan.profile_options.lora is not None:      # the frozen base in its dtype, the adapters in theirs
        from .lora import counts, frozen_gather_bytes
        adapters = placement.trainable_parameters_per_rank      # beside the base's parameters_per_rank
        c = counts(plan)        # QLoRA: the quantized linears gathered as stored (lora.gathered_layer)
        q_bytes = c.quantized_weight_bytes
        if c.quantized_parameters:      # an implementation that declares its split: what its all-gather rebuilds
            from . import quantized_sharding as qs
            if qs.declared(plan) is not None:
                q_bytes = plan.model.layers * qs.gathered_layer_bytes(plan)
        frozen = frozen_gather_bytes(plan) * (params - c.quantized_parameters) + q_bytes
        gathered = (frozen + gathered * adapters) / params
    return [MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="unsharded parameters kept from forward to backward",
        nbytes=params * gathered, phases=(FORWARD, BACKWARD),
        formula=f"{_fmt(params)} params x {gathered} B (SHARD_GRAD_OP / reshard_after_forward=False: every "
                "gathered layer stays until its backward)")]


def expert_all_to_all(plan, placement) -> list[MemoryTerm]:
    """The dispatch and combine buffers of the experts' all-to-all (none without expert parallelism:
    answered before the memo, whose key is the whole plan, new for every batch size)."""
    if placement.expert_shards == 1:
        return []
    return _expert_all_to_all(plan, placement)


@cached_terms
def _expert_all_to_all(plan, placement) -> list[MemoryTerm]:
    from .shapes import shape_of
    shape = shape_of(plan)
    o = plan.profile_options
    tokens = plan.microbatch * plan.seq_len / placement.sequence_shards / residual_shards(placement)
    cf = o.moe_capacity_factor or 1.0
    from .routing import imbalance_factor
    f = imbalance_factor(plan, placement)       # the busiest rank receives f x its share (it sends its own copies)
    nbytes = (1 + f) * tokens * shape.top_k * shape.hidden * o.regime.compute * cf
    return [MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="expert all-to-all dispatch + combine buffers", nbytes=nbytes,
        phases=(FORWARD, BACKWARD),
        formula=(f"2 x {_fmt(tokens)}" if f == 1.0 else f"(1 + imbalance {f:.4f}) x {_fmt(tokens)}")
                + f" tokens x top-k {shape.top_k} x h {shape.hidden} x {o.regime.compute} B"
                + (f" x capacity factor {cf:g}" if cf != 1.0 else ""))]


@per_layout
def offload_staging(plan, placement) -> list[MemoryTerm]:
    """Offloaded parameters stream in one layer at a time (when no rule already gathers
    layers: weights not sharded); offloaded gradients stream out one layer at a time."""
    offloaded = dict(plan.profile_options.offload)
    terms = []
    if "parameters" in offloaded and placement.weight_shards == 1:
        terms += _layer_gather(plan, placement)
    if "gradients" in offloaded:
        regime, layer = plan.profile_options.regime, layer_parameters(plan, placement)
        what = "params"
        if plan.profile_options.lora is not None:      # only the adapters have gradients (the frozen base none)
            from .lora import counts
            layer, what = sum(row[3] for row in counts(plan).per_module), "adapter params (the frozen base has none)"
        terms.append(MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="gradient offload staging (one layer)",
            nbytes=layer * (regime.gradient or 4), phases=(BACKWARD, BACKWARD_END),
            formula=f"{_fmt(layer)} {what} x {regime.gradient or 4} B copied to the host as they are produced"))
    return terms


def deepspeed_zero3(plan, placement, options) -> list[MemoryTerm]:
    """DeepSpeed ZeRO-3's buffers beside the gathered layer, its options given
    (``mlsysim_plugins._deepspeed_buckets.zero3_terms``): the ipg bucket in the run's precision
    (DeepSpeed's 16-bit parameter dtype), the prefetched and reused layers and the persistent tensors, gathered."""
    from mlsysim_plugins import _deepspeed_buckets as ds
    from .shapes import shape_of
    shape = shape_of(plan)
    layer = layer_parameters(plan, placement)
    head = shape.embedding_parameters / placement.tensor_shards + shape.hidden     # final norm and LM head
    return ds.zero3_terms(options, plan.bytes_per_value, gathered_bytes(plan), layer, placement.layers_per_stage, head,
                          tuple(shape.parameter_tensors()))


def fsdp2_eager_checkpointed(plan, placement) -> list[MemoryTerm]:
    """FSDP2's buffers around eager layers under full checkpointing (no LoRA: lora.py prices its own moments), the
    mechanism compile.fsdp2_around_blocks reads from validation/compile/measure_blocks_fsdp.py's timelines, which
    the eager twins share event for event (torch 2.13 ``_fsdp_param_group.py``; one description for both):

    * **the forward**: the top layer's forward inside its checkpoint (at its MLP: the mid residual, the MLP norm's
      output, the gated product's inputs and the product; on the CPU in 16 bits a matmul's fp32 output in place of
      the product) beside its gathered parameters and the last all-gather's output (kept until the next
      all-gather) and, with the root resharded after the forward (the rule's options say so), the root's; the rule's
      forward terms and the loss's moment hold none of these: priced as the excess over the loss's forward terms;
    * **the backward**: block i's recompute and MLP backward beside its gathered parameters and the root's, the
      block below's prefetched all-gather, the block above's reduce-scatter input and the shards of the blocks
      above (``fsdp2_around_blocks``' moments, the highest priced, BACKWARD_END); under a per-op policy (every
      layer's saved ops kept) the backward's peak is the top layer's MLP backward, which the policy declares
      (``measured.top_layer_backward``): there FSDP2 adds the block below's prefetched all-gather and the root's
      gradients unsharded until its reduce-scatter (BACKWARD; validation/compile/blocks_fsdp_sac_measurements.json).

    Only where measured: eager (no compile), dense, data parallelism alone, every layer checkpointed, FSDP's own
    prefetch (no ``prefetch_layers``/``limit_all_gathers``), no activation offload or optimizer in backward. The
    RNG state: torchtune's checkpoint keeps one per layer on the CPU (preserve_rng_state=True)."""
    o = plan.profile_options
    if (placement.weight_shards == 1 or o.compile or o.lora is not None or getattr(o, "activation_offload", None)
            or getattr(o, "optimizer_in_backward", None) or placement.tensor_shards != 1
            or placement.sequence_shards != 1 or placement.expert_shards != 1 or placement.pipeline_stages != 1):
        return []
    from .checkpointing import spec_of, whole_layers
    # a per-op policy (op-SAC, save-list) declares the ops it saves (the spec's measured.saved_ops): every layer
    # checkpointed, the rest recomputed
    per_op = None if whole_layers(plan) else spec_of(plan).extensions.get("measured.saved_ops")
    if not (whole_layers(plan) or per_op is not None) or o.checkpointed_layers is not None:
        return []
    from . import model as model_mod
    from .compile import _dp_options, _rng, fsdp2_around_blocks
    options = _dp_options(plan)
    if getattr(options, "prefetch_layers", None) is not None or getattr(options, "limit_all_gathers", None) is not None:
        return []
    ctx = model_mod.context(plan, placement)
    s, regime, T, L = ctx.shape, ctx.regime, ctx.tokens, ctx.layers
    if s.experts:
        return []
    import attrs

    from . import term_keys as K
    c, r, h, f = regime.compute, regime.residual, s.hidden, s.ffn
    held, backward = fsdp2_around_blocks(plan, placement, r * T * h, _rng(plan), L, what="the eager layers'")
    gated = s.model.gated_mlp if s.model.gated_mlp is not None else s.family.gated_mlp
    mlp_in, product = (2 if gated else 1) * f * c, f * c
    cpu16 = 4 * f if c != 4 and (o.device or "cuda") == "cpu" else 0
    work = T * (r * h + c * h + mlp_in + max(product, cpu16))
    after, saved_how = 0, ""
    if per_op is not None:
        # the top layer's saved ops are in the layers' saved term (its MLP's first matmuls' kept beside the
        # product, as the recompute working set of full checkpointing never keeps them); those after the product
        # (the MLP's output matmul) are not computed yet
        ops, kept = per_op(plan, placement)
        mlp = [op for op in ops if op.module == "mlp"]
        later_ops = [op for op in mlp[2 if gated else 1:] if op in kept]
        after = T * sum(op.nbytes for op in later_ops)
        saved_how = (f" - {_fmt(after)} B (the layer's saved " + ", ".join(op.name for op in later_ops)
                     + " output, not computed yet)") if after else ""
    during = (K.TOKEN_IDS, *K.ROPE_TABLE_KEYS, K.EMBEDDING_OUTPUT)     # alive while the layers run
    later = sum(t.nbytes for t in model_mod.model_activation_terms(plan, placement, recompute=True)
                if FORWARD in t.phases and t.key not in during)
    excess = work - after + held - later
    terms = []
    if excess > 0:
        terms.append(MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="FSDP2: the top checkpointed layer's forward beside its gathered "
                                                   "parameters (beyond the loss's moment)", nbytes=excess,
            phases=(FORWARD,),
            formula=f"T x ({_fmt(r * h)} (the mid residual) + {_fmt(c * h)} (the MLP norm's output) + {_fmt(mlp_in)} "
                    f"(the MLP's first matmuls' outputs) + {_fmt(max(product, cpu16))} ("
                    + ("a 16-bit matmul's fp32 output on the CPU" if cpu16 > product else "the product")
                    + f")) = {_fmt(work)} B + {_fmt(held)} B (FSDP2: the last all-gather's output, kept until the next "
                    "all-gather" + (", the layer's and the root's gathered parameters, resharded after the forward "
                                    "in the rule's terms" if getattr(options, "root_reshard_after_forward", False)
                                    else "") + f") - {_fmt(later)} B (the final norm's, the logits' and the loss's "
                    "forward terms, not yet)" + saved_how))
    if backward is not None and per_op is None:
        terms.append(attrs.evolve(backward, component=COMMUNICATION_BUFFERS))
    top = spec_of(plan).extensions.get("measured.top_layer_backward") if per_op is not None else None
    excess = top(plan, placement) if top is not None and backward is not None else None
    if excess is not None:
        # a per-op policy's backward peak is its top layer's MLP backward (the base's moment, declared by the
        # policy: ``measured.top_layer_backward``, signed over the loss's moment); FSDP2 adds there the block
        # below's prefetched all-gather (the rule's terms hold the top block's gathered layer and the root) and the
        # root's gradients unsharded until the root's reduce-scatter (the base counts this rank's share)
        from .parallel import gradient_divisor
        G = _layer_gather(plan, placement)[0].nbytes
        above = plan.model.parameters - L * s.layer_parameters() - (0 if s.tied else s.embedding_parameters)
        share = placement.trainable_parameters_per_rank / gradient_divisor(placement) / plan.model.parameters
        root_grads = above * (regime.gradient or 0) * (1 - share)
        add = max(excess + G + root_grads, 0) - max(excess, 0)
        if add > 0:
            terms.append(MemoryTerm(
                component=COMMUNICATION_BUFFERS, label="FSDP2: the block below's prefetched all-gather and the root's "
                                                       "unsharded gradients at the top layer's MLP backward",
                nbytes=add, phases=(BACKWARD,),
                formula=f"max({_fmt(excess)} B (the top layer's MLP backward over the loss's moment) + {_fmt(G)} B "
                        f"(the block below's all-gather, prefetched) + {_fmt(above)} params above the layers x "
                        f"{regime.gradient or 0} B x (1 - {share:g}) (the root's gradients unsharded, beyond this "
                        f"rank's share), 0) - max({_fmt(excess)} B, 0)"))
    return terms
