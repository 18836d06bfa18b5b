"""The registry, immutable: every installed spec by name, its provider, the component hooks in order."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import attrs

from ._checks import name_key, resolve_name  # noqa: F401 (name_key: re-exported, the CLI and scenarios use it)
from .errors import PluginContractError
from .specs import CheckpointingSpec, OptimizerSpec, ProfileSpec, ShardingRuleSpec


@attrs.frozen(kw_only=True)
class PluginInfo:
    """Where a plugin came from: its registered name and its distribution."""

    name: str
    distribution: str = "unknown"
    version: str = ""
    source: str = attrs.field(init=False, eq=False, repr=False, default=attrs.Factory(    # "mlsysim-core 0.1.0"
        lambda self: f"{self.distribution} {self.version}".strip(), takes_self=True))     # (read on every solve)

    def describe(self) -> str:
        return f"plugin '{self.name}' ({self.source})"

    def error(self, message: str, hook: str, kind: type = PluginContractError):
        """A ``kind`` error naming this plugin, its distribution and ``hook``."""
        return kind(f"{self.describe()} {message}", plugin=self.name, source=self.source, hook=hook)


@attrs.frozen(kw_only=True)
class ComponentImpl:
    """One plugin's implementation of one component hook, ready to call."""

    plugin: PluginInfo
    function: Callable
    argnames: tuple[str, ...]


# Spec kinds as users and messages name them.
OPTIMIZER = "optimizer"
CHECKPOINTING = "activation checkpointing strategy"
SHARDING = "sharding rule"
PROFILE = "profile"


@attrs.frozen(kw_only=True, eq=False)
class Registry:
    optimizers: Mapping[str, OptimizerSpec]
    checkpointing: Mapping[str, CheckpointingSpec]
    sharding_rules: Mapping[str, ShardingRuleSpec]
    profiles: Mapping[str, ProfileSpec]
    providers: Mapping[tuple[str, str], PluginInfo]          # (kind, name) -> provider
    component_impls: Mapping[str, tuple[ComponentImpl, ...]]  # hook name -> impls, by plugin name
    plugins: Mapping[str, PluginInfo]                         # every registered plugin
    rules_by_axis: Mapping[str, Mapping[str, ShardingRuleSpec]] = attrs.field(factory=dict)
    broken: Mapping[str, Exception] = attrs.field(factory=dict)   # plugin -> its error (survey() only)
    extensions: Mapping[str, Mapping[str, object]] = attrs.field(factory=dict)   # plugins' own hooks' items

    def rules_for_axis(self, axis: str) -> Mapping[str, ShardingRuleSpec]:
        return self.rules_by_axis.get(axis, {})

    def provider(self, kind: str, name: str) -> PluginInfo:
        return self.providers[(kind, name)]

    def resolve(self, kind: str, parameter: str, value: object, choices: Iterable[str] | None = None) -> str:
        """``value`` as an installed ``kind``'s name; the error lists each choice with its provider."""
        pool = {OPTIMIZER: self.optimizers, CHECKPOINTING: self.checkpointing, SHARDING: self.sharding_rules,
                PROFILE: self.profiles}[kind] if choices is None else choices
        if type(value) is str and value in pool:     # already canonical: every solve's case, kept cheap
            return value
        label = {OPTIMIZER: "an installed optimizer: ", SHARDING: "an installed sharding rule: "}.get(kind, "one of: ")
        return resolve_name(parameter, value, pool, label + self.describe_choices(kind, pool))

    def describe_choices(self, kind: str, names) -> str:
        """``"adam (mlsysim-core 0.1.0), demo.lion (mlsysim-demo 0.1)"``."""
        return ", ".join(f"{n} ({self.providers[(kind, n)].source})" for n in sorted(names)) or "(none installed)"
