"""The planner's step-time model: seconds per optimizer step of one layout, with every
component, tokens/s and MFU.

The model (docs/planner.md derives each line; all per rank of the slowest pipeline stage):

    T = b x s / cp                          tokens one rank holds per micro-batch (b = micro-batch)
    matmul    = 2 T (P_layer L_s / tp + V h / tp [last stage]) x (3 + r)   FLOPs at eff_matmul x peak
    attention = 2 T s h_q / tp x (3.5 + r)  causal, fused kernel: the backward is 2.5 forwards
                                            (it recomputes the scores), at eff_attention x peak
    memory    = bytes the norms, activations, RoPE and residuals move (read + write), at
                eff_memory x memory bandwidth; norms and residuals are divided by tp only
                under sequence parallelism
    kernels   = kernel count x kernel_overhead  (launch and tail time every kernel pays)
    tp        = (4 + 2r) collectives of T h bytes per layer (all-reduces, or all-gather +
                reduce-scatter pairs under SP: a ring's volume), on the critical path; a
                switch that reduces in the network (NVLink SHARP) sends an all-reduce's
                buffer once
    cp        = the ring's K/V (and dK/dV) passes, hidden behind the attention they feed:
                only what exceeds it is exposed
    ep        = (4 + 2r) all-to-alls of T k h bytes per MoE layer, on the critical path
    p2p       = the stage boundary's activation and its gradient, per micro-batch (x v model
                chunks per rank under an interleaved schedule)
    micro     = matmul + attention + memory + kernels + tp + cp + ep + p2p
    pipeline  = (gas + idle) x micro        idle: the schedule's bubble in micro-batch slots,
                pp - 1 for 1F1B and GPipe, (pp - 1) / v interleaved, less for zero-bubble ones
    dp        = the data-parallel rule's collectives, each hidden behind the compute it
                overlaps (see _data_parallel), only the excess exposed
    optimizer = the optimizer step's memory traffic over the local shard, at eff_memory
    step      = pipeline + dp + optimizer

r is the strategy's recompute (CheckpointingSpec.recompute: the share of a layer's forward
it runs again in the backward). A collective over n ranks moves (n-1)/n of its volume (x2
for an all-reduce) at the group's bus bandwidth: the intra-node link when the group fits in
a node, else min(intra, m x inter) with m members per node (m rails carry the ring across
nodes), each at its calibrated efficiency, plus a latency per collective. Ranks are ordered
tp (innermost), cp, dp (ep inside dp x cp), pp (outermost).

MFU counts model FLOPs as torchtitan does (6 x non-embedding active parameters + 12 x layers
x h_q x seq per token, torchtitan/models/utils.py get_dense_model_nparams_and_flops) over
the dense bf16 peak. The efficiencies are fitted per accelerator (CALIBRATIONS, fitted by
validation/steptime/calibrate.py on the cases it names); other hardware uses DEFAULT, and
every row says "uncalibrated".
"""

from __future__ import annotations

import math
from typing import Mapping

import attrs


TOPOLOGY_FIELDS = ("peak_bf16_flops", "intra_node_bandwidth", "inter_node_bandwidth", "devices_per_node")


@attrs.frozen(kw_only=True)
class Calibration:
    """The achieved shares of the hardware's peaks, and fixed costs, for one accelerator."""

    matmul: float            # share of the dense bf16 peak a large GEMM reaches
    attention: float         # share of the peak the fused attention kernel reaches
    memory: float            # share of the memory bandwidth a memory-bound kernel reaches
    intra_link: float        # share of intra_node_bandwidth a large collective reaches (bus bandwidth)
    inter_link: float        # share of inter_node_bandwidth
    kernel_overhead: float   # seconds each kernel pays beyond its FLOPs (launch, tail)
    latency: float           # seconds per collective
    overlap_sm_share: float  # share of the SMs a collective's kernel takes from the compute it overlaps
    switch_allreduce: bool = False   # the node's switch reduces in the network (NVLink SHARP)
    calibrated: bool = False
    source: str = ""

    def as_dict(self) -> dict:
        return attrs.asdict(self)


# Assumed, not fitted: what a well-tuned bf16 stack reaches on a large problem. Every row
# solved with it says "uncalibrated". attention: FlashAttention-2 (PyTorch SDPA's flash
# kernel) "achieves only 35% utilization on H100 GPUs" (Shah et al. 2024, FlashAttention-3,
# arXiv 2407.08608, abstract). overlap_sm_share: an H100 (132 SMs) running FSDP's prefetch
# pattern, "the concurrent ncclAllGather kernel launches 24 blocks, preemptively occupying a
# few SMs" (forums.developer.nvidia.com/t/337991, an nsys profile): while a collective hides
# behind compute, the compute runs on the SMs left.
DEFAULT = Calibration(matmul=0.7, attention=0.35, memory=0.8, intra_link=0.75, inter_link=0.8,
                      kernel_overhead=4e-6, latency=20e-6, overlap_sm_share=24 / 132,
                      source="assumed (no published measurement fitted for this hardware)")

# Fitted by validation/steptime/calibrate.py (it prints the fitted values); keyed by catalog
# name. H100: torchtitan's compiled bf16 runs (Grand Teton H100s, 500 W); docs/planner.md has
# the fit and the held-out checks. switch_allreduce: the third-generation NVSwitch "incorporates
# hardware acceleration for collective operations with multicast and NVIDIA SHARP in-network
# reductions" (developer.nvidia.com/blog/upgrading-multi-gpu-interconnectivity-with-the-third-
# generation-nvidia-nvswitch): an all-reduce inside an H100 node sends each buffer once.
CALIBRATIONS: dict[str, Calibration] = {
    "nvidia/h100-sxm5-80gb": Calibration(
        matmul=0.45, attention=0.35, memory=0.8, intra_link=0.57, inter_link=0.8, kernel_overhead=4e-6,
        latency=20e-6, overlap_sm_share=24 / 132, switch_allreduce=True, calibrated=True,
        source="validation/steptime/calibrate.py: matmul and intra_link fitted (least squares on log step time) "
               "on torchtitan's compiled bf16 Llama 3.1 8B FSDP (8 GPUs), 8B FSDP x TP=8 (64) and 70B FSDP x TP=8 "
               "(256) runs (validation/steptime/published.py); the rest assumed (steptime.DEFAULT)"),
}


def calibration_for(hardware_name: str) -> Calibration:
    """The accelerator's fitted calibration (matched by the catalog entry's name), else DEFAULT."""
    from .catalog import get_hardware
    for key, cal in CALIBRATIONS.items():
        if get_hardware(key).name == hardware_name:
            return cal
    return DEFAULT


def missing_topology(hardware, overrides: Mapping[str, object] = {}) -> list[str]:
    return [f for f in TOPOLOGY_FIELDS if getattr(hardware, f, None) is None and overrides.get(f) is None]


ASSUMED_MEMORY_BANDWIDTH = 10**12     # B/s, for hardware that does not say (the search notes it)


def hardware_figures(hardware, *, flops=None, intra=None, inter=None) -> dict:
    """What ``step_time`` reads of the hardware (``hw``), overrides first."""
    return {"flops": flops or hardware.peak_bf16_flops, "intra": intra or hardware.intra_node_bandwidth,
            "inter": inter or hardware.inter_node_bandwidth,
            "memory": hardware.memory_bandwidth or ASSUMED_MEMORY_BANDWIDTH}


def optimizer_step_bytes(result, parameters: int) -> float:
    """Bytes per parameter the optimizer step moves: its state and weights read and written, gradients read."""
    return (2 * result.optimizer_state + 2 * result.weights + result.gradients) / parameters


def model_figures(model) -> dict:
    """Matmul parameters per layer and in the LM head, attention and MLP widths, from the
    workload. A shape the model does not give is approximated and said in ``notes``: hidden
    from parameters ~ 12 x layers x hidden^2, heads of 128, an MLP of 4 x hidden, no vocabulary
    (every parameter in the layers)."""
    notes = []
    layers = model.layers
    h = model.hidden_dim
    if h is None:
        h = max(1, round(math.sqrt(model.parameters / (12 * layers))))
        notes.append(f"step time: model.hidden_dim not given: {h} from parameters ~ 12 x layers x hidden^2")
    heads = model.heads or max(1, h // 128)
    head_dim = model.head_dim or h // heads
    kv = model.kv_heads or heads
    ffn = model.ffn_dim
    if ffn is None:
        ffn = 4 * h
        notes.append(f"step time: model.ffn_dim not given: 4 x hidden = {ffn} (memory-bound traffic only)")
    vocab = model.vocab_size or 0
    if not vocab:
        notes.append("step time: model.vocab_size not given: no LM head, every parameter counted in the layers")
    sparse = model.is_sparse
    k = model.active_experts_per_token if sparse else 1
    experts = model.experts if sparse else 1
    gated = model.gated_mlp if model.gated_mlp is not None else True
    mats = 3 if gated else 2
    tied = bool(model.tied_embeddings)
    active = getattr(model, "active_parameters", None) or model.parameters
    embedding = head = vocab * h
    # The layers' matmul parameters: the active count less the embedding table (and the LM
    # head when untied); norms and biases are a rounding error here.
    layer_active = max(0.0, (active - embedding - (0 if tied else head)) / layers)
    expert_params = min(layers * experts * mats * h * ffn, model.parameters) if sparse else 0
    return dict(h=h, h_q=heads * head_dim, h_kv=kv * head_dim, ffn=ffn, k=k, experts=experts, mats=mats,
                layers=layers, vocab=vocab, layer_active=layer_active, head=head, parameters=model.parameters,
                expert_params=expert_params, non_embedding_active=active - embedding, notes=tuple(notes))


def model_flops_per_token(fig: dict, seq_len: int) -> float:
    """torchtitan's MFU numerator: 6 x non-embedding active parameters + 12 x layers x h_q x seq."""
    return 6 * fig["non_embedding_active"] + 12 * fig["layers"] * fig["h_q"] * seq_len


def link(members: int, stride: int, node: int, hw, cal: Calibration) -> float:
    """A group's bus bandwidth in B/s: ``members`` ranks ``stride`` apart."""
    intra = hw["intra"] * cal.intra_link
    if members * stride <= node:
        return intra
    per_node = max(1, node // stride) if stride < node else 1
    return min(intra, per_node * hw["inter"] * cal.inter_link)


def allreduce_time(volume: float, members: int, bandwidth: float, latency: float, in_node: bool,
                   cal: Calibration) -> float:
    """An all-reduce: a ring (2 (n-1)/n of the buffer each way), or, inside a node whose
    switch reduces (``switch_allreduce``), each rank sends its buffer once and receives the
    reduced one once (both directions at once)."""
    if members <= 1:
        return 0.0
    if in_node and cal.switch_allreduce:
        return volume / bandwidth + latency
    return ring_time(volume, members, bandwidth, latency, 2)


def ring_time(volume: float, members: int, bandwidth: float, latency: float, factor: float = 1.0) -> float:
    """A ring collective over ``members`` ranks moving ``volume`` bytes per rank's buffer:
    factor 1 for all-gather / reduce-scatter, 2 for all-reduce."""
    if members <= 1:
        return 0.0
    return factor * (members - 1) / members * volume / bandwidth + latency


KERNELS_PER_LAYER = 20      # forward kernels of a pre-norm layer: 7 matmuls, attention, norms, RoPE, act, adds
COMPONENTS = ("matmul", "attention", "memory", "kernels", "tp", "cp", "ep", "p2p", "bubble", "dp", "optimizer")


def step_time(fig: dict, hw: dict, cal: Calibration, *, tp: int, cp: int, pp: int, dp: int, ep: int, rule: str,
              recompute: float, sp: bool, mb: int, gas: int, seq_len: int, bytes_: float, node: int,
              optimizer_bytes: float, fused_attention: bool = True, shard_group: int | None = None,
              idle_slots: float | None = None, chunks: int = 1, compiled: bool = False) -> dict:
    """Every component of one layout's step, in seconds (see the module docstring).
    ``idle_slots``: the pipeline schedule's bubble in micro-batch slots (None: 1F1B's pp - 1);
    ``chunks``: model chunks per rank (an interleaved schedule's v: v times the sends);
    ``compiled``: torch.compile fuses the memory-bound ops (default: eager, as the measured
    memory profile models)."""
    h, h_q, h_kv = fig["h"], fig["h_q"], fig["h_kv"]
    layers = math.ceil(fig["layers"] / pp)
    T = mb * seq_len / cp
    r = recompute
    peak, mem_bw = hw["flops"], hw["memory"]
    # compute, one micro-batch on the slowest (last) stage
    layer_fwd = 2 * T * fig["layer_active"] / tp
    head_fwd = 2 * T * fig["head"] / tp
    matmul = (layer_fwd * layers * (3 + r) + head_fwd * 3) / (cal.matmul * peak)
    attn_fwd = 2 * T * seq_len * h_q / tp
    attention = attn_fwd * layers * (3.5 + (r if r >= 1 or not fused_attention else 0)) / (cal.attention * peak)
    elementwise = _elementwise_bytes(fig, tp, sp, compiled) * T * bytes_ / 2
    logits = 4 * T * fig["vocab"] / tp * 4          # fp32 logits: written, read by the loss, its gradient
    memory = (elementwise * layers * (3 + r) + logits) / (cal.memory * mem_bw)
    kernels = KERNELS_PER_LAYER * layers * (3 + r) * cal.kernel_overhead
    # communication inside a micro-batch
    tp_bw = link(tp, 1, node, hw, cal)
    # under SP an all-gather and a reduce-scatter per all-reduce: a ring's volume, whatever the switch
    one = (ring_time(T * h * bytes_, tp, tp_bw, cal.latency, 2) if sp
           else allreduce_time(T * h * bytes_, tp, tp_bw, cal.latency, tp <= node, cal))
    tp_comm = (4 + 2 * r) * layers * one if tp > 1 else 0.0
    cp_comm = 0.0
    if cp > 1:
        ring = (cp - 1) * T * 2 * h_kv * bytes_ / link(cp, tp, node, hw, cal) + (cp - 1) * cal.latency
        attn_layer = attention / layers
        cp_comm = layers * hidden(ring * (3 + r), attn_layer, cal)
    ep_comm = 0.0
    if ep > 1:
        a2a = (ep - 1) / ep * T * fig["k"] * h * bytes_ / link(ep, tp, node, hw, cal) + cal.latency
        ep_comm = (4 + 2 * r) * layers * a2a
    p2p = 0.0
    if pp > 1:
        stride = tp * cp * dp       # (consecutive stages are this many ranks apart)
        bw = hw["intra"] * cal.intra_link if stride < node else hw["inter"] * cal.inter_link
        p2p = 2 * chunks * (T * h * bytes_ / bw + cal.latency)
    micro = matmul + attention + memory + kernels + tp_comm + cp_comm + ep_comm + p2p
    bubble = (pp - 1 if idle_slots is None else idle_slots) * micro
    # data parallelism: the local shard's gradients and parameters
    d = dp * cp
    dense = (fig["parameters"] - fig["expert_params"]) / (tp * pp)
    local = dense + fig["expert_params"] / (tp * pp * ep)
    grads = local * bytes_
    dp_bw = link(d, tp, node, hw, cal)
    fwd = (matmul + attention + memory) / (3 + r)
    bwd = fwd * (2 + r)
    dp_comm = _data_parallel(rule, d, grads, dp_bw, cal.latency, fwd, bwd, gas, fig["layers"] / pp,
                             shard_group, node, tp, hw, cal)
    shards = d if rule != "zero0" else 1
    optimizer = local / shards * optimizer_bytes / (cal.memory * mem_bw)
    parts = dict(matmul=matmul * gas, attention=attention * gas, memory=memory * gas, kernels=kernels * gas,
                 tp=tp_comm * gas, cp=cp_comm * gas, ep=ep_comm * gas, p2p=p2p * gas, bubble=bubble,
                 dp=dp_comm, optimizer=optimizer)
    parts["step"] = sum(parts.values())
    return parts


def _elementwise_bytes(fig: dict, tp: int, sp: bool, compiled: bool) -> float:
    """Bytes per token one layer pass of the memory-bound ops reads and writes (bf16 activations,
    fp32 inside the norms and RoPE). Two RMSNorms: fused, read x and write y (4 B per element);
    eager (torchtitan's RMSNorm: x.float(), pow, mean, x * rsqrt, type_as, * weight), 36 B. Two
    residual adds, 6 B either way. RoPE on q and k: fused 4 B; eager (complex: .float(), multiply,
    type_as) 20 B. The gated MLP's act: fused silu(g) * u 6 B per element, eager (silu, mul) 10 B;
    a plain MLP's GELU 4 B. (Scaled by the precision's bytes over bf16's.)
    Norms and residuals are replicated across TP ranks unless sequence-parallel."""
    h, mlp = fig["h"], fig["ffn"] * fig["k"]
    gated = fig["mats"] == 3
    norm, rope, act = (4, 4, 6 if gated else 4) if compiled else (36, 20, 10 if gated else 4)
    replicated = (2 * norm + 12) * h / (tp if sp else 1)
    return replicated + (rope * (fig["h_q"] + fig["h_kv"]) + act * mlp) / tp


def layout_time(timing: dict, *, pp: int, gas: int, **layout) -> dict:
    """``step_time`` for one layout from a search's ``timing`` (the model, hardware and
    calibration, and the pipeline schedule's ``idle`` slots function and model chunks)."""
    idle = timing.get("idle")
    fixed = {k: v for k, v in timing.items() if k != "idle"}
    slots = idle(pp, gas, fixed.get("chunks", 1)) if idle is not None and pp > 1 else None
    return step_time(pp=pp, gas=gas, idle_slots=slots, **fixed, **layout)


def hidden(comm: float, compute: float, cal: Calibration) -> float:
    """Exposed seconds of a collective overlapping ``compute``: what outlasts it, plus the
    compute slowed while they overlap (the collective's kernel holds overlap_sm_share of the SMs)."""
    return max(0.0, comm - compute) + cal.overlap_sm_share * min(comm, compute)


def _data_parallel(rule, d, grads, bw, latency, fwd, bwd, gas, layers, shard_group, node, tp, hw, cal) -> float:
    """Exposed seconds per step of the data-parallel rule's collectives. Each overlaps the
    compute it runs beside (bucketed gradient reduction: the backward; FSDP's prefetched
    all-gathers: the forward and backward, layer by layer, the first layer's not hidden)."""
    if d <= 1:
        return 0.0
    once = ring_time(grads, d, bw, latency)         # one all-gather or reduce-scatter of the shard
    if rule == "zero0":                 # one all-reduce beside the last backward
        return hidden(allreduce_time(grads, d, bw, latency, d * tp <= node, cal), bwd, cal)
    if rule == "zero1":                 # reduce-scatter beside the last backward, gather beside the next forward
        return hidden(once, bwd, cal) + hidden(once, fwd, cal)
    if rule == "zero2":                 # reduce-scatter every micro-batch, gather once
        return gas * hidden(once, bwd, cal) + hidden(once, fwd, cal)
    if rule == "fsdp-grad-op":          # gather before each forward (kept to the backward), reduce after
        return gas * (hidden(once, fwd, cal) + hidden(once, bwd, cal) + once / layers)
    if rule == "hsdp":                  # fsdp in the shard group, an all-reduce across the replicas
        g = shard_group or min(d, node)
        inner = ring_time(grads, g, link(g, tp, node, hw, cal), latency)
        across = ring_time(grads / g, d // g, link(d // g, tp * g, node, hw, cal), latency, 2)
        return gas * (hidden(inner, fwd, cal) + hidden(2 * inner, bwd, cal) + inner / layers) + hidden(across, bwd, cal)
    # zero3, fsdp (and a rule the model does not know, said in the run's notes): gather for the
    # forward, again for the backward, reduce-scatter after it, every micro-batch
    return gas * (hidden(once, fwd, cal) + hidden(2 * once, bwd, cal) + once / layers)


def summary(parts: dict, *, tokens: int, devices: int, fig: dict, seq_len: int, peak: float) -> dict:
    step = parts["step"]
    return {"step_s": step, "tokens_per_s": tokens / step, "tokens_per_s_per_device": tokens / step / devices,
            "mfu": model_flops_per_token(fig, seq_len) * tokens / (step * devices * peak)}
