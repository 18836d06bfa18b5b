#!/usr/bin/env python
"""One gpt-oss decoder layer under Megatron-Core's tensor parallelism with sequence parallelism (tp = 2, rank 0 of a
fake process group of 2; and tp = 1 for comparison), measured on the CPU with PyTorch's ``MemTracker`` (eager): the
bytes the layer keeps for its backward, what outlives it, and the buffers Megatron-Core holds; and a stage of such
layers under Megatron-Core's full and block recompute and under its 1F1B pipeline schedule (issue 25 item 4).

    python validation/megatron_gpt_oss/measure_tp.py --megatron-lm DIR [--out FILE]

``DIR`` is a Megatron-LM checkout or bare mirror at ``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` (as measure_moe.py,
whose MoE block, dispatcher and stand-ins are reused as they are).

The layout is Megatron-Bridge's gpt-oss 20B H100 recipe's (Megatron-Bridge 067f987d,
``src/megatron/bridge/recipes/gpt_oss/h100/gpt_oss.py``, ``gpt_oss_20b_pretrain_16gpu_h100_bf16_config``:
``tensor_model_parallel_size = 2``, ``sequence_parallel = True``, ``expert_model_parallel_size = 4``,
``expert_tensor_parallel_size = 1``, ``context_parallel_size = 1``); ``MoELayer.forward`` refuses training with
tp > 1 without sequence parallelism (``moe_layer.py``), so every tp = 2 run here is sequence-parallel.

Run from Megatron-Core's source at that commit, exactly as written (the pure-PyTorch parts of the layer):

* ``LinearWithGradAccumulationAndAsyncCommunication`` and ``linear_with_grad_accumulation_and_async_allreduce``
  (``megatron/core/tensor_parallel/layers.py``): the column-parallel ``linear_qkv`` with ``sequence_parallel``
  (``save_for_backward(input, weight)``: the rank's sequence shard of its input; the all-gather into the
  ``"mpu"`` buffer of ``GlobalMemoryBuffer``, ``megatron/core/utils.py``, and again in the backward; the input
  gradient reduce-scattered into a new ``[T / tp, h]`` tensor) and the row-parallel ``linear_proj`` (no gather:
  its input is the attention's output, the rank's heads over the whole sequence); ``prepare_input_tensors_for_wgrad_compute``;
* ``reduce_scatter_to_sequence_parallel_region`` (``_ReduceScatterToSequenceParallelRegion``,
  ``_reduce_scatter_along_first_dim``, ``_gather_along_first_dim``, ``megatron/core/tensor_parallel/mappings.py``):
  ``RowParallelLinear.forward``'s reduce-scatter of ``linear_proj``'s output, its backward the all-gather;
* the MoE layer: measure_moe.py's (Megatron-Core's router, activation and bias code; TE's permutation and grouped
  GEMM stand-ins), on the rank's ``T / tp`` tokens: with ``expert_tensor_parallel_size = 1`` the dispatcher's
  ``tp_group`` is the expert-tensor-parallel group, of one rank (``token_dispatcher.py``: no
  ``gather_from_sequence_parallel_region`` of the tokens in ``dispatch_postprocess``), so the MoE layer routes the
  rank's sequence shard as on one device (ep 1) or as one rank of an expert-parallel group (ep > 1).

The collectives run through ``torch.distributed`` with PyTorch's fake process group
(``torch.testing._internal.distributed.fake_pg``: world 2, rank 0; a collective allocates nothing of its own and
writes nothing). ``torch.cuda.current_device()`` is ``"cpu"`` in the namespace those sources run in; the
autocast decorators ``custom_fwd`` / ``custom_bwd`` are the identity (bf16 throughout); ``gradient_accumulation_fusion``
is off (APEX's CUDA kernel; with it the weight gradient is accumulated into ``main_grad``, not allocated).

Stand-ins for what runs only on a GPU, each saving what Transformer Engine's source at d0067d0d saves:

* the norms (``TENorm`` / the ``LayerNormColumnParallelLinear``'s norm): measure_modules.py's RMSNorm, saving its
  input, its weight and the fp32 rsigma (4 B a token, which the profile does not count);
* the core attention (TE's ``FusedAttnFunc`` with ``softmax_type="learnable"``): saves q, k, v (views of
  ``linear_qkv``'s output: the rank's heads), its output and the fp32 softmax statistics ``[heads / tp, T]``; the
  sinks (``softmax_offset``, one a head: the rank's ``heads / tp``) a parameter. RoPE is not applied (the profile's
  rotary tables are a term of their own; what the rotary embedding saves is not derived for this stand-in).

Recorded per configuration (bytes over the start of the measured iteration, the third; the start holds the
previous iteration's held dispatcher tensors and the ``"mpu"`` buffer, both shown to the tracker before it):
``saved`` (the growth after the layer's forward, less its output; the MoE's held row_id_map that the forward
replaced is added back in ``saved_with_row_id_map``, as in measure_moe.py), ``after_backward_over_start`` (less
the layer's input, ``T / tp x h x 2`` B alive at the start, which the script frees after the backward),
``held`` / ``held_other`` (the dispatcher's, as measure_moe.py), ``mpu_buffer`` (the ``GlobalMemoryBuffer``'s
``"mpu"`` tensor: allocated by the first sequence-parallel all-gather, alive from then on), ``received``,
``peak_over_start`` (recorded, not compared).

Recompute runs (``RECOMPUTE_CONFIGS``): a ``TransformerBlock`` of 2 or 3 such layers through ``checkpointed_forward``
(``megatron/core/recompute.py``) and ``tensor_parallel.checkpoint`` (``CheckpointFunction``, ``random.py``), both run
from the source at COMMIT as measure_recompute.py runs them (``recompute_method="uniform"`` with one layer a chunk:
every layer checkpointed; ``"block"`` with ``recompute_num_layers`` n: the first n layers checkpointed, the others
not), one micro-batch, ``distribute_saved_activations`` False (Megatron-Core refuses it with sequence parallelism).
Recorded (bytes over the start, which holds the previous iteration's held dispatcher tensors and the detached inputs
and gradients their graphs keep, ``held_graph``: the kept layers' graphs also reach the harness's ``x0``, a leaf
standing for the embedding's output, left out): ``after_forward`` (less the stage's output), ``backward_start`` (when
the stage output's gradient hook runs: the output and all the forward left, before any layer's backward),
``after_recompute`` (after each recompute, inside the backward: top layer first), ``after_iteration`` (the stage's input, a fresh
non-leaf tensor made after the start, and the parameters' gradients freed), ``held``, ``held_other``,
``held_row_id_map``, ``held_graph``, ``received`` (per layer). Without ``gradient_accumulation_fusion`` the weight
gradients are bf16 ``.grad`` tensors (with it, APEX's kernel accumulates into ``main_grad``): alive from their
layer's backward on, they are in the backward's moments.

Recompute-modules runs (``MODULES_CONFIGS``, tp 2): the layer with measure_modules.py's ``Block`` (Megatron-Core's
``CheckpointWithoutOutput`` around the pre-MLP norm and the MoE activation, ``layernorm`` and ``moe_act``) in place of
its pre-MLP norm and MoE layer; recorded as the runs without recompute, with ``rebuilt`` (what each module's
recompute adds in the backward, as measure_modules.py records it).

Pipeline runs (``PP_CONFIGS``, tp 2, no recompute): a stage of such layers under Megatron-Core's 1F1B, measured as
measure_pp.py measures its stages (its ``run_iteration``: ``deallocate_output_tensor`` and ``custom_backward`` from
the source at COMMIT; a later stage's input is a receive buffer of the rank's ``T / tp x h``, as ``P2PCommunicator``
allocates it under sequence parallelism), the same fields as measure_pp.py's record.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import operator
import os
import sys
import types
import warnings
from typing import Callable, List, Optional, Set, Tuple, Union

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

import fakepg  # noqa: E402  (validation/fakepg.py)
import harness  # noqa: E402  (validation/harness.py)
import measure_modules  # noqa: E402
import measure_moe  # noqa: E402
from measure_moe import MegatronGptOssMoE, _defs, _read, _storage_bytes, megatron_namespace  # noqa: E402
from measure_modules import RMSNorm, modules_namespace  # noqa: E402
import measure_pp  # noqa: E402
from measure_pp import _NoModules, run_iteration, schedule_namespace  # noqa: E402
from measure_recompute import _exec, held_graph, recompute_namespace  # noqa: E402

# The tiny gpt-oss of tests/measured/test_megatron_gpt_oss.py: h 64, 4 heads of 16, 2 kv heads, 8 experts of width 48,
# top-2; 128 tokens (a micro-batch of 2 x 64), every tp rank's shard 128 / tp
T, H, HEADS, KV_HEADS, HEAD_DIM, F_, E, K = 128, 64, 4, 2, 16, 48, 8, 2
# (id, tp, ep)
CONFIGS = (
    ("tp1-ep1", 1, 1),
    ("tp2-ep1", 2, 1),
    ("tp2-ep2", 2, 2),
)
# (id, tp, ep, recompute_modules): Megatron-Core's selective recompute_modules (Megatron-Bridge's GPT-OSS 120B H100 perf
# recipe's layernorm and moe_act) on the pre-MLP norm and the MoE block (measure_modules.py's Block), one layer
MODULES_CONFIGS = (
    ("tp2-layernorm+moe_act", 2, 1, ("layernorm", "moe_act")),
    ("tp2-ep2-layernorm+moe_act", 2, 2, ("layernorm", "moe_act")),
)
# (id, tp, ep, layers, recompute_method, recompute_num_layers): Megatron-Core's full recompute (one layer a chunk,
# "uniform") and its block recompute (the first n layers of the stage checkpointed, the rest not)
RECOMPUTE_CONFIGS = (
    ("tp1-full-l2", 1, 1, 2, "uniform", 1),
    ("tp2-full-l2", 2, 1, 2, "uniform", 1),
    ("tp2-ep2-full-l2", 2, 2, 2, "uniform", 1),
    ("tp1-block1-l3", 1, 1, 3, "block", 1),
    ("tp2-block1-l3", 2, 1, 3, "block", 1),
    ("tp2-block2-l3", 2, 1, 3, "block", 2),
)
# (id, tp, ep, pipeline stages p, stage, micro-batches m, layers on the stage): a stage of such layers under
# Megatron-Core's 1F1B schedule (measure_pp.py's run_iteration: a later stage's input is a receive buffer of the
# rank's T / tp x h, as P2PCommunicator allocates it under sequence parallelism)
PP_CONFIGS = (
    ("tp2-pp2-stage0-m4-l2", 2, 1, 2, 0, 4, 2),
    ("tp2-pp2-stage1-m4-l2", 2, 1, 2, 1, 4, 2),
    ("tp2-ep2-pp2-stage1-m4-l2", 2, 2, 2, 1, 4, 2),
)
NS: dict = {}


class _CpuTorch(types.ModuleType):
    """``torch`` as the Megatron sources see it here: ``torch.cuda.current_device()`` is the CPU."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(current_device=lambda: "cpu")

    def __getattr__(self, name):
        return getattr(torch, name)


class _OneRank:
    """The tensor-parallel group of tp = 1 (``group.size() == 1``: the mappings return their input)."""

    def size(self):
        return 1

    def rank(self):
        return 0


def tp_namespace(repo: str) -> dict:
    """``GlobalMemoryBuffer`` (utils.py), the mappings and the linear autograd function at COMMIT, as written."""
    cpu_torch = _CpuTorch()
    ns: dict = {"torch": cpu_torch, "reduce": functools.reduce, "operator": operator, "Optional": Optional,
                "Callable": Callable, "List": List, "os": os, "warnings": warnings, "nullcontext": contextlib.nullcontext,
                "dist_all_gather_func": dist.all_gather_into_tensor,
                "dist_reduce_scatter_func": dist.reduce_scatter_tensor,
                "custom_fwd": lambda f: f, "custom_bwd": lambda f: f,      # bf16 throughout: no autocast
                "HAVE_TE": False, "fused_weight_gradient_mlp_cuda": None,
                "get_tensor_model_parallel_group_if_none": lambda group, **kw: group}
    utils = _read(repo, "megatron/core/utils.py")
    _exec(_defs(utils, ("GlobalMemoryBuffer", "prepare_input_tensors_for_wgrad_compute")), ns)
    buffer = ns["GlobalMemoryBuffer"]()
    ns["get_global_memory_buffer"] = lambda: buffer
    ns["mpu_buffer"] = buffer
    _exec(_defs(_read(repo, "megatron/core/tensor_parallel/mappings.py"),
                ("_gather_along_first_dim", "_reduce_scatter_along_first_dim",
                 "_ReduceScatterToSequenceParallelRegion", "reduce_scatter_to_sequence_parallel_region")), ns)
    _exec(_defs(_read(repo, "megatron/core/tensor_parallel/layers.py"),
                ("_linear_forward", "LinearWithGradAccumulationAndAsyncCommunication",
                 "linear_with_grad_accumulation_and_async_allreduce")), ns)
    ns["linear_with_grad_accumulation_and_async_allreduce"].warned = False     # (the module's statement after it)
    return ns


class FusedAttention(torch.autograd.Function):
    """TE's ``FusedAttnFunc`` (learnable softmax offsets) as a stand-in: saves q, k, v, the output and the fp32
    softmax statistics; returns the sinks' gradient. q: [T, a, d], k/v: [T, g, d] (the rank's heads)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks):
        a, g = q.shape[1], k.shape[1]
        rep = a // g
        qf, kf, vf = q.float(), k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
        scores = torch.einsum("tad,sad->ats", qf, kf) / q.shape[-1] ** 0.5
        mask = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).triu(1)
        scores.masked_fill_(mask, float("-inf"))
        lse = torch.logaddexp(torch.logsumexp(scores, -1), sinks.float().unsqueeze(-1))      # [a, T] fp32
        out = torch.einsum("ats,sad->tad", (scores - lse.unsqueeze(-1)).exp(), vf).to(q.dtype)
        del qf, kf, vf, scores, mask
        out = out.reshape(q.shape[0], -1)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v),
                torch.zeros(lse.shape[0], dtype=torch.bfloat16))


class Layer(torch.nn.Module):
    """``TransformerLayer.forward`` of a gpt-oss layer on tensor-parallel rank 0: the input norm, ``linear_qkv``
    (column-parallel, sequence-parallel input), the core attention on the rank's heads, ``linear_proj``
    (row-parallel) and its reduce-scatter, the bias and the residual, the pre-MLP norm, the MoE layer on the rank's
    sequence shard, the residual."""

    def __init__(self, ns, megatron, tp, ep, group, modules=(), ckpt=None):
        super().__init__()
        self.ns, self.tp, self.group = ns, tp, group
        p = lambda *s: torch.nn.Parameter(torch.randn(*s, dtype=torch.bfloat16) * 0.05)  # noqa: E731
        a, g = HEADS // tp, KV_HEADS // tp
        self.a, self.g = a, g
        self.norm1, self.norm2 = (torch.nn.Parameter(torch.ones(H, dtype=torch.bfloat16)) for _ in range(2))
        self.qkv_w, self.qkv_b = p((a + 2 * g) * HEAD_DIM, H), p((a + 2 * g) * HEAD_DIM)
        self.proj_w, self.proj_b = p(H, a * HEAD_DIM), p(H)
        self.sinks = p(a)
        self.block = None
        if modules:     # measure_modules.py's pre-MLP norm and MoE block with Megatron-Core's recompute modules
            self.block = measure_modules.Block(megatron, ckpt, H, F_, E, K, ep, tuple(modules))
            self.moe = self.block.moe
        else:
            self.moe = MegatronGptOssMoE(megatron, H, F_, E, K, ep)

    def forward(self, x):       # x: [T / tp, h], the rank's sequence shard of the residual stream
        ns, sp = self.ns, self.tp > 1
        linear = ns["linear_with_grad_accumulation_and_async_allreduce"]
        ln1 = RMSNorm.apply(x, self.norm1)
        qkv = linear(ln1, self.qkv_w, self.qkv_b, False, False, sp, tp_group=self.group)
        del ln1
        q, k, v = torch.split(qkv.view(qkv.shape[0], self.a + 2 * self.g, HEAD_DIM), [self.a, self.g, self.g], 1)
        del qkv
        core = FusedAttention.apply(q, k, v, self.sinks)
        del q, k, v
        out = linear(core, self.proj_w, None, False, False, False, tp_group=self.group)
        del core
        if sp:
            out = ns["reduce_scatter_to_sequence_parallel_region"](out, group=self.group)
        x = x + (out + self.proj_b)     # bias_dropout_add, no dropout
        del out
        if self.block is not None:
            return x + self.block(x)
        return x + self.moe(RMSNorm.apply(x, self.norm2))


def measure(cfg: dict) -> dict:
    tp, ep = cfg["tp"], cfg["ep"]
    group = dist.group.WORLD if tp > 1 else _OneRank()
    torch.manual_seed(0)
    ns = NS["tp"]
    ns["mpu_buffer"].buffer = {}        # (each run its own: the buffer a previous run allocated is not this one's)
    clock, rebuilt = {"now": lambda: 0}, []
    modules = tuple(cfg.get("recompute_modules", ()))
    ckpt = measure_modules._recording(NS["modules"], lambda: clock["now"](), rebuilt) if modules else None
    layer = Layer(ns, NS["megatron"], tp, ep, group, modules, ckpt)
    x0 = (torch.randn(T // tp, H) * 0.5).to(torch.bfloat16).requires_grad_(True)
    grad = torch.randn(T // tp, H).to(torch.bfloat16)
    for _ in range(2):      # warm-up iterations
        layer(x0.clone()).backward(grad)
        x0.grad = None
        for p in layer.parameters():
            p.grad = None
    moe = layer.moe
    buffers = list(ns["mpu_buffer"].buffer.values())
    held = _storage_bytes(moe.held.values())
    held_other = {n: _storage_bytes([t]) for n, t in moe.held_other.items()}
    mt = MemTracker()
    mt.track_external(layer)
    dev = torch.device("cpu")
    with mt:
        for t in (*moe.held.values(), *moe.held_other.values(), *buffers, grad):
            t.detach()
        x = x0.clone()
        start = mt.get_tracker_snapshot("current")[dev]["Total"]
        clock["now"] = lambda: mt.get_tracker_snapshot("current")[dev]["Total"]
        rebuilt.clear()
        out = layer(x)
        after_forward = mt.get_tracker_snapshot("current")[dev]["Total"]
        saved = after_forward - start - out.numel() * out.element_size()
        out.backward(grad)
        del out, x
        x0.grad = None
        for p in layer.parameters():
            p.grad = None
        end = mt.get_tracker_snapshot("current")[dev]["Total"]
        peak = mt.get_tracker_snapshot("peak")[dev]["Total"]
    clock["now"] = lambda: 0
    out = {"saved": saved, "saved_with_row_id_map": saved + held_other["row_id_map"], "held": held,
           "held_other": held_other, "after_backward_over_start": end - start, "peak_over_start": peak - start,
           "mpu_buffer": _storage_bytes(buffers), "received": moe.received, "tokens_on_rank": T // tp}
    if modules:
        out["rebuilt"] = list(rebuilt)
    return out


class CheckpointedLayer(Layer):
    """``Layer`` as ``checkpointed_forward`` calls a ``TransformerLayer``: keyword arguments, ``(hidden_states,
    context)`` returned; records the bytes alive after each forward run inside the backward (a recompute:
    ``CheckpointFunction.backward`` under ``enable_grad``)."""

    def __init__(self, *args, moments):
        super().__init__(*args)
        self.moments = moments

    def forward(self, hidden_states, attention_mask=None, context=None, context_mask=None, rotary_pos_emb=None,
                attention_bias=None, inference_context=None, packed_seq_params=None, padding_mask=None):
        out = super().forward(hidden_states)
        if torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1:    # inside the backward
            self.moments["recompute"].append(self.moments["now"]())
        return out, context


def checkpointed_forward(repo: str, checkpoint) -> Callable:
    """``checkpointed_forward`` (``megatron/core/recompute.py`` at COMMIT, as written) calling ``CheckpointedLayer``s
    and ``tensor_parallel.checkpoint`` (``CheckpointFunction``, measure_recompute.py's namespace)."""
    block = {"torch": torch, "Tensor": torch.Tensor, "Optional": Optional, "Set": Set, "List": List,
             "Tuple": Tuple, "Union": Union, "nullcontext": contextlib.nullcontext,
             "tensor_parallel": types.SimpleNamespace(checkpoint=checkpoint), "TransformerLayer": CheckpointedLayer,
             "te_checkpoint": None, "get_fp8_context": None, "get_fp4_context": None}
    _exec(_defs(_read(repo, "megatron/core/recompute.py"), ("checkpointed_forward",)), block)
    return block["checkpointed_forward"]


class Stage(torch.nn.Module):
    """A ``TransformerBlock`` of ``layers`` gpt-oss layers on tensor-parallel rank 0 under
    ``recompute_granularity="full"`` with ``recompute_method`` and ``recompute_num_layers``
    (``checkpointed_forward``, as ``TransformerBlock.forward`` calls it; ``distribute_saved_activations`` False, as
    Megatron-Core requires with sequence parallelism)."""

    def __init__(self, tp, ep, group, layers, method, num_layers):
        super().__init__()
        self.moments = {"now": lambda: 0, "recompute": []}
        self.layers = torch.nn.ModuleList(CheckpointedLayer(NS["tp"], NS["megatron"], tp, ep, group,
                                                            moments=self.moments) for _ in range(layers))
        self.config = types.SimpleNamespace(recompute_method=method, recompute_num_layers=num_layers, fp8=False,
                                            fp4=False, distribute_saved_activations=False)
        self.num_layers_per_pipeline_rank = layers
        self.pg_collection = None
        self.rope = torch.randn(T, 1, 1, HEAD_DIM)    # the shared rotary table (saved by every checkpoint, no grad)

    def forward(self, x):
        return NS["checkpointed_forward"](self, x, None, None, None, self.rope, None, None, False)


def _show(*tensors) -> None:
    """Show the tracker every tensor alive before its start (``detach``: it counts the storage of an op's result), in
    a function of its own: a loop variable left in the caller would keep the last one alive."""
    for t in tensors:
        t.detach()


def measure_recompute(cfg: dict) -> dict:
    """One forward and backward of the stage (one micro-batch) after two warm-up ones: bytes over the start (which
    holds the previous iteration's held dispatcher tensors and, under recompute, the detached inputs and gradients
    their graphs keep: ``held_graph``, shown to the tracker) after the forward (less the output), after each
    recompute (top layer first), after the iteration (the layer's input, alive at the start, freed by the script
    unless a held graph keeps it)."""
    tp, ep, layers = cfg["tp"], cfg["ep"], cfg["layers"]
    group = dist.group.WORLD if tp > 1 else _OneRank()
    torch.manual_seed(0)
    NS["tp"]["mpu_buffer"].buffer = {}
    stage = Stage(tp, ep, group, layers, cfg["recompute_method"], cfg["recompute_num_layers"])
    x0 = (torch.randn(T // tp, H) * 0.5).to(torch.bfloat16).requires_grad_(True)
    grad = torch.randn(T // tp, H).to(torch.bfloat16)

    def clear():
        x0.grad = None
        for p in stage.parameters():
            p.grad = None

    for _ in range(2):      # warm-up iterations
        stage(x0.clone()).backward(grad)
        clear()
    gc.collect()
    moes = [layer.moe for layer in stage.layers]
    held_row_id_map = sum(_storage_bytes([moe.held_other["row_id_map"]]) for moe in moes)

    def graph():        # (a kept layer's graph reaches the harness's x0, a leaf that stands for the embedding)
        inputs = [v for v in held_graph(stage)[0] if v is not x0]
        return inputs, [v.grad for v in inputs if v.grad is not None]

    inputs, input_grads = graph()
    before = {"inputs": _storage_bytes(inputs), "input_grads": _storage_bytes(input_grads)}
    buffers = list(NS["tp"]["mpu_buffer"].buffer.values())
    mt = MemTracker()
    mt._mod_tracker = _NoModules()
    mt.track_external(stage)
    dev = torch.device("cpu")
    with mt:
        _show(*(t for moe in moes for t in (*moe.held.values(), *moe.held_other.values())), *buffers, grad,
              stage.rope, *inputs, *input_grads)
        del inputs, input_grads
        start = mt.get_tracker_snapshot("current")[dev]["Total"]
        stage.moments["now"] = lambda: mt.get_tracker_snapshot("current")[dev]["Total"] - start
        stage.moments["recompute"] = []
        x = x0.clone()      # (the stage's input: a fresh non-leaf tensor, as measure_pp.py's first stage's)
        out = stage(x)
        after_forward = stage.moments["now"]() - out.numel() * out.element_size()
        out.register_hook(lambda g: stage.moments.__setitem__("backward_start", stage.moments["now"]()))
        out.backward(grad)
        del out, x
        clear()
        gc.collect()
        end = stage.moments["now"]()
        peak = mt.get_tracker_snapshot("peak")[dev]["Total"] - start
    stage.moments["now"] = lambda: 0
    inputs, input_grads = graph()
    return {"after_forward": after_forward, "backward_start": stage.moments["backward_start"],
            "after_recompute": list(stage.moments["recompute"]),
            "after_iteration": end, "peak_over_start": peak,
            "held": sum(_storage_bytes(moe.held.values()) for moe in moes),
            "held_other": {n: sum(_storage_bytes([moe.held_other[n]]) for moe in moes) for n in moes[0].held_other},
            "held_row_id_map": held_row_id_map,
            "held_graph": {**before, "inputs_after": _storage_bytes(inputs),
                           "input_grads_after": _storage_bytes(input_grads)},
            "mpu_buffer": _storage_bytes(buffers), "received": [moe.received for moe in moes],
            "tokens_on_rank": T // tp}


class PipelineStage(torch.nn.Module):
    """A stage's layers, one after the other (no recompute), as measure_pp.py's ``Stage`` runs them."""

    def __init__(self, tp, ep, group, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(NS["tp"], NS["megatron"], tp, ep, group) for _ in range(layers))
        self.last_input = lambda: None

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def measure_pipeline(cfg: dict) -> dict:
    """measure_pp.py's measurement (``run_iteration``: Megatron-Core's 1F1B with ``deallocate_output_tensor`` and
    ``custom_backward`` from its source; the parameters' gradients accumulate across iterations, shown to the tracker
    at the start) of a stage of this script's layers on tensor-parallel rank 0."""
    tp, ep, p, i, m, layers = (cfg[n] for n in ("tp", "ep", "pp", "stage", "microbatches", "layers"))
    if T // tp != measure_pp.T or H != measure_pp.H:
        raise SystemExit(f"measure_pp.py's receive buffer is {measure_pp.T} x {measure_pp.H}: T / tp = {T // tp}")
    group = dist.group.WORLD if tp > 1 else _OneRank()
    torch.manual_seed(0)
    NS["tp"]["mpu_buffer"].buffer = {}
    stage = PipelineStage(tp, ep, group, layers)
    x0 = (torch.randn(T // tp, H) * 0.5).to(torch.bfloat16).requires_grad_(True)
    grad = torch.randn(T // tp, H).to(torch.bfloat16)
    for _ in range(2):
        run_iteration(stage, NS["schedule"], p, i, m, x0, grad)
    gc.collect()
    moes = [layer.moe for layer in stage.layers]
    held_row_id_map = sum(_storage_bytes([moe.held_other["row_id_map"]]) for moe in moes)
    previous = stage.last_input()
    held_input = 0 if previous is None else _storage_bytes([previous])
    buffers = list(NS["tp"]["mpu_buffer"].buffer.values())
    mt = MemTracker()
    mt._mod_tracker = _NoModules()
    mt.track_external(stage)
    dev = torch.device("cpu")
    with mt:
        _show(*(t for moe in moes for t in (*moe.held.values(), *moe.held_other.values())), *buffers, x0, grad,
              *(t for t in (x0.grad, previous) if t is not None), *stage.parameters(),
              *(q.grad for q in stage.parameters() if q.grad is not None))
        del previous
        start = mt.get_tracker_snapshot("current")[dev]["Total"]
        after_forward, before_backward = run_iteration(stage, NS["schedule"], p, i, m, x0, grad, mt, start)
        gc.collect()
        end = mt.get_tracker_snapshot("current")[dev]["Total"] - start
    last = stage.last_input()
    return {"one_microbatch": after_forward[0], "forward_peak": max(after_forward),
            "before_backward_peak": max(before_backward), "after_forward": after_forward,
            "before_backward": before_backward, "after_iteration": end,
            "held": sum(_storage_bytes(moe.held.values()) for moe in moes),
            "held_other": {n: sum(_storage_bytes([moe.held_other[n]]) for moe in moes) for n in moes[0].held_other},
            "held_row_id_map": held_row_id_map, "held_input": held_input,
            "held_input_after": 0 if last is None else _storage_bytes([last]),
            "mpu_buffer": _storage_bytes(buffers), "received": [moe.received for moe in moes],
            "tokens_on_rank": T // tp}


def _measure_run(cfg: dict) -> dict:
    if "pp" in cfg:
        return measure_pipeline(cfg)
    return measure_recompute(cfg) if "recompute_method" in cfg else measure(cfg)


def _summary(m: dict) -> str:
    if "one_microbatch" in m:
        return (f"{m['tokens_on_rank']} tokens on the rank; one micro-batch {m['one_microbatch']:,} B, forward peak "
                f"{m['forward_peak']:,} B, after the iteration {m['after_iteration']:,} B; held input "
                f"{m['held_input_after']:,} B")
    if "after_recompute" in m:
        return (f"{m['tokens_on_rank']} tokens on the rank; after the forward {m['after_forward']:,} B, recomputes "
                f"{m['after_recompute']}, after the iteration {m['after_iteration']:,} B; held graph {m['held_graph']}")
    return (f"{m['tokens_on_rank']} tokens on the rank, {m['received']:,} rows received; saved "
            f"{m['saved_with_row_id_map']:,} B; held {m['held']:,} B; mpu buffer {m['mpu_buffer']:,} B; after the "
            f"backward {m['after_backward_over_start']:,} B over the start")


def _document(args, runs, ctx) -> dict:
    return measure_moe.record("measure_tp.py", runs, sequence_parallel=True, expert_tensor_parallel_size=1,
                              shape={"tokens": T, "hidden": H, "heads": HEADS, "kv_heads": KV_HEADS,
                                     "head_dim": HEAD_DIM, "moe_ffn_hidden_size": F_, "experts": E, "top_k": K})


def main(argv=None):
    arguments = measure_moe.megatron_lm_argument

    def before(args):
        if not dist.is_initialized():     # rank 0 of a fake world of 2 until the process ends (validation/fakepg.py)
            NS["world"] = contextlib.ExitStack()
            NS["world"].enter_context(fakepg.fake_world(0, 2))
        NS["megatron"] = megatron_namespace(args.megatron_lm)
        NS["tp"] = tp_namespace(args.megatron_lm)
        measure_moe.NS["megatron"] = NS["megatron"]
        NS["checkpointed_forward"] = checkpointed_forward(args.megatron_lm,
                                                          recompute_namespace(args.megatron_lm)["checkpoint"])
        NS["schedule"] = schedule_namespace(args.megatron_lm)
        NS["modules"] = modules_namespace(args.megatron_lm)

    configs = [{"id": cid, "tp": tp, "ep": ep} for cid, tp, ep in CONFIGS]
    configs += [{"id": cid, "tp": tp, "ep": ep, "recompute_modules": list(mods)} for cid, tp, ep, mods in MODULES_CONFIGS]
    configs += [{"id": cid, "tp": tp, "ep": ep, "layers": n, "recompute_granularity": "full", "recompute_method": method,
                 "recompute_num_layers": k} for cid, tp, ep, n, method, k in RECOMPUTE_CONFIGS]
    configs += [{"id": cid, "tp": tp, "ep": ep, "pp": p, "stage": i, "microbatches": m, "layers": n}
                for cid, tp, ep, p, i, m, n in PP_CONFIGS]
    return harness.main(argv, description=__doc__.splitlines()[0], configs=configs, measure_run=_measure_run,
                        document=_document, out=os.path.join(HERE, "tp_measurements.json"), summary=_summary,
                        threads=1, versions=harness.versions, catch=False, arguments=arguments, before=before)


if __name__ == "__main__":
    sys.exit(main())
