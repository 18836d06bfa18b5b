#!/usr/bin/env python
"""The measured profile against blocks_measurements.json (torchtune's model, eager and per-block compiled),
every phase.

    python validation/compile/compare_blocks.py          # the project's environment (mlsysim-core), no torch

Each run is solved with the same shape (its ``hf_config``), batch, sequence, regime, AdamW foreach, SDPA on the
CPU, no runtime overheads, and ``compile="blocks"`` for the per-block compiled runs (``None`` for the eager
ones); ``policy="op-sac"`` or ``"full"``: that ``activation_checkpointing``; ``loss="chunked"``: ``loss="chunked"``;
an FSDP2 run (rank 0 of 2): ``data_parallel="fsdp"``, ``dp_size=2``, the global batch; a TP run (rank 0 of 2):
``tp_size=2``, ``sequence_parallel=False``; a LoRA run:
``lora=LoRAConfig(rank, target_modules, adapter_dtype="base")`` (torchtune's adapters, in the model's dtype);
with ``torchtune_rope`` (compare_blocks_qlora.py's rows), a run on torchtune's builder: ``rope_cache=max_seq_len``
(its RoPE cache, one per model: rope.py), in fp32 or, where the harness casts the model after init, the run's
dtype (``rope_cache_dtype``); without it (this table, as before) Hugging Face's per-forward tables;
with ``torchtune_kv`` (the default of ``rows`` and ``table``: every run here is built by torchtune), its attention's
k and v expanded to every query head before SDPA (``kv_expanded=True``, kv_expand.py: the kv2 runs; a model with
as many key/value heads as query heads expands nothing, and a compiled block's set holds the copies already);
torchtitan's compiled loss (``loss="titan-compiled"``, blocks_extra_measurements.json): ``compile="blocks+loss"``
(its eager twin ``loss="titan"``: ``compile="blocks"``, the default cross-entropy).
A run the profile refuses is listed with the refusal. Asserted by tests/measured/test_compile_blocks.py.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PHASES = ("forward", "backward", "optimizer", "end_of_forward", "end_of_backward")      # compare.py's
TITLES = ("forward peak", "backward peak", "optimizer peak", "end of forward", "end of backward")

PATH = os.path.join(HERE, "blocks_measurements.json")


def solve(run, torchtune_rope: bool = False, torchtune_kv: bool = False):
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.types import HardwareNode
    model = from_hf_config(run["hf_config"], name=run["id"])
    extra = {"loss": "chunked"} if run["loss"] == "chunked" else {}
    if run.get("lora"):      # torchtune's LoRALinear: adapters in the model's dtype, no dropout
        from mlsysim_core.finetune import LoRAConfig
        lo = run["lora"]
        quantized = {"quantization": "nf4", "quant_implementation": "torchao"} if lo.get("quantize_base") else {}
        extra["lora"] = LoRAConfig(rank=lo["rank"], target_modules=tuple(lo["targets"]), adapter_dtype="base",
                                   **quantized)
    if torchtune_rope and "torchtune" in run:      # torchtune's builder: one persistent RoPE cache of its max_seq_len rows (rope.py),
        # computed in fp32; cast with the model where the harness casts it after init (model.to(dtype)), not where
        # it builds it under set_default_dtype (QLoRA: measure_blocks.py)
        cast = not (run.get("lora") or {}).get("quantize_base")
        extra.update(rope_cache=run["torchtune"]["max_seq_len"], rope_cache_dtype=run["regime"] if cast else "fp32")
    if torchtune_kv and "torchtune" in run:      # torchtune's MultiHeadAttention: k, v expanded to every query head
        extra.update(kv_expanded=True)            # before SDPA, which saves the copies (kv_expand.py; MHA: no copy)
    world = 1
    if run.get("layout", {}).get("kind") == "tp":      # tensor parallelism, no sequence parallelism: one replica
        extra.update(tp_size=run["layout"]["world_size"], sequence_parallel=False)
    elif run.get("layout"):      # FSDP2, every block resharded after forward: the rank of a world of dp ranks
        world = run["layout"]["world_size"]
        extra.update(dp_size=world, data_parallel="fsdp")
    return TrainingMemoryModel().solve(
        model, HardwareNode(name="unbounded", memory_capacity=2**60), run["batch_size"] * world, run["seq_len"],
        run["regime"],
        "adamw", {"op-sac": "op-sac", "full": "full", "full-in": "full"}.get(run["policy"], "none"), profile="measured", regime=run["regime"],
        attention="sdpa", device="cpu", runtime_overheads=False,
        compile=("blocks+loss" if run["loss"] == "titan-compiled" else "blocks") if run["compile"] == "blocks" else None,
        **extra)


def measured_phases(m: dict) -> dict:
    """A measured record's five phases (compare_blocks' PHASES) in bytes above nothing: its peaks and alive points
    plus the baseline the timeline starts from."""
    base = m["baseline_bytes"]
    return {"forward": base + m["peak_by_phase"]["forward"], "backward": base + m["peak_by_phase"]["backward"],
            "optimizer": base + m["peak_by_phase"]["optimizer"], "end_of_forward": base + m["alive"]["end_of_forward"],
            "end_of_backward": base + m["alive"]["end_of_backward"]}


def rows(path: str = PATH, torchtune_rope: bool = False, torchtune_kv: bool = True):
    """(id, predicted phases or the refusal, measured phases, baseline bytes) per measured run."""
    from mlsysim_core.errors import MlsysimError
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, OPTIMIZER_STEP
    with open(path) as f:
        runs = [r for r in json.load(f)["runs"] if r.get("measured")]
    for run in runs:
        m = run["measured"]
        base = m["baseline_bytes"]
        meas = measured_phases(m)
        try:
            r = solve(run, torchtune_rope, torchtune_kv)
        except MlsysimError as err:
            yield run["id"], err, meas, base
            continue
        t = r.phase_totals
        pred = {"forward": t[FORWARD], "backward": max(t[BACKWARD], t[BACKWARD_END]), "optimizer": t[OPTIMIZER_STEP],
                "end_of_forward": sum(x.nbytes for x in r.terms if FORWARD in x.phases and BACKWARD in x.phases),
                "end_of_backward": sum(x.nbytes for x in r.terms if OPTIMIZER_STEP in x.phases and (
                    tuple(x.phases) != (OPTIMIZER_STEP,) or x.component == GRADIENTS))}
        yield run["id"], pred, meas, base


def table(path: str = PATH, torchtune_rope: bool = False, torchtune_kv: bool = True) -> str:
    out = ["| run | " + " | ".join(f"{t}: predicted / measured (error)" for t in TITLES) + " |",
           "|---|" + "---:|" * len(PHASES)]
    errs = {p: [] for p in PHASES}
    for rid, pred, meas, _base in rows(path, torchtune_rope, torchtune_kv):
        if not isinstance(pred, dict):
            out.append(f"| {rid} | refused: {pred} |" + " |" * (len(PHASES) - 1))
            continue
        cells = []
        for p in PHASES:
            e = (pred[p] - meas[p]) / meas[p]
            errs[p].append(abs(e))
            cells.append(f"{pred[p] / 1e6:,.3f} / {meas[p] / 1e6:,.3f} MB ({100 * e:+.2f} %)")
        out.append(f"| {rid} | " + " | ".join(cells) + " |")
    if errs[PHASES[0]]:
        out.append("| **median / max \\|error\\|** | " + " | ".join(
            f"{100 * statistics.median(errs[p]):.2f} % / {100 * max(errs[p]):.2f} %" for p in PHASES) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
