#!/usr/bin/env python
"""LoRA / QLoRA with gradient accumulation: every phase of every micro-batch measured with PyTorch's tracker.

    /tmp/pplvenv/bin/python validation/lora_accumulation/measure.py --out validation/lora_accumulation/measurements.json

The environment is validation/measure_lora.py's (torch==2.13.0 CPU, transformers==5.23.0, peft==0.21.2,
bitsandbytes==0.50.2); the models, adapters and tracker are its own (``measure_lora.build_model``,
``FrozenAwareMemTracker``). The protocol is harness.py's ``run_protocol`` with ``microbatches`` = m per iteration, as a
training loop accumulates them (Hugging Face's Trainer, torchtune, a hand loop): ``zero_grad(set_to_none=True)``,
then m times ``loss = model(...).loss / m; loss.backward()``, then ``optimizer.step()``; three iterations, the third
measured. Each micro-batch's forward and backward is a phase of its own (``forward.0``, ``backward.0``,
``forward.1``, ...); ``forward`` and ``backward`` are their maxima. From the first backward on, the adapters'
``.grad`` tensors exist (PyTorch's AccumulateGrad: the first gradient becomes ``.grad``, later ones are added into
it), so every later forward and backward runs with them alive.
"""

from __future__ import annotations

import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402  (validation/harness.py)
import measure_lora  # noqa: E402  (validation/measure_lora.py)
from harness import _submodules, peak_record, run_protocol  # noqa: E402

import torch  # noqa: E402

M = 2
QV = ["q_proj", "v_proj"]
ALL = "all-linear"


def _cfg(id, model, batch_size, seq_len, **kw):
    cfg = measure_lora._cfg(id, model, batch_size, seq_len, **kw)
    cfg["gradient_accumulation_steps"] = M
    return cfg


CONFIGS = [
    _cfg("lora-llama-tiny-fp32-r16-all-b2-s256-m2", "llama-tiny", 2, 256, rank=16, targets=ALL),
    _cfg("lora-llama-tiny-fp32-r8-qv-b2-s256-m2", "llama-tiny", 2, 256, rank=8, targets=QV),
    _cfg("lora-gqa-tiny-amp-r16-all-b2-s256-m2", "gqa-tiny", 2, 256, rank=16, targets=ALL, regime="amp-bf16"),
    _cfg("lora-llama-tiny-bf16-r16-all-b2-s256-m2", "llama-tiny", 2, 256, rank=16, targets=ALL, regime="bf16"),
    _cfg("lora-llama-tiny-fp32-r16-all-ckpt-b2-s256-m2", "llama-tiny", 2, 256, rank=16, targets=ALL,
         checkpointing="full"),
    _cfg("qlora-llama-tiny-bf16-nf4-dq-r16-all-b2-s256-m2", "llama-tiny", 2, 256, rank=16, targets=ALL,
         regime="bf16", quantization="nf4", double_quant=True),
]


def measure(cfg: dict) -> dict:
    cell = {}

    def build(cfg):
        model, cell["hf_config"] = measure_lora.build_model(cfg)
        return model, torch.randint(0, cell["hf_config"].vocab_size, (cfg["batch_size"], cfg["seq_len"]))

    torch.manual_seed(0)
    with harness.training_run(cfg, build=build, tracker=measure_lora.FrozenAwareMemTracker) as run:
        model, mt, params = run.model, run.mt, run.params
        _submodules(model.get_base_model())
        alive, _ = run_protocol(mt, model, run.optimizer, run.input_ids, autocast=harness.autocast_for(cfg),
                                microbatches=cfg["gradient_accumulation_steps"])
        t_end = time.perf_counter()
        record = peak_record(mt)
        phases = record["peak_by_phase"]
        for name in ("forward", "backward"):
            each = [v for k, v in phases.items() if k.startswith(name + ".")]
            phases[name] = max(each, key=lambda v: v["bytes"])
        quant = harness.quant_state_storages(model)
        grad_bytes = sum(p.numel() * p.element_size() for p in params)
        return {
            **record,
            "quant_state_bytes": int(sum(quant.values())),
            "alive": alive,
            "adapter_gradient_bytes": int(grad_bytes),
            "trainable_parameters": int(sum(p.numel() for p in params)),
            "wall_s": round(t_end - run.t0, 1),
        }


def document(args, runs, ctx) -> dict:
    return {
        "generator": "/tmp/pplvenv/bin/python validation/lora_accumulation/measure.py "
                     "--out validation/lora_accumulation/measurements.json",
        "environment": "validation/measure_lora.py's (torch==2.13.0 CPU, transformers==5.23.0, peft==0.21.2, "
                       "bitsandbytes==0.50.2)",
        "python": platform.python_version(), **measure_lora._versions(), "device": "cpu",
        "total_wall_s": None if args.only else round(ctx.elapsed, 1),
        "runs": runs,
    }


def main(argv=None) -> int:
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                 document=document, versions=measure_lora._versions, summary=harness.mib_summary(9, 2, wall=5),
                 line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<52} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
