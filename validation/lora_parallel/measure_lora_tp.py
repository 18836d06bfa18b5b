#!/usr/bin/env python
"""Measure one tensor-parallel rank (no sequence parallelism) of LoRA training (issue 25 item 2) with Megatron-Bridge's
adapter layout, re-implemented in PyTorch over a Hugging Face Llama under torch's DTensor TP.

    /tmp/pplvenv/bin/python validation/lora_parallel/measure_lora_tp.py --out validation/lora_parallel/tp_measurements.json

The run is ``../parallel/measure_parallel.py``'s, unchanged (``measure_parallel``: the "fake" process group, one rank
of a world, ``apply_tp`` with sp=False: ColwiseParallel q/k/v/gate/up, RowwiseParallel o/down, vocab-parallel
embedding and LM head; ``harness.run_protocol``: three iterations, the third measured, every phase's peak), with one
addition: after the TP plan every base parameter is frozen and every targeted linear gets Megatron-Bridge's
``ParallelLinearAdapter`` (NVIDIA-NeMo/Megatron-Bridge 067f987df03b8355b03192d88d70f1709fedf51a
src/megatron/bridge/peft/utils.py ``ParallelLinearAdapter.__init__``/``forward``; ``lora.py`` builds it with
``activation="identity"``, ``input_is_parallel`` for a row-parallel base; its ``LoRALinear.forward`` adds the
adapter's output to the base linear's), re-implemented with the Megatron-Core mappings it calls (megatron/core/
tensor_parallel/mappings.py: ``copy_to_tensor_model_parallel_region`` identity forward / all-reduce backward,
``reduce_from_tensor_model_parallel_region`` all-reduce forward / identity backward,
``gather_from_tensor_model_parallel_region`` all-gather into a (tp x ...) buffer then ``torch.cat`` on the last dim /
the rank's chunk made contiguous in the backward):

* column-parallel base (q, k, v, gate, up): ``linear_in = ColumnParallelLinear(in, r, gather_output=True)``: the
  weight r/tp x in on each rank, its input the (replicated) layer input, its output all-gathered to the full r;
  ``linear_out = ColumnParallelLinear(r, out, gather_output=False)``: out/tp x r, its output this rank's shard of the
  base's output, added to it;
* row-parallel base (o, down): ``linear_in = RowParallelLinear(in, r, input_is_parallel=True)``: r x in/tp, its
  input the base's input shard, its output all-reduced to the full r; ``linear_out = ColumnParallelLinear(r, out,
  gather_output=True)``: out/tp x r, its output all-gathered to the full ``out`` (the base's all-reduced output);
* ``x * alpha / dim`` after ``linear_out`` (a scalar: saves nothing); in a bf16 model the adapters are bf16
  (``model_parallel_config.bf16: self.bfloat16()``), in fp32 fp32;
* the mapping of module names: Megatron adapts its fused ``linear_qkv`` / ``linear_fc1``; here each of Hugging Face's
  separate q/k/v (gate/up) projections gets its own adapter, as peft's ``target_modules`` names them (the layout of
  each adapter is Megatron-Bridge's).

The optimizer (``AdamW`` foreach) takes the adapters only. Needs torch==2.13.0 (CPU), transformers==5.23.0.
"""

from __future__ import annotations

import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(VALIDATION, "parallel"))

import measure_parallel as mp  # noqa: E402  (puts validation/ on sys.path)
import harness  # noqa: E402
from measure_lora import FrozenAwareMemTracker  # noqa: E402  (grad hooks on the trainable parameters only)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from torch.distributed.tensor import DTensor, Partial  # noqa: E402

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
# The tensor-parallel group of the mappings below (None: the whole world, as when tp is the only dimension;
# measure_lora_tp_dp.py sets the tp group of its (dp, tp) mesh)
GROUP = None


class _CopyToTP(torch.autograd.Function):
    """mappings.py ``_CopyToModelParallelRegion``: identity forward, all-reduce of the gradient (in place)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        dist.all_reduce(g, group=GROUP)
        return g


class _ReduceFromTP(torch.autograd.Function):
    """mappings.py ``_ReduceFromModelParallelRegion``: all-reduce (in place) forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x, group=GROUP)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class _GatherFromTP(torch.autograd.Function):
    """mappings.py ``_GatherFromModelParallelRegion`` (``_gather_along_last_dim``: an all-gather into a (tp x ...)
    buffer, then ``torch.cat`` of its chunks on the last dim; backward ``_split_along_last_dim``: the rank's chunk,
    contiguous)."""

    @staticmethod
    def forward(ctx, x):
        world = dist.get_world_size(GROUP)
        size = list(x.shape)
        size[0] *= world
        buf = torch.empty(size, dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(buf, x.contiguous(), group=GROUP)
        return torch.cat(buf.chunk(world, dim=0), dim=-1).contiguous()

    @staticmethod
    def backward(ctx, g):
        world, rank = dist.get_world_size(GROUP), dist.get_rank(GROUP)
        return g.chunk(world, dim=-1)[rank].contiguous()


class _ScatterToSP(torch.autograd.Function):
    """mappings.py ``_ScatterToSequenceParallelRegion`` (``_split_along_first_dim``: the rank's chunk of the sequence,
    made contiguous; backward ``_gather_along_first_dim``: one all-gather into the whole sequence). Megatron's
    activations are (s, b, h), Hugging Face's (b, s, h): the sequence is dim 1 here. The backward's all-gather lands
    in one (tp, b, s/tp, h) buffer, viewed as (b, s, h) where b = 1 (the layout Megatron's buffer has), else moved
    into one (b, s, h) tensor (a copy Megatron does not make)."""

    @staticmethod
    def forward(ctx, x):
        world, rank = dist.get_world_size(GROUP), dist.get_rank(GROUP)
        return x.chunk(world, dim=1)[rank].contiguous()

    @staticmethod
    def backward(ctx, g):
        world = dist.get_world_size(GROUP)
        b, s, h = g.shape
        buf = torch.empty((world, b, s, h), dtype=g.dtype, device=g.device)
        dist.all_gather_into_tensor(buf, g.contiguous(), group=GROUP)
        return buf.transpose(0, 1).reshape(b, world * s, h)


class ParallelLinearAdapter(torch.nn.Module):
    """Megatron-Bridge's adapter (identity activation, no dropout) for one rank: ``row`` = ``input_is_parallel``.

    ``sp`` (sequence parallelism, Megatron-Bridge's default path with Transformer Engine >= 1.5: ``get_adapter_
    attributes_from_linear`` sets ``return_layernorm_output_gathered`` on the column base and ``disable_sequence_
    parallel_comm`` for its adapter): a column adapter reads the layer's all-gathered norm output, the tensor its base
    reads (here the DTensor the attention / MLP input was all-gathered to), its ``linear_in`` built with
    ``disable_grad_reduce=True`` (no copy_to: the input's gradient is a partial sum, reduce-scattered with the base's);
    a row adapter's gathered output is scattered back to the rank's sequence chunk
    (``scatter_to_sequence_parallel_region``) before it is added to the base's reduce-scattered output."""

    def __init__(self, in_features, out_features, dim, alpha, row, tp, dtype, sp=False, dropout=0.0):
        super().__init__()
        self.row, self.scale, self.sp = row, alpha / dim, sp
        # dropout_position="pre" (Megatron-Bridge's default): ``x = self.dropout(x)`` first in ``forward``
        self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else None
        a_shape = (dim, in_features // tp) if row else (dim // tp, in_features)
        self.linear_in = torch.nn.Parameter(torch.randn(a_shape, dtype=dtype) * 0.02)
        self.linear_out = torch.nn.Parameter(torch.zeros(out_features // tp, dim, dtype=dtype))

    def forward(self, x):
        if isinstance(x, DTensor):      # (SP: the all-gathered norm output; its gradient a partial sum)
            x = x.to_local(grad_placements=(Partial(),))
        if self.dropout is not None:
            x = self.dropout(x)
        if self.row:            # RowParallelLinear(input_is_parallel=True): reduce_from after the matmul
            y = _ReduceFromTP.apply(torch.nn.functional.linear(x, self.linear_in))
        elif self.sp:           # the gathered norm output, as the base reads it; disable_grad_reduce: no copy_to
            y = _GatherFromTP.apply(torch.nn.functional.linear(x, self.linear_in))
        else:                   # ColumnParallelLinear(gather_output=True): copy_to before, gather after
            y = _GatherFromTP.apply(torch.nn.functional.linear(_CopyToTP.apply(x), self.linear_in))
        z = torch.nn.functional.linear(_CopyToTP.apply(y), self.linear_out)    # ColumnParallelLinear(r, out)
        if self.row:
            z = _GatherFromTP.apply(z)                                         # gather_output=True
            if self.sp:
                z = _ScatterToSP.apply(z)                                      # scatter_to_sequence_parallel_region
        return z * self.scale


class LoRALinear(torch.nn.Module):
    """Megatron-Bridge ``LoRALinear.forward``: the base linear's output plus the adapter's of the same input."""

    def __init__(self, base, adapter):
        super().__init__()
        self.base, self.adapter = base, adapter

    def forward(self, x):
        return self.base(x) + self.adapter(x)


def add_adapters(model, cfg, tp) -> dict:
    lora = cfg["lora"]
    sp = cfg["layout"]["kind"] == "tp+sp"
    for p in model.parameters():
        p.requires_grad_(False)
    dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
    targets = COLUMN + ROW if lora["target_modules"] == "all-linear" else tuple(lora["target_modules"])
    hf = cfg["hf_config"]
    widths = {"q_proj": (hf["hidden_size"], hf["num_attention_heads"] * (hf["hidden_size"] // hf["num_attention_heads"])),
              "k_proj": (hf["hidden_size"], hf["num_key_value_heads"] * (hf["hidden_size"] // hf["num_attention_heads"])),
              "v_proj": (hf["hidden_size"], hf["num_key_value_heads"] * (hf["hidden_size"] // hf["num_attention_heads"])),
              "o_proj": (hf["num_attention_heads"] * (hf["hidden_size"] // hf["num_attention_heads"]), hf["hidden_size"]),
              "gate_proj": (hf["hidden_size"], hf["intermediate_size"]),
              "up_proj": (hf["hidden_size"], hf["intermediate_size"]),
              "down_proj": (hf["intermediate_size"], hf["hidden_size"])}
    torch.manual_seed(1)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in targets:
                base = getattr(parent, name, None)
                if base is None:
                    continue
                i, o = widths[name]
                setattr(parent, name, LoRALinear(base, ParallelLinearAdapter(
                    i, o, lora["rank"], lora["alpha"], name in ROW, tp, dtype, sp, lora.get("dropout", 0.0))))
    info = {"adapter": "Megatron-Bridge ParallelLinearAdapter (re-implemented)", "targets": list(targets),
            "adapter_dtype": str(dtype).replace("torch.", "")}
    if sp:
        info["sequence_parallel"] = ("column adapters read the base's all-gathered norm output (Transformer Engine's "
                                     "return_layernorm_output_gathered), linear_in without copy_to; row adapters' "
                                     "gathered output scattered to the rank's sequence chunk")
    return info


def _cfg(regime, world, *, rank=16, targets="all-linear", b=2, s=256, model="llama-tiny", kind="tp", dropout=0.0):
    c = mp._cfg(kind, model, world, 0, regime=regime, b=b, s=s)
    short = "all" if targets == "all-linear" else "-".join(t.split("_")[0] for t in targets)
    d = f"-d{dropout:g}" if dropout else ""
    c["id"] = f"lora-{kind.replace('+', '')}-{model}-{regime}-r{rank}-{short}{d}-w{world}-b{b}-s{s}-r0"
    c["lora"] = {"rank": rank, "alpha": 2 * rank, "target_modules": targets, "implementation": "megatron-bridge"}
    if dropout:
        c["lora"]["dropout"] = dropout
    return c


CONFIGS = [
    _cfg("fp32", 2),
    _cfg("fp32", 2, targets=["q_proj", "v_proj"]),
    _cfg("bf16", 2),
    _cfg("fp32", 4, rank=8),
    # grouped-query attention: the KV heads split over the ranks too
    _cfg("fp32", 2, model="gqa-tiny"),
    _cfg("bf16", 2, targets=["q_proj", "v_proj"], model="gqa-tiny"),
    # lora_dropout (Megatron-Bridge's dropout_position="pre": each adapter drops its own input)
    _cfg("fp32", 2, dropout=0.1),
    _cfg("bf16", 2, targets=["q_proj", "v_proj", "down_proj"], dropout=0.1),
]


def measure(cfg: dict) -> dict:
    world = cfg["layout"]["world_size"]
    orig = mp.apply_tp
    info = {}

    def apply_tp(model, mesh, sp):
        plan = orig(model, mesh, sp)
        info.update(add_adapters(model, cfg, world))
        return plan
    tracker = mp.PhaseMemTracker
    mp.apply_tp, mp.PhaseMemTracker = apply_tp, FrozenAwareMemTracker
    try:
        m = mp.measure_parallel(cfg)
    finally:
        mp.apply_tp, mp.PhaseMemTracker = orig, tracker
    m["lora"] = info
    return m


def document_for(script: str):
    """The recorded JSON's header for one of the fake-process-group scripts (this one, _sp, _tp_pp)."""
    def document(args, runs, ctx) -> dict:
        return {"generator": f"validation/lora_parallel/{script}" + (" --only" if args.only else ""),
                "python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "device": "cpu",
                "process_group": "fake (torch.testing._internal.distributed.fake_pg.FakeStore), rank 0",
                "megatron_bridge": "NVIDIA-NeMo/Megatron-Bridge 067f987df03b8355b03192d88d70f1709fedf51a",
                "runs": runs}
    return document


document = document_for("measure_lora_tp.py")


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.splitlines()[1], configs=CONFIGS, measure_run=measure,
                        document=document, out=os.path.join(HERE, "tp_measurements.json"),
                        keep_previous="only")


if __name__ == "__main__":
    sys.exit(main())
