#!/usr/bin/env python
"""The measured profile's prediction of every run in measurements.json, phase by phase (forward, backward, optimizer
step), against what the tracker measured.

    python validation/lora_fsdp1/compare.py [--json | --doc]    # --doc: also rewrite the table in docs/validation.md

Each run is solved as measured: one rank of ``world_size``, m micro-batches of ``batch_size``; ``fsdp1`` runs with
the ``fsdp`` rule, ``gradop1`` runs with ``fsdp-grad-op``, both with ``fsdp_version=1`` and, with m > 1,
``gradient_sync="no_sync"``; ``fp32`` as the ``fp32`` regime, accelerate's bf16 (``MixedPrecision(param_dtype=bf16,
reduce_dtype=bf16)`` over fp32 parameters, the forward under bf16 autocast) and the same policy without autocast
(``mp-bf16``) as ``fsdp-bf16``; QLoRA (``qlora-*``: the base stored in bf16, the policy in bf16 over it) as
``fsdp-bf16-stored``; the adapters as
``lora=`` (rank, the seven linears of the decoder layers) with ``lora.fsdp_wrap`` the run's ``wrap``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS = Path(__import__("os").environ.get("LORA_FSDP1", ROOT / "validation" / "lora_fsdp1" / "measurements.json"))
RULE = {"fsdp1": "fsdp", "gradop1": "fsdp-grad-op"}
REGIME = {"fp32": "fp32", "accel-bf16": "fsdp-bf16", "mp-bf16": "fsdp-bf16"}
PHASES = ("forward", "backward", "optimizer")
DOC = ROOT / "docs" / "validation.md"
MARKERS = ("<!-- lora-fsdp1-table: begin (validation/lora_fsdp1/compare.py --doc) -->", "<!-- lora-fsdp1-table: end -->")


def runs() -> list[dict]:
    return [r for r in json.loads(MEASUREMENTS.read_text(encoding="utf-8"))["runs"] if r.get("measured")]


def solve(run, regime=None, **options):
    from mlsysim_core import HardwareNode, TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    m, w = run["microbatches"], run["world_size"]
    rule = RULE[run["kind"]]
    opts = {"fsdp_version": 1, **({"lora_wrap": "layer"} if run["wrap"] == "layer" else {}), **({"gradient_sync": "no_sync"} if m > 1 else {}), **options}
    lora = {"rank": run["lora"]["rank"], "target_modules": run["lora"]["target_modules"]}
    named, regime = regime, REGIME[run["regime"]]
    if run["lora"].get("quantization"):
        # QLoRA: the base loaded in bf16 (bnb_4bit_quant_storage bf16), MixedPrecision(param_dtype=bf16,
        # reduce_dtype=bf16) over it, peft's fp32 adapters gathered in bf16: fsdp-bf16-stored
        lora.update(quantization=run["lora"]["quantization"], double_quant=run["lora"]["double_quant"])
        regime = "fsdp-bf16-stored"
    regime = named or regime        # (the tests price a run under another regime)
    return TrainingMemoryModel("measured").solve(
        from_hf_config(run["hf_config"], name=run["model"]), HardwareNode(name="unbounded", memory_capacity=2**60),
        run["batch_size"] * w * m, run["seq_len"], "fp32", run["optimizer"], "none", regime=regime,
        optimizer_impl=run["optimizer_impl"], attention=run["attention"], runtime_overheads=False, dp_size=w,
        data_parallel=rule, gradient_accumulation_steps=m, lora=lora, device="cpu",
        plugin_options={rule: opts})


def phases(result) -> dict:
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP
    ours = {"forward": (FORWARD,), "backward": (BACKWARD, BACKWARD_END), "optimizer": (OPTIMIZER_STEP,)}
    return {name: max(sum(t.nbytes for t in result.terms if p in t.phases) for p in ps) for name, ps in ours.items()}


def compare(run) -> dict:
    predicted = phases(solve(run))
    measured = {name: run["measured"]["peak_by_phase"][name]["bytes"] for name in PHASES}
    return {name: (predicted[name], measured[name], predicted[name] / measured[name] - 1) for name in PHASES}


def table() -> str:
    import statistics
    lines = ["| run | wrap | strategy | precision | m | forward | backward | step |", "|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    refused = []
    for run in runs():
        try:
            row = compare(run)
        except Exception as e:      # a refusal: said, not hidden
            refused.append(f"{run['id']} ({type(e).__name__}: {e})")
            continue
        strategy = {"fsdp1": "FULL_SHARD", "gradop1": "SHARD_GRAD_OP"}[run["kind"]]
        precision = run["regime"] + (f" ({run['lora']['quantization']} QLoRA, as fsdp-bf16-stored)"
                                     if run["lora"].get("quantization") else "")
        lines.append(f"| {run['id']} | {run['wrap']} | {strategy} | {precision} | {run['microbatches']} | "
                     + " | ".join(f"{row[p][2]:+.2%}" for p in PHASES) + " |")
        groups.setdefault((run["wrap"], precision), []).extend(abs(row[p][2]) for p in PHASES)
    lines.append("")
    lines += [f"- wrap {w}, {g}: every phase median |err| {statistics.median(e):.2%}, max {max(e):.2%}"
              for (w, g), e in groups.items()]
    if refused:
        lines += ["", "Not compared: " + "; ".join(refused) + "."]
    return "\n".join(lines).replace("%", " %")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--json" in argv:
        out = {}
        for run in runs():
            try:
                out[run["id"]] = compare(run)
            except Exception as e:      # a refusal: said, not hidden
                out[run["id"]] = f"{type(e).__name__}: {e}"
        print(json.dumps(out, indent=1))
        return 0
    text = table()
    print(text)
    if "--doc" in argv:
        sys.path.insert(0, str(ROOT / "validation"))
        from report import write_table      # validation/report.py's
        write_table(text, *MARKERS, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
