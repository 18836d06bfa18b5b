"""The offload and optimizer-in-backward runs (schema of ``validation/configs.py``, plus
``technique``, ``solve_options``: the solve keywords the run is predicted with, and
``technique_options``: how the harness applies the technique).

Models: a Llama-style dense model (GQA) and a Mixtral-style MoE, each at two sizes, real
tensors on the CPU, b = 2, s = 256. Every run is also predicted with the options in
``solve_options`` (``tests/measured/test_technique_offload.py``).
"""

from __future__ import annotations

import copy
import importlib.util
import os

_path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs.py")
_spec = importlib.util.spec_from_file_location("validation_configs", _path)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)           # validation/configs.py (the model shapes)
GQA_TINY, MIXTRAL_TINY, _llama, _mixtral = _base.GQA_TINY, _base.MIXTRAL_TINY, _base._llama, _base._mixtral

MODELS = {
    "gqa-tiny": ("llama-gqa", GQA_TINY),                                   # h 256, L 4, V 32,000
    "gqa-wide": ("llama-gqa", _llama(512, 1376, 6, 8, 4, 8000)),           # h 512, L 6, V 8,000
    "mixtral-tiny": ("mixtral", MIXTRAL_TINY),                             # h 256, L 4, 8 experts, V 32,000
    "mixtral-wide": ("mixtral", _mixtral(384, 768, 4, 8, 2, 8000, experts=4)),   # h 384, L 4, 4 experts, V 8,000
}


def _cfg(id, model, technique, solve_options, *, regime="fp32", optimizer_impl="foreach", checkpointing="none",
         b=2, s=256, **technique_options):
    family, base = MODELS[model]
    hf = copy.deepcopy(base)
    hf["use_cache"] = False
    hf["attention_dropout"] = 0.0
    return {"id": id, "family": family, "model": model, "hf_config": hf, "batch_size": b, "seq_len": s,
            "regime": regime, "optimizer": "adamw", "optimizer_impl": optimizer_impl, "checkpointing": checkpointing,
            "attention": "sdpa", "dropout": 0.0, "method": "real", "sweep": None, "technique": technique,
            "solve_options": solve_options, "technique_options": technique_options}


OIB = {"optimizer_in_backward": True}
CONFIGS = []
for _m in MODELS:
    CONFIGS += [
        _cfg(f"oib-{_m}-fp32-foreach", _m, "optimizer_in_backward", OIB, b=1, s=128),
    ]
CONFIGS += [
    _cfg("oib-gqa-tiny-fp32-foreach-b2-s256", "gqa-tiny", "optimizer_in_backward", OIB),
    _cfg("oib-gqa-tiny-fp32-for-loop", "gqa-tiny", "optimizer_in_backward", OIB, optimizer_impl="for-loop", b=1, s=128),
    _cfg("oib-gqa-tiny-bf16-fused", "gqa-tiny", "optimizer_in_backward", OIB, regime="bf16", optimizer_impl="fused",
         b=1, s=128),
    _cfg("oib-gqa-wide-fp32-foreach-ckpt", "gqa-wide", "optimizer_in_backward", OIB, checkpointing="full", b=1,
         s=128),
]

SAVE_ON_CPU = {"activation_offload": "save_on_cpu"}
for _m in MODELS:
    CONFIGS.append(_cfg(f"save-on-cpu-{_m}-fp32", _m, "save_on_cpu", SAVE_ON_CPU, b=1, s=256))
CONFIGS.append(_cfg("save-on-cpu-gqa-tiny-bf16", "gqa-tiny", "save_on_cpu", SAVE_ON_CPU, regime="bf16", b=1, s=256))
# Full checkpointing under save_on_cpu (the RoPE tables' place: bound into the checkpoint's recompute closure)
CONFIGS.append(_cfg("save-on-cpu-gqa-tiny-fp32-ckpt", "gqa-tiny", "save_on_cpu", SAVE_ON_CPU, checkpointing="full",
                    b=1, s=256))
