"""Plugin loading, done deterministically and loudly.

Built-in plugins and third-party plugins share one path: the ``mlsysim_core`` entry-point
group. Entry points are loaded sorted by name; a duplicate name, an import failure, an
unknown hook, a wrong return type or a name claimed twice raises an error that names the
plugin, its distribution and the hook. Users can block a broken plugin
(``MLSYSIM_DISABLED_PLUGINS=a,b``) or skip every third-party plugin
(``MLSYSIM_DISABLE_PLUGIN_AUTOLOAD=1``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import os
import re
from collections import defaultdict
from typing import Iterable

import pluggy

from . import hookspecs
from .errors import NotInstalledError, PluginConflictError, PluginContractError, PluginLoadError
from .registry import (CHECKPOINTING, OPTIMIZER, PROFILE, SHARDING, ComponentImpl, PluginInfo,
                       Registry)
from .specs import AXES, CheckpointingSpec, OptimizerSpec, ProfileSpec, ShardingRuleSpec

ENTRY_POINT_GROUP = "mlsysim_core"
OWN_DISTRIBUTION = "mlsysim-core"
ENV_DISABLE_AUTOLOAD = "MLSYSIM_DISABLE_PLUGIN_AUTOLOAD"
ENV_DISABLED_PLUGINS = "MLSYSIM_DISABLED_PLUGINS"

_REGISTRATION = {
    "mlsysim_optimizers": (OPTIMIZER, OptimizerSpec),
    "mlsysim_checkpointing_strategies": (CHECKPOINTING, CheckpointingSpec),
    "mlsysim_sharding_rules": (SHARDING, ShardingRuleSpec),
    "mlsysim_profiles": (PROFILE, ProfileSpec),
}


def _normalise_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _env_list(value: str | None) -> tuple[str, ...]:
    return tuple(sorted({v.strip() for v in (value or "").split(",") if v.strip()}))


class PluginManager(pluggy.PluginManager):
    """pluggy's manager with mlsysim's loading rules and a frozen registry.

    Build one with ``PluginManager.from_environment()`` (what the tool uses), or
    ``PluginManager()`` and ``register(...)`` plugins yourself (tests, embedding).
    """

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self._info: dict[str, PluginInfo] = {}
        self._registry: Registry | None = None
        self.blocked_names: tuple[str, ...] = ()
        self.skipped_third_party: tuple[PluginInfo, ...] = ()

    # Functions named mlsysim_* count as hook implementations even without the marker, so
    # a misspelled hook name is caught by check_pending() instead of silently ignored.
    def parse_hookimpl_opts(self, plugin, name):
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("mlsysim_"):
            method = getattr(plugin, name, None)
            if inspect.isroutine(method):
                return {}
        return opts

    def register(self, plugin, name: str | None = None, *, info: PluginInfo | None = None):
        try:
            registered = super().register(plugin, name=name)
        except pluggy.PluginValidationError as err:
            label = info.describe() if info else f"plugin '{name}'"
            raise PluginContractError(f"{label}: {err}", plugin=name,
                                      source=info.source if info else None) from err
        if registered is not None:
            pname = self.get_name(plugin)
            self._info[pname] = info or PluginInfo(name=pname, distribution="registered directly")
            self._registry = None
        return registered

    def unregister(self, plugin=None, name=None):
        if name is None and plugin is not None:
            name = self.get_name(plugin)
        out = super().unregister(plugin=plugin, name=name)
        self._info.pop(name, None)
        self._registry = None
        return out

    def info(self, plugin_name: str) -> PluginInfo:
        return self._info.get(plugin_name, PluginInfo(name=plugin_name))

    # --- loading ----------------------------------------------------------------------

    @classmethod
    def from_environment(cls, *, autoload: bool | None = None,
                         blocked: Iterable[str] | None = None) -> "PluginManager":
        """Load every installed plugin as the environment says.

        ``autoload=False`` (or ``MLSYSIM_DISABLE_PLUGIN_AUTOLOAD=1``) loads only the
        built-ins; ``blocked`` (or ``MLSYSIM_DISABLED_PLUGINS=a,b``) skips named plugins.
        """
        if autoload is None:
            autoload = os.environ.get(ENV_DISABLE_AUTOLOAD, "").strip().lower() in ("", "0", "false", "no")
        blocked = tuple(sorted(set(blocked or ()) | set(_env_list(os.environ.get(ENV_DISABLED_PLUGINS)))))
        pm = cls()
        pm.load_entrypoints(third_party=autoload, blocked=blocked)
        return pm

    def load_entrypoints(self, *, third_party: bool = True, blocked: Iterable[str] = (),
                         group: str = ENTRY_POINT_GROUP) -> None:
        entry_points = sorted(importlib.metadata.entry_points(group=group),
                              key=lambda ep: (ep.name, ep.value))
        by_name = defaultdict(list)
        for ep in entry_points:
            by_name[ep.name].append(ep)
        dists: dict = {}     # distribution object -> (name, version): each reads its METADATA once
        if group == ENTRY_POINT_GROUP and not any(
                _normalise_dist(_dist_of(ep, dists)[0]) == OWN_DISTRIBUTION for ep in entry_points if ep.dist):
            raise NotInstalledError(
                f"mlsysim-core is not installed (its entry points in group '{group}' are missing): "
                "run `pip install -e .` in the source tree, or `pip install mlsysim-core`")
        blocked = set(blocked)
        self.blocked_names = tuple(sorted(blocked))
        skipped = []
        for name, eps in by_name.items():
            infos = [_ep_info(ep, dists) for ep in eps]
            if name in blocked:          # blocking is the escape hatch, duplicates included
                self.set_blocked(name)
                continue
            if not third_party:          # only mlsysim-core's own entry points
                own = [(ep, i) for ep, i in zip(eps, infos)
                       if _normalise_dist(i.distribution) == OWN_DISTRIBUTION]
                skipped.extend(i for i in infos if _normalise_dist(i.distribution) != OWN_DISTRIBUTION)
                if not own:
                    continue
                eps, infos = [ep for ep, _ in own], [i for _, i in own]
            if len({(i.distribution, ep.value) for i, ep in zip(infos, eps)}) > 1:
                providers = "; ".join(f"{i.source} -> {ep.value}" for i, ep in zip(infos, eps))
                raise PluginConflictError(
                    f"entry point '{name}' in group '{group}' is declared by more than one "
                    f"plugin: {providers}. Uninstall one, or block the name with "
                    f"{ENV_DISABLED_PLUGINS}={name}", plugin=name, hook="entry point")
            ep, info = eps[0], infos[0]
            try:
                module = ep.load()
            except Exception as err:
                raise PluginLoadError(
                    f"{info.describe()} failed to load from entry point '{name} = {ep.value}': "
                    f"{type(err).__name__}: {err}. To run without it, set "
                    f"{ENV_DISABLED_PLUGINS}={name} (or pass --disable-plugin {name})",
                    plugin=name, source=info.source, hook="entry point") from err
            self.register(module, name=name, info=info)
        self.skipped_third_party = tuple(skipped)
        self.check()

    def check(self) -> None:
        """Fail on hook implementations that match no hook spec (e.g. a misspelled name)."""
        for hook_name in sorted(self.hook.__dict__):
            caller = getattr(self.hook, hook_name)
            if not isinstance(caller, pluggy.HookCaller) or caller.spec is not None:
                continue
            for impl in caller.get_hookimpls():
                info = self.info(impl.plugin_name)
                raise PluginContractError(
                    f"{info.describe()} implements unknown hook '{hook_name}' (a misspelling?). "
                    f"Known hooks: {', '.join(_known_hooks())}",
                    plugin=impl.plugin_name, source=info.source, hook=hook_name)

    # --- the registry -----------------------------------------------------------------

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self.check()
            self._registry = self._build_registry()
        return self._registry

    def _impls(self, hook_name: str):
        """Implementations of a hook, sorted by plugin name (never pluggy's order)."""
        return sorted(getattr(self.hook, hook_name).get_hookimpls(), key=lambda i: i.plugin_name)

    def _build_registry(self) -> Registry:
        tables: dict[str, dict] = {}
        providers: dict[tuple[str, str], PluginInfo] = {}
        for hook_name, (kind, spec_type) in _REGISTRATION.items():
            claims = defaultdict(list)
            for impl in self._impls(hook_name):
                info = self.info(impl.plugin_name)
                items = _call_registration(impl, info, hook_name)
                for item in items:
                    if not isinstance(item, spec_type):
                        raise PluginContractError(
                            f"{info.describe()} hook {hook_name} returned "
                            f"{type(item).__name__} {item!r}; expected {spec_type.__name__}",
                            plugin=info.name, source=info.source, hook=hook_name)
                    claims[item.name].append((item, info))
            table = {}
            for name in sorted(claims):
                entries = claims[name]
                if len(entries) > 1:
                    who = ", ".join(i.describe() for _, i in entries)
                    raise PluginConflictError(
                        f"{kind} '{name}' is provided by more than one plugin: {who}. "
                        f"Uninstall one, or block one with {ENV_DISABLED_PLUGINS}=<plugin>",
                        plugin=entries[1][1].name, source=entries[1][1].source, hook=hook_name)
                table[name], providers[(kind, name)] = entries[0]
            tables[kind] = table

        component_impls = {}
        for hook_name in hookspecs.COMPONENT_HOOKS.values():
            impls = []
            for impl in self._impls(hook_name):
                info = self.info(impl.plugin_name)
                if impl.wrapper or impl.hookwrapper:
                    raise PluginContractError(
                        f"{info.describe()} implements {hook_name} as a wrapper; component hooks "
                        "return terms and cannot be wrappers",
                        plugin=info.name, source=info.source, hook=hook_name)
                impls.append(ComponentImpl(plugin=info, function=impl.function,
                                           argnames=tuple(impl.argnames)))
            component_impls[hook_name] = tuple(impls)

        plugins = {name: self.info(name) for name, plugin in sorted(self.list_name_plugin(),
                                                                     key=lambda pair: pair[0])
                   if plugin is not None}   # blocked names are registered as None
        rules_by_axis = {axis: {n: s for n, s in tables[SHARDING].items() if s.axis == axis} for axis in AXES}
        return Registry(optimizers=tables[OPTIMIZER], checkpointing=tables[CHECKPOINTING],
                        sharding_rules=tables[SHARDING], profiles=tables[PROFILE],
                        providers=providers, component_impls=component_impls, plugins=plugins,
                        rules_by_axis=rules_by_axis)


def _known_hooks() -> list[str]:
    return (sorted(hookspecs.REGISTRATION_HOOKS) + sorted(hookspecs.CATALOG_HOOKS.values())
            + sorted(hookspecs.COMPONENT_HOOKS.values()))


def _dist_of(ep, dists: dict) -> tuple[str, str]:
    """(name, version) of an entry point's distribution; ``dists`` keeps them per
    distribution object (every read of ``dist.name`` or ``dist.version`` parses METADATA)."""
    dist = ep.dist
    if dist is None:
        return ("unknown", "")
    found = dists.get(id(dist))
    if found is None or found[0] is not dist:
        found = dists[id(dist)] = (dist, (dist.name, dist.version))
    return found[1]


def _ep_info(ep, dists: dict | None = None) -> PluginInfo:
    name, version = _dist_of(ep, {} if dists is None else dists)
    return PluginInfo(name=ep.name, distribution=name, version=version)


def _call_registration(impl, info: PluginInfo, hook_name: str) -> list:
    try:
        result = impl.function()
        if result is not None and not isinstance(result, (str, bytes)) and isinstance(result, Iterable):
            return list(result)   # inside the try: a generator runs plugin code here
    except Exception as err:
        raise PluginContractError(
            f"{info.describe()} hook {hook_name} raised {type(err).__name__}: {err}",
            plugin=info.name, source=info.source, hook=hook_name) from err
    if result is None:
        return []
    if isinstance(result, (str, bytes)) or not isinstance(result, Iterable):
        raise PluginContractError(
            f"{info.describe()} hook {hook_name} returned {type(result).__name__}; "
            "expected a list of specs", plugin=info.name, source=info.source, hook=hook_name)
    return list(result)


@functools.lru_cache(maxsize=1)
def get_plugin_manager() -> PluginManager:
    """The process-wide manager, loaded lazily on first use (never at import)."""
    return PluginManager.from_environment()
