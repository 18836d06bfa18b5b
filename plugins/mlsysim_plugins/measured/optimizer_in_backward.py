"""The optimizer step fused into the backward (``optimizer_in_backward=True``), measured grade.

What it stands for: torchtune's ``optimizer_in_bwd`` (``torchtune/training/memory.py``,
``create_optim_in_bwd_wrapper`` and ``register_optim_in_bwd_hooks``) and PyTorch's tutorial "How to
save memory by fusing the optimizer step into the backward pass": one optimizer per parameter
tensor, and ``p.register_post_accumulate_grad_hook`` runs ``opt[p].step(); opt[p].zero_grad()`` as
soon as ``p``'s gradient is accumulated. So a gradient lives from its accumulation to the end of
its own step: at most one parameter's gradient (and that single-tensor step's temporaries) is
alive at a time, and the loop's step phase holds no gradient and no step temporary.

Measured (``validation/techniques/offload/``, torch 2.13 on the CPU, Llama-style and Mixtral-style
models at two sizes each, fp32 and bf16, foreach / for-loop / fused, with and without full
checkpointing), the backward has two moments that can be its peak besides the cross-entropy's:

* **the LM head's step**, right after its gradient: the cross-entropy's tensors are gone (the
  fp32 log-softmax, the labels, ``nll_loss_backward`` and ``_log_softmax_backward_data``'s outputs:
  4 T V + 8 T V + 8 T B), every layer's saved tensors are still alive, and the LM head's gradient
  (V x h x g) and its step temporaries (k x V x h x s) are added. So the backward is the larger of
  the cross-entropy moment and this one: the term ``max(0, n (g + k s) - 12 T V - 8 T)``. With a
  layer tensor larger than the LM head (big 3-D expert tensors) the same bound is used with that
  tensor (an upper bound: part of that layer's saved tensors is freed by its step, said in the
  formula).
* **the embedding's step**, the backward's last: ``embedding_dense_backward``'s output becomes
  ``.grad`` (the profile's "embedding gradient (being computed)"), the embedding output's gradient
  (res x T x h) is freed, then the step's temporaries k x V x h x s: the term
  ``max(0, k V h s - res T h - recompute working set)`` at the backward's end.

``k`` is the single-tensor step's temporaries in units of the tensor (AdamW: foreach 1, the
``_foreach_sqrt(exp_avg_sq)``; for-loop 2, ``exp_avg_sq.sqrt() / bias_correction2_sqrt``; fused 0).

Combined (measured, ``validation/techniques/oib_combinations/``: torchtune 0.6.1's chunked loss,
bitsandbytes 0.50.2's AdamW8bit one per parameter, AMP, tied embeddings, save_on_cpu, full
checkpointing and the per-op / module / every-k policies): the LM head's moments are set against
the selected loss's backward moment (``_loss_moment``); bitsandbytes' update keeps no temporary
(k = 0) and each per-parameter optimizer holds its own pair of quantization maps
(``_per_parameter_maps``); activation offloading changes no gradient moment (its terms are the
activations'); checkpointing policies that recompute layer 0 keep their end moment as counted
without the option (an upper bound, said in a note).

Refused (``NotModelledError``): gradient accumulation (torchtune refuses it: "Gradient accumulation
is not supported with optimizer in bwd"), any parallel layout (DDP would step on unreduced
gradients; FSDP/ZeRO gradient sharding is not modelled), offload, LoRA, regimes with an fp32
master copy or main-grad buffer, ``loss='fused_linear'``, and optimizers that do not declare their
step measured with it (``OptimizerSpec.step``, an ``OptimizerStep`` whose ``measured_with`` names
``optimizer_in_backward``; torchao's compiled low-bit steps, Adam8bit and Muon declare why not).
Everything about the optimizer is read from the selected spec's declaration (``k`` is
``step.temporaries(optimizer_impl)``, the maps ``step.quantization_maps``), never from its name.
"""

from __future__ import annotations

import attrs

from mlsysim_core import _checks
from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import BACKWARD, BACKWARD_END, GRADIENTS, OPTIMIZER_STATE, OPTIMIZER_STEP, MemoryTerm

from .optimizer_step import OPTIMIZER_IN_BACKWARD, step_of

OPTION = OPTIMIZER_IN_BACKWARD


def _step(plan):
    """The selected optimizer's declaration (``OptimizerSpec.step``; prepare put the spec in the options)."""
    return step_of(plan.profile_options.optimizer_spec)


def _k(plan) -> int:
    """The single-tensor step's temporaries, in units of the tensor's elements x the state dtype, for the
    plan's implementation, as the optimizer declares them (AdamW: foreach 1, torch/optim/adamw.py
    _multi_tensor_adamw's _foreach_sqrt; for-loop 2, _single_tensor_adamw's sqrt and division alive
    together; fused none. SGD keeps no temporary; Lion one; bitsandbytes' in-place 8-bit kernel none)."""
    return _step(plan).temporaries(plan.profile_options.optimizer_impl)


def prepare_option(plan, value, optimizers=None):
    """Check ``optimizer_in_backward`` against the plan (``options.prepare``; ``optimizers``: the
    registered specs, named in a refusal); the plan with it set."""
    value = _checks.flag(OPTION, value)
    plan = attrs.evolve(plan, profile_options=attrs.evolve(plan.profile_options, optimizer_in_backward=value))
    if not value:
        return plan
    o = plan.profile_options
    if plan.gradient_accumulation_steps > 1:
        raise NotModelledError(OPTION, value, "gradient_accumulation_steps=1",
                               "the step runs as each gradient is accumulated, so there is nothing to accumulate "
                               "into (torchtune: 'Gradient accumulation is not supported with optimizer in bwd')")
    if plan.dp_size * plan.tp_size * plan.pp_size * plan.cp_size * plan.ep_size > 1:
        raise NotModelledError(OPTION, value, "one device (dp = tp = pp = cp = ep = 1)",
                               "under data parallelism the hook would step on unreduced gradients (DDP), and "
                               "FSDP/ZeRO's sharded gradients and model-parallel layouts are not modelled with it")
    if o.offload:
        raise NotModelledError(OPTION, value, "offload=None", "a host-side optimizer step with the step fused "
                               "into the backward is not modelled (torchao's CPUOffloadOptimizer steps in "
                               "optimizer.step())")
    if o.lora is not None:
        raise NotModelledError(OPTION, value, "no LoRA", "the adapters' steps in the backward are not measured")
    regime = o.regime
    if regime.master or regime.main_grad:
        raise NotModelledError(OPTION, value, "a regime without fp32 master weights or main-grad buffer "
                               "(fp32, bf16, amp-bf16)", f"regime {regime.name} keeps them")
    step = _step(plan)
    if step is None or OPTION not in step.measured_with:     # what the optimizer declares, not its name
        why = (step and step.why_not(OPTION)) or f"the single-tensor step of {plan.optimizer!r} is not modelled"
        measured = sorted(n for n, spec in (optimizers or {}).items()
                          if (s := step_of(spec)) is not None and OPTION in s.measured_with)
        raise NotModelledError(OPTION, value, f"optimizer one of {measured} (declaring OptimizerStep("
                               f"measured_with=({OPTION!r},)))", why)
    from .loss import chosen
    if chosen(o) is not None and chosen(o).with_optimizer_in_backward is None:     # declared, not named
        raise NotModelledError(OPTION, value, "loss='cross_entropy' or 'chunked'",
                               f"the LM head's step moment with loss={o.loss!r} is not measured (Liger's fused "
                               "linear cross-entropy computes the LM head's weight gradient in the forward)")
    return attrs.evolve(plan, notes=plan.notes + notes(plan))


def _recompute_working_set(plan) -> float:
    """model.layer_terms' "recompute working set (one layer)" (one device: the whole model, no shards)."""
    from .checkpointing import whole_layers
    if not whole_layers(plan) or plan.profile_options.checkpointed_layers == 0:
        return 0
    from . import model
    from .shapes import shape_of
    shape, regime = shape_of(plan), plan.profile_options.regime
    ctx = model.Context(shape=shape, tokens=plan.microbatch * plan.seq_len, seq_len=plan.seq_len,
                        layers=plan.model.layers, shards=1, regime=regime)
    lb = model.layer_bytes(plan, ctx)
    work = lb.saved + lb.output + 2 * ctx.tokens * max(shape.top_k, 1) * shape.ffn * regime.compute
    if regime.autocast:
        work += 2 * sum(w.elements for w in shape.layer_weights() if w.autocast and not w.bias)
    return work


def relocate(plan, weights, gradients, optimizer_state):
    """The terms with the step fused into the backward: no gradient outlives its step, no step
    temporary in the step phase, and the two backward moments of the module docstring."""
    from .shapes import shape_of
    o = plan.profile_options
    regime, shape = o.regime, shape_of(plan)
    k = _k(plan)
    g, s, c, res = regime.gradient or 4, regime.state, regime.compute, regime.residual
    T, h, V = plan.microbatch * plan.seq_len, shape.hidden, shape.vocab
    E = shape.embedding_parameters
    tensors = list(shape.parameter_tensors())
    for _ in range(1 if shape.tied else 2):     # the embedding, and the LM head if untied
        tensors.remove(E)
    largest_layer = max(tensors, default=0)
    per = g + k * s
    freed, freed_how, head_moments = _loss_moment(plan, T, h, V, c, g, E, per)
    terms = []
    if shape.tied:
        n, what = largest_layer, "the largest layer tensor (tied LM head: its gradient is the embedding's, last)"
    elif largest_layer > E:
        n, what = largest_layer, ("the largest layer tensor, an upper bound: that layer's saved tensors are "
                                  "counted as still alive")
    else:
        n, what = E, "the LM head (V x h), the first gradient"
    moment, how = n * per, f"{n:,} params ({what}) x ({g} B gradient + {k} x {s} B step temporaries)"
    if n == E and not shape.tied:       # the LM head's own moments (oib_combinations: chunked, 8-bit, AMP)
        moment, how = max(head_moments)
    extra = moment - freed
    terms.append(MemoryTerm(
        component=GRADIENTS, label="optimizer in backward: a gradient and its step, over the loss moment",
        nbytes=max(0, extra), phases=(BACKWARD,),
        formula=f"max(0, {how} - ({freed_how} = {freed:,} B: freed by then)) = {max(0, extra):,.0f} B"))
    work = _recompute_working_set(plan)
    tied_sum = 2 * E * g if shape.tied else 0      # the tied partials, freed once summed into .grad
    last = k * E * s - res * T * h - work - tied_sum
    terms.append(MemoryTerm(
        component=GRADIENTS, label="optimizer in backward: the embedding's step temporaries",
        nbytes=max(0, last), phases=(BACKWARD_END,),
        formula=f"max(0, {k} x {E:,} x {s} B (the embedding's step, its gradient counted as 'embedding "
                f"gradient (being computed)') - {res} x T x h (the embedding output's gradient, freed by then)"
                + (f" - {work:,.0f} B (the recompute working set)" if work else "")
                + (f" - 2 x V x h x {g} B (the tied partials)" if tied_sum else "")
                + f") = {max(0, last):,.0f} B"))
    state = [t for t in optimizer_state if tuple(t.phases) != (OPTIMIZER_STEP,)]
    return weights, terms, state + _per_parameter_maps(plan)


def _loss_moment(plan, T, h, V, c, g, E, per):
    """The loss's backward bytes that the LM head's moments are set against, how, and the LM
    head's moments besides its step ([(bytes, how)]), measured in validation/techniques/oib_combinations.

    * default cross-entropy: 12 T V + 8 T (the fp32 log-softmax, ``nll_loss_backward`` and
      ``_log_softmax_backward_data``'s outputs, the labels). The LM head's weight-gradient matmul
      runs while the logits' gradient (c T V) and its input's gradient (c T h, computed first) are
      alive: c T V + c T h + V h c (the peak with an optimizer that keeps no step temporary, e.g.
      bitsandbytes' 8-bit AdamW, in fp32).
    * ``loss='chunked'``: the chunked loss's own backward moment (loss.py: every chunk's
      log-softmax 4 T V + labels 8 T + its backward term; the weight-gradient partials and their
      sum are counted there). The LM head's post-accumulate-grad hook fires once, after the last
      chunk's partial is summed (one AccumulateGrad for the n uses of the weight): every logits
      gradient and log-softmax is freed by then, and the n chunks' input gradients (c T h) wait
      for the split's backward: its step is V h x (g + k s) + c T h.
    * under autocast (measured, AMP runs): the LM head's matmul saved its 16-bit weight copy
      (``autocast 16-bit copy of the LM head``, c V h), released once the last matmul backward
      ran, before the hook; the gradient of the LM head's input is there (c T h): the step is
      V h x (g + k s) - c V h + c T h. (With the chunked loss this moment stayed below the loss's
      own in every measured run: derived there, the input gradients counted once.)"""
    o = plan.profile_options
    regime = o.regime
    moments = []
    amp = bool(regime.autocast)
    copy = f" - {c} x {E:,} (the 16-bit weight copy, freed)" if amp else ""
    from .loss import chosen
    loss = chosen(o)
    if loss is not None:       # its declared backward moment (prepare_option refused one declaring none)
        freed, how = loss.with_optimizer_in_backward(plan, T, h, V, c, regime)
        moments.append((E * per + c * T * h - (c * E if amp else 0),
                        f"{E:,} (the LM head, hooked after its last chunk) x ({g} B gradient + step temporaries) + "
                        f"{c} x T x h (the chunks' input gradients){copy}"))
    else:
        freed, how = 12 * T * V + 8 * T, "12 T V + 8 T: the log-softmax, labels and cross-entropy gradients"
        moments.append((c * T * V + c * T * h + E * c,
                        f"{c} x T x V (the logits' gradient) + {c} x T x h (the LM head input's gradient) + "
                        f"{E:,} x {c} B (the weight gradient's matmul)"))
        if amp:
            moments.append((E * per - c * E + c * T * h,
                            f"{E:,} x ({g} B gradient + step temporaries){copy} + {c} x T x h (the LM head input's "
                            "gradient)"))
        else:       # its input's gradient replaces its saved input (the final norm's output, saved by it only)
            moments.append((E * per, f"{E:,} (the LM head) x ({g} B gradient + step temporaries)"))
    return freed, how, moments


def _per_parameter_maps(plan) -> list[MemoryTerm]:
    """An optimizer that declares quantization maps per instance (``OptimizerStep.quantization_maps``):
    bitsandbytes' 8-bit optimizers fill their two in ``__init__`` (bitsandbytes/optim/optimizer.py
    ``Optimizer8bit.__init__``: ``if optim_bits == 8: self.fill_qmap()``) and move them to the device
    for the first 8-bit tensor (``Optimizer2State.init_state``). One optimizer per parameter: one pair
    per tensor of at least ``quantized_from`` (``min_8bit_size``, 4096) elements, where the shared
    optimizer has one (the state terms count it)."""
    step = _step(plan)
    if not step.quantization_maps:
        return []
    from .optimizers import STEADY, trainable_tensors
    least, maps = step.quantized_from, step.quantization_maps
    quantized = sum(1 for t in trainable_tensors(plan) if t >= least)
    if quantized < 2:
        return []
    return [MemoryTerm(component=OPTIMIZER_STATE, label=f"{plan.optimizer} quantization maps, one pair per parameter's "
                       "optimizer", nbytes=(quantized - 1) * maps, phases=STEADY,
                       formula=f"({quantized} tensors of >= {least} elements - 1 counted) x {maps:,} B of maps")]


def notes(plan) -> tuple[str, ...]:
    shape_notes = []
    from .shapes import shape_of
    if shape_of(plan).tied:
        shape_notes.append("optimizer_in_backward with tied embeddings: the LM head's gradient joins the "
                           "embedding's at the backward's end (the backward's peak measured with the default and "
                           "the chunked loss; the end moment itself derived, not measured)")
    o = plan.profile_options
    from .checkpointing import PART, recomputes, recomputes_first_layer
    declared = recomputes(plan)
    if (declared == "layers" and o.checkpointed_layers != 0
            and _k(plan) == 0):
        shape_notes.append("optimizer_in_backward with full checkpointing and a step without temporaries: the "
                           "backward's end counts layer 0's recompute working set beside the embedding's backward, "
                           "which follows it (an upper bound by one layer's working set; measured 1.8-2.6 MB over "
                           "on a moment below the loss's)")
    if declared == PART:     # a per-op, module or every-k policy (declared, not named)
        if recomputes_first_layer(plan):
            shape_notes.append(
                f"optimizer_in_backward with {plan.activation_checkpointing!r} checkpointing: the backward's end "
                "keeps the policy's layer-0 recompute moment as counted without the option (with every other "
                "layer's gradient, which the hooks have stepped and freed by then): an upper bound on that moment "
                "(measured 2.8-13.2 MB over; below the LM head's moment except in the Mixtral mlp-only run, "
                "+1.96 % of its peak)")
    return tuple(shape_notes)


def added_step_time(plan, hardware_flops=None, host_link_bytes_per_s=None):
    """Step time the technique adds: none. ``(0.0, how)``: the same optimizer arithmetic runs, one
    tensor at a time inside the backward (one kernel launch per tensor instead of a multi-tensor
    step; not priced), and nothing crosses the host link."""
    return 0.0, ("optimizer in backward: the same step arithmetic, run per parameter inside the backward; "
                 "no recompute and no host traffic (per-tensor kernel launches not priced)")
