#!/usr/bin/env python
"""Compiled LoRA blocks with full checkpointing where a lower block's backward moment is the peak (issue 25 item 1):
torchtune 0.6.1's lora_finetune_single_device order (compile each layer, then wrap it in the checkpoint), the README's
LoRA set (q, v, o and the MLP), bf16, the chunked loss, one sequence of 256 tokens, at ranks 64 and 128 over 3, 4
and 6 layers, so that each block's adapters' gradients (559,104 B at rank 64) outgrow its input (c T h = 131,072 B):
``compile.lora_full_terms`` prices the highest of the top block's, block 1's and block 0's moments.

    nice -n 10 /tmp/lossvenv/bin/python validation/compile/measure_lora_moments.py

(/tmp/lossvenv: torch 2.13.0+cpu, torchtune 0.6.1, torchao 0.13.0, as measure_blocks.py.) The runs are
validation/lora_offload's rank-64 twin's configuration (measure_lora_offload._cfg, offload=False) with other layer
counts and ranks, measured by validation/compile/measure_blocks.measure; the 4-layer rank-64 run is the twin itself.
Written to lora_moments_measurements.json; compared (no torch) by validation/compile/compare_blocks.rows and asserted
by tests/measured/test_compile_lora.py.
"""

from __future__ import annotations

import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lora_offload"))

OUT = os.path.join(HERE, "lora_moments_measurements.json")
RUNS = ((3, 64), (4, 64), (6, 64), (4, 128))      # (layers, rank)


def main() -> int:
    import measure_lora_offload as lora_offload     # validation/lora_offload (imports torch, torchtune)
    import torch
    runs = []
    for layers, rank in RUNS:
        cfg = lora_offload._cfg("bf16", layers=layers, b=1, seq=256, rank=rank, offload=False)
        cfg["measured"] = lora_offload.measure(cfg)
        print(f"{cfg['id']:<72} peak {cfg['measured']['peak_bytes']:>12,} B", flush=True)
        runs.append(cfg)
    import torchtune
    with open(OUT, "w") as f:
        json.dump({"generator": "/tmp/lossvenv/bin/python validation/compile/measure_lora_moments.py",
                   "python": platform.python_version(), "torch": torch.__version__,
                   "torchtune": torchtune.__version__, "device": "cpu", "threads": torch.get_num_threads(),
                   "runs": runs}, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
