#!/usr/bin/env python
"""torchtune 0.6.1's distributed QLoRA with ``compile: True`` (``lora_finetune_distributed`` with a ``qlora_*``
builder: torchao's NF4 base under FSDP2, each layer compiled), one rank of the fake process group, measured with the
profiler's memory timeline: validation/qlora_fsdp2/measure.py's setup, builders, loss and optimizer (its runs are
the eager twins), with the recipe's ``training.compile_model(model)`` between ``set_trainable_params`` and
``set_activation_checkpointing`` (recipes/lora_finetune_distributed.py ``_setup_model``, pytorch/torchtune v0.6.1).

    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_qlora_fsdp.py [--only ID ...]
    # writes validation/compile/blocks_qlora_fsdp_measurements.json; /tmp/tvenv: torch==2.13.0 (CPU),
    # torchtune==0.6.1, torchao==0.13.0
"""

from __future__ import annotations

import contextlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402  (validation/harness.py)

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "qlora_fsdp2"))
qlora = harness.load("qlora_fsdp2_measure", os.path.join(os.path.dirname(HERE), "qlora_fsdp2", "measure.py"))


def _compiled(cfg: dict) -> dict:
    return {**cfg, "id": cfg["id"].replace("-bf16-qlora", "-bf16-blocks-qlora"), "compile": "blocks"}


CONFIGS = [_compiled(qlora._cfg(w, ac=True)) for w in (1, 2, 4)]


def measure(cfg: dict) -> dict:
    """The eager setup of qlora_fsdp2/measure.py with ``compile_model`` where the recipe calls it: after
    ``set_trainable_params`` (which that script calls before checkpointing), before ``set_activation_checkpointing``;
    and the recipe's ``training.compile_loss(self._loss_fn)`` (``CEWithChunkedOutputLoss``: its
    ``compute_cross_entropy`` compiled in place)."""
    import torchtune.modules.loss as losses
    from torchtune import training
    original, chunked = training.set_activation_checkpointing, losses.CEWithChunkedOutputLoss

    def compile_then_checkpoint(model, *args, **kwargs):
        training.compile_model(model, verbose=False)
        return original(model, *args, **kwargs)

    def compiled_loss(*args, **kwargs):
        loss_fn = chunked(*args, **kwargs)
        training.compile_loss(loss_fn, verbose=False)
        return loss_fn

    training.set_activation_checkpointing, losses.CEWithChunkedOutputLoss = compile_then_checkpoint, compiled_loss
    try:
        return qlora.measure(cfg)
    finally:
        training.set_activation_checkpointing, losses.CEWithChunkedOutputLoss = original, chunked
        import torch
        torch._dynamo.reset()


def document(args, runs, ctx) -> dict:
    doc = qlora.document(args, runs, ctx)
    return {**doc, "generator": "nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_qlora_fsdp.py"}


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, out=os.path.join(HERE, "blocks_qlora_fsdp_measurements.json"),
                        incremental=True, keep_previous="always",
                        summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<56} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
