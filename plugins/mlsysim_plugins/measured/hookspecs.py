"""The measured profile's own hooks: what varies between runs it can describe.

Added to the plugin manager by the measured profile (``mlsysim_addhooks``); implement them
with ``mlsysim_core.hookimpl`` in any plugin, built-in or pip-installed. Each returns named
items, collected once per process into ``registry.extensions[<hook name>]``. Two plugins
registering the same name is an error naming both, with the way to block one.

Which item a solve uses is decided by the item itself, never by the physics code:
an architecture family ``claims`` the model, a regime and a kernel and a schedule are
named by the user (``regime=``, ``attention=``, ``pipeline_schedule=``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import pluggy

if TYPE_CHECKING:
    from .families import ArchitectureFamily
    from .kernels import AttentionKernel
    from .loss_implementations import LossImplementation
    from .quantizations import QuantImplementation
    from .regimes import Regime
    from .schedules import PipelineSchedule
    from .techniques import Technique

_hookspec = pluggy.HookspecMarker("mlsysim")


@_hookspec
def mlsysim_measured_architectures() -> Iterable[ArchitectureFamily]:
    """Architecture families: the parts of a decoder layer with their bytes, how each part
    splits under tensor/sequence/context/expert parallelism, what selective recompute
    drops, the parameter tensors, and which models the family describes (``claims``)."""


@_hookspec
def mlsysim_measured_regimes() -> Iterable[Regime]:
    """Training regimes: the bytes of weights, gradients, master copy, optimizer state,
    matmul outputs and the residual stream (``regime=`` selects one by name)."""


@_hookspec
def mlsysim_measured_attention_kernels() -> Iterable[AttentionKernel]:
    """Attention kernels: what one layer's attention saves for backward (``attention=``)."""


@_hookspec
def mlsysim_measured_pipeline_schedules() -> Iterable[PipelineSchedule]:
    """Pipeline schedules: how many micro-batches each stage holds at its peak
    (``pipeline_schedule=``)."""


@_hookspec
def mlsysim_measured_techniques() -> Iterable[Technique]:
    """Techniques (``techniques.Technique``): the options each owns (solve keywords, CLI flags,
    scenario fields, assembled into the profile's options), how it changes the plan at each
    stage of ``prepare``, what it moves to the host, and its candidates, added step time and
    caveats for ``fit techniques``."""


@_hookspec
def mlsysim_measured_losses() -> Iterable[LossImplementation]:
    """Loss implementations (``loss_implementations.LossImplementation``): what each keeps for the
    backward and its forward and backward temporaries, in place of the default cross-entropy's
    (``loss=`` selects one by name)."""


@_hookspec
def mlsysim_measured_quant_implementations() -> Iterable[QuantImplementation]:
    """Implementations of a quantized LoRA base (``quantizations.QuantImplementation``): the lora.quantization
    kinds each implements, the bytes it stores per quantized weight and what dequantizing one holds at its peak
    (``lora.quant_implementation`` selects one by name)."""


HOOKS = ("mlsysim_measured_architectures", "mlsysim_measured_regimes", "mlsysim_measured_attention_kernels",
         "mlsysim_measured_pipeline_schedules", "mlsysim_measured_techniques", "mlsysim_measured_losses",
         "mlsysim_measured_quant_implementations")
