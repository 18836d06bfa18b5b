#!/usr/bin/env python
"""torchtune's QLoRA recipes with ``compile: True`` (each decoder block compiled apart over torchao's NF4 base),
measured with measure_blocks.py's harness (the profiler's memory timeline, no dispatch mode; torchtune 0.6.1's own
builders).

    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_qlora.py [--only ID ...]
    # writes validation/compile/blocks_qlora_measurements.json; /tmp/tvenv: torch==2.13.0 (CPU), torchtune==0.6.1,
    # torchao==0.13.0 (measure_blocks.py's environment)
    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_qlora.py --events ID
    # one configuration's memory events (size, running total, phase: measure_blocks_order.py's --events)

What runs, as torchtune 0.6.1's ``lora_finetune_single_device`` runs a ``qlora_*`` config with ``compile: True``
(recipes/lora_finetune_single_device.py ``_setup_model``): the model built in the run's dtype
(``training.set_default_dtype``) by ``lora_llama3_2(..., quantize_base=True)`` (every adapted and frozen linear of
the layers a ``LoRALinear`` or ``FrozenNF4Linear`` whose weight is ``to_nf4``'d: torchao's ``NF4Tensor``, blocks
of 64, scalers double-quantized in blocks of 256; embedding, norms and LM head in the model's dtype);
``set_trainable_params`` (the NF4 bases frozen), then ``training.compile_model``, then, with
``enable_activation_checkpointing``, ``set_activation_checkpointing`` around each compiled layer (``policy="full"``);
rank 8, alpha 16, no dropout; the eager cross-entropy or the recipes' ``CEWithChunkedOutputLoss`` with
``compile_loss``; AdamW (foreach), two warm-ups, the third iteration measured. Every run has an eager twin.

The MLP width is 704, not the other compile runs' 688: torchao's double quantization needs a linear's
``out x in / 64`` scalers to be a multiple of 256 (688 x 256 / 64 = 2,752 is not; 704 x 256 / 64 = 2,816 is).

Before measuring, ``probe_nf4_compile.py`` checks that the compiled backward is right in this order (the base
frozen before compile): the input's gradient equals eager's for a square and a non-square NF4 linear (bf16).
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

SMALL = dict(vocab=1024, layers=3, seq=256, ffn=704, qlora=True)
CONFIGS = [
    # every linear adapted (q, k, v, output_proj and the MLP), and q/v only (the MLP's NF4 linears frozen)
    *(_cfg("bf16", mode, lora=lora, policy=policy, **SMALL)
      for lora in ("all", "qv") for policy in ("none", "full") for mode in ("eager", "blocks")),
    # grouped-query attention (k and v non-square), full checkpointing
    *(_cfg("bf16", mode, lora="all", policy="full", kv=2, **SMALL) for mode in ("eager", "blocks")),
    # the recipes' chunked loss, compiled by compile_loss, with full checkpointing (the QLoRA configs' setting)
    *(_cfg("bf16", mode, lora="all", policy="full", loss="chunked", **SMALL) for mode in ("eager", "blocks")),
    # fp32 (NF4 over an fp32 model), two batch rows of 512
    *(_cfg("fp32", mode, lora="qv", b=2, **{**SMALL, "seq": 512}) for mode in ("eager", "blocks")),
    # fp32 with full checkpointing, the MLP adapted and frozen; bf16 frozen-MLP at 128 tokens (T != h)
    *(_cfg("fp32", mode, lora=lora, policy="full", b=2, **{**SMALL, "seq": 512})
      for lora in ("all", "qv") for mode in ("eager", "blocks")),
    *(_cfg("bf16", mode, lora="qv", policy="full", **{**SMALL, "seq": 128}) for mode in ("eager", "blocks")),
]


def document(args, runs, ctx) -> dict:
    import torchao
    doc = measure_blocks.document(args, runs, ctx)
    return {**doc, "generator": "/tmp/tvenv/bin/python validation/compile/measure_blocks_qlora.py",
            "torchao": torchao.__version__}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--events"]:
        import measure_blocks_order
        measure_blocks_order.CONFIGS = CONFIGS
        measure_blocks_order.events(argv[1])
        return 0
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS,
                        measure_run=measure_blocks.measure, document=document,
                        out=os.path.join(HERE, "blocks_qlora_measurements.json"), incremental=True,
                        keep_previous="always", summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<66} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
