#!/usr/bin/env python
"""LoRA per tensor-parallel rank: the measured profile's rank against measure_lora_tp.py's measurements.

    .venv/bin/python validation/lora_parallel/compare_tp.py          # the table
    .venv/bin/python validation/lora_parallel/compare_tp.py --sp     # with sequence parallelism (measure_lora_sp.py)
    .venv/bin/python validation/lora_parallel/compare_tp.py --dp     # with data parallelism (measure_lora_tp_dp.py)
    .venv/bin/python validation/lora_parallel/compare_tp.py --loss   # Megatron's loss (measure_lora_tp_loss.py)
    .venv/bin/python validation/lora_parallel/compare_tp.py [--sp | --dp | --loss] --doc   # and rewrite it in docs/validation.md

Needs no torch. Each measured rank is solved as the run was laid out (``tp_size`` = the world, sequence
parallelism as measured, LoRA as measured: Megatron-Bridge's adapters, in the base's dtype) and each measured phase's peak is
compared with the rank's bytes in that phase. The tensor-parallel rule's communication buffers are left out of the
prediction compared: the fake process group has no transport (what a collective leaves on the rank is in the
activations). With ``--dp`` each rank is solved with the regime and the data-parallel rule it ran (``model_regime``:
``mixed-bf16-main-grad``; ``layout.data_parallel``: ``mcore-distopt`` or ``mcore-ddp``), ``dp_size`` (the global batch: the rank's x dp) and fused Adam.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = HERE / "tp_measurements.json"
SP_DATA = HERE / "sp_measurements.json"      # measure_lora_sp.py: with sequence parallelism
DP_DATA = HERE / "tp_dp_measurements.json"   # measure_lora_tp_dp.py: with data parallelism (Megatron-Core's rules)
LOSS_DATA = HERE / "tp_loss_measurements.json"   # measure_lora_tp_loss.py: Megatron's vocab-parallel cross-entropy
DOC = ROOT / "docs" / "validation.md"
MARKERS = {"loss": ("<!-- lora-tp-loss-table: begin (validation/lora_parallel/compare_tp.py --loss --doc) -->",
                    "<!-- lora-tp-loss-table: end -->"),
           "dp": ("<!-- lora-tp-dp-table: begin (validation/lora_parallel/compare_tp.py --dp --doc) -->",
                  "<!-- lora-tp-dp-table: end -->"),
           False: ("<!-- lora-tp-table: begin (validation/lora_parallel/compare_tp.py --doc) -->",
                   "<!-- lora-tp-table: end -->"),
           True: ("<!-- lora-sp-table: begin (validation/lora_parallel/compare_tp.py --sp --doc) -->",
                  "<!-- lora-sp-table: end -->")}
PHASES = {"forward": ("forward",), "backward": ("backward", "backward_end"), "optimizer": ("optimizer_step",)}


def runs(path=DATA) -> list[dict]:
    return json.loads(Path(path).read_text(encoding="utf-8"))["runs"]


def solve(run):
    from mlsysim_core import HardwareNode, TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    model = from_hf_config(run["hf_config"], name=run["model"])
    lay = run["layout"]
    dp = {"dp_size": lay.get("dp_size", 1)}
    if "data_parallel" in lay:
        dp["data_parallel"] = lay["data_parallel"]
    if "loss" in run:           # measure_lora_tp_loss.py: Megatron's vocab-parallel cross-entropy
        dp["loss"] = run["loss"]
    lora = {"rank": run["lora"]["rank"], "target_modules": run["lora"]["target_modules"],
            "adapter_dtype": "base", "dropout": run["lora"].get("dropout", 0.0)}
    return TrainingMemoryModel("measured").solve(
        model, HardwareNode(name="cpu", memory_capacity=2**40), run["batch_size"] * dp["dp_size"], run["seq_len"], precision="fp32",
        optimizer="adamw", activation_checkpointing="none", regime=run.get("model_regime", run["regime"]),
        optimizer_impl=run["optimizer_impl"],
        attention="sdpa", runtime_overheads=False, lora=lora, device="cpu", tp_size=lay.get("tp_size", lay["world_size"]), **dp,
        sequence_parallel=lay["kind"] == "tp+sp")


def phases(rank) -> dict[str, float]:
    from mlsysim_core.terms import ACCELERATOR, COMMUNICATION_BUFFERS
    return {name: max(sum(t.nbytes for t in rank.terms if t.component != COMMUNICATION_BUFFERS and p in t.phases
                          and t.tier == ACCELERATOR) for p in ours) for name, ours in PHASES.items()}


def compare(run) -> dict:
    result = solve(run)
    rank = result.ranks[0]
    predicted = phases(rank)
    measured = {p: run["measured"]["peak_by_phase"][p]["bytes"] for p in PHASES}
    peak_m, peak_p = run["measured"]["peak_bytes"], max(predicted.values())
    return {"predicted": predicted, "measured": measured,
            "errors": {p: (predicted[p] - m) / m for p, m in measured.items()},
            "peak": (peak_m, peak_p, (peak_p - peak_m) / peak_m)}


def table(path=DATA) -> str:
    lines = ["| run | measured peak (B) | predicted (B) | peak | forward | backward | step |",
             "|---|---|---|---|---|---|---|"]
    errors, peaks = [], []
    for run in runs(path):
        c = compare(run)
        pm, pp, pe = c["peak"]
        peaks.append(abs(pe))
        errors += [abs(e) for e in c["errors"].values()]
        lines.append(f"| {run['id']} | {pm:,} | {pp:,.0f} | {pe:+.2%} | "
                     + " | ".join(f"{c['errors'][p]:+.2%}" for p in PHASES) + " |")
    lines += ["", f"{len(peaks)} ranks: peak median |err| {statistics.median(peaks):.2%}, max {max(peaks):.2%}; "
              f"every phase median {statistics.median(errors):.2%}, max {max(errors):.2%}."]
    return "\n".join(lines).replace("%", " %")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sp", action="store_true", help="the runs with sequence parallelism (sp_measurements.json)")
    ap.add_argument("--dp", action="store_true", help="the runs with data parallelism (tp_dp_measurements.json)")
    ap.add_argument("--loss", action="store_true", help="the runs with Megatron's vocab-parallel cross-entropy "
                    "(tp_loss_measurements.json)")
    ap.add_argument("--doc", action="store_true", help="rewrite the table in docs/validation.md")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    text = table(LOSS_DATA if args.loss else DP_DATA if args.dp else SP_DATA if args.sp else DATA)
    print(text)
    if args.doc:
        sys.path.insert(0, str(ROOT / "validation"))
        from report import write_table      # validation/report.py's
        write_table(text, *MARKERS["loss" if args.loss else "dp" if args.dp else args.sp], DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
