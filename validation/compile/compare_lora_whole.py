#!/usr/bin/env python
"""The measured profile's ``compile=True`` with peft's LoRA (Hugging Face's ``torch_compile``) against
lora_whole_measurements.json, every phase, compiled and eager.

    python validation/compile/compare_lora_whole.py            # the project's environment (mlsysim-core), no torch

Prints docs/compile.md's table: per run (compiled, and its eager twin solved with ``compile`` off) the
predicted and measured bytes of the forward peak, the backward peak, the optimizer's peak and what is alive
at the end of the forward and of the backward (absolute: the timeline's figures plus ``baseline_bytes``), and
the median and largest |error| per phase. tests/measured/test_compile_lora_whole.py asserts the same.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "lora_whole_measurements.json")
PHASES = ("forward", "backward", "optimizer", "end_of_forward", "end_of_backward")
TITLES = ("forward peak", "backward peak", "optimizer peak", "end of forward", "end of backward")


def solve(run: dict, compile: bool = True, lora=None):
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.finetune import LoRAConfig
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.types import HardwareNode

    lora_config, lora = lora, run["lora"]
    targets = lora["target_modules"]
    config = lora_config or LoRAConfig(rank=lora["rank"], target_modules=targets if isinstance(targets, str)
                                       else tuple(targets), quantization=lora["quantization"],
                                       dropout=run["lora_dropout"])
    model = from_hf_config(run["hf_config"], name=run["id"])
    big = HardwareNode(name="unbounded", memory_capacity=2**60)
    return TrainingMemoryModel().solve(model, big, run["batch_size"], run["seq_len"], run["regime"], "adamw",
                                       run["checkpointing"], profile="measured", regime=run["regime"],
                                       attention="sdpa", device="cpu", runtime_overheads=False, lora=config,
                                       compile=True if compile else None)


def predicted(r) -> dict:
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, OPTIMIZER_STEP
    t = r.phase_totals
    return {"forward": t[FORWARD], "backward": max(t[BACKWARD], t[BACKWARD_END]), "optimizer": t[OPTIMIZER_STEP],
            "end_of_forward": sum(x.nbytes for x in r.terms if FORWARD in x.phases and BACKWARD in x.phases),
            "end_of_backward": sum(x.nbytes for x in r.terms if OPTIMIZER_STEP in x.phases and (
                tuple(x.phases) != (OPTIMIZER_STEP,) or x.component == GRADIENTS))}


def rows(path: str = PATH):
    """(id, predicted, measured, baseline) per run and way (``-compiled``, ``-eager``); a refused run's
    predicted is the NotModelledError's message."""
    from mlsysim_core.errors import NotModelledError
    with open(path) as f:
        runs = [r for r in json.load(f)["runs"] if r.get("measured")]
    for run in runs:
        for way in ("compiled", "eager"):
            m = run["measured"][way]
            base = m["baseline_bytes"]
            meas = {"forward": m["peak_by_phase"]["forward"], "backward": m["peak_by_phase"]["backward"],
                    "optimizer": m["peak_by_phase"]["optimizer"], "end_of_forward": m["alive"]["end_of_forward"],
                    "end_of_backward": m["alive"]["end_of_backward"]}
            meas = {k: base + v for k, v in meas.items()}
            try:
                pred = predicted(solve(run, way == "compiled"))
            except NotModelledError as e:
                pred = str(e)
            yield f"{run['id']}-{way}", pred, meas, base


def table(path: str = PATH) -> str:
    out = ["| run | " + " | ".join(f"{t}: predicted / measured (error)" for t in TITLES) + " |",
           "|---|" + "---:|" * len(PHASES)]
    errs = {p: [] for p in PHASES}
    for rid, pred, meas, _ in rows(path):
        if isinstance(pred, str):
            name = pred.split("=", 1)[0]
            why = pred.split(" is not allowed: ", 1)[-1]
            out.append(f"| {rid} | refused (`{name}`): {why[:240]} |" + " |" * (len(PHASES) - 1))
            continue
        cells = []
        for p in PHASES:
            e = (pred[p] - meas[p]) / meas[p]
            if rid.endswith("-compiled"):
                errs[p].append(abs(e))
            cells.append(f"{pred[p] / 1e6:,.3f} / {meas[p] / 1e6:,.3f} MB ({100 * e:+.2f} %)")
        out.append(f"| {rid} | " + " | ".join(cells) + " |")
    out.append("| **median / max \\|error\\|, compiled runs** | " + " | ".join(
        f"{100 * statistics.median(errs[p]):.2f} % / {100 * max(errs[p]):.2f} %" for p in PHASES) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
