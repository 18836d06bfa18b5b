#!/usr/bin/env python
"""LoRA / QLoRA per pipeline stage: the measured profile's rank against measure_lora_pp.py's measurements.

    .venv/bin/python validation/lora_parallel/compare_pp.py          # the table
    .venv/bin/python validation/lora_parallel/compare_pp.py --doc    # and rewrite it in docs/validation.md
    .venv/bin/python validation/lora_parallel/compare_pp.py --tp [--doc]   # the stages of a tensor-parallel model
                                                                            # (measure_lora_tp_pp.py's)

Needs no torch. Each measured stage is solved as the run was laid out (``pp_size``, 1F1B over
``gradient_accumulation_steps`` = m micro-batches, the micro-batch b, LoRA as measured) and compared with the
rank class holding that stage (first, middle, last: a middle stage another middle stage dominates has no class of
its own and is listed as not compared). The pipeline rule's send + receive staging buffers (communication buffers:
the NCCL side of the transfer) are left out of the prediction compared: a stage measured alone has no transport;
what a receive leaves on the stage (the received input and gradient) is in the activations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = HERE / "pp_measurements.json"
TP_DATA = HERE / "tp_pp_measurements.json"     # measure_lora_tp_pp.py: stages of a tensor-parallel model
DOC = ROOT / "docs" / "validation.md"
BEGIN = "<!-- lora-pp-table: begin (validation/lora_parallel/compare_pp.py --doc) -->"
END = "<!-- lora-pp-table: end -->"
TP_BEGIN = "<!-- lora-tp-pp-table: begin (validation/lora_parallel/compare_pp.py --tp --doc) -->"
TP_END = "<!-- lora-tp-pp-table: end -->"
PHASES = {"forward": ("forward",), "backward": ("backward", "backward_end"), "optimizer": ("optimizer_step",)}
REGIMES = {"fp32": "fp32", "bf16": "bf16", "amp-bf16": "amp-bf16"}


def runs(path=DATA) -> list[dict]:
    return json.loads(Path(path).read_text(encoding="utf-8"))["runs"]


def solve(run):
    from mlsysim_core import HardwareNode, TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    model = from_hf_config(run["hf_config"], name=run["model"])
    lay = run["layout"]
    lora = {k: v for k, v in run["lora"].items() if v is not None}
    tp = lay.get("tp_size", 1)
    if tp > 1:          # Megatron-Bridge's adapters, in the base's dtype (measure_lora_tp_pp.py)
        lora = {"rank": lora["rank"], "target_modules": lora["target_modules"], "adapter_dtype": "base"}
    return TrainingMemoryModel("measured").solve(
        model, HardwareNode(name="cpu", memory_capacity=2**40), run["batch_size"] * lay["microbatches"],
        run["seq_len"], precision="fp32", optimizer="adamw", activation_checkpointing=run["checkpointing"],
        regime=REGIMES[run["regime"]], optimizer_impl="foreach", attention="sdpa", runtime_overheads=False,
        lora=lora, device="cpu", pp_size=lay["pp_size"], dp_size=1, pipeline_schedule="1f1b",
        gradient_accumulation_steps=lay["microbatches"], tp_size=tp, sequence_parallel=lay.get("kind") == "tp+sp")


def rank_of(result, stage: int):
    """The rank class whose representative stage is ``stage`` (None: a dominated middle stage)."""
    return next((r for r in result.ranks if r.stages[0] == stage or (len(r.stages) == 1 and stage in r.stages)),
                None)


def phases(rank) -> dict[str, float]:
    """Per measured phase, the rank's bytes without the communication buffers (see the docstring)."""
    from mlsysim_core.terms import ACCELERATOR, COMMUNICATION_BUFFERS
    out = {}
    for name, ours in PHASES.items():
        out[name] = max(sum(t.nbytes for t in rank.terms if t.component != COMMUNICATION_BUFFERS and p in t.phases
                            and t.tier == ACCELERATOR) for p in ours)
    return out


def refused(run):
    """The message of the profile's refusal of this run (None: it is solved)."""
    from mlsysim_core.errors import NotModelledError
    try:
        solve(run)
    except NotModelledError as e:
        return str(e)
    return None


def compare(run):
    """The comparison, or None where the run has no rank class of its own or is refused (``refused``)."""
    if refused(run) is not None:
        return None
    result = solve(run)
    rank = rank_of(result, run["layout"]["stage"])
    if rank is None:
        return None
    predicted = phases(rank)
    measured = {p: run["measured"]["peak_by_phase"][p]["bytes"] for p in PHASES}
    peak_m, peak_p = run["measured"]["peak_bytes"], max(predicted.values())
    return {"rank": rank, "predicted": predicted, "measured": measured,
            "errors": {p: (predicted[p] - m) / m for p, m in measured.items()},
            "peak": (peak_m, peak_p, (peak_p - peak_m) / peak_m)}


def table(path=DATA) -> str:
    lines = ["| run | stage | in flight | measured peak (B) | predicted (B) | peak | forward | backward | step |",
             "|---|---|---|---|---|---|---|---|---|"]
    errors, peaks, skipped = [], [], []
    for run in runs(path):
        c = compare(run)
        lay = run["layout"]
        if c is None:
            why = refused(run)
            skipped.append(f"{run['id']} (" + (f"refused by the profile: {why.split(' (')[0]}" if why else
                           f"stage {lay['stage']}: a middle stage dominated by another, no rank class") + ")")
            continue
        pm, pp, pe = c["peak"]
        peaks.append(abs(pe))
        errors += [abs(e) for e in c["errors"].values()]
        name = run["id"].split("-pp")[0]
        lines.append(f"| {name} | {lay['stage']} of {lay['pp_size']} | {c['rank'].in_flight:g} | {pm:,} | "
                     f"{pp:,.0f} | {pe:+.2%} | " + " | ".join(f"{c['errors'][p]:+.2%}" for p in PHASES) + " |")
    lines += ["", f"{len(peaks)} stages: peak median |err| {statistics.median(peaks):.2%}, max {max(peaks):.2%}; "
              f"every phase median {statistics.median(errors):.2%}, max {max(errors):.2%}."]
    if skipped:
        lines += ["", "Not compared: " + "; ".join(skipped) + "."]
    return "\n".join(lines).replace("%", " %")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc", action="store_true", help="rewrite the table in docs/validation.md")
    ap.add_argument("--tp", action="store_true", help="the stages of a tensor-parallel model (tp_pp_measurements.json)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    text = table(TP_DATA if args.tp else DATA)
    print(text)
    if args.doc:
        sys.path.insert(0, str(ROOT / "validation"))
        from report import write_table      # validation/report.py's
        write_table(text, *((TP_BEGIN, TP_END) if args.tp else (BEGIN, END)), DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
