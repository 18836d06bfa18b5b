"""Selective recomputation: recompute only the attention core; keep 34*s*b*h bytes per layer."""

from typing import Any

import attrs

from mlsysim_core import CheckpointingSpec, hookimpl
from mlsysim_core.errors import InvalidInputError, NotModelledError

from ._lazy import lazy_module
from . import _korthikanti

model = lazy_module(globals(), "model", "mlsysim_plugins.measured.model")

PER_TOKEN_BYTES = 34   # Korthikanti Table 2, fp16, selective recompute
DEFAULT_MODULES = ("core_attn",)     # Megatron-Core's recompute_modules default (transformer_config.py)
MODULES = ("core_attn", "layernorm", "moe_act")     # those a family may describe (families.MEGATRON_MODULES)


def _modules(value):
    if isinstance(value, str):     # one name, or names with commas (--option selective.modules=layernorm,moe_act)
        value = [v.strip() for v in value.split(",") if v.strip()]
    value = tuple(value) if isinstance(value, list) else value
    if not isinstance(value, tuple) or not value:
        raise InvalidInputError("plugin_options['selective'].modules", value,
                                f"a non-empty list of Megatron-Core recompute modules: {', '.join(MODULES)}")
    for module in value:
        if module not in MODULES:
            raise InvalidInputError("plugin_options['selective'].modules", module, f"one of {', '.join(MODULES)}")
    return tuple(dict.fromkeys(value))


@attrs.frozen(kw_only=True)
class SelectiveOptions:
    """``modules``: what is recomputed, as Megatron-Core's ``recompute_modules`` under
    ``recompute_granularity="selective"`` names it: ``core_attn`` (the attention core, the default),
    ``layernorm`` and ``moe_act`` (for a family that declares them: ``ArchitectureFamily.
    megatron_recompute_modules``, under a Megatron-Core regime)."""
    # Any: the converter reads a string (a structuring hook for tuple would split it into characters)
    modules: Any = attrs.field(default=DEFAULT_MODULES, converter=_modules)


def _options(plan, options):
    if options is not None:
        return options
    opts = plan.options.get(plan.activation_checkpointing) if plan.options else None
    return SelectiveOptions() if opts is None else opts


def activation_terms(plan, placement, options):
    modules = _options(plan, options).modules
    if modules != DEFAULT_MODULES:
        raise NotModelledError("plugin_options['selective'].modules", list(modules), "['core_attn'] under the "
                               "reference profile", "Korthikanti's selective recompute is the attention core's")
    return _korthikanti.activation_terms(plan, placement, PER_TOKEN_BYTES, 0,
                                         "stored activations (selective recompute)")


def measured_activation_terms(plan, placement, options):
    """Measured grade: every layer keeps what it saves except eager attention's s x s
    tensors (scores, probabilities, dropout mask), which are recomputed; with fused
    attention (sdpa) there are none, so this equals no recomputation. Other Megatron-Core
    ``recompute_modules`` (``modules``): ``checkpointing.recompute_module_terms``."""
    modules = _options(plan, options).modules
    if modules == DEFAULT_MODULES:
        return model.layer_terms(plan, placement, selective=True)
    from .measured.checkpointing import recompute_module_terms
    return recompute_module_terms(plan, placement, modules)


def recompute(plan):
    """The share of the forward the backward runs again (the planner's step time)."""
    from .checkpointing_policies import selective_share
    return selective_share(plan)


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="selective", description="recompute attention core; 34*s*b*h B/layer",
                              activation_terms=activation_terms,
                              extensions={"measured.activation_terms": measured_activation_terms,
                                          "measured.saves_rank": 1,     # fit techniques' ladder: the least saving
                                          "explain.why": (
                                              "the tensors the forward pass saves for the backward pass",
                                              "34·s·b·h bytes per layer at 16 bit (Korthikanti et al. 2023); the "
                                              "attention core is recomputed in the backward pass instead of stored.")},
                              recompute=recompute, recomputes="part", options_type=SelectiveOptions)]
