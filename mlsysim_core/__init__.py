"""mlsysim-core: how much memory one accelerator needs to train a model, and does it fit.

    >>> from mlsysim_core import TrainingMemoryModel
    >>> r = TrainingMemoryModel().solve("llama3-8b", "h100", batch_size=8, seq_len=1024)
    >>> round(r.gb.total_memory, 3), r.feasible
    (165.79, False)

Plugin authors import ``hookimpl``, the spec types and ``MemoryTerm`` from here: the whole plugin API.
"""

import pluggy as _pluggy

from .errors import (InvalidInputError, InvalidInputTypeError, LayoutError, MlsysimError, NotInstalledError,
                     NotModelledError, PluginConflictError, PluginContractError, PluginError, PluginLoadError)
from .hookspecs import PROJECT as _PROJECT
from .specs import CheckpointingSpec, OptimizerSpec, ProfileSpec, ShardingEffect, ShardingRuleSpec, SplitSoFar
from .terms import (ACCELERATOR, ACTIVATIONS, BACKWARD, BACKWARD_END, COMMUNICATION_BUFFERS, COMPONENTS,
                    FORWARD, GRADIENTS, HOST, OPTIMIZER_STATE, OPTIMIZER_STEP, PHASES, RUNTIME_OVERHEADS,
                    WEIGHTS, MemoryTerm)
from .types import HardwareNode, SparseTransformerWorkload, TransformerWorkload

hookimpl = _pluggy.HookimplMarker(_PROJECT)

__version__ = "0.1.0"

# The plugin API's (major, minor) version: a minor bump only adds (hooks, hook arguments, optional
# spec fields); a major one removes or changes something, after a release that warns. 1.1: SplitSoFar.
# 1.2: the backward_end phase, runtime_overheads and its hook, measured-grade spec callables,
# ProfileSpec.grade. 2.0: profiles own their options and hooks (ProfileSpec.options_type, prepare,
# ranks, relocate; mlsysim_addhooks; measured_buffer_terms; TrainingPlan.profile_options, rank, notes).
# 2.4: profiles declare what they do (ProfileSpec.callables, checks_layouts, exact_batch, sequence_limit,
# solve_cost); ProfileSpec.grade deprecated. 2.5: step-time models (mlsysim_step_time_models, StepTimeSpec),
# the rules' declared collectives (ShardingRuleSpec.collectives, Collective). 2.6: launch-config readers
# (mlsysim_launch_formats, LaunchFormatSpec).
# 3.0: the core knows no profile: the specs' measured_* fields, MEASURED_CALLABLES and ProfileSpec.grade
# removed (a profile's callables name a field or a dotted key of the specs' new ``extensions``: the measured
# profile's "measured.state_terms", ...); TrainingMemoryResult.regime is ``details`` (ProfileSpec.details).
# 3.1: a hook-spec module's REGISTRATION_HOOK_TYPES are collected (registry.extensions); the launch formats'
# and the step time's hooks moved to the plugins that own them (mlsysim_plugins.launch: LaunchFormatSpec;
# mlsysim_plugins.steptime_hookspecs: StepTimeSpec, Collective; the old names warn), a rule's collectives
# to its extensions["steptime.collectives"].
PLUGIN_API_VERSION = (3, 1)

# Imported on first use: the solver pulls in the plugin manager, and plugin modules import this package.
_LAZY = {"estimate": "scenario", "TrainingMemoryModel": "solver", "TrainingMemoryResult": "result", "TrainingPlan": "plan",
         "Placement": "plan", "PluginManager": "manager", "get_plugin_manager": "manager"}


# Moved out of the core to the plugins that own them (still importable from here, with a warning).
_MOVED = {"LaunchFormatSpec": "mlsysim_plugins.launch", "StepTimeSpec": "mlsysim_plugins.steptime_hookspecs",
          "Collective": "mlsysim_plugins.steptime_hookspecs"}


def __getattr__(name):
    if name in _MOVED:
        import importlib
        import warnings
        warnings.warn(f"mlsysim_core.{name} moved to {_MOVED[name]} (plugin API 3.1); import it from there",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(_MOVED[name]), name)
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'mlsysim_core' has no attribute {name!r}")


__all__ = [
    "estimate", "hookimpl", "PLUGIN_API_VERSION", "TrainingMemoryModel", "TrainingMemoryResult", "TrainingPlan", "Placement",
    "PluginManager", "get_plugin_manager", "TransformerWorkload", "SparseTransformerWorkload", "HardwareNode",
    "MemoryTerm", "OptimizerSpec", "CheckpointingSpec", "ShardingRuleSpec", "ShardingEffect", "SplitSoFar",
    "ProfileSpec", "WEIGHTS", "GRADIENTS", "OPTIMIZER_STATE", "ACTIVATIONS", "COMMUNICATION_BUFFERS",
    "RUNTIME_OVERHEADS", "COMPONENTS", "FORWARD", "BACKWARD", "BACKWARD_END", "OPTIMIZER_STEP", "PHASES",
    "ACCELERATOR", "HOST", "MlsysimError", "InvalidInputError", "InvalidInputTypeError", "LayoutError",
    "NotModelledError", "NotInstalledError", "PluginError", "PluginLoadError", "PluginConflictError",
    "PluginContractError",
]
