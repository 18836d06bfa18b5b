#!/usr/bin/env python
"""Measure one rank of LoRA under FSDP2 (issue 25 item 2) with measure_parallel.py's fake process group.

    /tmp/loravenv/bin/python validation/parallel/measure_lora_parallel.py --out validation/parallel/lora_measurements.json

The runs are measure_parallel.py's (``torch.distributed`` "fake" process group, one rank of a world, FSDP2's
``fully_shard`` per decoder layer then the root, ``FSDPMemTracker``, the protocol of ../harness.py), with peft's
LoRA injected in place (``peft.inject_adapter_in_model``: the base frozen, the adapters the only trainable
parameters, as ``get_peft_model`` leaves them) before ``fully_shard``: FSDP2 shards every parameter, frozen or not,
and reduce-scatters the gradients that exist. Needs torch==2.13.0, transformers==5.23.0, peft==0.21.2.
"""

from __future__ import annotations

import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402
import measure_parallel as mp  # noqa: E402
from measure_lora_variants import _collect_after_dora  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402


def _cfg(model, world, rank, *, raf, regime="fp32", rank_r=16, targets="all-linear", b=2, s=256, use_dora=False):
    cfg = mp._cfg("fsdp2", model, world, rank, raf=raf, regime=regime, b=b, s=s)
    cfg["id"] = ("dora-" if use_dora else "lora-") + cfg["id"]
    cfg["lora"] = {"rank": rank_r, "target_modules": targets, "quantization": None, "double_quant": False}
    if use_dora:
        cfg["lora"]["use_dora"] = True
    return cfg


CONFIGS = [
    _cfg("llama-tiny", 4, 0, raf=True),
    _cfg("llama-tiny", 4, 0, raf=False),
    _cfg("llama-tiny", 4, 0, raf=True, regime="mp-bf16"),
    _cfg("gqa-tiny", 2, 1, raf=True, targets=["q_proj", "v_proj"], rank_r=8),
    # DoRA (measure_lora_variants.py): the magnitude vectors sharded with the adapters, the norm from the gathered W
    _cfg("llama-tiny", 4, 0, raf=True, use_dora=True),
    _cfg("gqa-tiny", 2, 1, raf=False, targets=["q_proj", "v_proj"], rank_r=8, use_dora=True),
]


def measure(cfg: dict) -> dict:
    from peft import LoraConfig, inject_adapter_in_model
    lora = cfg["lora"]
    original = mp.apply_fsdp

    def apply_fsdp(model, mesh, raf, root_raf, mp_policy):
        config = LoraConfig(r=lora["rank"], lora_alpha=2 * lora["rank"], lora_dropout=0.0,
                            target_modules=lora["target_modules"], bias="none", use_dora=lora.get("use_dora", False))
        inject_adapter_in_model(config, model)
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)
        return original(model, mesh, raf, root_raf, mp_policy)

    mp.apply_fsdp = apply_fsdp
    # the tracker's module hooks make DoRA's norm graph cyclic garbage: collected where a plain run frees it
    undo = _collect_after_dora() if lora.get("use_dora") else (lambda: None)
    try:
        out = mp.measure_parallel(cfg)
    finally:
        mp.apply_fsdp = original
        undo()
    return out


def _versions() -> dict:
    import peft
    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}


def document(args, runs, ctx) -> dict:
    return {"generator": "/tmp/loravenv/bin/python validation/parallel/measure_lora_parallel.py "
                         "--out validation/parallel/lora_measurements.json",
            "environment": "python3 -m venv /tmp/loravenv && /tmp/loravenv/bin/pip install -r "
                           "validation/requirements.txt peft==0.21.2",
            "python": platform.python_version(), **_versions(), "device": "cpu", "runs": runs}


def main(argv=None) -> int:
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                 document=document, versions=_versions, summary=harness.mib_summary(9, 2, wall=5),
                 line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<56} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
