#!/usr/bin/env python
"""torchtune's ``custom_sharded_layers: ['tok_embeddings', 'output']`` (llama3_1/8B_full.yaml, 70B_full.yaml,
llama3_3/70B_full_multinode.yaml) under FSDP2 with full checkpointing, eager, in torchtune 0.6.1's distributed order:
measure_blocks_fsdp.py's runs (measure_blocks.py's harness, one rank of the fake process group) with
``training.shard_model``'s ``get_shard_conditions(names_to_match=custom_sharded_layers)``, each beside its twin
without it.

    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_fsdp_custom.py [--only ID ...]
    # writes validation/compile/blocks_fsdp_custom_measurements.json (torch==2.13.0 CPU, torchtune==0.6.1)
    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_fsdp_custom.py --events ID
    nice -n 10 /tmp/tvenv/bin/python validation/compile/measure_blocks_fsdp_custom.py --gathers
    # each FSDP unit's all-gathers in one forward and backward with the chunked loss (gathers())

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


def gathers() -> None:
    """Each FSDP unit's all-gathers (``FSDPParamGroup.unshard`` from the sharded state, torch 2.13) in one forward and
    backward of the untied cell (2 layers, s 256) with ``custom_sharded_layers`` and ``CEWithChunkedOutputLoss``
    (8 chunks): the output unit runs its pre- and post-forward around each chunk's call (torchtune's
    ``chunked_output``: ``[self.output(chunk) for chunk in ...]``), so it is gathered once per chunk in the forward
    and again per chunk in the backward, one copy alive at a time (the peaks: the plain loss's to the byte)."""
    import collections
    from functools import partial

    import torch
    from fakepg import fake_world      # validation/fakepg.py
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    counts, phase, original = collections.Counter(), ["forward"], FSDPParamGroup.unshard

    def unshard(self, *args, **kwargs):
        if self.is_sharded and self._all_gather_result is None:     # (an unshard already issued returns early)
            counts[(phase[0], self._module_fqn or "(root)")] += 1
        return original(self, *args, **kwargs)

    FSDPParamGroup.unshard = unshard
    try:
        with fake_world(0, 2):
            from torch.distributed.device_mesh import init_device_mesh
            from torchtune import training
            from torchtune.models.llama3_2._component_builders import llama3_2
            from torchtune.modules.loss import CEWithChunkedOutputLoss
            model = llama3_2(vocab_size=1024, num_layers=2, num_heads=8, num_kv_heads=8, embed_dim=256,
                             max_seq_len=256, intermediate_dim=688, tie_word_embeddings=False)
            training.shard_model(model, [partial(training.get_shard_conditions, names_to_match=list(CUSTOM))],
                                 cpu_offload=False, reshard_after_forward=True,
                                 dp_mesh=init_device_mesh("cpu", (2,)))
            loss_fn = CEWithChunkedOutputLoss()
            model.set_num_output_chunks(loss_fn.num_output_chunks)
            x = torch.randint(0, 1024, (1, 256), generator=torch.Generator().manual_seed(1))
            loss = loss_fn(model(x), x)
            phase[0] = "backward"
            loss.backward()
    finally:
        FSDPParamGroup.unshard = original
    for (ph, unit), n in sorted(counts.items()):
        print(f"{ph:9s} {unit:16s} {n}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--gathers"]:
        gathers()
        return 0
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
