#!/usr/bin/env python
"""Compare the float8 runs (measurements.json) with the measured profile, phase by phase. No torch.

    .venv/bin/python validation/techniques/float8/compare_float8.py

Each run is solved as validation/families/report_families.py solves a family run (device="cpu", no
runtime overheads) with ``float8=<the run's recipe>``; the forward, backward (the larger of the
backward and its end) and optimizer phases are compared with MemTracker's phase peaks.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "families"))
sys.path.insert(0, str(HERE.parent.parent))

from report_families import PHASES, predicted_phases, solve as family_solve  # noqa: E402


def load() -> list[dict]:
    doc = json.loads((HERE / "measurements.json").read_text(encoding="utf-8"))
    return [r for r in doc["runs"] if r.get("measured", {}).get("peak_bytes")]


def solve(run: dict):
    if run.get("float8"):
        run = {**run, "solve_options": {**run.get("solve_options", {}), "float8": run["float8"]}}
    return family_solve(run)


def compare(runs: list[dict]) -> list[dict]:
    rows = []
    for run in runs:
        result = solve(run)
        predicted = predicted_phases(result)
        measured = {p: run["measured"]["peak_by_phase"][p]["bytes"] for p in PHASES}
        rows.append({"id": run["id"], "family": run["family"], "predicted": predicted, "measured": measured,
                     "errors": {p: (predicted[p] - m) / m for p, m in measured.items()},
                     "peak_error": (result.total_memory - run["measured"]["peak_bytes"]) / run["measured"]["peak_bytes"]})
    return rows


def main() -> int:
    rows = compare(load())
    print(f"{'run':<40} {'peak':>8} {'forward':>8} {'backward':>9} {'optimizer':>9}")
    for r in rows:
        e = r["errors"]
        print(f"{r['id']:<40} {r['peak_error']:+8.2%} {e['forward']:+8.2%} {e['backward']:+9.2%} {e['optimizer']:+9.2%}")
    for fam in sorted({r["family"] for r in rows}):
        sel = [r for r in rows if r["family"] == fam]
        peaks = [abs(r["peak_error"]) for r in sel]
        phases = [abs(v) for r in sel for v in r["errors"].values()]
        print(f"{fam}: {len(sel)} runs, peak median {statistics.median(peaks):.2%} max {max(peaks):.2%}; "
              f"phases median {statistics.median(phases):.2%} max {max(phases):.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
