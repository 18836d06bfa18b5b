"""A memo for measured-grade term lists: searches and sweeps solve the same shapes again
and again, and building ~25 terms costs more than the rest of a solve. Terms are frozen,
so a cached list is reused as is (a copy of the list: the solver extends lists).

The key of a solve (everything a measured-grade term reads from the plan and the
placement, compared by value) is computed once per (plan, placement) pair and interned as
a small integer, so that each of the ~7 cached functions a solve calls hashes a short
tuple instead of re-reading and re-hashing ~35 fields (the model's hash alone walks all
its fields).
"""

from __future__ import annotations

import functools
import itertools

ENABLED = True     # tests turn it off to check the cached and plain paths agree byte for byte
_MAX = 4096

_tokens: dict = {}                 # plan key -> its token (an int never reissued)
_counter = itertools.count()
_last: tuple = (None, None, None)  # (plan, placement, token) of the latest lookup


def plan_key(plan, placement) -> tuple:
    """Everything a measured-grade term reads from a plan and a placement."""
    return (plan.model, plan.regime, plan.microbatch, plan.seq_len, plan.optimizer, plan.activation_checkpointing,
            plan.optimizer_impl, plan.attention, plan.dropout, plan.checkpointed_layers, plan.runtime_overheads,
            plan.tp_size, plan.pp_size, plan.dp_size, plan.ep_size, plan.cp_size, plan.trainable_fraction,
            plan.lora, plan.pipeline_schedule, plan.virtual_stages, plan.expert_tp_size, plan.stage_layers,
            plan.offload, plan.rank, plan.moe_capacity_factor, plan.sequence_parallel, plan.zero_stage, plan.rules["dp"],
            plan.gradient_accumulation_steps, plan.precision,
            placement.parameters_per_rank, placement.trainable_parameters_per_rank, placement.layers_per_stage,
            placement.activation_shards, placement.weight_shards, placement.gradient_shards,
            placement.optimizer_state_shards)


def _token(plan, placement) -> int:
    """The interned plan key of this (plan, placement); plans and placements are frozen,
    so the latest pair's token is reused by identity (one solve asks ~7 times)."""
    global _last
    last = _last
    if last[0] is plan and last[1] is placement:
        return last[2]
    key = plan_key(plan, placement)
    token = _tokens.get(key)
    if token is None:
        if len(_tokens) >= _MAX:
            _tokens.clear()     # tokens are never reissued, so stale entries elsewhere never match
        token = _tokens[key] = next(_counter)
    _last = (plan, placement, token)
    return token


def cached_terms(fn):
    """Memoize ``fn(plan, placement, *extra, **kw)`` on the plan's measured-grade inputs."""
    cache: dict = {}

    @functools.wraps(fn)
    def wrapper(plan, placement, *extra, **kw):
        if not ENABLED:
            return fn(plan, placement, *extra, **kw)
        last = _last
        token = last[2] if last[0] is plan and last[1] is placement else _token(plan, placement)
        key = (token, extra, tuple(sorted(kw.items()))) if kw else (token, extra)
        hit = cache.get(key)
        if hit is None:
            if len(cache) >= _MAX:
                cache.clear()
            hit = cache[key] = tuple(fn(plan, placement, *extra, **kw))
        return list(hit)
    return wrapper
