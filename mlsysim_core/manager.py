"""Plugin loading, deterministic and loud: entry points of the ``mlsysim_core`` group, sorted by
name; anything wrong names the plugin, its distribution and the hook."""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.metadata
import inspect
import os
import re
import warnings
from collections import defaultdict
from typing import Iterable, Mapping

import pluggy

from . import hookspecs
from .errors import NotInstalledError, PluginConflictError, PluginContractError, PluginError, PluginLoadError
from .registry import CHECKPOINTING, OPTIMIZER, PROFILE, SHARDING, ComponentImpl, PluginInfo, Registry
from .specs import AXES, CheckpointingSpec, OptimizerSpec, ProfileSpec, ShardingRuleSpec

ENTRY_POINT_GROUP = "mlsysim_core"
OWN_DISTRIBUTION = "mlsysim-core"
ENV_DISABLE_AUTOLOAD = "MLSYSIM_DISABLE_PLUGIN_AUTOLOAD"
ENV_DISABLED_PLUGINS = "MLSYSIM_DISABLED_PLUGINS"
_REGISTRATION = {"mlsysim_optimizers": (OPTIMIZER, OptimizerSpec),
                 "mlsysim_checkpointing_strategies": (CHECKPOINTING, CheckpointingSpec),
                 "mlsysim_sharding_rules": (SHARDING, ShardingRuleSpec),
                 "mlsysim_profiles": (PROFILE, ProfileSpec)}
_HOOK_OF = {kind: hook for hook, (kind, _) in _REGISTRATION.items()}     # (a plugin's own hook: its kind is its name)


class PluginWarning(UserWarning):
    """Something about the installed plugins that must be seen but does not stop a run."""


def _normalise_dist(name: str) -> str:   # as PEP 503 does: case, and runs of -_.
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_own(info: PluginInfo) -> bool:
    return _normalise_dist(info.distribution) == OWN_DISTRIBUTION


def _describe_exception(err: BaseException) -> str:
    """What a plugin did: ``ValueError: boom``, or ``SystemExit: called sys.exit(0)``."""
    if isinstance(err, SystemExit):
        return f"SystemExit: called sys.exit({err.code!r})"
    return f"{type(err).__name__}: {err}"


class PluginManager(pluggy.PluginManager):
    """pluggy's manager with mlsysim's loading rules and a frozen registry."""

    def __init__(self) -> None:
        self._collected: dict[str, type] = {}    # plugins' own registration hooks -> item type
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.hook.mlsysim_addhooks.call_historic(kwargs={"pluginmanager": self})   # plugins' own hook specs
        self._info: dict[str, PluginInfo] = {}
        self._registry = self._survey = None     # the registry, and the one with broken plugins set aside
        self._allow_broken, self._entry_point_names = 0, set()
        # What load_entrypoints blocked and skipped, and the blocked names that match nothing.
        self.blocked_names = self.skipped_third_party = self.blocked_entry_points = ()
        self.unknown_blocked: dict[str, tuple[str, ...]] = {}

    def add_hookspecs(self, module_or_class) -> None:
        """pluggy's; a module's ``REGISTRATION_HOOK_TYPES`` ({hook: item type}) go to ``registry.extensions``."""
        super().add_hookspecs(module_or_class)
        self._collected.update(getattr(module_or_class, "REGISTRATION_HOOK_TYPES", {}))

    def parse_hookimpl_opts(self, plugin, name):
        # mlsysim_* functions are hook implementations even unmarked: check() catches a misspelled hook.
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("mlsysim_") and inspect.isroutine(getattr(plugin, name, None)):
            return {}
        return opts

    def register(self, plugin, name: str | None = None, *, info: PluginInfo | None = None):
        try:
            registered = super().register(plugin, name=name)
        except pluggy.PluginValidationError as err:
            label = info.describe() if info else f"plugin '{name}'"
            raise PluginContractError(f"{label}: {err}", plugin=name, source=info.source if info else None) from err
        if registered is not None:
            pname = self.get_name(plugin)
            self._info[pname] = info or PluginInfo(name=pname, distribution="registered directly")
            self._registry = self._survey = None
        return registered

    def unregister(self, plugin=None, name=None):
        if name is None and plugin is not None:
            name = self.get_name(plugin)
        out = super().unregister(plugin=plugin, name=name)
        self._info.pop(name, None)
        self._registry = self._survey = None
        return out

    def info(self, plugin_name: str) -> PluginInfo:
        return self._info.get(plugin_name, PluginInfo(name=plugin_name))

    @classmethod
    def from_environment(cls, *, autoload: bool | None = None, blocked: Iterable[str] | None = None) -> PluginManager:
        """A manager with every installed plugin loaded as the arguments and the environment say."""
        if autoload is None:
            autoload = os.environ.get(ENV_DISABLE_AUTOLOAD, "").strip().lower() in ("", "0", "false", "no")
        from_env = {v.strip() for v in os.environ.get(ENV_DISABLED_PLUGINS, "").split(",") if v.strip()}
        pm = cls()
        pm.load_entrypoints(third_party=autoload, blocked=tuple(sorted(set(blocked or ()) | from_env)))
        return pm

    def load_entrypoints(self, *, third_party: bool = True, blocked: Iterable[str] = (),
                         group: str = ENTRY_POINT_GROUP) -> None:
        """Load the plugins of ``group``, sorted by name, but ``blocked`` entry-point or distribution names."""
        provenance = functools.cache(lambda dist: {"distribution": dist.name, "version": dist.version})  # (METADATA)
        by_name = defaultdict(list)      # entry-point name -> [(entry point, PluginInfo)]
        for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda ep: (ep.name, ep.value)):
            by_name[ep.name].append((ep, PluginInfo(name=ep.name, **provenance(ep.dist) if ep.dist is not None else {})))
        infos = [i for pairs in by_name.values() for _, i in pairs]
        if group == ENTRY_POINT_GROUP and not any(_is_own(i) for i in infos):
            raise NotInstalledError(
                f"mlsysim-core is not installed (its entry points in group '{group}' are missing): "
                "run `pip install -e .` in the source tree, or `pip install mlsysim-core`")
        # Normalised -> as declared (the first spelling wins).
        dist_names = {_normalise_dist(i.distribution): i.distribution for i in reversed(infos)
                      if i.distribution != "unknown"}
        own_names = {name for name, pairs in by_name.items() if any(_is_own(i) for _, i in pairs)}
        blocked = {str(b).strip() for b in blocked if str(b).strip()}
        self.blocked_names = tuple(sorted(blocked))
        blocked_dists = {_normalise_dist(b) for b in blocked} & set(dist_names)
        self.unknown_blocked = {b: _did_you_mean(b, [*by_name, *dist_names.values()]) for b in self.blocked_names
                                if b not in by_name and _normalise_dist(b) not in dist_names}
        for b, close in self.unknown_blocked.items():
            hint = (f"did you mean {' or '.join(map(repr, close))}?" if close
                    else "`mlsysim-core plugins` lists the installed plugins and their distributions")
            warnings.warn(PluginWarning(
                f"blocked plugin '{b}' ({ENV_DISABLED_PLUGINS} / --disable-plugin) matches no installed plugin "
                f"(entry-point name) or distribution in group '{group}', so it blocks nothing; {hint}"), stacklevel=2)
        skipped, blocked_eps = [], []
        for name, pairs in by_name.items():
            # Blocking a name is the escape hatch (duplicates included); a blocked distribution takes only its own.
            out = [i for _, i in pairs if name in blocked or _normalise_dist(i.distribution) in blocked_dists]
            blocked_eps.extend(out)
            if not (pairs := [(ep, i) for ep, i in pairs if i not in out]):
                self.set_blocked(name)
                continue
            if not third_party:          # only mlsysim-core's own entry points
                skipped.extend(i for _, i in pairs if not _is_own(i))
                if not (pairs := [(ep, i) for ep, i in pairs if _is_own(i)]):
                    continue
            if len({(i.distribution, ep.value) for ep, i in pairs}) > 1:
                providers = "; ".join(f"{i.source} -> {ep.value}" for ep, i in pairs)
                raise PluginConflictError(
                    f"entry point '{name}' in group '{group}' is declared by more than one plugin: {providers}. "
                    f"{_duplicate_hint(name, [i for _, i in pairs], own_names)}", plugin=name, hook="entry point")
            ep, info = pairs[0]
            self._entry_point_names.add(name)
            try:
                module = ep.load()
            except KeyboardInterrupt:
                raise
            except BaseException as err:     # SystemExit at import too: never a silent exit
                raise PluginLoadError(f"{info.describe()} failed to load from entry point '{name} = {ep.value}': "
                                      f"{_describe_exception(err)}{self._workaround(name)}",
                                      plugin=name, source=info.source, hook="entry point") from err
            self.register(module, name=name, info=info)
        self.skipped_third_party, self.blocked_entry_points = tuple(skipped), tuple(blocked_eps)
        self.check()

    def check(self) -> None:
        """Fail on hook implementations that match no hook spec (e.g. a misspelled name)."""
        known = (sorted(_REGISTRATION) + sorted(hookspecs.CATALOG_HOOKS.values())
                 + sorted(hookspecs.COMPONENT_HOOKS.values()))
        for hook_name in sorted(self.hook.__dict__):
            caller = getattr(self.hook, hook_name)
            if not isinstance(caller, pluggy.HookCaller) or caller.spec is not None:
                continue
            for impl in caller.get_hookimpls():
                blocked = sorted(i.name for i in self.blocked_entry_points)
                why = (f"; or the plugin that adds this hook is blocked ({', '.join(blocked)}): block the plugins "
                       f"that implement it too, or unblock it" if blocked else "")
                raise self._contract_error(impl, hook_name, f"implements unknown hook '{hook_name}' "
                                                            f"(a misspelling?{why}). Known hooks: {', '.join(known)}")

    @property
    def registry(self) -> Registry:
        """Every spec, by kind and name; raises the first broken plugin's error (but in ``allowing_broken()``)."""
        if self._registry is not None:
            return self._registry
        survey = self.survey()
        if survey.broken and not self._allow_broken:
            raise next(iter(survey.broken.values()))
        if not survey.broken:
            self._registry = survey       # (only a clean registry is cached: solves read it)
        return survey

    def survey(self) -> Registry:
        """The registry with each broken plugin set aside, its error in ``broken`` (for listings)."""
        if self._survey is None:
            self.check()
            self._survey = self._build_registry()
        return self._survey

    def broken_plugins(self) -> Mapping[str, PluginError]:
        """Plugins whose registration failed, by name, with the error (never raises)."""
        return self.survey().broken

    @contextlib.contextmanager
    def allowing_broken(self):
        """Within this block ``registry`` is the survey (broken plugins in ``registry.broken``)."""
        self._allow_broken += 1
        try:
            yield self
        finally:
            self._allow_broken -= 1

    def _impls(self, hook_name: str):
        """Implementations of a hook, sorted by plugin name (never pluggy's order)."""
        return sorted(getattr(self.hook, hook_name).get_hookimpls(), key=lambda i: i.plugin_name)

    def _workaround(self, name: str) -> str:     # (only entry-point plugins can be blocked)
        return (f". To run without it, set {ENV_DISABLED_PLUGINS}={name} (or pass --disable-plugin {name})"
                if name in self._entry_point_names else "")

    def _contract_error(self, impl, hook: str, message: str) -> PluginContractError:
        info = self.info(impl.plugin_name)
        return info.error(f"{message}{self._workaround(info.name)}", hook)

    def _claims(self, hook: str, spec_type: type, broken: dict) -> dict[str, list]:
        """name -> [(item, provider)] of one registration hook; a plugin that fails goes to ``broken``."""
        claims = defaultdict(list)
        for impl in self._impls(hook):
            if impl.plugin_name in broken:
                continue
            try:
                for item in self._registered(impl, hook, spec_type):
                    claims[item.name].append((item, self.info(impl.plugin_name)))
            except PluginError as err:
                broken[impl.plugin_name] = err
        return claims

    def _registered(self, impl, hook: str, spec_type: type) -> list:
        """The items a registration hook returns, each checked to be a named ``spec_type``."""
        try:
            result = impl.function()
            iterable = isinstance(result, Iterable) and not isinstance(result, (str, bytes))
            items = list(result) if iterable else []    # inside the try: a generator runs plugin code here
        except KeyboardInterrupt:
            raise
        except BaseException as err:      # SystemExit too: a plugin never ends the run silently
            raise self._contract_error(impl, hook, f"hook {hook} raised {_describe_exception(err)}") from err
        if result is not None and not iterable:
            raise self._contract_error(impl, hook, f"hook {hook} returned {type(result).__name__}; "
                                                   "expected a list of specs")
        for item in items:
            if not isinstance(item, spec_type) or not isinstance(getattr(item, "name", None), str):
                expected = spec_type.__name__ if spec_type is not object else "a named spec"
                raise self._contract_error(impl, hook, f"hook {hook} returned {type(item).__name__} {item!r}; "
                                                       f"expected {expected}")
        return items

    def _build_registry(self) -> Registry:
        broken: dict[str, PluginError] = {}
        claims = {kind: self._claims(hook, spec_type, broken) for hook, (kind, spec_type) in _REGISTRATION.items()}
        # Plugins' own registration hooks (mlsysim_addhooks, or a profile's); absent: a blocked plugin's.
        added = dict(self._collected)
        added.update((h, object) for items in claims[PROFILE].values() for spec, _ in items
                     for h in spec.registration_hooks if h not in added)
        for hook, item_type in sorted(added.items()):
            if hasattr(self.hook, hook):
                claims[hook] = self._claims(hook, item_type, broken)
        # Two plugins claiming one name: every third-party claimant is set aside (a built-in keeps it).
        for kind, table in claims.items():
            for name in sorted(table):
                entries = [i for _, i in table[name] if i.name not in broken]
                if len(entries) > 1:
                    third = [i for i in entries if not _is_own(i)] or entries
                    hint = " or ".join(f"{ENV_DISABLED_PLUGINS}={i.name}" for i in third)
                    err = PluginConflictError(
                        f"{kind.replace('mlsysim_', '').replace('_', ' ')} '{name}' is provided by more than one "
                        f"plugin: {', '.join(i.describe() for i in entries)}. Uninstall one, or block one with {hint}",
                        plugin=entries[1].name, source=entries[1].source, hook=_HOOK_OF.get(kind, kind))
                    for i in third:
                        broken.setdefault(i.name, err)
        tables: dict[str, dict] = {kind: {} for kind in claims}
        providers: dict[tuple[str, str], PluginInfo] = {}
        for kind, table in claims.items():
            for name in sorted(table):
                entries = [(item, i) for item, i in table[name] if i.name not in broken]
                if entries:
                    tables[kind][name], providers[(kind, name)] = entries[0]
        for hook in hookspecs.COMPONENT_HOOKS.values():    # component hooks return terms, never wrap
            for impl in self._impls(hook):
                if impl.wrapper or impl.hookwrapper:
                    broken.setdefault(impl.plugin_name, self._contract_error(impl, hook, (
                        f"implements {hook} as a wrapper; component hooks return terms and cannot be wrappers")))
        component_impls = {hook: tuple(ComponentImpl(plugin=info, function=impl.function,
                                                     argnames=tuple(impl.argnames))
                                       for impl in self._impls(hook)
                                       if (info := self.info(impl.plugin_name)).name not in broken)
                           for hook in hookspecs.COMPONENT_HOOKS.values()}
        plugins = {name: self.info(name) for name, plugin in sorted(self.list_name_plugin()) if plugin is not None}
        registry = Registry(optimizers=tables[OPTIMIZER], checkpointing=tables[CHECKPOINTING],
                        sharding_rules=tables[SHARDING], profiles=tables[PROFILE],
                        providers=providers, component_impls=component_impls, plugins=plugins,
                        rules_by_axis={axis: {n: s for n, s in tables[SHARDING].items() if s.axis == axis}
                                       for axis in AXES},
                        broken=broken,
                        extensions={hook: tables[hook] for hook in added if hook in tables})
        for name, spec in tables[PROFILE].items():     # a profile completed from its hooks' items
            if spec.assemble is not None:
                tables[PROFILE][name] = spec.assemble(spec, registry)
        return registry


def _did_you_mean(name: str, candidates: Iterable[str]) -> tuple[str, ...]:
    """Up to three close matches, about as close as the best."""
    key = _normalise_dist(name)
    scored = sorted((-ratio, c) for c in set(candidates)
                    if (ratio := difflib.SequenceMatcher(None, key, _normalise_dist(c)).ratio()) >= 0.6)
    return tuple(c for r, c in scored if r <= scored[0][0] + 0.1)[:3]


def _duplicate_hint(name: str, infos: list[PluginInfo], own_names: set[str]) -> str:
    """How to get out of an entry-point name declared twice, never by blocking a built-in."""
    third = sorted({i.distribution for i in infos if not _is_own(i)})
    if not any(_is_own(i) for i in infos):
        return (f"Uninstall one, or block one distribution (all of its plugins) with "
                f"{ENV_DISABLED_PLUGINS}=<distribution> ({' or '.join(third)}), or every declaration of the "
                f"name with {ENV_DISABLED_PLUGINS}={name}")
    safe = [d for d in third if d not in own_names and d != "unknown"]
    uninstall = f"'{name}' is also a built-in plugin's name: uninstall {' and '.join(third)}"
    if not safe:
        return uninstall
    one = len(safe) == 1
    return (f"{uninstall}, or block {'that distribution' if one else 'those distributions'} "
            f"(all of {'its' if one else 'their'} plugins, not the built-in) with "
            f"{ENV_DISABLED_PLUGINS}={','.join(safe)} (or --disable-plugin {' --disable-plugin '.join(safe)})")


@functools.lru_cache(maxsize=1)
def get_plugin_manager() -> PluginManager:
    """The process-wide manager, loaded lazily on first use (never at import)."""
    return PluginManager.from_environment()
