#!/usr/bin/env python
"""The committed measurements against the measured profile, every phase (no torch).

    .venv/bin/python validation/techniques/oib_combinations/compare.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PHASES = ("forward", "backward", "optimizer")
PRECISION = {"fp32": "fp32", "bf16": "bf16", "amp-bf16": "bf16"}


def load() -> list[dict]:
    return [r for r in json.loads((HERE / "measurements.json").read_text(encoding="utf-8"))["runs"] if "measured" in r]


def solve(run: dict, **more):
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.types import HardwareNode
    model = from_hf_config(run["hf_config"], name=run["id"])
    big = HardwareNode(name="unbounded", memory_capacity=2**60)
    policy = run["checkpointing"]
    plugin_options = {policy: run["policy_options"]} if run["policy_options"] else None
    options = dict(regime=run["regime"], optimizer_impl=run["optimizer_impl"], attention=run["attention"],
                   device="cpu", dropout=0.0, runtime_overheads=False, **{**run["solve_options"], **more})
    return TrainingMemoryModel().solve(model, big, run["batch_size"], run["seq_len"], PRECISION[run["regime"]],
                                       run["optimizer"], policy, profile="measured", plugin_options=plugin_options,
                                       **options)


def predicted_phases(result) -> dict:
    t = result.phase_totals
    return {"forward": t.get("forward", 0), "optimizer": t.get("optimizer_step", 0),
            "backward": max(t.get("backward", 0), t.get("backward_end", 0)),
            "backward_only": t.get("backward", 0), "backward_end": t.get("backward_end", 0)}


def errors(run: dict) -> dict:
    result = solve(run)
    p = predicted_phases(result)
    m = run["measured"]
    out = {ph: (p[ph] - m["peak_by_phase"][ph]["bytes"]) / m["peak_by_phase"][ph]["bytes"] for ph in PHASES}
    out["peak"] = (result.total_memory - m["peak_bytes"]) / m["peak_bytes"]
    return out


def main() -> int:
    rows, every = [], []
    print("| run | measured peak MiB | peak | forward | backward | optimizer |\n|---|---:|---:|---:|---:|---:|")
    for run in load():
        e = errors(run)
        every += [abs(v) for v in e.values()]
        rows.append(e)
        print(f"| {run['id']} | {run['measured']['peak_bytes'] / 2**20:.2f} | {e['peak']:+.3%} | "
              f"{e['forward']:+.3%} | {e['backward']:+.3%} | {e['optimizer']:+.3%} |")
    if every:
        print(f"\n{len(rows)} runs: every phase and peak median {statistics.median(every):.3%}, max {max(every):.3%}")
    return 0 if every and statistics.median(every) <= 0.03 and max(every) <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
