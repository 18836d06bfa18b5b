"""The hooks a plugin can implement.

Two kinds, and nothing else:

* **Registration hooks** take no arguments and return an iterable of specs
  (``OptimizerSpec``, ``CheckpointingSpec``, ``ShardingRuleSpec``, ``ProfileSpec``), or
  of catalog entries (``mlsysim_catalog_models``, ``mlsysim_catalog_hardware``). They are
  called once per process, when the registry (or the catalog) is built.
* **Component hooks**, one per memory component, return an iterable of ``MemoryTerm``
  (possibly empty) for one rank. They are always-on additive contributions (a framework
  overhead, an extra buffer) and are called once per solve, only for the plugins the
  selected profile names (or the user includes).

No hook's meaning depends on pluggy's call order: the solver sorts and combines results
itself. Implement hooks with ``@mlsysim_core.hookimpl``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

import pluggy

if TYPE_CHECKING:
    from .plan import Placement, TrainingPlan
    from .specs import CheckpointingSpec, OptimizerSpec, ProfileSpec, ShardingRuleSpec
    from .terms import MemoryTerm

PROJECT = "mlsysim"
_hookspec = pluggy.HookspecMarker(PROJECT)

# --- registration hooks -------------------------------------------------------------


@_hookspec(historic=True)
def mlsysim_addhooks(pluginmanager) -> None:
    """Add hook specs of your own (``pluginmanager.add_hookspecs(module)``), as pytest's
    ``pytest_addhooks`` does: a profile plugin declares the hooks its own extensions
    implement (the measured profile's architectures, regimes, kernels, schedules). Called
    once per plugin, when it is registered.

    .. versionadded:: plugin API 2.0
    """



@_hookspec
def mlsysim_optimizers() -> Iterable[OptimizerSpec]:
    """Register named optimizers.

    Example::

        @hookimpl
        def mlsysim_optimizers():
            return [OptimizerSpec(name="myorg.lion", state_terms=lion_state_terms)]
    """


@_hookspec
def mlsysim_checkpointing_strategies() -> Iterable[CheckpointingSpec]:
    """Register named activation-checkpointing strategies."""


@_hookspec
def mlsysim_sharding_rules() -> Iterable[ShardingRuleSpec]:
    """Register named sharding rules (tensor, pipeline, expert or data parallel)."""


@_hookspec
def mlsysim_profiles() -> Iterable[ProfileSpec]:
    """Register named profiles (a set of component plugins and a combine rule)."""


# --- component hooks ------------------------------------------------------------------


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
def mlsysim_communication_buffer_terms(
    plan: TrainingPlan, placement: Placement, model_states: Mapping[str, float]
) -> Iterable[MemoryTerm]:
    """Communication-buffer terms of one rank.

    ``model_states`` maps ``"weights"``, ``"gradients"`` and ``"optimizer_state"`` to the
    bytes already assembled for this rank (after sharding), e.g. for a gradient bucket
    sized as a fraction of the gradients.
    """


@_hookspec
def mlsysim_runtime_overhead_terms(
    plan: TrainingPlan, placement: Placement, allocated: float
) -> Iterable[MemoryTerm]:
    """Runtime-overhead terms of one rank (``component="runtime_overheads"``): memory the
    process uses beyond its tensors (CUDA context, allocator reserve, library workspaces).

    ``allocated`` is the peak of every other component (bytes of live tensors at the
    peak phase), e.g. for an allocator reserve sized as a fraction of it. Kept apart so a
    comparison with allocator-level measurements can leave them out.

    .. versionadded:: plugin API 1.2
    """


REGISTRATION_HOOKS = (
    "mlsysim_optimizers", "mlsysim_checkpointing_strategies", "mlsysim_sharding_rules",
    "mlsysim_profiles",
)
COMPONENT_HOOKS = {
    "weights": "mlsysim_weight_terms",
    "gradients": "mlsysim_gradient_terms",
    "optimizer_state": "mlsysim_optimizer_state_terms",
    "activations": "mlsysim_activation_terms",
    "communication_buffers": "mlsysim_communication_buffer_terms",
    "runtime_overheads": "mlsysim_runtime_overhead_terms",
}


# --- catalog hooks (registration hooks for catalog entries) --------------------------
#
# Collected by ``mlsysim_core.catalog`` (not by the registry), lazily, once per plugin
# manager: when the catalog is listed, or a name is looked up that neither the built-in
# catalog nor the user catalog directory has. See docs/catalog.md.

if TYPE_CHECKING:
    from .catalog import CatalogEntry


@_hookspec
def mlsysim_catalog_models() -> Iterable[CatalogEntry]:
    """Add models to the catalog: an iterable of ``CatalogEntry`` whose ``value`` is a
    ``TransformerWorkload`` or ``SparseTransformerWorkload``.

    Example::

        @hookimpl
        def mlsysim_catalog_models():
            return [CatalogEntry.from_dict({"key": "myorg/lm-1b", "parameters": 1_100_000_000,
                                            "layers": 22, "hidden_dim": 2048, "heads": 32},
                                           kind="model")]
    """


@_hookspec
def mlsysim_catalog_hardware() -> Iterable[CatalogEntry]:
    """Add accelerators to the catalog: an iterable of ``CatalogEntry`` whose ``value`` is a
    ``HardwareNode``."""


CATALOG_HOOKS = {"model": "mlsysim_catalog_models", "hardware": "mlsysim_catalog_hardware"}
