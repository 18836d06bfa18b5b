#!/usr/bin/env python
"""Checkpointing policies under tensor parallelism: the measured profile's per-rank, per-phase prediction
against measurements.json here (no torch needed).

    .venv/bin/python validation/parallel/policies/compare_policies.py            # every run, every phase
    .venv/bin/python validation/parallel/policies/compare_policies.py --doc      # rewrite the table in docs/validation.md
    .venv/bin/python validation/parallel/policies/compare_policies.py --check    # fail if the table is stale

Each run is solved as it was made (``../tp_plans/compare_tp_plans.py``'s solve, with the run's policy and its
options): ``TrainingMemoryModel("measured").solve(from_hf_config(run["hf_config"]), b, s, regime, optimizer="adamw",
optimizer_impl="foreach", attention="sdpa", activation_checkpointing=<policy>, plugin_options={policy: options},
tp_size=tp, dp_size=1, sequence_parallel=<plan's>, loss_parallel=<plan's>, runtime_overheads=False, device="cpu")``;
``result.ranks[0].phase_totals`` (rank 0, the rank measured). Phases: forward, backward (the larger of the
predicted backward and backward end, as the measured backward runs to the embedding's backward), backward end
(measured: the peak from the first decoder layer's backward on, its recompute included, to the end of the
backward: ``max(backward_first_layer, backward_embedding)``), optimizer step, and the peak.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PHASES = (("forward", "forward"), ("backward", "backward"), ("backward_end", "backward_embedding"),
          ("optimizer_step", "optimizer"))
DOC = ROOT / "docs" / "validation.md"
BEGIN = "<!-- policies-parallel-table: begin (validation/parallel/policies/compare_policies.py --doc) -->"
END = "<!-- policies-parallel-table: end -->"


def load(path: Path | None = None) -> dict:
    return json.loads((path or HERE / "measurements.json").read_text())


def solve(run: dict):
    from mlsysim_core import HardwareNode, TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    model = from_hf_config(run["hf_config"], name=run["model"])
    policy = run["checkpointing"]
    options = {policy: run["policy_options"]} if run["policy_options"] else None
    return TrainingMemoryModel("measured").solve(
        model, HardwareNode(name="cpu", memory_capacity=2**40), run["batch_size"], run["seq_len"],
        precision="fp32", optimizer=run["optimizer"], optimizer_impl=run["optimizer_impl"],
        attention=run["attention"], activation_checkpointing=policy, plugin_options=options, regime=run["regime"],
        tp_size=run["tp"], dp_size=1, sequence_parallel=run["plan"]["sequence_parallel"],
        loss_parallel=run["plan"].get("loss_parallel", False), runtime_overheads=False, device="cpu")


def rows(data: dict | None = None) -> list[dict]:
    out = []
    for run in (data or load())["runs"]:
        result = solve(run)
        pred = dict(result.ranks[0].phase_totals)
        pred["backward"] = max(pred["backward"], pred["backward_end"])
        m = run["measured"]
        meas = {ph: m["peak_by_phase"][key]["bytes"] for ph, key in PHASES}
        # The predicted backward end is the larger of the first layer's backward (with its recompute) and the
        # embedding's: measured, the peak from the first layer's backward on (backward_first_layer).
        if "backward_first_layer" in m["peak_by_phase"]:
            meas["backward_end"] = max(meas["backward_end"], m["peak_by_phase"]["backward_first_layer"]["bytes"])
        errors = {ph: pred[ph] / meas[ph] - 1 for ph, _ in PHASES}
        out.append(dict(id=run["id"], policy=run["checkpointing"], plan=run["plan"]["name"], tp=run["tp"],
                        sequence_parallel=run["plan"]["sequence_parallel"], measured=m["peak_bytes"],
                        predicted=int(result.total_memory), peak_error=result.total_memory / m["peak_bytes"] - 1,
                        errors=errors))
    return out


def summary(table: list[dict]) -> dict:
    peak = [abs(r["peak_error"]) for r in table]
    phases = [abs(e) for r in table for e in r["errors"].values()]
    return {"runs": len(table), "peak_median": statistics.median(peak), "peak_max": max(peak),
            "phase_median": statistics.median(phases), "phase_max": max(phases)}


def doc_table(table: list[dict]) -> str:
    lines = [BEGIN, "",
             "| policy | plan | SP | tp | measured peak (B) | predicted (B) | peak | forward | backward | backward end "
             "| step |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        e = r["errors"]
        lines.append(f"| {r['policy']} | {r['plan']} | {'yes' if r['sequence_parallel'] else 'no'} | {r['tp']} | "
                     f"{r['measured']:,} | {r['predicted']:,} | {100 * r['peak_error']:+.2f} % | "
                     + " | ".join(f"{100 * e[ph]:+.2f} %" for ph, _ in PHASES) + " |")
    s = summary(table)
    lines += ["", f"{s['runs']} runs: peak median |err| {100 * s['peak_median']:.2f} %, max {100 * s['peak_max']:.2f} %; "
              f"every phase median {100 * s['phase_median']:.2f} %, max {100 * s['phase_max']:.2f} %.", "", END]
    return "\n".join(lines)


def update_doc(table: list[dict], check: bool) -> int:
    text = DOC.read_text(encoding="utf-8")
    if BEGIN not in text:
        print(f"{DOC}: no policies-parallel table markers", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = head + doc_table(table) + tail
    if check:
        if new != text:
            print(f"{DOC}: the policies-parallel table is stale; run {Path(__file__).name} --doc", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    table = rows()
    if "--doc" in argv or "--check" in argv:
        return update_doc(table, "--check" in argv)
    for r in table:
        print(f"{r['id']:<62} peak {100 * r['peak_error']:+6.2f} %  "
              + "  ".join(f"{ph} {100 * e:+6.2f} %" for ph, e in r["errors"].items()))
    s = summary(table)
    print(f"{s['runs']} runs: peak median {100 * s['peak_median']:.2f} % max {100 * s['peak_max']:.2f} %, "
          f"every phase median {100 * s['phase_median']:.2f} % max {100 * s['phase_max']:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
