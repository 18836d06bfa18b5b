"""What plugins register: named optimizers, checkpointing strategies, sharding rules, profiles.

A spec is a *named factory*: a frozen attrs object holding plain callables that the solver
calls directly once the user's configuration has selected it by name. Only the selected
spec of each axis is ever called, so an installed but unselected plugin never contributes
a byte. Callables receive the validated ``TrainingPlan`` (and, after placement, the
``Placement``) plus the spec's own options object (``None`` when it declares none).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

import attrs

from .terms import MemoryTerm

NAME_PATTERN = r"^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$"
_name_re = re.compile(NAME_PATTERN)


def _spec_name(instance, attribute, value):
    if not isinstance(value, str) or not _name_re.match(value):
        raise ValueError(
            f"{type(instance).__name__}.name={value!r} is not a valid name: lowercase letters, "
            f"digits, '-' and '_', optionally dotted (third parties: 'myorg.name')")


def _options_type(instance, attribute, value):
    if value is not None and not attrs.has(value):
        raise TypeError(f"{type(instance).__name__}.options_type must be an attrs class or None, "
                        f"got {value!r}")


def _callable(instance, attribute, value):
    if not callable(value):
        raise TypeError(f"{type(instance).__name__}.{attribute.name} must be callable, got {value!r}")


_name_field = attrs.field(validator=_spec_name)
_description = attrs.field(default="", validator=attrs.validators.instance_of(str))
_options = attrs.field(default=None, validator=_options_type)


@attrs.frozen(kw_only=True)
class OptimizerSpec:
    """A named optimizer.

    ``state_terms(plan, placement, options)`` returns the optimizer-state terms of ONE
    rank, already divided by ``placement.optimizer_state_shards`` (ZeRO-1 and up).
    """

    name: str = _name_field
    description: str = _description
    state_terms: Callable[..., Iterable[MemoryTerm]] = attrs.field(validator=_callable)
    options_type: type | None = _options
    measured_state_terms: Callable[..., Iterable[MemoryTerm]] | None = attrs.field(
        default=None, validator=attrs.validators.optional(_callable))
    """Same signature, for measured-grade profiles: the state in ``plan.regime``'s dtypes and
    the step's temporaries for ``plan.optimizer_impl`` (phase ``optimizer_step``).
    ``None``: the optimizer has no measured-grade model (such profiles refuse it).

    .. versionadded:: plugin API 1.2"""


@attrs.frozen(kw_only=True)
class CheckpointingSpec:
    """A named activation-checkpointing strategy.

    ``activation_terms(plan, placement, options)`` returns the activation terms of one
    rank, using ``placement.layers_per_stage`` and dividing by
    ``placement.activation_shards`` (tensor/sequence parallelism).
    """

    name: str = _name_field
    description: str = _description
    activation_terms: Callable[..., Iterable[MemoryTerm]] = attrs.field(validator=_callable)
    requires_heads: bool = False
    options_type: type | None = _options
    measured_activation_terms: Callable[..., Iterable[MemoryTerm]] | None = attrs.field(
        default=None, validator=attrs.validators.optional(_callable))
    """Same signature, for measured-grade profiles: the decoder layers' activations with
    phases (``mlsysim_core.measured.model.layer_terms`` does the layer accounting).

    .. versionadded:: plugin API 1.2"""


# The axes a sharding rule can own, in the order the solver applies them:
# model parallel first (tensor, context, pipeline, expert), then data parallel.
TENSOR = "tp"
CONTEXT = "cp"
PIPELINE = "pp"
EXPERT = "ep"
DATA = "dp"
AXES = (TENSOR, CONTEXT, PIPELINE, EXPERT, DATA)
DEFAULT_RULES = {TENSOR: "tp", CONTEXT: "cp", PIPELINE: "pp", EXPERT: "ep"}   # data parallel: zero<stage>


_SHARD_FIELDS = ("parameter_shards", "activation_shards", "weight_shards", "gradient_shards",
                 "optimizer_state_shards")


def _tuple(value):
    return tuple(value)


@attrs.frozen(kw_only=True)
class ShardingEffect:
    """What one sharding rule does to one rank, as plain numbers.

    The solver multiplies the shard factors of all selected rules (integer products, so
    the order of rules never changes a number) and divides once. A factor of 1 means
    "this rule does not split that quantity".
    """

    parameter_shards: int = 1
    activation_shards: int = 1
    weight_shards: int = 1
    gradient_shards: int = 1
    optimizer_state_shards: int = 1
    layers_per_stage: int | None = None
    buffer_terms: tuple[MemoryTerm, ...] = ()
    notes: tuple[str, ...] = ()

    # Hand-written checks (effects are built on every solve; attrs validators cost more).
    def __attrs_post_init__(self):
        for name in _SHARD_FIELDS:
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"ShardingEffect.{name} must be an int >= 1, got {value!r}")
        if type(self.buffer_terms) is not tuple:
            object.__setattr__(self, "buffer_terms", tuple(self.buffer_terms))
        if type(self.notes) is not tuple:
            object.__setattr__(self, "notes", tuple(self.notes))


@attrs.frozen(kw_only=True)
class SplitSoFar:
    """What the sharding rules applied before this one did, for one rank.

    ``parameters_per_rank`` is ``model.parameters / parameter_shards`` (fractional, as the
    reference keeps it); ``layers_per_stage`` is ``None`` until a pipeline rule sets it.
    """

    parameter_shards: int
    activation_shards: int
    weight_shards: int
    gradient_shards: int
    optimizer_state_shards: int
    parameters_per_rank: float
    layers_per_stage: int | None


@attrs.frozen(kw_only=True)
class ShardingRuleSpec:
    """A named sharding rule for one axis (``tp``, ``cp``, ``pp``, ``ep`` or ``dp``).

    ``apply(plan, options) -> ShardingEffect``. A rule that finds the layout impossible
    raises ``mlsysim_core.LayoutError`` naming the parameter; the solver passes that
    through. Research variants of ZeRO are simply more ``dp`` rules.

    Rules run in axis order (tp, cp, pp, ep, then dp). An ``apply`` that takes a third
    parameter receives ``SplitSoFar``: what the rules before it did (e.g. a ZeRO variant
    that needs the parameters per model-parallel rank). Two-parameter rules keep working.

    .. versionadded:: plugin API 1.1 -- the optional third parameter.
    """

    name: str = _name_field
    axis: str = attrs.field(validator=attrs.validators.in_(AXES))
    description: str = _description
    apply: Callable[..., ShardingEffect] = attrs.field(validator=_callable)
    options_type: type | None = _options
    measured_buffer_terms: Callable[..., Iterable[MemoryTerm]] | None = attrs.field(
        default=None, validator=attrs.validators.optional(_callable))
    """``(plan, placement, options) -> terms``, for measured-grade profiles: the rule's own
    communication buffers (gathers, reduce-scatters, buckets), with their phases, in the
    regime's dtypes. Under a measured-grade profile they replace the effect's
    ``buffer_terms`` (a reference-grade estimate of the same buffers). ``None``: the
    effect's ``buffer_terms`` are the rule's buffers under every profile.

    .. versionadded:: plugin API 2.0"""


@attrs.frozen(kw_only=True)
class ProfileSpec:
    """A named set of plugins and a rule for combining their terms.

    ``component_plugins`` names the plugins whose component hooks (always-on additive
    terms) take part in this profile; component hooks of other plugins are not called
    unless the user includes them. ``combine`` is ``"sum"`` (every term adds up, as the
    textbook reference does) or ``"peak"``: the total is the largest, over the phases of
    one iteration, of the accelerator bytes alive in that phase (``MemoryTerm.phases``);
    the result names that phase, and its component fields are what is alive then.
    """

    name: str = _name_field
    description: str = _description
    component_plugins: tuple[str, ...] = attrs.field(converter=_tuple)
    combine: str = attrs.field(default="sum", validator=attrs.validators.in_(("sum", "peak")))
    grade: str = attrs.field(default="reference", validator=attrs.validators.in_(("reference", "measured")))
    """Which callables of the selected optimizer and checkpointing specs this profile calls:
    ``state_terms``/``activation_terms`` (reference) or ``measured_state_terms``/
    ``measured_activation_terms`` (measured). A measured-grade solve also carries a training
    regime (``plan.regime``) and the implementation options.

    .. versionadded:: plugin API 1.2"""
    options_type: type | None = _options
    """The profile's own options: an attrs class whose fields (each with a default) are
    extra keyword arguments of ``solve``, ``--flags`` of the CLI and fields of a scenario
    file. The solver builds it from the given keywords; ``plan.profile_options`` holds it.

    .. versionadded:: plugin API 2.0"""
    registration_hooks: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    """The profile's own registration hooks (added with ``mlsysim_addhooks``): each returns
    named items (architecture families, regimes, ...), collected once into
    ``registry.extensions[hook]`` with the same conflict rules as specs.

    .. versionadded:: plugin API 2.0"""
    prepare: Callable | None = attrs.field(default=None, validator=attrs.validators.optional(_callable))
    """``prepare(plan, extensions) -> plan``: check the options against the model and
    complete them (``attrs.evolve(plan, profile_options=..., notes=...)``), choosing among
    ``extensions`` (``registry.extensions``); raise ``NotModelledError`` for what the
    profile cannot describe. ``None``: the plan as checked.

    .. versionadded:: plugin API 2.0"""
    ranks: Callable | None = attrs.field(default=None, validator=attrs.validators.optional(_callable))
    """``ranks(plan) -> sequence of rank objects, or None`` for one kind of rank. Each rank
    object has ``name``, ``stages``, ``ranks``, ``layers``, ``in_flight`` and
    ``place(plan, placement) -> Placement``; the pipeline runs once per rank (``plan.rank``)
    and the result is the heaviest's, ``feasible`` only if all fit.

    .. versionadded:: plugin API 2.0"""
    relocate: Callable | None = attrs.field(default=None, validator=attrs.validators.optional(_callable))
    """``relocate(plan, weights, gradients, optimizer_state) -> (weights, gradients,
    optimizer_state)``: the profile's last word on which memory tier each model-state term
    lives in (offload to host memory or NVMe), before buffers and the combine.

    .. versionadded:: plugin API 2.0"""
