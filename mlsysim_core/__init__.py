"""mlsysim-core: how much memory one accelerator needs to train a model, and does it fit.

    >>> from mlsysim_core import TrainingMemoryModel
    >>> r = TrainingMemoryModel().solve("llama3-8b", "h100", batch_size=8, seq_len=1024)
    >>> round(r.gb.total_memory, 3), r.feasible
    (165.79, False)

Plugin authors import ``hookimpl``, the spec types and ``MemoryTerm`` from here; that
is the whole public plugin API.
"""

import pluggy as _pluggy

from .errors import (InvalidInputError, InvalidInputTypeError, LayoutError, MlsysimError,
                     NotInstalledError, NotModelledError, PluginConflictError, PluginContractError, PluginError,
                     PluginLoadError)
from .hookspecs import PROJECT as _PROJECT
from .specs import (CheckpointingSpec, OptimizerSpec, ProfileSpec, ShardingEffect,
                    ShardingRuleSpec, SplitSoFar)
from .terms import (ACCELERATOR, ACTIVATIONS, BACKWARD, BACKWARD_END, COMMUNICATION_BUFFERS, COMPONENTS,
                    FORWARD, GRADIENTS, HOST, OPTIMIZER_STATE, OPTIMIZER_STEP, PHASES, RUNTIME_OVERHEADS,
                    WEIGHTS, MemoryTerm)
from .types import HardwareNode, SparseTransformerWorkload, TransformerWorkload

hookimpl = _pluggy.HookimplMarker(_PROJECT)

__version__ = "0.1.0"

# The plugin API's version: (major, minor). A minor bump adds hooks, hook arguments or
# optional spec fields (old plugins keep working: pluggy's opt-in arguments); a major bump
# would remove or change something, after a release of deprecation warnings.
# 1.1: a sharding rule's apply may take SplitSoFar.
# 1.2: the backward_end phase, the runtime_overheads component and its hook, measured-grade
#      callables on optimizer and checkpointing specs (OptimizerSpec.measured_state_terms,
#      CheckpointingSpec.measured_activation_terms), ProfileSpec.grade.
# 2.0: profiles own their options and hooks: ProfileSpec.options_type / prepare / ranks /
#      relocate, the mlsysim_addhooks registration hook (a profile's own hook specs),
#      ShardingRuleSpec.measured_buffer_terms, TrainingPlan.profile_options / rank / notes
#      (the measured-only plan fields moved into the profile's options), mlsysim_core.memo.
#      See docs/migrating.md.
PLUGIN_API_VERSION = (2, 0)


def __getattr__(name):
    # The solver pulls in the plugin manager; import it on first use so that
    # `import mlsysim_core` stays cheap for plugin modules.
    if name in ("TrainingMemoryModel", "TrainingMemoryResult", "TrainingPlan", "Placement",
                "PluginManager", "get_plugin_manager"):
        from . import manager, plan, result, solver
        return {"TrainingMemoryModel": solver.TrainingMemoryModel,
                "TrainingMemoryResult": result.TrainingMemoryResult,
                "TrainingPlan": plan.TrainingPlan, "Placement": plan.Placement,
                "PluginManager": manager.PluginManager,
                "get_plugin_manager": manager.get_plugin_manager}[name]
    raise AttributeError(f"module 'mlsysim_core' has no attribute {name!r}")


__all__ = [
    "hookimpl", "PLUGIN_API_VERSION", "TrainingMemoryModel", "TrainingMemoryResult", "TrainingPlan", "Placement",
    "PluginManager", "get_plugin_manager",
    "TransformerWorkload", "SparseTransformerWorkload", "HardwareNode",
    "MemoryTerm", "OptimizerSpec", "CheckpointingSpec", "ShardingRuleSpec", "ShardingEffect", "SplitSoFar",
    "ProfileSpec",
    "WEIGHTS", "GRADIENTS", "OPTIMIZER_STATE", "ACTIVATIONS", "COMMUNICATION_BUFFERS",
    "RUNTIME_OVERHEADS", "COMPONENTS", "FORWARD", "BACKWARD", "BACKWARD_END", "OPTIMIZER_STEP", "PHASES", "ACCELERATOR", "HOST",
    "MlsysimError", "InvalidInputError", "InvalidInputTypeError", "LayoutError", "NotModelledError", "NotInstalledError",
    "PluginError", "PluginLoadError", "PluginConflictError", "PluginContractError",
]
