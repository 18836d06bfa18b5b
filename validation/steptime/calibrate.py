"""Calibrate the planner's step-time model (plugins/mlsysim_plugins/steptime.py) per accelerator against
published training throughput (validation/steptime/published.py), and check it on held-out runs.

    python validation/steptime/calibrate.py            # fit, print the Calibration and the tables
    python validation/steptime/calibrate.py --doc      # also rewrite the tables in docs/planner.md
    python validation/steptime/calibrate.py --check    # exit 1 if docs/planner.md is stale

Every run is timed by ``mlsysim_core.search.time_plan`` (the public one-layout timing, `mlsysim-core time`),
with the layout, schedule and implementation choices the source states (``layout``).

THE SPLIT (decided before any fit and committed before the fitted constants were: FIT below). Per accelerator a
small set of physically meaningful constants is fitted by least squares on log step time over the runs named in
FIT, and nothing else; every other comparable run is HELD OUT and reported as such.

* H100 (two constants: ``matmul``, the share of the dense peak a large wave-aligned GEMM reaches at the board's
  full power, and ``intra_link``, the NVLink bus-bandwidth share): torchtitan's compiled Llama 3.1 8B FSDP on
  one node (500 W, compute-bound), llm-foundry's MPT-7B on one node (700 W, compute-bound: the power envelope
  between them is a formula, not fitted) and torchtitan's Llama 3 70B FSDP x TP=8 (the TP collectives).
* A100 (one constant: ``matmul``): llm-foundry's MPT-7B and MPT-30B at sequence 2048 on one node.
* H200: nothing fitted; the H100's constants are carried over (the same GH100 die and NVLink 4; said in the
  Calibration's source) and checked on the held-out H200 runs.

Everything else is a documented constant or formula (steptime.DEFAULT and its comments): attention's share of
the peak is FlashAttention-2's stated utilization (H100: 35 %; A100: 50 %, the low end of '50-73%'), the forward's,
its backward at 63/73 of it (the paper's 'up to 73%' forward and 'up to 63%' backward; a source that states
another attention kernel is timed with that kernel's declared shares of it, ATTENTION_KERNEL), memory-bound
kernels 80 % of the bandwidth, collective latency NCCL's model, the overlap cost 24/132 of the SMs.
"""

from __future__ import annotations

import argparse
import math
import runpy
import statistics
import sys
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mlsysim_plugins import steptime                   # noqa: E402
from mlsysim_core import TransformerWorkload            # noqa: E402
from mlsysim_core.search import scale_up_domain, time_plan  # noqa: E402
from mlsysim_core.catalog import get_hardware           # noqa: E402
from mlsysim_core import hookimpl, TrainingMemoryModel  # noqa: E402
from mlsysim_core.manager import PluginManager          # noqa: E402
from mlsysim_core.errors import NotModelledError        # noqa: E402

CASES = runpy.run_path(str(Path(__file__).with_name("published.py")))["CASES"]


# The attention kernel a source states it ran (published.py's attn_impl), as a kernel that declares its speed
# (``step_time``, steptime.AttentionTiming) and keeps what torch's SDPA keeps (``computes="sdpa"`` and the
# built-in's layouts: an output and an fp32 logsumexp per head, no s x s scores): llm-foundry's attn_impl
# 'triton' is the Triton FlashAttention kernel, timed at steptime.FLASH_ATTENTION_TRITON. Not stated: the
# profile's default (torch's SDPA, FlashAttention-2).
def _kernels():
    from mlsysim_plugins.measured import kernels
    from mlsysim_plugins.measured.regimes import REGIMES

    @attrs.frozen(kw_only=True)
    class TimedKernel(kernels.AttentionKernel):
        step_time: steptime.AttentionTiming

    triton = TimedKernel(name="llmfoundry.flash-attn-triton", computes=kernels.COMPUTES_SDPA,
                         layouts=dict(kernels.SDPA.layouts), step_time=steptime.FLASH_ATTENTION_TRITON,
                         description="llm-foundry's attn_impl 'triton' (llmfoundry/models/layers/flash_attn_triton.py)")

    # The regimes the sources ran that no built-in states (published.py's regimes, cited there): each a built-in with
    # the data-parallel collectives' dtypes the source states (Regime.gather, Regime.reduce); the memory side reads
    # them as it reads the built-in's (the calibration times, it does not solve memory: memory=False).
    regimes = [
        attrs.evolve(REGIMES["fsdp-bf16"], name="composer-fsdp-pure-bf16", reduce=2,
                     description="Composer's FSDP mixed_precision 'PURE': fsdp-bf16 with the gradients reduced in bf16"),
        attrs.evolve(REGIMES["mixed-bf16"], name="megatron-bf16-grads-fp8-gather", gather=1,
                     description="Megatron's bf16 with FP8 parameter gathering and bf16 gradient reduction (Megatron-LM "
                                 "--bf16 --grad-reduce-in-bf16 --fp8-param-gather; Megatron-Bridge's performance FP8 "
                                 "recipes): mixed-bf16 with fp8 parameters all-gathered"),
    ]
    # Where the profile refuses a stated regime for a model (Megatron's regimes on a family it models only as
    # transformers' layers): the profile's default amp-bf16 with the stated regime's collective dtypes, so the
    # data-parallel collectives are timed as the source ran them (the rest as amp-bf16; the row says so: predict)
    stated = {r.name: r for r in (*REGIMES.values(), *regimes)}
    fallback = {name: attrs.evolve(REGIMES["amp-bf16"], name=f"amp-bf16+{name}-collectives",
                                   gather=r.collective_bytes()["parameters"], reduce=r.collective_bytes()["gradients"],
                                   description=f"amp-bf16 with {name}'s data-parallel collective dtypes")
                for name, r in stated.items() if not r.autocast and r.compute == 2}
    regimes += list(fallback.values())

    # Transformer Engine's attention on Hopper: cuDNN's fused attention (steptime.CUDNN_FUSED_ATTENTION); it keeps what
    # FlashAttention keeps (the output and the softmax statistics, fp32 per head and query: ``Stats`` of cuDNN's SDPA)
    cudnn = TimedKernel(name="te.cudnn-fused-attention", computes=kernels.COMPUTES_SDPA,
                        layouts=dict(kernels.SDPA.layouts), step_time=steptime.CUDNN_FUSED_ATTENTION,
                        description="Transformer Engine's FusedAttention (cuDNN), its choice on Hopper and later")

    class Plugin:
        @staticmethod
        @hookimpl
        def mlsysim_measured_attention_kernels():
            return [triton, cudnn]

        @staticmethod
        @hookimpl
        def mlsysim_measured_regimes():
            return regimes

    pm = PluginManager.from_environment()
    pm.register(Plugin(), name="calibrate_attention_kernels")
    return ({"triton": triton.name, "te-fused": cudnn.name}, TrainingMemoryModel("measured", plugin_manager=pm),
            {name: r.name for name, r in fallback.items()})


# (a stated regime the profile refuses for a model: the regime it is timed in instead, FALLBACK_REGIME; predict)
ATTENTION_KERNEL, _SOLVER, FALLBACK_REGIME = _kernels()
FIT = {
    "h100": ("torchtitan-2412-llama3.1-8b-8xh100-fsdp-compile", "llmfoundry-mpt-7b-8xh100-seq2048",
             "torchtitan-2506-asynctp-llama3-70b-256xh100-bf16-vanillatp"),
    "a100": ("llmfoundry-mpt-7b-8xa100-seq2048", "llmfoundry-mpt-30b-8xa100-seq2048"),
}
CATALOG = {"h100": "nvidia/h100-sxm5-80gb", "a100": "nvidia/a100-sxm4-80gb", "h200": "nvidia/h200-sxm-141gb",
           # uncalibrated (steptime.DEFAULT: nothing fitted, nothing carried over): their rows are held out, reported
           # per accelerator (published_more.py)
           "b200": "nvidia/b200", "gb200": "nvidia/gb200"}
# What each accelerator fits (the rest of its Calibration is DEFAULT's, attention as the module docstring says)
FITTED = {"h100": ("matmul", "intra_link"), "a100": ("matmul",)}
ATTENTION = {"h100": 0.35, "a100": 0.5, "h200": 0.35}
# The EP all-to-all a dispatcher sends (published.py's ep_dispatcher, as the source's recipe names it): Megatron's
# 'flex' dispatcher runs DeepEP / HybridEP kernels, a token once per destination node ("node-forwarded"); its
# 'alltoall' dispatcher an NCCL all-to-all of every copy (the EP rule's default); not stated: the default.
EP_DISPATCH = {"flex": "node-forwarded", "alltoall": None, None: None}
# The float8 implementation a source states (published.py's float8_recipe): its casts as it declares them
# (steptime.Float8Casts); not stated: torchao's tensorwise Float8Linear (float8=True), as torchtitan runs it. Its
# declaration carries torchtitan's float8 tensor parallelism (Float8Casts.tp_gather: the input cast once on the rank's
# shard and all-gathered in float8; _steptime_float8): torchtitan/parallelisms/parallelize_llama.py at 9dec370 (the
# 2024-12 tables, dynamic tensorwise scaling only) lines 148-162 and 174-193 apply Float8ColwiseParallel,
# Float8RowwiseParallel and PrepareFloat8ModuleInput whenever float8 is on; torchtitan/models/llama3/
# parallelize_llama.py at 820504e (the 2025-06 async-TP table) lines 56-65 only for the tensorwise recipe ("For
# rowwise recipes, we use regular TP and all-gather happens in high precision"): torchao-rowwise declares none.
FLOAT8_RECIPE = {"torchao-rowwise": steptime.TORCHAO_ROWWISE, "te-current-scaling": steptime.TE_CURRENT_SCALING,
                 "te-delayed-scaling": steptime.TE_DELAYED_SCALING, "te-mxfp8": steptime.TE_MXFP8,
                 None: True}
CKPT = {"selective-op": "op-sac", "full": "full", "none": "none", None: "none",
        # Megatron-Core's selective recompute of the layer norms and the experts' activation (recompute_modules
        # ['layernorm', 'moe_act']): no strategy of the profile recomputes those; their recompute runs no matmul (the
        # step time's recompute share, the layers' forward FLOPs run again, is 0): timed as none, and the row says so
        "megatron-selective-layernorm-moe-act": "none"}
# A stated Megatron-Core recompute the memory side expresses as selective's modules option (a search's memory only;
# its elementwise recompute is not timed, as above)
SEARCH_RECOMPUTE_MODULES = {"megatron-selective-layernorm-moe-act": ("layernorm", "moe_act")}
# What a stated strategy the profile cannot express is timed as, said in its row
CKPT_NOT_EXPRESSED = {"megatron-selective-layernorm-moe-act": (
    "Megatron's selective recompute of layernorm and moe_act (not expressible in the profile: timed as none, no "
    "matmul recomputed; its elementwise recompute not timed)")}
RULE = {"FULL_SHARD": "fsdp", "SHARD_GRAD_OP": "fsdp-grad-op", "distributed-optimizer": "mcore-distopt", "ddp": "zero0",
        "no-reshard-after-forward": "fsdp-grad-op"}
DOC = ROOT / "docs" / "planner.md"
BEGIN, END = "<!-- calibration table: begin -->", "<!-- calibration table: end -->"
LF, MG, L3, NAR = "mosaicml/llm-foundry", "NVIDIA/Megatron-LM", "The Llama 3 Herd", "Efficient Large-Scale"


def comparable(case) -> str | None:
    """Why a published run cannot be compared (None: it can)."""
    if case["model"] is None and case["model_dims"] is None:
        return "model not in the catalog and its dimensions not stated"
    if case["hardware"] not in CATALOG:
        return f"{case['hardware']}: no calibration (no comparable published run with a named model)"
    if None in (case["tp"], case["cp"], case["pp"], case["seq_len"], case["global_batch"], case["devices"]):
        return "layout not stated"
    return None


# The sources whose model code runs q, k and v (and a gated MLP's gate and up) as separate linear modules, declared
# to the step time as the model's ``details["separate_projections"]`` (steptime.model_figures: under float8 each
# module casts the input it reads): torchtitan's Llama, torchtitan/models/llama/model.py at 9dec370 (the 2024-12
# tables) lines 158-162 and 248-250, torchtitan/models/llama3/model.py at 820504e (the 2025-06 async-TP table) lines
# 205-209 and 297-299: "self.wq = nn.Linear(", "self.wk = nn.Linear(model_args.dim, self.n_kv_heads *
# self.head_dim, bias=False)", "self.wv = ...", "self.w1 = nn.Linear(dim, hidden_dim, bias=False)", "self.w3 = ...".
# (Megatron's linear_qkv and linear_fc1 and llm-foundry's Wqkv are fused modules: not declared.) The same model code
# repeats K and V to the query heads before the attention kernel, declared as ``details["repeated_kv"]`` (what a
# context-parallel ring then moves and accumulates: steptime.model_figures' ``h_kv_kernel``): model.py at 9dec370 lines
# 201-209, at 820504e lines 250-257, "keys = repeat_kv(xk, self.n_rep)", "values = repeat_kv(xv, self.n_rep)", then
# "F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)" (self.sdpa at 820504e).
SEPARATE_PROJECTIONS = ("pytorch/torchtitan",)

# The async TP a source's stack runs (time_plan's async_tp): torchtitan's enable_async_tensor_parallel is torch's
# micro-pipeline TP over symmetric memory (torchtitan/parallelisms/parallelize_llama.py at 9dec370 lines 201-205,
# torchtitan/models/llama3/parallelize_llama.py at 820504e lines 205-209: "from torch.distributed._symmetric_memory
# import enable_symm_mem_for_group", "torch._inductor.config._micro_pipeline_tp = True"), whose fused
# matmul-reduce-scatter sums its partials in a kernel of its own ("symmetric-memory", steptime._partials_reduction);
# the others (Megatron-Core's --tp-comm-overlap: Transformer Engine's userbuffers, which reduce inside their
# reduce-scatter kernels): True ("decomposed").
ASYNC_TP = {"pytorch/torchtitan": "symmetric-memory"}


def async_tp_of(case):
    """time_plan's async_tp for the source's stack (ASYNC_TP; True: decomposed, the reduction in the collective)."""
    return next((how for src, how in ASYNC_TP.items() if case["source"].startswith(src)), True)


def model_for(case):
    """The catalog model, or the source's stated dimensions as a workload (its position table, not a
    matmul, left out of the parameters); with ``separate_projections`` declared where the source's model
    code runs its projections as separate modules (SEPARATE_PROJECTIONS)."""
    if case["model"]:
        if case["source"].startswith(SEPARATE_PROJECTIONS):
            from mlsysim_core.catalog import get_model
            model = get_model(case["model"])
            return attrs.evolve(model, details={**(model.details or {}), "separate_projections": True,
                                                "repeated_kv": True})
        return case["model"]
    dims = {k: v for k, v in case["model_dims"].items() if k not in ("source", "position_table")}
    dims["parameters"] -= case["model_dims"].get("position_table") or 0
    return TransformerWorkload(**dims)


def fused(case) -> tuple[bool, str]:
    """Whether the memory-bound ops run as fused kernels (one read, one write each), and why."""
    if case["compile"]:
        return True, "torch.compile"
    if case["source"].startswith(LF):
        return True, "llm-foundry's ops are single kernels (low_precision_layernorm = F.layer_norm, GELU, ALiBi in flash-attn)"
    if case["source"].startswith(NAR):
        return True, "the paper's fused kernels (bias+GeLU, bias+dropout+add, scale+mask+softmax; section 4.2)"
    if case["source"].startswith((MG, L3, "NVIDIA-NeMo/Megatron-Bridge")):
        return True, "fused kernels (Transformer Engine / production kernels): assumed"
    return False, "eager PyTorch"


# The sources whose stack runs Transformer Engine's attention: Megatron-LM (Megatron-Core's TE layer spec, its
# default: megatron/training/arguments.py "'--transformer-impl', default='transformer_engine'") and Megatron-Bridge
# (the same Megatron-Core); TE picks cuDNN's fused attention on Hopper and later (steptime.CUDNN_FUSED_ATTENTION),
# timed as such where its speed against FlashAttention-2 was measured (H100, and H200, the same die): on Blackwell no
# such measurement, the rows keep FlashAttention-2's shares (their attention share is DEFAULT's, uncalibrated).
TE_ATTENTION = (MG, "NVIDIA-NeMo/Megatron-Bridge")
CUDNN_MEASURED = ("h100", "h200")


def layout(case) -> dict:
    """``time_plan``'s keywords for the published run, and the assumptions made (``assumed``)."""
    assumed = []
    dp = (case["dp_shard"] or 1) * (case["dp_replicate"] or 1)
    pp = case["pp"]
    mb = case["micro_batch"] or (1 if pp > 1 else case["local_batch"])
    if case["micro_batch"] is None and pp > 1:
        assumed.append("micro-batch 1")
    if case["sharding"] in RULE:
        rule = RULE[case["sharding"]]
    elif case["source"].startswith("pytorch/torchtitan") and dp * case["cp"] > 1:
        rule = "fsdp"       # (torchtitan's FSDP shards over dp_shard x cp)
    else:
        rule = "fsdp" if (case["dp_shard"] or 1) > 1 else "zero1" if dp > 1 else "zero0"
    vp = case["virtual_stages"]
    if vp is None and "nterleaved" in (case["pp_schedule"] or ""):
        vp = 2
        assumed.append("interleaved with 2 stages per rank (not stated)")
    if case["virtual_stages_derived"] and pp > 1:
        assumed.append(case["virtual_stages_derived"])
    if case.get("async_tp_derived") and case["async_tp"] and case["tp"] > 1:
        assumed.append(case["async_tp_derived"])
    is_fused, why = fused(case)
    if case["float8"] is None:
        assumed.append("bf16 (precision not stated)")
    if case["checkpointing"] is None:
        assumed.append("no activation checkpointing (not stated)")
    elif case["checkpointing"] in CKPT_NOT_EXPRESSED:
        assumed.append(CKPT_NOT_EXPRESSED[case["checkpointing"]])
    extra = {"expert_tp_size": case["expert_tp"]} if case["expert_tp"] else {}      # (stated: the layout column's)
    if case["attn_impl"]:
        extra["attention"] = ATTENTION_KERNEL[case["attn_impl"]]
    elif case["source"].startswith(TE_ATTENTION) and case["hardware"] in CUDNN_MEASURED:
        extra["attention"] = ATTENTION_KERNEL["te-fused"]
    # the training regime the source ran (published.py's regime: the data-parallel collectives' dtypes among its
    # declarations); not stated: the profile's default for bf16 (amp-bf16), said
    if case["regime"]:
        extra["regime"] = case["regime"]
    else:
        assumed.append("regime amp-bf16 (the profile's default; not stated)")
    # the rules' implementation choices a source states (published.py's cp_ring, dp_gradient_sync): their options
    rule_options = {}
    if case["cp_ring"] and case["cp"] > 1:
        rule_options["cp"] = {"ring": case["cp_ring"]}
    if case["dp_gradient_sync"]:
        rule_options[rule] = {"gradient_sync": case["dp_gradient_sync"]}
    if case["pp_stages"] and pp > 1:
        rule_options["pp"] = {"stages": case["pp_stages"]}
    if case["pp_p2p"] and pp > 1:
        rule_options.setdefault("pp", {})["p2p"] = case["pp_p2p"]
    if case["pp_stages"] == "ends-one-fewer" and pp > 1:
        # the same split said to the memory side (its stage_layers): ceil((L + 2) / pp) layers on a middle stage, one
        # fewer on the first and the last (126 over 16: 7, 14 x 8, 7), which lets a chunk of the end stages hold no
        # layer (the Llama 3 paper's embedding-only first chunk; an even split refuses pp x vp > L)
        L = _model_object(case).layers
        middle = math.ceil((L + 2) / pp)
        split = (middle - 1,) + (middle,) * (pp - 2) + (middle - 1,)
        assert sum(split) == L, f"{case['id']}: {L} layers do not split as ends-one-fewer over {pp} stages"
        extra["stage_layers"] = split
    if rule_options:
        extra["plugin_options"] = rule_options
    return dict(**extra, tp=case["tp"], cp=case["cp"], pp=pp, dp=dp, ep=case["ep"] or 1, vp=vp if pp > 1 else None,
                data_parallel=rule, checkpointing=CKPT[case["checkpointing"]], microbatch=mb,
                sequence_parallel=case["tp"] > 1, compiled=is_fused,
                float8=FLOAT8_RECIPE[case.get("float8_recipe")] if case["float8"] else False,
                async_tp=async_tp_of(case) if case["async_tp"] and case["tp"] > 1 else False, power=case["power_watts"],
                ep_overlap=bool(case["ep_overlap"]) and (case["ep"] or 1) > 1,
                ep_dispatch=EP_DISPATCH.get(case["ep_dispatcher"]) if (case["ep"] or 1) > 1 else None,
                memory_bandwidth=case["memory_bandwidth"], network_bandwidth=case["network_bandwidth"],
                assumed=tuple(assumed), fused_why=why)


_MODELS: dict = {}


# Rows whose stated regime the profile refuses for their model (NotModelledError naming the regime): timed in the
# profile's default, amp-bf16, and the row says so (REFUSED_REGIME, filled by predict)
REFUSED_REGIME: dict = {}


def predict(case, cal: steptime.Calibration) -> dict:
    lay = layout(case)
    kw = {k: v for k, v in lay.items() if k not in ("assumed", "fused_why")}
    if case["id"] not in _MODELS:
        _MODELS[case["id"]] = model_for(case)
    run = dict(global_batch=case["global_batch"], seq_len=case["seq_len"], precision="bf16", optimizer="adamw",
               profile="measured", calibration=cal, memory=False, solver=_SOLVER)
    if case["id"] in REFUSED_REGIME:
        kw["regime"] = FALLBACK_REGIME[kw["regime"]]
    try:
        return time_plan(_MODELS[case["id"]], case["hardware"], **run, **kw)
    except NotModelledError as err:
        if kw.get("regime") not in FALLBACK_REGIME or err.parameter != "regime":
            raise
        REFUSED_REGIME[case["id"]] = (f"regime {kw['regime']} (refused by the profile for this model: timed as amp-bf16 "
                                      "with its collective dtypes)")
        kw["regime"] = FALLBACK_REGIME[kw["regime"]]
        return time_plan(_MODELS[case["id"]], case["hardware"], **run, **kw)


def megatron_flops(dims: dict, batch: int, s: int) -> float:
    """Megatron-LM's num_floating_point_operations (training.py, e.g. at b5a7b5ff8311aa98137df24b15b9032f7345f098):
    12 B s l h^2 ((1 + g/a + s/h) (a kv / h) + (ffn / h) (3/2 if swiglu) + V / (2 l h)), here MHA (g = a, a kv = h)."""
    l, h = dims["layers"], dims["hidden_dim"]
    gated = 1.5 if dims["gated_mlp"] else 1.0
    return 12 * batch * s * l * h * h * ((2 + s / h) + dims["ffn_dim"] / h * gated + dims["vocab_size"] / (2 * l * h))


def published_step(case) -> float | None:
    """Seconds per step the source's figures give: tokens/s/GPU, or TFLOP/s per GPU under the source's own FLOP
    count (Megatron's; the Llama 3 paper's 'MFU (Chowdhery et al. 2023)', PaLM's 6 N + 12 L H Q T per token)."""
    tokens = case["global_batch"] * case["seq_len"]
    if case["tokens_per_s_per_gpu"]:
        return tokens / (case["tokens_per_s_per_gpu"] * case["devices"])
    if case["flops_convention"] == "megatron":
        return megatron_flops(case["model_dims"], case["global_batch"], case["seq_len"]) / (
            case["tflops_per_gpu"] * 1e12 * case["devices"])
    if case["flops_convention"] == "megatron-2021":      # the paper's F, recomputation included
        d = case["model_dims"]
        l, h, s, V = d["layers"], d["hidden_dim"], case["seq_len"], d["vocab_size"]
        f = 96 * case["global_batch"] * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        return f / (case["tflops_per_gpu"] * 1e12 * case["devices"])
    if case["flops_convention"] == "palm":
        fig = steptime.model_figures(_model_object(case))
        return tokens * steptime.model_flops_per_token(fig, case["seq_len"]) / (case["tflops_per_gpu"] * 1e12 * case["devices"])
    return None


def _model_object(case):
    m = model_for(case)
    if isinstance(m, str):
        from mlsysim_core.catalog import get_model
        m = get_model(m)
    return m


def error(case, cal) -> float:
    """log(predicted / published) step time."""
    return math.log(predict(case, cal)["step_s"] / published_step(case))


def base_calibration(acc: str) -> steptime.Calibration:
    return attrs.evolve(steptime.DEFAULT, attention=ATTENTION[acc], calibrated=True,
                        switch_allreduce=acc in ("h100", "h200"))


def fit(acc: str = "h100") -> steptime.Calibration:
    """Least squares on the log step time of FIT[acc] over FITTED[acc]: a grid (matmul 0.300-0.950 in steps of
    0.025, intra_link 0.20-1.00 in 0.05: a share of a physical bandwidth is at most 1), then a finer one around its
    best (0.005, 0.01): each run's error is monotone in each constant."""
    cal = base_calibration(acc)
    cases = [c for c in CASES if c["id"] in FIT[acc]]
    assert len(cases) == len(FIT[acc]), "a FIT run is missing from published.py"
    has_link = "intra_link" in FITTED[acc]

    def best_of(matmuls, links):
        best = None
        for i in links:
            for m in matmuls:
                trial = attrs.evolve(cal, matmul=m, intra_link=i)
                loss = sum(error(c, trial) ** 2 for c in cases)
                if best is None or loss < best[0]:
                    best = (loss, trial)
        return best[1]

    coarse = best_of([round(0.3 + 0.025 * k, 3) for k in range(27)],
                     [round(0.2 + 0.05 * k, 2) for k in range(17)] if has_link else [cal.intra_link])
    fine = best_of([round(coarse.matmul + 0.005 * k, 3) for k in range(-5, 6)],
                   [x for x in (round(coarse.intra_link + 0.01 * k, 2) for k in range(-5, 6)) if x <= 1.0]
                   if has_link else [cal.intra_link])
    return attrs.evolve(fine, source=f"validation/steptime/calibrate.py: {', '.join(FITTED[acc])} fitted (least "
                        f"squares on log step time) on {', '.join(FIT[acc])} (validation/steptime/published.py); "
                        f"attention {ATTENTION[acc]} (FlashAttention-2's stated utilization; its backward at 63/73 of "
                        "it); the rest steptime.DEFAULT")


def shipped(acc: str) -> steptime.Calibration:
    """The accelerator's shipped calibration; steptime.DEFAULT (uncalibrated) for one without."""
    return steptime.CALIBRATIONS.get(CATALOG[acc], steptime.DEFAULT)


def rows(acc: str):
    """(case, prediction, published step, role) of every comparable run on ``acc``."""
    out = []
    for case in CASES:
        if comparable(case) or case["hardware"] != acc:
            continue
        p = predict(case, shipped(acc))
        out.append((case, p, published_step(case), "fit" if case["id"] in FIT.get(acc, ()) else "held out"))
    return out


def summary(acc: str, found=None) -> dict:
    found = rows(acc) if found is None else found
    held = [abs(p["step_s"] / s - 1) for c, p, s, role in found if role == "held out"]
    slower = sum(1 for c, p, s, role in found if role == "held out" and p["step_s"] > s)
    return {"held_out": len(held), "median": statistics.median(held) if held else None,
            "max": max(held) if held else None, "slower": slower,
            "fit": sum(1 for r in found if r[3] == "fit")}


def _source_name(case) -> str:
    src = case["source"]
    for key, name in (("pytorch/torchtitan", "torchtitan"), (LF, "llm-foundry"), (MG, "Megatron-LM"), (L3, "Llama 3 paper"),
                      (NAR, "Narayanan et al. 2021"), ("NVIDIA-NeMo/Megatron-Bridge", "Megatron-Bridge (NeMo)")):
        if src.startswith(key) or key in src[:80]:
            return name
    return "other"


def table() -> str:
    lines = []
    for acc in CATALOG:
        found = rows(acc)
        s = summary(acc, found)
        label = "" if shipped(acc).calibrated else "; uncalibrated: steptime.DEFAULT's assumed efficiencies, nothing fitted"
        hw = get_hardware(CATALOG[acc])
        domain = scale_up_domain(hw)
        label += f"; timed with its {domain}-GPU NVLink domain as the node" if domain != hw.devices_per_node else ""
        lines.append(f"**{acc.upper()}** ({CATALOG[acc]}{label}): {s['fit']} runs fitted, {s['held_out']} held out; held-out "
                     f"step time median |error| {s['median']:.1%}, max {s['max']:.1%}, predicted slower than "
                     f"published on {s['slower']} of {s['held_out']}.")
        lines.append("")
        by = {}
        for c, p, st, role in found:
            if role == "held out":
                by.setdefault(_source_name(c), []).append(abs(p["step_s"] / st - 1))
        lines.append("| source | held-out runs | median abs error | max |")
        lines.append("|---|---|---|---|")
        for name, errs in sorted(by.items()):
            lines.append(f"| {name} | {len(errs)} | {statistics.median(errs):.1%} | {max(errs):.1%} |")
        lines.append("")
        lines.append("| run | layout (tp/cp/pp/dp, vp, rule, ckpt, mb x gas; choices) | role | published | predicted | step time error |")
        lines.append("|---|---|---|---|---|---|")
        for c, p, st, role in found:
            lay, L = layout(c), p["layout"]
            regime = REFUSED_REGIME.get(c["id"]) or (f"regime {c['regime']}" if c["regime"] else None)
            choices = [x for x, on in ((regime, regime), ("fused ops", lay["compiled"]), (f"float8 {getattr(lay['float8'], 'name', 'torchao-tensorwise')}", lay["float8"]),
                                       ("async TP" + (f" ({lay['async_tp']})" if isinstance(lay["async_tp"], str)
                                                      else ""), lay["async_tp"]),
                                       ("EP overlap", lay["ep_overlap"]),
                                       ("EP node-forwarded", lay["ep_dispatch"]),
                                       (f"attention {c['attn_impl']}", c["attn_impl"]),
                                       (f"{c['cp_ring']} ring", c["cp_ring"] and c["cp"] > 1),
                                       (f"gradients reduced per {c['dp_gradient_sync']}", c["dp_gradient_sync"]),
                                       (f"stages {c['pp_stages']}", c["pp_stages"] and c["pp"] > 1),
                                       (f"pp sends {c['pp_p2p']}", c["pp_p2p"] and c["pp"] > 1),
                                       (f"expert tensor parallelism {c['expert_tp']}", c["expert_tp"]))
                       if on]
            if lay["power"]:
                choices.append(f"{lay['power']} W")
            choices += [f"assumed {a}" for a in lay["assumed"]]
            shape = (f"{L['tp']}/{L['cp']}/{L['pp']}/{L['dp']}" + (f", vp {L['vp']}" if L["vp"] > 1 else "")
                     + f", {L['data_parallel']}, {L['checkpointing']}, {L['microbatch']} x "
                     f"{L['gradient_accumulation_steps']}" + (f"; {', '.join(choices)}" if choices else ""))
            if c["tokens_per_s_per_gpu"]:
                pub = f"{c['tokens_per_s_per_gpu']:,.0f} tok/s/GPU"
                pred = f"{p['tokens_per_s_per_device']:,.0f} tok/s/GPU"
            else:
                pub = f"{c['tflops_per_gpu']:g} TFLOP/s/GPU ({c['flops_convention']} count): {st:.2f} s/step"
                pred = f"{p['step_s']:.2f} s/step"
            lines.append(f"| {c['id']} | {shape} | {role} | {pub} | {pred} | {p['step_s'] / st - 1:+.1%} |")
        lines.append("")
    skipped = {}
    for c in CASES:
        why = comparable(c)
        if why:
            skipped[why] = skipped.get(why, 0) + 1
    lines.append("Not comparable: " + "; ".join(f"{n} runs: {w}" for w, n in sorted(skipped.items())) + ".")
    return "\n".join(lines)


def command() -> str:
    return "python validation/steptime/calibrate.py"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", action="store_true", help="rewrite the tables in docs/planner.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/planner.md's tables are stale")
    parser.add_argument("--no-fit", action="store_true", help="skip the fit (print the tables of the shipped constants)")
    args = parser.parse_args(argv)
    if not args.no_fit:
        for acc in FIT:
            cal = fit(acc)
            print(f"fitted {acc}: " + ", ".join(f"{k}={getattr(cal, k)}" for k in FITTED[acc]))
            ship = shipped(acc)
            if any(getattr(ship, k) != getattr(cal, k) for k in FITTED[acc]):
                print(f"note: steptime.CALIBRATIONS[{CATALOG[acc]!r}] differs from this fit: update it")
    text = table() + "\n\n" + ranks() + "\n\n" + target()
    print(text)
    if args.doc or args.check:
        doc = DOC.read_text(encoding="utf-8")
        a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
        new = doc[:a] + "\n" + text + "\n" + doc[b:]
        if args.check:
            return 0 if new == doc else 1
        DOC.write_text(new, encoding="utf-8")
    return 0


def ranks() -> str:
    """Where each comparable published bf16 layout of a catalog model on up to 256 H100 ranks in the measured
    search of its run, searched as its source states the recipe (``search_recipe``)."""
    rows_ = ["| run | published layout (tp/cp/pp/dp) | searched as | its rank among distinct layouts | "
             "the search's first row |", "|---|---|---|---|---|"]
    for case in CASES:
        if (comparable(case) is None and case["model"] and case["hardware"] == "h100" and case["devices"] <= 256
                and not case["float8"] and not case["async_tp"]):
            rank, count, top, how = search_rank(case)
            lay = layout(case)
            rows_.append(f"| {case['id']} | {lay['tp']}/{lay['cp']}/{lay['pp']}/{lay['dp']} | {how} | "
                         f"{rank if rank else 'does not fit'} of {count} | {top} |")
    return "\n".join(rows_)


def target() -> str:
    """Issue 17's case: Llama-3-70B on 64 H100 (8 per node), global batch 512, seq 4096, the
    CLI's defaults (measured profile, fp16 autocast, adam)."""
    from mlsysim_core.search import search_plans
    found = search_plans("llama3-70b", "h100", devices=64, global_batch=512, seq_len=4096, profile="measured")
    out = ["| rank | tp/cp/pp/dp | dp rule | ckpt | mb x gas | memory GiB | step s | MFU |", "|---|---|---|---|---|---|---|---|"]
    shown = list(enumerate(found.fits[:5], 1))
    first = next(((i, c) for i, c in enumerate(found.fits, 1) if c.tp == 8 and c.cp == 1), None)
    if first and first[0] > 5:
        shown.append(first)
    for i, c in shown:
        out.append(f"| {i} | {c.tp}/{c.cp}/{c.pp}/{c.dp} | {c.data_parallel} | {c.checkpointing} | "
                   f"{c.microbatch} x {c.gradient_accumulation_steps} | {c.total_memory / 2**30:.1f} | "
                   f"{c.step_time:.2f} | {c.mfu:.1%} |")
    return "\n".join(out)


# The recipe of a published run as its source states it, for the search of the run (search_rank): what the memory
# side needs to describe the published layout, the same for every layout the search ranks (no layout is favoured).
# * torchtitan: FSDP2's MixedPrecisionPolicy (pytorch/torchtitan torchtitan/config_manager.py, e.g. at
#   0011fb905e9561a51af0f265e35d989f7448b1d8: '--training.mixed_precision_param' default 'bfloat16',
#   '--training.mixed_precision_reduce' default 'float32'), the measured profile's regime 'fsdp-bf16', as
#   launch/torchtitan.py reads it; loss parallel with tp > 1 ('--training.enable_loss_parallel' default True; v0.2.2's
#   parallelism.disable_loss_parallel False). Its H100 files state the card (published.py's _H100_GT: 'Each H100 GPU
#   is equipped with 96GB HBM2e with 2.4 TB/sec peak memory bandwidth'): the catalog's H100 with that memory (96 GB
#   read as GiB, the catalog's convention, docs/catalog.md), its chip's envelope kept (steptime.envelope).
# * Megatron-Bridge: the regime its performance recipe ran (published.py's regime: bf16_mixed with the benchmark's
#   grad_reduce_in_fp32=False, src/megatron/bridge/perf_recipes/_common.py at 067f987df03b8355b03192d88d70f1709fedf51a:
#   'mixed-bf16', bf16 gradients reduced in bf16).
# A recipe the profile refuses for the model is said, and the run searched with the profile's default. Every row is
# timed at the power limit the source states (published.py's power_watts: torchtitan's H100s at 500 W).
# Checkpointing: none and full, and the run's own strategy (torchtitan's selective op: 'op-sac').
GRAND_TETON_GIB = 96


def search_recipe(case) -> tuple[object, dict, list[str]]:
    """(hardware, search_plans options, checkpointing strategies) for the search of ``case``'s run."""
    from mlsysim_core.catalog import get_hardware
    hardware, options = get_hardware(CATALOG[case["hardware"]]), {}
    if case["source"].startswith("pytorch/torchtitan"):
        options = {"regime": "fsdp-bf16", "loss_parallel": True}
        if case["hardware"] == "h100":
            hardware = attrs.evolve(hardware, memory_capacity=GRAND_TETON_GIB * 2**30,
                                    memory_bandwidth=int(case["memory_bandwidth"] or hardware.memory_bandwidth))
    elif case["source"].startswith("NVIDIA-NeMo/Megatron-Bridge"):
        options = {"regime": case["regime"]}
    strategies = ["none", "full"]
    if layout(case)["checkpointing"] not in strategies:
        strategies.append(layout(case)["checkpointing"])
    modules = SEARCH_RECOMPUTE_MODULES.get(case["checkpointing"])
    if modules and case["regime"] == "mixed-bf16":
        # Megatron-Core's own layers, as the memory side describes them: its main-grad regime with the recipe's bf16
        # grad buffer (grad_reduce_in_fp32=False: mcore-distopt's grad_reduce_in_bf16) and the recipe's recompute
        # modules as selective's option (validation/megatron_gpt_oss: measured); mixed-bf16 has the same step bytes
        options = {"regime": "mixed-bf16-main-grad",
                   "plugin_options": {"selective": {"modules": list(modules)}, "mcore-distopt": {"grad_reduce_in_bf16": True}}}
        strategies.append("selective")
    return hardware, options, strategies


def search_rank(case) -> tuple[int | None, int, str, str]:
    """Where the published layout (tp, cp, pp, dp) first appears in the measured search's
    ranking of the same run (devices, global batch, seq, bf16; the recipe ``search_recipe`` says),
    counting distinct (tp, cp, pp, dp) layouts; (rank or None, layouts ranked, the top layout, the recipe
    searched)."""
    from mlsysim_core.catalog import get_hardware
    from mlsysim_core.errors import NotModelledError
    from mlsysim_core.search import search_plans
    hardware, options, strategies = search_recipe(case)
    run = dict(devices=case["devices"], global_batch=case["global_batch"], seq_len=case["seq_len"], precision="bf16",
               optimizer="adamw", profile="measured", checkpointing=strategies, power=case["power_watts"])
    how = ", ".join([options["regime"]] if "regime" in options else []) or "amp-bf16"
    try:
        found = search_plans(case["model"], hardware, **run, **options)
    except NotModelledError as err:
        if err.parameter != "regime":
            raise
        found = search_plans(case["model"], hardware, **run)
        how = f"amp-bf16 ({options['regime']} not modelled for this family)"
    how += (", loss parallel" if options.get("loss_parallel") else "") + f", {'/'.join(strategies)}"
    if "plugin_options" in options:
        how += "".join(f", {spec}.{field}={value}" for spec, fields in options["plugin_options"].items()
                       for field, value in fields.items())
    if hardware.memory_capacity != get_hardware(CATALOG[case["hardware"]]).memory_capacity:
        how += f", {hardware.memory_capacity / 2**30:.0f} GiB card"
    if case["power_watts"]:
        how += f", {case['power_watts']} W"
    lay = layout(case)
    want, order = (lay["tp"], lay["cp"], lay["pp"], lay["dp"]), []
    for c in found.fits:
        key = (c.tp, c.cp, c.pp, c.dp)
        if key not in order:
            order.append(key)
    top = found.fits[0]
    text = (f"tp{top.tp} cp{top.cp} pp{top.pp} dp{top.dp} {top.data_parallel} {top.checkpointing} "
            f"mb{top.microbatch}")
    return (order.index(want) + 1 if want in order else None), len(order), text, how


if __name__ == "__main__":
    sys.exit(main())
