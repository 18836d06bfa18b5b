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

Refused (``NotModelledError``): gradient accumulation (torchtune refuses it: "Gradient accumulation
is not supported with optimizer in bwd"), any parallel layout (DDP would step on unreduced
gradients; FSDP/ZeRO gradient sharding is not modelled), offload, LoRA, regimes with an fp32
master copy or main-grad buffer, and optimizers whose single-tensor step is not tabled here.
"""

from __future__ import annotations

import attrs

from mlsysim_core import _checks
from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import BACKWARD, BACKWARD_END, GRADIENTS, OPTIMIZER_STATE, OPTIMIZER_STEP, MemoryTerm

# The single-tensor step's temporaries, in units of the tensor's elements x the state dtype, per
# implementation (torch/optim/adamw.py: _multi_tensor_adamw's _foreach_sqrt; _single_tensor_adamw's
# sqrt and division alive together; _fused_adamw none). SGD keeps no temporary; Lion one.
STEP_TEMPORARIES = {
    "adam": {"foreach": 1, "for-loop": 2, "fused": 0},
    "adamw": {"foreach": 1, "for-loop": 2, "fused": 0},
    "lion": {"foreach": 1, "for-loop": 1, "fused": 0},
    "sgd": {"foreach": 0, "for-loop": 0, "fused": 0},
    "sgd-momentum": {"foreach": 0, "for-loop": 0, "fused": 0},
}
OPTION = "optimizer_in_backward"


def prepare_option(plan, value):
    """Check ``optimizer_in_backward`` against the plan (``options.prepare``); the plan with it set."""
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
    if plan.optimizer not in STEP_TEMPORARIES:
        raise NotModelledError(OPTION, value, f"optimizer one of {sorted(STEP_TEMPORARIES)}",
                               f"the single-tensor step of {plan.optimizer!r} is not modelled")
    if getattr(o, "loss", None) not in (None, "cross_entropy"):
        raise NotModelledError(OPTION, value, "loss='cross_entropy'",
                               f"the LM head's step moment with loss={o.loss!r} is not measured")
    return attrs.evolve(plan, notes=plan.notes + notes(plan))


def _recompute_working_set(plan) -> float:
    """model.layer_terms' "recompute working set (one layer)" (one device: the whole model, no shards)."""
    if plan.activation_checkpointing != "full" or plan.profile_options.checkpointed_layers == 0:
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
    k = STEP_TEMPORARIES[plan.optimizer][o.optimizer_impl]
    g, s, c, res = regime.gradient or 4, regime.state, regime.compute, regime.residual
    T, h, V = plan.microbatch * plan.seq_len, shape.hidden, shape.vocab
    E = shape.embedding_parameters
    tensors = list(shape.parameter_tensors())
    for _ in range(1 if shape.tied else 2):     # the embedding, and the LM head if untied
        tensors.remove(E)
    largest_layer = max(tensors, default=0)
    per = g + k * s
    freed = 12 * T * V + 8 * T
    terms = []
    if shape.tied:
        n, what = largest_layer, "the largest layer tensor (tied LM head: its gradient is the embedding's, last)"
    elif largest_layer > E:
        n, what = largest_layer, ("the largest layer tensor, an upper bound: that layer's saved tensors are "
                                  "counted as still alive")
    else:
        n, what = E, "the LM head (V x h), the first gradient"
    extra = n * per - freed
    terms.append(MemoryTerm(
        component=GRADIENTS, label="optimizer in backward: a gradient and its step, over the loss moment",
        nbytes=max(0, extra), phases=(BACKWARD,),
        formula=f"max(0, {n:,} params ({what}) x ({g} B gradient + {k} x {s} B step temporaries) - "
                f"(12 T V + 8 T = {freed:,} B: the log-softmax, labels and cross-entropy gradients freed by "
                f"then)) = {max(0, extra):,.0f} B"))
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
    return weights, terms, state


def notes(plan) -> tuple[str, ...]:
    shape_notes = []
    from .shapes import shape_of
    if shape_of(plan).tied:
        shape_notes.append("optimizer_in_backward with tied embeddings: the LM head's gradient joins the "
                           "embedding's at the backward's end (derived, not measured)")
    return tuple(shape_notes)


def added_step_time(plan, hardware_flops=None, host_link_bytes_per_s=None):
    """Step time the technique adds: none. ``(0.0, how)``: the same optimizer arithmetic runs, one
    tensor at a time inside the backward (one kernel launch per tensor instead of a multi-tensor
    step; not priced), and nothing crosses the host link."""
    return 0.0, ("optimizer in backward: the same step arithmetic, run per parameter inside the backward; "
                 "no recompute and no host traffic (per-tensor kernel launches not priced)")
