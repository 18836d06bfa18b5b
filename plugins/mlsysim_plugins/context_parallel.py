"""Context parallelism: the sequence is split over cp ranks, so every per-token activation
divides by cp. Two rules for the ``cp`` axis:

* ``cp`` (the default; ring attention, as Megatron-Core/Transformer Engine run it): each
  rank keeps a send and a receive buffer for the K/V chunk it passes around the ring;
* ``cp-ulysses`` (DeepSpeed-Ulysses all-to-all; ``sharding_rules={"cp": "cp-ulysses"}``):
  q, k, v are exchanged from a sequence split to a head split and the output back: send
  and receive buffers of the local q, k, v and output. The heads must divide over tp x cp.

Parameters are replicated over cp (the ZeRO rules shard over dp x cp, as Megatron's
distributed optimizer does).

The ring's implementation is the ``cp`` rule's option (``ContextParallelOptions.ring``): what the
step time counts of it (its collectives and the elementwise work beside them); its memory is the
same either way. ``"pytorch"`` (the default): PyTorch's context parallelism (torchtitan's);
``"transformer-engine"``: Transformer Engine's P2P ring (Megatron's ``--cp-comm-type p2p``)."""

import attrs

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


# Transformer Engine's P2P ring (Megatron-Core's default, --cp-comm-type p2p), as NVIDIA/TransformerEngine
# transformer_engine/pytorch/attention.py at 6792ecaa4131544b100ac4a552df3a85c560f085 runs it (AttnFuncWithCPAndKVP2P,
# flash_attn_p2p_communicate):
# * forward: "for i in range(cp_size + 1)": step i waits for its K/V ("wait until KV is received"), then, "if i <
#   (cp_size - 1)", sends its K/V buffer to the next rank and receives the next step's (isend/irecv of
#   "p2p_comm_buffers[i]", bf16 K and V concatenated) before computing step i's attention: n - 1 sends, each beside
#   one step's attention, none waited for after the loop (trailing=False);
# * backward: "for i in range(cp_size)": step i sends "p2p_comm_buffers[i % 2]", the K/V at step 0 ("send_tensor[0]"),
#   the K/V and the dK/dV accumulated so far in between, the dK/dV alone at the last step ("send_tensor[1]"), in
#   the K/V's dtype ("torch.empty((2, *kv.shape), dtype=kv.dtype"), computes step i's attention backward, then
#   "wait until dKV is received" and adds its own: n - 1 K/V sends and n - 1 dK/dV sends, each beside one step.
#   (Declared as two collectives, each hidden behind its step on its own: exact at cp 2; at larger cp the middle
#   steps carry both, and where their sum outlasts a step this is a lower bound.)
TE_RING = (Collective(kind="send-recv", volume="kv", group="cp", per="layer", forward=1, backward=1,
                      overlaps="attention-step", per_step=True, trailing=False, shard="tp"),
           Collective(kind="send-recv", volume="kv", group="cp", per="layer", backward=1, overlaps="attention-step",
                      per_step=True, trailing=False, shard="tp"))
# The same function's elementwise work, in the K/V's and the output's dtype (bf16: 2 B), bytes read + written per
# element. Forward: "out = torch.empty_like(q).zero_()" (2 per q element) once; after the loop every step's output
# corrected into it by the fused "flash_attn_fwd_out_correction" (@jit_fuser: out_per_step * exp(lse_step - lse)
# added to out: read 2 + 2, write 2: 6 per q element per step, the first step's in the pass); the "torch.cat((k...,
# v...))" of the first buffer (4 per k, v element). (The per-head softmax_lse corrections are a rounding error;
# the steps after a rank's own correct half its q: counted whole, an upper bound.) Backward: the K/V copied into
# the first buffer ("p2p_comm_buffers[0][0].copy_(kv)": 4 per k, v element); at step 0 dQ and dK/dV copied into
# their accumulators (4 each), at every later step added ("dq.add_", "dkv.add_": 6 each). Kernels beyond the
# layer's own: a forward step after the first, its flash kernel, the softmax_lse correction and the output
# correction (3); once per pass the zero, the lse clone and its two casts, the cat and the first step's
# correction (6). A backward step after the first: FlashAttention-2's three backward kernels and the two
# accumulations (5); once per pass the K/V copy and the first step's two copies (3).
TE_TRAFFIC = RingTraffic(forward_step=(6, 0), forward_pass=(8, 4), backward_step=(6, 6), backward_pass=(4, 8),
                         kernels_step=(3, 5), kernels_pass=(6, 3),
                         source="NVIDIA/TransformerEngine transformer_engine/pytorch/attention.py at "
                                "6792ecaa4131544b100ac4a552df3a85c560f085: AttnFuncWithCPAndKVP2P")

RINGS = {"pytorch": (RING, TRAFFIC), "transformer-engine": (TE_RING, TE_TRAFFIC)}


@attrs.frozen(kw_only=True)
class ContextParallelOptions:
    """``ring``: the ring attention's implementation, as the step time counts it (the memory is the
    same): ``"pytorch"`` (torch.distributed.tensor.experimental's context parallelism, torchtitan's: K/V
    all-gathered per pass, float32 dK/dV sent every backward step, an eager float32 merge) or
    ``"transformer-engine"`` (Transformer Engine's P2P ring, Megatron's ``--cp-comm-type p2p``: K/V
    sent to the next rank beside each step's attention, dK/dV too in the backward, bf16)."""

    ring: str = attrs.field(default="pytorch", validator=attrs.validators.in_(tuple(RINGS)))


def ring_collectives(options):
    return RINGS[options.ring][0]


def ring_traffic(options):
    return RINGS[options.ring][1]


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="cp", axis="cp", apply=apply, options_type=ContextParallelOptions,
                             extensions={STEPTIME_COLLECTIVES: ring_collectives, STEPTIME_TRAFFIC: ring_traffic},
                             description="activations / cp (sequence split); ring-attention K/V buffers"),
            ShardingRuleSpec(name="cp-ulysses", axis="cp", apply=apply_ulysses,
                             description="activations / cp (sequence split); Ulysses all-to-all q/k/v/output buffers")]
