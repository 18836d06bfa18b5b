"""The solver: one fixed, documented pipeline.

    1. check the inputs          -> TrainingPlan          (nothing unchecked past here)
    2. select one spec per axis   (optimizer, checkpointing, tp, pp, ep, dp rules)
    3. apply the sharding rules   -> Placement             (tp, pp, ep, then dp)
    4. collect terms per component: weights, gradients, optimizer state, activations,
       communication buffers (selected specs + the profile's component hooks)
    5. combine                    -> TrainingMemoryResult  (the profile's rule; "sum")

Only selected specs are called, so installed-but-unselected plugins contribute nothing.
Shard factors are integer products, and terms are ordered by (source, label) before
they are added, so pluggy's registration order never decides a number.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Sequence

from . import _checks
from .errors import (InvalidInputError, InvalidInputTypeError, LayoutError, PluginContractError,
                     PluginError)
from .manager import PluginManager, get_plugin_manager
from .plan import PRECISION_BYTES, Placement, TrainingPlan
from .registry import CHECKPOINTING, OPTIMIZER, PROFILE, SHARDING, PluginInfo, Registry
from .result import TrainingMemoryResult
from .specs import AXES, DATA, DEFAULT_RULES, ShardingEffect
from .terms import (ACCELERATOR, ACTIVATIONS, COMMUNICATION_BUFFERS, COMPONENTS, GRADIENTS,
                    OPTIMIZER_STATE, WEIGHTS, MemoryTerm)
from .types import HardwareNode, TransformerWorkload

DEFAULT_PROFILE = "reference"


class TrainingMemoryModel:
    """How much memory one accelerator needs to train a model, and whether it fits.

    ``TrainingMemoryModel()`` uses the ``reference`` profile, which reproduces the
    reference model (mlsysim 0.3.0) exactly. ``plugin_manager`` lets tests and embedders
    supply their own set of plugins; by default every installed plugin is loaded once
    per process.
    """

    def __init__(self, profile: str = DEFAULT_PROFILE, *, plugin_manager: PluginManager | None = None):
        self._pm = plugin_manager
        self._profile = profile

    @property
    def plugin_manager(self) -> PluginManager:
        if self._pm is None:
            self._pm = get_plugin_manager()
        return self._pm

    @property
    def registry(self) -> Registry:
        return self.plugin_manager.registry

    def solve(self, model, hardware, batch_size, seq_len=2048, precision='fp16', optimizer='adam',
              activation_checkpointing='selective', tp_size=1, pp_size=1, dp_size=1, ep_size=1,
              zero_stage=0, gradient_accumulation_steps=1, trainable_fraction=1.0,
              communication_buffer_fraction=0.05, *, sequence_parallel: bool = True,
              data_parallel: str | None = None, sharding_rules: Mapping[str, str] | None = None,
              plugin_options: Mapping[str, Any] | None = None,
              include_plugins: Sequence[str] = (), profile: str | None = None,
              ) -> TrainingMemoryResult:
        """Solve for the memory of one accelerator.

        The positional parameters are the reference model's, in its order, with its
        defaults; ``batch_size`` is the GLOBAL batch (all DP replicas and accumulation
        steps). Keyword-only extensions:

        * ``sequence_parallel``: with ``tp_size > 1``, divide activations by ``tp_size``.
        * ``data_parallel``: name of a data-parallel sharding rule (e.g. a third party's
          ZeRO variant); by default ``zero_stage`` selects ``zero0`` .. ``zero3``.
        * ``sharding_rules``: ``{"tp"|"pp"|"ep": rule name}`` to replace a default rule.
        * ``plugin_options``: ``{spec name: options}``, a dict or the spec's attrs options.
        * ``include_plugins``: plugins whose component hooks take part in addition to
          the profile's own.
        * ``profile``: overrides the model's profile for this call.
        """
        registry = self.registry
        plan = _build_plan(registry, profile or self._profile, model, hardware, batch_size, seq_len,
                           precision, optimizer, activation_checkpointing, tp_size, pp_size,
                           dp_size, ep_size, zero_stage, gradient_accumulation_steps,
                           trainable_fraction, communication_buffer_fraction, sequence_parallel,
                           data_parallel, sharding_rules, plugin_options, include_plugins)
        return _run_pipeline(registry, plan)


# --- 1. inputs ----------------------------------------------------------------------------

def _resolve_model(model) -> TransformerWorkload:
    if isinstance(model, str):
        from .catalog import get_model
        return get_model(model)
    if not isinstance(model, TransformerWorkload):
        raise InvalidInputTypeError("model", model,
                                    "a TransformerWorkload, SparseTransformerWorkload or a catalog name "
                                    "(see `mlsysim-core models`)", f"got {type(model).__name__}")
    return model


def _resolve_hardware(hardware) -> HardwareNode:
    if isinstance(hardware, str):
        from .catalog import get_hardware
        return get_hardware(hardware)
    if not isinstance(hardware, HardwareNode):
        raise InvalidInputTypeError("hardware", hardware,
                                    "a HardwareNode or a catalog name (see `mlsysim-core hardware`)",
                                    f"got {type(hardware).__name__}")
    return hardware


def _select_rule(registry: Registry, axis: str, name: object, parameter: str) -> str:
    choices = registry.rules_for_axis(axis)
    if not isinstance(name, str) or name.strip().lower() not in choices:
        label = {"dp": "data-parallel", "tp": "tensor-parallel", "pp": "pipeline-parallel",
                 "ep": "expert-parallel"}[axis]
        raise (InvalidInputTypeError if not isinstance(name, str) else InvalidInputError)(
            parameter, name, f"an installed {label} rule: {registry.describe_choices(SHARDING, choices)}")
    return name.strip().lower()


def _build_plan(registry, profile, model, hardware, batch_size, seq_len, precision, optimizer,
                activation_checkpointing, tp_size, pp_size, dp_size, ep_size, zero_stage,
                gradient_accumulation_steps, trainable_fraction, communication_buffer_fraction,
                sequence_parallel, data_parallel, sharding_rules, plugin_options,
                include_plugins) -> TrainingPlan:
    profile = _checks.name("profile", profile, registry.profiles)
    model = _resolve_model(model)
    hardware = _resolve_hardware(hardware)
    # The reference model's order of checks (spec §4), made strict.
    precision = _checks.name("precision", precision, PRECISION_BYTES)
    if not isinstance(optimizer, str) or optimizer.lower() not in registry.optimizers:
        raise (InvalidInputError if isinstance(optimizer, str) else InvalidInputTypeError)(
            "optimizer", optimizer,
            f"an installed optimizer: {registry.describe_choices(OPTIMIZER, registry.optimizers)}")
    optimizer_name = optimizer.lower()
    if not isinstance(activation_checkpointing, str) or activation_checkpointing not in registry.checkpointing:
        # Case-sensitive, as the reference: 'Selective' is not a strategy name.
        raise (InvalidInputError if isinstance(activation_checkpointing, str) else InvalidInputTypeError)(
            "activation_checkpointing", activation_checkpointing,
            f"one of: {registry.describe_choices(CHECKPOINTING, registry.checkpointing)}")
    counts = {}
    for parameter, value in (("batch_size", batch_size), ("seq_len", seq_len), ("tp_size", tp_size),
                             ("pp_size", pp_size), ("dp_size", dp_size), ("ep_size", ep_size),
                             ("gradient_accumulation_steps", gradient_accumulation_steps)):
        counts[parameter] = _checks.count(parameter, value)
    trainable_fraction = _checks.fraction("trainable_fraction", trainable_fraction)
    communication_buffer_fraction = _checks.fraction("communication_buffer_fraction",
                                                     communication_buffer_fraction)
    if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
        raise (InvalidInputTypeError if isinstance(zero_stage, bool) else InvalidInputError)(
            "zero_stage", zero_stage, "0, 1, 2 or 3")
    zero_stage = int(zero_stage)
    sequence_parallel = _checks.flag("sequence_parallel", sequence_parallel)

    if activation_checkpointing in registry.checkpointing and \
            registry.checkpointing[activation_checkpointing].requires_heads and model.heads is None:
        usable = sorted(n for n, s in registry.checkpointing.items() if not s.requires_heads)
        raise InvalidInputError(
            "activation_checkpointing", activation_checkpointing,
            f"a strategy that does not need the head count for model {model.name!r} (heads=None): "
            f"{', '.join(usable)}",
            f"strategy '{activation_checkpointing}' needs model.heads"
            + (": the 5*a*s^2*b attention-score term scales with the head count (Korthikanti et al. "
               "2023, Sec. 4.1)" if activation_checkpointing == "none" else ""))

    # Select one sharding rule per axis.
    requested = dict(sharding_rules or {})
    for axis in requested:
        if axis not in DEFAULT_RULES:
            raise InvalidInputError("sharding_rules", requested,
                                    f"keys among {', '.join(DEFAULT_RULES)} (use data_parallel= for 'dp')")
    rules = {axis: _select_rule(registry, axis, requested.get(axis, default), f"sharding_rules[{axis!r}]")
             for axis, default in DEFAULT_RULES.items()}
    if data_parallel is None:
        rules[DATA] = _select_rule(registry, DATA, f"zero{zero_stage}", "zero_stage")
    else:
        if zero_stage != 0:
            raise InvalidInputError("zero_stage", zero_stage,
                                    "0 when data_parallel= names a rule (the rule decides the sharding)",
                                    f"data_parallel={data_parallel!r}")
        rules[DATA] = _select_rule(registry, DATA, data_parallel, "data_parallel")

    if isinstance(include_plugins, str):
        include_plugins = (include_plugins,)
    include = tuple(sorted(set(include_plugins)))
    for plugin in include:
        if plugin not in registry.plugins:
            raise InvalidInputError("include_plugins", plugin,
                                    f"an installed plugin: {', '.join(sorted(registry.plugins))}")

    spec_names = {optimizer_name: registry.optimizers[optimizer_name],
                  activation_checkpointing: registry.checkpointing[activation_checkpointing]}
    spec_names.update({name: registry.sharding_rules[name] for name in rules.values()})
    options = _structure_options(plugin_options or {}, spec_names)

    return TrainingPlan(model=model, hardware=hardware, precision=precision, optimizer=optimizer_name,
                        activation_checkpointing=activation_checkpointing, zero_stage=zero_stage,
                        trainable_fraction=trainable_fraction,
                        communication_buffer_fraction=communication_buffer_fraction,
                        sequence_parallel=sequence_parallel, profile=profile, rules=rules,
                        options=options, include_plugins=include, **counts)


def _structure_options(given: Mapping[str, Any], selected: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        raise InvalidInputTypeError("plugin_options", given, "a mapping of spec name -> options")
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
    return options


# --- 2-5. the pipeline --------------------------------------------------------------------

def _call_spec(registry: Registry, kind: str, name: str, role: str, function: Callable, *args):
    """Call a spec's callable; user errors pass through, anything else blames the plugin."""
    try:
        out = function(*args)
        if role != "apply" and out is not None and not isinstance(out, (str, bytes, MemoryTerm)) \
                and isinstance(out, Iterable):
            out = list(out)   # a generator runs plugin code while it is consumed
        return out
    except InvalidInputError:
        raise
    except Exception as err:
        info = registry.provider(kind, name)
        raise PluginContractError(
            f"{info.describe()} {kind} '{name}' failed in {role}: {type(err).__name__}: {err}",
            plugin=info.name, source=info.source, hook=role) from err


def _place(registry: Registry, plan: TrainingPlan) -> tuple[Placement, list, list]:
    products = {"parameter_shards": 1, "activation_shards": 1, "weight_shards": 1,
                "gradient_shards": 1, "optimizer_state_shards": 1}
    sources = {key: [] for key in products}
    layers_per_stage = None
    buffer_terms, notes = [], []
    for axis in AXES:   # model parallel (tp, pp, ep), then data parallel
        name = plan.rules[axis]
        spec = registry.sharding_rules[name]
        effect = _call_spec(registry, SHARDING, name, "apply", spec.apply, plan, plan.options_for(name))
        info = registry.provider(SHARDING, name)
        if not isinstance(effect, ShardingEffect):
            raise PluginContractError(
                f"{info.describe()} sharding rule '{name}' apply returned {type(effect).__name__}; "
                "expected ShardingEffect", plugin=info.name, source=info.source, hook="apply")
        for key in products:
            factor = getattr(effect, key)
            if factor != 1:
                products[key] *= factor
                sources[key].append(name)
        if effect.layers_per_stage is not None:
            if layers_per_stage is not None:
                raise PluginContractError(
                    f"{info.describe()} sharding rule '{name}' sets layers_per_stage, which the "
                    f"'{plan.rules['pp']}' rule already set", plugin=info.name, source=info.source,
                    hook="apply")
            layers_per_stage = _checks.count(f"{name}.layers_per_stage", effect.layers_per_stage)
        buffer_terms.extend((info, term) for term in effect.buffer_terms)
        notes.append((axis, effect.notes))
    parameters_per_rank = plan.model.parameters / products["parameter_shards"]
    placement = Placement(
        parameters_per_rank=parameters_per_rank,
        trainable_parameters_per_rank=parameters_per_rank * plan.trainable_fraction,
        layers_per_stage=layers_per_stage if layers_per_stage is not None else plan.model.layers,
        shard_sources={k: tuple(v) for k, v in sources.items()}, **products)
    return placement, buffer_terms, notes


def _stamp(info: PluginInfo, items, component: str, where: str) -> list[MemoryTerm]:
    """Check what a plugin returned and stamp each term with the plugin's name."""
    if items is None:
        return []
    if isinstance(items, (str, bytes, MemoryTerm)) or not isinstance(items, Iterable):
        raise PluginContractError(
            f"{info.describe()} {where} returned {type(items).__name__}; expected a list of MemoryTerm",
            plugin=info.name, source=info.source, hook=where)
    out = []
    for term in items:
        if not isinstance(term, MemoryTerm):
            raise PluginContractError(
                f"{info.describe()} {where} returned {type(term).__name__} {term!r}; expected MemoryTerm",
                plugin=info.name, source=info.source, hook=where)
        if term.component != component:
            raise PluginContractError(
                f"{info.describe()} {where} returned a '{term.component}' term ({term.label!r}); "
                f"expected component '{component}'", plugin=info.name, source=info.source, hook=where)
        out.append(term if term.source == info.name else _with_source(term, info.name))
    return out


def _with_source(term: MemoryTerm, source: str) -> MemoryTerm:
    return MemoryTerm(component=term.component, label=term.label, nbytes=term.nbytes,
                      formula=term.formula, source=source, phases=term.phases, tier=term.tier,
                      pipeline_stage=term.pipeline_stage, rank=term.rank)


def _hook_terms(registry: Registry, plan: TrainingPlan, component: str, kwargs: dict) -> list[MemoryTerm]:
    from .hookspecs import COMPONENT_HOOKS
    hook_name = COMPONENT_HOOKS[component]
    wanted = set(registry.profiles[plan.profile].component_plugins) | set(plan.include_plugins)
    terms = []
    for impl in registry.component_impls[hook_name]:
        if impl.plugin.name not in wanted:
            continue
        try:
            items = impl.function(*[kwargs[a] for a in impl.argnames])
            if items is not None and not isinstance(items, (str, bytes, MemoryTerm)) and isinstance(items, Iterable):
                items = list(items)
            terms.extend(_stamp(impl.plugin, items, component, hook_name))
        except (InvalidInputError, PluginContractError):
            raise
        except Exception as err:
            raise PluginContractError(
                f"{impl.plugin.describe()} hook {hook_name} raised {type(err).__name__}: {err}",
                plugin=impl.plugin.name, source=impl.plugin.source, hook=hook_name) from err
    return terms


def _accelerator_sum(terms: list[MemoryTerm]):
    total = 0
    for term in terms:
        if term.tier == ACCELERATOR:
            total += term.nbytes
    return total


def _ordered(terms: list[MemoryTerm]) -> list[MemoryTerm]:
    return sorted(terms, key=lambda t: (t.source, t.label))


def _run_pipeline(registry: Registry, plan: TrainingPlan) -> TrainingMemoryResult:
    profile = registry.profiles[plan.profile]
    missing = sorted(set(profile.component_plugins) - set(registry.plugins))
    if missing:
        info = registry.provider(PROFILE, plan.profile)
        raise PluginError(
            f"profile '{plan.profile}' ({info.source}) needs plugin(s) {', '.join(missing)}, which "
            "are not loaded (blocked or uninstalled?); unblock them or choose another profile",
            plugin=info.name, source=info.source, hook="mlsysim_profiles")
    placement, buffer_terms, notes = _place(registry, plan)
    hook_kwargs = {"plan": plan, "placement": placement}

    by_component: dict[str, list[MemoryTerm]] = {}
    totals: dict[str, int | float] = {}
    for component in (WEIGHTS, GRADIENTS):
        by_component[component] = _ordered(_hook_terms(registry, plan, component, hook_kwargs))
        totals[component] = _accelerator_sum(by_component[component])

    opt_spec = registry.optimizers[plan.optimizer]
    opt_info = registry.provider(OPTIMIZER, plan.optimizer)
    own = _call_spec(registry, OPTIMIZER, plan.optimizer, "state_terms", opt_spec.state_terms,
                     plan, placement, plan.options_for(plan.optimizer))
    by_component[OPTIMIZER_STATE] = _ordered(
        _stamp(opt_info, own, OPTIMIZER_STATE, f"optimizer '{plan.optimizer}' state_terms")
        + _hook_terms(registry, plan, OPTIMIZER_STATE, hook_kwargs))
    totals[OPTIMIZER_STATE] = _accelerator_sum(by_component[OPTIMIZER_STATE])

    ckpt = plan.activation_checkpointing
    ckpt_spec = registry.checkpointing[ckpt]
    ckpt_info = registry.provider(CHECKPOINTING, ckpt)
    own = _call_spec(registry, CHECKPOINTING, ckpt, "activation_terms", ckpt_spec.activation_terms,
                     plan, placement, plan.options_for(ckpt))
    by_component[ACTIVATIONS] = _ordered(
        _stamp(ckpt_info, own, ACTIVATIONS, f"checkpointing strategy '{ckpt}' activation_terms")
        + _hook_terms(registry, plan, ACTIVATIONS, hook_kwargs))
    totals[ACTIVATIONS] = _accelerator_sum(by_component[ACTIVATIONS])

    comm = []
    for info, term in buffer_terms:
        comm.extend(_stamp(info, [term], COMMUNICATION_BUFFERS, "sharding rule apply"))
    model_states = {k: totals[k] for k in (WEIGHTS, GRADIENTS, OPTIMIZER_STATE)}
    comm.extend(_hook_terms(registry, plan, COMMUNICATION_BUFFERS,
                            {**hook_kwargs, "model_states": model_states}))
    by_component[COMMUNICATION_BUFFERS] = _ordered(comm)
    totals[COMMUNICATION_BUFFERS] = _accelerator_sum(comm)

    # 5. combine: the reference adds the five components left to right, in float64.
    total = (totals[WEIGHTS] + totals[GRADIENTS] + totals[OPTIMIZER_STATE] + totals[ACTIVATIONS]
             + totals[COMMUNICATION_BUFFERS])
    terms = tuple(t for c in COMPONENTS for t in by_component[c])
    host = sum(t.nbytes for t in terms if t.tier != ACCELERATOR)
    capacity = plan.hardware.memory_capacity
    # Feasibility and utilisation are computed in GB, exactly as the reference does.
    total_gb, available_gb = total * 1e-9, capacity * 1e-9
    utilization = total_gb / available_gb

    trace = [_summary_trace(totals)]
    for axis in (DATA, "tp", "pp", "ep"):
        trace.extend(n for a, ns in notes if a == axis for n in ns)

    selected = {"profile": plan.profile, "optimizer": plan.optimizer, "activation_checkpointing": ckpt,
                **{f"{axis}_rule": plan.rules[axis] for axis in AXES}}
    contributors = [opt_info, ckpt_info] + [registry.provider(SHARDING, plan.rules[a]) for a in AXES]
    contributors += [registry.plugins[t.source] for t in terms if t.source in registry.plugins]
    plugin_sources = {info.name: info.source for info in sorted(contributors, key=lambda i: i.name)}

    return TrainingMemoryResult(
        feasible=total_gb <= available_gb, total_memory=total, available_memory=capacity,
        memory_utilization=utilization, precision=plan.precision, optimizer=plan.optimizer,
        activation_checkpointing=ckpt,
        parallelism={"dp": plan.dp_size, "tp": plan.tp_size, "pp": plan.pp_size, "ep": plan.ep_size},
        constraint_trace=tuple(trace), profile=plan.profile, terms=terms, host_memory=host,
        model=plan.model.name, hardware=plan.hardware.name, microbatch=plan.microbatch,
        layers_per_stage=placement.layers_per_stage, sequence_parallel=plan.sequence_parallel,
        selected=selected, plugin_sources=plugin_sources, **totals)


def format_gb(nbytes) -> str:
    """The reference's rendering of a byte count in GB (pint's ``~P`` format):
    ``repr`` of the float, with exponents written as ``×10⁻⁵``."""
    text = repr(float(nbytes * 1e-9))
    if "e" in text:
        mantissa, exponent = text.split("e")
        sup = str.maketrans("-+0123456789", "⁻⁺⁰¹²³⁴⁵⁶⁷⁸⁹")
        exponent = str(int(exponent)).translate(sup)
        text = f"{mantissa}×10{exponent}"
    return f"{text} GB"


def _summary_trace(totals) -> str:
    return ("Training Memory: "
            f"weights={format_gb(totals[WEIGHTS])}, gradients={format_gb(totals[GRADIENTS])}, "
            f"optimizer={format_gb(totals[OPTIMIZER_STATE])}, activations={format_gb(totals[ACTIVATIONS])}, "
            f"buffers={format_gb(totals[COMMUNICATION_BUFFERS])}.")
