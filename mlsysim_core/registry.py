"""The registry: every installed spec by name, who provided it, and the component-hook
implementations in a fixed order (a solve never depends on pluggy's order). Immutable."""

from __future__ import annotations

from typing import Callable, Mapping

import attrs

from .specs import CheckpointingSpec, OptimizerSpec, ProfileSpec, ShardingRuleSpec


@attrs.frozen(kw_only=True)
class PluginInfo:
    """Where a plugin came from: its registered name and its distribution."""

    name: str
    distribution: str = "unknown"
    version: str = ""
    source: str = attrs.field(init=False, eq=False, repr=False)   # "mlsysim-core 0.1.0", read on every solve

    @source.default
    def _source(self) -> str:
        return f"{self.distribution} {self.version}".strip()

    def describe(self) -> str:
        return f"plugin '{self.name}' ({self.source})"


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
    extensions: Mapping[str, Mapping[str, object]] = attrs.field(factory=dict)   # profiles' own hooks' items

    def rules_for_axis(self, axis: str) -> Mapping[str, ShardingRuleSpec]:
        return self.rules_by_axis.get(axis, {})

    def provider(self, kind: str, name: str) -> PluginInfo:
        return self.providers[(kind, name)]

    def describe_choices(self, kind: str, names) -> str:
        """``"adam (mlsysim-core 0.1.0), demo.lion (mlsysim-demo 0.1)"``."""
        return ", ".join(f"{n} ({self.providers[(kind, n)].source})" for n in sorted(names)) or "(none installed)"
