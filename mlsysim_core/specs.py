"""What plugins register: named optimizers, checkpointing strategies, sharding rules and profiles,
each a frozen attrs object of callables called only when a solve selects it by name (so an unselected
plugin never adds a byte), with the plan (and placement) and its options object. See docs/hooks.md."""

from __future__ import annotations

import operator
import re
from typing import Callable, Iterable, Mapping

import attrs

from .plan import FrozenMap
from .terms import MemoryTerm

NAME_PATTERN = r"^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$"
_name_re = re.compile(NAME_PATTERN)


def _spec_name(instance, attribute, value):
    if not isinstance(value, str) or not _name_re.match(value):
        raise ValueError(f"{type(instance).__name__}.name={value!r} is not a valid name: lowercase letters, "
                         f"digits, '-' and '_', optionally dotted (third parties: 'myorg.name')")


def _options_type(instance, attribute, value):
    if value is not None and not attrs.has(value):
        raise TypeError(f"{type(instance).__name__}.options_type must be an attrs class or None, got {value!r}")


def _callable(instance, attribute, value):   # None too, where that is the default
    if not callable(value) and (value is not None or attribute.default is not None):
        raise TypeError(f"{type(instance).__name__}.{attribute.name} must be callable, got {value!r}")


_name_field = attrs.field(validator=_spec_name)
_description = attrs.field(default="", validator=attrs.validators.instance_of(str))
_options = attrs.field(default=None, validator=_options_type)
_optional_callable = attrs.field(default=None, validator=_callable)
# What profiles read from a spec beyond the core's fields, under dotted keys each profile documents
# (the measured profile's: "measured.state_terms", ...); the core never reads one. Plugin API 3.0.
_extensions = attrs.field(factory=dict, converter=lambda value: FrozenMap(value or {}))


# What a checkpointing strategy recomputes, as it declares it (CheckpointingSpec.recomputes).
RECOMPUTES = ("nothing", "layers", "part")


def _recomputes(instance, attribute, value):
    if value not in RECOMPUTES:
        raise ValueError(f"{type(instance).__name__}.recomputes={value!r} is not one of {', '.join(RECOMPUTES)}")


@attrs.frozen(kw_only=True)
class OptimizerSpec:
    """A named optimizer: ``state_terms(plan, placement, options)`` returns the optimizer-state
    terms of ONE rank, already divided by ``placement.optimizer_state_shards``."""
    name: str = _name_field
    description: str = _description
    state_terms: Callable[..., Iterable[MemoryTerm]] = attrs.field(validator=_callable)
    options_type: type | None = _options
    extensions: Mapping[str, object] = _extensions
    step: object | None = None
    """Its state and step, declared for a profile's techniques (measured: ``OptimizerStep``). API 2.3."""


@attrs.frozen(kw_only=True)
class CheckpointingSpec:
    """A named activation-checkpointing strategy: ``activation_terms(plan, placement, options)``
    returns one rank's activation terms (``placement.layers_per_stage`` layers, divided by
    ``placement.activation_shards``)."""
    name: str = _name_field
    description: str = _description
    activation_terms: Callable[..., Iterable[MemoryTerm]] = attrs.field(validator=_callable)
    requires_heads: bool = False
    options_type: type | None = _options
    extensions: Mapping[str, object] = _extensions
    searched: bool = True
    """Enumerated by ``search`` when no strategies are named (False: only when named). API 2.1."""
    recompute: Callable[..., float] | None = _optional_callable
    """``recompute(plan)``: the share of the layers' forward FLOPs the backward runs again (0: none,
    1: all); the planner's step time reads it (None: counted as 0, and said). API 2.2."""
    recomputes: str = attrs.field(default="part", validator=_recomputes)
    """What the backward recomputes, which the profiles' physics reads (never the strategy's name):
    ``"nothing"`` (every layer keeps all it saves), ``"layers"`` (every decoder layer keeps only its
    input and is recomputed whole, one layer at a time; a profile's block option, the measured
    ``checkpointed_layers=k``, limits it to the first k layers), ``"part"`` (the default: anything
    else, part of each layer or some of the layers, as the strategy's own terms say). API 2.3."""
    recomputes_first_layer: Callable[..., bool] | None = _optional_callable
    """``recomputes_first_layer(plan)``: is layer 0 (or a module of it) recomputed at the backward's
    end, so its gradients are born after the recompute? Asked for ``"part"`` strategies (None: no);
    ``"nothing"`` never, ``"layers"`` unless the block option leaves every layer kept. API 2.3."""


# The axes a sharding rule can own, in the order the solver applies them.
TENSOR = "tp"
CONTEXT = "cp"
PIPELINE = "pp"
EXPERT = "ep"
DATA = "dp"
AXES = (TENSOR, CONTEXT, PIPELINE, EXPERT, DATA)
DEFAULT_RULES = {TENSOR: "tp", CONTEXT: "cp", PIPELINE: "pp", EXPERT: "ep"}   # data parallel: zero<stage>

_SHARD_FIELDS = ("parameter_shards", "activation_shards", "weight_shards", "gradient_shards", "optimizer_state_shards",
                 "tensor_shards", "sequence_shards", "expert_shards", "pipeline_stages")
_shard_factors = operator.attrgetter(*_SHARD_FIELDS)
_INT = {int}


@attrs.frozen(kw_only=True)
class ShardingEffect:
    """What one sharding rule does to one rank, as plain numbers (1: "does not split it").
    The solver multiplies the factors of all selected rules and divides once."""
    parameter_shards: int = 1
    activation_shards: int = 1
    weight_shards: int = 1
    gradient_shards: int = 1
    optimizer_state_shards: int = 1
    # What the rule splits, declared for a profile that prices tensors one by one (the measured
    # profile reads these, never plan.tp_size and friends). Plugin API 2.4.
    tensor_shards: int = 1
    """Ranks each weight matrix is split over, as its tensor class says (Megatron's column- and
    row-parallel linears, the vocabulary-parallel embedding; norms and routers replicated)."""
    sequence_shards: int = 1
    """Ranks the tokens of each sequence are split over (context parallelism): every per-token
    tensor, the token ids, logits and attention scores included. A rule that splits the sequence
    declares it in ``activation_shards`` too; the rest of ``activation_shards`` is the tensor-parallel
    ranks' split of the residual stream (sequence parallelism)."""
    expert_shards: int = 1
    """Ranks the routed experts are distributed over (expert parallelism)."""
    pipeline_stages: int = 1
    """Pipeline stages the layer stack is split into (a rank holds one stage's layers)."""
    layers_per_stage: int | None = None
    buffer_terms: tuple[MemoryTerm, ...] = ()
    notes: tuple[str, ...] = ()

    # Hand-written checks (effects are built on every solve; attrs validators cost more).
    def __attrs_post_init__(self):
        factors = _shard_factors(self)
        if set(map(type, factors)) != _INT or min(factors) < 1:      # (in C: the common case)
            for name, value in zip(_SHARD_FIELDS, factors):
                if type(value) is not int or value < 1:
                    raise ValueError(f"ShardingEffect.{name} must be an int >= 1, got {value!r}")
        if type(self.buffer_terms) is not tuple:
            object.__setattr__(self, "buffer_terms", tuple(self.buffer_terms))
        if type(self.notes) is not tuple:
            object.__setattr__(self, "notes", tuple(self.notes))


@attrs.frozen(kw_only=True)
class SplitSoFar:
    """What the sharding rules applied before this one did, for one rank
    (``parameters_per_rank = model.parameters / parameter_shards``, fractional)."""
    parameter_shards: int
    activation_shards: int
    weight_shards: int
    gradient_shards: int
    optimizer_state_shards: int
    parameters_per_rank: float
    layers_per_stage: int | None      # None until a pipeline rule sets it
    tensor_shards: int = 1
    sequence_shards: int = 1
    expert_shards: int = 1
    pipeline_stages: int = 1


@attrs.frozen(kw_only=True)
class ShardingRuleSpec:
    """A named sharding rule for one axis: ``apply(plan, options) -> ShardingEffect`` (a third parameter
    receives ``SplitSoFar``; rules run in axis order), raising ``LayoutError`` for an impossible layout."""
    name: str = _name_field
    axis: str = attrs.field(validator=attrs.validators.in_(AXES))
    description: str = _description
    apply: Callable[..., ShardingEffect] = attrs.field(validator=_callable)
    options_type: type | None = _options
    extensions: Mapping[str, object] = _extensions


# Which callable of each selected spec a profile calls (ProfileSpec.callables): the textbook's.
SPEC_CALLABLES = {"optimizer": "state_terms", "checkpointing": "activation_terms", "sharding": None}
_CALLABLE_FIELDS = {"optimizer": OptimizerSpec, "checkpointing": CheckpointingSpec, "sharding": ShardingRuleSpec}


def _spec_callables(value) -> FrozenMap:
    out = {**SPEC_CALLABLES, **dict(value)}
    for kind, key in out.items():
        spec = _CALLABLE_FIELDS.get(kind)
        if spec is None or (key is not None and "." not in key and key not in attrs.fields_dict(spec)):
            raise ValueError(f"ProfileSpec.callables: {kind!r}: {key!r} is neither a field of the spec it names nor "
                             f"a dotted key of its extensions (kinds: {', '.join(SPEC_CALLABLES)})")
    if out["optimizer"] is None or out["checkpointing"] is None:
        raise ValueError("ProfileSpec.callables: the optimizer's and strategy's terms are always called")
    return FrozenMap(out)


def declared(spec, key: str):
    """What ``ProfileSpec.callables`` names on a spec: a field, or (a dotted key) an item of its
    ``extensions``; None when the spec declares none."""
    return spec.extensions.get(key) if "." in key else getattr(spec, key)


@attrs.frozen(kw_only=True)
class ProfileSpec:
    """A named set of plugins whose component hooks take part, and a rule combining the terms:
    ``"sum"`` (as the reference) or ``"peak"`` (the most accelerator bytes alive in one phase).
    What the profile does is declared by its fields; the core never asks for a profile by name."""
    name: str = _name_field
    description: str = _description
    component_plugins: tuple[str, ...] = attrs.field(converter=tuple)
    combine: str = attrs.field(default="sum", validator=attrs.validators.in_(("sum", "peak")))
    options_type: type | None = _options
    """The profile's own options (``plan.profile_options``): keywords of ``solve``. Plugin API 2.0."""
    registration_hooks: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """Its own registration hooks, collected into ``registry.extensions[hook]``. Plugin API 2.0."""
    prepare: Callable | None = _optional_callable
    """``prepare(plan, registry) -> plan``: checks and completes the options (and may add notes);
    called with or without ``options_type``. Plugin API 2.0."""
    ranks: Callable | None = _optional_callable
    """``ranks(plan)``: the distinct ranks of a layout, or ``None`` for one kind. Plugin API 2.0."""
    relocate: Callable | None = _optional_callable
    """``relocate(plan, weights, gradients, optimizer_state)``: memory tiers (offload). Plugin API 2.0."""
    sequence_parallel: bool = True
    """What ``sequence_parallel`` not given (None) means under this profile. Plugin API 2.1."""
    callables: Mapping[str, str | None] = attrs.field(factory=dict, converter=_spec_callables)
    """Which callable of each selected spec it calls: a field name, or a dotted key of the spec's
    ``extensions`` (the measured profile's ``"measured.state_terms"``): ``{"optimizer": "state_terms",
    "checkpointing": "activation_terms", "sharding": None}`` by default (None: the rules' effect's
    ``buffer_terms``; a key, e.g. ``"measured.buffer_terms"``, replaces them where a rule declares it).
    A selected spec that declares none is refused (``NotModelledError``). Plugin API 2.4 (keys: 3.0)."""
    checks_layouts: bool = False
    """Its ``prepare`` and callables refuse runs they cannot describe (``NotModelledError``) and may
    refuse one micro-batch but not another: ``search`` asks every micro-batch of a layout and stops
    (rather than skipping the layout) at a ``NotModelledError``. Plugin API 2.4."""
    exact_batch: bool = False
    """It never rounds the micro-batch: ``fewest_devices`` tries only data-parallel sizes that
    split the global batch into whole micro-batches, by default. Plugin API 2.4."""
    sequence_limit: Callable | None = _optional_callable
    """``sequence_limit(model) -> int | None``: the longest sequence the profile accepts for a
    model (e.g. a learned position table's rows), which ``longest_sequence`` caps at. API 2.4."""
    solve_cost: float = 1.0
    """About how many reference solves one of its solves costs: ``search`` parallelises a search
    of at least ``8000 / solve_cost`` candidates. Plugin API 2.4."""
    techniques: Callable | None = _optional_callable
    """``techniques(model, hardware, batch_size, seq_len, **keywords) -> ladder``: the profile's
    technique ladder, which ``fit techniques`` calls (the measured one's: ``mlsysim_plugins.measured.
    technique_fit.fit_techniques``). Plugin API 2.4."""
    assemble: Callable | None = _optional_callable
    """``assemble(spec, registry) -> ProfileSpec``: the profile completed from what its registration hooks
    collected (the measured profile's options type from the registered techniques), once per
    registry; the registry keeps what it returns. Plugin API 2.5."""

    details: Callable | None = _optional_callable
    """``details(plan) -> {str: str}``: what a result says about the run beyond the core's fields
    (``TrainingMemoryResult.details``; the measured profile's ``{"regime": ...}``). Plugin API 3.0."""
