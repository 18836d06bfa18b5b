"""Expert parallelism: the reference spreads ALL parameters evenly over ep ranks
(an approximation: dense weights are really replicated). Only mixture-of-experts models
can use it, and with at most one rank per expert."""

from mlsysim_core import LayoutError, ShardingEffect, ShardingRuleSpec, hookimpl
from mlsysim_plugins.steptime_hookspecs import COLLECTIVES as STEPTIME_COLLECTIVES, Collective

from mlsysim_core.memo import memoize

from ._lazy import lazy_module

buffers = lazy_module(globals(), "buffers", "mlsysim_plugins.measured.buffers")

# The reference's note ends "; routing imbalance is modeled separately by MoERoutingModel.",
# a class of mlsysim that this package does not have: that clause is left out.
MOE_NOTE = "MoE memory approximation: total expert parameters are evenly sharded by expert parallelism."


def apply(plan, options):
    e, model = plan.ep_size, plan.model
    if e > 1 and not model.is_sparse:
        raise LayoutError("ep_size", e, "1 for a dense model",
                          f"{model.name!r} has no experts to distribute")
    if model.is_sparse and e > model.experts:
        raise LayoutError("ep_size", e, f"at most the model's {model.experts} experts")
    return effect(e)


@memoize
def effect(e):
    return ShardingEffect(parameter_shards=e, expert_shards=e, notes=(MOE_NOTE,) if e > 1 else ())


def all_to_all(plan, placement, options):
    """Measured grade: the experts' dispatch and combine buffers."""
    return buffers.expert_all_to_all(plan, placement)


# Declared for the step time: dispatch and combine all-to-alls of the routed tokens (tokens x
# experts per token x hidden) per layer in each forward (recomputed ones too) and two in its
# backward, on the critical path (no overlap modelled).
COLLECTIVES = (Collective(kind="all-to-all", volume="routed", group="ep", per="layer", forward=2, backward=2),)


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="ep", axis="ep", apply=apply, extensions={"measured.buffer_terms": all_to_all,
                                                                           STEPTIME_COLLECTIVES: COLLECTIVES},
                             description="parameters / ep (mixture-of-experts models only)")]
