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
from mlsysim_plugins.steptime_hookspecs import (COLLECTIVES as STEPTIME_COLLECTIVES, TRAFFIC as STEPTIME_TRAFFIC,
                                                 Collective, RingTraffic)

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


# Ring attention, declared for the step time as PyTorch's context parallelism runs it (torchtitan's CP, the
# runs validation/steptime/published.py cites): pytorch/pytorch torch/distributed/tensor/experimental/_attention.py
# (stored version 0123248a484ffe531edb5098b986c1bac08cd296). _ContextParallelOptions: "rotate_method:
# _RotateMethod = _RotateMethod.ALL_GATHER", "enable_load_balance: bool = True", "convert_to_f32: bool = True".
# * forward (_templated_ring_attention): _AllGatherRotater "Only one communication will be done": one all-gather
#   of the rank's K/V (n - 1 chunks received, a ring pass's bytes), issued before step 0's SDPA and waited for at
#   step 1: hidden behind one step's attention only (load balanced, every step computes 1/n of the rank's pairs);
# * backward (_templated_ring_attention_backward): the K/V all-gathered again ("kv_rotater"), and
#   "dkv_rotater = _create_rotater(group, 2, method=_RotateMethod.ALL_TO_ALL)": the dK/dV buffer, accumulated in
#   float32 ("accum_dtype = torch.float32 if _cp_options.convert_to_f32"), sent to the next rank in every step
#   (n sends), each waited for after the next step's SDPA backward, the last one after the loop (exposed).
# K/V are split over tp with the heads (shard="tp").
RING = (Collective(kind="ring-pass", volume="kv", group="cp", per="layer", forward=1, backward=1,
                   overlaps="attention-step", shard="tp"),
        Collective(kind="send-recv", volume="kv", group="cp", per="layer", backward=1, overlaps="attention-step",
                   per_step=True, element_bytes=4, shard="tp"))

# The same file's elementwise work beside the SDPA calls, eager (bytes read + written per element; bf16 2 B,
# float32 4 B). Forward, _SDPAMerger with convert_to_f32: each step after the first casts the step's output to
# float32 (2 + 4) and merges "out = out - F.sigmoid(block_lse - lse) * (out - block_out)" (three float32 ops:
# 12 + 8 + 12; the per-head lse terms are a rounding error): 38 per q element; "next_kv = torch.cat([key.flatten(),
# value.flatten()])" before each exchange: 4 per k, v element. Once per pass: the first step's cast (6) and
# results()' cast back to bf16 (4 + 2): 12 per q element. Backward, each step after the first: "grad_query +=
# grad_query_" into float32 (4 + 2 + 4 = 10 per q element); per k, v element the float32 accumulation (10), the
# dK/dV cat for the send (8) and the K/V cat (4): 22. Once per pass: the float32 zeros (4) and the first step's
# accumulation (10), the final cast of dQ (6): 20 per q element; zeros (4), accumulation (10), cat (8), K/V cat
# (4) and the final cast of dK/dV (6): 32 per k, v element. (The _partial_update torch.cat copies of the
# load-balanced half-steps are left out: a lower bound.) Kernels beyond the layer's own, counted from the same
# code: a forward step after the first launches its SDPA, the K/V cat, the two float32 casts (out, lse) and the
# merge's eight ops (out: sub, sigmoid, sub, mul, sub; lse: sub, logsigmoid, sub): 12; once per pass the first
# step's two casts and results()' two: 4. A backward step after the first: the flash backward's three kernels
# (FlashAttention-2's preprocess, main and dQ conversion), the K/V cat, the dK, dV and dQ accumulations and the
# dK/dV cat: 8; once per pass three float32 zeros, the first step's three accumulations, two cats and the two
# final casts: 10 (its SDPA backward is the layer's own).
TRAFFIC = RingTraffic(forward_step=(38, 4), forward_pass=(12, 0), backward_step=(10, 22), backward_pass=(20, 32),
                      kernels_step=(12, 8), kernels_pass=(4, 10),
                      source="pytorch/pytorch torch/distributed/tensor/experimental/_attention.py at "
                             "0123248a484ffe531edb5098b986c1bac08cd296: _SDPAMerger, "
                             "_templated_ring_attention(_backward)")


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="cp", axis="cp", apply=apply, extensions={STEPTIME_COLLECTIVES: RING, STEPTIME_TRAFFIC: TRAFFIC},
                             description="activations / cp (sequence split); ring-attention K/V buffers"),
            ShardingRuleSpec(name="cp-ulysses", axis="cp", apply=apply_ulysses,
                             description="activations / cp (sequence split); Ulysses all-to-all q/k/v/output buffers")]
