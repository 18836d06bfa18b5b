#!/usr/bin/env python
"""Measure one tensor-parallel rank of LoRA training with sequence parallelism (issue 25 item 2): Megatron-Bridge's
adapters under SP, re-implemented over a Hugging Face Llama split by torch's DTensor TP + SP.

    /tmp/pplvenv/bin/python validation/lora_parallel/measure_lora_sp.py --out validation/lora_parallel/sp_measurements.json

``measure_lora_tp.py``'s run (its ``measure``: ``../parallel/measure_parallel.py``'s ``measure_parallel`` with the
adapters added after the TP plan), with the layout ``tp+sp``: torchtitan's Llama plan (the residual stream and the
norms sharded on the sequence, all-gathered before attention and the MLP, reduce-scattered after o and down; position
ids passed whole) and each adapter on its sequence-parallel path (``measure_lora_tp.ParallelLinearAdapter`` with
``sp``), as Megatron-Bridge builds it with Transformer Engine >= 1.5 (NVIDIA-NeMo/Megatron-Bridge
067f987df03b8355b03192d88d70f1709fedf51a src/megatron/bridge/peft/utils.py ``get_adapter_attributes_from_linear``:
``return_layernorm_output_gathered = True`` and ``disable_sequence_parallel_comm = True`` for a
``TELayerNormColumnParallelLinear``; ``ParallelLinearAdapter.__init__``: ``disable_grad_reduce=_sequence_parallel``
for the column adapter's ``linear_in``; ``forward``: ``scatter_to_sequence_parallel_region`` after a row adapter's
``linear_out``):

* q/k/v, gate/up: the adapter reads the all-gathered norm output the base reads (one tensor per attention / MLP
  block), ``linear_in`` saves it (the frozen base does not), no copy_to (its gradient a partial sum, reduce-scattered
  with the base's);
* o/down: as without SP (r x in/tp, r all-reduced, out/tp all-gathered to the whole width), then the rank's chunk of
  the sequence (a contiguous copy), added to the base's reduce-scattered output.

Needs torch==2.13.0 (CPU), transformers==5.23.0.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure_lora_tp as tp  # noqa: E402  (puts validation/ and validation/parallel/ on sys.path)
import harness  # noqa: E402



def _cfg(regime, world, **kw):
    return tp._cfg(regime, world, kind="tp+sp", **kw)


CONFIGS = [
    _cfg("fp32", 2),
    _cfg("fp32", 2, targets=["q_proj", "v_proj"]),
    _cfg("bf16", 2),
    _cfg("fp32", 4, rank=8),
    _cfg("fp32", 2, b=1),
    _cfg("fp32", 2, targets=["o_proj", "down_proj"]),
    # grouped-query attention: the KV heads split over the ranks too
    _cfg("fp32", 2, model="gqa-tiny"),
    _cfg("bf16", 2, targets=["q_proj", "v_proj"], model="gqa-tiny"),
    # lora_dropout (dropout_position="pre": a column adapter drops the all-gathered input, a row adapter its shard)
    _cfg("fp32", 2, dropout=0.1),
    _cfg("bf16", 2, targets=["q_proj", "v_proj", "down_proj"], dropout=0.1),
]


document = tp.document_for("measure_lora_sp.py")


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.splitlines()[1], configs=CONFIGS, measure_run=tp.measure,
                        document=document, out=os.path.join(HERE, "sp_measurements.json"),
                        keep_previous="only")


if __name__ == "__main__":
    sys.exit(main())
