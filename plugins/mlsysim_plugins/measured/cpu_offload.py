"""torchao's CPU-offload optimizer (``offload="torchao"`` / ``"torchao+gradients"``), measured grade.

What it stands for: ``torchao.optim.CPUOffloadOptimizer`` (torchao 0.18.0,
``torchao/optim/cpu_offload.py``; line numbers below are that file's). It differs from the
``offload="optimizer..."`` modes (DeepSpeed ZeRO-Offload / FSDP ``CPUOffload``: the state moved to
the host, nothing else kept there) in what it allocates:

* every parameter tensor with at least ``minimal_size`` = 4,096 elements (line 25; smaller ones,
  lines 94-96, stay on the device with a device optimizer ``d_opt`` of the same class, lines
  110-114) gets a pinned host copy ``p_host`` and a pinned host gradient buffer ``p_host.grad``,
  both ``torch.empty_like`` the parameter, i.e. in the parameter's dtype (lines 99-100), and its own
  host optimizer over ``p_host`` (lines 106-108), whose state (AdamW: ``exp_avg``, ``exp_avg_sq`` in
  the parameter's dtype, a 4-byte ``step``) lives on the host. AdamW is fused unless told otherwise
  (lines 38-40), on the host and for ``d_opt`` alike;
* the device keeps the weights, and the gradients as usual: a post-accumulate-grad hook copies each
  gradient into ``p_host.grad`` (lines 65-72, 105); ``optimizer.step()`` steps ``d_opt`` on the
  device, then each host optimizer, and copies ``p_host`` back into the device parameter in place
  (lines 122-135). The step allocates nothing on the device beyond ``d_opt``'s own step;
* with ``offload_gradients=True`` the hook frees the device gradient right after its copy (lines
  81-84; ``record_stream`` delays the block's reuse, not its release from the allocated bytes), so
  at most one offloaded gradient is alive at a time and the step phase holds only the small
  tensors' gradients. torchao: "Not compatible with gradient accumulation" (line 34).

Device bytes, per phase (T tokens, V vocabulary, h hidden, g gradient bytes, ``small`` the elements
of tensors under 4,096): weights and activations unchanged; optimizer state ``small x 2 x s + 4 x
(small tensors)``; gradients as without offload, or with ``offload_gradients`` ``small x g`` at the
backward's end and in the step, plus one moment in the backward: the LM head's backward (its
gradient V h, the largest offloaded tensor, born first) while every layer's saved tensors are alive
and the cross-entropy's (12 T V + 8 T) are gone: ``max(0, c T V + c T h + g V h - 12 T V - 8 T)`` over
the loss moment (the logits' gradient, the LM head input's and its weight's; under autocast also the
weight gradient's cast, ``2 T h + 6 V h``). Host bytes (``result.host_memory``):
``offloaded x (w + w + 2 w) + 4 x (offloaded tensors)``, w the parameter's bytes.

Measured (``validation/techniques/cpu_offload/``): torchao's own ``CPUOffloadOptimizer`` code run on
the CPU with the accelerator simulated (torchao asserts a CUDA or XPU device, lines 55-59: the
harness answers ``cuda`` and stands in for the streams and pinned memory; the host tensors are
allocated outside the tracker and counted beside it).

Refused (``NotModelledError``): parallel layouts (torchao: "for single-GPU training", line 28),
gradient accumulation with ``offload_gradients`` (line 34), optimizers that do not declare their
state measured with it (``OptimizerSpec.step``: ``measured_with`` naming ``torchao_offload``, as
Adam and AdamW do; their moments, step counters and step temporaries are read from it, never
their names),
regimes with an fp32 master copy or main-grad buffer, LoRA, float8 and the optimizer step in the
backward.
"""

from __future__ import annotations

import attrs

from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.terms import (BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, HOST, OPTIMIZER_STATE, OPTIMIZER_STEP,
                                WEIGHTS, MemoryTerm)

MODES = ("torchao", "torchao+gradients")
MINIMAL_SIZE = 4096         # CPUOffloadOptimizer(minimal_size=4096), line 25
STEADY = (FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP)
TECHNIQUE = "torchao_offload"     # optimizer_step.TORCHAO_OFFLOAD: what an optimizer declares measured with
SOURCE = "torchao 0.18 torchao/optim/cpu_offload.py"
HELP = ("torchao (torchao's CPUOffloadOptimizer: a pinned host copy of each parameter >= 4,096 elements, its host "
        "gradient buffer and its AdamW state on the host, the step on the CPU; smaller tensors and their optimizer on "
        "the device) or torchao+gradients (offload_gradients=True: each device gradient freed after its copy)")


TORCHAO_FORMS = ("torchao", "torchao+gradients")     # offload= values that select torchao's optimizer


def is_torchao(value) -> bool:
    """Does ``offload``'s value name torchao's optimizer (``torchao``, ``torchao+gradients``)?"""
    return isinstance(value, str) and "torchao" in (p.strip() for p in value.split("+"))


def take_option(plan):
    """``offload="torchao[+gradients]"`` moved to the internal ``cpu_offload_optimizer`` (the
    ``offload`` option's other machinery stays off); torchao's default fused AdamW when no
    ``optimizer_impl`` is given (lines 38-40)."""
    o = plan.profile_options
    parts = sorted(p.strip() for p in o.offload.split("+"))
    if parts not in [sorted(form.split("+")) for form in TORCHAO_FORMS]:
        raise InvalidInputError("offload", o.offload, "torchao or torchao+gradients (torchao's CPUOffloadOptimizer; "
                                "offload_gradients=True with +gradients)",
                                "torchao's optimizer keeps parameters and state where it does itself: it combines "
                                "with no other offload name")
    mode = "torchao+gradients" if "gradients" in parts else "torchao"
    o = attrs.evolve(o, offload=None, cpu_offload_optimizer=mode,
                     optimizer_impl="fused" if o.optimizer_impl is None else o.optimizer_impl)
    return attrs.evolve(plan, profile_options=o)


def prepare_option(plan, optimizers=None):
    """Refuse what is not modelled with torchao's optimizer (``optimizers``: the registered specs, named
    in a refusal); the plan with its note."""
    o = plan.profile_options
    mode = o.cpu_offload_optimizer

    def refuse(expected, why):
        raise NotModelledError("offload", mode, expected, why)
    if plan.dp_size * plan.tp_size * plan.pp_size * plan.cp_size * plan.ep_size > 1:
        refuse("one device (dp = tp = pp = cp = ep = 1)",
               "torchao's CPUOffloadOptimizer is 'for single-GPU training' (cpu_offload.py line 28)")
    if mode == "torchao+gradients" and plan.gradient_accumulation_steps > 1:
        refuse("gradient_accumulation_steps=1 with torchao+gradients",
               "offload_gradients 'Not compatible with gradient accumulation' (cpu_offload.py line 34): each "
               "micro-batch's device gradient is freed after its copy")
    step = _declared(plan)
    if step is None or TECHNIQUE not in step.measured_with:     # what the optimizer declares, not its name
        from .optimizer_step import measured_with
        measured = sorted(n for n, spec in (optimizers or {}).items() if measured_with(spec, TECHNIQUE))
        refuse(f"optimizer one of {', '.join(measured)} (declaring OptimizerStep(measured_with=({TECHNIQUE!r},)))",
               (step and step.why_not(TECHNIQUE))
               or f"the host and device states of {plan.optimizer!r} under torchao's optimizer are not modelled")
    regime = o.regime
    if regime.master or regime.main_grad or regime.gather:
        refuse("a regime without fp32 master weights, main-grad buffer or FSDP gather (fp32, bf16, amp-bf16)",
               f"regime {regime.name}: torchao's host optimizer steps the parameter's own dtype")
    if o.lora is not None:
        refuse("no LoRA", "the adapters under torchao's optimizer are not measured")
    if getattr(o, "optimizer_in_backward", None):
        refuse("optimizer_in_backward=None", "torchao's CPUOffloadOptimizer steps in optimizer.step(), not in the "
               "backward")
    if getattr(o, "float8", None) is not None:
        refuse("float8=None", "float8 with torchao's CPU-offload optimizer is not measured")
    note = (f"offload={mode}: torchao's CPUOffloadOptimizer ({SOURCE}): tensors >= {MINIMAL_SIZE:,} elements have a "
            "pinned host copy, host gradient buffer and AdamW state in host memory (result.host_memory), stepped on "
            "the CPU; smaller tensors and their optimizer stay on the device"
            + ("; each device gradient is freed after its copy" if mode == "torchao+gradients" else "")
            + ". Validated by running torchao's own code on the CPU with the accelerator's streams and pinned "
              "memory simulated (validation/techniques/cpu_offload/), not on a GPU")
    notes = [note]
    if plan.gradient_accumulation_steps > 1:
        notes.append("offload=torchao with gradient accumulation: derived (the device gradients accumulate as "
                     "without offload; each micro-batch's copy overwrites the host buffer), not measured")
    return attrs.evolve(plan, notes=plan.notes + tuple(notes))


def _split(plan):
    """(small, offloaded) element counts of the trainable tensors, by torchao's minimal_size."""
    from .shapes import shape_of
    tensors = shape_of(plan).parameter_tensors()
    small = [n for n in tensors if n < MINIMAL_SIZE]
    return small, [n for n in tensors if n >= MINIMAL_SIZE]


def _declared(plan):
    """The selected optimizer's ``OptimizerStep`` (None: it declares none)."""
    from .optimizer_step import step_of
    return step_of(plan.profile_options.optimizer_spec)


def _step_temporaries(step, impl: str, tensors, b: int):
    """(elements, how) of one optimizer's step temporaries over ``tensors`` (one optimizer over
    all of them: d_opt; or one per tensor: pass the largest alone), as ``step`` declares them
    (torch/optim/adamw.py for Adam/AdamW: foreach one, _foreach_sqrt; for-loop two for the current
    tensor and one for the previous; fused none)."""
    if impl == "fused" or not tensors:
        return 0, "fused: none"
    if impl == "foreach":
        return step.foreach * sum(tensors), f"foreach: {step.foreach} x {sum(tensors):,} elements"
    current, before = step.loop_current, step.loop_previous
    worst, previous = 0, 0
    for n in tensors:
        worst = max(worst, current * n + before * previous)
        previous = n
    return worst, f"for-loop: max of {current} x n_i + {before} x n_(i-1) = {worst:,} elements"


def relocate(plan, weights, gradients, optimizer_state):
    """The terms under torchao's optimizer (the module docstring): the optimizer-state terms
    replaced by the small tensors' device state and the host tensors; with offload_gradients the
    gradients replaced by the small tensors' and the LM head's moment."""
    from .shapes import shape_of
    o = plan.profile_options
    regime, shape = o.regime, shape_of(plan)
    w, s, g = regime.weight, regime.state, regime.gradient or 4
    small, big = _split(plan)
    n_small, n_big = sum(small), sum(big)
    impl = o.optimizer_impl
    step = _declared(plan)
    m, c = step.moments, 4 if step.step_counters else 0      # declared moments and 4-byte step tensors
    state = []
    if small:
        state.append(MemoryTerm(
            component=OPTIMIZER_STATE, label=f"{plan.optimizer} state of the tensors under {MINIMAL_SIZE:,} elements "
            "(device optimizer)", nbytes=n_small * m * s + c * len(small), phases=STEADY,
            formula=f"{n_small:,} elements ({len(small)} tensors < minimal_size {MINIMAL_SIZE:,}, kept on the device "
                    f"with d_opt, cpu_offload.py lines 94-96, 110-114) x {m} moments x {s} B + {len(small)} x {c} B step"))
        temp, how = _step_temporaries(step, impl, small, s)
        if temp:
            state.append(MemoryTerm(
                component=OPTIMIZER_STATE, label="device optimizer step temporaries (small tensors)",
                nbytes=temp * s, phases=(OPTIMIZER_STEP,), formula=f"{how} x {s} B (d_opt.step(), line 124)"))
    state.append(MemoryTerm(
        component=OPTIMIZER_STATE, tier=HOST, label=f"{plan.optimizer} state on the host (torchao)",
        nbytes=n_big * m * w + c * len(big), phases=STEADY,
        formula=f"{n_big:,} offloaded elements ({len(big)} tensors) x {m} moments x {w} B (the host copy's dtype) + "
                f"{len(big)} x {c} B step (one host optimizer per tensor, lines 106-108)"))
    temp, how = _step_temporaries(step, impl, [max(big)] if big else [], w)
    if temp:
        state.append(MemoryTerm(
            component=OPTIMIZER_STATE, tier=HOST, label="host optimizer step temporaries (largest tensor)",
            nbytes=temp * w, phases=(OPTIMIZER_STEP,),
            formula=f"{how} x {w} B (the host optimizers step one tensor at a time, line 128)"))
    weights = [*weights, MemoryTerm(
        component=WEIGHTS, tier=HOST, label="pinned host copy of the parameters (torchao p_host)",
        nbytes=n_big * w, phases=STEADY,
        formula=f"{n_big:,} offloaded elements x {w} B (torch.empty_like(p, device='cpu', pin_memory=True), "
                "line 99)")]
    host_grad = MemoryTerm(
        component=GRADIENTS, tier=HOST, label="pinned host gradient buffers (torchao p_host.grad)",
        nbytes=n_big * w, phases=STEADY,
        formula=f"{n_big:,} offloaded elements x {w} B (empty_like(p_host), line 100)")
    if o.cpu_offload_optimizer != "torchao+gradients":
        return weights, [*gradients, host_grad], state
    T, V, h, c = plan.microbatch * plan.seq_len, shape.vocab, shape.hidden, regime.compute
    E = shape.embedding_parameters
    layer_tensors = list(shape.parameter_tensors())
    for _ in range(1 if shape.tied else 2):     # the embedding, and the LM head if untied
        layer_tensors.remove(E)
    largest = max(layer_tensors, default=0)
    if shape.tied:
        n, what = largest, "the largest layer tensor (tied LM head: its gradient is the embedding's, last)"
    elif largest > E:
        n, what = largest, "the largest layer tensor, an upper bound: that layer's saved tensors counted alive"
    else:
        n, what = E, "the LM head (V x h), the first offloaded gradient"
    # The LM head's backward (mm): the logits' gradient (c T V), then its input's (c T h), then its
    # weight's (n in the matmul's dtype); under autocast the weight's bf16 gradient is then cast to
    # the fp32 .grad (2 n + 4 n alive, the logits' gradient freed with the mm node).
    mm_dtype = c if regime.autocast else g
    during_mm = c * T * V + c * T * h + mm_dtype * n
    at_cast = c * T * h + (c + g) * n if regime.autocast else 0
    freed = 12 * T * V + 8 * T
    moment = max(0, max(during_mm, at_cast) - freed)
    grads = [host_grad, MemoryTerm(
        component=GRADIENTS, label="offloaded gradient in flight, over the loss moment (torchao+gradients)",
        nbytes=moment, phases=(BACKWARD,),
        formula=f"max(0, max({c} T V + {c} T h + {mm_dtype} n (the LM head's mm: the logits', its input's and its "
                f"weight's gradients)" + (f", {c} T h + ({c} + {g}) n (the weight gradient's cast to fp32)"
                                          if regime.autocast else "")
                + f") - (12 T V + 8 T: the log-softmax, labels and cross-entropy temporaries freed by then)) with "
                f"n = {n:,} ({what}) = {moment:,.0f} B; each device gradient is freed after its copy "
                "(cpu_offload.py lines 81-84), so no other offloaded gradient is alive")]
    if small:
        grads.append(MemoryTerm(
            component=GRADIENTS, label=f"gradients of the tensors under {MINIMAL_SIZE:,} elements (kept on the device)",
            nbytes=n_small * g, phases=(BACKWARD_END, OPTIMIZER_STEP),
            formula=f"{n_small:,} elements x {g} B (no offload hook on them, line 94; under recomputation the first "
                    "layer's are counted at the backward's end too, an upper bound of a few KB)"))
    return weights, grads, state


def added_step_time(plan, hardware_flops=None, host_link_bytes_per_s=None, host_memory_bytes_per_s=None):
    """Step time torchao's CPU-offload optimizer adds: ``(seconds or None, how)``.

    Over the host link: each offloaded gradient to the host (``offloaded x g``) and each updated
    parameter back (``offloaded x w``); in host memory, the CPU step reads and writes the parameter
    copy, gradient buffer and two moments (``offloaded x (2 w + w + 2 x 2 w)`` bytes: read p, g, m, v,
    write p, m, v). Assumed not overlapped (an upper bound: torchao copies each gradient on a side
    stream during the backward, lines 70-72, and the step's H2D copies overlap the next tensor's
    CPU step). None when a needed bandwidth is unknown."""
    if not getattr(plan.profile_options, "cpu_offload_optimizer", None):
        return 0.0, "no torchao CPU-offload optimizer"
    regime = plan.profile_options.regime
    w, g = regime.weight, regime.gradient or 4
    _small, big = _split(plan)
    n = sum(big)
    link = n * (g + w)
    host = n * (3 * w + 4 * w)
    how = (f"torchao CPU offload: {link:,.0f} B over the host link (gradients {g} B + parameters {w} B x {n:,}) "
           f"+ {host:,.0f} B of CPU-step traffic in host memory, not overlapped (upper bound)")
    if host_link_bytes_per_s is None or host_memory_bytes_per_s is None:
        from .technique_fit import given_as
        return None, how + f"; host-link or host-memory bandwidth unknown ({given_as('host link B/s', 'host memory B/s')})"
    return link / host_link_bytes_per_s + host / host_memory_bytes_per_s, how
