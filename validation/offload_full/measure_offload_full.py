#!/usr/bin/env python
"""torchtune 0.6.1's activation offloading (``enable_activation_offloading``) in full training, with full activation
checkpointing in torchtune's order and per-block compile: measured on the CPU with the offload's device/host split
simulated (issue 25, items 1-2; the torchtune ladder's "+ Activation Offloading" row).

    nice -n 10 /tmp/lossvenv/bin/python validation/offload_full/measure_offload_full.py [--only ID ...]
    # writes validation/offload_full/measurements.json; /tmp/lossvenv: torch==2.13.0 (CPU), torchtune==0.6.1,
    # torchao==0.13.0 (validation/compile/measure_blocks.py's environment)

What runs: validation/lora_offload/measure_lora_offload.py's harness (``SimulatedOffloadActivations``: torchtune's
pack and unpack hooks with ``use_streams=True`` line for line, the host copies on numpy's memory, outside the
profiler's timeline, counted by a ledger) on ``llama3_2`` without LoRA, as recipes/full_finetune_single_device.py
runs it: ``training.compile_model`` then ``training.set_activation_checkpointing`` (the checkpoint outside each
compiled layer), ``CEWithChunkedOutputLoss`` with ``compile_loss``, the model's call inside
``get_act_offloading_ctx_manager(model, True)`` (the output head in its ``NoOpManager``), with and without
``optimizer_in_bwd`` (measure_blocks.py's ``_InBackward``: one AdamW per parameter stepped by its
post-accumulate-grad hook). The record's ``packs`` lists what the pack hook was given in the measured forward.
"""

from __future__ import annotations

import contextlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(VALIDATION, "lora_offload"))
sys.path.insert(0, VALIDATION)

import harness  # noqa: E402  (validation/harness.py)
import measure_lora_offload as mlo  # noqa: E402

OUT = os.path.join(HERE, "measurements.json")
GENERATOR = "/tmp/lossvenv/bin/python validation/offload_full/measure_offload_full.py"


def _cfg(regime, *, oib=True, offload=True, compile="blocks", policy="full", **kw):
    cfg = mlo._cfg(regime, compile, lora=None, offload=offload, **kw)
    if policy != "full":
        cfg.update(policy=policy, id=cfg["id"].replace("-full", f"-{policy}" if policy != "none" else ""))
    if oib:
        cfg["optimizer_in_backward"] = True
        cfg["id"] = cfg["id"].replace("-full", "-full-oib")
    return cfg


CONFIGS = [
    # the ladder's "+ Activation Offloading" settings scaled down: bf16, compile, full checkpointing in torchtune's
    # order, the chunked loss, optimizer_in_bwd
    _cfg("bf16", layers=4, kv=2),
    _cfg("bf16", layers=8),
    _cfg("bf16", layers=3, b=1, seq=256),
    _cfg("fp32", layers=4),
    _cfg("bf16", layers=4, b=1, vocab=32000),
    # without optimizer_in_bwd (foreach AdamW after the backward)
    _cfg("bf16", layers=4, kv=2, oib=False),
    _cfg("fp32", layers=3, oib=False),
    # twins without offloading
    _cfg("bf16", layers=8, offload=False),
    # the 256-token run's twin: the top block's backward under optimizer_in_bwd peaks in its attention's backward
    # (the MLP's weight gradients already stepped and freed), which compile.blocks_outside_full_terms does not price
    _cfg("bf16", layers=3, b=1, seq=256, offload=False),
    # eager layers (item 2: the derived full-training mode): full checkpointing, and none (every saved tensor through
    # the hooks, the matmuls' transposed weight views included)
    _cfg("bf16", compile="eager", layers=4, kv=2),
    _cfg("bf16", compile="eager", layers=4, kv=2, oib=False),
    _cfg("fp32", compile="eager", layers=3, oib=False),
    _cfg("bf16", compile="eager", layers=2, oib=False, policy="none"),
    _cfg("fp32", compile="eager", layers=2, oib=False, policy="none"),
    _cfg("bf16", compile="eager", layers=4, kv=2, oib=False, offload=False),
]


def document(args, runs, ctx) -> dict:
    return {**mlo.document(args, runs, ctx), "generator": GENERATOR}


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=mlo.measure,
                        document=document, out=OUT, incremental=True, keep_previous="always",
                        summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<70} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
