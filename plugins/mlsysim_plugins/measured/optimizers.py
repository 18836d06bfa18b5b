"""Optimizer state and step transients, measured grade.

Optimizer plugins describe their state in these terms (see ``adam``, ``sgd``, ...): how
many parameter-shaped buffers they keep, in the regime's state dtype, and what one step
allocates on top, which depends on PyTorch's implementation:

* ``foreach`` (the default on CUDA): one multi-tensor kernel per operation, so a
  temporary is the size of ALL parameters at once (Adam's ``_foreach_sqrt(exp_avg_sq)``,
  Adafactor's ``_foreach_mul``);
* ``fused``: one kernel does the whole update, no temporary;
* ``for-loop``: one parameter at a time; the temporaries of parameter i and the last
  temporary of parameter i-1 (still bound to the loop variable) are alive together.

Measured with ``torch.distributed._tools.mem_tracker.MemTracker`` (validation/README.md).
"""

from __future__ import annotations


from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STATE, OPTIMIZER_STEP, MemoryTerm
from ._cache import per_layout
from .parallel import optimizer_state_divisor
from .shapes import shape_of

IMPLEMENTATIONS = ("foreach", "fused", "for-loop")
STEADY = (FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP)


def _fmt(x) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else str(x)


def _scale(plan, placement) -> float:
    """The share of ``trainable_tensors(plan)`` one rank holds state for."""
    if plan.profile_options.lora is not None:     # the adapters themselves
        return 1 / optimizer_state_divisor(placement)
    return placement.trainable_parameters_per_rank / plan.model.parameters / optimizer_state_divisor(placement)


tensor_share = _scale


def trainable_tensors(plan) -> tuple[int, ...]:
    """Element counts of the tensors the optimizer updates, in order: every parameter tensor,
    or under LoRA the adapters (``lora_A``, ``lora_B`` per adapted linear and layer)."""
    if plan.profile_options.lora is not None:
        from .lora import adapter_matrices
        return tuple(r * c for r, c in adapter_matrices(plan))
    return shape_of(plan).parameter_tensors()


def trainable_matrices(plan) -> tuple[tuple[int, int], ...]:
    """``(rows, cols)`` of each tensor the optimizer updates, in order (a vector's ``cols`` 0: its
    rows are its elements): every parameter tensor as the family's ``matrix_shapes`` lists it, or
    under LoRA the adapters. What a factored optimizer (Adafactor, CAME) keeps rows and columns of;
    scale a count of them to one rank with ``tensor_share(plan, placement)``."""
    if plan.profile_options.lora is not None:
        from .lora import adapter_matrices
        return tuple(adapter_matrices(plan))
    return tuple(shape_of(plan).matrix_shapes())


@per_layout
def master_terms(plan, placement) -> list[MemoryTerm]:
    """An fp32 master copy kept by the optimizer (mixed-precision regimes)."""
    regime = plan.profile_options.regime
    terms = []
    params = placement.trainable_parameters_per_rank / optimizer_state_divisor(placement)
    if regime.master:
        terms.append(MemoryTerm(component=OPTIMIZER_STATE, label="fp32 master weights", phases=STEADY,
                                nbytes=params * regime.master,
                                formula=f"{_fmt(params)} trainable params/rank x {regime.master} B ({regime.name})"))
    # A data-parallel rule that lays the main-grad buffer out its own way (Megatron's distributed
    # optimizer keeps it whole) says so through its options object's ``main_grad_terms``.
    layout = getattr(plan.options.get(plan.rules.get("dp")), "main_grad_terms", None)
    if layout is not None:
        terms += layout(plan, placement)
    elif regime.main_grad:
        terms.append(MemoryTerm(component=OPTIMIZER_STATE, label="fp32 main-grad buffer",
                                phases=STEADY, nbytes=params * regime.main_grad,
                                formula=f"{_fmt(params)} trainable params/rank x {regime.main_grad} B"))
    return terms


@per_layout
def moment_terms(plan, placement, name: str, moments: int, *, step_counters: bool) -> list[MemoryTerm]:
    """``moments`` parameter-shaped buffers in the regime's state dtype (Adam: 2, SGD with
    momentum and Lion: 1), plus Adam's 4-byte fp32 ``step`` tensor per parameter tensor."""
    b = plan.profile_options.regime.state
    params = placement.trainable_parameters_per_rank / optimizer_state_divisor(placement)
    terms = master_terms(plan, placement)
    if moments:
        terms.append(MemoryTerm(
            component=OPTIMIZER_STATE, label=f"{name} state ({moments} x {b * 8}-bit)", phases=STEADY,
            nbytes=params * moments * b,
            formula=f"{_fmt(params)} trainable params/rank x {moments} x {b} B ({plan.profile_options.regime.name} state)"))
    if step_counters:
        tensors = len(trainable_tensors(plan))
        share = _scale(plan, placement)
        terms.append(MemoryTerm(
            component=OPTIMIZER_STATE, label=f"{name} step counters", phases=STEADY,
            nbytes=round(tensors * share) * 4,
            formula=f"{tensors} parameter tensors x 4 B (one fp32 step tensor each)"))
    return terms


@per_layout
def step_transient(plan, placement, name: str, *, foreach: int, loop_current: int, loop_previous: int,
                   element_bytes: int | None = None) -> list[MemoryTerm]:
    """What one optimizer step allocates on top of the state, alive only during the step.

    ``foreach``: parameter-sized temporaries of the foreach implementation (0, 1, ...);
    ``loop_current``/``loop_previous``: temporaries of the for-loop implementation for the
    current and the previous parameter tensor.
    """
    impl = plan.profile_options.optimizer_impl
    b = element_bytes or plan.profile_options.regime.state
    share = _scale(plan, placement)
    if impl == "fused" or (impl == "foreach" and not foreach):
        return []
    if impl == "foreach":
        params = placement.trainable_parameters_per_rank / optimizer_state_divisor(placement)
        return [MemoryTerm(
            component=OPTIMIZER_STATE, label=f"{name} foreach step temporaries", phases=(OPTIMIZER_STEP,),
            nbytes=params * foreach * b,
            formula=f"{foreach} x {_fmt(params)} params/rank x {b} B (one multi-tensor temporary over "
                    "all parameters)")]
    tensors = trainable_tensors(plan)
    worst, at = 0, 0
    previous = 0
    for i, n in enumerate(tensors):
        alive = loop_current * n + loop_previous * previous
        if alive > worst:
            worst, at = alive, i
        previous = n
    if not worst:
        return []
    return [MemoryTerm(
        component=OPTIMIZER_STATE, label=f"{name} for-loop step temporaries", phases=(OPTIMIZER_STEP,),
        nbytes=worst * share * b,
        formula=f"max over parameter tensors of {loop_current} x n_i + {loop_previous} x n_(i-1) = "
                f"{_fmt(worst)} elements (tensor #{at}) x {b} B")]


@per_layout
def adafactor_terms(plan, placement) -> list[MemoryTerm]:
    """torch.optim.Adafactor: a factored second moment (a row and a column vector per
    matrix, the full vector for 1-D parameters) in the parameters' dtype, one fp32 step
    tensor per parameter tensor; no first moment."""
    share = _scale(plan, placement)
    b = plan.profile_options.regime.state
    elements = 0
    matrices = trainable_matrices(plan)
    for rows, cols in matrices:
        elements += rows + cols if cols else rows
    terms = master_terms(plan, placement)
    terms.append(MemoryTerm(
        component=OPTIMIZER_STATE, label="adafactor factored second moment", phases=STEADY,
        nbytes=round(elements * share) * b,
        formula=f"{_fmt(elements)} row + column elements x {b} B"))
    terms.append(MemoryTerm(
        component=OPTIMIZER_STATE, label="adafactor step counters", phases=STEADY,
        nbytes=round(len(matrices) * share) * 4,
        formula=f"{len(matrices)} parameter tensors x 4 B"))
    return terms
