#!/usr/bin/env python
"""Phase-by-phase: the estimator's per-rank prediction against measurements.json (no torch needed).

    python3 validation/parallel/tp_phases/compare_tp_phases.py [--json]

Each run is solved exactly as ../compare.py maps a run to a solve (``compare.predict``: the model from the run's HF
config, ``TrainingMemoryModel("measured")``, regime bf16, AdamW foreach, SDPA, no recomputation, tp_size = the
world size, sequence_parallel=False, runtime_overheads=False). Phases:

| measured (this rank)                       | predicted (``result.ranks[0].phase_totals``) |
|--------------------------------------------|----------------------------------------------|
| ``peak_by_phase.forward``                  | ``forward``                                  |
| ``peak_by_phase.backward``                 | ``backward``                                 |
| ``peak_by_phase.backward_embedding``       | ``backward_end``                             |
| ``peak_by_phase.optimizer``                | ``optimizer_step``                           |
| ``alive.end_of_forward`` / ``end_of_backward`` / ``end_of_step`` | (no predicted phase; shown, not compared) |

``backward_embedding`` is the peak from the embedding's backward op (``aten.embedding_dense_backward``) to the end of
the backward, the moment the estimator's ``backward_end`` phase describes (its terms: the embedding gradient being
computed, the gradient of the embedding output).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import compare  # noqa: E402  (../compare.py: run -> solve)

PHASES = (("forward", "forward peak"), ("backward", "backward peak"), ("backward_end", "embedding backward"),
          ("optimizer_step", "optimizer-step peak"))
GiB = 2**30


def measured_phases(m: dict) -> dict:
    return {
        "forward": m["peak_by_phase"]["forward"]["bytes"],
        "backward": m["peak_by_phase"]["backward"]["bytes"],
        "backward_end": m["peak_by_phase"]["backward_embedding"]["bytes"],
        "end_of_backward": m["alive"]["end_of_backward"]["bytes"],
        "optimizer_step": m["peak_by_phase"]["optimizer"]["bytes"],
        "end_of_forward": m["alive"]["end_of_forward"]["bytes"],
        "end_of_step": m["alive"]["end_of_step"]["bytes"],
    }


def rows(data: dict) -> list[dict]:
    out = []
    for run in data["runs"]:
        result = compare.predict(run)
        rank = result.ranks[0] if result.ranks else result
        pred = dict(rank.phase_totals)
        meas = measured_phases(run["measured"])
        tp = run["layout"]["world_size"]
        layers = run["hf_config"]["num_hidden_layers"]
        for ph, label in PHASES:
            out.append(dict(id=run["id"], layers=layers, tp=tp, phase=ph, label=label, measured=meas[ph],
                            predicted=pred[ph], diff=meas[ph] - pred[ph]))
        out.append(dict(id=run["id"], layers=layers, tp=tp, phase="peak", label="peak (max)",
                        measured=run["measured"]["peak_bytes"], predicted=result.total_memory,
                        diff=run["measured"]["peak_bytes"] - result.total_memory,
                        measured_phase=run["measured"]["peak_phase"], predicted_phase=result.peak_phase))
    return out


def main() -> int:
    data = json.loads((HERE / "measurements.json").read_text())
    table = rows(data)
    if "--json" in sys.argv:
        print(json.dumps(table, indent=1))
        return 0
    print(f"{'L':>3} {'tp':>3}  {'phase':<22} {'measured B':>15} {'predicted B':>15} {'meas GiB':>9} {'pred GiB':>9} "
          f"{'meas-pred B':>14} {'err':>8}")
    for r in table:
        print(f"{r['layers']:3d} {r['tp']:3d}  {r['label']:<22} {r['measured']:15,d} {int(r['predicted']):15,d} "
              f"{r['measured'] / GiB:9.3f} {r['predicted'] / GiB:9.3f} {int(r['diff']):14,d} "
              f"{r['predicted'] / r['measured'] - 1:+8.3%}"
              + (f"  ({r['measured_phase']} / {r['predicted_phase']})" if r["phase"] == "peak" else ""))
    print("measured only (alive at the phase boundaries, bytes):")
    for run in data["runs"]:
        m = measured_phases(run["measured"])
        print(f"  {run['id']:45} end_of_forward {m['end_of_forward']:15,d}  end_of_backward {m['end_of_backward']:15,d}"
              f"  end_of_step {m['end_of_step']:15,d}")
    worst = max(abs(r["diff"]) for r in table)
    print(f"largest |measured - predicted| over {len(table)} rows: {int(worst):,d} B ({worst / 2**20:.3f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
