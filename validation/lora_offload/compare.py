#!/usr/bin/env python
"""The measured profile against measurements.json (torchtune's offloading under LoRA), every phase and the host.

    python validation/lora_offload/compare.py          # the project's environment (mlsysim-core), no torch

Each run is solved as validation/compile/compare_blocks.py solves it (its shape, batch, sequence, regime, AdamW
foreach, SDPA on the CPU, no runtime overheads, ``compile="blocks"``, ``loss="chunked"``, full checkpointing,
``lora=LoRAConfig(rank, target_modules, adapter_dtype="base")``) with ``activation_offload="torchtune"`` for the
offloaded runs. The host is the bytes of the host copies alive at the forward's end (the ledger's) against the
host-tier terms. Asserted by tests/measured/test_lora_offload.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PATH = os.path.join(HERE, "measurements.json")
PHASES = ("forward", "backward", "optimizer", "end_of_forward", "end_of_backward", "host")


def _compare_blocks():
    spec = importlib.util.spec_from_file_location("compile_compare_blocks",
                                                  os.path.join(ROOT, "validation", "compile", "compare_blocks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def solve(run):
    """compare_blocks.solve with the run's ``activation_offload``."""
    from mlsysim_core import TrainingMemoryModel
    offload = run.get("offload")
    if not offload:
        return _compare_blocks().solve(run)
    real = TrainingMemoryModel.solve

    def with_offload(self, *args, **kwargs):
        return real(self, *args, activation_offload=offload, **kwargs)
    TrainingMemoryModel.solve = with_offload
    try:
        return _compare_blocks().solve(run)
    finally:
        TrainingMemoryModel.solve = real


def rows(path: str = PATH):
    """(id, predicted phases, measured phases) per measured run (bytes; the host's measured None without offload)."""
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, HOST, OPTIMIZER_STEP
    with open(path) as f:
        runs = [r for r in json.load(f)["runs"] if r.get("measured")]
    for run in runs:
        m = run["measured"]
        meas = _compare_blocks().measured_phases(m)
        meas["host"] = m["host"]["end_of_forward"] if "host" in m else 0
        r = solve(run)
        t = r.phase_totals
        device = [x for x in r.terms if x.tier != HOST]
        pred = {"forward": t[FORWARD], "backward": max(t[BACKWARD], t[BACKWARD_END]), "optimizer": t[OPTIMIZER_STEP],
                "end_of_forward": sum(x.nbytes for x in device if FORWARD in x.phases and BACKWARD in x.phases),
                "end_of_backward": sum(x.nbytes for x in device if OPTIMIZER_STEP in x.phases and (
                    tuple(x.phases) != (OPTIMIZER_STEP,) or x.component == GRADIENTS)),
                "host": sum(x.nbytes for x in r.terms if x.tier == HOST and FORWARD in x.phases)}
        yield run["id"], pred, meas


def table(path: str = PATH) -> str:
    out = ["| run | " + " | ".join(f"{p}: predicted / measured (error)" for p in PHASES) + " |",
           "|---|" + "---:|" * len(PHASES)]
    for rid, pred, meas in rows(path):
        cells = []
        for p in PHASES:
            if not meas[p] and not pred[p]:
                cells.append("0 / 0")
                continue
            e = (pred[p] - meas[p]) / meas[p]
            cells.append(f"{pred[p] / 1e6:,.3f} / {meas[p] / 1e6:,.3f} MB ({100 * e:+.2f} %)")
        out.append(f"| {rid} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
