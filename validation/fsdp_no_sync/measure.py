#!/usr/bin/env python
"""FSDP gradient accumulation without communication, one rank of a fake process-group world, every phase measured.

    /tmp/valvenv/bin/python validation/fsdp_no_sync/measure.py --out validation/fsdp_no_sync/measurements.json

The environment is ../README.md's (torch==2.13.0 CPU, transformers==5.23.0). Each configuration plays rank ``r`` of
a world of ``W`` ranks (``init_process_group("fake", store=FakeStore(), ...)``: collectives allocate their outputs
and move no data, as validation/parallel/measure_parallel.py does) and shards a Hugging Face Llama built from its
config (``../configs.py``'s shapes) in one of two ways:

- ``fsdp1``: ``FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
  sharding_strategy=FULL_SHARD, use_orig_params=False, device_id=cpu)``: what Lightning's ``FSDPStrategy`` builds
  for LitGPT's ``finetune_full`` (``auto_wrap_policy={Block}``). FSDP1 needs ``device_id`` on the CPU (without it
  ``_init_device_handle`` asks for an accelerator). Accumulation: the first m-1 micro-batches inside
  ``model.no_sync()`` (what Lightning Fabric's ``no_backward_sync`` turns into for FSDP1), the last outside.
- ``fsdp2``: ``fully_shard`` on every decoder layer and on the model (reshard_after_forward=True, the ``fsdp``
  rule); accumulation: ``model.set_requires_gradient_sync(False)`` for the first m-1 micro-batches, ``True`` for
  the last.
- ``hsdp1`` / ``hsdp2``: the same with HYBRID_SHARD over a (replicate 2, shard 2) CPU device mesh (the ``hsdp``
  rule with ``shard_group_size=2``).
- ``gradop1`` / ``gradop2``: SHARD_GRAD_OP (the ``fsdp-grad-op`` rule): FSDP1 with
  ``sharding_strategy=SHARD_GRAD_OP`` (accumulating inside ``no_sync()``), FSDP2 with ``reshard_after_forward=False``
  on every layer and the model (``set_requires_gradient_sync(False)``).
- regime ``fsdp-bf16-reduce-bf16`` (``fsdp1`` / ``fsdp2``): accelerate's FSDP mixed precision bf16 over fp32
  parameters: FSDP1 ``MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16)``, FSDP2
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)`` (``mixed_precision`` below).
- regime ``fsdp-fp16-reduce-fp16`` (``fsdp1`` / ``fsdp2``): the same policy in fp16 (accelerate's
  ``mixed_precision: fp16``) with the loss scaler accelerate 1.16.0 builds for it (accelerator.py lines 536-555):
  FSDP1 torch's ``ShardedGradScaler``, FSDP2 ``torch.amp.GradScaler`` (utils/fsdp_utils.py ``get_fsdp2_grad_scaler``),
  driven as the Trainer drives it through accelerate: ``scaler.scale(loss).backward()`` (``Accelerator.backward``),
  then ``scaler.unscale_(optimizer)`` (``clip_grad_norm_``'s ``unscale_gradients``), ``scaler.step(optimizer)``,
  ``scaler.update()`` (``AcceleratedOptimizer.step``), all in the ``optimizer`` phase (``Scaled`` below). The
  scaler runs on the CPU (``device="cpu"``): its update takes the CPU branch (``_amp_update_scale_cpu_``), which
  replaces the 4-byte growth tracker instead of updating it in place; every fp16 op used has a CPU kernel.

The protocol is ../harness.py's ``run_protocol`` (two warm-up iterations, the third measured; AdamW foreach;
``zero_grad(set_to_none=True)``; ``loss = model(input_ids, labels=input_ids).loss / m``), the model called through
``SyncSwitch``, which switches the synchronization per micro-batch as above, inside ``harness.PhaseMemTracker`` (PyTorch's ``MemTracker``, eager, no
compile). Each micro-batch's forward and backward is a phase of its own (``forward.0``, ``backward.0``, ...);
``forward`` and ``backward`` are their maxima. With m = 1 nothing is accumulated (the baseline of each layout).
"""

from __future__ import annotations

import os
import platform
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
sys.path.insert(0, VALIDATION)

import configs as _configs  # noqa: E402
import harness  # noqa: E402  (validation/harness.py)
from fakepg import fake_world  # noqa: E402  (validation/fakepg.py)

import torch  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import (FullyShardedDataParallel, MixedPrecision, MixedPrecisionPolicy,  # noqa: E402
                                    ShardingStrategy, fully_shard)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaDecoderLayer  # noqa: E402

OUT = os.path.join(HERE, "measurements.json")
GENERATOR = "/tmp/valvenv/bin/python validation/fsdp_no_sync/measure.py --out validation/fsdp_no_sync/measurements.json"


def _cfg(kind, model, world, rank, m, *, regime="fp32", b=2, s=256):
    return {
        "id": f"{kind}-{model}-{regime}-w{world}-r{rank}-m{m}-b{b}-s{s}",
        "kind": kind,
        "model": model,
        "family": _configs.MODELS[model][0],
        "hf_config": _configs._hf(_configs.MODELS[model][1], 0.0),
        "world_size": world,
        "rank": rank,
        "microbatches": m,
        "regime": regime,
        "optimizer": "adamw",
        "optimizer_impl": "foreach",
        "batch_size": b,
        "seq_len": s,
        "attention": "sdpa",
        "method": "real",
    }


# accelerate's FSDP mixed precision (1.16.0 utils/dataclasses.py lines 2008-2013, set_mixed_precision("bf16"):
# param_dtype = reduce_dtype = bf16, FSDP1's buffer_dtype too), over the fp32 parameters accelerate upcasts to
# (accelerator.py line 1970 for FSDP1, utils/fsdp_utils.py line 801 for FSDP2): the profile's regime of that name.
ACCELERATE_MP = "fsdp-bf16-reduce-bf16"
# The same policy in fp16 (set_mixed_precision("fp16"): param_dtype = reduce_dtype = fp16), with accelerate's loss
# scaler: the profile's fsdp-fp16-reduce-fp16.
ACCELERATE_MP_FP16 = "fsdp-fp16-reduce-fp16"
POLICY_DTYPE = {ACCELERATE_MP: torch.bfloat16, ACCELERATE_MP_FP16: torch.float16}


def mixed_precision(kind: str, regime: str) -> dict:
    """The sharding call's mixed-precision keyword for ``regime`` (none but accelerate's 16-bit policies)."""
    dtype = POLICY_DTYPE.get(regime)
    if dtype is None:
        return {}
    if kind.endswith("1"):
        return {"mixed_precision": MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)}
    return {"mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)}


def grad_scaler(kind: str):
    """accelerate 1.16.0's loss scaler for fp16 (accelerator.py lines 536-555): FSDP1 ``ShardedGradScaler``
    (utils/modeling.py ``get_grad_scaler``), FSDP2 the plain ``torch.amp.GradScaler`` (``get_fsdp2_grad_scaler``),
    both with their defaults (init_scale 2**16), on this run's device."""
    if kind.endswith("1"):
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        return ShardedGradScaler(device="cpu")
    from torch.amp.grad_scaler import GradScaler
    return GradScaler(device="cpu")


class Scaled:
    """The model and optimizer as the Trainer drives them with a loss scaler (transformers 5.23.0 through
    accelerate 1.16.0): the loss scaled before its backward (``Accelerator.backward``: ``scaler.scale(loss)
    .backward()``), and the step ``unscale_`` (``Accelerator.clip_grad_norm_`` -> ``unscale_gradients``), ``step``,
    ``update`` (``AcceleratedOptimizer.step``). ``steps``/``skipped``: the scaler's steps and those it skipped
    (inf/NaN found)."""

    def __init__(self, model, optimizer, scaler):
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.steps = self.skipped = 0

    def __call__(self, **kwargs):
        out = self.model(**kwargs)
        out.loss = self.scaler.scale(out.loss)
        return out

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self):
        self.scaler.unscale_(self.optimizer)
        found = sum(v.item() for v in self.scaler._per_optimizer_states[id(self.optimizer)]
                    ["found_inf_per_device"].values())
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.steps += 1
        self.skipped += int(found > 0)


CONFIGS = [_cfg(kind, model, 4, 0, m, regime=regime)
           for kind in ("fsdp1", "fsdp2")
           for model, regime in (("gqa-tiny", "fp32"), ("gqa-tiny", "bf16"), ("llama-tiny", "fp32"))
           for m in (1, 4)] + [_cfg(kind, "gqa-tiny", 4, 0, m) for kind in ("hsdp1", "hsdp2") for m in (1, 4)] + [
    _cfg(kind, "gqa-tiny", 4, 0, m, regime=regime) for kind in ("gradop1", "gradop2") for regime in ("fp32", "bf16")
    for m in (1, 4)] + [
    _cfg(kind, "gqa-tiny", 4, 0, m, regime=ACCELERATE_MP) for kind in ("fsdp1", "fsdp2") for m in (1, 4)] + [
    _cfg(kind, "gqa-tiny", 4, 0, m, regime=ACCELERATE_MP_FP16) for kind in ("fsdp1", "fsdp2") for m in (1, 4)]
SHARD_GROUP = 2     # the HSDP runs: 2 replicas of a 2-rank shard group (a (replicate, shard) device mesh)


def shard(model, kind: str, world: int, regime: str = "fp32"):
    mesh = (init_device_mesh("cpu", (world // SHARD_GROUP, SHARD_GROUP), mesh_dim_names=("replicate", "shard"))
            if kind.startswith("hsdp") else None)
    if kind in ("fsdp1", "hsdp1", "gradop1"):
        strategy = (ShardingStrategy.HYBRID_SHARD if mesh is not None else ShardingStrategy.SHARD_GRAD_OP
                    if kind == "gradop1" else ShardingStrategy.FULL_SHARD)
        return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
                                        sharding_strategy=strategy, use_orig_params=False,
                                        device_id=torch.device("cpu"), device_mesh=mesh,
                                        **mixed_precision(kind, regime))
    kw = {**({} if mesh is None else {"mesh": mesh}), **mixed_precision(kind, regime)}
    reshard = kind != "gradop2"
    for layer in model.model.layers:
        fully_shard(layer, reshard_after_forward=reshard, **kw)
    fully_shard(model, **kw, **({} if reshard else {"reshard_after_forward": False}))
    return model


class SyncSwitch:
    """The model as ``harness.run_protocol`` calls it, switching the gradient synchronization per micro-batch:
    calls 1 .. m-1 of each iteration without sync (FSDP1: inside ``no_sync()``, entered here and left at the next
    call, after that micro-batch's backward; FSDP2: ``set_requires_gradient_sync(False)``), the m-th with it."""

    def __init__(self, model, kind: str, m: int):
        self.model, self.kind, self.m, self.calls, self.context = model, kind, m, 0, None

    def __call__(self, **kwargs):
        if self.context is not None:
            self.context.__exit__(None, None, None)
            self.context = None
        last = self.calls % self.m == self.m - 1
        self.calls += 1
        if self.kind in ("fsdp1", "hsdp1", "gradop1"):
            if not last:
                self.context = self.model.no_sync()
                self.context.__enter__()
        else:
            self.model.set_requires_gradient_sync(last)
        return self.model(**kwargs)


def micro_batch_maxima(record: dict) -> None:
    """``forward`` and ``backward`` in ``record``'s phases: the largest of their micro-batches' (``forward.0``,
    ``forward.1``, ...; each micro-batch's forward and backward is a phase of its own)."""
    phases = record["peak_by_phase"]
    for name in ("forward", "backward"):
        each = {k: v for k, v in phases.items() if k.startswith(name + ".")}
        if each:
            phases[name] = max(each.values(), key=lambda v: v["bytes"])


def measure(cfg: dict) -> dict:
    t0 = time.perf_counter()
    with fake_world(cfg["rank"], cfg["world_size"]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, input_ids = harness.build_model(cfg)
            parameters = sum(p.numel() for p in model.parameters())
            model = shard(model, cfg["kind"], cfg["world_size"], cfg["regime"])
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = harness.build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])
            mt = harness.PhaseMemTracker()
            mt.track_external(model, optimizer, input_ids)
            run_model, run_optimizer = SyncSwitch(model, cfg["kind"], cfg["microbatches"]), optimizer
            scaled = None
            if cfg["regime"] == ACCELERATE_MP_FP16:
                scaled = Scaled(run_model, optimizer, grad_scaler(cfg["kind"]))
                run_model = run_optimizer = scaled
            alive, _ = harness.run_protocol(mt, run_model, run_optimizer, input_ids,
                                            microbatches=cfg["microbatches"])
            record = harness.peak_record(mt)
            micro_batch_maxima(record)
            flat = [p for p in model.parameters()]
            if scaled is not None:
                record["grad_scaler"] = {"class": type(scaled.scaler).__name__, "steps": scaled.steps,
                                         "skipped_steps": scaled.skipped,
                                         "scale": float(scaled.scaler.get_scale())}
            return {**record, "alive": alive, "parameters_global": int(parameters),
                    "local_parameter_bytes": int(sum(p.numel() * p.element_size() for p in flat)),
                    "wall_s": round(time.perf_counter() - t0, 1)}


def document(args, runs, ctx) -> dict:
    return {
        "description": "FSDP1 no_sync() and FSDP2 set_requires_gradient_sync(False) gradient accumulation: one rank "
                       "of a fake process-group world, every phase (validation/fsdp_no_sync/measure.py's docstring)",
        "generator": GENERATOR,
        "environment": {"setup": harness.ENVIRONMENT, "python": platform.python_version(),
                        **harness.versions("torch", "transformers")},
        "runs": runs,
    }


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__, configs=CONFIGS, measure_run=measure, document=document,
                        out=OUT)


if __name__ == "__main__":
    sys.exit(main())
