#!/usr/bin/env python
"""torchtune's distributed QLoRA with compiled blocks (``compile="blocks"``, torchao's NF4 base under FSDP2, full
checkpointing in torchtune's order) against blocks_qlora_fsdp_measurements.json
(validation/compile/measure_blocks_qlora_fsdp.py), every phase, beside the eager twins of
validation/qlora_fsdp2/measurements.json: each run solved as validation/qlora_fsdp2/compare.py solves its eager twin
(the same shape, global batch, layout, bf16, fused AdamW, chunked loss, torchao's NF4 LoRA, RoPE cache, expanded k
and v, full checkpointing; its ``solve`` with the keyword added), with ``compile="blocks"``.

    python validation/compile/compare_blocks_qlora_fsdp.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "blocks_qlora_fsdp_measurements.json")


def _eager_compare():
    name = "qlora_fsdp2_compare"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(HERE), "qlora_fsdp2",
                                                                         "compare.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


eager = _eager_compare()
PHASES, TITLES = eager.PHASES, eager.TITLES


def solve(run):
    """qlora_fsdp2/compare.py's solve, compiled: the same call with ``compile="blocks"`` (torchtune's order, the
    default with LoRA)."""
    from mlsysim_core import TrainingMemoryModel
    original = TrainingMemoryModel.solve

    def compiled(self, *args, **kwargs):
        return original(self, *args, **kwargs, **({"compile": "blocks"} if run.get("compile") else {}))
    TrainingMemoryModel.solve = compiled
    try:
        return eager.solve(run)
    finally:
        TrainingMemoryModel.solve = original


def rows():
    """(id, predicted phases or the refusal, measured phases) per run: each compiled run, then its eager twin."""
    from mlsysim_core.errors import MlsysimError
    with open(PATH) as f:
        runs = [r for r in json.load(f)["runs"] if r.get("measured")]
    with open(eager.PATH) as f:
        twins = {r["id"]: r for r in json.load(f)["runs"] if r.get("measured")}
    for run in runs:
        for r in (run, twins.get(run["id"].replace("-blocks", ""))):
            if r is None:
                continue
            try:
                pred = eager.predicted(solve(r))
            except MlsysimError as err:
                pred = err
            yield r["id"], pred, eager.measured(r)


def table() -> str:
    out = ["| run | " + " | ".join(f"{t}: predicted / measured (error)" for t in TITLES) + " |",
           "|---|" + "---:|" * len(PHASES)]
    errs = {p: [] for p in PHASES}
    for rid, pred, meas in rows():
        if not isinstance(pred, dict):
            out.append(f"| {rid} | refused: {pred} |" + " |" * (len(PHASES) - 1))
            continue
        cells = []
        for p in PHASES:
            e = (pred[p] - meas[p]) / meas[p]
            if "-blocks-" in rid:
                errs[p].append(abs(e))
            cells.append(f"{pred[p] / 1e6:,.3f} / {meas[p] / 1e6:,.3f} MB ({100 * e:+.2f} %)")
        out.append(f"| {rid} | " + " | ".join(cells) + " |")
    if errs[PHASES[0]]:
        out.append("| **median / max \\|error\\|, compiled runs** | " + " | ".join(
            f"{100 * statistics.median(errs[p]):.2f} % / {100 * max(errs[p]):.2f} %" for p in PHASES) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
