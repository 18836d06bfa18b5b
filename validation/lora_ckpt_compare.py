#!/usr/bin/env python
"""Eager LoRA and QLoRA with every layer checkpointed: the measured profile against every such measurement, phase by
phase, with and without the top layer's checkpointed moments (lora.py's ``_dequantized_in_forward`` and
``_top_layer_backward``: "a checkpointed layer's forward ..." and "the top layer's backward ..." terms).

    python validation/lora_ckpt_compare.py          # the project's environment (mlsysim-core), no torch

The runs:

* torchtune 0.6.1's eager LoRA and QLoRA (``validation/compile/blocks_extra_measurements.json``,
  ``blocks_qlora_measurements.json``: ``compile`` eager, ``policy`` full), solved as
  ``validation/compile/compare_blocks_qlora.py`` solves them (torchtune's RoPE cache and expanded k/v); bytes above
  the profiler timeline's zero plus that zero (``baseline_bytes``); the timeline counts the checkpoint's CPU RNG
  state (5,056 B a layer) that no term prices;
* Hugging Face + peft 0.21.2 (``validation/lora_ckpt_measurements.json``: ``validation/measure_lora.py
  --checkpointed``; ``validation/lora_measurements.json``'s checkpointed run), solved as
  tests/measured/test_lora_hf_checkpointed.py solves them; MemTracker's bytes (+ bitsandbytes' QuantState, which it
  does not see). ``residue``: what the previous iteration left alive in the tracker's account at the iteration's
  start (``alive.start``'s activation + temp: MemTracker's multi-grad hooks on the checkpointed layers' inputs keep
  them, a measurement artifact), shown apart.

The columns: forward, backward (the larger of the backward and its end), the end of the backward and the optimizer
step, each ``error after (before)``: with the moments, and without them (the moment terms left out of the phase
totals). Asserted by tests/measured/test_lora_ckpt_plain.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MOMENTS = ("a checkpointed layer's forward", "the top layer's backward")
PHASES = ("forward", "backward", "end_of_backward", "optimizer")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _phases(result, drop=()):
    """forward, backward (max of the backward and its end), end of the backward, optimizer: summed from the terms,
    leaving out those whose label starts with one of ``drop``."""
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, OPTIMIZER_STEP
    terms = [t for t in result.terms if not t.label.startswith(tuple(drop))] if drop else list(result.terms)

    def total(phase):
        return sum(t.nbytes for t in terms if phase in t.phases)
    return {"forward": total(FORWARD), "backward": max(total(BACKWARD), total(BACKWARD_END)),
            "end_of_backward": sum(t.nbytes for t in terms if OPTIMIZER_STEP in t.phases and (
                tuple(t.phases) != (OPTIMIZER_STEP,) or t.component == GRADIENTS)),
            "optimizer": total(OPTIMIZER_STEP)}


def torchtune_runs():
    """(id, result, measured phases, residue 0) of torchtune's eager fully checkpointed LoRA / QLoRA runs."""
    cb = _load("lora_ckpt_compare_blocks", os.path.join(HERE, "compile", "compare_blocks.py"))
    for name in ("blocks_extra_measurements.json", "blocks_qlora_measurements.json"):
        with open(os.path.join(HERE, "compile", name)) as f:
            runs = json.load(f)["runs"]
        for run in runs:
            if not (run.get("lora") and run["compile"] == "eager" and run["policy"] == "full" and run.get("measured")):
                continue
            m = run["measured"]
            base = m["baseline_bytes"]
            meas = {"forward": m["peak_by_phase"]["forward"], "backward": m["peak_by_phase"]["backward"],
                    "end_of_backward": m["alive"]["end_of_backward"], "optimizer": m["peak_by_phase"]["optimizer"]}
            yield run["id"], cb.solve(run, True, True), {k: base + v for k, v in meas.items()}, 0


def hf_solve(run):
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.types import HardwareNode
    report = _load("lora_ckpt_report_families", os.path.join(HERE, "families", "report_families.py"))
    regime = run["regime"]
    return TrainingMemoryModel().solve(
        from_hf_config(run["hf_config"], name=run["id"]), HardwareNode(name="unbounded", memory_capacity=2**60),
        run["batch_size"], run["seq_len"], report.REFERENCE_PRECISION[regime], run["optimizer"], run["checkpointing"],
        profile="measured", regime=regime, optimizer_impl=run["optimizer_impl"], attention=run["attention"],
        device="cpu", dropout=0.0, runtime_overheads=False, lora=run["lora"])


def hf_runs():
    """(id, result, measured phases, residue) of the Hugging Face + peft checkpointed runs."""
    with open(os.path.join(HERE, "lora_ckpt_measurements.json")) as f:
        runs = json.load(f)["runs"]
    with open(os.path.join(HERE, "lora_measurements.json")) as f:
        runs += [r for r in json.load(f)["runs"] if r["checkpointing"] == "full"]
    for run in runs:
        m = run["measured"]
        q = m.get("quant_state_bytes", 0)
        meas = {p: m["peak_by_phase"][p]["bytes"] + q for p in ("forward", "backward", "optimizer")}
        meas["end_of_backward"] = m["alive"]["end_of_backward"]["bytes"] + q
        c = m["alive"]["start"]["by_category"]
        yield run["id"], hf_solve(run), meas, c["activation"] + c["temp"]


def rows():
    """(id, predicted with the moments, predicted without them, measured, residue) per run."""
    for source in (torchtune_runs, hf_runs):
        for rid, result, meas, residue in source():
            yield rid, _phases(result), _phases(result, MOMENTS), meas, residue


def table() -> str:
    out = ["| run | " + " | ".join(p.replace("_", " ") + ": error (without the moments)" for p in PHASES)
           + " | residue |", "|---|" + "---:|" * (len(PHASES) + 1)]
    for rid, after, before, meas, residue in rows():
        cells = [f"{100 * (after[p] - meas[p]) / meas[p]:+.2f} % ({100 * (before[p] - meas[p]) / meas[p]:+.2f} %)"
                 for p in PHASES]
        out.append(f"| {rid} | " + " | ".join(cells) + f" | {residue:,} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
