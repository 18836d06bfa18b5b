"""The measured-grade terms that are not an optimizer's or a checkpointing strategy's:
weights, gradients, the activations outside the decoder layers (embedding, final norm,
logits and cross-entropy, AMP's weight copies) and the decoder layers themselves under
each checkpointing choice. Every formula follows what PyTorch 2.13 and transformers 5.23
keep alive, op by op, as measured by ``MemTracker`` (``validation/``).

Notation in formulas: T = micro-batch x sequence tokens, h hidden, V vocabulary,
c = bytes of the compute dtype, L layers on this rank.
"""

from __future__ import annotations

import attrs

from mlsysim_core.terms import (ACTIVATIONS, BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, OPTIMIZER_STEP,
                     RUNTIME_OVERHEADS, WEIGHTS, MemoryTerm)
from mlsysim_core import _checks
from mlsysim_core.memo import memoize

from ._cache import cached_terms, layout_of, per_layout
from ._cache import term as _term
from . import term_keys as K
from .kv_expand import kernel_for     # (the plan's attention kernel, k/v expanded where declared)
from .layers import EXPERTS, layer_forward_bytes, megatron_layer_bytes
from .parallel import (expert_tensor_shards, gradient_divisor, is_parallel, rank_layer_saved, residual_shards,
                       weight_divisor)
from .shapes import ModelShape, shape_of

ALL = (FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP)
SAVED = (FORWARD, BACKWARD)


_n = "{:,.0f}".format     # a number as formulas show it: 1,234,567 (a C method: ~22 per solve)


@attrs.frozen
class Context:
    """What the activation formulas read, derived once per plan."""

    shape: ModelShape
    tokens: int          # micro-batch x sequence on this rank
    seq_len: int
    layers: int          # decoder layers on this rank
    shards: int          # activation shards (tensor/sequence parallelism)
    regime: object
    # What the selected rules split (their placement), never plan.tp_size and friends:
    tensor: int = 1          # each weight matrix's split (tensor parallelism)
    sequence: int = 1        # the sequence's split (context parallelism)
    residual: int = 1        # the residual stream's split over the tensor-parallel ranks (sequence parallelism)
    experts: int = 1         # the routed experts' split (expert parallelism)
    expert_tensor: int = 1   # each expert's matrices' split (expert_tp_size, else the tensor split)


_last_context: tuple = (None, None, None)     # (a plan, a placement, their Context): a rank asks twice


def context(plan, placement) -> Context:
    """The plan's ``Context`` on ``placement``: what does not depend on the batch kept per layout
    (``_layout_context``), the tokens of this plan's micro-batch set on a copy of it."""
    global _last_context
    last_plan, last_placement, ctx = _last_context
    if plan is last_plan and placement is last_placement:
        return ctx
    ctx = _with_tokens(_layout_context(layout_of(plan), placement), plan.microbatch * plan.seq_len)
    _last_context = (plan, placement, ctx)
    return ctx


@memoize
def _layout_context(layout, placement) -> Context:
    """``Context`` but its ``tokens`` (None here), from what a plan of this layout reads besides its batch."""
    plan = layout.plan
    return Context(shape=shape_of(plan), tokens=None, seq_len=plan.seq_len,
                   layers=placement.layers_per_stage, shards=placement.activation_shards,
                   regime=plan.profile_options.regime, tensor=placement.tensor_shards,
                   sequence=placement.sequence_shards, residual=residual_shards(placement),
                   experts=placement.expert_shards, expert_tensor=expert_tensor_shards(plan, placement))


# (``_with_tokens`` sets every field of ``Context``: a field added to it is added there too.)
assert tuple(a.name for a in attrs.fields(Context)) == ("shape", "tokens", "seq_len", "layers", "shards", "regime",
                                                        "tensor", "sequence", "residual", "experts", "expert_tensor")
(_c_shape, _c_tokens, _c_seq_len, _c_layers, _c_shards, _c_regime, _c_tensor, _c_sequence, _c_residual, _c_experts,
 _c_expert_tensor) = (Context.__dict__[a.name].__set__ for a in attrs.fields(Context))


def _with_tokens(base: Context, tokens: int) -> Context:
    """``attrs.evolve(base, tokens=tokens)``, slot by slot (``Context`` has no checks or converters)."""
    ctx = object.__new__(Context)
    _c_shape(ctx, base.shape)
    _c_tokens(ctx, tokens)
    _c_seq_len(ctx, base.seq_len)
    _c_layers(ctx, base.layers)
    _c_shards(ctx, base.shards)
    _c_regime(ctx, base.regime)
    _c_tensor(ctx, base.tensor)
    _c_sequence(ctx, base.sequence)
    _c_residual(ctx, base.residual)
    _c_experts(ctx, base.experts)
    _c_expert_tensor(ctx, base.expert_tensor)
    return ctx


def layer_bytes(plan, ctx: Context):
    o = plan.profile_options
    cf, imbalance = o.moe_capacity_factor, 1.0
    if cf is None and plan.rank is not None and ctx.experts > 1:
        # Dropless routing: the busiest expert-parallel rank computes more than the mean T x k copies.
        from .routing import imbalance_factor
        imbalance = imbalance_factor(plan, ctx)
    return _layer_bytes(ctx.shape, ctx.regime, kernel_for(plan), o.dropout > 0, o.device or "cuda", ctx.tokens,
                        ctx.seq_len, plan.model, cf, imbalance)


@memoize
def _layer_bytes(s: ModelShape, regime, kernel, dropout: bool, device: str, tokens: int, seq_len: int, model, cf,
                 imbalance: float):
    """One layer's ``LayerBytes`` from exactly what it depends on (a search meets the same layer
    under every data-parallel rule and checkpointing strategy)."""
    if megatron(regime):
        lb = megatron_layer_bytes(
            family=s.family, hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim, ffn=s.ffn,
            attention=kernel, dropout=dropout, tokens=tokens, seq_len=seq_len, experts=s.experts, top_k=s.top_k)
    else:
        lb = layer_forward_bytes(
            family=s.family, hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim, ffn=s.ffn,
            regime=_regime_kind(regime), attention=kernel, dropout=dropout, tokens=tokens, seq_len=seq_len,
            experts=s.experts, top_k=s.top_k, model=model, device=device)
    if cf is not None:
        # Token dropping with a capacity factor pads every expert's batch to its capacity:
        # the experts' activations scale with cf x the routed tokens (dropless: cf = None).
        parts = tuple(attrs.evolve(p, nbytes=p.nbytes * cf) if p.split == EXPERTS else p for p in lb.parts)
        lb = attrs.evolve(lb, parts=parts, saved=sum(p.nbytes for p in parts))
    elif imbalance != 1.0:
        parts = tuple(attrs.evolve(p, nbytes=p.nbytes * imbalance) if p.split == EXPERTS else p for p in lb.parts)
        lb = attrs.evolve(lb, parts=parts, saved=sum(p.nbytes for p in parts))
    return lb


def megatron(regime) -> bool:
    """Megatron-Core training (the fp32 main-grad regime): the decoder layers are
    Megatron-Core's (16-bit activations, the saved tensors Korthikanti et al. count) and
    the cross-entropy is vocabulary-parallel; every other regime runs Hugging Face's layers
    in PyTorch."""
    return bool(regime.main_grad)


def _regime_kind(regime) -> str:
    """The activation formulas know three dtype layouts: fp32, autocast, pure 16-bit."""
    if regime.autocast:
        return "amp-bf16"
    return "fp32" if regime.compute == 4 else "bf16"


# --- weights and gradients -----------------------------------------------------------------

@per_layout
def weight_terms(plan, placement) -> list[MemoryTerm]:
    if plan.profile_options.lora is not None:     # (LoRA's module is imported only for LoRA plans)
        from . import lora
        return lora.weight_terms(plan, placement)
    regime = plan.profile_options.regime
    shape = shape_of(plan)
    params = placement.parameters_per_rank / weight_divisor(placement)
    terms = [MemoryTerm(component=WEIGHTS, label=f"parameters ({regime.name}, {regime.weight} B)",
                        nbytes=params * regime.weight, phases=ALL,
                        formula=f"{_n(params)} params/rank x {regime.weight} B")]
    terms += rope_buffer_terms(shape)
    return shape.family.adjusted("weights", plan, placement, terms)


def rope_buffer_terms(shape: ModelShape) -> list[MemoryTerm]:
    """RoPE's inverse-frequency buffer (fp32, head_dim/2 values; registered twice by HF)."""
    if not shape.rope_buffer_bytes:
        return []
    return [MemoryTerm(component=WEIGHTS, key=K.ROPE_BUFFERS,
                       label="RoPE frequency buffers", phases=ALL, nbytes=shape.rope_buffer_bytes,
                       formula=f"2 x head_dim/2 = {shape.head_dim // 2} x 4 B (fp32)")]


@per_layout
def gradient_terms(plan, placement, *, first_layer_late: bool = False) -> list[MemoryTerm]:
    """Gradients live from the backward's end through the step (``zero_grad(set_to_none=True)``
    frees them before the next forward). With recomputation the deepest-first backward
    recomputes the first layer while its gradients do not exist yet: ``first_layer_late``
    keeps that layer's share out of the end-of-backward phase."""
    if plan.profile_options.lora is not None:
        from . import lora
        return lora.gradient_terms(plan, placement)
    regime = plan.profile_options.regime
    b = regime.gradient or regime.main_grad
    if not b:
        return []
    if regime.main_grad and not regime.gradient:
        return []   # accumulated straight into the fp32 main-grad buffer (optimizer state)
    params = placement.trainable_parameters_per_rank / gradient_divisor(placement)
    per_parameter = params / plan.model.parameters       # this rank's share of each parameter
    shape = shape_of(plan)
    # The embedding's gradient is the backward's last: while it is computed it is a
    # temporary (see model_activation_terms), it becomes .grad for the step.
    embedding = per_parameter * shape.embedding_parameters
    terms = [MemoryTerm(component=GRADIENTS, label="gradient of the token embedding", nbytes=embedding * b,
                        phases=(OPTIMIZER_STEP,),
                        formula=f"V x h = {_n(embedding)} params x {b} B (the backward's last gradient)")]
    params -= embedding
    if first_layer_late and plan.model.layers > 1:
        share = per_parameter * shape.layer_parameters()
        terms.append(MemoryTerm(component=GRADIENTS, label=f"gradients of the first layer ({regime.name})",
                                nbytes=share * b, phases=(OPTIMIZER_STEP,),
                                formula=f"{_n(share)} params x {b} B (born last, after its recompute)"))
        params -= share
    terms.append(MemoryTerm(component=GRADIENTS, label=f"gradients ({regime.name}, {b} B)",
                            nbytes=params * b, phases=(BACKWARD_END, OPTIMIZER_STEP),
                            formula=f"{_n(params)} trainable params/rank x {b} B"))
    if plan.gradient_accumulation_steps > 1:
        # Accumulated over the micro-batches: from the first backward on, every gradient is
        # alive while the next micro-batches run their forward and backward.
        terms = [attrs.evolve(t, phases=ALL, formula=t.formula + " (accumulated over micro-batches: alive throughout)")
                 for t in terms]
    return terms


# --- activations outside the decoder layers -----------------------------------------------

@cached_terms
def model_activation_terms(plan, placement, *, recompute: bool) -> list[MemoryTerm]:
    """Outside the decoder layers, for one rank (one device: the whole model is its only
    stage): the stage's input (the embedding output on the first stage, the activation
    received from the previous stage otherwise) for each micro-batch in flight, RoPE
    tables, AMP's weight copies; on the last stage the final norm, logits and loss; on the
    first the end of the backward (the embedding's gradient, tied partials).

    Splits: the residual stream over cp (and tp with sequence parallelism); the logits
    over cp, and over tp too for Megatron's vocabulary-parallel cross-entropy (PyTorch's
    tensor parallelism gathers them in full on every rank)."""
    if plan.profile_options.lora is not None:
        from . import lora
        terms = lora.model_activation_terms(plan, placement, recompute=recompute)
        if getattr(plan.profile_options, "activation_offload", None):     # offload_activations.py
            from .offload_activations import offload_terms
            terms = offload_terms(plan, terms, "model", placement)
        return terms
    ctx = context(plan, placement)
    shape, regime, T = ctx.shape, ctx.regime, ctx.tokens
    h, V = shape.hidden, shape.vocab
    rank = plan.rank
    first, last, n = (True, True, 1) if rank is None else (rank.first, rank.last, rank.in_flight)
    t, cp = ctx.tensor, ctx.sequence
    seq = ctx.shards                                  # the residual stream's split: cp x (tp with SP)
    mega = megatron(regime)
    # PyTorch's loss_parallel keeps the logits sharded over the vocabulary, as Megatron's does.
    loss_parallel = bool(plan.profile_options.loss_parallel) and t > 1 and not mega
    dtensor_sp = ctx.residual != 1 and not mega
    vocab = (t if mega or loss_parallel else 1) * cp
    c = regime.compute
    kind = _regime_kind(regime)
    on_seq = f" / {seq}" if seq != 1 else ""
    on_vocab = f" / {vocab}" if vocab != 1 else ""
    flying = f" x {n:g} micro-batches in flight" if n != 1 else ""
    terms = []
    add = terms.append
    if first or last:
        add(_term(component=ACTIVATIONS, key=K.TOKEN_IDS,
                  label="input token ids (int64)", nbytes=8 * T / cp, phases=ALL,
                       formula=f"T={_n(T)} x 8 B" + (f" / cp={cp}" if cp != 1 else "")))
    # Does the first norm save its input? (Megatron's layers count their norm inputs themselves.)
    norm = shape.family.norm
    if not mega and (norm.saves_input_in_16bit or not regime.pure_16bit):
        what = "embedding output" if first else "stage input (received from the previous stage)"
        add(_term(component=ACTIVATIONS, key=(K.EMBEDDING_OUTPUT if first else K.STAGE_INPUT),
                  label=f"{what} (saved by the first norm)",
                       nbytes=regime.residual * T * h / seq * n, phases=SAVED,
                       formula=f"T x h x {regime.residual} B{on_seq}{flying}"))
    if shape.family.positions == "rotary":
        b = 4 if regime.residual == 4 else 2
        add(_term(component=ACTIVATIONS, key=K.ROPE_TABLES, label="RoPE cos/sin tables",
                       nbytes=2 * ctx.seq_len * shape.rotary_dim * b / cp, phases=SAVED,
                       formula=f"2 x s x head_dim x {b} B" + (f" / cp={cp}" if cp != 1 else "")))
    if last:
        final, how = norm.final_saved(kind, c, T, h)
        add(_term(component=ACTIVATIONS, key=K.FINAL_NORM, label="final norm", nbytes=final / seq, phases=SAVED,
                       formula=f"{how} = {_n(final)} B{on_seq}"))
        if regime.autocast:
            # Under autocast the final norm's output is fp32 and saved by nobody (the LM head keeps its
            # bf16 cast), but the base model's output (last_hidden_state) holds it until the loss.
            add(_term(component=ACTIVATIONS, key=K.FINAL_NORM_OUTPUT,
                      label="final norm output (fp32, held until the loss)",
                           nbytes=4 * T * h / seq, phases=(FORWARD,),
                           formula=f"4 x T x h{on_seq} (the base model's last_hidden_state)"))
        # Loss: HF's ForCausalLMLoss upcasts the logits to fp32; log_softmax keeps its fp32 output.
        add(_term(component=ACTIVATIONS, key=K.LOG_SOFTMAX,
                  label="log-softmax of the logits (fp32)", nbytes=4 * T * V / vocab,
                       phases=SAVED, formula=f"4 x T x V = 4 x {_n(T)} x {_n(V)}{on_vocab}"))
        add(_term(component=ACTIVATIONS, key=K.SHIFTED_LABELS,
                  label="shifted labels (int64)", nbytes=8 * T / cp, phases=SAVED,
                       formula="T x 8 B (saved by nll_loss)" + (f" / cp={cp}" if cp != 1 else "")))
        logits = c * T * V + (4 * T * V if c != 4 else 0)
        add(_term(component=ACTIVATIONS, key=K.LOGITS,
                  label="logits" + (" + their fp32 copy" if c != 4 else "") + " (at the loss)",
                       nbytes=logits / vocab, phases=(FORWARD,),
                       formula=f"{c} x T x V" + (" + 4 x T x V" if c != 4 else "") + on_vocab
                               + " (freed once the loss is computed)"))
        add(_term(component=ACTIVATIONS, key=K.CE_BACKWARD, label="cross-entropy backward temporaries (fp32)",
                       nbytes=8 * T * V / vocab, phases=(BACKWARD,),
                       formula=f"nll_loss_backward + _log_softmax_backward_data: 2 x 4 x T x V{on_vocab}"))
        if t > 1 and not loss_parallel and not mega and c == 4:
            # fp32 logits are gathered with no later copy: the forward's peak is the all-gather itself
            # (gathered [tp, T, V/tp], their concatenation and the local shard), T x V/tp more than
            # the log-softmax moment (validation/parallel/tp_plans: 125M fp32 at tp 4).
            add(_term(component=ACTIVATIONS, label="LM head all-gather: the local logits shard (fp32)",
                           nbytes=4 * T * V / t / cp, phases=(FORWARD,), formula=f"4 x T x V / tp={t}"))
        if loss_parallel:
            # torch/distributed/tensor/parallel/loss.py: _log_softmax keeps x - max beside its result,
            # and the backward builds a zeros_like before adding (validation/parallel/tp_plans).
            add(_term(component=ACTIVATIONS, label="loss_parallel: shifted logits (x - max, fp32)",
                           nbytes=4 * T * V / vocab, phases=(FORWARD,), formula=f"4 x T x V{on_vocab}"))
            add(_term(component=ACTIVATIONS, label="loss_parallel: zeros_like in the backward (fp32)",
                           nbytes=4 * T * V / vocab, phases=(BACKWARD,), formula=f"4 x T x V{on_vocab}"))
        if dtensor_sp:
            # The LM head's input is all-gathered from the sequence shards and kept for its weight gradient.
            add(_term(component=ACTIVATIONS, label="LM head input, all-gathered (sequence parallelism)",
                           nbytes=c * T * h / cp, phases=SAVED,
                           formula=f"T x h x {c} B" + (f" / cp={cp}" if cp != 1 else "")))
    if regime.autocast:
        if last:
            add(_term(component=ACTIVATIONS, key=K.LM_HEAD_AUTOCAST_COPY, label="autocast 16-bit copy of the LM head",
                           nbytes=2 * shape.embedding_parameters / t, phases=SAVED,
                           formula=f"{_n(shape.embedding_parameters / t)} params x 2 B (saved by the LM head matmul)"))
        layer_params = _autocast_layer_parameters(shape)
        share = ctx.layers / shape.layers / weight_divisor(placement) / t
        add(_term(component=ACTIVATIONS, label="autocast 16-bit copies of the layers' weights",
                       nbytes=2 * layer_params * share, phases=(FORWARD,) if recompute else SAVED,
                       formula=f"{_n(layer_params * share)} matmul params x 2 B"
                               + (" (cached until autocast exits; recomputation re-casts them)" if recompute
                                  else " (saved by each matmul for backward)")))
    if first:
        # The lookup's gradient is made in the weight's dtype; a regime that keeps no .grad (Megatron's main-grad:
        # its hook adds it to the fp32 main_grad, then drops it) still has it computed in that dtype.
        grad_b = regime.gradient or regime.weight
        E = shape.embedding_parameters / t
        on_tp = f" / tp={t}" if t != 1 else ""
        # A data-parallel rule whose hook makes the tied gradient its own way (Megatron's with
        # gradient_accumulation_fusion) says so through its options object's tied_gradient_terms.
        tied_terms = getattr(plan.options.get(plan.rules.get("dp")), "tied_gradient_terms", None)
        own = tied_terms(plan, placement) if shape.tied and last and tied_terms is not None else None
        if own is not None:
            terms.extend(own)
        elif shape.tied and last:
            add(_term(component=ACTIVATIONS, key=K.TIED_EMBEDDING_GRAD,
                      label="tied embedding gradient: two partials and their sum",
                           nbytes=3 * E * grad_b, phases=(BACKWARD_END,),
                           formula=f"3 x V x h{on_tp} x {grad_b} B (the LM head's and the lookup's gradients, "
                                   "then their sum)"))
        elif not (rank is not None and t > 1 and not mega and placement.gradient_shards == 1
                  and plan.gradient_accumulation_steps == 1):
            # (Under PyTorch TP the full V x h output of embedding_dense_backward becomes the
            # rank's .grad itself, counted with the gradients: parallel.rank_gradient_terms.)
            add(_term(component=ACTIVATIONS, label="embedding gradient (being computed)",
                           nbytes=E * grad_b, phases=(BACKWARD_END,),
                           formula=f"V x h{on_tp} x {grad_b} B (embedding_dense_backward's output)"))
        # (With DTensor sequence parallelism the embedding's output was reduce-scattered: its
        # gradient arrives all-gathered, whole.)
        grad_split = cp if dtensor_sp else seq
        add(_term(component=ACTIVATIONS, label="gradient of the embedding output",
                       nbytes=regime.residual * T * h / grad_split, phases=(BACKWARD_END,),
                       formula=f"T x h x {regime.residual} B" + (f" / {grad_split}" if grad_split != 1 else "")))
    if getattr(plan.profile_options, "loss_implementation", None) is not None:   # loss.py: its terms, if its own
        from .loss import loss_terms
        terms = loss_terms(plan, ctx, terms)
    if getattr(plan.profile_options, "float8", None) is not None:    # float8.py: the casts' excess, TE's buffers
        from .float8 import terms as float8_terms
        terms = terms + float8_terms(plan, placement, terms, layer_bytes(plan, ctx))
    if getattr(plan.profile_options, "activation_offload", None):     # offload_activations.py
        from .offload_activations import offload_terms
        terms = offload_terms(plan, terms, "model")
    if getattr(plan.profile_options, "compile", None):     # compile.py: the compiled forward's saved set, its loss
        from .compile import model_terms as compiled_model_terms
        terms = compiled_model_terms(plan, placement, terms)
    return shape.family.adjusted("model_activations", plan, placement, terms)


@memoize
def _autocast_layer_parameters(shape: ModelShape) -> int:
    """The decoder layers' weights autocast copies (the model's, less the LM head's)."""
    return shape.autocast_matmul_parameters() - shape.embedding_parameters


# --- decoder layers ---------------------------------------------------------------------------

@cached_terms
def layer_terms(plan, placement, *, kept_layers: int | None = None, selective: bool = False) -> list[MemoryTerm]:
    """The decoder layers: ``kept_layers`` of the L layers keep everything they save (the
    rest are checkpointed: they keep their input and recompute in the backward; ``None``
    means all are kept). ``selective`` drops the parts marked ``recomputed_by_selective``
    (the attention's s x s tensors, recomputed in the backward)."""
    if plan.profile_options.lora is not None:
        from . import lora
        terms = lora.layer_terms(plan, placement, kept_layers=kept_layers, selective=selective)
        if getattr(plan.profile_options, "activation_offload", None):     # offload_activations.py
            from .offload_activations import offload_terms
            terms = offload_terms(plan, terms, "layers", placement)
        return terms
    if getattr(plan.profile_options, "compile", None):     # compile.py: the partitioner's saved set
        from .compile import layer_terms as compiled_layer_terms
        terms = compiled_layer_terms(plan, placement)
        if getattr(plan.profile_options, "activation_offload", None):     # offload_activations.py
            from .offload_activations import offload_terms
            terms = offload_terms(plan, terms, "layers", placement)
        return terms
    ctx = context(plan, placement)
    L, k = ctx.layers, ctx.shards
    kept = L if kept_layers is None else min(kept_layers, L)
    lb = layer_bytes(plan, ctx)
    regime = ctx.regime
    saved = lb.saved
    if selective:
        saved -= sum(p.nbytes for p in lb.parts if p.recomputed_by_selective)
    out = lb.output if lb.output_saved_by_next else 0
    per_layer, split, n = (saved + out) / k, (f" / {k} shards" if k > 1 else ""), 1
    if plan.rank is not None:     # a parallel layout: what tp splits, and the micro-batches in flight
        per_layer, split, n = rank_layer_saved(plan, ctx, lb, selective)
    flying = f" x {n:g} micro-batches in flight" if n != 1 else ""
    terms = []
    if kept:
        parts = _parts_text(lb)
        terms.append(_term(
            component=ACTIVATIONS, key=K.LAYERS_SAVED,
            label="decoder layers: saved for backward", nbytes=kept * per_layer * n,
            phases=SAVED, formula=f"{kept} layers x {_n(saved + out)} B ({parts}"
                                  + (f"; output {_n(out)}" if out else "") + ")" + split + flying))
    checkpointed = L - kept
    if checkpointed:
        residual = 2 if megatron(regime) else regime.residual
        inputs = residual * ctx.tokens * ctx.shape.hidden
        terms.append(_term(
            component=ACTIVATIONS, key=K.CHECKPOINTED_INPUTS,
            label="checkpointed layers: their inputs", nbytes=checkpointed * inputs / k * n,
            phases=SAVED, formula=f"{checkpointed} layers x T x h x {residual} B" + flying))
        # The recomputed layer's saved tensors, its output, and the MLP backward's
        # activation gradients (two of the intermediate's size, per routed expert copy).
        s = ctx.shape
        mlp_grads = 2 * ctx.tokens * max(s.top_k, 1) * s.ffn * regime.compute
        work = lb.saved + lb.output + mlp_grads
        if regime.autocast:
            work += 2 * sum(w.elements for w in ctx.shape.layer_weights() if w.autocast and not w.bias)
        terms.append(_term(
            component=ACTIVATIONS, key=K.RECOMPUTE_WORKING_SET,
            label="recompute working set (one layer)", nbytes=work / k,
            phases=(BACKWARD_END,),
            formula=f"one layer's forward recomputed in the backward, with its MLP's activation gradients "
                    f"(2 x T x {max(s.top_k, 1)} x ffn x {regime.compute} B): {_n(work)} B"))
    if getattr(plan.profile_options, "activation_offload", None):     # offload_activations.py
        from .offload_activations import offload_terms
        terms = offload_terms(plan, terms, "layers")
    return terms


_last_parts: tuple = (None, "")      # (a LayerBytes, its parts as text): a layout's ranks share the layer's


def _parts_text(lb) -> str:
    """``lb``'s parts as the decoder layers' formula names them ("name bytes, ..."), made once for the
    last ``LayerBytes`` asked for (the memoised layer is the same object for every rank of a layout)."""
    global _last_parts
    last, text = _last_parts
    if lb is not last:
        text = ", ".join(f"{p.name} {_n(p.nbytes)}" for p in lb.parts) if lb.parts else ""
        _last_parts = (lb, text)
    return text


# --- runtime ------------------------------------------------------------------------------------

def _bytes(instance, attribute, value):
    _checks.count(f"runtime_overheads.{attribute.name}", value, minimum=0)


def _fraction(instance, attribute, value):
    _checks.fraction(f"runtime_overheads.{attribute.name}", value)


def _allocator(instance, attribute, value):
    if value not in ALLOCATOR_MODELS:
        from mlsysim_core.errors import InvalidInputError
        raise InvalidInputError(f"runtime_overheads.{attribute.name}", value, " or ".join(ALLOCATOR_MODELS))


def _flag(instance, attribute, value):
    if not isinstance(value, bool):
        from mlsysim_core.errors import InvalidInputTypeError
        raise InvalidInputTypeError(f"runtime_overheads.{attribute.name}", value, "True or False")


ALLOCATOR_MODELS = ("fraction", "segments")


@attrs.frozen(kw_only=True, cache_hash=True)     # (memo keys hash it: once per object)
class RuntimeOverheads:
    """Memory a CUDA process uses beyond its tensors. None of it appears in
    ``torch.cuda.max_memory_allocated`` (or in MemTracker); all of it counts against the
    device's capacity. Defaults are typical for PyTorch 2.x on an 80 GB-class GPU with
    CUDA 12; set any to 0 to leave it out, or ``runtime_overheads=False`` for none.

    * ``cuda_context``: the CUDA context and kernels loaded (nvidia-smi shows it before
      the first allocation; 300-600 MiB with lazy module loading).
    * ``allocator``: how the caching allocator's reserve is priced. ``"fraction"`` (the default):
      ``allocator_fraction`` of the peak allocated (segment rounding and fragmentation:
      ``max_memory_reserved / max_memory_allocated - 1``). ``"segments"``: the mechanism of
      ``allocator.py``, derived from PyTorch's allocator source: the block and segment rounding of
      the rank's model states and the side-stream pools its data-parallel rule declares (FSDP2's
      reduce-scatter and all-gather streams); the default stream's fragmentation is not priced
      (said in the term's formula).
    * ``allocator_fraction``: with ``allocator="fraction"``, the reserve over the peak allocated.
    * ``expandable_segments``: with ``allocator="segments"``, ``PYTORCH_CUDA_ALLOC_CONF=
      expandable_segments:True`` (one segment per stream grown in 20 MiB pages).
    * ``cublas_workspace``: the process's cuBLAS workspaces, all of them (cuBLASLt shares them:
      TORCH_CUBLASLT_UNIFIED_WORKSPACE is on by default). None (the default): PyTorch's default for the
      accelerator's compute capability (``cublas_workspace_bytes``, read from its catalog entry's
      ``extra["compute_capability"]``) for each of the ``GEMM_THREADS`` threads that run a step's GEMMs;
      an int: those bytes in all.
    * ``nccl_buffers``: NCCL's communicator buffers, only when a parallel layout communicates.
    """

    cuda_context: int = attrs.field(default=500 * 2**20, converter=_checks.to_int, validator=_bytes)
    allocator_fraction: float = attrs.field(default=0.05, validator=_fraction)
    allocator: str = attrs.field(default="fraction", validator=_allocator)
    expandable_segments: bool = attrs.field(default=False, validator=_flag)
    cublas_workspace: int | None = attrs.field(default=None, converter=attrs.converters.optional(_checks.to_int),
                                               validator=attrs.validators.optional(_bytes))
    nccl_buffers: int = attrs.field(default=256 * 2**20, converter=_checks.to_int, validator=_bytes)

    def __attrs_post_init__(self):
        if self.expandable_segments and self.allocator != "segments":    # a fraction knows no segments
            from mlsysim_core.errors import InvalidInputError
            raise InvalidInputError("runtime_overheads.expandable_segments", True,
                                    "False unless allocator='segments' (expandable segments change the "
                                    "segments' rounding, which only that allocator model prices)",
                                    f"allocator={self.allocator!r}")


# PyTorch's default cuBLAS workspace, per (handle, stream) (pytorch/pytorch
# 26a39059ec580351411f180816c47e2ef5134ae1 aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize
# / getChosenWorkspaceSize, allocated by getNewWorkspace through the caching allocator): ":4096:8"
# (8 x 4096 KiB = 32 MiB) where ``properties->major == 9 && properties->minor == 0`` (Hopper, sm90: exactly
# 9.0), ":4096:2:16:8" (2 x 4096 KiB + 8 x 16 KiB = 8 MiB + 128 KiB) on every other compute capability.
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * 1024
CUBLAS_WORKSPACE_OTHER = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_SOURCE = ("pytorch/pytorch 26a39059ec580351411f180816c47e2ef5134ae1 aten/src/ATen/cuda/CublasHandlePool.cpp "
                 "parseChosenWorkspaceSize")
# A training step runs its GEMMs on two threads, each with its own cuBLAS handle and so its own workspace (kept
# per (handle, stream): CublasHandlePool.cpp's thread_local PoolWindow, cublas_handle_stream_to_workspace): the
# thread that runs the forward and the autograd engine's device thread, which runs the CUDA backward
# (pytorch/pytorch#180283: freeing the workspaces must reach the engine's device threads). Megatron-LM's
# functional-test goldens' memory between steps is matched to 0.4 MiB with both counted (docs/launch-megatron.md).
GEMM_THREADS = 2


@memoize
def compute_capability(hardware) -> str | None:
    """The accelerator's CUDA compute capability ("9.0") as its catalog entry records it
    (``extra["compute_capability"]``, sourced in the entry); None for hardware the catalog does not
    say it of (or a node that is not the catalog's object)."""
    from mlsysim_core.catalog import find_hardware
    try:
        entry = find_hardware(hardware.name)
    except Exception:       # (not in the catalog: a user's HardwareNode)
        return None
    if entry.value != hardware:
        return None
    cc = entry.extra.get("compute_capability")
    return None if cc is None else str(cc)


def cublas_workspace_bytes(capability: str | None) -> tuple[int, str]:
    """PyTorch's default cuBLAS workspace for a compute capability, and how (None: the accelerator does not
    say: 32 MiB, the Hopper default this profile has always priced, said in a note)."""
    if capability is None:
        return CUBLAS_WORKSPACE_SM90, ("32 MiB: the accelerator records no compute capability (catalog extra "
                                       "'compute_capability'); PyTorch's sm90 default (:4096:8) assumed, "
                                       f"other GPUs' is 8 MiB + 128 KiB (:4096:2:16:8; {CUBLAS_SOURCE})")
    if capability == "9.0":
        return CUBLAS_WORKSPACE_SM90, f"32 MiB (:4096:8, PyTorch's default on sm90; {CUBLAS_SOURCE})"
    return CUBLAS_WORKSPACE_OTHER, (f"8 MiB + 128 KiB (:4096:2:16:8, PyTorch's default on compute capability "
                                    f"{capability}: 32 MiB is sm90's only; {CUBLAS_SOURCE})")


def runtime_terms(plan, overheads: RuntimeOverheads, allocated: int | float, placement=None) -> list[MemoryTerm]:
    """The runtime-overhead terms: NCCL's buffers only when the layout communicates (any
    parallel axis, context parallelism included: the one predicate, ``parallel.is_parallel``); the cuBLAS
    workspace PyTorch's default for the hardware's compute capability unless the overheads set it; the
    allocator's reserve as ``overheads.allocator`` says (``"segments"``: ``allocator.reserve_terms``,
    which needs the rank's ``placement``)."""
    cc = compute_capability(plan.hardware) if overheads.cublas_workspace is None else None
    if overheads.allocator == "segments":
        from .allocator import reserve_terms
        return list(_fixed_runtime_terms(overheads, is_parallel(plan), cc)) + reserve_terms(plan, placement,
                                                                                            overheads)
    return list(_runtime_terms(overheads, is_parallel(plan), allocated, cc))


def _runtime_terms(overheads: RuntimeOverheads, parallel: bool, allocated: int | float, capability=None) -> tuple:
    terms = _fixed_runtime_terms(overheads, parallel, capability)
    if overheads.allocator_fraction:
        terms += (_term(component=RUNTIME_OVERHEADS, label="allocator reserve and fragmentation",
                             nbytes=allocated * overheads.allocator_fraction, phases=ALL,
                             formula=f"{overheads.allocator_fraction:g} x {_n(allocated)} B allocated at the peak"),)
    return terms


@memoize
def _fixed_runtime_terms(overheads: RuntimeOverheads, parallel: bool, capability=None) -> tuple:
    """The runtime overheads that do not depend on the bytes allocated (all but the allocator's)."""
    terms = []
    if overheads.cuda_context:
        terms.append(MemoryTerm(component=RUNTIME_OVERHEADS, label="CUDA context", nbytes=overheads.cuda_context,
                                phases=ALL, formula=f"{overheads.cuda_context / 2**20:,.0f} MiB (runtime_overheads.cuda_context)"))
    if overheads.cublas_workspace is None:
        one, how = cublas_workspace_bytes(capability)
        workspace = GEMM_THREADS * one
        how = (f"{GEMM_THREADS} x {how}: one per thread that runs GEMMs (the forward's and the autograd engine's "
               "device thread, each with its own cuBLAS handle)")
    else:
        workspace, how = overheads.cublas_workspace, f"{overheads.cublas_workspace / 2**20:,.0f} MiB"
    if workspace:
        terms.append(MemoryTerm(component=RUNTIME_OVERHEADS, label="cuBLAS workspaces",
                                nbytes=workspace, phases=ALL, formula=how))
    if parallel and overheads.nccl_buffers:
        terms.append(MemoryTerm(component=RUNTIME_OVERHEADS, label="NCCL buffers", nbytes=overheads.nccl_buffers,
                                phases=ALL, formula=f"{overheads.nccl_buffers / 2**20:,.0f} MiB (parallel layout)"))
    return tuple(terms)
