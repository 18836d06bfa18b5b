#!/usr/bin/env python
"""Compare the measured profile with torchtune's order of full checkpointing and per-block compile for full
fine-tuning (``compile="blocks"``, ``activation_checkpointing="full"``, ``compile_checkpoint="outside"``; ``-oib-``
runs with ``optimizer_in_backward``): the runs
of blocks_order_measurements.json (validation/compile/measure_blocks_order.py) and the two such runs of
blocks_measurements.json, every phase (compare_blocks.py's phases, solve and table). Eager twins are solved with
compile off.

    python validation/compile/compare_blocks_order.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare_blocks  # noqa: E402

PATHS = (os.path.join(HERE, "blocks_measurements.json"), os.path.join(HERE, "blocks_order_measurements.json"))


def _torchtune_order(run) -> bool:
    return run["policy"] == "full" and not run.get("lora") and not run.get("layout")


def _solve(run, torchtune_rope: bool = False, torchtune_kv: bool = False):
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.types import HardwareNode
    model = from_hf_config(run["hf_config"], name=run["id"])
    extra = {"loss": "chunked"} if run["loss"] == "chunked" else {}
    if run["compile"] == "blocks":
        extra.update(compile="blocks", compile_checkpoint="outside")
    if run.get("optimizer_in_backward"):      # torchtune's optimizer_in_bwd: one AdamW (foreach) per parameter
        extra.update(optimizer_in_backward=True)
    if torchtune_kv and "torchtune" in run:      # torchtune's attention: k, v expanded before SDPA (compare_blocks.py)
        extra.update(kv_expanded=True)
    return TrainingMemoryModel().solve(
        model, HardwareNode(name="unbounded", memory_capacity=2**60), run["batch_size"], run["seq_len"], run["regime"],
        "adamw", "full", profile="measured", regime=run["regime"], attention="sdpa", device="cpu",
        runtime_overheads=False, **extra)


def rows():
    """(id, predicted phases or the refusal, measured phases, baseline bytes) per torchtune-order run."""
    original = compare_blocks.solve
    compare_blocks.solve = _solve
    try:
        for path in PATHS:
            with open(path) as f:
                keep = {r["id"] for r in json.load(f)["runs"] if _torchtune_order(r)}
            yield from (row for row in compare_blocks.rows(path) if row[0] in keep)
    finally:
        compare_blocks.solve = original


def table() -> str:
    phases, titles = compare_blocks.PHASES, compare_blocks.TITLES
    out = ["| run | " + " | ".join(f"{t}: predicted / measured (error)" for t in titles) + " |",
           "|---|" + "---:|" * len(phases)]
    errs = {p: [] for p in phases}
    for rid, pred, meas, _base in rows():
        if not isinstance(pred, dict):
            out.append(f"| {rid} | refused: {pred} |" + " |" * (len(phases) - 1))
            continue
        cells = []
        for p in phases:
            e = (pred[p] - meas[p]) / meas[p]
            if "-blocks-" in rid:
                errs[p].append(abs(e))
            cells.append(f"{pred[p] / 1e6:,.3f} / {meas[p] / 1e6:,.3f} MB ({100 * e:+.2f} %)")
        out.append(f"| {rid} | " + " | ".join(cells) + " |")
    out.append("| **median / max \\|error\\|, compiled runs** | " + " | ".join(
        f"{100 * statistics.median(errs[p]):.2f} % / {100 * max(errs[p]):.2f} %" for p in phases) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
