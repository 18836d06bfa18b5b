#!/usr/bin/env python
"""peft LoRA under FSDP1 (``FullyShardedDataParallel``, ``use_orig_params=True``), one rank of a fake process-group
world, every phase measured (issue 25, item 2).

    /tmp/tvenv/bin/python validation/lora_fsdp1/measure.py --out validation/lora_fsdp1/measurements.json

The environment: torch==2.13.0 (CPU), transformers==5.23.0, peft==0.22.0, accelerate==1.16.0 (the file's
``environment``). Each configuration plays rank 0 of a world of 2 (``init_process_group("fake", store=FakeStore())``:
collectives allocate their outputs and move no data, as ../fsdp_no_sync/measure.py, whose protocol this is). The
model: ../configs.py's ``gqa-tiny`` Llama (h 256, 4 layers, 8 heads, 2 KV heads, MLP 688, vocab 32,000), built from
its config in fp32, then ``peft.get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
target_modules=<every linear of the decoder layers>))`` (the base frozen, the adapters trainable, as HF Trainer
receives a PEFT model), then wrapped as accelerate 1.16.0's ``Accelerator.prepare_model`` wraps it for FSDP1
(accelerate/accelerator.py, the ``DistributedType.FSDP`` branch: ``FSDP(model, sharding_strategy=...,
auto_wrap_policy=fsdp_plugin.auto_wrap_policy, mixed_precision=fsdp_plugin.mixed_precision_policy,
use_orig_params=..., device_id=...)``):

- ``wrap="peft"``: ``auto_wrap_policy=peft.utils.other.fsdp_auto_wrap_policy(model)`` (an ``_or_policy`` of a
  ``lambda_auto_wrap_policy`` wrapping every leaf module whose weight requires grad, i.e. each ``lora_A`` /
  ``lora_B`` linear, and ``transformer_auto_wrap_policy`` over ``_no_split_modules``, here ``LlamaDecoderLayer``).
  This is what HF Trainer gives accelerate for a PEFT model: transformers 5.23.0 trainer.py (``if
  self.is_fsdp_enabled and _is_peft_model(self.model): update_fsdp_plugin_peft(self.model, self.accelerator)``)
  and transformers/distributed/fsdp.py ``update_fsdp_plugin_peft``: ``accelerator.state.fsdp_plugin.auto_wrap_policy
  = fsdp_auto_wrap_policy(model)``; accelerate's ``set_auto_wrap_policy`` (utils/dataclasses.py) leaves a policy
  that is neither ``transformer_auto_wrap_policy`` nor ``size_based_auto_wrap_policy`` as it is.
- ``wrap="layer"``: ``transformer_auto_wrap_policy`` over ``LlamaDecoderLayer`` alone: what accelerate builds by
  itself (``set_auto_wrap_policy``: ``TRANSFORMER_BASED_WRAP`` with ``transformer_cls_names_to_wrap`` from the
  model's ``_no_split_modules``) when a PEFT model is prepared outside HF Trainer (a script calling
  ``accelerator.prepare`` directly). Each decoder layer's flat parameter then holds its frozen weights and its
  adapters together (mixed ``requires_grad``, allowed only with ``use_orig_params=True``).

QLoRA (``qlora-*``, peft's wrap, accelerate's bf16): the model built in bf16, saved and reloaded with
``BitsAndBytesConfig(load_in_4bit=True, nf4, double quantization, bnb_4bit_quant_storage=bfloat16)`` (FSDP flattens
floating tensors only; ``_quantized``), bitsandbytes 0.50.2 quantizing on the CPU.

Sharding strategies: ``FULL_SHARD`` (kind ``fsdp1``) and ``SHARD_GRAD_OP`` (kind ``gradop1``). Precision:
``fp32`` (no policy) and ``accel-bf16`` (accelerate's ``mixed_precision="bf16"`` for FSDP1: ``set_mixed_precision``
builds ``MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16)``, the model's parameters stay fp32,
and ``prepare_model`` wraps the forward in ``torch.autocast(bf16)`` and ``convert_outputs_to_fp32``, done here
with ``torch.autocast`` as accelerate's ``get_mixed_precision_context_manager`` makes it and accelerate's own
``convert_outputs_to_fp32``); and ``mp-bf16``, the same ``MixedPrecision`` without the autocast and the conversion
(to tell FSDP1's part from accelerate's). Accumulation: m = 1,
or m = 2 with the first micro-batch inside ``model.no_sync()`` (accelerate's ``accumulate()`` /
``no_sync`` for FSDP1, ``sync_each_batch`` False), ../fsdp_no_sync/measure.py's ``SyncSwitch``.

The protocol is ../harness.py's ``run_protocol`` (two warm-up iterations, the third measured; AdamW foreach over
the parameters that require grad; ``zero_grad(set_to_none=True)``; ``loss = model(input_ids, labels=input_ids).loss
/ m``), inside ``FrozenAwareMemTracker`` (PyTorch's ``MemTracker``, its gradient hooks on the
trainable leaf parameters only). Each micro-batch's forward and backward is a
phase of its own; ``forward`` and ``backward`` are their maxima.
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

import harness  # noqa: E402  (validation/harness.py)
from fakepg import fake_world  # noqa: E402  (validation/fakepg.py)
from measure_lora import FrozenAwareMemTracker  # noqa: E402  (grad hooks on the trainable leaf parameters only)

# ../fsdp_no_sync/measure.py: its configurations, SyncSwitch and the micro-batches' phase maxima
NO_SYNC = harness.load("fsdp_no_sync_measure", os.path.join(VALIDATION, "fsdp_no_sync", "measure.py"))
SyncSwitch = NO_SYNC.SyncSwitch

import torch  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy  # noqa: E402
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaDecoderLayer  # noqa: E402

OUT = os.path.join(HERE, "measurements.json")
GENERATOR = "/tmp/tvenv/bin/python validation/lora_fsdp1/measure.py --out validation/lora_fsdp1/measurements.json"
SETUP = ("python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install torch==2.13.0 transformers==5.23.0 peft==0.22.0 "
         "accelerate==1.16.0 bitsandbytes==0.50.2 (CPU wheels)")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _cfg(kind, wrap, regime, m, *, model="gqa-tiny", world=2, rank=0, b=2, s=256, r=16, quantization=None):
    """../fsdp_no_sync/measure.py's configuration, with the wrap and the adapters."""
    return {
        **NO_SYNC._cfg(kind, model, world, rank, m, regime=regime, b=b, s=s),
        "id": f"{'q' if quantization else ''}lora-{kind}-{wrap}-{model}-{regime}-w{world}-r{rank}-m{m}-b{b}-s{s}",
        "wrap": wrap,
        "lora": {"rank": r, "alpha": 2 * r, "dropout": 0.0, "target_modules": TARGETS, "quantization": quantization,
                 "double_quant": bool(quantization)},
    }


CONFIGS = [_cfg(kind, wrap, regime, m)
           for wrap in ("peft", "layer")
           for kind in ("fsdp1", "gradop1")
           for regime in ("fp32", "accel-bf16")
           for m in (1, 2)] + [
    # the same MixedPrecision without accelerate's autocast (which part of accel-bf16 is FSDP1's, which autocast's)
    _cfg("fsdp1", "peft", "mp-bf16", 1), _cfg("fsdp1", "layer", "mp-bf16", 1)] + [
    # QLoRA (nf4, double quantization) as HF Trainer runs it under FSDP1: the base loaded in bf16 with
    # bnb_4bit_quant_storage=bfloat16 (FSDP flattens floating tensors only), MixedPrecision in that dtype
    # (transformers' update_fsdp_plugin_peft: set_mixed_precision(bnb_4bit_quant_storage, override=True)) under
    # accelerate's bf16 autocast; peft's wrap
    _cfg("fsdp1", "peft", "accel-bf16", m, quantization="nf4") for m in (1, 2)]


def shard(model, kind: str, wrap: str, regime: str):
    from peft.utils.other import fsdp_auto_wrap_policy
    policy = fsdp_auto_wrap_policy(model) if wrap == "peft" else ModuleWrapPolicy({LlamaDecoderLayer})
    mp = (MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
          if regime in ("accel-bf16", "mp-bf16") else None)
    strategy = ShardingStrategy.SHARD_GRAD_OP if kind == "gradop1" else ShardingStrategy.FULL_SHARD
    return FullyShardedDataParallel(model, auto_wrap_policy=policy, sharding_strategy=strategy, mixed_precision=mp,
                                    use_orig_params=True, device_id=torch.device("cpu"))


def _quantized(model, cfg):
    """The bf16 model saved and reloaded 4-bit (bitsandbytes 0.50.2 quantizes on the CPU), the packed codes stored as
    bf16 (``bnb_4bit_quant_storage``) so that FSDP can flatten them with the bf16 norms."""
    import tempfile
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=cfg["lora"]["quantization"],
                             bnb_4bit_use_double_quant=cfg["lora"]["double_quant"],
                             bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        del model
        return AutoModelForCausalLM.from_pretrained(tmp, quantization_config=bnb, dtype=torch.bfloat16,
                                                    attn_implementation=cfg["attention"], device_map="cpu")


class Accelerated:
    """accelerate's forward under ``mixed_precision="bf16"`` (accelerator.py ``prepare_model``: ``model.forward =
    convert_outputs_to_fp32(autocast_context(model_forward_func))``), around the ``SyncSwitch`` call."""

    def __init__(self, inner):
        from accelerate.utils import convert_outputs_to_fp32
        self.inner = inner
        self.call = convert_outputs_to_fp32(self._autocast)

    def _autocast(self, **kw):
        # accelerate/utils/modeling.py get_mixed_precision_context_manager: mixed_precision "bf16" under
        # DistributedType.FSDP: torch.autocast(device_type=state.device.type, dtype=torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.inner(**kw)

    def __call__(self, **kwargs):
        return self.call(**kwargs)


def measure(cfg: dict) -> dict:
    from peft import LoraConfig, get_peft_model
    t0 = time.perf_counter()
    with fake_world(cfg["rank"], cfg["world_size"]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lora = cfg["lora"]
            model, input_ids = harness.build_model({**cfg, "regime": "bf16" if lora["quantization"] else "fp32"})
            if lora["quantization"]:
                model = _quantized(model, cfg)
            model = get_peft_model(model, LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"],
                                                     lora_dropout=lora["dropout"],
                                                     target_modules=lora["target_modules"], bias="none"))
            parameters = sum(p.numel() for p in model.parameters())
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            model = shard(model, cfg["kind"], cfg["wrap"], cfg["regime"])
            units = sum(1 for _ in FullyShardedDataParallel.fsdp_modules(model))
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = harness.build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])
            mt = FrozenAwareMemTracker()
            mt.track_external(model, optimizer, input_ids)
            call = SyncSwitch(model, cfg["kind"], cfg["microbatches"])
            if cfg["regime"] == "accel-bf16":
                call = Accelerated(call)
            alive, _ = harness.run_protocol(mt, call, optimizer, input_ids, microbatches=cfg["microbatches"])
            record = harness.peak_record(mt)
            NO_SYNC.micro_batch_maxima(record)
            flat = [h.flat_param for h in (u._handle for u in FullyShardedDataParallel.fsdp_modules(model))
                    if h is not None]
            return {**record, "alive": alive, "parameters_global": int(parameters),
                    "trainable_parameters_global": int(trainable), "fsdp_units": units,
                    "local_flat_parameter_bytes": int(sum(p.numel() * p.element_size() for p in flat)),
                    "wall_s": round(time.perf_counter() - t0, 1)}


def _versions() -> dict:
    return harness.versions("transformers", "peft", "accelerate", "bitsandbytes")


def document(args, runs, ctx) -> dict:
    return {
        "description": "peft LoRA under FSDP1 (use_orig_params=True; peft's fsdp_auto_wrap_policy or the decoder "
                       "layers alone; FULL_SHARD and SHARD_GRAD_OP; fp32 and accelerate's bf16; with and without "
                       "no_sync() accumulation): rank 0 of a fake process-group world of 2, every phase "
                       "(validation/lora_fsdp1/measure.py's docstring)",
        "generator": GENERATOR,
        "environment": {"setup": SETUP, "python": platform.python_version(), **_versions()},
        "runs": runs,
    }


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, out=OUT, versions=_versions, incremental=True)


if __name__ == "__main__":
    sys.exit(main())
