#!/usr/bin/env python
"""The measured profile against measurements.json (torchtune's offloading in full training around compiled,
checkpointed blocks), every phase and the host.

    python validation/offload_full/compare.py          # the project's environment (mlsysim-core), no torch

Each run is solved as validation/compile/compare_blocks_order.py solves it (its shape, batch, sequence, regime,
AdamW foreach, SDPA on the CPU, no runtime overheads, ``compile="blocks"``, ``compile_checkpoint="outside"``,
``loss="chunked"``, full checkpointing, ``optimizer_in_backward`` for the ``-oib-`` runs; the eager runs without
checkpointing as compare_blocks.py solves them) with
``activation_offload="torchtune"`` for the offloaded runs. The host is the bytes of the host copies alive at the
forward's end (the ledger's) against the host-tier terms. Asserted by tests/measured/test_offload_full.py.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PATH = os.path.join(HERE, "measurements.json")
PHASES = ("forward", "backward", "optimizer", "end_of_forward", "end_of_backward", "host")


def _module(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def solve(run):
    """compare_blocks_order's solve with the run's ``activation_offload``."""
    from mlsysim_core import TrainingMemoryModel
    sys.path.insert(0, os.path.join(ROOT, "validation", "compile"))
    order = _module("compile_compare_blocks_order", "validation", "compile", "compare_blocks_order.py")
    if run["policy"] != "full":     # (compare_blocks_order solves torchtune's order, full checkpointing)
        order = types.SimpleNamespace(_solve=_module("compile_compare_blocks", "validation", "compile",
                                                     "compare_blocks.py").solve)
    offload = run.get("offload")
    if not offload:
        return order._solve(run)
    real = TrainingMemoryModel.solve

    def with_offload(self, *args, **kwargs):
        return real(self, *args, activation_offload=offload, **kwargs)
    TrainingMemoryModel.solve = with_offload
    try:
        return order._solve(run)
    finally:
        TrainingMemoryModel.solve = real


def rows(path: str = PATH):
    """(id, predicted phases, measured phases) per measured run (bytes; the host's measured 0 without offload)."""
    lora_compare = _module("lora_offload_compare", "validation", "lora_offload", "compare.py")
    real = lora_compare.solve
    lora_compare.solve = solve
    try:
        yield from lora_compare.rows(path)
    finally:
        lora_compare.solve = real


def table(path: str = PATH) -> str:
    lora_compare = _module("lora_offload_compare", "validation", "lora_offload", "compare.py")
    real = lora_compare.rows
    lora_compare.rows = rows
    try:
        return lora_compare.table(path)
    finally:
        lora_compare.rows = real


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
