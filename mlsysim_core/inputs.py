"""Step 1 of the pipeline: the inputs, checked once, become a frozen ``TrainingPlan``; then the
profile's options are built and its ``prepare`` completes them. Nothing later re-checks an input."""

from __future__ import annotations

import sys
from typing import Callable, Iterable, Mapping

import attrs

from . import _checks
from .errors import InvalidInputError, InvalidInputTypeError, LayoutError, PluginError
from .hookspecs import COMPONENT_HOOKS
from .memo import kinds, memoize
from .plan import PRECISION_BYTES, FrozenMap, TrainingPlan
from .terms import _source_cell
from .registry import CHECKPOINTING, OPTIMIZER, PROFILE, SHARDING, PluginInfo, Registry, resolve_name
from .specs import DATA, DEFAULT_RULES
from .types import HardwareNode, TransformerWorkload

_RULES_ALLOWED = f"a mapping of axis ({', '.join(DEFAULT_RULES)}) -> rule name, or None"
_profile_options = memoize(lambda info, options_type, *given: call_plugin(     # (frozen: one object per options)
    info, "options_type", "mlsysim_profiles", lambda: options_type(**{name: value for name, value, _ in given})))


def check_plan(registry, profile, model, hardware, batch_size, seq_len, precision, optimizer,
               activation_checkpointing, tp_size, pp_size, dp_size, ep_size, zero_stage,
               gradient_accumulation_steps, trainable_fraction, communication_buffer_fraction,
               sequence_parallel, data_parallel, sharding_rules, plugin_options, include_plugins,
               cp_size=1) -> TrainingPlan:
    """The generic inputs, checked in the reference model's order (spec §4), made strict."""
    profile = _checks.name("profile", profile, registry.profiles)
    model, hardware = _catalog_value(model, "model"), _catalog_value(hardware, "hardware")
    precision = _checks.name("precision", precision, PRECISION_BYTES)
    # Names: case and separators ignored, a near miss named (Registry.resolve, the one lookup).
    if type(optimizer) is not str or optimizer not in registry.optimizers:     # (canonical: every solve's case)
        optimizer = registry.resolve(OPTIMIZER, "optimizer", optimizer)
    if type(activation_checkpointing) is not str or activation_checkpointing not in registry.checkpointing:
        activation_checkpointing = registry.resolve(CHECKPOINTING, "activation_checkpointing", activation_checkpointing)
    count = _checks.count
    sizes = {name: count(name, value) for name, value in (
        ("batch_size", batch_size), ("seq_len", seq_len), ("tp_size", tp_size), ("pp_size", pp_size),
        ("dp_size", dp_size), ("ep_size", ep_size), ("cp_size", cp_size),
        ("gradient_accumulation_steps", gradient_accumulation_steps))}
    trainable_fraction = _checks.fraction("trainable_fraction", trainable_fraction)
    communication_buffer_fraction = _checks.fraction("communication_buffer_fraction", communication_buffer_fraction)
    if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
        raise (InvalidInputTypeError if isinstance(zero_stage, bool) else InvalidInputError)(
            "zero_stage", zero_stage, "0, 1, 2 or 3")
    zero_stage = int(zero_stage)
    catalog = sys.modules.get("mlsysim_core.catalog")     # never imported: no catalog objects, no notes of theirs
    notes = catalog.provenance_notes(model, hardware) if catalog is not None else ()
    if sequence_parallel is None:       # the profile's default, said where it matters
        sequence_parallel = registry.profiles[profile].sequence_parallel
        if sizes["tp_size"] > 1 and not sequence_parallel:
            notes += (f"sequence parallelism off: the {profile} profile's default, as in PyTorch's and Hugging Face's "
                      "tensor-parallel plans (torchtitan, Megatron --sequence-parallel: sequence_parallel=True)",)
    sequence_parallel = _checks.flag("sequence_parallel", sequence_parallel)
    if sizes["tp_size"] > 1:
        _check_tp(model, sizes["tp_size"])
    # Wrong types are errors, even falsy ones: only None, {} and () mean "not given".
    for name, value, allowed in (
            ("sharding_rules", sharding_rules, _RULES_ALLOWED),
            ("plugin_options", plugin_options, "a mapping of spec name -> options, or None")):
        if value is not None and not isinstance(value, Mapping):
            raise InvalidInputTypeError(name, value, allowed, f"got {type(value).__name__}")
    if isinstance(include_plugins, str):
        include_plugins = (include_plugins,)
    if include_plugins is not None and (
            type(include_plugins) is not tuple and (not isinstance(include_plugins, Iterable) or
                                                    isinstance(include_plugins, (bytes, Mapping, set, frozenset)))
            or not all(isinstance(plugin, str) for plugin in include_plugins)):
        raise InvalidInputTypeError("include_plugins", include_plugins,
                                    "a sequence of installed plugin names (or one name), or ()",
                                    f"got {type(include_plugins).__name__}")
    if registry.checkpointing[activation_checkpointing].requires_heads and model.heads is None:
        usable = sorted(n for n, s in registry.checkpointing.items() if not s.requires_heads)
        raise InvalidInputError(
            "activation_checkpointing", activation_checkpointing,
            f"a strategy that does not need the head count for model {model.name!r} (heads=None): "
            f"{', '.join(usable)}",
            f"strategy '{activation_checkpointing}' needs model.heads"
            + (": the 5*a*s^2*b attention-score term scales with the head count (Korthikanti et al. "
               "2023, Sec. 4.1)" if registry.checkpointing[activation_checkpointing].recomputes == "nothing" else ""))
    rules = _rules(registry, sharding_rules, data_parallel, zero_stage)
    include = tuple(sorted(set(include_plugins))) if include_plugins else ()
    for plugin in include:
        if plugin not in registry.plugins:
            raise InvalidInputError("include_plugins", plugin,
                                    f"an installed plugin: {', '.join(sorted(registry.plugins))}")
    if include:
        _check_included(registry, profile, include)
    options = _options(registry, optimizer, activation_checkpointing, rules, plugin_options or None)
    return TrainingPlan(model=model, hardware=hardware, precision=precision, optimizer=optimizer,
                        activation_checkpointing=activation_checkpointing, zero_stage=zero_stage,
                        trainable_fraction=trainable_fraction,
                        communication_buffer_fraction=communication_buffer_fraction,
                        sequence_parallel=sequence_parallel, profile=profile, rules=rules, options=options,
                        include_plugins=include, notes=notes, **sizes)


_OBJECTS = {"model": (TransformerWorkload, "a TransformerWorkload, SparseTransformerWorkload or a catalog name "
                                           "(see `mlsysim-core models`)"),
            "hardware": (HardwareNode, "a HardwareNode or a catalog name (see `mlsysim-core hardware`)")}


def _catalog_value(value, kind: str):
    """A model or accelerator object, or a catalog name looked up."""
    if isinstance(value, str):
        from . import catalog
        return catalog.get_model(value) if kind == "model" else catalog.get_hardware(value)
    if not isinstance(value, _OBJECTS[kind][0]):
        raise InvalidInputTypeError(kind, value, _OBJECTS[kind][1], f"got {type(value).__name__}")
    return value


def _check_tp(model: TransformerWorkload, tp_size: int) -> None:
    """A tensor-parallel rank holds at least one column of the hidden size (the heads are the profile's)."""
    hidden = model.hidden_dim or 4096
    if tp_size > hidden:
        heads = model.heads
        hint = (f"; with its {heads} heads, a divisor of {heads} (e.g. "
                f"{max(d for d in range(1, min(heads, 8) + 1) if heads % d == 0)})" if heads else "")
        raise LayoutError("tp_size", tp_size, f"at most the model's hidden size {hidden}{hint}",
                          "tensor parallelism splits the hidden dimension (and the heads) over tp ranks: "
                          "more ranks than columns leaves ranks with nothing")


@memoize     # (a sharding_rules dict is not remembered: nothing to key it by)
def _rules(registry: Registry, sharding_rules, data_parallel, zero_stage) -> FrozenMap:
    """One installed rule per axis: the defaults, those named, and the data-parallel rule."""
    requested = dict(sharding_rules) if sharding_rules else {}
    for axis in requested:
        if axis not in DEFAULT_RULES:
            raise InvalidInputError("sharding_rules", requested,
                                    f"keys among {', '.join(DEFAULT_RULES)} (use data_parallel= for 'dp')")
    rules = {axis: _rule(registry, axis, requested.get(axis, default)) for axis, default in DEFAULT_RULES.items()}
    if data_parallel is None:
        rules[DATA] = _rule(registry, DATA, f"zero{zero_stage}", "zero_stage")   # zero_stage 0-3 -> zero0-zero3
    else:
        rules[DATA] = _rule(registry, DATA, data_parallel, "data_parallel")    # a known rule first
        if zero_stage != 0:
            raise InvalidInputError("zero_stage", zero_stage,
                                    "0 when data_parallel= names a rule (the rule decides the sharding)",
                                    f"data_parallel={data_parallel!r}")
    return FrozenMap(rules)


def _rule(registry: Registry, axis: str, name: object, parameter: str | None = None) -> str:
    choices = registry.rules_by_axis.get(axis, {})
    if type(name) is str and name in choices:
        return name
    parameter = parameter or f"sharding_rules[{axis!r}]"
    label = {"dp": "data-parallel", "tp": "tensor-parallel", "pp": "pipeline-parallel",
             "ep": "expert-parallel", "cp": "context-parallel"}[axis]
    return resolve_name(parameter, name.strip() if isinstance(name, str) else name, choices,
                        f"an installed {label} rule: {registry.describe_choices(SHARDING, choices)}")


def _check_included(registry: Registry, profile: str, include: tuple) -> None:
    """``include_plugins``: only plugins whose component hooks the profile does not already run."""
    providers = {info.name for (kind, _), info in registry.providers.items() if kind == PROFILE}
    providers |= {name for spec in registry.profiles.values() for name in spec.component_plugins
                  if spec.name != profile}
    runs = set(registry.profiles[profile].component_plugins)
    hooked = {impl.plugin.name for hook in COMPONENT_HOOKS.values() for impl in registry.component_impls.get(hook, ())}
    names = sorted(hooked - providers - runs)
    for plugin in include:
        if plugin in names:
            continue
        why = (f"plugin {plugin!r} provides a profile or is part of one: use profile= to select it"
               if plugin in providers else
               f"profile {profile!r} already runs plugin {plugin!r}: its terms would count twice" if plugin in runs
               else f"plugin {plugin!r} implements no component hook: including it would change nothing")
        raise InvalidInputError("include_plugins", plugin,
                                "a plugin whose component hooks the profile does not already run: "
                                + (", ".join(names) if names else "(none installed)"), why)


@memoize     # (plugin_options given as a dict are structured on every call)
def _options(registry: Registry, optimizer: str, checkpointing: str, rules: FrozenMap, given) -> FrozenMap:
    """Each selected spec's options object: structured from ``given``, else its defaults."""
    selected = {optimizer: registry.optimizers[optimizer], checkpointing: registry.checkpointing[checkpointing],
                **{name: registry.sharding_rules[name] for name in rules.values()}}
    given = given or {}
    for name in given:
        if name not in selected:
            raise InvalidInputError("plugin_options", name,
                                    f"options for a selected spec: {', '.join(sorted(selected))}",
                                    "that spec is not selected in this solve")
    options = {}
    for name, spec in selected.items():
        if spec.options_type is None:
            if name in given:
                raise InvalidInputError(f"plugin_options[{name!r}]", given[name],
                                        f"nothing: '{name}' declares no options")
            continue
        if name in given:
            from .serialization import structure_options
            options[name] = structure_options("plugin_options", name, spec.options_type, given[name])
        else:
            try:
                options[name] = spec.options_type()
            except TypeError as err:
                raise InvalidInputError(f"plugin_options[{name!r}]", None,
                                        f"values for the required options of '{name}'", str(err)) from err
    return FrozenMap(options)


def profile_plan(registry: Registry, spec, plan: TrainingPlan, given: dict) -> TrainingPlan:
    """The plan with the profile's own options (an unknown keyword named), completed by ``prepare``."""
    known = options_fields(spec) if given else ()
    for name, value in given.items():
        if name in known:
            continue
        owners = sorted(p.name for p in registry.profiles.values() if name in options_fields(p))
        if owners:
            raise InvalidInputError(name, value, f"under profile {plan.profile!r}, which has no such option",
                                    f"use profile={owners[0]!r}")
        import difflib
        every = {o for p in registry.profiles.values() for o in options_fields(p)}
        close = difflib.get_close_matches(name, sorted(every), n=1)
        raise InvalidInputTypeError(name, value, "a keyword of solve" + (
            f" or an option of profile {plan.profile!r}: {', '.join(known)}" if known else ""),
            "no such keyword" + (f"; did you mean {close[0]!r}?" if close else ""))
    if spec.options_type is None and spec.prepare is None:
        return plan
    info = registry.providers[(PROFILE, spec.name)]
    if spec.options_type is not None:
        plan = plan.evolve(profile_options=_profile_options(info, spec.options_type, *(
            (name, value, kinds(value)) for name, value in given.items())))
    if spec.prepare is not None:
        plan = call_plugin(info, "prepare", "mlsysim_profiles", spec.prepare, plan, registry)
        if type(plan) is not TrainingPlan:
            raise info.error(f"profile '{spec.name}' prepare returned {type(plan).__name__}; expected "
                             "TrainingPlan", "prepare")
    return plan


def options_fields(spec) -> dict[str, attrs.Attribute]:
    """A profile's options users give: its ``options_type``'s fields, but ``metadata={"internal": True}``."""
    if spec.options_type is None:
        return {}
    return {f.name: f for f in attrs.fields(spec.options_type) if not f.metadata.get("internal")}


def call_plugin(info: PluginInfo, where: str, hook: str, function: Callable, *args):
    """Call a plugin: a user error passes through, anything else names the plugin and hook."""
    cell = _source_cell.get()
    if cell is not None:
        cell[0] = info.name     # terms it builds are stamped with its name
    try:
        return function(*args)
    except (InvalidInputError, PluginError):      # a user error, or a plugin error already naming its plugin
        raise
    except Exception as err:
        raise info.error(f"{where} raised {type(err).__name__}: {err}", hook) from err
