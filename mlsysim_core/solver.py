"""The solver: one fixed pipeline, read top to bottom.

    1. check     (inputs.py) the inputs become a frozen ``TrainingPlan``; the profile's ``prepare``
    2. select    one spec per role (optimizer, strategy, a rule per axis) and the component plugins
    3. place     the rules' integer factors multiply into a ``Placement``; per rank if ranks differ
    4. collect   terms per component, from the selected specs and the component hooks
    5. combine   the profile's rule ("sum", or "peak" over the phases) -> result

Terms are ordered by (source, label) before they are added: pluggy's order never decides a number.
"""

from __future__ import annotations

import operator
import types
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs

from . import _checks
from .errors import InvalidInputTypeError, NotModelledError, PluginError
from .hookspecs import COMPONENT_HOOKS
from .inputs import call_plugin as _call, check_plan, profile_plan
from .manager import PluginManager, get_plugin_manager
from .memo import kinds, memoize
from .plan import FrozenMap, Placement, TrainingPlan
from .registry import CHECKPOINTING, OPTIMIZER, PROFILE, SHARDING, PluginInfo, Registry
from .result import RankReport, TrainingMemoryResult
from .specs import _SHARD_FIELDS, AXES, DATA, ShardingEffect, SplitSoFar, _shard_factors, declared
from .terms import (ACCELERATOR, COMMUNICATION_BUFFERS, COMPONENTS, HOST, OPTIMIZER_STATE, ACTIVATIONS,
                    PHASES, RUNTIME_OVERHEADS, WEIGHTS, GRADIENTS, MemoryTerm, _source_cell)

DEFAULT_PROFILE = "reference"
_EMPTY = FrozenMap()


class TrainingMemoryModel:
    """How much memory one accelerator needs to train a model, and whether it fits."""

    def __init__(self, profile: str = DEFAULT_PROFILE, *, plugin_manager: PluginManager | None = None):
        if plugin_manager is not None and not isinstance(plugin_manager, PluginManager):
            raise InvalidInputTypeError("plugin_manager", plugin_manager,
                                        "a mlsysim_core.manager.PluginManager, or None for the installed plugins",
                                        f"got {type(plugin_manager).__name__}")
        if not isinstance(profile, str):
            raise InvalidInputTypeError("profile", profile, "a profile name, e.g. 'reference' or 'measured'",
                                        f"got {type(profile).__name__}")
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
              communication_buffer_fraction=0.05, *, sequence_parallel: bool | None = None,
              data_parallel: str | None = None, sharding_rules: Mapping[str, str] | None = None,
              plugin_options: Mapping[str, Any] | None = None,
              include_plugins: Sequence[str] = (), profile: str | None = None, cp_size: int = 1,
              **profile_options) -> TrainingMemoryResult:
        """The memory of one accelerator (every parameter: docs/api.md)."""
        if type(model) is str or type(hardware) is str:   # catalog names, with this manager's plugins' entries
            from .catalog import get_hardware, get_model
            model = get_model(model, plugin_manager=self.plugin_manager) if type(model) is str else model
            hardware = get_hardware(hardware, plugin_manager=self.plugin_manager) if type(hardware) is str else hardware
        return _solve(self.registry, self._profile if profile is None else profile, model, hardware, batch_size,
                      seq_len, precision, optimizer, activation_checkpointing, tp_size, pp_size, dp_size, ep_size,
                      zero_stage, gradient_accumulation_steps, trainable_fraction, communication_buffer_fraction,
                      sequence_parallel, data_parallel, sharding_rules, plugin_options,
                      tuple(include_plugins) if type(include_plugins) is list else include_plugins, cp_size,
                      tuple((name, value, kinds(value)) for name, value in profile_options.items())
                      if profile_options else ())


@memoize
def _solve(registry: Registry, profile, model, hardware, *args) -> TrainingMemoryResult:
    """The whole pipeline for one set of inputs (the memo's key is every one of them)."""
    *args, profile_options = args
    plan = check_plan(registry, profile, model, hardware, *args)
    return solve_plan(registry, plan, {name: value for name, value, _ in profile_options})


def solve_plan(registry: Registry, plan: TrainingPlan, profile_options: Mapping[str, Any], *,
               total_only: bool = False) -> TrainingMemoryResult | int | float:
    """Steps 1 (the profile's part) to 5 for a checked plan; ``total_only``: the heaviest rank's total."""
    spec = registry.profiles[plan.profile]
    plan = profile_plan(registry, spec, plan, profile_options)
    selection = _selection(registry, plan.profile, plan.include_plugins, plan.optimizer,   # (a rank: the same)
                           plan.activation_checkpointing, plan.rules)
    token = _source_cell.set([""])     # the terms a plugin makes are stamped with its name
    try:
        # ranks(plan, placement): the rules place the layout once; each rank is a stage of it.
        placed = _place(selection, plan) if spec.ranks is not None and _positional(spec.ranks) >= 2 else None
        ranks = None if spec.ranks is None else spec.ranks(plan, placed[0]) if placed else spec.ranks(plan)
        if not ranks:
            return run_pipeline(selection, plan, total_only, placed)
        if total_only:
            return max(run_pipeline(selection, plan.evolve(rank=rank), True, placed) for rank in ranks)
        return _heaviest([(rank, run_pipeline(selection, plan.evolve(rank=rank), False, placed)) for rank in ranks])
    finally:
        _source_cell.reset(token)


# --- 2. select -----------------------------------------------------------------------------
@attrs.frozen
class _Selection:
    """What one combination of specs and plugins calls: (provider, callable, name) per role."""
    profile: Any
    optimizer: tuple
    checkpointing: tuple
    rules: tuple                   # (axis, name, provider, apply, takes SplitSoFar, its own buffers, call site)
    buffers: tuple                 # the rules' own buffers (ProfileSpec.callables): (provider, function, name, site)
    calls: Mapping[str, tuple]     # component -> ((provider, function, argument picker, call site), ...)
    selected: Mapping[str, str]
    plugin_sources: Mapping[str, str]


@memoize
def _selection(registry: Registry, profile: str, include: tuple, optimizer: str, checkpointing: str,
               rules: FrozenMap) -> _Selection:
    spec = registry.profiles[profile]
    missing = sorted(n for n in spec.component_plugins if n not in registry.plugins)
    if missing:
        info = registry.providers[(PROFILE, profile)]
        raise PluginError(f"profile '{profile}' ({info.source}) needs plugin(s) {', '.join(missing)}, which are not "
                          "loaded (blocked or uninstalled?); unblock them or choose another profile",
                          plugin=info.name, source=info.source, hook="mlsysim_profiles")
    callables = spec.callables      # which callable of each spec the profile calls (it declares them)
    chosen = []
    for kind, name, parameter, table, field in (
            (OPTIMIZER, optimizer, "optimizer", registry.optimizers, callables["optimizer"]),
            (CHECKPOINTING, checkpointing, "activation_checkpointing", registry.checkpointing,
             callables["checkpointing"])):
        function = declared(table[name], field)
        if function is None:
            usable = sorted(n for n, s in table.items() if declared(s, field) is not None)
            raise NotModelledError(parameter, name, f"one with a {field} callable under profile {profile!r}: "
                                   f"{', '.join(usable)}", f"{registry.providers[(kind, name)].describe()} gives "
                                   f"no {field}; profile='reference' accepts it")
        chosen.append((registry.providers[(kind, name)], function, f"{kind} '{name}' {field}"))
    own = callables["sharding"]      # a rule's own buffers' callable, if the profile calls one
    rule_calls = tuple((axis, s.name, registry.providers[(SHARDING, s.name)], s.apply, _positional(s.apply) >= 3,
                        declared(s, own) if own else None, f"sharding rule '{s.name}' apply")
                       for axis, s in ((axis, registry.sharding_rules[rules[axis]]) for axis in AXES))
    wanted = set(spec.component_plugins) | set(include)
    calls = {component: tuple((i.plugin, i.function, _arguments(i.argnames), f"hook {hook}")
                              for i in registry.component_impls[hook] if i.plugin.name in wanted)
             for component, hook in COMPONENT_HOOKS.items()}
    infos = [chosen[0][0], chosen[1][0], *(rule[2] for rule in rule_calls),
             *(call[0] for component_calls in calls.values() for call in component_calls)]
    return _Selection(
        profile=spec, optimizer=chosen[0], checkpointing=chosen[1], rules=rule_calls, calls=calls,
        buffers=tuple((info, buffers, name, f"sharding rule '{name}' {own}")
                      for _, name, info, _, _, buffers, _ in rule_calls if buffers is not None),
        selected=types.MappingProxyType({"profile": profile, "optimizer": optimizer,
                                         "activation_checkpointing": checkpointing,
                                         **{f"{axis}_rule": rules[axis] for axis in AXES}}),
        plugin_sources=types.MappingProxyType(dict(sorted((i.name, i.source) for i in infos))))


def _arguments(argnames: tuple) -> Callable:
    """A hook's arguments picked by name from (plan, placement, the component's third argument)."""
    index = tuple({"plan": 0, "placement": 1}.get(a, 2) for a in argnames)
    if len(index) >= 2:
        return operator.itemgetter(*index)      # a tuple, in C
    return (lambda values: (values[index[0]],)) if index else (lambda values: ())


@memoize     # (an unhashable callable object is counted on every call)
def _positional(function) -> int:
    """How many positional arguments ``function`` takes (many for ``*args``; 0 if unreadable)."""
    import inspect
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return 0
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return 1 << 30
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)


# --- 3. place ------------------------------------------------------------------------------
_NOTE_ORDER = (DATA, "tp", "cp", "pp", "ep")
_UNSPLIT = (1,) * len(_SHARD_FIELDS)


def _place(selection: _Selection, plan: TrainingPlan) -> tuple[Placement, list, tuple]:
    """Every selected rule in axis order, each seeing what the earlier ones split; integer factors."""
    shards = dict.fromkeys(_SHARD_FIELDS, 1)
    split_by = dict.fromkeys(_SHARD_FIELDS, ())
    layers_per_stage = layers_rule = split = None
    buffers, notes = [], {}
    for axis, name, info, apply, takes_split, own_buffers, where in selection.rules:
        option = plan.options.get(name)
        if takes_split:
            if split is None:      # (what the rules before did: the same object until one splits something)
                split = SplitSoFar(**shards, parameters_per_rank=plan.model.parameters / shards["parameter_shards"],
                                   layers_per_stage=layers_per_stage)
            effect = _call(info, where, "apply", apply, plan, option, split)
        else:
            effect = _call(info, where, "apply", apply, plan, option)
        if type(effect) is not ShardingEffect:
            raise info.error(f"{where} returned {type(effect).__name__}; expected ShardingEffect", "apply")
        factors = _shard_factors(effect)
        if factors != _UNSPLIT:
            split = None
            for field, factor in zip(_SHARD_FIELDS, factors):
                if factor != 1:
                    shards[field] *= factor
                    split_by[field] += (name,)
        if effect.layers_per_stage is not None:
            split = None
            if layers_rule is not None:
                raise info.error(f"sharding rule '{name}' sets layers_per_stage, which the '{layers_rule}' "
                                 "rule already set", "apply")
            layers_rule = name
            layers_per_stage = effect.layers_per_stage
            if type(layers_per_stage) is not int or not 1 <= layers_per_stage <= _checks.MAX_COUNT:   # (no f-string)
                layers_per_stage = _checks.count(f"{name}.layers_per_stage", layers_per_stage)
        if effect.buffer_terms and own_buffers is None:    # (a rule's own buffers replace them: selection.buffers)
            buffers += _checked(info, where, "apply", effect.buffer_terms, COMMUNICATION_BUFFERS)
        if effect.notes:
            notes[axis] = effect.notes
    parameters_per_rank = plan.model.parameters / shards["parameter_shards"]
    placement = Placement(**shards, parameters_per_rank=parameters_per_rank,
                          trainable_parameters_per_rank=parameters_per_rank * plan.trainable_fraction,
                          layers_per_stage=layers_per_stage if layers_per_stage is not None else plan.model.layers,
                          shard_sources=FrozenMap(split_by))
    return placement, buffers, tuple(n for axis in _NOTE_ORDER for n in notes.get(axis, ()))


# --- 4. collect ----------------------------------------------------------------------------
def _checked(info: PluginInfo, where: str, hook: str, items, component: str) -> list[MemoryTerm]:
    """What a plugin returned, as a new list of ``component`` terms stamped with its name."""
    if type(items) is not list and type(items) is not tuple:
        if items is None:
            return []
        if isinstance(items, (str, bytes, MemoryTerm)) or not isinstance(items, Iterable):
            raise info.error(f"{where} returned {type(items).__name__}; expected a list of MemoryTerm", hook)
        items = _call(info, where, hook, list, items)      # a generator runs plugin code here
    terms = []
    for term in items:
        if type(term) is not MemoryTerm and not isinstance(term, MemoryTerm):
            raise info.error(f"{where} returned {type(term).__name__} {term!r}; expected MemoryTerm", hook)
        if term.component != component:
            raise info.error(f"{where} returned a '{term.component}' term ({term.label!r}); expected "
                             f"component '{component}'", hook)
        terms.append(term if term.source == info.name else attrs.evolve(term, source=info.name))
    return terms


def _terms(info, where, hook, component, function, *args) -> list[MemoryTerm]:
    return _checked(info, where, hook, _call(info, where, hook, function, *args), component)


def _hooked(selection: _Selection, component: str, plan, placement, extra=None, terms=None) -> list[MemoryTerm]:
    """``terms`` (a new list) then the terms of one component's hook implementations, sorted in place."""
    terms, hook = [] if terms is None else terms, COMPONENT_HOOKS[component]
    for info, function, pick, where in selection.calls[component]:
        terms += _terms(info, where, hook, component, function, *pick((plan, placement, extra)))
    terms.sort(key=_term_key)     # stably, by (source, label): then the order they came in
    return terms


_term_key = operator.attrgetter("source", "label")


def run_pipeline(selection: _Selection, plan: TrainingPlan, total_only: bool = False,
                 placed: tuple | None = None) -> TrainingMemoryResult:
    """Steps 3-5 for one plan (one rank); ``placed``: the layout's placement, when the ranks were made from it."""
    placement, rule_buffers, notes = placed if placed is not None else _place(selection, plan)
    if plan.rank is not None:      # one rank of a layout whose ranks differ: its own counts
        placement = plan.rank.place(plan, placement)
    weights = _hooked(selection, WEIGHTS, plan, placement)
    gradients = _hooked(selection, GRADIENTS, plan, placement)
    (info, function, where), (ck_info, ck_function, ck_where) = selection.optimizer, selection.checkpointing
    optimizer_state = _hooked(selection, OPTIMIZER_STATE, plan, placement, None, _terms(
        info, where, "state_terms", OPTIMIZER_STATE, function, plan, placement, plan.options.get(plan.optimizer)))
    activations = _hooked(selection, ACTIVATIONS, plan, placement, None, _terms(
        ck_info, ck_where, "activation_terms", ACTIVATIONS, ck_function, plan, placement,
        plan.options.get(plan.activation_checkpointing)))
    if selection.profile.relocate is not None:     # e.g. offload to host memory
        weights, gradients, optimizer_state = selection.profile.relocate(plan, weights, gradients, optimizer_state)
    buffers = list(rule_buffers)
    for info, function, name, where in selection.buffers:      # a rule's own buffers replace its effect's
        buffers += _terms(info, where, "buffer_terms", COMMUNICATION_BUFFERS, function, plan, placement,
                          plan.options.get(name))
    model_states = {WEIGHTS: _bytes_on(ACCELERATOR, weights), GRADIENTS: _bytes_on(ACCELERATOR, gradients),
                    OPTIMIZER_STATE: _bytes_on(ACCELERATOR, optimizer_state)}
    buffers = _hooked(selection, COMMUNICATION_BUFFERS, plan, placement, model_states, buffers)
    terms = (*weights, *gradients, *optimizer_state, *activations, *buffers)
    peak = selection.profile.combine == "peak"
    phase, alive, table = _combine(terms, peak)
    runtime = _hooked(selection, RUNTIME_OVERHEADS, plan, placement, sum(alive))
    if runtime:
        terms = (*terms, *runtime)
        phase, alive, _ = _combine(runtime, peak, table)     # (added after the others, as if combined anew)
    w, g, o, a, c, r = alive
    total = w + g + o + a + c      # the reference adds the five components left to right, in float64
    if r:
        total += r
    if total_only:
        return total
    capacity = plan.hardware.memory_capacity
    parallelism = {"dp": plan.dp_size, "tp": plan.tp_size, "pp": plan.pp_size, "ep": plan.ep_size}
    if plan.cp_size != 1:
        parallelism["cp"] = plan.cp_size
    return TrainingMemoryResult(
        feasible=total * 1e-9 <= capacity * 1e-9, total_memory=total, available_memory=capacity,
        memory_utilization=(total * 1e-9) / (capacity * 1e-9),      # in GB, exactly as the reference
        weights=w, gradients=g, optimizer_state=o, activations=a, communication_buffers=c,
        precision=plan.precision, optimizer=plan.optimizer, activation_checkpointing=plan.activation_checkpointing,
        parallelism=types.MappingProxyType(parallelism), notes=plan.notes + notes,
        profile=plan.profile, terms=terms, host_memory=_bytes_on(HOST, terms), model=plan.model.name,
        hardware=plan.hardware.name, microbatch=plan.microbatch, layers_per_stage=placement.layers_per_stage,
        sequence_parallel=plan.sequence_parallel, selected=selection.selected, peak_phase=phase,
        plugin_sources=selection.plugin_sources, runtime_overheads=r,
        details=_EMPTY if (details := selection.profile.details) is None else FrozenMap(details(plan)))


def _bytes_on(tier: str, terms) -> int | float:
    total = 0
    for term in terms:
        if term.tier == tier:      # (NVMe-tier terms are neither accelerator nor host memory)
            total += term.nbytes
    return total


# --- 5. combine ----------------------------------------------------------------------------
_COMPONENT_INDEX = {component: i for i, component in enumerate(COMPONENTS)}
_PHASE_INDEX = {phase: i for i, phase in enumerate(PHASES)}
_PHASE_ROWS = {tuple(PHASES[i] for i in rows): rows for rows in (     # a term's phases, in order -> table rows
    tuple(i for i in range(len(PHASES)) if m >> i & 1) for m in range(1, 1 << len(PHASES)))}


def _combine(terms, peak: bool, table=None) -> tuple[str | None, list, list]:
    """Accelerator bytes per component: of every term ("sum"), or of the phase with most alive ("peak")."""
    if not peak:
        alive = [0] * len(COMPONENTS) if table is None else table
        for term in terms:
            if term.tier == ACCELERATOR:
                alive[_COMPONENT_INDEX[term.component]] += term.nbytes
        return None, alive, alive
    table, rows_of, component_index = [[0] * len(COMPONENTS) for _ in PHASES] if table is None else table, \
        _PHASE_ROWS.get, _COMPONENT_INDEX
    for term in terms:
        if term.tier == ACCELERATOR:
            i, nbytes = component_index[term.component], term.nbytes
            for p in rows_of(term.phases) or [_PHASE_INDEX[phase] for phase in term.phases]:
                table[p][i] += nbytes
    best = (sums := [sum(row) for row in table]).index(max(sums))     # the first phase with the most alive
    return PHASES[best], list(table[best]), table


def _heaviest(results: list) -> TrainingMemoryResult:
    """Every rank's report, the heaviest rank's totals; feasible only if every rank fits."""
    reports = tuple(RankReport(
        name=rank.name, stages=rank.stages, ranks=rank.ranks, layers=rank.layers, in_flight=rank.in_flight,
        total_memory=r.total_memory, weights=r.weights, gradients=r.gradients, optimizer_state=r.optimizer_state,
        activations=r.activations, communication_buffers=r.communication_buffers,
        runtime_overheads=r.runtime_overheads, host_memory=r.host_memory, peak_phase=r.peak_phase,
        feasible=r.feasible, terms=r.terms) for rank, r in results)
    index = max(range(len(results)), key=lambda i: (results[i][1].total_memory, -i))
    heaviest = results[index][1]      # (made by this solve, seen by nobody yet: completed in place, no evolve)
    for field, value in ("ranks", reports), ("heaviest_rank", reports[index].name), ("feasible", all(
            r.feasible for r in reports)):
        object.__setattr__(heaviest, field, value)
    return heaviest
