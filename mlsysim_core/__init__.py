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
# The plugin API's (major, minor): a minor bump only adds (history: docs/hooks.md#evolving-the-hooks).
PLUGIN_API_VERSION = (3, 1)
# Imported on first use: the solver pulls in the plugin manager, and plugin modules import this package.
_LAZY = {"estimate": "scenario", "TrainingMemoryModel": "solver", "TrainingMemoryResult": "result", "TrainingPlan": "plan",
         "Placement": "plan", "PluginManager": "manager", "get_plugin_manager": "manager"}
# Moved out of the core to the plugins that own them (still importable from here, with a warning).
_MOVED = {"LaunchFormatSpec": "mlsysim_plugins.launch", "StepTimeSpec": "mlsysim_plugins.steptime_hookspecs",
          "Collective": "mlsysim_plugins.steptime_hookspecs"}


def __getattr__(name):
    import importlib
    if name in _MOVED:
        import warnings
        warnings.warn(f"mlsysim_core.{name} moved to {_MOVED[name]} (plugin API 3.1); import it from there",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(_MOVED[name]), name)
    if name in _LAZY:
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
