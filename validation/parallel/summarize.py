#!/usr/bin/env python
"""Print the per-rank measurements of measurements.json next to their single-device baselines (no torch needed).

    python3 validation/parallel/summarize.py [validation/parallel/measurements.json] [--full]

One line per run: the peak (MiB) and where it is; the model states alive at the start of the measured iteration
as a multiple of the local parameter count (bytes per local parameter); the activation alive at the end of the
forward and the per-layer retained bytes as fractions of the single-device run; with ``--full`` also the split at
the peak, in bytes.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    full = "--full" in argv
    argv = [a for a in argv if a != "--full"]
    path = argv[0] if argv else os.path.join(HERE, "measurements.json")
    with open(path) as f:
        doc = json.load(f)
    single = {r["id"]: r["measured"] for r in doc["single_device"] if "measured" in r}
    print(f"{'id':<58} {'peak MiB':>9} {'phase':<9} {'states B/p':>10} {'act_fw/1dev':>11} {'layer/1dev':>10}")
    for r in doc["runs"]:
        if "measured" not in r:
            print(f"{r['id']:<58} ERROR {r.get('error', '')[:80]}")
            continue
        m, s = r["measured"], single.get(r["single_device_id"])
        start = m["alive"]["start"]["bytes"]
        act = m["alive"]["end_of_forward"]["by_category"]["activation"]
        act1 = s["alive"]["end_of_forward"]["by_category"]["activation"] if s else None
        lay = m.get("layer_forward_retained_bytes")
        lay1 = s.get("layer_forward_retained_bytes") if s else None
        lr = f"{lay[0] / lay1[0]:.4f}" if lay and lay1 and lay[0] is not None else "-"
        print(f"{r['id']:<58} {m['peak_bytes'] / 2**20:9.2f} {m['peak_phase']:<9} "
              f"{start / m['local_parameters']:10.3f} {act / act1 if act1 else float('nan'):11.4f} {lr:>10}")
        if full:
            print("    peak:", {k: v for k, v in m["by_category_at_peak"].items() if v}, m["peak_op"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
