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
    tp, cp, ep, p2p = the collectives the tensor, context, expert and pipeline rules declare
                (extensions["steptime.collectives"]; see declarations), each built-in's:
        tp    (4 + 2r) collectives of T h bytes per layer (all-reduces, or all-gather +
                reduce-scatter pairs under SP: a ring's volume), on the critical path; a
                switch that reduces in the network (NVLink SHARP) sends an all-reduce's
                buffer once
        cp    the ring as PyTorch runs it: K/V all-gathered per pass behind one ring step's
                attention, the float32 dK/dV sent every backward step, and the merge's
                elementwise work and kernels the rule declares (RingTraffic)
        ep    (4 + 2r) all-to-alls of T k h bytes per MoE layer, on the critical path
        p2p   the stage boundary's activation and its gradient, per micro-batch (x v model
                chunks per rank under an interleaved schedule)
    micro     = matmul + attention + memory + kernels + tp + cp + ep + p2p
    pipeline  = (gas + idle) x micro        idle: the schedule's bubble in micro-batch slots,
                pp - 1 for 1F1B and GPipe, (pp - 1) / v interleaved, less for zero-bubble ones
    dp        = the data-parallel rule's declared collectives, each hidden behind the compute it
                overlaps (see _data_parallel), only the excess exposed; a rule that declares
                none is timed as fsdp's (UNDECLARED_DP, said in the search's notes)
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

A plugin (entry point ``steptime``): it registers the step-time model ``roofline``
(``mlsysim_step_time_models``) and the float8 implementations torchao-tensorwise, torchao-rowwise,
te-current-scaling, te-delayed-scaling and te-mxfp8 (``mlsysim_float8_implementations``, _steptime_float8), which
``mlsysim_core.search`` reaches through the registry.
The step time reads the rules' declarations, never their names: a rule registered again under
another name is timed the same.
"""

from __future__ import annotations

import math
from typing import Mapping

import attrs

from mlsysim_core import (ACCELERATOR, GRADIENTS, OPTIMIZER_STATE, OPTIMIZER_STEP, WEIGHTS, InvalidInputError,
                          InvalidInputTypeError, hookimpl)
from mlsysim_plugins import steptime_hookspecs
from mlsysim_plugins._steptime_float8 import (BUILTIN as FLOAT8_IMPLEMENTATIONS, NORMED_GEMMS,  # noqa: F401
                                              TE_CURRENT_SCALING, TE_DELAYED_SCALING, TE_MXFP8, TORCHAO_ROWWISE,
                                              TORCHAO_TENSORWISE, Float8Casts, casts_of)
from mlsysim_plugins._steptime_paired import PairedSlot, paired  # noqa: F401  (the declarations, public here)
from mlsysim_plugins.steptime_hookspecs import Collective, StepTimeSpec, collectives, stages, traffic


TOPOLOGY_FIELDS = ("peak_bf16_flops", "intra_node_bandwidth", "inter_node_bandwidth", "devices_per_node")


# The fused attention kernel's backward runs below its forward: FlashAttention-2 reaches "up to 73% of the
# theoretical max throughput in the forward pass, and up to 63% of the theoretical max throughput in the backward
# pass" (Dao 2023, FlashAttention-2, arXiv 2307.08691, section 1, on A100). ``Calibration.attention`` is the
# forward's share; the backward runs at attention x 63/73 (the ratio of the two stated peaks, carried to H100,
# where the same FlashAttention-2 kernel is what torch's SDPA and the sources' stacks run).
ATTENTION_BACKWARD = 63 / 73


@attrs.frozen(kw_only=True)
class AttentionTiming:
    """What an attention kernel declares about its speed (its ``step_time`` attribute): the
    throughput of its forward and of its backward as shares of FlashAttention-2's, whose
    utilization the calibration's ``attention`` (forward) and ``attention_backward`` describe.
    A kernel that declares none is timed as FlashAttention-2 (torch's SDPA flash kernel)."""

    forward: float      # the kernel's forward throughput over FlashAttention-2's (1: the same)
    backward: float     # its backward's over FlashAttention-2's backward
    source: str = ""

    def __attrs_post_init__(self):
        for name in ("forward", "backward"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 4:
                raise InvalidInputError(f"AttentionTiming.{name}", value, "a share of FlashAttention-2's throughput "
                                        "in (0, 4]")


# The FlashAttention kernel written in Triton (Tillet's, as HazyResearch's flash_attn/flash_attn_triton.py and
# llm-foundry's llmfoundry/models/layers/flash_attn_triton.py run it; llm-foundry's attn_impl 'triton'):
# "FlashAttention-2 is around 1.3-1.5x faster than FlashAttention in Triton in the forward pass and around 2x
# faster in the backward pass" (Dao 2023, FlashAttention-2, arXiv 2307.08691, section 4.1, Fig. 5 and 6, A100,
# causal and not, head dimension 64 and 128): the forward at 1/1.4 (the range's middle) and the backward at 1/2
# of FlashAttention-2's; the ratios carried to H100, as ATTENTION_BACKWARD is.
FLASH_ATTENTION_TRITON = AttentionTiming(
    forward=1 / 1.4, backward=1 / 2,
    source="Dao 2023 (FlashAttention-2, arXiv 2307.08691) section 4.1: FlashAttention-2 'around 1.3-1.5x faster "
           "than FlashAttention in Triton in the forward pass and around 2x faster in the backward pass'")


# cuDNN's fused attention (cuDNN 9's SDPA kernels), what Transformer Engine runs on Hopper and later: its backend
# selection "Disabling FlashAttention to give FusedAttention preference on Hopper+ for performance reasons"
# (NVIDIA/TransformerEngine transformer_engine/pytorch/attention/dot_product_attention/utils.py at d0067d0, lines
# 1647-1653: ``device_compute_capability >= (9, 0)``), and so Megatron-Core's TEDotProductAttention. Its speed over
# FlashAttention-2's as measured on one H100 SXM5 (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, Fig. 5
# "Attention forward speed, head dim 128 (H100 80GB SXM5)", with causal mask, and Fig. 6 "Attention backward speed,
# head dim 128", BF16, sequence 8k): forward 529 against 333 TFLOP/s, backward 518 against 318 (at 4k 518 / 319
# and 499 / 310: the same ratio within 1 %). FlashAttention-2's own figures there (333-370 TFLOP/s forward) are the
# "35% utilization" the calibration's ``attention`` states.
CUDNN_FUSED_ATTENTION = AttentionTiming(
    forward=529 / 333, backward=518 / 318,
    source="Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608) Fig. 5-6, H100 SXM5, head dim 128, BF16, seq 8k: "
           "cuDNN 529 / 518 TFLOP/s forward (causal) / backward against FlashAttention-2's 333 / 318")


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
    hop_intra: float = 3.4e-6        # seconds per ring step inside a node (NCCL's NVLink Simple hwLat)
    hop_inter: float = 14.0e-6       # seconds per ring or tree step between nodes (NCCL's NET Simple hwLat)
    hop_tree_intra: float = 4.0e-6   # seconds per tree step inside a node (NCCL's NVLink Tree Simple hwLat)
    nvls_latency: float = 25e-6      # an in-network (NVLS) all-reduce inside a node (NCCL's NVLS hwLat)
    attention_backward: float = ATTENTION_BACKWARD  # the backward kernel's share of the peak over the forward's
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
                      kernel_overhead=4e-6, latency=8.4e-6, overlap_sm_share=24 / 132,
                      source="assumed (no published measurement fitted for this hardware)")
# latency, hop_intra, hop_tree_intra, hop_inter, nvls_latency: NCCL's own cost model for the Simple protocol
# (the one large messages use), NVIDIA/nccl src/graph/tuning.cc at 5067397c2676d5aed50042fc39e5c8ee96eb0027
# (last changed in 50bf0bca1a6b88b2a3e3cebf41f3b827fc9fb19e), ncclTunerConstantsDefaults: 'baseLatencies' Tree
# and Ring Simple 8.4 us; 'hwLatencies' NVLink Ring Simple 3.4 us and Tree Simple 4.0 us per step, NET Ring and
# Tree Simple 14.0 us per step, NVLink NVLS Simple 25 us; ncclTopoTuneModel: a ring's latency is baseLat +
# (nsteps - nInterSteps) x intraLat + nInterSteps x interLat (nsteps = n - 1 for all-gather and
# reduce-scatter, 2 (n - 1) for all-reduce; nInterSteps the same over nodes), a tree all-reduce's
# baseLat + 2 ((ranks per node - 1) x intraLat + log2(nodes) x interLat); NCCL picks the faster.

# Fitted by validation/steptime/calibrate.py (it prints the fitted values) on the runs its FIT names, the split
# recorded there before the fit; keyed by catalog name. matmul: the share of the dense peak a large, wave-aligned
# GEMM reaches at the board's full power (a run capped lower keeps clock_share of it); intra_link: the NVLink bus
# bandwidth share (at most 1). attention: FlashAttention-2's stated utilization, "only 35% utilization on H100
# GPUs" (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, abstract) and "50-73% of the theoretical maximum
# FLOPs/s on A100" (Dao 2023, FlashAttention-2, arXiv 2307.08691, abstract; the low end), taken as the forward's
# share, the backward at ATTENTION_BACKWARD of it (not fitted). switch_allreduce: the
# third-generation NVSwitch "incorporates hardware acceleration for collective operations with multicast and NVIDIA
# SHARP in-network reductions" (developer.nvidia.com/blog/upgrading-multi-gpu-interconnectivity-with-the-third-
# generation-nvidia-nvswitch): an all-reduce inside an H100 node sends each buffer once. docs/planner.md has the
# fit and every held-out run.
_H100 = Calibration(
    matmul=0.55, attention=0.35, memory=0.8, intra_link=0.94, inter_link=0.8, kernel_overhead=4e-6,
    latency=8.4e-6, overlap_sm_share=24 / 132, switch_allreduce=True, calibrated=True,
    source="validation/steptime/calibrate.py: matmul and intra_link fitted (least squares on log step time) on "
           "torchtitan-2412-llama3.1-8b-8xh100-fsdp-compile, llmfoundry-mpt-7b-8xh100-seq2048, "
           "torchtitan-2506-asynctp-llama3-70b-256xh100-bf16-vanillatp (validation/steptime/published.py); "
           "attention 0.35 (FlashAttention-2's stated H100 utilization; its backward at 63/73 of it); the rest "
           "steptime.DEFAULT")
CALIBRATIONS: dict[str, Calibration] = {
    "nvidia/h100-sxm5-80gb": _H100,
    # the same GH100 die, NVLink 4 and NVSwitch: H100's constants carried over, not fitted (checked on the
    # held-out H200 runs in docs/planner.md)
    "nvidia/h200-sxm-141gb": attrs.evolve(_H100, source="H100's calibration carried over (the same GH100 die, "
                                          "NVLink 4 and NVSwitch; nothing fitted on H200): " + _H100.source),
    "nvidia/a100-sxm4-80gb": Calibration(
        matmul=0.79, attention=0.5, memory=0.8, intra_link=0.75, inter_link=0.8, kernel_overhead=4e-6,
        latency=8.4e-6, overlap_sm_share=24 / 132, calibrated=True,
        source="validation/steptime/calibrate.py: matmul fitted (least squares on log step time) on "
               "llmfoundry-mpt-7b-8xa100-seq2048, llmfoundry-mpt-30b-8xa100-seq2048 (validation/steptime/"
               "published.py); attention 0.5 (FlashAttention-2's stated A100 utilization, low end; its backward at "
               "63/73 of it); the rest "
               "steptime.DEFAULT"),
}


def calibration_for(hardware_name: str) -> Calibration:
    """The accelerator's fitted calibration (matched by the catalog entry's name), else DEFAULT."""
    from mlsysim_core.catalog import get_hardware
    for key, cal in CALIBRATIONS.items():
        if get_hardware(key).name == hardware_name:
            return cal
    return DEFAULT


def missing_topology(hardware, overrides: Mapping[str, object] = {}) -> list[str]:
    return [f for f in TOPOLOGY_FIELDS if getattr(hardware, f, None) is None and overrides.get(f) is None]


ASSUMED_MEMORY_BANDWIDTH = 10**12     # B/s, for hardware that does not say (the search notes it)


def envelope(hardware) -> dict:
    """The accelerator's power and clock envelope as its catalog entry records it (``extra``:
    ``power_limit_watts``, the board's TDP; ``streaming_multiprocessors``, the compute units a
    GEMM's tiles are spread over), each with its source in the entry's ``sources``; {} for
    hardware outside the catalog (or a node that is not the catalog's object). A memory variant of
    the catalog's chip (the same node but for ``memory_capacity`` and ``memory_bandwidth``, e.g.
    the 96 GB HBM2e H100s of Meta's Grand Teton that torchtitan's benchmark files state) keeps the
    chip's envelope: the memory is not the tensor cores' power or SM count."""
    extra = _chip_extra(hardware)
    return {k: extra[k] for k in ("power_limit_watts", "streaming_multiprocessors") if k in extra}


def achievable_matmul(hardware) -> dict:
    """The best GEMM throughput measured on the accelerator per operand dtype, {"bf16": FLOP/s, "fp8": FLOP/s}, as
    its catalog entry records it (``extra["max_achievable_matmul_flops"]``, cited in its ``sources``; a memory variant
    keeps the chip's, as ``envelope``); {} where none is recorded. ``float8_matmul_share`` reads it."""
    return dict(_chip_extra(hardware).get("max_achievable_matmul_flops") or {})


def _chip_extra(hardware) -> Mapping:
    """The catalog entry's ``extra`` for ``hardware`` (or a memory variant of it: ``envelope``); {} outside it."""
    from mlsysim_core.catalog import find_hardware
    try:
        entry = find_hardware(hardware.name)
    except Exception:       # (not in the catalog: a user's HardwareNode)
        return {}
    if entry.value != hardware and attrs.evolve(entry.value, memory_capacity=hardware.memory_capacity,
                                                memory_bandwidth=hardware.memory_bandwidth) != hardware:
        return {}
    return entry.extra


def float8_matmul_share(measured, peak_bf16, peak_fp8) -> float | None:
    """The share of its float8 peak a float8 GEMM reaches, over the share of its bf16 peak a bf16 GEMM reaches, as
    the accelerator's measured maximum achievable matmul throughput gives them (``measured``: {"bf16": FLOP/s, "fp8":
    FLOP/s}, the catalog's ``max_achievable_matmul_flops``; stas00/ml-engineering's MAMF tables: H100 SXM 794.5 of
    989 TFLOP/s in bf16, 80.3 %, and 1,402.6 of 1,979 in float8, 70.9 %: 0.883). None where either figure or peak is
    missing (the float8 GEMMs are then timed at the bf16 ones' share). Measured, not explained by the source: every
    accelerator of the table reaches less of its float8 peak than of its bf16 one (H100 0.882, H200 0.914, B200
    0.984, GB200 0.992)."""
    measured = measured or {}
    allowed = "a mapping {'bf16': FLOP/s, 'fp8': FLOP/s} of positive numbers (either may be left out)"
    if not isinstance(measured, Mapping):
        raise InvalidInputTypeError("max_achievable_matmul_flops", measured, allowed)
    for dtype, value in measured.items():
        if dtype not in ("bf16", "fp8") or isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value > 0):
            raise InvalidInputError(f"max_achievable_matmul_flops[{dtype!r}]", value, allowed)
    bf16, fp8 = measured.get("bf16"), measured.get("fp8")
    if not bf16 or not fp8 or not peak_bf16 or not peak_fp8:
        return None
    return (fp8 / peak_fp8) / (bf16 / peak_bf16)


def clock_share(power: float | None, tdp: float | None) -> float:
    """The share of its full-power clock a matmul-bound accelerator keeps when capped at ``power``
    watts (its board TDP ``tdp``): dynamic power P = C V^2 f with the voltage scaled with the
    frequency, so P ~ f^3 and f ~ P^(1/3) (Hennessy & Patterson, Computer Architecture: A
    Quantitative Approach, 6th ed., section 1.5, 'Trends in Power and Energy'); 1 at or above the
    TDP, or when either is unknown."""
    if not power or not tdp or power >= tdp:
        return 1.0
    return (power / tdp) ** (1 / 3)


def hardware_figures(hardware, *, flops=None, intra=None, inter=None, power=None, memory=None) -> dict:
    """What ``step_time`` reads of the hardware (``hw``), overrides first. ``power``: the run's
    power limit in watts (default the catalog's TDP): the tensor cores' clock scales by
    ``clock_share``; ``memory``: the memory bandwidth, B/s (a variant the source names)."""
    env = envelope(hardware)
    tdp = env.get("power_limit_watts")
    peak = flops or hardware.peak_bf16_flops
    fp8 = hardware.peak_fp8_flops or (2 * peak if peak else None)
    # (the shares are the chip's: measured against its own stated peaks, whatever ``flops`` overrides)
    share = float8_matmul_share(achievable_matmul(hardware), hardware.peak_bf16_flops, hardware.peak_fp8_flops)
    return {"flops": peak, "intra": intra or hardware.intra_node_bandwidth,
            "inter": inter or hardware.inter_node_bandwidth,
            "memory": memory or hardware.memory_bandwidth or ASSUMED_MEMORY_BANDWIDTH,
            "fp8": fp8, "fp8_stated": hardware.peak_fp8_flops is not None, "fp8_matmul": share,
            "sms": env.get("streaming_multiprocessors"), "tdp": tdp, "power": power or tdp,
            "clock": clock_share(power, tdp)}


def optimizer_step_bytes(result, parameters: int) -> float:
    """Bytes per parameter the optimizer step moves: its state and weights read and written, gradients read,
    as alive on the accelerator in the optimizer step (a summed result: every term), whatever phase the peak is."""
    if result.peak_phase is None:     # summed: every term counts
        return (2 * result.optimizer_state + 2 * result.weights + result.gradients) / parameters
    alive = {WEIGHTS: 0, GRADIENTS: 0, OPTIMIZER_STATE: 0}
    for term in result.terms:
        if term.component in alive and term.tier == ACCELERATOR and OPTIMIZER_STEP in term.phases:
            alive[term.component] += term.nbytes
    return (2 * alive[OPTIMIZER_STATE] + 2 * alive[WEIGHTS] + alive[GRADIENTS]) / parameters


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
    # The layer's GEMMs, forward (N outputs, K inputs, split by tp along N or K, routed or not):
    # fused q/k/v, the output projection, the MLP's fused up (and gate) and its down projection.
    gemms = ((heads * head_dim + 2 * kv * head_dim, h, "n", False), (h, heads * head_dim, "k", False),
             ((mats - 1) * ffn, h, "n", sparse), (h, ffn, "k", sparse))
    details = getattr(model, "details", None) or {}
    window = details.get("sliding_window") or None
    windowed = min(layers, details.get("sliding_window_layers") or 0) if window else 0
    # How many linear modules each GEMM above runs as, each reading the GEMM's whole input
    # (``linears``): 1 (one fused module, Megatron's linear_qkv and linear_fc1) unless the model
    # declares ``details["separate_projections"]`` (q, k and v three modules, a gated MLP's gate and
    # up two: torchtitan's wq / wk / wv and w1 / w3, transformers' q_proj / k_proj / v_proj). The
    # GEMMs' FLOPs and tiles are timed as the fused GEMM's; a float8 linear casts its own input
    # (_steptime_float8: 'one linear module'), so the input's casts are paid once per module.
    separate = details.get("separate_projections", False)
    if not isinstance(separate, bool):
        raise InvalidInputTypeError("details['separate_projections']", separate,
                                    "True (q, k, v and a gated MLP's gate and up run as separate linear modules) "
                                    "or False (fused)")
    linears = (3, 1, mats - 1, 1) if separate else (1, 1, 1, 1)
    # The K and V width the attention kernel reads (``h_kv_kernel``): the model's K/V heads, unless the model
    # declares ``details["repeated_kv"]`` (its code repeats K and V to the query heads before the kernel:
    # torchtitan's and transformers' ``repeat_kv``), then the query heads': what a context-parallel ring moves and
    # accumulates (K/V, dK/dV, and the ring's elementwise work on them). (The repeat's own copy, forward and
    # backward, is not counted: it would move the fitted torchtitan runs, docs/planner.md says by how much.)
    repeated = details.get("repeated_kv", False)
    if not isinstance(repeated, bool):
        raise InvalidInputTypeError("details['repeated_kv']", repeated,
                                    "True (K and V repeated to the query heads before the attention kernel) or False")
    return dict(h=h, h_q=heads * head_dim, h_kv=kv * head_dim, ffn=ffn, k=k, experts=experts, mats=mats, gemms=gemms,
                h_kv_kernel=heads * head_dim if repeated else kv * head_dim,
                linears=linears, window=window, windowed=windowed,
                layers=layers, vocab=vocab, layer_active=layer_active, head=head, parameters=model.parameters,
                expert_params=expert_params, non_embedding_active=active - embedding, notes=tuple(notes))


def model_flops_per_token(fig: dict, seq_len: int) -> float:
    """torchtitan's MFU numerator: 6 x non-embedding active parameters + 12 x layers x h_q x seq."""
    return 6 * fig["non_embedding_active"] + 12 * fig["layers"] * fig["h_q"] * seq_len


# The output tile of Hopper's large bf16 GEMM kernels (cuBLAS / CUTLASS 128 x 256): a GEMM of an
# M x N output runs ceil(M/128) x ceil(N/256) tiles in waves of one tile per SM, so a partial tile
# (tile quantization) and a partial last wave (wave quantization) cost a whole one (NVIDIA, "Matrix
# Multiplication Background User's Guide", docs.nvidia.com/deeplearning/performance/dl-performance-
# matrix-multiplication, sections "Tile Quantization" and "Wave Quantization").
TILE = (128, 256)
# (the float8 casts' bytes per element: each implementation's declaration, _steptime_float8.Float8Casts)


def gemm_seconds(m: float, n: float, k: float, hw: dict, cal: Calibration, operand_bytes: float) -> float:
    """One GEMM (M x K by K x N): a roofline of its tensor-core time (whole tiles, whole waves,
    at ``cal.matmul`` of the peak, the float8 one for 1-byte operands, times the power
    envelope's clock share) and its memory time (operands read, bf16 output written, at
    ``cal.memory`` of the bandwidth); the slower. Without an SM count, no quantization.
    A float8 GEMM reaches ``hw["fp8_matmul"]`` (``float8_matmul_share``: the accelerator's measured
    float8 share of its float8 peak over its bf16 share of the bf16 one) of the bf16 GEMMs' share."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    if operand_bytes < 2:
        peak = (hw.get("fp8") or 2 * hw["flops"]) * (hw.get("fp8_matmul") or 1.0)
    else:
        peak = hw["flops"]
    peak = peak * hw.get("clock", 1.0) * cal.matmul
    sms = hw.get("sms")
    if sms:
        tm, tn = TILE
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        compute = math.ceil(tiles / sms) * sms * tm * tn * 2 * k / peak
    else:
        compute = 2 * m * n * k / peak
    traffic = operand_bytes * (m * k + k * n) + 2 * m * n
    return max(compute, traffic / (cal.memory * hw["memory"]))


_GEMM_CACHE: dict = {}


def layer_gemms(fig: dict, hw: dict, cal: Calibration, T: float, tp: int, ep: int, operand_bytes: float,
                casts: Float8Casts = TORCHAO_TENSORWISE, float8_tp: bool = False) -> dict:
    """Seconds per FLOP of one layer's GEMMs (``fig['gemms']``), forward and backward (the input
    gradient M x K from M x N and N x K, the weight gradient N x K over the M tokens), and of the
    LM head; ``cast``: the float8 casts' bytes per forward, per backward and (``cast_step``) once a
    step (0 in bf16), as the float8 implementation declares them (``casts``, _steptime_float8). A routed
    GEMM runs on the tokens its rank's experts receive: T x k x ep / experts each. ``float8_tp``: the
    implementation's tensor parallelism casts before the all-gathers (``Float8Casts.tp_gather``, under
    sequence parallelism): a column-parallel GEMM's normed input is cast once, on T / tp tokens, whatever
    modules read it, and a row-parallel GEMM's output gradient on its T / tp tokens."""
    linears = fig.get("linears") or (1,) * len(fig["gemms"])
    key = (fig["gemms"], linears, fig["experts"], fig["k"], fig["h"], fig["vocab"], T, tp, ep, operand_bytes, hw.get("sms"),
           hw["flops"], hw.get("fp8"), hw.get("fp8_matmul"), hw.get("clock", 1.0), hw["memory"], cal.matmul, cal.memory,
           casts, float8_tp)
    got = _GEMM_CACHE.get(key)
    if got is not None:
        return got
    flops = fwd = bwd = cast_f = cast_b = cast_s = routed_f = routed_b = 0.0
    for i, (n, k, split, routed) in enumerate(fig["gemms"]):
        if split == "n":
            n = n / tp
        else:
            k = k / tp
        m, count = T, 1
        if routed:
            count = max(1, fig["experts"] // ep)
            m = T * fig["k"] * ep / fig["experts"]
        if n <= 0 or k <= 0:
            continue
        flops += count * 2 * m * n * k
        f = count * gemm_seconds(m, n, k, hw, cal, operand_bytes)
        b = count * (gemm_seconds(m, k, n, hw, cal, operand_bytes) + gemm_seconds(k, n, m, hw, cal, operand_bytes))
        fwd += f
        bwd += b
        if routed:
            routed_f += f
            routed_b += b
        if operand_bytes < 2:
            c = casts
            read = c.normed_input if i in NORMED_GEMMS and not routed else c.input
            # (the GEMM run as ``modules`` linears, each casting the whole input M x K: _steptime_float8)
            modules = linears[i] if i < len(linears) else 1
            # (float8 tensor parallelism: the gathered input cast once on the rank's T / tp tokens, before the
            # all-gather, for all its modules; the row-parallel output's gradient on its T / tp: _steptime_float8)
            gathered = float8_tp and not routed and tp > 1 and i in NORMED_GEMMS and split == "n"
            grad_rows = m / tp if float8_tp and not routed and tp > 1 and split == "k" else m
            # (under float8 tensor parallelism the shard's casts as declared: tp_input, tp_grad; and each gathered
            # tensor's transposed copy on all m tokens, each backward: tp_transpose)
            grad = c.grad if grad_rows == m or c.tp_grad is None else c.tp_grad
            if gathered:
                cast_f += count * (read if c.tp_input is None else c.tp_input) * m / tp * k
                if c.weight_per == "micro-batch":
                    cast_f += count * c.weight * n * k
                else:
                    cast_s += count * c.weight * n * k
            elif c.weight_per == "micro-batch" and read == c.weight and modules == 1:
                cast_f += count * read * (m * k + n * k)
            else:
                cast_f += count * read * m * k * modules
                if c.weight_per == "micro-batch":
                    cast_f += count * c.weight * n * k
                else:
                    cast_s += count * c.weight * n * k
            if c.transpose_weight is None:
                back = grad * grad_rows * n + c.transpose * (m * k * modules + n * k)
            else:       # (the weight's transposed copy declared apart from the input's)
                back = grad * grad_rows * n + c.transpose * m * k * modules + c.transpose_weight * n * k
            if c.tp_transpose and (gathered or grad_rows != m):
                back += c.tp_transpose * ((m * k * modules if gathered else 0) + (m * n if grad_rows != m else 0))
            if c.rescale:       # (a kernel scaling each backward GEMM's output: input and weight gradients)
                back += c.rescale * (m * k * modules + n * k)
            cast_b += count * back
    v = fig["vocab"] / tp
    head_flops = 2 * T * v * fig["h"]
    # (the LM head stays in bf16: torchtitan's float8 converts leave out the output projection)
    head = (gemm_seconds(T, v, fig["h"], hw, cal, 2) + gemm_seconds(T, fig["h"], v, hw, cal, 2)
            + gemm_seconds(fig["h"], v, T, hw, cal, 2)) if v else 0.0
    got = {"fwd": fwd / flops if flops else 0.0, "bwd": bwd / (2 * flops) if flops else 0.0,
           "head": head / (3 * head_flops) if head_flops else 0.0, "cast_fwd": cast_f, "cast_bwd": cast_b,
           "cast_step": cast_s, "routed_fwd": routed_f / fwd if fwd else 0.0,
           "routed_bwd": routed_b / bwd if bwd else 0.0}
    if len(_GEMM_CACHE) > 50_000:
        _GEMM_CACHE.clear()
    _GEMM_CACHE[key] = got
    return got


def link(members: int, stride: int, node: int, hw, cal: Calibration) -> float:
    """A group's bus bandwidth in B/s: ``members`` ranks ``stride`` apart."""
    intra = hw["intra"] * cal.intra_link
    if members * stride <= node:
        return intra
    per_node = max(1, node // stride) if stride < node else 1
    return min(intra, per_node * hw["inter"] * cal.inter_link)


def remote_nodes(experts: int, k: int, nodes: float) -> float:
    """The expected number of other nodes a token's top-``k`` experts lie on, ``experts`` spread evenly
    over ``nodes`` nodes (E / N each) and routing balanced (the k experts a uniformly random k-subset):
    a given node holds none of them with probability C(E - E/N, k) / C(E, k), so E[distinct nodes] =
    N (1 - C(E - E/N, k) / C(E, k)) and, by linearity, (N - 1) (1 - C(E - E/N, k) / C(E, k)) of them
    are not the token's own."""
    if nodes <= 1 or experts <= 0:
        return 0.0
    per_node = experts / nodes
    miss = 1.0
    for i in range(min(k, experts)):        # C(E - e, k) / C(E, k) as a product (e need not be whole)
        miss *= max(0.0, experts - per_node - i) / (experts - i)
    return (nodes - 1) * (1 - miss)


def all_to_all_across_nodes(factors, members: int, stride: int, node: int, hw, cal: Calibration,
                            forwarded: tuple[int, int] | None = None) -> float:
    """An all-to-all whose group spans nodes (``members`` ranks ``stride`` apart, ``m`` of them in
    each node): each rank sends 1/members of its buffer to every other member, (members - m)/members
    of it to members in other nodes, through its own share of the node's NICs (``inter``, per
    device), and (m - 1)/members to members in its node over NVLink, both at once: the slower. (A
    ring's m rails, ``link``, do not apply: the bytes of an all-to-all that leave a node are not
    relayed, every rank's own leave through its own NIC share.)

    ``forwarded`` = (experts, experts per token k) for a routed all-to-all sent node-forwarded
    (DeepEP's normal kernels, Megatron's flex dispatcher): a token crosses the network once to each
    other node that holds one of its k experts (``remote_nodes``, over members / m nodes), instead
    of once per expert, and is forwarded inside that node over NVLink; the buffer's k copies each
    cross NVLink once unless they land on the rank that received them, (m - 1) / m of them."""
    volume = 1.0
    for f in factors:
        volume = volume * f
    m = max(1, min(members, node // stride)) if stride < node else 1
    if forwarded is not None:
        experts, k = forwarded
        across = volume / k * remote_nodes(experts, k, members / m) / (hw["inter"] * cal.inter_link)
        inside = (m - 1) / m * volume / (hw["intra"] * cal.intra_link)
        return max(across, inside)
    across = (members - m) / members * volume / (hw["inter"] * cal.inter_link)
    inside = (m - 1) / members * volume / (hw["intra"] * cal.intra_link)
    return max(across, inside)


def allreduce_time(volume: float, members: int, bandwidth: float, latency: float, in_node: bool,
                   cal: Calibration) -> float:
    """An all-reduce: a ring (2 (n-1)/n of the buffer each way), or, inside a node whose
    switch reduces (``switch_allreduce``), each rank sends its buffer once and receives the
    reduced one once (both directions at once), at NCCL's NVLS latency."""
    if members <= 1:
        return 0.0
    if in_node and cal.switch_allreduce:
        return volume / bandwidth + cal.nvls_latency
    return ring_time(volume, members, bandwidth, latency, 2)


def ring_time(volume: float, members: int, bandwidth: float, latency: float, factor: float = 1.0) -> float:
    """A ring collective over ``members`` ranks moving ``volume`` bytes per rank's buffer:
    factor 1 for all-gather / reduce-scatter, 2 for all-reduce; ``latency``: its alpha
    (``alpha``'s)."""
    if members <= 1:
        return 0.0
    return factor * (members - 1) / members * volume / bandwidth + latency


def alpha(kind: str, members: int, stride: int, node: int, cal: Calibration) -> float:
    """A collective's latency by NCCL's model (DEFAULT's comment): a ring's steps, those that cross
    a node at the network's step latency; for an all-reduce across nodes the faster of the ring
    and the tree. ``members`` ranks ``stride`` apart; ``node`` devices per node."""
    if members <= 1:
        return 0.0
    per_node = max(1, min(members, node // stride)) if stride < node else 1
    nodes = math.ceil(members / per_node)
    if kind == "all-reduce":
        steps, inter = 2 * (members - 1), 2 * (nodes - 1)
    elif kind in ("all-gather", "reduce-scatter", "all-to-all", "ring-pass"):
        steps, inter = members - 1, nodes - 1
    else:       # send-recv: one message
        return cal.latency + (cal.hop_inter if stride >= node else cal.hop_intra)
    ring = cal.latency + (steps - inter) * cal.hop_intra + inter * cal.hop_inter
    if kind == "all-reduce" and nodes > 1:
        tree = cal.latency + 2 * ((per_node - 1) * cal.hop_tree_intra + math.log2(nodes) * cal.hop_inter)
        return min(ring, tree)
    return ring


KERNELS_PER_LAYER = 20      # forward kernels of a pre-norm layer: 7 matmuls, attention, norms, RoPE, act, adds
COMPONENTS = ("matmul", "attention", "memory", "kernels", "tp", "cp", "ep", "p2p", "bubble", "dp", "optimizer")


def step_time(fig: dict, hw: dict, cal: Calibration, *, tp: int, cp: int, pp: int, dp: int, ep: int, rule: str,
              recompute: float, sp: bool, mb: int, gas: int, seq_len: int, bytes_: float, node: int,
              optimizer_bytes: float, fused_attention: bool = True, shard_group: int | None = None,
              idle_slots: float | None = None, chunks: int = 1, compiled: bool = False,
              rules: Mapping[str, tuple] | None = None, float8: bool = False,
              overlap: Mapping[str, str] | None = None, dispatch: Mapping[str, str] | None = None,
              attention_speed: tuple[float, float] = (1.0, 1.0), dp_bytes: Mapping[str, float] | None = None,
              expert_tp: int | None = None,
              _stage: tuple[int, bool] | None = None) -> dict:
    """Every component of one layout's step, in seconds (see the module docstring).
    ``rule``: the data-parallel rule's declared collectives, or its name (its declaration read
    from the installed rules); ``rules``: the tp, cp, ep and pp rules' declarations by axis
    (default: the installed default rules');
    ``idle_slots``: the pipeline schedule's bubble in micro-batch slots (None: 1F1B's pp - 1);
    ``chunks``: model chunks per rank (an interleaved schedule's v: v times the sends);
    ``compiled``: torch.compile fuses the memory-bound ops (default: eager, as the measured
    memory profile models); ``float8``: the layers' linears run float8 GEMMs (the LM head and
    attention stay bf16) and pay their casts; ``overlap``: {axis: how} for the collectives an
    implementation overlaps that the rule declares on the critical path (``_per_layer``:
    ``{"tp": "decomposed"}`` for async TP, ``{"ep": "batched"}`` for EP all-to-all overlap);
    ``dispatch``: {"ep": "node-forwarded"} for a DeepEP-style all-to-all (``all_to_all_across_nodes``);
    ``attention_speed``: the attention kernel's declared (forward, backward) throughput over
    FlashAttention-2's (``AttentionTiming``; (1, 1): FlashAttention-2); ``dp_bytes``: the bytes per element
    the run's regime declares for the ``parameters`` and ``gradients`` volumes (``collective_bytes``; a
    volume it does not declare, or None: ``bytes_``, the precision's). The pipeline rule's declared
    stages (``rules["pp.stages"]``, ``steptime_hookspecs.STAGES``): ``"ends-one-fewer"`` times the
    slower of a middle stage (ceil((L + 2) / pp) layers) and the last (one layer fewer, the LM head);
    otherwise every stage ceil(L / pp) layers, the head on the last."""
    if rules is None or isinstance(rule, str):      # (a direct call: the installed rules' declarations)
        axes, by_name = declarations()
        rules = axes if rules is None else rules
        rule = by_name[rule] if isinstance(rule, str) else rule
    if _stage is None and pp > 1 and rules.get("pp.stages") == "ends-one-fewer":
        middle = math.ceil((fig["layers"] + 2) / pp)
        run = dict(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, rule=rule, recompute=recompute, sp=sp, mb=mb, gas=gas,
                   seq_len=seq_len, bytes_=bytes_, node=node, optimizer_bytes=optimizer_bytes,
                   fused_attention=fused_attention, shard_group=shard_group, idle_slots=idle_slots, chunks=chunks,
                   compiled=compiled, rules=rules, float8=float8, overlap=overlap, dispatch=dispatch,
                   attention_speed=attention_speed, dp_bytes=dp_bytes, expert_tp=expert_tp)
        return max((step_time(fig, hw, cal, **run, _stage=(middle, False)),
                    step_time(fig, hw, cal, **run, _stage=(middle - 1, True))), key=lambda parts: parts["step"])
    overlap, dispatch = overlap or {}, dispatch or {}
    h, h_q, h_kv = fig["h"], fig["h_q"], fig["h_kv"]
    layers, head = _stage if _stage is not None else (math.ceil(fig["layers"] / pp), True)
    T = mb * seq_len / cp
    r = recompute
    peak, mem_bw = hw["flops"], hw["memory"]
    # compute, one micro-batch on the slowest (last) stage: each GEMM's roofline (layer_gemms)
    # (float8 tensor parallelism, the implementation's declared tp_gather: under sequence parallelism the casts move
    # before the all-gathers, which move tp_gather bytes an element: layer_gemms, _seconds)
    f8 = casts_of(float8)
    tp_gather = f8.tp_gather if float8 and sp and tp > 1 else None
    g = layer_gemms(fig, hw, cal, T, tp, ep, 1 if float8 else 2, f8, tp_gather is not None)
    layer_fwd = 2 * T * fig["layer_active"] / tp
    head_fwd = 2 * T * fig["head"] / tp if head else 0.0
    matmul = layer_fwd * layers * (g["fwd"] * (1 + r) + g["bwd"] * 2) + head_fwd * 3 * g["head"]
    attn_fwd = 2 * T * attention_span(fig, seq_len) * h_q / tp
    # forward passes (the first and any recomputed one) at cal.attention, the backward's 2.5 forwards (it
    # recomputes the scores) at cal.attention x cal.attention_backward (ATTENTION_BACKWARD); each at the kernel's
    # declared share of FlashAttention-2's (attention_speed, AttentionTiming)
    speed_fwd, speed_bwd = attention_speed
    attention = attn_fwd * layers * ((1 + (r if r >= 1 or not fused_attention else 0)) / speed_fwd
                                     + 2.5 / (cal.attention_backward * speed_bwd)) / (
        cal.attention * peak * hw.get("clock", 1.0))
    elementwise = _elementwise_bytes(fig, tp, sp, compiled) * T * bytes_ / 2
    logits = 4 * T * fig["vocab"] / tp * 4 if head else 0.0     # fp32 logits: written, read by the loss, its gradient
    casts = (g["cast_fwd"] * (1 + r) + g["cast_bwd"]) * layers
    if g["cast_step"]:      # (casts once a step, e.g. TE's cached weights: a micro-batch's share)
        casts += g["cast_step"] * layers / gas
    memory = (elementwise * layers * (3 + r) + logits + casts) / (cal.memory * mem_bw)
    if fig["experts"] > 1:      # (a routed layer's token permutation: ROUTING_COPIES)
        fwd_copies, bwd_copies = routing_copies(fig["k"])
        memory += (T * fig["h"] * bytes_ / (tp if sp else 1) * layers * (fwd_copies * (1 + r) + bwd_copies)
                   / (cal.memory * mem_bw))
    kernels = KERNELS_PER_LAYER * layers * (3 + r) * cal.kernel_overhead
    # communication inside a micro-batch: what the tp, cp, ep and pp rules declare
    d = dp * cp
    gs = shard_group or min(d, node)
    # (the expert-parallel group: ep ranks expert_tp apart, Megatron-Core's expert RankGenerator (tp =
    # expert_tensor_parallel_size, order tp-ep-dp-pp, parallel_state.py at NVIDIA/Megatron-LM 001199898c4b): with an
    # expert tensor parallelism below tp the EP group is denser than the dense tp-cp-dp order; None: tp apart)
    groups = {"tp": (tp, 1), "cp": (cp, tp), "ep": (ep, tp if expert_tp is None else expert_tp), "dp": (d, tp),
              "pp": (pp, tp * cp * dp),
              "dp-node": (gs, tp), "dp-across": (d // gs, tp * gs),
              # the expert tensor-parallel group: expert_tp ranks, 1 apart (None: the tp group, Megatron-Core's default
              # expert_tensor_parallel_size)
              "etp": (tp if expert_tp is None else expert_tp, 1)}
    dense = (fig["parameters"] - fig["expert_params"]) / (tp * pp)
    expert_local = fig["expert_params"] / (tp * pp * ep)
    local = dense + expert_local
    dp_bytes = dp_bytes or {}
    h_kv_kernel = fig.get("h_kv_kernel", h_kv)       # (K/V as the attention kernel reads them: repeated or not)
    volumes = {"activations": (T, h, bytes_), "kv": (T, 2, h_kv_kernel, bytes_), "routed": (T, fig["k"], h, bytes_),
               "gradients": (local, dp_bytes.get("gradients", bytes_)),
               "parameters": (local, dp_bytes.get("parameters", bytes_))}
    size = dict(groups=groups, volumes=volumes, node=node, hw=hw, cal=cal, sp=sp, experts=fig["experts"], k=fig["k"],
                tp_gather=tp_gather, tp_fuses=f8.async_tp_fuses if float8 else None)
    # A rank's experts have replicas only on the d / ep ranks that hold the same experts (its expert-data-parallel
    # group, ep x tp ranks apart): the data-parallel collectives of the expert parameters (and their gradients) run
    # over that group, the dense ones over dp x cp (_seconds; Megatron-Core's DistributedDataParallel allocates the
    # expert parameters' buffers over ``intra_expt_dp_group``, the dense ones' over ``intra_dp_cp_group``,
    # megatron/core/distributed/distributed_data_parallel.py at NVIDIA/Megatron-LM 001199898c4b; its expert ranks
    # ordered tp-ep-dp-pp, parallel_state.py's expert RankGenerator, expert data parallel = world / (tp ep pp))
    # (an ep beyond dp x cp, folded over the tp ranks as Megatron allows: each expert on one rank, no replica)
    edp = max(1, d // ep)
    if ep > 1 and expert_local:     # (the two shares' sizes, built once: a search's hot path)
        size["expert_dp"] = ({**size, "volumes": {**volumes, "gradients": (dense, volumes["gradients"][1]),
                                                  "parameters": (dense, volumes["parameters"][1])}},
                             {**size, "groups": {**groups, "dp": (edp, tp * ep)},
                              "volumes": {**volumes, "gradients": (expert_local, volumes["gradients"][1]),
                                          "parameters": (expert_local, volumes["parameters"][1])}})
    fwd = (matmul + attention + memory) / (3 + r)
    bwd = fwd * (2 + r)
    attn_r = r if r >= 1 or not fused_attention else 0
    attn_pass = attn_fwd / (cal.attention * peak * hw.get("clock", 1.0))     # one forward pass, one layer
    per_layer = {"attention": attention / layers, "forward": fwd / layers, "backward": bwd / layers,
                 "matmul": matmul / layers, "layer": (matmul + attention + memory) / layers,
                 "attention-recompute": attn_r, "attention-forward-pass": attn_pass / speed_fwd,
                 "attention-backward-pass": attn_pass * 2.5 / (cal.attention_backward * speed_bwd)}
    # (a paired overlap's slots, _steptime_paired: the attention block and the routed GEMMs, per layer; only for
    # a run that overlaps: a search's hot path)
    if "batched" in overlap.values():
        _paired_computes(per_layer, fig, g, cal, layer_fwd, elementwise, T, tp, sp, compiled, bytes_, mem_bw)
    # (the expert rule's collectives move routed tokens: a dense model has none)
    tp_comm, cp_comm, ep_comm = (_per_layer(rules.get(axis) or (), layers, r, per_layer, size, overlap.get(axis),
                                            dispatch.get(axis), rules.get(f"{axis}.paired"))
                                 if axis != "ep" or fig["experts"] > 1 else 0.0
                                 for axis in ("tp", "cp", "ep"))
    # the memory-bound work the cp rule declares beside its ring (RingTraffic), per rank's q and k, v elements
    ring = rules.get("cp.traffic")
    cp_comm += layers * (_ring_traffic(ring, cp, attn_r, T * h_q / tp, T * 2 * h_kv_kernel / tp) / (cal.memory * mem_bw)
                         + _ring_kernels(ring, cp, attn_r) * cal.kernel_overhead)
    p2p = _per_micro_batch(rules.get("pp") or (), chunks, size, {"forward": fwd, "backward": bwd})
    micro = matmul + attention + memory + kernels + tp_comm + cp_comm + ep_comm + p2p
    bubble = (pp - 1 if idle_slots is None else idle_slots) * micro
    # data parallelism: the local shard's gradients and parameters
    declared = UNDECLARED_DP if rule is None else rule
    dp_comm = _data_parallel(declared, gas, fig["layers"] / pp, {"forward": fwd, "backward": bwd,
                                                                 "attention": attention}, size)
    # a rule that reduce-scatters the gradients steps the optimizer on its shard of dp x cp
    shards = d if any(c.kind == "reduce-scatter" for c in declared) else 1
    if shards > 1 and size.get("expert_dp"):     # (the expert parameters' shard: of their d / ep replicas)
        optimizer = (dense / d + expert_local / edp) * optimizer_bytes / (cal.memory * mem_bw)
    else:
        optimizer = local / shards * optimizer_bytes / (cal.memory * mem_bw)
    parts = dict(matmul=matmul * gas, attention=attention * gas, memory=memory * gas, kernels=kernels * gas,
                 tp=tp_comm * gas, cp=cp_comm * gas, ep=ep_comm * gas, p2p=p2p * gas, bubble=bubble,
                 dp=dp_comm, optimizer=optimizer)
    parts["step"] = sum(parts.values())
    return parts


def _paired_computes(per_layer: dict, fig: dict, g: dict, cal: Calibration, layer_fwd: float, elementwise: float,
                     T: float, tp: int, sp: bool, compiled: bool, bytes_: float, mem_bw: float) -> None:
    """A paired overlap's computes per layer (_steptime_paired.SLOT_COMPUTES): the GEMMs by routed share, the
    memory-bound ops (the activation the MLP's, the rest the attention block's; a pass forward, two backward)
    and the casts (by the GEMMs' routed share: an approximation)."""
    mm_f, mm_b, rf, rb = layer_fwd * g["fwd"], layer_fwd * 2 * g["bwd"], g["routed_fwd"], g["routed_bwd"]
    bw = cal.memory * mem_bw
    e_mlp = _elementwise_bytes(fig, tp, sp, compiled, mlp_only=True) * T * bytes_ / 2 / bw
    e_attn = elementwise / bw - e_mlp
    per_layer.update({"attention-block-forward": mm_f * (1 - rf) + per_layer["attention-forward-pass"] + e_attn
                      + g["cast_fwd"] * (1 - rf) / bw,
                      "mlp-block": mm_f * rf + mm_b * rb + 3 * e_mlp + (g["cast_fwd"] * rf + g["cast_bwd"] * rb) / bw,
                      "attention-block-backward": mm_b * (1 - rb) + per_layer["attention-backward-pass"] + 2 * e_attn
                      + g["cast_bwd"] * (1 - rb) / bw})


def routing_copies(k: int) -> tuple[int, int]:
    """Elements per token and hidden unit a routed (dropless token-choice) layer's token permutation reads
    and writes, (forward, backward), for ``k`` experts per token: each kernel's input and output tensors
    once. Megatron-Core's ``permute`` and ``unpermute`` (megatron/core/transformer/moe/moe_utils.py at
    NVIDIA/Megatron-LM 00611e6eeb0b; with ``fused``, Transformer Engine's ``fused_permute`` and
    ``fused_unpermute(..., merging_probs=probs)``): the forward copies each token [T, h] once per expert into
    expert order [T k, h] (k + 1) and sums the experts' outputs [T k, h] back into [T, h] weighted by their
    probabilities (k + 1): 2 k + 2. The backward: the unpermute's reads the output gradient [T, h] and the
    experts' outputs [T k, h] (the probabilities' gradient) and writes the gradient in expert order [T k, h]
    (2 k + 1); the permute's sums the k copies' gradients [T k, h] back into [T, h] (k + 1): 3 k + 2.
    (torchtitan's MoE runs the same gather and scatter-add.) Not counted: the alltoall dispatcher's second
    sort of the received tokens by local expert (``sort_chunks_by_idxs``), the router's [T, experts] work,
    and reads of a row more than once by the unfused ``index_select``."""
    return 2 * k + 2, 3 * k + 2


def attention_span(fig: dict, seq_len: int) -> float:
    """Twice the mean number of keys a query attends to, averaged over the layers (the attention
    FLOPs per token are 2 x span x h_q forward: QK^T and PV, 2 FLOPs per key and width each). A
    causal layer: ``seq_len`` (its (s + 1) / 2 keys, as the FLOP count the sources use); a
    sliding-window layer (``fig['window']`` keys, itself included, in ``fig['windowed']`` of the
    layers, as the family's ``sliding_window`` and ``sliding_window_layers`` describe it): the
    first w queries see 1..w keys, the rest w, so 2 (w (w + 1) / 2 + (s - w) w) / s (a window
    at least the sequence is causal). The kernel's block granularity is not modelled."""
    w, n = fig.get("window"), fig.get("windowed", 0)
    if not w or not n or w >= seq_len:
        return seq_len
    windowed = 2 * (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len
    layers = fig["layers"]
    return ((layers - n) * seq_len + n * windowed) / layers


def _elementwise_bytes(fig: dict, tp: int, sp: bool, compiled: bool, mlp_only: bool = False) -> float:
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
    if mlp_only:        # (the MLP's activation alone: what a paired overlap's MLP block runs)
        return act * mlp / tp
    replicated = (2 * norm + 12) * h / (tp if sp else 1)
    return replicated + (rope * (fig["h_q"] + fig["h_kv"]) + act * mlp) / tp


def declarations(registry=None, options: Mapping | None = None) -> tuple[dict, dict]:
    """The installed rules' declared collectives: ({axis: the default tp, cp, ep and pp rule's},
    {data-parallel rule name: its, or None}), from ``registry`` (default: the process's), each under
    the run's options object for it (``options``: {rule name: options}, a plan's ``options``; a rule
    not in it: its defaults)."""
    if registry is None:
        from mlsysim_core.manager import get_plugin_manager
        registry = get_plugin_manager().registry
    from mlsysim_core.specs import DATA, DEFAULT_RULES
    options = options or {}
    rules = registry.sharding_rules
    axes = {axis: collectives(rules[name], options.get(name)) or () for axis, name in DEFAULT_RULES.items()
            if name in rules}
    for axis, name in DEFAULT_RULES.items():     # ("<axis>.traffic": what a rule runs beside its collectives)
        declared = traffic(rules[name], options.get(name)) if name in rules else None
        if declared is not None:
            axes[f"{axis}.traffic"] = declared
        declared = stages(rules[name], options.get(name)) if name in rules else None
        if declared is not None:         # ("<axis>.stages": how the pipeline rule splits the layers)
            axes[f"{axis}.stages"] = declared
        declared = paired(rules[name], options.get(name)) if name in rules else None
        if declared is not None:         # ("<axis>.paired": how a rule's batched collectives pair, _steptime_paired)
            axes[f"{axis}.paired"] = declared
    return axes, {name: collectives(spec, options.get(name)) for name, spec in registry.rules_for_axis(DATA).items()}


def time_layout(timing: Mapping, *, tp: int, cp: int, pp: int, dp: int, ep: int, rule: str, recompute: float,
                sp: bool, mb: int, gas: int) -> dict:
    """``step_time`` for one layout from a search's ``timing`` (``prepare``'s: the model, hardware,
    calibration, the rules' declarations, the pipeline schedule's ``idle`` slots and model chunks)."""
    idle = timing["idle"]
    slots = idle(pp, gas, timing["chunks"]) if idle is not None and pp > 1 else None
    return step_time(timing["fig"], timing["hw"], timing["cal"], tp=tp, cp=cp, pp=pp, dp=dp, ep=ep,
                     rule=timing["dp_rules"].get(rule), recompute=recompute, sp=sp, mb=mb, gas=gas,
                     seq_len=timing["seq_len"], bytes_=timing["bytes_"], node=timing["node"],
                     optimizer_bytes=timing["optimizer_bytes"], fused_attention=timing["fused_attention"],
                     idle_slots=slots, chunks=timing["chunks"], rules=timing["rules"],
                     compiled=timing.get("compiled", False), float8=timing.get("float8", False),
                     overlap=timing.get("overlap"), dispatch=timing.get("dispatch"),
                     attention_speed=timing.get("attention_speed", (1.0, 1.0)), dp_bytes=timing.get("dp_bytes"),
                     expert_tp=timing.get("expert_tp"))


def check(hardware, overrides: Mapping[str, object], calibration) -> None:
    """Before anything is solved: the hardware has the topology (or overrides), ``calibration`` is one."""
    missing = missing_topology(hardware, overrides)
    if missing:
        raise InvalidInputError("hardware", hardware.name, "hardware with the planner's topology: "
                                + ", ".join(TOPOLOGY_FIELDS),
                                f"{hardware.name} has no {', '.join(missing)}: add them to its catalog entry or "
                                "JSON file (or pass flops=, tp_bandwidth=, network_bandwidth=)")
    if calibration is not None and not isinstance(calibration, Calibration):
        raise InvalidInputTypeError("calibration", calibration, "a steptime.Calibration, or None")


def prepare(*, model, hardware, registry, result, seq_len: int, precision_bytes: float, node: int, flops=None,
            intra=None, inter=None, calibration: Calibration | None = None, attention: str | None = None,
            schedule=None, chunks: int = 1, dp_rules=(), compiled: bool = False, float8: bool = False,
            overlap: Mapping[str, str] | None = None, power: float | None = None,
            memory_bandwidth: float | None = None, dispatch: Mapping[str, str] | None = None,
            rule_options: Mapping | None = None, expert_tp: int | None = None) -> dict:
    """A search's ``timing``: what ``time_layout`` reads, and the notes and assumptions it says.
    The implementation choices a search does not enumerate (``compiled``, ``float8``,
    ``overlap``: {"tp": "decomposed"} for async TP, {"ep": "batched"} for EP all-to-all overlap;
    ``dispatch``: {"ep": "node-forwarded"} for DeepEP-style node-level deduplication)
    and the run's ``power`` limit (watts) and ``memory_bandwidth`` (B/s) apply to every layout.
    ``rule_options``: {rule name: the run's options object} (a plan's ``options``): a rule whose
    declarations depend on its options (an implementation it lets a run choose) is timed under
    them; None: every rule's defaults. ``expert_tp``: the run's expert tensor-parallel size, the
    ``etp`` group of the collectives that declare it (None: the tp group, as a search times)."""
    cal = calibration_for(hardware.name) if calibration is None else calibration
    fig = model_figures(model)
    hw = hardware_figures(hardware, flops=flops, intra=intra, inter=inter, power=power, memory=memory_bandwidth)
    overlap = dict(overlap or {})
    for axis, how in overlap.items():
        if (axis, how) not in [*(("tp", d) for d in DECOMPOSED), ("ep", "batched")]:
            raise InvalidInputError("overlap", overlap, "{'tp': 'decomposed'} or {'tp': 'symmetric-memory'} (async TP: "
                                    "time_plan's async_tp True or 'symmetric-memory') and/or {'ep': 'batched'} (EP "
                                    "all-to-all overlap)")
    dispatch = dict(dispatch or {})
    if any(axis != "ep" or how != "node-forwarded" for axis, how in dispatch.items()):
        raise InvalidInputError("dispatch", dispatch, "{'ep': 'node-forwarded'} (a DeepEP-style all-to-all: once per "
                                "destination node, forwarded inside it)")
    axes, declared = declarations(registry, rule_options)
    notes = []
    if not cal.calibrated:
        notes.append(f"step time uncalibrated for {hardware.name}: assumed efficiencies (steptime.DEFAULT), no "
                     "published measurement fitted")
    untimed = [r for r in dp_rules if declared.get(r) is None]
    if untimed:
        notes.append(f"data-parallel rules {', '.join(untimed)}: the step time counts their communication as fsdp's "
                     "(gather, gather, reduce-scatter per micro-batch)")
    # What the kernel computes, as it declares it (a kernel registered under another name is the same kernel)
    kernel = (registry.extensions.get("mlsysim_measured_attention_kernels") or {}).get(attention) if attention else None
    eager = kernel is not None and getattr(kernel, "eager", False)
    if eager:
        notes.append("step time: eager attention is timed as the fused kernel's FLOPs, not its s x s traffic: optimistic")
    # the kernel's speed, as it declares it (``step_time``: an AttentionTiming); none: FlashAttention-2's
    declared_speed = getattr(kernel, "step_time", None) if kernel is not None else None
    if declared_speed is not None and not isinstance(declared_speed, AttentionTiming):
        raise InvalidInputTypeError(f"attention kernel {attention!r} step_time", declared_speed,
                                    "a steptime.AttentionTiming, or None (timed as FlashAttention-2)")
    attention_speed = ((1.0, 1.0) if declared_speed is None
                       else (float(declared_speed.forward), float(declared_speed.backward)))
    if hardware.memory_bandwidth is None and memory_bandwidth is None:
        notes.append(f"step time: {hardware.name} has no memory_bandwidth: {ASSUMED_MEMORY_BANDWIDTH:.0e} B/s")
    if hw["sms"] is None:
        notes.append(f"step time: {hardware.name} records no streaming_multiprocessors: GEMMs timed without tile "
                     "and wave quantization")
    if power is not None and hw["tdp"] is None:
        notes.append(f"step time: {hardware.name} records no power_limit_watts: the power limit {power:g} W is not "
                     "applied")
    if float8 and not hw["fp8_stated"]:
        notes.append(f"step time: {hardware.name} has no peak_fp8_flops: float8 GEMMs timed at 2 x its bf16 peak")
    if float8 and hw["fp8_matmul"] is None:
        notes.append(f"step time: {hardware.name} records no max_achievable_matmul_flops for bf16 and fp8: float8 "
                     "GEMMs timed at the bf16 GEMMs' share of the peak")
    notes += fig["notes"]
    if schedule is not None and getattr(schedule, "idle_slots", None) is None:
        notes.append(f"pipeline schedule {schedule.name} declares no idle_slots: its bubble is timed as 1F1B's")
    state = optimizer_step_bytes(result, model.parameters)
    dp_bytes = collective_bytes(result, registry)
    return dict(fig=fig, hw=hw, cal=cal, seq_len=seq_len, bytes_=precision_bytes, node=node, optimizer_bytes=state,
                fused_attention=not eager, attention_speed=attention_speed, dp_bytes=dp_bytes,
                idle=getattr(schedule, "idle_slots", None), chunks=chunks,
                compiled=compiled, float8=float8, overlap=overlap, dispatch=dispatch, expert_tp=expert_tp,
                rules=axes, dp_rules=declared, calibrated=cal.calibrated, notes=tuple(notes),
                flops_per_token=model_flops_per_token(fig, seq_len), peak=hw["flops"],
                assumptions={"peak_bf16_flops": hw["flops"], "intra_node_bandwidth": hw["intra"],
                             "inter_node_bandwidth": hw["inter"], "memory_bandwidth": hw["memory"],
                             "streaming_multiprocessors": hw["sms"], "power_limit_watts": hw["power"],
                             "clock_share": hw["clock"], "float8_matmul_share": hw["fp8_matmul"],
                             **{f"data_parallel_bytes.{k}": v for k, v in sorted(dp_bytes.items())},
                             "devices_per_node": node, "optimizer_step_bytes_per_parameter": state,
                             **{f"calibration.{k}": v for k, v in cal.as_dict().items()}})


REGIMES_HOOK = "mlsysim_measured_regimes"     # (the measured profile's registered regimes, by name)


def collective_bytes(result, registry) -> dict:
    """Bytes per element of the data-parallel collectives' volumes (``parameters``, ``gradients``), as the
    regime the run was solved in declares them (its ``collective_bytes()``: the measured profile's
    ``Regime``); {} for a result that names no regime (the reference profile) or a regime that declares
    none: the precision's bytes, as before."""
    name = (getattr(result, "details", None) or {}).get("regime")
    if not name:
        return {}
    regimes = registry.extensions.get(REGIMES_HOOK) or {}
    from mlsysim_core.registry import resolve_name
    try:
        regime = regimes[resolve_name("regime", name, regimes)]
    except (InvalidInputError, KeyError):
        return {}
    declared = getattr(regime, "collective_bytes", None)
    return dict(declared()) if callable(declared) else {}


def hidden(comm: float, compute: float, cal: Calibration) -> float:
    """Exposed seconds of a collective overlapping ``compute``: what outlasts it, plus the
    compute slowed while they overlap (the collective's kernel holds overlap_sm_share of the SMs)."""
    return max(0.0, comm - compute) + cal.overlap_sm_share * min(comm, compute)


# A data-parallel rule that declares no collectives is timed as fsdp's: gather for the forward,
# again for the backward, reduce-scatter after it, every micro-batch.
UNDECLARED_DP = (
    Collective(kind="all-gather", volume="parameters", group="dp", per="micro-batch", forward=1, overlaps="forward",
               first_layer_exposed=True),
    Collective(kind="all-gather", volume="parameters", group="dp", per="micro-batch", backward=1, overlaps="backward"),
    Collective(kind="reduce-scatter", volume="gradients", group="dp", per="micro-batch", backward=1,
               overlaps="backward"))


def _seconds(c: Collective, size: dict, choice: str | None = None) -> float:
    """One call of a declared collective: its kind's time over its group's link, plus its
    latency by NCCL's model (``alpha``). ``choice``: the run's implementation choice for its axis
    (``node-forwarded`` applies to a routed all-to-all across nodes that declares it). A collective of the
    ``parameters`` or ``gradients`` volume over ``dp`` in a run with experts spread over ep > 1 ranks
    (``size["expert_dp"]``: the sizes of the dense share over dp x cp and of the experts' share over the
    expert-data-parallel group) is two, one after the other."""
    split = size.get("expert_dp")
    if split is not None and c.group == "dp" and c.volume in ("parameters", "gradients"):
        return _seconds(c, split[0], choice) + _seconds(c, split[1], choice)
    n, stride = size["groups"][c.group]
    if n <= 1:
        return 0.0
    node, hw, cal = size["node"], size["hw"], size["cal"]
    factors = size["volumes"][c.volume]
    if c.element_bytes is not None:     # (the last factor is the element's bytes)
        factors = (*factors[:-1], c.element_bytes)
    elif (size.get("tp_gather") is not None and c.group == "tp" and c.volume == "activations"
          and c.kind in ("all-gather", "all-reduce")):
        # float8 tensor parallelism (Float8Casts.tp_gather): the all-gathers move tp_gather bytes an element; an
        # all-reduce under sequence parallelism is an all-gather and a reduce-scatter (in the run's precision) of the
        # same volume: their mean
        gather = size["tp_gather"]
        factors = (*factors[:-1], gather if c.kind == "all-gather" else (gather + factors[-1]) / 2)
    if c.per_step:      # one send of the buffer to the next rank of the ring (split over ``shard``)
        volume = 1.0
        for f in factors:
            volume = volume * f
        if c.shard is not None:
            volume = volume / size["groups"][c.shard][0]
        inside = n * stride <= node
        bw = hw["intra"] * cal.intra_link if inside else hw["inter"] * cal.inter_link
        return volume / bw + cal.latency + (cal.hop_intra if inside else cal.hop_inter)
    lat = alpha(c.kind, n, stride, node, cal)
    if c.kind in ("all-to-all", "ring-pass"):       # (the factors multiplied in the formula's order)
        if c.shard is not None:     # (a buffer split over another group: each rank sends its part)
            factors = (*factors, 1 / size["groups"][c.shard][0])
        if c.kind == "all-to-all" and n * stride > node:
            fwd = ((size["experts"], size["k"]) if choice == "node-forwarded" and c.volume == "routed"
                   and "node-forwarded" in c.implementations else None)
            return all_to_all_across_nodes(factors, n, stride, node, hw, cal, fwd) + lat
        x = (n - 1) / n if c.kind == "all-to-all" else n - 1
        for f in factors:
            x = x * f
        bw = link(n, stride, node, hw, cal)
        return x / bw + lat
    volume = factors[0]
    for f in factors[1:]:
        volume = volume * f
    if c.shard is not None:
        volume = volume / size["groups"][c.shard][0]
    if c.kind == "send-recv":   # to the neighbouring stage, ``stride`` ranks away
        if c.volume == "activations" and size["sp"]:
            # under sequence parallelism the boundary activation is sequence-sharded over the tp ranks:
            # each sends its 1/tp (Narayanan et al. 2021, section 4.1, scatter/gather optimization)
            volume = volume / size["groups"]["tp"][0]
        bw = hw["intra"] * cal.intra_link if stride < node else hw["inter"] * cal.inter_link
        return volume / bw + lat
    bw = link(n, stride, node, hw, cal)
    if c.kind == "all-reduce":
        if c.in_network:
            return allreduce_time(volume, n, bw, lat, n * stride <= node, cal)
        return ring_time(volume, n, bw, lat, 2)
    return ring_time(volume, n, bw, lat)        # all-gather, reduce-scatter


def _applies(c: Collective, size: dict) -> bool:
    return c.sequence_parallel is None or c.sequence_parallel == size["sp"]


# The async-TP implementations (``overlap={"tp": ...}``): each GEMM split into tp chunks, each chunk's collective beside
# the next chunk's GEMM. "decomposed": the reduce-scatter's reduction runs inside the collective's own kernels
# (Megatron-Core's --tp-comm-overlap, Transformer Engine's userbuffers: CommOverlapBase::split_overlap_rs calls
# reducescatter2_userbuff_strided per chunk on the communication stream); "symmetric-memory": torch's micro-pipeline TP
# (torchtitan's enable_async_tensor_parallel), whose fused matmul-reduce-scatter sums the partials in a kernel of its
# own after the pipeline (_partials_reduction).
DECOMPOSED = ("decomposed", "symmetric-memory")


def _per_layer(declared, layers: int, r: float, compute: Mapping[str, float], size: dict, overlap: str | None = None,
               dispatch: str | None = None, paired=None) -> float:
    """Exposed seconds per micro-batch of an axis' per-layer collectives: ``forward`` calls per
    forward (recomputed ones too), ``backward`` per backward; those overlapping one compute are
    added and hidden behind it, layer by layer. ``overlap`` (an implementation's choice for
    the collectives declared on the critical path): ``"decomposed"`` (async TP, Megatron's TP
    communication overlap: each GEMM split into n chunks over the group, each chunk's collective
    beside the next chunk's GEMM; Wang et al. 2023, 'Overlap Communication with Dependent
    Computation via Decomposition', ASPLOS; torchtitan's async TP): the first chunk's share
    1/n is exposed, the rest hidden behind the layer's matmuls; ``"batched"`` (DeepEP-style EP
    overlap: one micro-batch's all-to-all beside another's compute): hidden behind the layer's
    compute, for the collectives that declare it (or declare no implementations); where the rule declares
    how its batched collectives pair (``paired``: _steptime_paired.PairedSlot's, Megatron's combined
    1F1B), each slot's share of their calls hidden behind its compute, slot by slot; ``dispatch``:
    ``"node-forwarded"`` (``_seconds``)."""
    exposed, overlapping = 0.0, {}
    slots = [0.0] * len(paired or ())
    for c in declared:
        if c.per != "layer" or not _applies(c, size):
            continue
        t = _seconds(c, size, dispatch)
        calls = (c.forward + c.backward) + c.forward * r
        if c.overlaps == "attention-step":
            exposed += layers * _ring_steps(c, t, compute, size)
            continue
        if c.overlaps is None and overlap in DECOMPOSED:
            n = size["groups"][c.group][0]
            whole = _not_fused(c, size)     # (the share of the call the GEMMs' implementation does not decompose)
            exposed += layers * t * calls * (whole + (1 - whole) / n)
            if overlap == "symmetric-memory":   # (the fused reduce-scatter's partials summed after its pipeline)
                exposed += layers * calls * _partials_reduction(c, size)
            overlapping["matmul"] = overlapping.get("matmul", 0.0) + t * calls * (1 - whole) * (n - 1) / n
        elif c.overlaps is None and overlap == "batched" and (not c.implementations or "batched" in c.implementations):
            if paired:
                for i, slot in enumerate(paired):
                    slots[i] += t * (slot.forward * c.forward * (1 + r) + slot.backward * c.backward)
            else:
                overlapping["layer"] = overlapping.get("layer", 0.0) + t * calls
        elif c.overlaps is None:
            exposed += calls * layers * t
        else:
            overlapping[c.overlaps] = overlapping.get(c.overlaps, 0.0) + t * calls
    for target, comm in overlapping.items():
        exposed += layers * hidden(comm, compute[target], size["cal"])
    for slot, comm in zip(paired or (), slots):
        if comm:
            exposed += layers * hidden(comm, compute[slot.compute], size["cal"])
    return exposed


def _partials_reduction(c: Collective, size: dict) -> float:
    """Seconds of the kernel that sums a fused matmul-reduce-scatter's partial outputs, once per call of a
    tensor-parallel collective whose reduce-scatter half an async TP over symmetric memory fuses
    (``{"tp": "symmetric-memory"}``, torch's micro-pipeline TP): each rank's GEMM chunks write the n partial sums of
    its output shard into one buffer of the whole output's size ([M, N], the run's precision), and a reduction
    kernel of its own reads it and writes the [M / n, N] shard, after the last chunk, on the critical path
    (pytorch/pytorch torch/distributed/_symmetric_memory/__init__.py: ``_fused_matmul_reduce_scatter_impl`` and
    ``_fused_scaled_matmul_reduce_scatter_impl``, ``stacked_partials`` then ``reduce_fn = partial(torch.sum,
    dim=0)``, later ``reduce_partials``; in the stored copies with rowwise scales, 2025, and at 006b161f). 0 where
    the reduce-scatter is not fused (``Float8Casts.async_tp_fuses``) or the collective has none."""
    if c.group != "tp" or not (c.kind == "reduce-scatter" or (c.kind == "all-reduce" and c.sequence_parallel)):
        return 0.0
    fuses = size.get("tp_fuses")
    if fuses is not None and "reduce-scatter" not in fuses:
        return 0.0
    factors = size["volumes"][c.volume]
    precision = c.element_bytes if c.element_bytes is not None else factors[-1]
    elements = 1.0
    for f in factors[:-1]:
        elements *= f
    n = size["groups"][c.group][0]
    return elements * precision * (1 + 1 / n) / (size["cal"].memory * size["hw"]["memory"])


def _not_fused(c: Collective, size: dict) -> float:
    """The share of a tensor-parallel collective's seconds that an async TP leaves whole on the critical path:
    the halves the float8 implementation's GEMMs do not fuse (``Float8Casts.async_tp_fuses``; None, a 16-bit run:
    both fused, 0). A sequence-parallel all-reduce is an all-gather and a reduce-scatter of one volume, the
    all-gather's share its bytes over both's (``tp_gather`` float8 bytes against the run's precision)."""
    fuses = size.get("tp_fuses")
    if fuses is None or c.group != "tp" or len(fuses) == 2:
        return 0.0
    if c.kind == "all-reduce" and c.sequence_parallel:
        precision = c.element_bytes if c.element_bytes is not None else size["volumes"][c.volume][-1]
        gather = size["tp_gather"] if size.get("tp_gather") is not None and c.volume == "activations" else precision
        share = {"all-gather": gather / (gather + precision), "reduce-scatter": precision / (gather + precision)}
        return sum(v for k, v in share.items() if k not in fuses)
    return 0.0 if c.kind in fuses or c.kind not in ("all-gather", "reduce-scatter") else 1.0


def _ring_steps(c: Collective, t: float, compute: Mapping[str, float], size: dict) -> float:
    """Exposed seconds per layer of a collective hidden step by step behind a ring's attention: each
    pass (``forward`` per forward, the attention's recomputed forwards too, ``backward`` per backward)
    runs n steps of 1/n of its attention each; a call hides behind one step of its pass, or, declared
    ``per_step``, runs once per step, n - 1 of them hidden behind a step and the last exposed (it is
    waited for after the last step's attention); ``trailing=False``: n - 1 per pass, each hidden behind
    its step and none after the loop."""
    n = size["groups"][c.group][0]
    seconds = 0.0
    for passes, attention in ((c.forward * (1 + compute["attention-recompute"]), compute["attention-forward-pass"]),
                              (c.backward, compute["attention-backward-pass"])):
        if not passes:
            continue
        step = attention / n
        if not c.per_step:
            one = hidden(t, step, size["cal"])
        else:   # n - 1 sends each behind a step, and (trailing) the last waited for after the loop
            one = (n - 1) * hidden(t, step, size["cal"]) + (t if c.trailing else 0.0)
        seconds += passes * one
    return seconds


def _ring_traffic(declared, cp: int, recompute: float, q: float, kv: float) -> float:
    """Bytes per layer of a rule's declared ring traffic (``RingTraffic``) over a cp-rank ring: each
    forward (1 + the attention's recomputed ones) and the backward, ``pass`` once and ``step`` in
    each of the cp - 1 steps after the first, per element of the rank's q (output) and k, v."""
    if declared is None or cp <= 1:
        return 0.0
    def bytes_(step, once):
        return (cp - 1) * (step[0] * q + step[1] * kv) + once[0] * q + once[1] * kv
    return (1 + recompute) * bytes_(declared.forward_step, declared.forward_pass) + bytes_(
        declared.backward_step, declared.backward_pass)


def _ring_kernels(declared, cp: int, recompute: float) -> float:
    """Kernels per layer a rule's ring launches beyond the layer's own (``RingTraffic.kernels_*``)."""
    if declared is None or cp <= 1:
        return 0.0
    (fs, bs), (fp, bp) = declared.kernels_step, declared.kernels_pass
    return (1 + recompute) * ((cp - 1) * fs + fp) + (cp - 1) * bs + bp


def _per_micro_batch(declared, chunks: int, size: dict, compute: Mapping[str, float]) -> float:
    """Exposed seconds per micro-batch of the pipeline rule's sends (x the model chunks per rank): on the critical
    path, or (``overlaps``) each call beside one model chunk's share of the micro-batch's ``forward`` or
    ``backward`` (``compute``), hidden but for what outlasts it and the SMs it takes (``hidden``)."""
    return sum(((c.forward + c.backward) * chunks * (
        _seconds(c, size) if c.overlaps is None else hidden(_seconds(c, size), compute[c.overlaps] / chunks, size["cal"]))
        for c in declared if c.per == "micro-batch" and _applies(c, size)), 0.0)


def _data_parallel(declared, gas: int, layers: float, compute: Mapping[str, float], size: dict) -> float:
    """Exposed seconds per step of the data-parallel rule's declared collectives. Each overlaps
    the compute it runs beside (one micro-batch's backward for a bucketed gradient reduction;
    its forward and backward, layer by layer, for FSDP's prefetched all-gathers, the first
    layer's not hidden); those beside one compute are added and hidden together, per
    micro-batch (x gas) or once per step. A once-a-step call declared ``last_micro_batch`` is
    hidden together with the last micro-batch's calls beside the same compute: gas - 1 micro-batches
    as the others, the last one with it added."""
    declared = [c for c in declared if _applies(c, size)]
    last = any(c.per == "step" and c.last_micro_batch for c in declared)

    def slots(c):       # (which sums a call is in: "last", the last micro-batch's, only when one is declared)
        if c.per == "step":
            return ("last",) if c.last_micro_batch else ("step",)
        if c.per == "micro-batch":
            return ("micro-batch", "last") if last else ("micro-batch",)
        return ()
    total = {}
    for per in ("micro-batch", "step", "last") if last else ("micro-batch", "step"):
        overlapping, exposed = {}, []
        for c in declared:
            if per not in slots(c):
                continue
            one = _seconds(c, size)
            t = (c.forward + c.backward) * one
            if c.overlaps is None:
                exposed.append(t)
            else:
                overlapping[c.overlaps] = overlapping.get(c.overlaps, 0.0) + t
            if c.first_layer_exposed:
                exposed.append(one / layers)
        seconds = 0.0
        for target, comm in overlapping.items():
            seconds += hidden(comm, compute[target], size["cal"])
        for t in exposed:
            seconds += t
        total[per] = seconds
    if last:        # (gas - 1 micro-batches without the call, the last with it)
        return (gas - 1) * total["micro-batch"] + total["last"] + total["step"]
    return gas * total["micro-batch"] + total["step"]


def summary(parts: dict, *, tokens: int, devices: int, fig: dict, seq_len: int, peak: float) -> dict:
    step = parts["step"]
    return {"step_s": step, "tokens_per_s": tokens / step, "tokens_per_s_per_device": tokens / step / devices,
            "mfu": model_flops_per_token(fig, seq_len) * tokens / (step * devices * peak)}


@hookimpl
def mlsysim_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(steptime_hookspecs)      # the planner's hook, this plugin's own


@hookimpl
def mlsysim_step_time_models():
    return [StepTimeSpec(name="roofline", check=check, prepare=prepare, time=time_layout, components=COMPONENTS,
                         description="FLOPs and bytes at fitted shares of the peaks, the rules' declared collectives "
                                     "over the group's link, hidden behind what they overlap (docs/planner.md)")]


@hookimpl
def mlsysim_float8_implementations():
    return list(FLOAT8_IMPLEMENTATIONS)
