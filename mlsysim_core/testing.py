"""The conformance kit: check that a plugin keeps the plugin contract.

Use it from a plugin package's own tests, against the plugin as pip installed it::

    from mlsysim_core.testing import assert_plugin_conforms

    def test_conforms():
        assert_plugin_conforms("myorg_lion")          # the entry-point name

It loads every installed plugin the way the tool does, finds what the named plugin
provides, selects each of its specs by name in a handful of solves (dense and
mixture-of-experts models, several layouts) under the default profile and under every
measured-grade profile its specs support, and checks:

* it was loaded through an entry point, with a distribution and version (provenance);
* every spec it registers is a valid spec type with a valid name;
* every term is a ``MemoryTerm`` with finite, non-negative bytes, stamped with the plugin;
* solving twice, and with plugins registered in reverse order, gives byte-identical JSON;
* when none of its specs is selected (and it is not included), it changes no number;
* its options round-trip through a scenario file (JSON) to the same result;
* a checkpointing strategy that declares ``recomputes="layers"`` honours the block option of
  a measured-grade profile that has one (``checkpointed_layers=0``, every layer kept, changes
  its terms), as the profile's physics then assumes;
* an item of a profile's own hook that can check itself (``conformance_failures(models)``) passes
  on every catalog model: a measured architecture family's descriptions of the parameters of each
  model it claims agree (its layer weights, parameter tensors, matrix shapes and count);
* an item that declares the values it offers (a measured technique: ``ladder_keyword`` and
  ``candidates_in(registry)``) is solved with each value, under the profile whose hook it is;
* a launch-format reader (an item with ``recognizes`` and ``read``) says "not mine" without raising
  to documents of other shapes, and reads the files its layouts name (``{"launch": PATH}``, with
  ``from_launch``'s keywords beside it: ``gpus``, ``seq_len``, ...) into scenarios it recognizes and
  that solve, as ``mlsysim-core estimate --from PATH`` does.

``layouts`` overrides the solve arguments tried per kind (e.g. a rule that needs dp_size
divisible by 8, a family's model); ``options`` gives plugin options per spec name.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from .errors import MlsysimError, NotModelledError
from .manager import PluginManager
from .registry import CHECKPOINTING, OPTIMIZER, PROFILE, SHARDING
from .scenario import Scenario, option_fields
from .solver import TrainingMemoryModel
from .specs import SPEC_CALLABLES, CheckpointingSpec, OptimizerSpec, ProfileSpec, ShardingRuleSpec, declared
from .terms import MemoryTerm

DENSE = "llama3-8b"
MOE = "mixtral-8x7b"
BASE = {"hardware": "h100", "batch_size": 16, "seq_len": 1024}

# Default layouts tried for each kind of spec; "{name}" is replaced by the spec's name.
DEFAULT_LAYOUTS = {
    OPTIMIZER: [{"model": DENSE, "optimizer": "{name}"},
                {"model": DENSE, "optimizer": "{name}", "dp_size": 8, "zero_stage": 1},
                {"model": MOE, "optimizer": "{name}", "tp_size": 2, "pp_size": 2, "ep_size": 4,
                 "dp_size": 4, "zero_stage": 3}],
    CHECKPOINTING: [{"model": DENSE, "activation_checkpointing": "{name}"},
                    {"model": MOE, "activation_checkpointing": "{name}", "tp_size": 4, "pp_size": 4,
                     "ep_size": 2, "dp_size": 2}],
    "dp": [{"model": DENSE, "dp_size": 8, "data_parallel": "{name}"},
           {"model": DENSE, "dp_size": 64, "tp_size": 2, "batch_size": 128, "data_parallel": "{name}"}],
    "tp": [{"model": DENSE, "tp_size": 4, "sharding_rules": {"tp": "{name}"}}],
    "pp": [{"model": DENSE, "pp_size": 4, "sharding_rules": {"pp": "{name}"}}],
    "ep": [{"model": MOE, "ep_size": 4, "dp_size": 4, "sharding_rules": {"ep": "{name}"}}],
    PROFILE: [{"model": DENSE, "profile": "{name}"}],
    # The measured profile's own hooks (an architecture family needs a model it claims: give it).
    "mlsysim_measured_regimes": [{"model": DENSE, "profile": "measured", "regime": "{name}"}],
    "mlsysim_measured_attention_kernels": [{"model": DENSE, "profile": "measured", "attention": "{name}"}],
    "mlsysim_measured_pipeline_schedules": [{"model": DENSE, "profile": "measured", "pp_size": 4,
                                             "gradient_accumulation_steps": 4, "pipeline_schedule": "{name}"}],
    "component": [{"model": DENSE, "include_plugins": ["{name}"]},
                  {"model": MOE, "include_plugins": ["{name}"], "tp_size": 2, "ep_size": 2,
                   "dp_size": 4, "zero_stage": 2}],
}

_CALLABLE_KIND = {OPTIMIZER: "optimizer", CHECKPOINTING: "checkpointing"}   # (ProfileSpec.callables' keys)
_SPEC_TYPES = {OPTIMIZER: OptimizerSpec, CHECKPOINTING: CheckpointingSpec, SHARDING: ShardingRuleSpec,
               PROFILE: ProfileSpec}


class ConformanceError(AssertionError):
    """A plugin broke the contract; the message lists every failed check."""


@attrs.frozen
class ConformanceReport:
    plugin: str
    source: str
    provides: Mapping[str, tuple[str, ...]]
    solves: int
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures


def _fill(value, name):
    if isinstance(value, (list, dict)):
        return [_fill(v, name) for v in value] if isinstance(value, list) else {k: _fill(v, name) for k, v in value.items()}
    return value.replace("{name}", name) if isinstance(value, str) else value


def _scenario(layout: dict, options: Mapping[str, Any], fields=None) -> Scenario:
    data = {**BASE, **layout}
    selected = {data.get("optimizer", "adam"), data.get("activation_checkpointing", "selective"),
                data.get("data_parallel") or f"zero{data.get('zero_stage', 0)}",
                *data.get("sharding_rules", {}).values()}
    opts = {k: v for k, v in options.items() if k in selected}
    if opts:
        data["plugin_options"] = {k: (attrs.asdict(v) if attrs.has(type(v)) else dict(v)) for k, v in opts.items()}
    return Scenario.from_dict(data, options=fields)


def _reversed_manager(pm: PluginManager, leave_out: str = "") -> PluginManager:
    fresh = PluginManager()
    for name in sorted((n for n in pm.registry.plugins if n != leave_out), reverse=True):
        fresh.register(pm.get_plugin(name), name=name, info=pm.info(name))
    return fresh


def check_plugin(plugin: str, *, layouts: Mapping[str, Sequence[dict]] | None = None,
                 options: Mapping[str, Any] | None = None,
                 plugin_manager: PluginManager | None = None,
                 allow_direct_registration: bool = False) -> ConformanceReport:
    """Run every check on one plugin; return a report (``assert_plugin_conforms`` raises)."""
    pm = plugin_manager or PluginManager.from_environment()
    registry = pm.registry
    failures: list[str] = []
    if plugin not in registry.plugins:
        raise ConformanceError(f"plugin {plugin!r} is not loaded; loaded: {', '.join(sorted(registry.plugins))}")
    info = registry.plugins[plugin]
    if not allow_direct_registration and (info.distribution in ("unknown", "registered directly") or not info.version):
        failures.append(f"provenance: {plugin!r} has no distribution/version ({info.source!r}); "
                        "declare it as an entry point in the 'mlsysim_core' group")
    provides: dict[str, list[str]] = {}
    tables = {OPTIMIZER: registry.optimizers, CHECKPOINTING: registry.checkpointing,
              SHARDING: registry.sharding_rules, PROFILE: registry.profiles, **registry.extensions}
    for (kind, name), provider in registry.providers.items():
        if provider.name == plugin:
            provides.setdefault(kind, []).append(name)
            spec = tables[kind][name]      # (a profile's own hooks' items are that profile's to check)
            if kind in _SPEC_TYPES and not isinstance(spec, _SPEC_TYPES[kind]):
                failures.append(f"{kind} {name!r}: {type(spec).__name__} is not a {_SPEC_TYPES[kind].__name__}")
            if spec.__class__ is not ProfileSpec and getattr(spec, "options_type", None) is not None:
                try:
                    spec.options_type()
                except Exception as err:   # options need defaults so a bare selection works
                    failures.append(f"{kind} {name!r}: options_type() without arguments fails: {err}")
    component_hooks = sorted(impl_hook for impl_hook, impls in registry.component_impls.items()
                             if any(i.plugin.name == plugin for i in impls))
    if not provides and not component_hooks:
        failures.append(f"{plugin!r} provides no spec and implements no component hook")

    layouts = {**DEFAULT_LAYOUTS, **(layouts or {})}
    options = dict(options or {})
    cases: list[tuple[str, dict]] = []
    # the profiles that call callables of their own (ProfileSpec.callables, e.g. the measured one's measured.*)
    measured = sorted(p.name for p in registry.profiles.values() if p.callables != SPEC_CALLABLES)
    for kind, names in provides.items():
        for name in sorted(names):
            key = registry.sharding_rules[name].axis if kind == SHARDING else kind
            item = tables[kind][name]
            if _is_reader(item):      # a launch format: its files, read and solved below
                reader_failures, reader_cases = _reader_cases(kind, name, item, layouts.get(key), registry)
                failures += reader_failures
                cases += reader_cases
                continue
            if key not in layouts and _offers(item):
                layouts[key] = _offered_layouts(kind, item, registry)
            # Rules work under every profile; an optimizer or strategy under such a profile if it has its callable.
            graded = measured if kind == SHARDING else [
                p for p in measured if kind in _CALLABLE_KIND
                and declared(tables[kind][name], registry.profiles[p].callables[_CALLABLE_KIND[kind]]) is not None]
            if key not in layouts:
                failures.append(f"{kind} {name!r}: no layout to solve it in; give layouts={{{key!r}: [...]}}")
            for layout in (_fill(x, name) for x in layouts.get(key, ())):   # default profile, then measured ones
                cases += [(f"{kind} {name!r}" + (f" under {p!r}" if p else ""),
                           {**layout, "profile": p or layout.get("profile")})
                          for p in (None, *graded) if "profile" not in layout or not p]
    if component_hooks:
        # A plugin a profile runs is checked under that profile (including it there would
        # count its terms twice, and solve refuses that); any other plugin is included.
        running = sorted(p.name for p in registry.profiles.values() if plugin in p.component_plugins)
        for layout in layouts["component"]:
            layout = _fill(layout, plugin)
            if running and layout.get("include_plugins") == [plugin]:
                layout = {**{k: v for k, v in layout.items() if k != "include_plugins"}, "profile": running[0]}
            cases.append(("component hooks", layout))

    solver = TrainingMemoryModel(plugin_manager=pm)
    reversed_solver = TrainingMemoryModel(plugin_manager=_reversed_manager(pm))
    blocked_solver = TrainingMemoryModel(plugin_manager=_reversed_manager(pm, leave_out=plugin))
    solves = 0
    for what, layout in cases:
        label = f"{what} with {json.dumps(layout, sort_keys=True, default=str)}"
        try:
            scenario = (layout["scenario"] if "scenario" in layout else   # the profiles' options of this manager's world
                        _scenario({k: v for k, v in layout.items() if v is not None or k != "profile"}, options,
                                  option_fields(registry)))
            result = scenario.solve(solver)
            solves += 1
        except Exception as err:
            if isinstance(err, NotModelledError) and layout.get("profile"):
                continue     # a measured-grade profile refusing a layout by name is allowed; erring is not
            failures.append(f"{label}: solve failed: {type(err).__name__}: {err}")
            continue
        for term in result.terms:
            if not isinstance(term, MemoryTerm) or not math.isfinite(term.nbytes) or term.nbytes < 0:
                failures.append(f"{label}: bad term {term!r}")
            if not term.source or term.source not in result.plugin_sources:
                failures.append(f"{label}: term {term.label!r} has no provenance")
        if _unmemoised(lambda: scenario.solve(solver).to_json()) != result.to_json():
            failures.append(f"{label}: not deterministic (two solves differ)")
        if scenario.solve(reversed_solver).to_json() != result.to_json():
            failures.append(f"{label}: result depends on plugin registration order")
        if scenario.plugin_options:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "scenario.json"
                scenario.dump(path)
                again = Scenario.load(path, options=option_fields(registry))
            if again != scenario or again.solve(solver).to_json() != result.to_json():
                failures.append(f"{label}: options do not round-trip through a scenario file")
    failures += _declared_checkpointing(plugin, provides.get(CHECKPOINTING, ()), registry, solver, measured)
    failures += _self_checks(provides, tables, pm)
    # Unselected, the plugin must not change a number.
    for layout in ({**BASE, "model": DENSE, "dp_size": 8, "zero_stage": 2},
                   {**BASE, "model": MOE, "tp_size": 2, "pp_size": 2, "ep_size": 2, "dp_size": 2}):
        scenario = Scenario.from_dict(layout)
        with_plugin = scenario.solve(solver)
        try:
            without = scenario.solve(blocked_solver)
        except MlsysimError:
            continue   # this layout needs the plugin (a default spec or a profile's plugin)
        if with_plugin.terms != without.terms or with_plugin.total_memory != without.total_memory:
            failures.append(f"{plugin!r} changes numbers while none of its specs is selected "
                            f"({json.dumps(layout, sort_keys=True)})")
    return ConformanceReport(plugin=plugin, source=info.source,
                             provides={k: tuple(sorted(v)) for k, v in provides.items()},
                             solves=solves, failures=tuple(failures))


def _offers(item) -> bool:
    return callable(getattr(item, "candidates_in", None)) and bool(getattr(item, "ladder_keyword", None))


def _offered_layouts(kind, item, registry) -> list[dict]:
    """One solve per value the item offers (its ``ladder_keyword`` set to each of its
    ``candidates_in(registry)``), under the profiles whose registration hooks collect ``kind``."""
    profiles = sorted(p.name for p in registry.profiles.values() if kind in p.registration_hooks)
    return [{"model": DENSE, "profile": profile, item.ladder_keyword: candidate.value}
            for profile in profiles for candidate in item.candidates_in(registry)]


def _is_reader(item) -> bool:
    return callable(getattr(item, "recognizes", None)) and callable(getattr(item, "read", None))


# Documents of other shapes than any one format's: a reader must say "not mine" to each, never raise.
FOREIGN_DOCUMENTS = ({}, [], "", "--model llama3-8b", 0, None, {"model": DENSE}, {"optimizer": {"lr": 1e-4}}, [{}])


def _reader_cases(kind, name, reader, files, registry) -> tuple[list[str], list[tuple[str, dict]]]:
    """A launch-format reader's checks: ``recognizes`` of foreign documents, then each of its
    ``files`` (``{"launch": PATH, **from_launch keywords}``) read by it into a scenario to solve."""
    from .scenario import from_launch
    failures, cases = [], []
    for document in FOREIGN_DOCUMENTS:
        try:
            said = reader.recognizes(Path("conformance.yaml"), document)
        except Exception as err:
            failures.append(f"{kind} {name!r}: recognizes() raised {type(err).__name__} on a document of another "
                            f"format ({document!r}): {err}; it must return False")
            continue
        if not isinstance(said, bool):
            failures.append(f"{kind} {name!r}: recognizes() returned {said!r} for {document!r}; expected a bool")
    if not files:
        failures.append(f"{kind} {name!r}: no file to read; give layouts={{{kind!r}: [{{'launch': 'PATH', "
                        "'seq_len': 2048}]} (a launch file of this format, and from_launch's keywords: gpus, seq_len, "
                        "...)")
        return failures, cases
    for given in files:
        given = dict(given)
        path = given.pop("launch", None)
        if path is None:
            failures.append(f"{kind} {name!r}: layout {given!r} names no 'launch' file")
            continue
        try:
            launch = from_launch([path], registry=registry, **given)
        except Exception as err:
            failures.append(f"{kind} {name!r}: reading {str(path)!r} failed: {type(err).__name__}: {err}")
            continue
        formats = [r.format for r in launch.readings]
        if formats != [name]:
            failures.append(f"{kind} {name!r}: {str(path)!r} was read as {formats}, not by this format")
            continue
        cases.append((f"{kind} {name!r} reading {str(path)!r}", {"scenario": launch.scenario}))
    return failures, cases


def _self_checks(provides, tables, pm) -> list[str]:
    """What the plugin's registered items say about themselves against the catalog: an item of a
    profile's own hook that has ``conformance_failures(models)`` (a measured architecture family: its
    descriptions of each catalog model it claims agree) is asked with every catalog model."""
    failures, models = [], None
    for kind, names in provides.items():
        for name in names:
            check = getattr(tables[kind][name], "conformance_failures", None)
            if not callable(check):
                continue
            if models is None:
                from .catalog import list_models
                models = [entry.value for entry in list_models(plugin_manager=pm)]
            failures += [f"{kind} {name!r} {found}" for found in check(models)]
    return failures


def _declared_checkpointing(plugin, names, registry, solver, measured) -> list[str]:
    """A strategy declaring whole-layer recompute must honour a profile's ``checkpointed_layers``
    (the profile reads the declaration: it accepts the option and adds what follows from it)."""
    failures = []
    for name in sorted(names):
        spec = registry.checkpointing[name]
        if spec.recomputes != "layers":
            continue
        for profile in measured:
            if declared(spec, registry.profiles[profile].callables["checkpointing"]) is None:
                continue
            options = registry.profiles[profile].options_type
            if options is None or "checkpointed_layers" not in attrs.fields_dict(options):
                continue
            own = []
            for blocks in (None, 0):
                try:
                    result = solver.solve(DENSE, BASE["hardware"], BASE["batch_size"], BASE["seq_len"], profile=profile,
                                          activation_checkpointing=name, checkpointed_layers=blocks)
                except NotModelledError:
                    break
                own.append(sorted(t.nbytes for t in result.terms if t.source == plugin))
            if len(own) == 2 and own[0] == own[1]:
                failures.append(f"checkpointing {name!r} under {profile!r} declares recomputes='layers' but "
                                "checkpointed_layers=0 (every layer kept) changes none of its terms: honour "
                                "plan.profile_options.checkpointed_layers, or declare recomputes='part'")
    return failures


def assert_plugin_conforms(plugin: str, **kwargs) -> ConformanceReport:
    """``check_plugin``, raising ``ConformanceError`` listing every failure."""
    report = check_plugin(plugin, **kwargs)
    if report.failures:
        raise ConformanceError(f"plugin {plugin!r} ({report.source}) fails {len(report.failures)} "
                               "check(s):\n- " + "\n- ".join(report.failures))
    return report


def _unmemoised(run):
    """``run()`` with ``mlsysim_core.memo`` off: a solve that really runs the plugins again."""
    from . import memo
    memo.set_enabled(False)
    try:
        return run()
    finally:
        memo.set_enabled(True)
