"""A memo for measured-grade term lists: searches and sweeps solve the same shapes again
and again, and building ~25 terms costs more than the rest of a solve. Terms are frozen,
so a cached list is reused as is (a copy of the list: the solver extends lists)."""

from __future__ import annotations

import functools

ENABLED = True     # tests turn it off to check the cached and plain paths agree byte for byte
_MAX = 4096


def plan_key(plan, placement) -> tuple:
    """Everything a measured-grade term reads from a plan and a placement."""
    return (plan.model, plan.regime, plan.microbatch, plan.seq_len, plan.optimizer, plan.activation_checkpointing,
            plan.optimizer_impl, plan.attention, plan.dropout, plan.checkpointed_layers, plan.runtime_overheads,
            plan.tp_size, plan.pp_size, plan.dp_size, plan.ep_size, plan.cp_size, plan.trainable_fraction,
            plan.lora, plan.pipeline_schedule, plan.virtual_stages, plan.expert_tp_size, plan.stage_layers,
            plan.offload, plan.rank, plan.sequence_parallel, plan.zero_stage, plan.rules["dp"],
            placement.parameters_per_rank, placement.trainable_parameters_per_rank, placement.layers_per_stage,
            placement.activation_shards, placement.weight_shards, placement.gradient_shards,
            placement.optimizer_state_shards)


def cached_terms(fn):
    """Memoize ``fn(plan, placement, *extra, **kw)`` on the plan's measured-grade inputs."""
    cache: dict = {}

    @functools.wraps(fn)
    def wrapper(plan, placement, *extra, **kw):
        if not ENABLED:
            return fn(plan, placement, *extra, **kw)
        key = (plan_key(plan, placement), extra, tuple(sorted(kw.items())) if kw else ())
        hit = cache.get(key)
        if hit is None:
            if len(cache) >= _MAX:
                cache.clear()
            hit = cache[key] = tuple(fn(plan, placement, *extra, **kw))
        return list(hit)
    return wrapper
