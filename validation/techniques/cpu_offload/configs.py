"""torchao's CPUOffloadOptimizer runs (schema of ``validation/configs.py``, plus ``technique``,
``solve_options``: the solve keywords the run is predicted with, and ``technique_options``: the
keywords the harness passes to ``CPUOffloadOptimizer``).

Models: the Llama-style dense model (GQA) and the Mixtral-style MoE of ``../offload/configs.py``,
each at two sizes, real tensors on the CPU. ``optimizer_impl`` is the implementation of both the
host optimizers and the device optimizer of the small tensors (torchao passes the same keywords to
both; its default is ``fused=True``).
"""

from __future__ import annotations

import copy
import importlib.util
import os

_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "offload", "configs.py")
_spec = importlib.util.spec_from_file_location("offload_configs", _path)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)           # ../offload/configs.py (the model shapes)
MODELS = _base.MODELS                     # gqa-tiny, gqa-wide, mixtral-tiny, mixtral-wide


def _cfg(id, model, mode, *, regime="fp32", optimizer_impl="fused", checkpointing="none", b=1, s=128,
         minimal_size=4096):
    family, base = MODELS[model]
    hf = copy.deepcopy(base)
    hf["use_cache"] = False
    hf["attention_dropout"] = 0.0
    gradients = mode == "torchao+gradients"
    return {"id": id, "family": family, "model": model, "hf_config": hf, "batch_size": b, "seq_len": s,
            "regime": regime, "optimizer": "adamw", "optimizer_impl": optimizer_impl, "checkpointing": checkpointing,
            "attention": "sdpa", "dropout": 0.0, "method": "real", "sweep": None, "technique": "cpu_offload",
            "solve_options": {"offload": mode} if mode else {},
            "technique_options": {"offload_gradients": gradients, "minimal_size": minimal_size,
                                  "optimizer_kwargs": ({} if optimizer_impl == "fused" else
                                                       {"fused": False, "foreach": optimizer_impl == "foreach"})}}


CONFIGS = []
for _m in MODELS:
    CONFIGS += [_cfg(f"torchao-{_m}-fp32", _m, "torchao"),
                _cfg(f"torchao-grads-{_m}-fp32", _m, "torchao+gradients")]
CONFIGS += [
    _cfg("torchao-gqa-tiny-bf16", "gqa-tiny", "torchao", regime="bf16"),
    _cfg("torchao-grads-gqa-tiny-bf16", "gqa-tiny", "torchao+gradients", regime="bf16"),
    _cfg("torchao-grads-gqa-tiny-amp", "gqa-tiny", "torchao+gradients", regime="amp-bf16"),
    _cfg("torchao-gqa-wide-fp32-foreach", "gqa-wide", "torchao", optimizer_impl="foreach"),
    _cfg("torchao-grads-gqa-wide-fp32-ckpt", "gqa-wide", "torchao+gradients", checkpointing="full"),
    _cfg("torchao-grads-mixtral-tiny-fp32-b2-s256", "mixtral-tiny", "torchao+gradients", b=2, s=256),
    # The harness's control: minimal_size above every tensor keeps them all on the device with the
    # device optimizer (d_opt), which must measure as the plain run the profile predicts without offload.
    _cfg("control-all-on-device-gqa-tiny-fp32", "gqa-tiny", None, minimal_size=10**12),
]
