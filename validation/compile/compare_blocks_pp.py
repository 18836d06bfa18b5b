#!/usr/bin/env python
"""Per-block compile under pipeline parallelism: the measured profile's rank against measure_blocks_pp.py's stages
(torchtune's model, eager and per-block compiled), every phase's peak.

    python validation/compile/compare_blocks_pp.py          # the project's environment, no torch

Each stage is solved as measured: ``pp_size``, 1F1B over ``gradient_accumulation_steps`` = m micro-batches of b,
fp32, AdamW foreach, SDPA on the CPU, no runtime overheads, ``compile="blocks"`` for the compiled stages (``None``
for the eager), and compared with the rank class holding that stage. As ../lora_parallel/compare_pp.py does, the
pipeline rule's send and receive staging buffers (communication buffers) are left out: a stage measured alone
has no transport; what a receive leaves on the stage (the received input and gradient) is in the activations.
Asserted by tests/measured/test_compile_blocks_pp.py."""

from __future__ import annotations

import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "blocks_pp_measurements.json")
PHASES = {"forward": ("forward",), "backward": ("backward", "backward_end"), "optimizer": ("optimizer_step",)}


def solve(run):
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.types import HardwareNode
    lay = run["layout"]
    return TrainingMemoryModel().solve(
        from_hf_config(run["hf_config"], name=run["id"]), HardwareNode(name="unbounded", memory_capacity=2**60),
        run["batch_size"] * lay["microbatches"], run["seq_len"], run["regime"], "adamw", "none", profile="measured",
        regime=run["regime"], attention="sdpa", device="cpu", runtime_overheads=False, optimizer_impl="foreach",
        pp_size=lay["pp_size"], pipeline_schedule=lay["schedule"], gradient_accumulation_steps=lay["microbatches"],
        compile="blocks" if run["compile"] == "blocks" else None)


def rows(path: str = PATH):
    """(id, predicted peaks per phase, measured peaks per phase) per measured stage."""
    from mlsysim_core.terms import COMMUNICATION_BUFFERS
    with open(path) as f:
        runs = [r for r in json.load(f)["runs"] if r.get("measured")]
    for run in runs:
        m = run["measured"]
        result = solve(run)
        stage = run["layout"]["stage"]
        rank = next(r for r in result.ranks if stage in r.stages)
        pred = {name: max(sum(t.nbytes for t in rank.terms if t.component != COMMUNICATION_BUFFERS
                              and p in t.phases and t.tier == "accelerator") for p in ours)
                for name, ours in PHASES.items()}
        meas = {p: m["baseline_bytes"] + m["peak_by_phase"][p] for p in PHASES}
        yield run["id"], pred, meas


def table(path: str = PATH) -> str:
    out = ["| stage | " + " | ".join(f"{p} peak: predicted / measured (error)" for p in PHASES) + " |",
           "|---|" + "---:|" * len(PHASES)]
    errs = {p: [] for p in PHASES}
    for rid, pred, meas in rows(path):
        cells = []
        for p in PHASES:
            e = (pred[p] - meas[p]) / meas[p]
            errs[p].append(abs(e))
            cells.append(f"{pred[p] / 1e6:,.3f} / {meas[p] / 1e6:,.3f} MB ({100 * e:+.2f} %)")
        out.append(f"| {rid} | " + " | ".join(cells) + " |")
    out.append("| **median / max \\|error\\|** | " + " | ".join(
        f"{100 * statistics.median(errs[p]):.2f} % / {100 * max(errs[p]):.2f} %" for p in PHASES) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
