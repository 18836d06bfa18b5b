"""What plugins register, each called only when a solve selects it (every field: docs/hooks.md)."""

from __future__ import annotations

import operator
import re
from typing import Callable, Iterable, Mapping

import attrs

from .plan import FrozenMap, Shards
from .terms import MemoryTerm

NAME_PATTERN = r"^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$"
_name_re = re.compile(NAME_PATTERN)


def _must(ok, error: type, text: str):   # an attrs validator raising error("Class.field" + text), {value} formatted
    def validate(instance, attribute, value):
        if not ok(value, attribute):
            raise error(f"{type(instance).__name__}.{attribute.name}" + text.format(value=value))
    return validate


_spec_name = _must(lambda v, _: isinstance(v, str) and _name_re.match(v), ValueError, "={value!r} is not a valid "
                   "name: lowercase letters, digits, '-' and '_', optionally dotted (third parties: 'myorg.name')")
_options_type = _must(lambda v, _: v is None or attrs.has(v), TypeError, " must be an attrs class or None, got {value!r}")
_callable = _must(lambda v, a: callable(v) or v is None and a.default is None,    # None too, where that is the default
                  TypeError, " must be callable, got {value!r}")

_name_field = attrs.field(validator=_spec_name)
_description = attrs.field(default="", validator=attrs.validators.instance_of(str))
_options = attrs.field(default=None, validator=_options_type)
_optional_callable = attrs.field(default=None, validator=_callable)
# What profiles read beyond the core's fields, under dotted keys ("measured.state_terms"); the core never does.
_extensions = attrs.field(factory=dict, converter=lambda value: FrozenMap(value or {}))
RECOMPUTES = ("nothing", "layers", "part")
_recomputes = _must(lambda v, _: v in RECOMPUTES, ValueError, "={value!r} is not one of " + ", ".join(RECOMPUTES))


@attrs.frozen(kw_only=True)
class OptimizerSpec:
    """A named optimizer: ``state_terms(plan, placement, options)``, one rank's optimizer-state terms."""
    name: str = _name_field
    description: str = _description
    state_terms: Callable[..., Iterable[MemoryTerm]] = attrs.field(validator=_callable)
    options_type: type | None = _options
    extensions: Mapping[str, object] = _extensions
    step: object | None = None     # its state and step, for a profile (measured: OptimizerStep)


@attrs.frozen(kw_only=True)
class CheckpointingSpec:
    """A named activation-checkpointing strategy: ``activation_terms(plan, placement, options)``."""
    name: str = _name_field
    description: str = _description
    activation_terms: Callable[..., Iterable[MemoryTerm]] = attrs.field(validator=_callable)
    requires_heads: bool = False
    options_type: type | None = _options
    extensions: Mapping[str, object] = _extensions
    searched: bool = True       # enumerated by search when no strategies are named
    recompute: Callable[..., float] | None = _optional_callable    # (plan) -> share of forward FLOPs rerun
    recomputes: str = attrs.field(default="part", validator=_recomputes)   # "nothing", "layers" or "part"
    recomputes_first_layer: Callable[..., bool] | None = _optional_callable   # (plan) -> layer 0 rerun last?


DATA = "dp"
AXES = ("tp", "cp", "pp", "ep", DATA)     # the axes a rule can own, in the order the solver applies them
DEFAULT_RULES = {"tp": "tp", "cp": "cp", "pp": "pp", "ep": "ep"}   # data parallel: zero<stage>
_SHARD_FIELDS = tuple(f.name for f in attrs.fields(Shards))
_shard_factors = operator.attrgetter(*_SHARD_FIELDS)
_INT = {int}


@attrs.frozen(kw_only=True)
class ShardingEffect(Shards):
    """What one sharding rule splits for one rank (its factors: ``Shards``), its buffers and notes."""
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
class SplitSoFar(Shards):
    """What the rules applied before this one split, for one rank."""
    parameters_per_rank: float
    layers_per_stage: int | None      # None until a pipeline rule sets it


@attrs.frozen(kw_only=True)
class ShardingRuleSpec:
    """A named rule for one axis: ``apply(plan, options[, split_so_far]) -> ShardingEffect`` or ``LayoutError``."""
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
    """A spec's field, or (a dotted key) an item of its ``extensions``; None if it declares none."""
    return spec.extensions.get(key) if "." in key else getattr(spec, key)


@attrs.frozen(kw_only=True)
class ProfileSpec:
    """A named set of component plugins and a combine rule ("sum" or "peak"), declared (docs/hooks.md)."""
    name: str = _name_field
    description: str = _description
    component_plugins: tuple[str, ...] = attrs.field(converter=tuple)
    combine: str = attrs.field(default="sum", validator=attrs.validators.in_(("sum", "peak")))
    options_type: type | None = _options     # its own options: keywords of solve (plan.profile_options)
    registration_hooks: tuple[str, ...] = attrs.field(default=(), converter=tuple)   # -> registry.extensions
    prepare: Callable | None = _optional_callable     # (plan, registry) -> plan: checks, completes the options
    ranks: Callable | None = _optional_callable       # (plan[, placement]) -> the distinct ranks, or None
    relocate: Callable | None = _optional_callable    # (plan, weights, gradients, optimizer_state): tiers
    sequence_parallel: bool = True                    # what sequence_parallel=None means
    # Which callable of each selected spec it calls: a field, or a dotted key of the spec's extensions.
    callables: Mapping[str, str | None] = attrs.field(factory=dict, converter=_spec_callables)
    checks_layouts: bool = False     # it may refuse one micro-batch of a layout but not another
    exact_batch: bool = False        # it never rounds the micro-batch
    sequence_limit: Callable | None = _optional_callable   # (model) -> the longest sequence, or None
    solve_cost: float = 1.0          # about how many reference solves one of its solves costs
    techniques: Callable | None = _optional_callable       # the technique ladder that fit techniques calls
    assemble: Callable | None = _optional_callable         # (spec, registry) -> the spec completed
    details: Callable | None = _optional_callable          # (plan) -> {str: str}: result.details
