"""ZeRO stages 0-3 (Rajbhandari et al. 2020): shard model states over dp ranks.

Stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the
weights. ``zero_stage`` selects ``zero<stage>``; each stage is one data-parallel rule.
"""

import attrs

from mlsysim_core import ShardingEffect, ShardingRuleSpec, hookimpl
from mlsysim_plugins.steptime_hookspecs import COLLECTIVES as STEPTIME_COLLECTIVES, Collective

from mlsysim_core.memo import memoize

from . import _deepspeed_buckets as ds_options
from ._lazy import lazy_module

buffers = lazy_module(globals(), "buffers", "mlsysim_plugins.measured.buffers")

WHAT = {0: "nothing sharded (plain data parallelism)", 1: "optimizer state / dp",
        2: "optimizer state and gradients / dp", 3: "optimizer state, gradients and weights / dp"}


@memoize
def effect(stage, d):
    notes = (f"ZeRO-{stage}: data-parallel state sharding applied across {d} ranks.",) if stage else ()
    return ShardingEffect(optimizer_state_shards=d if stage >= 1 else 1,
                          gradient_shards=d if stage >= 2 else 1,
                          weight_shards=d if stage >= 3 else 1, notes=notes)


def make_apply(stage):
    def apply(plan, options):   # the distributed optimizer shards over dp x cp (Megatron-Core)
        e = effect(stage, plan.dp_size * plan.cp_size)
        if options is None or not options.replaces_communication_buffer_fraction:
            return e
        return _with_buckets(stage, e, plan, options)
    return apply


def _with_buckets(stage, e, plan, options):
    """DeepSpeed's buffers, its options given (``deepspeed_buckets``): the reference profile's
    terms (the measured profile's zero3 prices its own, ``zero3_buffers``) and the note."""
    from . import _deepspeed_buckets as ds
    b, params = plan.bytes_per_value, plan.model.parameters / (plan.tp_size * plan.pp_size)   # the rank's, unsharded
    terms = (ds.zero12_terms(options, b, params * plan.trainable_fraction) if stage < 3
             else ds.zero3_reference_terms(options, b, params))
    return attrs.evolve(e, buffer_terms=e.buffer_terms + tuple(terms),
                        notes=e.notes + (ds.given_note(f"zero{stage}", options),))


def ddp_buffers(plan, placement, options):
    """Measured grade, plain data parallelism: PyTorch DDP's gradient buckets, when the
    gradients are all-reduced over more than one replica (this rule's group, dp x cp)."""
    return buffers.ddp_buckets(plan, placement, plan.dp_size * plan.cp_size)


def zero3_buffers(plan, placement, options):
    """Measured grade, ZeRO-3: one layer gathered at a time, its gradients reduce-scattered;
    with DeepSpeed's options given, its ipg bucket, prefetch, reuse and persistent parameters."""
    terms = buffers.layer_gather(plan, placement)
    if options is not None and options.replaces_communication_buffer_fraction and placement.weight_shards > 1:
        terms = terms + buffers.deepspeed_zero3(plan, placement, options)
    return terms


MEASURED_BUFFERS = {0: ddp_buffers, 3: zero3_buffers}
OPTIONS = {1: ds_options.ZeroBucketOptions, 2: ds_options.ZeroBucketOptions, 3: ds_options.Zero3BucketOptions}


def _dp(kind, per, overlaps, first_layer_exposed=False):
    """One collective of the rank's gradient (or, all-gathered, parameter) shard over the dp x cp ranks."""
    return Collective(kind=kind, volume="parameters" if kind == "all-gather" else "gradients", group="dp", per=per, overlaps=overlaps,
                      first_layer_exposed=first_layer_exposed, **{overlaps: 1})


# What each stage communicates, declared for the step time: stage 0 all-reduces the gradients
# beside the last backward; 1 reduce-scatters them there and all-gathers the updated shard beside
# the next forward; 2 reduce-scatters every micro-batch; 3 gathers the weights for each forward
# and again for each backward (the first layer's not hidden) and reduce-scatters after it.
COLLECTIVES = {
    0: (_dp("all-reduce", "step", "backward"),),
    1: (_dp("reduce-scatter", "step", "backward"), _dp("all-gather", "step", "forward")),
    2: (_dp("reduce-scatter", "micro-batch", "backward"), _dp("all-gather", "step", "forward")),
    3: (_dp("all-gather", "micro-batch", "forward", True), _dp("all-gather", "micro-batch", "backward"),
        _dp("reduce-scatter", "micro-batch", "backward")),
}


# What each stage shards over the data-parallel ranks, said by `explain` (render.EXPLAIN_SHARDS).
EXPLAIN_SHARDS = {0: (), 1: ("optimizer_state",), 2: ("optimizer_state", "gradients"),
                  3: ("optimizer_state", "gradients", "weights")}


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name=f"zero{stage}", axis="dp", apply=make_apply(stage),
                             description=f"ZeRO-{stage}: {WHAT[stage]}", options_type=OPTIONS.get(stage),
                             extensions={"measured.buffer_terms": MEASURED_BUFFERS.get(stage),
                                         "explain.shards": EXPLAIN_SHARDS[stage], "explain.label": f"ZeRO-{stage}",
                                         "search.unsharded_at_one_rank": stage > 0,
                                         STEPTIME_COLLECTIVES: COLLECTIVES[stage]})
            for stage in range(4)]
