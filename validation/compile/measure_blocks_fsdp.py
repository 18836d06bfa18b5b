#!/usr/bin/env python
"""Per-block compile with full activation checkpointing under FSDP2, in torchtune 0.6.1's distributed order,
measured with measure_blocks.py's harness (the profiler's memory timeline, no dispatch mode) on one rank of the
fake process group (validation/fakepg.py).

    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_fsdp.py [--only ID ...]
    # writes validation/compile/blocks_fsdp_measurements.json; /tmp/tvenv: torch==2.13.0 (CPU), torchtune==0.6.1,
    # torchao==0.13.0 (measure_blocks.py's environment)
    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_fsdp.py --sac [--only ID ...]
    # torchtitan's op-SAC runs and their single-device twins: validation/compile/blocks_fsdp_sac_measurements.json
    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_fsdp.py --events ID
    # the measured iteration's memory events of one configuration (measure_blocks_order.py's)

What runs, as recipes/full_finetune_distributed.py and recipes/lora_finetune_distributed.py ``_setup_model`` of
torchtune 0.6.1 order it (pytorch/torchtune v0.6.1): the model built (LoRA: ``set_trainable_params`` on the
adapters), ``training.compile_model(model)`` (each ``TransformerSelfAttentionLayer`` compiled in place), then
``training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})`` (each compiled
layer wrapped in a non-reentrant ``checkpoint_wrapper``), then ``training.shard_model`` with
``training.get_shard_conditions`` (``fully_shard`` on every ``layers.i``, the checkpoint wrapper around the
compiled layer, bottom-up, then on the root; ``reshard_after_forward=True``; with ``fsdp_cpu_offload`` a
``CPUOffloadPolicy``, ``pin_memory=False`` since this CPU build has no accelerator to pin for). The rank's
micro-batch is ``batch_size``; the rank is ``layout.rank`` of ``layout.world_size``. Every run has its eager twin
(the same order without ``compile_model``).

On the CPU an offload policy moves nothing (the "device" is the host): the ``-offload-`` runs show only whether
compile's saved set and moments change with the policy on (its compiled-minus-eager delta against the one without).
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
import measure_blocks_order  # noqa: E402
from measure_blocks import _cfg  # noqa: E402


def _fsdp_cfg(regime, compile, *, world=2, rank=0, offload=False, custom=None, **kw):
    c = _cfg(regime, compile, policy="full", **kw)
    tag = f"-fsdp2tt{'-offload' if offload else ''}{'-custom' if custom else ''}-w{world}r{rank}"
    rid = c["id"].replace("-full", "-full" + tag, 1)
    c.update(id=rid, layout={"kind": "fsdp2-torchtune", "world_size": world, "rank": rank,
                             **({"cpu_offload": True} if offload else {}),
                             **({"custom_sharded_layers": list(custom)} if custom else {})})
    return c


CELL = dict(vocab=1024, b=2, layers=3)
CONFIGS = []
for _world in (2, 4):
    for _compile in ("eager", "blocks"):
        CONFIGS.append(_fsdp_cfg("fp32", _compile, world=_world, **CELL))
for _lora in ("all", "qv"):
    for _compile in ("eager", "blocks"):
        CONFIGS.append(_fsdp_cfg("fp32", _compile, world=2, lora=_lora, **CELL))
for _compile in ("eager", "blocks"):
    CONFIGS.append(_fsdp_cfg("fp32", _compile, world=4, lora="all", **CELL))
for _compile in ("eager", "blocks"):
    CONFIGS.append(_fsdp_cfg("bf16", _compile, world=2, vocab=1024, b=1, seq=256, layers=3))
for _compile in ("eager", "blocks"):       # fsdp_cpu_offload: True (CPUOffloadPolicy)
    CONFIGS.append(_fsdp_cfg("fp32", _compile, world=2, offload=True, **CELL))
for _compile in ("eager", "blocks"):       # 5 layers at 4 ranks: block L - 2's moment the highest (one input more,
    CONFIGS.append(_fsdp_cfg("fp32", _compile, world=4, **dict(CELL, layers=5)))      # a smaller shard less, per block)
for _compile in ("eager", "blocks"):       # the last rank of 4
    CONFIGS.append(_fsdp_cfg("fp32", _compile, world=4, rank=3, **CELL))


# torchtitan's order (parallelize_llama.py: apply_ac, apply_compile, apply_fsdp; measure_blocks.py's "full-in" policy
# and "fsdp2" layout: each block checkpoint-wrapped (preserve_rng_state False), torch.compile'd (fullgraph), then
# fully_shard on each and the root, the root given no reshard_after_forward): rank 0 of 2
for _compile in ("eager", "blocks"):
    CONFIGS.append(_cfg("fp32", _compile, policy="full-in", layout="fsdp2", **CELL))


def _titan_cfg(regime, compile, *, world=2, policy="op-sac", **kw):
    """torchtitan's order (measure_blocks.py's "fsdp2" layout: apply_ac, then fully_shard on each block and the
    root, the root given no reshard_after_forward) at ``world`` ranks, rank 0."""
    c = _cfg(regime, compile, policy=policy, layout="fsdp2", **kw)
    c.update(id=c["id"].replace("-fsdp2-w2r0", f"-fsdp2-w{world}r0", 1),
             layout={"kind": "fsdp2", "world_size": world, "rank": 0})
    return c


# ``--sac`` (blocks_fsdp_sac_measurements.json): torchtitan's default, selective op-level checkpointing
# (parallelize_llama.py apply_ac, mode "selective", selective_ac_option "op": measure_blocks.py's "op-sac" policy,
# every block wrapped before fully_shard), eager, and the same cells on one device (no layout): what the rank's
# FSDP2 adds to the same op-SAC layers, moment for moment
SAC_CONFIGS = [_titan_cfg("fp32", "eager", world=2, **CELL), _titan_cfg("fp32", "eager", world=4, **CELL),
               _titan_cfg("fp32", "eager", world=4, **dict(CELL, layers=5)),
               _titan_cfg("bf16", "eager", world=2, vocab=1024, b=1, seq=256, layers=3),
               _cfg("fp32", "eager", policy="op-sac", **CELL),
               _cfg("bf16", "eager", policy="op-sac", vocab=1024, b=1, seq=256, layers=3),
               # torchtitan's layer SAC (mode "selective", selective_ac_option "2": every second block, by its
               # 1-based count, wrapped in checkpoint_wrapper, preserve_rng_state False), then fully_shard
               _titan_cfg("fp32", "eager", world=2, policy="every-2", **CELL),
               _titan_cfg("fp32", "eager", world=2, policy="every-2", **dict(CELL, layers=4))]


def _measure_sac(cfg: dict) -> dict:
    """measure_blocks.measure, with torchtitan's layer SAC (``every-K``) applied before its ``_fsdp2`` shards the
    model (apply_ac, then apply_fsdp): ``_apply_ac_to_transformer_block``'s ``_layer_sac_count % ac_freq == 0``."""
    if not cfg["policy"].startswith("every-"):
        return measure_blocks.measure(cfg)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    k, shard = int(cfg["policy"].split("-")[1]), measure_blocks._fsdp2

    def wrap_then_shard(model, world):
        for i, layer in enumerate(model.layers):
            if (i + 1) % k == 0:
                model.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
        return shard(model, world)
    measure_blocks._fsdp2 = wrap_then_shard
    try:
        return measure_blocks.measure(cfg)
    finally:
        measure_blocks._fsdp2 = shard


def document(args, runs, ctx) -> dict:
    doc = measure_blocks.document(args, runs, ctx)
    sac = any(r.get("policy") == "op-sac" for r in runs)
    return {**doc, "generator": "/tmp/tvenv/bin/python validation/compile/measure_blocks_fsdp.py" + (" --sac" if sac else "")}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--events"]:
        measure_blocks_order.CONFIGS.extend(CONFIGS + SAC_CONFIGS)
        measure_blocks_order.events(argv[1])
        return 0
    sac = argv[:1] == ["--sac"]
    argv = argv[1:] if sac else argv
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=SAC_CONFIGS if sac else CONFIGS,
                        measure_run=_measure_sac if sac else measure_blocks.measure, document=document,
                        out=os.path.join(HERE, "blocks_fsdp_sac_measurements.json" if sac else
                                         "blocks_fsdp_measurements.json"), incremental=True,
                        keep_previous="always", summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<64} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
