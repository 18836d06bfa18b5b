#!/usr/bin/env python
"""Measure LoRA on the families whose LoRA the measured profile derives from their description
(issue 25 item 2): Qwen3, Gemma 3, gpt-oss, Qwen3-MoE, with measure_lora.py's protocol (peft over
transformers, MemTracker, three iterations, the third measured; every phase recorded).

    python3 -m venv /tmp/loravenv
    /tmp/loravenv/bin/pip install -r validation/requirements.txt peft==0.21.2
    /tmp/loravenv/bin/python validation/measure_lora_families.py --out validation/lora_family_measurements.json

The models are the families' own tiny validation configs (validation/families/*/configs.py), built from
their configs with random weights; the runs are measure_lora.py's ``measure`` (bitsandbytes not needed:
no QLoRA here).
"""

from __future__ import annotations

import copy
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import measure_lora  # noqa: E402
from configs import LLAMA_TINY, _hf  # noqa: E402
from families.gemma.configs import MODELS as GEMMA  # noqa: E402
from families.gpt_oss.configs import MODELS as GPT_OSS  # noqa: E402
from families.llama_variants.configs import MODELS as VARIANTS  # noqa: E402
from families.moe_2025.configs import MODELS as MOE  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402

BASES = {"llama-tiny": ("llama", _hf(LLAMA_TINY, 0.0), "sdpa"),
         "qwen3-tiny": ("qwen3", VARIANTS["qwen3-tiny"], "sdpa"),
         "gemma3-tiny": ("gemma3_text", GEMMA["gemma3-tiny"], "sdpa"),
         "gpt-oss-tiny": ("gpt_oss", GPT_OSS["gpt-oss-tiny"], "eager"),
         "qwen3-moe-tiny": ("qwen3_moe", MOE["qwen3-moe-tiny"][1], "sdpa")}


def _cfg(id, model, batch_size, seq_len, *, rank, targets, regime="fp32", checkpointing="none", lora_dropout=0.0,
         adapter_dtype=None):
    family, base, attention = BASES[model]
    hf = copy.deepcopy(base)
    hf.update(use_cache=False, attention_dropout=0.0)
    return {"id": id, "family": family, "model": model, "hf_config": hf, "batch_size": batch_size,
            "seq_len": seq_len, "regime": regime, "optimizer": "adamw", "optimizer_impl": "foreach",
            "checkpointing": checkpointing, "attention": attention, "dropout": 0.0, "method": "real", "sweep": None,
            "lora": {"rank": rank, "target_modules": targets, "quantization": None, "double_quant": False,
                     **({"dropout": lora_dropout} if lora_dropout else {}),
                     **({"adapter_dtype": adapter_dtype} if adapter_dtype else {})},
            "lora_dropout": lora_dropout}


QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL = "all-linear"
CONFIGS = [
    _cfg("lora-qwen3-tiny-fp32-r16-all-b2-s256", "qwen3-tiny", 2, 256, rank=16, targets=ALL),
    _cfg("lora-qwen3-tiny-bf16-r8-qkvo-b2-s256", "qwen3-tiny", 2, 256, rank=8, targets=QKVO, regime="bf16"),
    _cfg("lora-qwen3-tiny-amp-r16-all-b2-s256", "qwen3-tiny", 2, 256, rank=16, targets=ALL, regime="amp-bf16"),
    _cfg("lora-gemma3-tiny-fp32-r16-all-b2-s256", "gemma3-tiny", 2, 256, rank=16, targets=ALL),
    _cfg("lora-gemma3-tiny-bf16-r8-qkvo-b2-s256", "gemma3-tiny", 2, 256, rank=8, targets=QKVO, regime="bf16"),
    _cfg("lora-gpt-oss-tiny-fp32-r16-qkvo-b2-s256", "gpt-oss-tiny", 2, 256, rank=16, targets=QKVO),
    _cfg("lora-gpt-oss-tiny-bf16-r8-all-b2-s256", "gpt-oss-tiny", 2, 256, rank=8, targets=ALL, regime="bf16"),
    _cfg("lora-qwen3-moe-tiny-fp32-r16-qkvo-b2-s256", "qwen3-moe-tiny", 2, 256, rank=16, targets=QKVO),
    # peft's lora_dropout > 0: each adapted linear's dropout mask and output
    _cfg("lora-qwen3-tiny-fp32-r16-all-dropout-b2-s256", "qwen3-tiny", 2, 256, rank=16, targets=ALL, lora_dropout=0.1),
    _cfg("lora-qwen3-tiny-bf16-r8-qkvo-dropout-b2-s256", "qwen3-tiny", 2, 256, rank=8, targets=QKVO, regime="bf16",
         lora_dropout=0.1),
    _cfg("lora-qwen3-tiny-amp-r16-all-dropout-b2-s256", "qwen3-tiny", 2, 256, rank=16, targets=ALL,
         regime="amp-bf16", lora_dropout=0.1),
    _cfg("lora-llama-tiny-fp32-r16-all-dropout-b2-s256", "llama-tiny", 2, 256, rank=16, targets=ALL, lora_dropout=0.1),
    _cfg("lora-llama-tiny-fp32-r8-qv-dropout-b2-s256", "llama-tiny", 2, 256, rank=8, targets=["q_proj", "v_proj"],
         lora_dropout=0.05),
    # adapters in the base's dtype (peft's autocast_adapter_dtype=False, torchtune's recipes)
    _cfg("lora-qwen3-tiny-bf16-r16-all-bf16adapters-b2-s256", "qwen3-tiny", 2, 256, rank=16, targets=ALL,
         regime="bf16", adapter_dtype="base"),
    _cfg("lora-llama-tiny-bf16-r16-all-bf16adapters-b2-s256", "llama-tiny", 2, 256, rank=16, targets=ALL,
         regime="bf16", adapter_dtype="base"),
]


def measure(cfg: dict) -> dict:
    """measure_lora.py's run; ``adapter_dtype`` "base": get_peft_model(..., autocast_adapter_dtype=False)."""
    import peft
    if cfg["lora"].get("adapter_dtype") != "base":
        return measure_lora.measure(cfg)
    original = peft.get_peft_model
    peft.get_peft_model = lambda model, config, **kw: original(model, config, autocast_adapter_dtype=False, **kw)
    try:
        return measure_lora.measure(cfg)
    finally:
        peft.get_peft_model = original


def _versions() -> dict:
    import peft
    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}


def document(args, runs, ctx) -> dict:
    return {
        "generator": "/tmp/loravenv/bin/python validation/measure_lora_families.py "
                     "--out validation/lora_family_measurements.json",
        "environment": "python3 -m venv /tmp/loravenv && /tmp/loravenv/bin/pip install -r "
                       "validation/requirements.txt peft==0.21.2",
        "python": platform.python_version(), **_versions(), "device": "cpu",
        "total_wall_s": None if args.only else round(ctx.elapsed, 1),
        "runs": runs,
    }


def main(argv=None) -> int:
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                 document=document, versions=_versions, summary=harness.mib_summary(9, 2, wall=5),
                 line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<48} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
