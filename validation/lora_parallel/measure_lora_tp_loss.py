#!/usr/bin/env python
"""Measure one rank of Megatron-Bridge's LoRA training under tensor parallelism with Megatron-Core's own loss
(issue 25 items 2 and 4): the logits kept vocab-parallel (each tp rank its V/tp slice, never all-gathered) and
Megatron's unfused vocab-parallel cross-entropy run on them.

    /tmp/pplvenv/bin/python validation/lora_parallel/measure_lora_tp_loss.py --out validation/lora_parallel/tp_loss_measurements.json

The run is measure_lora_tp_dp.py's (Megatron-Bridge's adapters, Megatron-Core's grad buffer and distributed
optimizer, regime ``mixed-bf16-main-grad``; ``../parallel/measure_parallel.py``'s fake process group, rank 0 of a
(dp, tp) world; tensor parallelism with or without sequence parallelism), with two changes:

* the LM head is Megatron-Core's ``output_layer`` as Megatron-Bridge's PEFT leaves it: ``ColumnParallelLinear(h, V,
  gather_output=False)`` with its weight frozen, i.e. ``LinearWithFrozenWeight`` (NVIDIA/Megatron-LM
  d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/core/tensor_parallel/layers.py: ``forward`` ``torch.matmul(input,
  weight.t())``, ``ctx.save_for_backward(weight)`` only; ``backward`` ``grad_output.matmul(weight)`` all-reduced in
  place over tp (``allreduce_dgrad``)): this rank's [V/tp, h] shard of the weight, its output the rank's logits
  shard (b, s, V/tp) in bf16; with sequence parallelism ``linear_with_frozen_weight`` first all-gathers the rank's
  sequence chunk of the final norm's output (``gather_from_sequence_parallel_region``, its backward a reduce-scatter;
  ``allreduce_dgrad`` False), with b = 1 (Megatron's (s, b, h) gather layout is Hugging Face's (b, s, h) only then);
* the loss is ``vocab_parallel_cross_entropy`` (tensor_parallel/cross_entropy.py, ``cross_entropy_loss_fusion=
  False`` as the PEFT recipe sets it, label_smoothing 0) re-implemented line by line below (``MegatronVocabParallelCE``;
  read at the stored NVIDIA/Megatron-LM 00611e6eeb0b09b5ee074750956855215ddbd67f, lines 19-120 the
  ``VocabParallelCrossEntropy`` helpers and 123-235 ``_VocabParallelCrossEntropy``, the same steps as d98e8a6's
  lines 13-210 that measured/published_losses.py cites): the shard upcast once (``.float()``, a new fp32 tensor),
  ``logits_max`` all-reduced (MAX) over tp, the max subtracted in place, the target mask and ``target.clone()`` for
  this rank's vocabulary range [rank V/tp, (rank+1) V/tp), ``predicted_logits`` gathered, exp in place, ``sum_exp``,
  ``predicted_logits`` and ``sum_exp_logits`` all-reduced (SUM) over tp, ``loss = log(sum_exp) - predicted``, the
  softmax made in place (``div_``) and saved with the target mask and the masked target; the backward subtracts the
  one-hot in place in the saved softmax (``grad_2d[arange_1d, masked_target_1d] -= softmax_update``), scales it in
  place and returns it (fp32; autograd casts it to the logits' bf16 beside it).

The targets are the labels shifted by one (Megatron's data loader gives tokens[1:]; the wrap-around position, as in
validation/techniques/loss/measure_published.py), the loss ``losses.sum() / losses.numel()`` (Megatron-Bridge's
``masked_next_token_loss`` with every position in the mask). Needs torch==2.13.0 (CPU), transformers==5.23.0.
"""

from __future__ import annotations

import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure_lora_tp as tp  # noqa: E402  (puts validation/ and validation/parallel/ on sys.path)
import measure_lora_tp_dp as tpdp  # noqa: E402
import measure_parallel as mp  # noqa: E402
import harness  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402


class _FrozenColumnLinear(torch.autograd.Function):
    """layers.py ``LinearWithFrozenWeight`` (no sequence parallelism, ``allreduce_dgrad`` = tp > 1)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(weight)
        return torch.matmul(x, weight.t())

    @staticmethod
    def backward(ctx, grad_output):
        (weight,) = ctx.saved_tensors
        grad_input = grad_output.matmul(weight)
        dist.all_reduce(grad_input, group=tp.GROUP)
        return grad_input, None


class _FrozenColumnLinearSP(torch.autograd.Function):
    """layers.py ``LinearWithFrozenWeight`` under sequence parallelism (``allreduce_dgrad`` False: the input's
    gradient is reduce-scattered by the gather's backward)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(weight)
        return torch.matmul(x, weight.t())

    @staticmethod
    def backward(ctx, grad_output):
        (weight,) = ctx.saved_tensors
        return grad_output.matmul(weight), None


class _GatherFromSP(torch.autograd.Function):
    """mappings.py ``gather_from_sequence_parallel_region(tensor_parallel_output_grad=True)`` (``linear_with_frozen_
    weight`` with ``sequence_parallel``): ``_gather_along_first_dim`` (one all-gather into a new buffer of the whole
    sequence), backward ``_reduce_scatter_along_first_dim`` (a new buffer of the rank's chunk, reduce-scattered into).
    Megatron's sequence is dim 0, Hugging Face's dim 1: with b = 1 the (tp, 1, s/tp, h) buffer is the (1, s, h)
    tensor, as Megatron's (the configurations below use b = 1)."""

    @staticmethod
    def forward(ctx, x):
        world = dist.get_world_size(tp.GROUP)
        b, s, h = x.shape
        assert b == 1, "the sequence-parallel gather is Megatron's layout with b = 1 only"
        buf = torch.empty((world, b, s, h), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(buf, x.contiguous(), group=tp.GROUP)
        return buf.view(b, world * s, h)

    @staticmethod
    def backward(ctx, g):
        world = dist.get_world_size(tp.GROUP)
        b, s, h = g.shape
        out = torch.empty((b, s // world, h), dtype=g.dtype, device=g.device)
        # (b = 1: the (1, s, h) gradient is the (tp, s/tp, h) chunks in order, Megatron's first-dim layout)
        dist.reduce_scatter_tensor(out, g.contiguous().view(world * b, s // world, h), group=tp.GROUP)
        return out


class VocabParallelHead(torch.nn.Module):
    """Megatron-Core's ``output_layer`` (ColumnParallelLinear, gather_output=False) with its weight frozen; ``sp``:
    its input the rank's sequence chunk of the final norm's output, all-gathered first."""

    def __init__(self, weight, sp=False):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.sp = sp

    def forward(self, x):
        if self.sp:
            if isinstance(x, DTensor):      # (the SequenceParallel norm's Shard(1) output: the rank's chunk)
                x = x.to_local()
            return _FrozenColumnLinearSP.apply(_GatherFromSP.apply(x), self.weight)
        return _FrozenColumnLinear.apply(x, self.weight)


class MegatronVocabParallelCE(torch.autograd.Function):
    """tensor_parallel/cross_entropy.py ``_VocabParallelCrossEntropy`` (label_smoothing 0) over ``tp.GROUP``."""

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target):
        group = tp.GROUP
        # VocabParallelCrossEntropy.calculate_logits_max
        vocab_parallel_logits = vocab_parallel_logits.float()
        logits_max = torch.max(vocab_parallel_logits, dim=-1)[0]
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        # VocabUtility.vocab_range_from_per_partition_vocab_size
        partition_vocab_size = vocab_parallel_logits.size()[-1]
        rank = dist.get_rank(group)
        vocab_start_index = rank * partition_vocab_size
        vocab_end_index = vocab_start_index + partition_vocab_size
        # VocabParallelCrossEntropy.calculate_predicted_logits
        vocab_parallel_logits -= logits_max.unsqueeze(dim=-1)
        target_mask = (target < vocab_start_index) | (target >= vocab_end_index)
        masked_target = target.clone() - vocab_start_index
        masked_target[target_mask] = 0
        logits_2d = vocab_parallel_logits.view(-1, partition_vocab_size)
        masked_target_1d = masked_target.view(-1)
        arange_1d = torch.arange(start=0, end=logits_2d.size()[0], device=logits_2d.device)
        predicted_logits_1d = logits_2d[arange_1d, masked_target_1d]
        predicted_logits_1d = predicted_logits_1d.clone().contiguous()
        predicted_logits = predicted_logits_1d.view_as(target)
        predicted_logits[target_mask] = 0.0
        exp_logits = vocab_parallel_logits
        torch.exp(vocab_parallel_logits, out=exp_logits)
        sum_exp_logits = exp_logits.sum(dim=-1)
        dist.all_reduce(predicted_logits, op=dist.ReduceOp.SUM, group=group)
        dist.all_reduce(sum_exp_logits, op=dist.ReduceOp.SUM, group=group)
        # VocabParallelCrossEntropy.calculate_cross_entropy_loss
        loss = torch.log(sum_exp_logits) - predicted_logits
        exp_logits.div_(sum_exp_logits.unsqueeze(dim=-1))
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        # prepare_gradient_calculation_operands
        grad_input = softmax
        partition_vocab_size = softmax.size()[-1]
        grad_2d = grad_input.view(-1, partition_vocab_size)
        arange_1d = torch.arange(start=0, end=grad_2d.size()[0], device=grad_2d.device)
        softmax_update = 1.0 - target_mask.view(-1).float()
        # calculate_gradients
        grad_2d[arange_1d, masked_target_1d] -= softmax_update
        grad_input.mul_(grad_output.unsqueeze(dim=-1))
        return grad_input, None


def use_megatron_loss(model, sp=False):
    """The LM head replaced by its frozen vocab-parallel shard, the forward by Megatron's loss on it."""
    w = model.lm_head.weight
    model.lm_head = VocabParallelHead(w.to_local() if isinstance(w, DTensor) else w, sp)
    base = model.model

    def forward(input_ids=None, labels=None, use_cache=False, **kw):
        hidden = base(input_ids=input_ids, use_cache=use_cache, **kw)[0]
        logits = model.lm_head(hidden)
        target = torch.cat((labels[:, 1:], labels[:, :1]), dim=1)
        losses = MegatronVocabParallelCE.apply(logits, target)
        del hidden, logits
        return types.SimpleNamespace(loss=losses.sum() / losses.numel())
    model.forward = forward
    return {"loss": "megatron_vocab_parallel", "lm_head": "ColumnParallelLinear(gather_output=False), frozen "
            "(LinearWithFrozenWeight): the rank's V/tp logits, never all-gathered"}


def _cfg(t, d, **kw):
    c = tpdp._cfg(t, d, **kw)
    c["id"] = c["id"].replace("lora-tp-", "lora-tp-megatron_vocab_parallel-").replace(
        "lora-tpsp-", "lora-tpsp-megatron_vocab_parallel-")
    c["loss"] = "megatron_vocab_parallel"
    return c


CONFIGS = [
    _cfg(2, 1),
    _cfg(2, 4),
    _cfg(2, 2, targets=["q_proj", "v_proj"]),
    _cfg(4, 2, rank=8),
    _cfg(2, 2, model="gqa-tiny"),
    _cfg(2, 2, rule="mcore-ddp"),
    # sequence parallelism (b = 1: Megatron's gather layout, _GatherFromSP)
    _cfg(2, 2, kind="tp+sp", b=1),
    _cfg(2, 2, kind="tp+sp", targets=["q_proj", "v_proj"], model="gqa-tiny", b=1),
]


def measure(cfg: dict) -> dict:
    orig = mp.apply_tp
    head = {}

    def apply_tp(model, mesh, sp):
        plan = orig(model, mesh, sp)
        head.update(use_megatron_loss(model, sp))
        return plan
    mp.apply_tp = apply_tp          # measure_lora_tp_dp.measure wraps this one (adapters after it)
    try:
        m = tpdp.measure(cfg)
    finally:
        mp.apply_tp = orig
    m["lora"].update(head)
    return m


document = tp.document_for("measure_lora_tp_loss.py")


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.splitlines()[1], configs=CONFIGS, measure_run=measure,
                        document=document, out=os.path.join(HERE, "tp_loss_measurements.json"),
                        keep_previous="only")


if __name__ == "__main__":
    sys.exit(main())
