#!/usr/bin/env python
"""The measured profile against recompute_measurements.json (Megatron-Core's full recompute of gpt-oss's MoE layers,
measure_recompute.py), per run and phase: the table of docs/validation.md.

    python validation/megatron_gpt_oss/compare_recompute.py [--doc]

``--doc`` rewrites the table between its markers in docs/validation.md. The measured side of each phase is the
moment the harness records (the forward's end, the first backward's bottom-layer recompute, the last one's, after
the iteration), put back on the bytes alive at the start (the previous iteration's held tensors), less what the
profile counts elsewhere (a later stage's received gradient: its pipeline buffer term; the loss's and pseudo-freed
outputs' few bytes); the profile's side is its recompute and dispatcher terms, the recompute working sets without
the attention's and norms' share (784 B a token, not run by the harness) and the MLP backward's transient
activation gradients (tests/measured/test_megatron_gpt_oss_recompute.py derives every moment by hand)."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "measured"))
sys.path.insert(0, os.path.dirname(HERE))

import test_megatron_gpt_oss_recompute as t  # noqa: E402  (the tiny model, the solve, the term selection)
from report import write_table  # noqa: E402  (validation/report.py: the compare scripts' --doc)

BEGIN = "<!-- gpt-oss-megatron-recompute-table: begin (validation/megatron_gpt_oss/compare_recompute.py --doc) -->"
END = "<!-- gpt-oss-megatron-recompute-table: end -->"


def rows() -> list[str]:
    out = ["| run | pp | stage | micro-batches | layers | ep | phase | measured B | profile B | error |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for run in t.RUNS:
        pp, stage, m, L, ep = (run[n] for n in ("pp", "stage", "microbatches", "layers", "ep"))
        meas = run["measured"]
        n, last = min(pp - stage, m), stage == pp - 1
        held, counts = meas["held"], meas["held_other"]["num_global_tokens_per_local_expert"]
        graph = meas["held_graph"]
        start = held + counts + meas["held_row_id_map"] + graph["inputs"] + graph["input_grads"]
        recv, loss = (0, 4) if last else (t.X, 0)
        measured = {t.FORWARD: meas["forward_peak"] + start - 2 * n,
                    t.BACKWARD: meas["recompute_peak"] + start - recv - loss - 2 * n,
                    t.BACKWARD_END: meas["after_recompute"][-1] + start - recv - loss - 2,
                    t.OPTIMIZER_STEP: meas["after_iteration"] + held + sum(meas["held_other"].values())
                    + graph["inputs_after"] + graph["input_grads_after"]}
        options = {} if ep == 1 else {"moe_routing_imbalance": meas["received"][0] / (t.T * t.K)}
        rank = t.rank_of(t.solve(L * pp, pp, m, ep, **options), stage)
        for phase, value in measured.items():
            profile = t.moe_share(t.recompute_terms(rank, phase))
            out.append(f"| {run['id']} | {pp} | {stage} | {m} | {L} | {ep} | {phase} | {value:,} | {profile:,.0f} | "
                       f"{100 * (profile / value - 1):+.3f} % |")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    table = "\n".join(rows())
    if "--doc" not in argv:
        print(table)
        return 0
    write_table(table, BEGIN, END)
    print("wrote docs/validation.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
