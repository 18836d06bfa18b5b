"""The planner's hooks and the declarations it reads (added by the built-in plugin ``steptime``,
collected into ``registry.extensions["mlsysim_step_time_models"]`` (in the core until plugin API
3.1) and ``registry.extensions["mlsysim_float8_implementations"]``). A third party imports them
from here: a step-time model registers a ``StepTimeSpec``; a float8 implementation registers the
bytes its casts move as a ``Float8Casts``; a
sharding rule declares what it communicates as ``Collective``s under its
``extensions["steptime.collectives"]`` (``collectives(spec)`` reads them; None: nothing declared,
which the step-time model says and times as it documents)."""

from __future__ import annotations

from typing import Callable, Iterable

import attrs
import pluggy

from mlsysim_core.errors import InvalidInputError
from mlsysim_core.specs import _callable, _description, _name_field

_hookspec = pluggy.HookspecMarker("mlsysim")

HOOK = "mlsysim_step_time_models"
FLOAT8_HOOK = "mlsysim_float8_implementations"
COLLECTIVES = "steptime.collectives"     # the sharding rules' extension key
TRAFFIC = "steptime.traffic"             # a rule's memory-bound work per ring step (``RingTraffic``)
STAGES = "steptime.stages"               # how a pipeline rule splits the layers over its stages (``STAGE_SPLITS``)
# "even": ceil(L / pp) layers a stage, the LM head beside the last stage's; "ends-one-fewer": the first and the last
# stage one layer fewer than the others, so the embedding and the LM head do not load them
STAGE_SPLITS = ("even", "ends-one-fewer")


def _among(*allowed, default=attrs.NOTHING):
    return attrs.field(default=default, validator=attrs.validators.in_(allowed))


@attrs.frozen(kw_only=True)
class Collective:
    """One collective a sharding rule runs, declared for the step time in the rule's
    ``extensions["steptime.collectives"]`` (a tuple of them; the step-time model sizes and times
    each, docs/planner.md). ``kind``: a ``ring-pass`` is n-1 sends
    of the buffer around the group (ring attention). ``volume``: what one call moves per rank:
    ``gradients`` (the gradients of the rank's parameter shard, in the dtype the run's regime
    reduces them in), ``parameters`` (the shard's parameters, in the dtype it gathers them in),
    ``activations`` (a micro-batch's hidden states), ``kv`` (its keys and values), ``routed`` (its tokens x experts per token x hidden); ``shard``: a
    group whose size divides it. ``group``: an axis (``pp``: neighbouring stages, ``dp``: dp x cp
    ranks), ``dp-node`` (those inside one node), ``dp-across`` (one per node) or ``etp`` (the expert
    tensor-parallel group: the run's expert_tp_size ranks, 1 apart; the tp group unless the run sets it). ``per``: ``layer``
    (``forward`` calls per forward of each layer, recomputed ones included, ``backward`` per
    backward), ``micro-batch`` or ``step`` (``forward + backward`` calls). ``overlaps``: the
    compute it hides behind (one micro-batch's ``forward`` or ``backward``, the layer's
    ``attention``; ``attention-step``: one step of a ring, the attention of the pass the call runs
    in over the group size), None: on the critical path. ``per_step``: the call runs once per ring
    step (n per pass over an n-rank group), each hidden behind its step, the last one exposed;
    with ``trailing=False`` n - 1 per pass, each waited for within the step it overlaps (none exposed
    beyond what outlasts its step). ``element_bytes``: the bytes of one element it moves (None: what the run's regime declares
    for its volume, ``Regime.collective_bytes``, else the run's precision). ``in_network``: a switch that reduces in the
    network may carry this all-reduce (False: a ring). ``last_micro_batch``: a ``per="step"`` call that
    runs inside the last micro-batch's ``overlaps`` compute, hidden together with that micro-batch's
    calls beside it (FSDP's gradients reduce-scattered once after accumulating without communication);
    False: hidden on its own behind one such compute. ``first_layer_exposed``: the first layer's
    share is not hidden. ``sequence_parallel``: only with (True) or without (False) it.
    ``implementations``: the implementation choices a run may make for it (the step time applies
    a run's choice to the collectives that declare it; one that declares none takes ``batched``
    as before): ``batched`` (beside another micro-batch's compute), ``node-forwarded`` (a
    ``routed`` all-to-all that crosses the network once per destination node and is forwarded
    inside it over NVLink, DeepEP-style)."""
    kind: str = _among("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv", "ring-pass")
    volume: str = _among("gradients", "parameters", "activations", "kv", "routed")
    group: str = _among("tp", "cp", "ep", "pp", "dp", "dp-node", "dp-across", "etp")
    per: str = _among("layer", "micro-batch", "step")
    forward: int = 0
    backward: int = 0
    overlaps: str | None = _among(None, "forward", "backward", "attention", "attention-step", default=None)
    shard: str | None = _among(None, "dp-node", "tp", default=None)
    in_network: bool = True
    first_layer_exposed: bool = False
    last_micro_batch: bool = False
    sequence_parallel: bool | None = None
    per_step: bool = False
    trailing: bool = True
    element_bytes: int | None = None
    implementations: tuple[str, ...] = attrs.field(
        default=(), converter=tuple,
        validator=attrs.validators.deep_iterable(attrs.validators.in_(("batched", "node-forwarded"))))


@attrs.frozen(kw_only=True)
class RingTraffic:
    """The memory-bound work a ring implementation runs beside its attention kernels, declared for
    the step time in a rule's ``extensions["steptime.traffic"]``: bytes read and written per element
    of the rank's attention output (``q``: tokens x query heads x head dim) and of its keys and values
    (``kv``: tokens x 2 x kv heads x head dim), in each ring step after the first (``*_step``) and once
    per pass (``*_pass``), in a forward (recomputed ones too) and in a backward. Timed at the
    memory-bound share of the bandwidth, on the critical path. ``kernels_step`` and ``kernels_pass``:
    the (forward, backward) kernels it launches beyond the layer's own, each step after the first
    and once per pass, each paying the calibration's ``kernel_overhead``."""
    forward_step: tuple[float, float] = (0, 0)      # (per q element, per kv element)
    forward_pass: tuple[float, float] = (0, 0)
    backward_step: tuple[float, float] = (0, 0)
    backward_pass: tuple[float, float] = (0, 0)
    kernels_step: tuple[int, int] = (0, 0)
    kernels_pass: tuple[int, int] = (0, 0)
    source: str = ""


def _declared(rule, key, options):
    """A rule's declaration under ``key``: a value, or a callable of the rule's options object (what the
    rule communicates depends on an implementation choice its options make), called with ``options``
    (None: the rule's default options, ``options_type()``)."""
    declared = rule.extensions.get(key)
    if callable(declared):
        if options is None and rule.options_type is not None:
            options = rule.options_type()
        declared = declared(options)
    return declared


def traffic(rule, options=None) -> RingTraffic | None:
    """What memory-bound work a sharding rule declares beside its collectives (None: none), under
    ``options`` (the run's options object for the rule; None: its defaults)."""
    return _declared(rule, TRAFFIC, options)


def stages(rule, options=None) -> str | None:
    """How a pipeline rule declares it splits the layers (one of ``STAGE_SPLITS``; None: ``"even"``),
    under ``options`` (the run's options object for the rule; None: its defaults)."""
    return _declared(rule, STAGES, options)


def collectives(rule, options=None) -> tuple[Collective, ...] | None:
    """What a sharding rule declares it communicates (None: nothing declared), under ``options``
    (the run's options object for the rule; None: its defaults). A rule declares a tuple, or a
    callable of its options object returning one."""
    declared = _declared(rule, COLLECTIVES, options)
    return None if declared is None else tuple(declared)


@attrs.frozen(kw_only=True)
class StepTimeSpec:
    """A named step-time model, which ``search`` ranks the layouts that fit by (plugin API 2.5):
    ``check(hardware, overrides, calibration)`` refuses what it cannot time before anything is
    solved; ``prepare(**run) -> timing`` once per search (a mapping: ``search`` reads its
    ``calibrated``, ``notes``, ``assumptions``, ``flops_per_token``, ``peak``, ``idle`` and ``chunks``);
    ``time(timing, **layout) -> {component: seconds, "step": total}`` per layout; ``components``."""
    name: str = _name_field
    description: str = _description
    check: Callable = attrs.field(validator=_callable)
    prepare: Callable = attrs.field(validator=_callable)
    time: Callable = attrs.field(validator=_callable)
    components: tuple[str, ...] = attrs.field(default=(), converter=tuple)


def _per(instance, attribute, value):
    if value not in ("micro-batch", "step"):
        raise InvalidInputError(attribute.name, value, "'micro-batch' (cast each forward) or 'step' (once a step)")


@attrs.frozen(kw_only=True)
class Float8Casts:
    """A named float8 implementation: the bytes per element of a GEMM operand its casts read and
    write (plugins/mlsysim_plugins/_steptime_float8.py derives the built-ins' from their sources).
    ``input``: of a GEMM's input, each forward (recomputed ones too); ``normed_input``: of an input a
    norm produces (q/k/v, a dense MLP's up projection), each forward; ``weight``: of a weight, each
    forward (``weight_per="micro-batch"``) or once a step (``"step"``: cast on the first micro-batch
    and cached); ``grad``: of the output gradient, each backward; ``transpose``: of the input and of
    the weight, each backward (transposed copies); ``transpose_weight``: of the weight's, where it
    differs from the input's (None: ``transpose``); ``rescale``: of each backward GEMM's output (the
    input gradient M x K, the weight gradient N x K) that a separate kernel reads and writes to apply
    the operands' scales after the GEMM (0: the GEMM applies them). ``tp_gather``: under tensor
    parallelism with sequence parallelism, the implementation's parallel styles cast a column-parallel
    GEMM's input once, on the rank's 1/tp of the tokens, before the all-gather, for every module that
    reads it, and a row-parallel GEMM's output gradient once, on its 1/tp, before the backward's
    all-gather (torchao's Float8ColwiseParallel, Float8RowwiseParallel and PrepareFloat8ModuleInput):
    the bytes per element those all-gathers move (the reduce-scatters move the run's precision); None:
    the tensor-parallel collectives move the run's precision and each module casts the gathered input.
    Where the gathered tensors' casts differ from the unsharded ones' (under ``tp_gather``): ``tp_input``,
    the bytes per element of a column-parallel GEMM's normed input cast on the rank's shard before the
    all-gather (None: ``normed_input``; it may be negative: a cast fused into the norm that writes 1-byte
    elements in place of its 2-byte ones saves a byte); ``tp_grad``, of a row-parallel GEMM's output
    gradient cast on its shard (None: ``grad``); ``tp_transpose``, of the column-wise (transposed) copy
    made from each gathered tensor on all the tokens, each backward, for the weight-gradient GEMM (the
    input gathered again and the output gradient; 0: none, the copy is gathered or not needed).
    ``async_tp_fuses``: the halves of a sequence-parallel tensor-parallel collective (an all-gather
    before a column-parallel GEMM, a reduce-scatter after a row-parallel one, and their backward
    counterparts) that an async TP (``{"tp": "decomposed"}``) fuses with this implementation's GEMMs;
    a half not listed is not decomposed and runs whole on the critical path, as vanilla TP's does.
    ``memory``: the memory profile's ``float8=`` option
    whose memory this implementation has (the measured profile's torchao recipes), which a search's
    ``allow_float8`` solves its rows with; None: its memory is not modelled, the rows' memory is the
    16-bit run's (said in a note). The step time reads these fields, never ``name``."""
    name: str = _name_field
    input: float
    normed_input: float
    weight: float
    weight_per: str = attrs.field(validator=_per)
    grad: float
    transpose: float
    transpose_weight: float | None = None
    rescale: float = 0
    tp_gather: float | None = None
    tp_input: float | None = None
    tp_grad: float | None = None
    tp_transpose: float = 0
    async_tp_fuses: tuple[str, ...] = attrs.field(
        default=("all-gather", "reduce-scatter"), converter=tuple,
        validator=attrs.validators.deep_iterable(attrs.validators.in_(("all-gather", "reduce-scatter"))))
    memory: str | None = None
    source: str = ""
    description: str = _description


@_hookspec
def mlsysim_step_time_models() -> Iterable[StepTimeSpec]:
    """Register named step-time models (what ``search`` ranks layouts by).

    .. versionadded:: plugin API 2.5 (here since 3.1)
    """


@_hookspec
def mlsysim_float8_implementations() -> Iterable[Float8Casts]:
    """Register named float8 implementations (``Float8Casts``: what their casts read and write),
    which ``time_plan(float8=name)``, ``mlsysim-core time --float8 NAME`` and ``search_plans(
    allow_float8=name)`` choose from.
    """


# the plugin manager checks and collects them
REGISTRATION_HOOK_TYPES = {HOOK: StepTimeSpec, FLOAT8_HOOK: Float8Casts}
