"""The hooks a plugin can implement (docs/hooks.md): registration hooks return specs, once per
process; component hooks return one rank's ``MemoryTerm``s, once per solve."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

import pluggy

if TYPE_CHECKING:
    from .catalog import CatalogEntry
    from .plan import Placement, TrainingPlan
    from .specs import CheckpointingSpec, OptimizerSpec, ProfileSpec, ShardingRuleSpec
    from .terms import MemoryTerm
PROJECT = "mlsysim"
_hookspec = pluggy.HookspecMarker(PROJECT)


# --- registration hooks -------------------------------------------------------------------
@_hookspec(historic=True)
def mlsysim_addhooks(pluginmanager) -> None:
    """Add hook specs of your own (``pluginmanager.add_hookspecs(module)``), as pytest_addhooks. API 2.0."""


@_hookspec
def mlsysim_optimizers() -> Iterable[OptimizerSpec]:
    """Register named optimizers: ``return [OptimizerSpec(name="myorg.lion", state_terms=...)]``."""


@_hookspec
def mlsysim_checkpointing_strategies() -> Iterable[CheckpointingSpec]:
    """Register named activation-checkpointing strategies."""


@_hookspec
def mlsysim_sharding_rules() -> Iterable[ShardingRuleSpec]:
    """Register named sharding rules (tensor, pipeline, expert or data parallel)."""


@_hookspec
def mlsysim_profiles() -> Iterable[ProfileSpec]:
    """Register named profiles (a set of component plugins and a combine rule)."""


# --- component hooks ----------------------------------------------------------------------
@_hookspec
def mlsysim_weight_terms(plan: TrainingPlan, placement: Placement) -> Iterable[MemoryTerm]:
    """Weight terms of one rank (``component="weights"``)."""


@_hookspec
def mlsysim_gradient_terms(plan: TrainingPlan, placement: Placement) -> Iterable[MemoryTerm]:
    """Gradient terms of one rank (``component="gradients"``)."""


@_hookspec
def mlsysim_optimizer_state_terms(plan: TrainingPlan, placement: Placement) -> Iterable[MemoryTerm]:
    """Extra optimizer-state terms of one rank, added to the selected optimizer's own."""


@_hookspec
def mlsysim_activation_terms(plan: TrainingPlan, placement: Placement) -> Iterable[MemoryTerm]:
    """Extra activation terms of one rank, added to the selected checkpointing strategy's."""


@_hookspec
def mlsysim_communication_buffer_terms(plan: TrainingPlan, placement: Placement,
                                       model_states: Mapping[str, float]) -> Iterable[MemoryTerm]:
    """Communication-buffer terms of one rank; ``model_states``: this rank's model-state bytes."""


@_hookspec
def mlsysim_runtime_overhead_terms(plan: TrainingPlan, placement: Placement,
                                   allocated: float) -> Iterable[MemoryTerm]:
    """Runtime-overhead terms of one rank; ``allocated``: the peak of every other component. API 1.2."""


COMPONENT_HOOKS = {"weights": "mlsysim_weight_terms", "gradients": "mlsysim_gradient_terms",
                   "optimizer_state": "mlsysim_optimizer_state_terms", "activations": "mlsysim_activation_terms",
                   "communication_buffers": "mlsysim_communication_buffer_terms",
                   "runtime_overheads": "mlsysim_runtime_overhead_terms"}


# --- catalog hooks: collected lazily by ``mlsysim_core.catalog`` (see docs/catalog.md) -----
@_hookspec
def mlsysim_catalog_models() -> Iterable[CatalogEntry]:
    """Add models to the catalog: ``CatalogEntry``s whose ``value`` is a ``TransformerWorkload``."""


@_hookspec
def mlsysim_catalog_hardware() -> Iterable[CatalogEntry]:
    """Add accelerators to the catalog: ``CatalogEntry``s whose ``value`` is a ``HardwareNode``."""


CATALOG_HOOKS = {"model": "mlsysim_catalog_models", "hardware": "mlsysim_catalog_hardware"}
