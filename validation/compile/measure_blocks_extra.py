#!/usr/bin/env python
"""Per-block ``torch.compile`` beyond blocks_measurements.json: torchtitan's compiled loss and torchtune's LoRA
recipes with full activation checkpointing, measured with measure_blocks.py's harness (the profiler's memory
timeline, no dispatch mode; torchtune 0.6.1's own builders).

    nice -n 10 /tmp/lossvenv/bin/python validation/compile/measure_blocks_extra.py [--only ID ...]
    # writes validation/compile/blocks_extra_measurements.json; /tmp/lossvenv: torch==2.13.0 (CPU),
    # torchtune==0.6.1, torchao==0.13.0 (measure_blocks.py's environment)

* ``loss="titan-compiled"``: torchtitan v0.2.2's ``cross_entropy_loss`` wrapped in ``torch.compile`` (its
  ``build_cross_entropy_loss`` with "loss" in ``compile.components``, torchtitan's default), called as its
  ``forward_backward_step`` calls it (``measure_blocks.TitanStep``: ``del pred`` before the backward), on the
  logits in the model's dtype (torchtitan's ``self.output(h)``); each block compiled with
  ``torch.compile(block, fullgraph=True)`` (``apply_compile``); ``loss="titan"`` is its eager twin (the same
  step, the loss not compiled). With ``policy="op-sac"`` / ``"full-in"``: torchtitan's order (measure_blocks.py).
* ``lora=...`` with ``policy="full"``: torchtune's ``lora_finetune_single_device`` order (``_setup_model``:
  ``training.compile_model(model)``, then ``training.set_activation_checkpointing`` wraps each compiled layer),
  rank 8, alpha 16, adapters in the model's dtype, the eager cross-entropy (measure_blocks.py's LoRA runs) or, with
  ``loss="chunked"``, the recipes' ``CEWithChunkedOutputLoss`` with ``compile_loss`` (its ``compute_cross_entropy``
  compiled in place).
"""

from __future__ import annotations

import contextlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402  (validation/harness.py)
import measure_blocks  # noqa: E402
from measure_blocks import _cfg  # noqa: E402

CONFIGS = [
    # torchtitan's compiled loss (compile.components ["model", "loss"]), and its eager twin
    _cfg("fp32", "blocks", loss="titan"), _cfg("fp32", "blocks", loss="titan-compiled"),
    _cfg("bf16", "blocks", loss="titan"), _cfg("bf16", "blocks", loss="titan-compiled"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, loss="titan"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, loss="titan-compiled"),
    _cfg("fp32", "blocks", kv=2, loss="titan-compiled"),
    _cfg("fp32", "blocks", policy="op-sac", loss="titan-compiled"),
    _cfg("fp32", "blocks", policy="full-in", loss="titan-compiled"),
    _cfg("bf16", "blocks", vocab=1024, b=1, seq=256, layers=3, loss="titan-compiled"),
    # torchtune's LoRA recipes with enable_activation_checkpointing and compile (torchtune's order)
    _cfg("fp32", "eager", vocab=1024, b=2, layers=3, lora="qv", policy="full"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, lora="qv", policy="full"),
    _cfg("fp32", "eager", vocab=1024, b=2, layers=3, lora="all", policy="full"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, lora="all", policy="full"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, kv=2, lora="all", policy="full"),
    _cfg("fp32", "eager", lora="qv", policy="full"), _cfg("fp32", "blocks", lora="qv", policy="full"),
    _cfg("bf16", "eager", vocab=1024, layers=3, seq=256, lora="all", policy="full"),
    _cfg("bf16", "blocks", vocab=1024, layers=3, seq=256, lora="all", policy="full"),
    # torchtune's LoRA recipes' own loss, CEWithChunkedOutputLoss: compile_loss compiles its compute_cross_entropy in
    # place (lora_finetune_single_device keeps the return value too), with and without full checkpointing
    _cfg("fp32", "eager", lora="qv", loss="chunked"), _cfg("fp32", "blocks", lora="qv", loss="chunked"),
    _cfg("fp32", "blocks", lora="qv", loss="chunked", policy="full"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, lora="all", loss="chunked", policy="full"),
    _cfg("bf16", "blocks", lora="qv", loss="chunked", policy="full"),
]


def document(args, runs, ctx) -> dict:
    doc = measure_blocks.document(args, runs, ctx)
    return {**doc, "generator": "/tmp/lossvenv/bin/python validation/compile/measure_blocks_extra.py"}


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS,
                        measure_run=measure_blocks.measure, document=document,
                        out=os.path.join(HERE, "blocks_extra_measurements.json"), incremental=True,
                        keep_previous="always", summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<60} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
