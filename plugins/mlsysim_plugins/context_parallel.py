"""Context parallelism (ring attention, as Megatron-Core/Transformer Engine run it): the
sequence is split over cp ranks, so every per-token activation divides by cp, and each
rank keeps a send and a receive buffer for the K/V chunk it passes around the ring.
Parameters are replicated over cp (the ZeRO rules shard over dp x cp, as Megatron's
distributed optimizer does)."""

from mlsysim_core import (BACKWARD, COMMUNICATION_BUFFERS, FORWARD, LayoutError, MemoryTerm,
                          ShardingEffect, ShardingRuleSpec, hookimpl)

from ._memo import memoize


@memoize
def effect(c, tokens, kv_width, tp, b):
    if c == 1:
        return ShardingEffect()
    chunk = tokens // c
    buffers = (MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="ring-attention K/V send + receive buffers",
        nbytes=2 * 2 * chunk * kv_width * b / tp, phases=(FORWARD, BACKWARD),
        formula=f"2 (send, recv) x 2 (K, V) x b*s/cp={chunk:,} tokens x kv_heads*head_dim={kv_width:,}"
                + (f" / tp={tp}" if tp > 1 else "") + f" x {b} B"),)
    return ShardingEffect(activation_shards=c, buffer_terms=buffers)


def apply(plan, options):
    c = plan.cp_size
    if c == 1:
        return effect(1, 0, 0, 1, 0)
    if plan.seq_len % c:
        raise LayoutError("cp_size", c, f"a divisor of seq_len={plan.seq_len}",
                          "context parallelism splits the sequence evenly over cp ranks")
    model = plan.model
    head_dim = model.head_dim or (plan.hidden_dim // model.heads if model.heads else None)
    kv = model.kv_heads or model.heads
    kv_width = kv * head_dim if kv and head_dim else plan.hidden_dim
    return effect(c, plan.microbatch * plan.seq_len, kv_width, plan.tp_size, plan.bytes_per_value)


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="cp", axis="cp", apply=apply,
                             description="activations / cp (sequence split); ring K/V send and receive buffers")]
