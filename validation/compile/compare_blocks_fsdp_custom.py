#!/usr/bin/env python
"""torchtune's ``custom_sharded_layers`` (the fsdp rule's ``separate_units``, as the torchtune reader sets it) against
blocks_fsdp_custom_measurements.json (validation/compile/measure_blocks_fsdp_custom.py: eager, full checkpointing,
FSDP2 in torchtune's order, one rank of the fake process group), every phase, each run beside its twin without it
(compare_blocks_fsdp.py's solve: the root resharded after the forward, as torchtune's ``shard_model``).

    python validation/compile/compare_blocks_fsdp_custom.py
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare_blocks  # noqa: E402

PATH = os.path.join(HERE, "blocks_fsdp_custom_measurements.json")
# torchtune's module names -> the rule's separate_units (the torchtune reader's mapping)
UNITS = {"tok_embeddings": "embedding", "output": "lm_head"}


def solve(run, separate=None):
    """compare_blocks_fsdp._solve's (the rank's micro-batch x the world, fsdp, full checkpointing, eager, the root
    resharded after the forward) with ``separate_units`` from the run's custom_sharded_layers (``separate``: given
    instead)."""
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.types import HardwareNode
    lay = run["layout"]
    if separate is None:
        separate = tuple(UNITS[n] for n in lay.get("custom_sharded_layers", ()))
    fsdp = {"root_reshard_after_forward": True, **({"separate_units": list(separate)} if separate else {})}
    return TrainingMemoryModel().solve(
        from_hf_config(run["hf_config"], name=run["id"]), HardwareNode(name="unbounded", memory_capacity=2**60),
        run["batch_size"] * lay["world_size"], run["seq_len"], run["regime"], "adamw", "full", profile="measured",
        regime=run["regime"], attention="sdpa", device="cpu", runtime_overheads=False, dp_size=lay["world_size"],
        data_parallel="fsdp", kv_expanded=True, plugin_options={"fsdp": fsdp},
        **({"loss": "chunked"} if run["loss"] == "chunked" else {}))


def phases(result):
    """compare_blocks_fsdp.rows' phases of one solve."""
    from mlsysim_core.terms import ACCELERATOR, BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, OPTIMIZER_STEP
    terms = [x for x in result.terms if x.tier == ACCELERATOR]
    t = {p: sum(x.nbytes for x in terms if p in x.phases) for p in (FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP)}
    return {"forward": t[FORWARD], "backward": max(t[BACKWARD], t[BACKWARD_END]), "optimizer": t[OPTIMIZER_STEP],
            "end_of_forward": sum(x.nbytes for x in terms if FORWARD in x.phases and BACKWARD in x.phases),
            "end_of_backward": sum(x.nbytes for x in terms if OPTIMIZER_STEP in x.phases and (
                tuple(x.phases) != (OPTIMIZER_STEP,) or x.component == GRADIENTS))}


def measured(run):
    return compare_blocks.measured_phases(run["measured"])


def runs():
    with open(PATH) as f:
        return [r for r in json.load(f)["runs"] if r.get("measured")]


def rows():
    """(id, predicted phases, measured phases, predicted as before: the whole root one unit) per run."""
    for run in runs():
        yield run["id"], phases(solve(run)), measured(run), phases(solve(run, separate=()))


def table() -> str:
    ps, titles = compare_blocks.PHASES, compare_blocks.TITLES
    out = ["| run | " + " | ".join(f"{t}: predicted / measured (error; the root whole)" for t in titles) + " |",
           "|---|" + "---:|" * len(ps)]
    for rid, pred, meas, whole in rows():
        cells = [f"{pred[p] / 1e6:,.3f} / {meas[p] / 1e6:,.3f} MB ({100 * (pred[p] - meas[p]) / meas[p]:+.2f} %"
                 + (f"; {100 * (whole[p] - meas[p]) / meas[p]:+.2f} %)" if "-custom-" in rid else ")") for p in ps]
        out.append(f"| {rid} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(print(table()) or 0)
