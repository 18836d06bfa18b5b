#!/usr/bin/env python
"""The rows of docs/validation.md's "Published loss implementations" table: each run of
published_measurements.json solved with the measured profile (device="cpu", sdpa, no runtime
overheads, as test_technique_loss.py solves) against every measured phase.

    python validation/techniques/loss/report_published.py          # (mlsysim-core's environment)
"""

from __future__ import annotations

import json
from pathlib import Path

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.hf import from_hf_config
from mlsysim_core.types import HardwareNode

HERE = Path(__file__).resolve().parent
RUNS = HERE / "published_measurements.json"
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
PRECISION = {"fp32": "fp32", "bf16": "bf16", "amp-bf16": "bf16"}
PHASES = ("forward", "backward", "optimizer")


def runs() -> list[dict]:
    return [r for r in json.loads(RUNS.read_text(encoding="utf-8"))["runs"] if "measured" in r]


def errors(run) -> dict:
    """(prediction - measurement) / measurement, per phase and at the peak."""
    model = from_hf_config(run["hf_config"], name=run["id"])
    r = TrainingMemoryModel().solve(model, BIG, run["batch_size"], run["seq_len"], PRECISION[run["regime"]],
                                    "adamw", run["checkpointing"], profile="measured", regime=run["regime"],
                                    attention="sdpa", device="cpu", runtime_overheads=False,
                                    **run.get("solve_options", {}))
    t = r.phase_totals
    pred = {"forward": t.get("forward", 0), "backward": max(t.get("backward", 0), t.get("backward_end", 0)),
            "optimizer": t.get("optimizer_step", 0)}
    meas = {p: run["measured"]["peak_by_phase"][p]["bytes"] for p in PHASES}
    out = {p: (pred[p] - meas[p]) / meas[p] for p in PHASES}
    out["peak"] = (r.total_memory - run["measured"]["peak_bytes"]) / run["measured"]["peak_bytes"]
    return out


def table() -> str:
    lines = ["| run | loss | regime | measured peak MiB (phase) | peak | forward | backward | optimizer |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs():
        e, m = errors(run), run["measured"]
        loss = run["loss"] + (f" (share {run['share']:g})" if run.get("share") else "")
        lines.append(f"| {run['id']} | {loss} | {run['regime']} | {m['peak_bytes'] / 2**20:.2f} ({m['peak_phase']}) | "
                     + " | ".join(f"{100 * e[k]:+.2f} %" for k in ("peak", *PHASES)) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
