"""Compare every checkpointing-policy run (measurements.json here) with the measured profile, phase by
phase (forward, backward = the larger of backward and backward_end predicted, optimizer). No torch.

    .venv/bin/python validation/techniques/checkpointing/compare.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "families"))
sys.path.insert(0, str(HERE.parents[1]))

from report_families import PHASES, predicted_phases  # noqa: E402
from report import REFERENCE_PRECISION  # noqa: E402


def load() -> list[dict]:
    return [r for r in json.loads((HERE / "measurements.json").read_text(encoding="utf-8"))["runs"]
            if r.get("measured", {}).get("peak_bytes")]


def solve(run: dict):
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.types import HardwareNode
    model = from_hf_config(run["hf_config"], name=run["id"])
    big = HardwareNode(name="unbounded", memory_capacity=2**60)
    policy = run["checkpointing"]
    plugin_options = {policy: run["policy_options"]} if run["policy_options"] else None
    return TrainingMemoryModel().solve(model, big, run["batch_size"], run["seq_len"], REFERENCE_PRECISION[run["regime"]],
                                       run["optimizer"], policy, profile="measured", plugin_options=plugin_options,
                                       regime=run["regime"], optimizer_impl=run["optimizer_impl"],
                                       attention=run["attention"], device="cpu", dropout=0.0, runtime_overheads=False)


def compare(runs=None) -> list[dict]:
    rows = []
    for run in runs if runs is not None else load():
        result = solve(run)
        predicted = predicted_phases(result)
        measured = {p: run["measured"]["peak_by_phase"][p]["bytes"] for p in PHASES}
        rows.append({"run": run, "result": result, "predicted": predicted, "measured": measured,
                     "errors": {p: (predicted[p] - m) / m for p, m in measured.items()},
                     "peak_error": (result.total_memory - run["measured"]["peak_bytes"]) / run["measured"]["peak_bytes"]})
    return rows


def summary(rows) -> dict:
    out = {}
    for row in rows:
        s = out.setdefault(row["run"]["family"], {"runs": 0, "peak": [], "phases": []})
        s["runs"] += 1
        s["peak"].append(abs(row["peak_error"]))
        s["phases"] += [abs(e) for e in row["errors"].values()]
    return {f: {"runs": s["runs"], "peak_median": statistics.median(s["peak"]), "peak_max": max(s["peak"]),
                "phase_median": statistics.median(s["phases"]), "phase_max": max(s["phases"])} for f, s in out.items()}


def main() -> int:
    rows = compare()
    for row in rows:
        print(f"{row['run']['id']:<62} peak {100 * row['peak_error']:+6.2f} %  "
              + "  ".join(f"{p} {100 * e:+6.2f} %" for p, e in row["errors"].items()))
    for fam, s in summary(rows).items():
        print(f"{fam}: {s['runs']} runs, peak median {100 * s['peak_median']:.2f} % max {100 * s['peak_max']:.2f} %, "
              f"every phase median {100 * s['phase_median']:.2f} % max {100 * s['phase_max']:.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
