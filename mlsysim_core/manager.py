"""Plugin loading, done deterministically and loudly.

Built-in plugins and third-party plugins share one path: the ``mlsysim_core`` entry-point
group. Entry points are loaded sorted by name; a duplicate name, an import failure, an
unknown hook, a wrong return type or a name claimed twice raises an error that names the
plugin, its distribution and the hook. Users can block a broken plugin
(``MLSYSIM_DISABLED_PLUGINS=a,b``: entry-point names or distribution names) or skip every
third-party plugin (``MLSYSIM_DISABLE_PLUGIN_AUTOLOAD=1``). A blocked name that matches
nothing installed is not an error but a ``PluginWarning`` (with a did-you-mean), so a typo
never goes unseen.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.metadata
import inspect
import os
import re
import sys
import warnings
from collections import defaultdict
from typing import Iterable, Mapping

import pluggy

from . import hookspecs
from .errors import (NotInstalledError, PluginConflictError, PluginContractError, PluginError,
                     PluginLoadError)
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


class PluginWarning(UserWarning):
    """Something about the installed plugins that does not stop a run but must be seen,
    e.g. a name in ``MLSYSIM_DISABLED_PLUGINS`` / ``--disable-plugin`` that matches no
    installed plugin or distribution. The command line prints these on stderr as
    ``mlsysim-core: warning: ...``."""


def _normalise_dist(name: str) -> str:
    """A distribution name normalised as PEP 503 does (case, and runs of ``-_.``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_own(info: PluginInfo) -> bool:
    return _normalise_dist(info.distribution) == OWN_DISTRIBUTION


def _block_hint(name: str) -> str:
    return f"set {ENV_DISABLED_PLUGINS}={name} (or pass --disable-plugin {name})"


def _describe_exception(err: BaseException) -> str:
    """What a plugin did: ``ValueError: boom``, or ``SystemExit: called sys.exit(0)``."""
    if isinstance(err, SystemExit):
        return f"SystemExit: called sys.exit({err.code!r})"
    return f"{type(err).__name__}: {err}"


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
        self.hook.mlsysim_addhooks.call_historic(kwargs={"pluginmanager": self})   # plugins' own hook specs
        self._info: dict[str, PluginInfo] = {}
        self._registry: Registry | None = None
        self.blocked_names: tuple[str, ...] = ()
        self.skipped_third_party: tuple[PluginInfo, ...] = ()
        # Blocked names that match no entry point and no distribution: name -> did-you-mean.
        self.unknown_blocked: dict[str, tuple[str, ...]] = {}
        # Every declaration a blocked name skipped (by entry-point or distribution name).
        self.blocked_entry_points: tuple[PluginInfo, ...] = ()
        self._entry_point_names: set[str] = set()
        self._survey: Registry | None = None     # the registry with broken plugins set aside
        self._allow_broken = 0

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
            self._registry = self._survey = None
        return registered

    def unregister(self, plugin=None, name=None):
        if name is None and plugin is not None:
            name = self.get_name(plugin)
        out = super().unregister(plugin=plugin, name=name)
        self._info.pop(name, None)
        self._registry = self._survey = None
        return out

    def describe_blocked(self, name: str) -> str:
        """What a blocked name did, for listings: ``(blocked)``, ``(blocked: distribution
        NAME, entry points a, b)``, or ``(blocked: matches no installed plugin or
        distribution; did you mean 'sgd'?)``."""
        if name in self.unknown_blocked:
            close = self.unknown_blocked[name]
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            return f"(blocked: matches no installed plugin or distribution, blocks nothing{hint})"
        by_dist = sorted({i.name for i in self.blocked_entry_points
                          if _normalise_dist(i.distribution) == _normalise_dist(name)})
        if by_dist and name not in {i.name for i in self.blocked_entry_points}:
            return f"(blocked: distribution, entry point(s) {', '.join(by_dist)})"
        return "(blocked)"

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
        """Load the plugins of ``group``, sorted by entry-point name.

        ``blocked`` holds entry-point names (every declaration of that name is skipped) and
        distribution names, normalised as PEP 503 does (every entry point that
        distribution declares is skipped). A blocked name that matches neither is
        recorded in ``unknown_blocked`` with close matches and warned about
        (``PluginWarning``); it does not stop the load.
        """
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
        infos = {name: [_ep_info(ep, dists) for ep in eps] for name, eps in by_name.items()}
        dist_names = {}      # normalised -> as declared
        for name_infos in infos.values():
            for info in name_infos:
                if info.distribution != "unknown":
                    dist_names.setdefault(_normalise_dist(info.distribution), info.distribution)
        own_names = {name for name, name_infos in infos.items() if any(_is_own(i) for i in name_infos)}
        blocked = {str(b).strip() for b in blocked if str(b).strip()}
        self.blocked_names = tuple(sorted(blocked))
        blocked_dists = {_normalise_dist(b) for b in blocked} & set(dist_names)
        self.unknown_blocked = {
            b: _did_you_mean(b, [*by_name, *dist_names.values()])
            for b in sorted(blocked) if b not in by_name and _normalise_dist(b) not in dist_names}
        for b, close in self.unknown_blocked.items():
            warnings.warn(PluginWarning(_unknown_blocked_message(b, close, group)), stacklevel=2)
        skipped, blocked_eps = [], []
        for name, eps in by_name.items():
            name_infos = infos[name]
            if name in blocked:          # blocking is the escape hatch, duplicates included
                self.set_blocked(name)
                blocked_eps.extend(name_infos)
                continue
            if blocked_dists:            # a blocked distribution takes only its own declarations
                keep = [(ep, i) for ep, i in zip(eps, name_infos)
                        if _normalise_dist(i.distribution) not in blocked_dists]
                blocked_eps.extend(i for i in name_infos
                                   if _normalise_dist(i.distribution) in blocked_dists)
                if not keep:
                    self.set_blocked(name)
                    continue
                eps, name_infos = [ep for ep, _ in keep], [i for _, i in keep]
            if not third_party:          # only mlsysim-core's own entry points
                own = [(ep, i) for ep, i in zip(eps, name_infos) if _is_own(i)]
                skipped.extend(i for i in name_infos if not _is_own(i))
                if not own:
                    continue
                eps, name_infos = [ep for ep, _ in own], [i for _, i in own]
            if len({(i.distribution, ep.value) for i, ep in zip(name_infos, eps)}) > 1:
                providers = "; ".join(f"{i.source} -> {ep.value}" for i, ep in zip(name_infos, eps))
                raise PluginConflictError(
                    f"entry point '{name}' in group '{group}' is declared by more than one "
                    f"plugin: {providers}. {_duplicate_hint(name, name_infos, own_names)}",
                    plugin=name, hook="entry point")
            ep, info = eps[0], name_infos[0]
            try:
                module = ep.load()
            except KeyboardInterrupt:
                raise
            except BaseException as err:     # SystemExit at import too: never a silent exit
                raise PluginLoadError(
                    f"{info.describe()} failed to load from entry point '{name} = {ep.value}': "
                    f"{_describe_exception(err)}. To run without it, {_block_hint(name)}",
                    plugin=name, source=info.source, hook="entry point") from err
            self.register(module, name=name, info=info)
            self._entry_point_names.add(name)
        self.skipped_third_party = tuple(skipped)
        self.blocked_entry_points = tuple(blocked_eps)
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
                    f"Known hooks: {', '.join(_known_hooks())}{self._workaround(impl.plugin_name)}",
                    plugin=impl.plugin_name, source=info.source, hook=hook_name)

    # --- the registry -----------------------------------------------------------------

    @property
    def registry(self) -> Registry:
        """Every spec, by kind and name. Raises the first broken plugin's error (a
        registration hook that raised or returned the wrong thing, two plugins claiming one
        name), except inside ``allowing_broken()``."""
        if self._registry is not None:
            return self._registry
        survey = self.survey()
        if survey.broken and not self._allow_broken:
            raise next(iter(survey.broken.values()))
        if not survey.broken:
            self._registry = survey       # (only a clean registry is cached: solves read it)
        return survey

    def survey(self) -> Registry:
        """The registry with broken plugins set aside instead of raising: each one stays
        in ``plugins``, provides nothing, and its error is in ``broken`` (plugin name ->
        ``PluginError``). For listings (``mlsysim-core plugins``); a solve uses ``registry``."""
        if self._survey is None:
            self.check()
            self._survey = self._build_registry()
        return self._survey

    def broken_plugins(self) -> Mapping[str, PluginError]:
        """Plugins whose registration failed, by name, with the error (never raises)."""
        return self.survey().broken

    @contextlib.contextmanager
    def allowing_broken(self):
        """Within this block ``registry`` is the survey: broken plugins provide nothing
        and are listed in ``registry.broken`` instead of raising."""
        self._allow_broken += 1
        try:
            yield self
        finally:
            self._allow_broken -= 1

    def _impls(self, hook_name: str):
        """Implementations of a hook, sorted by plugin name (never pluggy's order)."""
        return sorted(getattr(self.hook, hook_name).get_hookimpls(), key=lambda i: i.plugin_name)

    def _claims(self, hook_name: str, spec_type: type, broken: dict) -> dict[str, list]:
        """name -> [(item, provider)] of one registration hook; a plugin whose hook fails
        or returns something else is set aside in ``broken``."""
        claims = defaultdict(list)
        for impl in self._impls(hook_name):
            info = self.info(impl.plugin_name)
            if info.name in broken:
                continue
            try:
                items = _call_registration(impl, info, hook_name)
                for item in items:
                    if not isinstance(item, spec_type) or not isinstance(getattr(item, "name", None), str):
                        raise PluginContractError(
                            f"{info.describe()} hook {hook_name} returned {type(item).__name__} {item!r}; "
                            f"expected {spec_type.__name__ if spec_type is not object else 'a named spec'}",
                            plugin=info.name, source=info.source, hook=hook_name)
            except PluginError as err:
                broken[info.name] = _with_workaround(err, self._workaround(info.name))
                continue
            for item in items:
                claims[item.name].append((item, info))
        return claims

    def _workaround(self, name: str) -> str:
        """How to run without a plugin (only entry-point plugins can be blocked)."""
        return f". To run without it, {_block_hint(name)}" if name in self._entry_point_names else ""

    def _build_registry(self) -> Registry:
        broken: dict[str, PluginError] = {}
        claims_by_kind: dict[str, dict[str, list]] = {}
        registrations = dict(_REGISTRATION)
        for hook_name, (kind, spec_type) in _REGISTRATION.items():
            claims_by_kind[kind] = self._claims(hook_name, spec_type, broken)
        # A profile's own registration hooks (added with mlsysim_addhooks): named items, each
        # kept under the hook's name, with the same rules for conflicts.
        for hook_name in sorted({h for items in claims_by_kind[PROFILE].values() for spec, _ in items
                                 for h in spec.registration_hooks}):
            if not hasattr(self.hook, hook_name):
                continue      # its plugin is blocked or broken: the profile says what is missing
            registrations[hook_name] = (hook_name, object)
            claims_by_kind[hook_name] = self._claims(hook_name, object, broken)

        # Two plugins claiming one name: every third-party claimant is set aside (a built-in
        # keeps its name); the error names all of them.
        for kind, claims in claims_by_kind.items():
            for name in sorted(claims):
                entries = [(item, i) for item, i in claims[name] if i.name not in broken]
                if len(entries) < 2:
                    continue
                who = ", ".join(i.describe() for _, i in entries)
                third = [i for _, i in entries if not _is_own(i)] or [i for _, i in entries]
                hook_name = next(h for h, (k, _) in registrations.items() if k == kind)
                err = PluginConflictError(
                    f"{kind.replace('mlsysim_', '').replace('_', ' ')} '{name}' is provided by more than one "
                    f"plugin: {who}. Uninstall one, or block one with {_conflict_hint(third)}",
                    plugin=entries[1][1].name, source=entries[1][1].source, hook=hook_name)
                for i in third:
                    broken.setdefault(i.name, err)

        tables: dict[str, dict] = {}
        providers: dict[tuple[str, str], PluginInfo] = {}
        for kind, claims in claims_by_kind.items():
            table = {}
            for name in sorted(claims):
                entries = [(item, i) for item, i in claims[name] if i.name not in broken]
                if entries:
                    table[name], providers[(kind, name)] = entries[0]
            tables[kind] = table

        component_impls = {}
        for hook_name in hookspecs.COMPONENT_HOOKS.values():
            impls = []
            for impl in self._impls(hook_name):
                info = self.info(impl.plugin_name)
                if impl.wrapper or impl.hookwrapper:
                    broken.setdefault(info.name, PluginContractError(
                        f"{info.describe()} implements {hook_name} as a wrapper; component hooks "
                        f"return terms and cannot be wrappers{self._workaround(info.name)}",
                        plugin=info.name, source=info.source, hook=hook_name))
                if info.name in broken:
                    continue
                impls.append(ComponentImpl(plugin=info, function=impl.function,
                                           argnames=tuple(impl.argnames)))
            component_impls[hook_name] = tuple(impls)
        if broken:        # a wrapper found late: drop its component impls everywhere
            component_impls = {h: tuple(c for c in impls if c.plugin.name not in broken)
                               for h, impls in component_impls.items()}

        plugins = {name: self.info(name) for name, plugin in sorted(self.list_name_plugin(),
                                                                     key=lambda pair: pair[0])
                   if plugin is not None}   # blocked names are registered as None
        rules_by_axis = {axis: {n: s for n, s in tables[SHARDING].items() if s.axis == axis} for axis in AXES}
        extensions = {kind: table for kind, table in tables.items() if kind.startswith("mlsysim_")}
        return Registry(optimizers=tables[OPTIMIZER], checkpointing=tables[CHECKPOINTING],
                        sharding_rules=tables[SHARDING], profiles=tables[PROFILE],
                        providers=providers, component_impls=component_impls, plugins=plugins,
                        rules_by_axis=rules_by_axis, broken=broken, extensions=extensions)


def _did_you_mean(name: str, candidates: Iterable[str]) -> tuple[str, ...]:
    """Close matches among entry-point and distribution names: at most three, all about as
    close as the best one (compared normalised, so ``MLSYSIM_Demo.Lion`` finds
    ``mlsysim-demo-lion`` and a shared ``mlsysim-`` prefix alone does not make a match)."""
    key = _normalise_dist(name)
    scored = []
    for c in sorted(set(candidates)):
        ratio = difflib.SequenceMatcher(None, key, _normalise_dist(c)).ratio()
        if ratio >= 0.6:
            scored.append((-ratio, c))
    scored.sort()
    best = -scored[0][0] if scored else 0.0
    return tuple(c for r, c in scored if -r >= best - 0.1)[:3]


def _unknown_blocked_message(name: str, close: tuple[str, ...], group: str) -> str:
    hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close
            else "`mlsysim-core plugins` lists the installed plugins and their distributions")
    return (f"blocked plugin '{name}' ({ENV_DISABLED_PLUGINS} / --disable-plugin) matches no installed "
            f"plugin (entry-point name) or distribution in group '{group}', so it blocks nothing; {hint}")


def _duplicate_hint(name: str, infos: list[PluginInfo], own_names: set[str]) -> str:
    """How to get out of an entry-point name declared twice, never by blocking a built-in.

    Blocking the name blocks every declaration of it, so when one of them is a built-in
    the hint names the other distributions instead (a distribution name blocks only its
    own entry points), unless such a name would itself match a built-in entry point."""
    third = sorted({i.distribution for i in infos if not _is_own(i)})
    if not any(_is_own(i) for i in infos):
        dists = " or ".join(third)
        return (f"Uninstall one, or block one distribution (all of its plugins) with "
                f"{ENV_DISABLED_PLUGINS}=<distribution> ({dists}), or every declaration of the name "
                f"with {ENV_DISABLED_PLUGINS}={name}")
    safe = [d for d in third if d not in own_names and d != "unknown"]
    uninstall = f"'{name}' is also a built-in plugin's name: uninstall {' and '.join(third)}"
    if not safe:
        return uninstall
    value = ",".join(safe)
    return (f"{uninstall}, or block {'that distribution' if len(safe) == 1 else 'those distributions'} "
            f"(all of {'its' if len(safe) == 1 else 'their'} plugins, not the built-in) with "
            f"{ENV_DISABLED_PLUGINS}={value} (or --disable-plugin {' --disable-plugin '.join(safe)})")


def _conflict_hint(third: list[PluginInfo]) -> str:
    names = [i.name for i in third]
    return " or ".join(f"{ENV_DISABLED_PLUGINS}={n}" for n in names) if names \
        else f"{ENV_DISABLED_PLUGINS}=<plugin>"


def _with_workaround(err: PluginError, workaround: str) -> PluginError:
    """The same error, its message ending with how to run without the plugin."""
    if not workaround or workaround in str(err):
        return err
    new = type(err)(f"{err}{workaround}", plugin=err.plugin, source=err.source, hook=err.hook)
    new.__cause__ = err.__cause__
    return new


def plugin_warnings_to_stderr():
    """A context in which ``PluginWarning``s are printed once each on stderr as
    ``mlsysim-core: warning: ...`` (the command line's format); other warnings as usual."""
    return _PluginWarningsToStderr()


class _PluginWarningsToStderr(contextlib.AbstractContextManager):
    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always", PluginWarning)
        previous, seen = warnings.showwarning, set()

        def show(message, category, filename, lineno, file=None, line=None):
            if not issubclass(category, PluginWarning):
                return previous(message, category, filename, lineno, file, line)
            if str(message) not in seen:
                seen.add(str(message))
                print(f"mlsysim-core: warning: {message}", file=sys.stderr)

        warnings.showwarning = show
        return self

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


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
    except KeyboardInterrupt:
        raise
    except BaseException as err:      # SystemExit too: a plugin never ends the run silently
        raise PluginContractError(
            f"{info.describe()} hook {hook_name} raised {_describe_exception(err)}",
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
