#!/usr/bin/env python
"""The measured profile's ``compile=True`` against the compiled runs of measurements.json, every phase.

    python validation/compile/compare.py            # the project's environment (mlsysim-core), no torch

Prints README.md's and docs/compile.md's validation table: per run the predicted and measured bytes of the
forward peak, the backward peak, the optimizer's peak, and what is alive at the end of the forward and of
the backward (absolute: the timeline's figures plus what was alive at its zero, ``baseline_bytes``), and the
median and largest |error| per phase. The same comparison is asserted by tests/measured/test_compile.py.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PHASES = ("forward", "backward", "optimizer", "end_of_forward", "end_of_backward")
TITLES = ("forward peak", "backward peak", "optimizer peak", "end of forward", "end of backward")


def rows(path: str = os.path.join(HERE, "measurements.json")):
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, OPTIMIZER_STEP
    from mlsysim_core.types import HardwareNode

    big = HardwareNode(name="unbounded", memory_capacity=2**60)
    with open(path) as f:
        runs = [r for r in json.load(f)["runs"] if r.get("measured")]
    solver = TrainingMemoryModel()
    for run in runs:
        model = from_hf_config(run["hf_config"], name=run["id"])
        r = solver.solve(model, big, run["batch_size"], run["seq_len"], run["regime"], "adamw", run["checkpointing"],
                         profile="measured", regime=run["regime"], attention="sdpa", device="cpu",
                         runtime_overheads=False, compile=True)
        t = r.phase_totals
        pred = {"forward": t[FORWARD], "backward": max(t[BACKWARD], t[BACKWARD_END]), "optimizer": t[OPTIMIZER_STEP],
                "end_of_forward": sum(x.nbytes for x in r.terms if FORWARD in x.phases and BACKWARD in x.phases),
                "end_of_backward": sum(x.nbytes for x in r.terms if OPTIMIZER_STEP in x.phases and (
                    tuple(x.phases) != (OPTIMIZER_STEP,) or x.component == GRADIENTS))}
        m = run["measured"]["compiled"]
        base = m["baseline_bytes"]
        meas = {"forward": m["peak_by_phase"]["forward"], "backward": m["peak_by_phase"]["backward"],
                "optimizer": m["peak_by_phase"]["optimizer"], "end_of_forward": m["alive"]["end_of_forward"],
                "end_of_backward": m["alive"]["end_of_backward"]}
        meas = {k: base + v for k, v in meas.items()}
        yield run["id"], pred, meas, base


def table(path: str = os.path.join(HERE, "measurements.json")) -> str:
    out = ["| run | " + " | ".join(f"{t}: predicted / measured (error)" for t in TITLES) + " |",
           "|---|" + "---:|" * len(PHASES)]
    errs = {p: [] for p in PHASES}
    above = {p: [] for p in PHASES}
    for rid, pred, meas, base in rows(path):
        cells = []
        for p in PHASES:
            e = (pred[p] - meas[p]) / meas[p]
            errs[p].append(abs(e))
            above[p].append(abs(pred[p] - meas[p]) / max(meas[p] - base, 1))
            cells.append(f"{pred[p] / 1e6:,.3f} / {meas[p] / 1e6:,.3f} MB ({100 * e:+.2f} %)")
        out.append(f"| {rid} | " + " | ".join(cells) + " |")
    out.append("| **median / max \\|error\\|** | " + " | ".join(
        f"{100 * statistics.median(errs[p]):.2f} % / {100 * max(errs[p]):.2f} %" for p in PHASES) + " |")
    out.append("| median / max \\|error\\| of the bytes above the timeline's zero (activations, gradients, "
               "temporaries) | " + " | ".join(f"{100 * statistics.median(above[p]):.2f} % / {100 * max(above[p]):.2f} %"
                                             for p in PHASES) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
