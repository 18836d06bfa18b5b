#!/usr/bin/env python
"""Measure one rank of LoRA training under tensor and data parallelism together (issue 25 item 2): Megatron-Bridge's
adapters over a tensor-parallel Hugging Face Llama, trained as Megatron-Bridge trains them: Megatron-Core's
DistributedDataParallel over the adapters and its distributed optimizer.

    /tmp/pplvenv/bin/python validation/lora_parallel/measure_lora_tp_dp.py --out validation/lora_parallel/tp_dp_measurements.json

What Megatron-Bridge runs (NVIDIA-NeMo/Megatron-Bridge 067f987df03b8355b03192d88d70f1709fedf51a
src/megatron/bridge/recipes/common.py ``_peft_common``: ``mixed_precision="bf16_mixed"`` (bf16 parameters, the
adapters cast to bf16 by ``ParallelLinearAdapter``), ``DistributedDataParallelConfig(grad_reduce_in_fp32=True)``,
``distributed_fused_adam_with_cosine_annealing``: the distributed optimizer; the perf recipes
src/megatron/bridge/perf_recipes/llama/h100/llama3.py ``llama3_70b_peft_8gpu_h100_*``: ``use_distributed_optimizer
= True`` with tp 1 / 2 and dp > 1): the measured profile's regime ``mixed-bf16-main-grad`` with the data-parallel
rule ``mcore-distopt``. Re-implemented after NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553:

* ``megatron/core/distributed/distributed_data_parallel.py`` (``__init__``: only parameters with ``requires_grad``,
  here the adapters' tp shards; ``_make_backward_post_hook``: a hook on each parameter's ``AccumulateGrad`` node,
  ``param.main_grad.add_(param.grad.data); param.grad = None``); ``param_and_grad_buffer.py``: one buffer per
  (param dtype, grad dtype), one bucket without ``overlap_grad_reduce`` (Bridge's PEFT default), ``grad_data =
  torch.zeros(numel, fp32)`` and, with the distributed optimizer, ``param_data = torch.zeros(numel, bf16)`` into
  which each parameter is moved (``param.data`` a view of it; the old storage freed); each parameter's start padded to
  64 elements and the bucket's end to lcm(dp, 128) (``megatron/core/optimizer/param_layout.py``);
  ``main_grad`` a view of ``grad_data``; ``zero_grad_buffer``: ``grad_data.zero_()``; the gradients scaled by 1/dp
  and reduce-scattered in place (``reduce_scatter_tensor`` into this rank's view of the bucket); with ``mcore-ddp``
  all-reduced in place;
* ``megatron/core/optimizer/distrib_optimizer.py``: this rank's 1/dp range of the buffer; its fp32 main parameters
  (``shard_model_param.clone().float()``, made at construction), ``main_param.grad = shard_model_grad.float()`` (the
  fp32 buffer's own view: no copy), Adam on the shard, ``shard_model_param.data.copy_(shard_main_param)``, the
  parameters all-gathered in place into ``param_data``. Without the distributed optimizer (``mcore-ddp``,
  ``Float16OptimizerWithFloat16Params``): the same with the whole buffer as the shard (and no ``param_data``: the
  parameters stay where they are).

Adam is torch's fused AdamW over the fp32 shard (Megatron-Core's is TransformerEngine's / apex's ``FusedAdam``: the
moments in fp32, updated in place, no temporaries); the step is compared with ``optimizer_impl="fused"``. The run
is ``measure_lora_tp.py``'s (``../parallel/measure_parallel.py``: the fake process group, rank 0 of a world of dp x
tp over a (dp, tp) mesh, the TP plan on the tp dimension; the adapters added after it), with the optimizer above in
place of ``torch.optim.AdamW`` over the adapters. Needs torch==2.13.0 (CPU), transformers==5.23.0.
"""

from __future__ import annotations

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure_lora_tp as tp  # noqa: E402  (puts validation/ and validation/parallel/ on sys.path)
import measure_parallel as mp  # noqa: E402
import harness  # noqa: E402
from measure_lora import FrozenAwareMemTracker  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def _pad(x, d):
    return int(math.ceil(x / d) * d)


class MegatronLoRAOptimizer:
    """Megatron-Core's DDP grad buffer over the trainable parameters and its (distributed) optimizer (module
    docstring). ``distributed``: the distributed optimizer (``param_data``, the fp32 state over 1/dp); else DDP with
    ``Float16OptimizerWithFloat16Params`` (the fp32 state of the whole buffer)."""

    def __init__(self, params, dp, distributed, group):
        self.params, self.dp, self.group = list(params), dp, group
        start, index = 0, []
        for p in self.params:
            start = _pad(start, 64) if distributed else start      # pad_param_start (distributed optimizer only)
            index.append((start, start + p.numel()))
            start += p.numel()
        numel = _pad(start, math.lcm(dp, 128)) if distributed else start   # pad_bucket_end
        self.padding = numel - sum(p.numel() for p in self.params)
        self.grad_data = torch.zeros(numel, dtype=torch.float32)
        self.param_data = torch.zeros(numel, dtype=self.params[0].dtype) if distributed else None
        self._hooks = []
        for p, (a, b) in zip(self.params, index):
            if distributed:
                self.param_data[a:b].view(p.shape).copy_(p.data)
                p.data = self.param_data[a:b].view(p.shape)
            p.main_grad = self.grad_data[a:b].view(p.shape)
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append((acc, acc.register_hook(self._hook(p))))
        shard = numel // dp if distributed else numel
        self.grad_shard = self.grad_data[:shard]                              # rank 0's range
        if distributed:
            self.param_shard = self.param_data[:shard]
            self.main = self.param_shard.clone().float()                       # shard_model_param.clone().float()
        else:                                                                  # Float16OptimizerWithFloat16Params
            self.main = torch.cat([p.detach().reshape(-1) for p in self.params]).float()
        self.inner = torch.optim.AdamW([self.main], lr=1e-4, weight_decay=0.01, fused=True)
        self.state = self.inner.state
        self.distributed = distributed

    @staticmethod
    def _hook(p):
        def hook(*unused):
            if p.grad is not None:
                p.main_grad.add_(p.grad.data)
            p.grad = None
        return hook

    def zero_grad(self, set_to_none=True):
        self.grad_data.zero_()                 # zero_grad_buffer
        self.main.grad = None

    def step(self):
        self.grad_data.mul_(1.0 / self.dp)     # gradient_scaling_factor = 1 / dp, in place
        if self.distributed:
            dist.reduce_scatter_tensor(self.grad_shard, self.grad_data, group=self.group)
        else:
            dist.all_reduce(self.grad_data, group=self.group)
        self.main.grad = self.grad_shard.float()       # fp32: the buffer's own view
        self.inner.step()
        if self.distributed:
            self.param_shard.copy_(self.main)
            dist.all_gather_into_tensor(self.param_data, self.param_shard, group=self.group)
        else:
            with torch.no_grad():
                at = 0
                for p in self.params:
                    p.copy_(self.main[at:at + p.numel()].view(p.shape))
                    at += p.numel()


class Tracker(FrozenAwareMemTracker):
    """The buffers Megatron-Core allocates before training, and the inner Adam, tracked as the model's and the
    optimizer's are."""

    def track_external(self, *external):
        out = []
        for e in external:
            if isinstance(e, MegatronLoRAOptimizer):
                out += [e.inner, e.grad_data, e.main] + ([e.param_data] if e.param_data is not None else [])
            else:
                out.append(e)
        return super().track_external(*out)


def _cfg(t, d, rule="mcore-distopt", **kw):
    c = tp._cfg("bf16", t, **kw)
    world = t * d
    c["layout"].update(world_size=world, mesh_shape=[d, t], mesh_dim_names=["dp", "tp"], tp_size=t, dp_size=d,
                       data_parallel=rule)
    c["id"] = c["id"].replace("-bf16-", "-mixed-bf16-main-grad-").replace(f"-w{t}-", f"-tp{t}-dp{d}-{rule}-")
    c["model_regime"] = "mixed-bf16-main-grad"     # the measured profile's name for what runs (module docstring)
    c["optimizer_impl"] = "fused"
    return c


CONFIGS = [
    _cfg(2, 2),
    _cfg(2, 4),
    _cfg(2, 2, targets=["q_proj", "v_proj"]),
    _cfg(4, 2, rank=8),
    _cfg(2, 2, model="gqa-tiny"),
    _cfg(2, 2, kind="tp+sp"),
    _cfg(2, 2, kind="tp+sp", targets=["q_proj", "v_proj"], model="gqa-tiny"),
    _cfg(2, 2, dropout=0.1),
    _cfg(2, 2, rule="mcore-ddp"),
    _cfg(2, 1),
]


def measure(cfg: dict) -> dict:
    lay = cfg["layout"]
    t, d = lay["tp_size"], lay["dp_size"]
    orig_tp, orig_opt, orig_tracker = mp.apply_tp, harness.build_optimizer, mp.PhaseMemTracker
    info, made = {}, {}

    def apply_tp(model, mesh, sp):
        plan = orig_tp(model, mesh, sp)
        tp.GROUP = mesh.get_group()       # the adapters' mappings over the tp dimension of the (dp, tp) mesh
        info.update(tp.add_adapters(model, cfg, t))
        return plan

    def megatron_optimizer(params, name, impl):    # in place of harness.build_optimizer
        group = dist.new_group(ranks=list(range(0, t * d, t)))       # rank 0's data-parallel group
        made["opt"] = MegatronLoRAOptimizer(params, d, lay["data_parallel"] == "mcore-distopt", group)
        return made["opt"]

    mp.apply_tp, harness.build_optimizer, mp.PhaseMemTracker = apply_tp, megatron_optimizer, Tracker
    try:
        m = mp.measure_parallel(cfg)
    finally:
        mp.apply_tp, harness.build_optimizer, mp.PhaseMemTracker = orig_tp, orig_opt, orig_tracker
        tp.GROUP = None
    opt = made["opt"]
    info.update(megatron={"data_parallel": lay["data_parallel"], "grad_buffer_elements": opt.grad_data.numel(),
                          "padding_elements": opt.padding, "main_shard_elements": opt.main.numel()})
    m["lora"] = info
    return m


document = tp.document_for("measure_lora_tp_dp.py")


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.splitlines()[1], configs=CONFIGS, measure_run=measure,
                        document=document, out=os.path.join(HERE, "tp_dp_measurements.json"),
                        keep_previous="only")


if __name__ == "__main__":
    sys.exit(main())
