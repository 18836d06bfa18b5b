#!/usr/bin/env python
"""LoRA on the LM head (torchtune ``apply_lora_to_output: True``), measured with torchtune's own builder: the
groundwork of issue 25 item 3 (the profile still refuses it: the adapter's r x (h + V) parameters are not in
mlsysim_core.finetune.lora_counts).

    nice -n 10 /tmp/tvenv/bin/python validation/lora_head/measure.py [--only ID ...]
    # writes validation/lora_head/measurements.json; /tmp/tvenv: torch==2.13.0 (CPU), torchtune==0.6.1

Each run is validation/compile/measure_blocks.py's eager LoRA run (torchtune 0.6.1's ``lora_llama3_2`` built in the
run's dtype, ``set_trainable_params(get_adapter_params)``, the recipe's ``_loss_step`` (``Step``), AdamW foreach over
the adapters, the profiler's memory timeline of the third iteration, every phase) with the builder's
``apply_lora_to_output`` set (the untied output projection a ``LoRALinear``: ``F.linear(x, W)`` plus
``(alpha / rank) * lora_b(lora_a(x))``, summed), beside its twin with the LM head frozen. ``loss="chunked"``:
``CEWithChunkedOutputLoss`` with the model's ``set_num_output_chunks(8)`` (the output projection, adapter included,
applied per chunk), as recipes/lora_finetune_single_device.py runs mistral/7B_lora.yaml.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
sys.path.insert(0, VALIDATION)
sys.path.insert(0, os.path.join(VALIDATION, "compile"))

PATH = os.path.join(HERE, "measurements.json")
GENERATOR = "nice -n 10 /tmp/tvenv/bin/python validation/lora_head/measure.py"


def _cfg(regime, output, *, loss="chunked", vocab=8000, b=2, seq=256, lora="qv"):
    import measure_blocks
    cfg = measure_blocks._cfg(regime, "eager", vocab=vocab, b=b, seq=seq, layers=2, tied=False, loss=loss, lora=lora)
    cfg["id"] = cfg["id"].replace("tt-llama3_2", "head-llama3" if output else "nohead-llama3", 1)
    cfg["lora"]["apply_lora_to_output"] = output
    return cfg


def configs():
    return [_cfg(regime, output, loss=loss) for loss in ("chunked", "ce") for regime in ("bf16", "fp32")
            for output in (False, True)]


def measure(cfg: dict) -> dict:
    import measure_blocks
    import torchtune.models.llama3_2._component_builders as builders
    original = builders.lora_llama3_2
    output = cfg["lora"]["apply_lora_to_output"]

    from torchtune.models.llama3._component_builders import lora_llama3

    def builder(attn, mlp, _output, **kw):      # measure_blocks passes apply_lora_to_output=False positionally
        # lora_llama3_2 refuses apply_lora_to_output (its 1B and 3B tie the projection to the embedding): Llama 3's
        # builder (the same decoder, untied, no RoPE scaling) for both twins
        kw = {k: v for k, v in kw.items() if k not in ("tie_word_embeddings", "scale_factor")}
        return lora_llama3(attn, mlp, output, **kw)
    builders.lora_llama3_2 = builder
    try:
        run = {k: v for k, v in cfg.items()}
        run["lora"] = {k: v for k, v in cfg["lora"].items() if k != "apply_lora_to_output"}
        record = measure_blocks.measure(run)
    finally:
        builders.lora_llama3_2 = original
    return record


def _versions() -> dict:
    import torch
    import torchtune
    return {"torch": torch.__version__, "torchtune": torchtune.__version__}


def document(args, runs, ctx) -> dict:
    return {"generator": GENERATOR, "environment": "/tmp/tvenv: torch==2.13.0 (CPU), torchtune==0.6.1",
            **_versions(), "device": "cpu", "runs": runs}


def main(argv=None) -> int:
    import harness
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=configs(), measure_run=measure,
                 document=document, out=PATH, versions=_versions, incremental=True, keep_previous="always",
                 threads=2, summary=lambda m: f"peak {m['peak_bytes'] / 2**20:8.2f} MiB ({m['peak_phase']}) "
                 + " ".join(f"{p} {v / 2**20:.2f}" for p, v in m["peak_by_phase"].items()),
                 line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<60} {msg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
