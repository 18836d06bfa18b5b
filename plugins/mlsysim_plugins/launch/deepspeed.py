"""A DeepSpeed config JSON as a launch format (docs/launch-hf.md): ZeRO stage, offload, the
16-bit engine, the batch, and the buckets (``"auto"`` resolved as transformers' DeepSpeed
integration resolves it when the model is known; DeepSpeed's defaults from
deepspeed/runtime/zero/config.py otherwise)."""

from __future__ import annotations

from mlsysim_core import hookimpl

from .hookspecs import LaunchFormatSpec
from . import _hf

DS_KEYS = {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "zero_allow_untested_optimizer"}


def recognizes(path, document) -> bool:
    return isinstance(document, dict) and bool(DS_KEYS & set(document))


def read(path, document, context):
    r = _hf.Reading("deepspeed", path, _hf.DEEPSPEED, context)
    _hf.deepspeed(r, "", document, trainer=None, model=None)
    return r.done()


@hookimpl
def mlsysim_launch_formats():
    return [LaunchFormatSpec(name="deepspeed", description="DeepSpeed config JSON (ZeRO, offload, bf16/fp16, "
                             "batch, buckets)", framework="DeepSpeed", suffixes=(".json",), recognizes=recognizes,
                             read=read)]
