#!/usr/bin/env python
"""torchtune's ``custom_sharded_layers: ['tok_embeddings', 'output']`` (llama3_1/8B_full.yaml, 70B_full.yaml,
llama3_3/70B_full_multinode.yaml) under FSDP2 with full checkpointing, eager, in torchtune 0.6.1's distributed order:
measure_blocks_fsdp.py's runs (measure_blocks.py's harness, one rank of the fake process group) with
``training.shard_model``'s ``get_shard_conditions(names_to_match=custom_sharded_layers)``, each beside its twin
without it.

    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_fsdp_custom.py [--only ID ...]
    # writes validation/compile/blocks_fsdp_custom_measurements.json (torch==2.13.0 CPU, torchtune==0.6.1)
    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_fsdp_custom.py --events ID

What changes (pytorch/torchtune v0.6.1 torchtune/training/_distributed.py ``shard_model``): ``fully_shard`` on every
module ``get_shard_conditions`` names, bottom-up (``layers.i``, then ``output``, then ``tok_embeddings``, in
``reversed(model.named_modules())``), then on the model: the root unit keeps only the final norm. The cell is
untied (a tied output projection is no module of its own: torchtune's ``TiedLinear``), fp32 (CE and the chunked
``CEWithChunkedOutputLoss``, whose output projection is called once per chunk) and bf16.
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
from measure_blocks_fsdp import CELL, _fsdp_cfg  # noqa: E402

CUSTOM = ("tok_embeddings", "output")
UNTIED = dict(CELL, tied=False)
CONFIGS = []
for _world, _custom in ((2, None), (2, CUSTOM), (4, None), (4, CUSTOM)):
    CONFIGS.append(_fsdp_cfg("fp32", "eager", world=_world, custom=_custom, **UNTIED))
for _custom in (None, CUSTOM):
    CONFIGS.append(_fsdp_cfg("fp32", "eager", world=2, custom=_custom, loss="chunked", **UNTIED))
    CONFIGS.append(_fsdp_cfg("bf16", "eager", world=2, custom=_custom, vocab=1024, b=1, seq=256, layers=3, tied=False))


def document(args, runs, ctx) -> dict:
    doc = measure_blocks.document(args, runs, ctx)
    return {**doc, "generator": "/tmp/tvenv/bin/python validation/compile/measure_blocks_fsdp_custom.py"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--events"]:
        measure_blocks_order.CONFIGS.extend(CONFIGS)
        measure_blocks_order.events(argv[1])
        return 0
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS,
                        measure_run=measure_blocks.measure, document=document,
                        out=os.path.join(HERE, "blocks_fsdp_custom_measurements.json"), incremental=True,
                        keep_previous="always", summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<72} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
