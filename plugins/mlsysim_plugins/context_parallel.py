"""Context parallelism: the sequence is split over cp ranks, so every per-token activation
divides by cp. Two rules for the ``cp`` axis:

* ``cp`` (the default; ring attention, as Megatron-Core/Transformer Engine run it): each
  rank keeps a send and a receive buffer for the K/V chunk it passes around the ring;
* ``cp-ulysses`` (DeepSpeed-Ulysses all-to-all; ``sharding_rules={"cp": "cp-ulysses"}``):
  q, k, v are exchanged from a sequence split to a head split and the output back: send
  and receive buffers of the local q, k, v and output. The heads must divide over tp x cp.

Parameters are replicated over cp (the ZeRO rules shard over dp x cp, as Megatron's
distributed optimizer does)."""

from mlsysim_core import (BACKWARD, COMMUNICATION_BUFFERS, FORWARD, LayoutError, MemoryTerm,
                          ShardingEffect, ShardingRuleSpec, hookimpl)
from mlsysim_plugins.steptime_hookspecs import COLLECTIVES as STEPTIME_COLLECTIVES, Collective

from mlsysim_core.memo import memoize


@memoize
def effect(c, tokens, kv_width, q_width, tp, b, style="ring"):
    if c == 1:
        return ShardingEffect()
    chunk = tokens // c
    if style == "ring":
        buffers = (MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="ring-attention K/V send + receive buffers",
            nbytes=2 * 2 * chunk * kv_width * b / tp, phases=(FORWARD, BACKWARD),
            formula=f"2 (send, recv) x 2 (K, V) x b*s/cp={chunk:,} tokens x kv_heads*head_dim={kv_width:,}"
                    + (f" / tp={tp}" if tp > 1 else "") + f" x {b} B"),)
    else:
        width = 2 * q_width + 2 * kv_width      # q, k, v in; the attention output back
        buffers = (MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="Ulysses all-to-all q/k/v/output send + receive buffers",
            nbytes=2 * chunk * width * b / tp, phases=(FORWARD, BACKWARD),
            formula=f"2 (send, recv) x b*s/cp={chunk:,} tokens x (2 x q {q_width:,} + 2 x kv {kv_width:,})"
                    + (f" / tp={tp}" if tp > 1 else "") + f" x {b} B"),)
    return ShardingEffect(activation_shards=c, sequence_shards=c, buffer_terms=buffers)


def apply(plan, options, *, style="ring"):
    c = plan.cp_size
    if c == 1:
        return effect(1, 0, 0, 0, 1, 0)
    if plan.seq_len % c:
        raise LayoutError("cp_size", c, f"a divisor of seq_len={plan.seq_len}",
                          "context parallelism splits the sequence evenly over cp ranks")
    model = plan.model
    head_dim = model.head_dim or (plan.hidden_dim // model.heads if model.heads else None)
    kv = model.kv_heads or model.heads
    kv_width = kv * head_dim if kv and head_dim else plan.hidden_dim
    q_width = model.heads * head_dim if model.heads and head_dim else plan.hidden_dim
    if style == "all-to-all" and model.heads and model.heads % (plan.tp_size * c):
        raise LayoutError("cp_size", c, f"a value with tp x cp dividing the model's {model.heads} heads",
                          "Ulysses all-to-all gives every rank whole attention heads")
    return effect(c, plan.microbatch * plan.seq_len, kv_width, q_width, plan.tp_size, plan.bytes_per_value, style)


def apply_ulysses(plan, options):
    return apply(plan, options, style="all-to-all")


# Ring attention, declared for the step time: the K/V chunk passed around the ring (cp - 1 sends)
# in each forward of a layer, K/V and dK/dV in its backward, hidden behind the layer's attention.
RING = (Collective(kind="ring-pass", volume="kv", group="cp", per="layer", forward=1, backward=2,
                   overlaps="attention"),)


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="cp", axis="cp", apply=apply, extensions={STEPTIME_COLLECTIVES: RING},
                             description="activations / cp (sequence split); ring-attention K/V buffers"),
            ShardingRuleSpec(name="cp-ulysses", axis="cp", apply=apply_ulysses,
                             description="activations / cp (sequence split); Ulysses all-to-all q/k/v/output buffers")]
