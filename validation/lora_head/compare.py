#!/usr/bin/env python
"""The measured profile against measurements.json (LoRA on the LM head, torchtune 0.6.1), every phase.

    python validation/lora_head/compare.py          # the project's environment (mlsysim-core), no torch

Each run is solved as validation/compile/compare_blocks.py solves torchtune's eager LoRA runs (its ``hf_config``,
batch, sequence, regime, AdamW foreach, SDPA on the CPU, no runtime overheads, ``loss="chunked"`` for the chunked
runs, ``LoRAConfig(rank, target_modules, adapter_dtype="base")``), the ``head-*`` runs with ``lm_head`` among the
targets (torchtune's ``apply_lora_to_output: True``). Asserted by tests/measured/test_lora_head.py.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "compile"))

import compare_blocks  # noqa: E402

PATH = os.path.join(HERE, "measurements.json")
PHASES, TITLES = compare_blocks.PHASES, compare_blocks.TITLES


def as_solved(run: dict) -> dict:
    """The run as compare_blocks solves it: the output adapter a target (``lm_head``)."""
    lora = dict(run["lora"])
    if lora.pop("apply_lora_to_output", False):
        lora["targets"] = list(lora["targets"]) + ["lm_head"]
    return {**run, "lora": lora}


def rows(path: str = PATH):
    """(id, predicted phases, measured phases, baseline bytes) per measured run."""
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, OPTIMIZER_STEP
    with open(path) as f:
        runs = [r for r in json.load(f)["runs"] if r.get("measured")]
    for run in runs:
        m = run["measured"]
        base = m["baseline_bytes"]
        meas = compare_blocks.measured_phases(m)
        r = compare_blocks.solve(as_solved(run), torchtune_kv=True)
        t = r.phase_totals
        pred = {"forward": t[FORWARD], "backward": max(t[BACKWARD], t[BACKWARD_END]), "optimizer": t[OPTIMIZER_STEP],
                "end_of_forward": sum(x.nbytes for x in r.terms if FORWARD in x.phases and BACKWARD in x.phases),
                "end_of_backward": sum(x.nbytes for x in r.terms if OPTIMIZER_STEP in x.phases and (
                    tuple(x.phases) != (OPTIMIZER_STEP,) or x.component == GRADIENTS))}
        yield run["id"], pred, meas, base


def table(path: str = PATH) -> str:
    out = ["| run | " + " | ".join(f"{t}: predicted / measured (error)" for t in TITLES) + " |",
           "|---|" + "---:|" * len(PHASES)]
    errs = {p: [] for p in PHASES}
    for rid, pred, meas, _base in rows(path):
        cells = []
        for p in PHASES:
            e = (pred[p] - meas[p]) / meas[p]
            errs[p].append(abs(e))
            cells.append(f"{pred[p] / 1e6:,.3f} / {meas[p] / 1e6:,.3f} MB ({100 * e:+.2f} %)")
        out.append(f"| {rid} | " + " | ".join(cells) + " |")
    out.append("| **median / max \\|error\\|** | " + " | ".join(
        f"{100 * statistics.median(errs[p]):.2f} % / {100 * max(errs[p]):.2f} %" for p in PHASES) + " |")
    return "\n".join(out)


def deltas(path: str = PATH) -> str:
    """What the output adapter adds, predicted against measured: each ``head-*`` run minus its ``nohead-*`` twin."""
    got = {rid: (pred, meas) for rid, pred, meas, _ in rows(path)}
    out = ["| run | " + " | ".join(f"{t}: predicted / measured" for t in TITLES) + " |", "|---|" + "---:|" * len(PHASES)]
    for rid, (pred, meas) in got.items():
        if not rid.startswith("head-"):
            continue
        twin = got["no" + rid]
        out.append(f"| {rid} | " + " | ".join(f"{int(pred[p] - twin[0][p]):,} / {meas[p] - twin[1][p]:,}" for p in PHASES)
                   + " |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table())
    print()
    print(deltas())
