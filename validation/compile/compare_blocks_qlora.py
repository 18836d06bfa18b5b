#!/usr/bin/env python
"""The measured profile against blocks_qlora_measurements.json (torchtune's QLoRA recipes, eager and with compiled
blocks, torchao's NF4 base), every phase, solved as compare_blocks.py solves a LoRA run with the base quantized as
torchtune's reader describes a ``qlora_*`` builder: ``quantization="nf4"``, ``double_quant=True``,
``quant_blocksize=64`` (torchao's NF4Tensor counted as bitsandbytes' nf4 with double quantization), and torchtune's
RoPE cache (``rope_cache=max_seq_len``: one fp32 buffer of max_seq_len x head_dim/2 x 2 per model, rope.py) in
place of Hugging Face's per-forward cos/sin tables, and its attention's k and v expanded to every query head before
SDPA (``kv_expanded=True``, kv_expand.py: the kv2 runs' eager layers save the copies).

    python validation/compile/compare_blocks_qlora.py      # the project's environment (mlsysim-core), no torch

Asserted by tests/measured/test_compile_blocks_qlora.py.
"""

from __future__ import annotations

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "blocks_qlora_measurements.json")
_spec = importlib.util.spec_from_file_location("compile_compare_blocks", os.path.join(HERE, "compare_blocks.py"))
compare_blocks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_blocks)


def rows(path: str = PATH):
    return compare_blocks.rows(path, torchtune_rope=True, torchtune_kv=True)


def table(path: str = PATH) -> str:
    return compare_blocks.table(path, torchtune_rope=True, torchtune_kv=True)


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
