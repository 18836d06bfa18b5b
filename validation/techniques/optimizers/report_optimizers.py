"""Compare the optimizer runs (measurements.json) with the measured profile, phase by phase.
No torch.

    .venv/bin/python validation/techniques/optimizers/report_optimizers.py

Each measured phase (forward, backward, optimizer step) is compared with the prediction's
bytes alive in that phase (the backward: the larger of backward and backward_end), the error
relative to the measured phase (validation/families/report_families.py's convention).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "families"))
sys.path.insert(0, str(HERE.parent.parent))

from report_families import PHASES, predicted_phases, solve  # noqa: E402


def load() -> list[dict]:
    doc = json.loads((HERE / "measurements.json").read_text(encoding="utf-8"))
    return [r for r in doc["runs"] if r.get("measured", {}).get("peak_bytes")]


def compare(runs=None) -> list[dict]:
    rows = []
    for run in runs if runs is not None else load():
        result = solve(run)
        predicted = predicted_phases(result)
        phases = run["measured"]["peak_by_phase"]
        measured = {p: phases[p]["bytes"] for p in PHASES if p in phases}
        peak = max(measured.values())
        rows.append({"run": run, "result": result, "predicted": predicted, "measured": measured,
                     "errors": {p: (predicted[p] - m) / m for p, m in measured.items()},
                     "peak_error": (max(predicted[p] for p in measured) - peak) / peak})
    return rows


def table(rows) -> str:
    lines = ["| run | optimizer | regime | measured peak | peak error | forward | backward | optimizer step |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        run, e = r["run"], r["errors"]
        impl = "" if run["optimizer_impl"] == "foreach" else f" ({run['optimizer_impl']} AdamW part)"
        lines.append(f"| {run['model']} | `{run['optimizer']}`{impl} | {run['regime']} | "
                     f"{max(r['measured'].values()) / 2**20:.2f} MiB | {r['peak_error']:+.2%} | "
                     + " | ".join(f"{e[p]:+.2%}" for p in PHASES) + " |")
    errs = [abs(r["peak_error"]) for r in rows]
    phase = [abs(x) for r in rows for x in r["errors"].values()]
    lines.append(f"\n{len(rows)} runs: peak median {statistics.median(errs):.2%}, max {max(errs):.2%}; "
                 f"every phase median {statistics.median(phase):.2%}, max {max(phase):.2%}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(compare()))
