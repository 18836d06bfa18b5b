#!/usr/bin/env python
"""Per-block compile with full checkpointing under FSDP2 in torchtune's distributed order (``compile="blocks"``,
``activation_checkpointing="full"``, ``compile_checkpoint="outside"``, ``data_parallel="fsdp"``; with
``fsdp_cpu_offload``: ``offload="optimizer+gradients+parameters"``) against blocks_fsdp_measurements.json
(validation/compile/measure_blocks_fsdp.py: one rank of the fake process group), every phase (compare_blocks.py's
phases, solve and table). Eager twins are solved with compile off (without LoRA: FSDP2's buffers around the eager
checkpointed layers, buffers.fsdp2_eager_checkpointed); each run's micro-batch is the rank's, the global batch
``batch_size x world_size``.

    python validation/compile/compare_blocks_fsdp.py
"""

from __future__ import annotations

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare_blocks  # noqa: E402

PATH = os.path.join(HERE, "blocks_fsdp_measurements.json")
# torchtitan's op-SAC runs (eager) and their single-device twins (measure_blocks_fsdp.py --sac)
SAC_PATH = os.path.join(HERE, "blocks_fsdp_sac_measurements.json")


def _solve(run, torchtune_rope: bool = False, torchtune_kv: bool = True):
    """compare_blocks.solve's (the shape, AdamW foreach, SDPA on the CPU, no runtime overheads, torchtune's k and v
    expansion; the rank's micro-batch times the world, ``data_parallel="fsdp"``), with full checkpointing in
    torchtune's order (``compile_checkpoint="outside"``), the root resharded after the forward as torchtune's
    ``shard_model`` does (the fsdp rule's ``root_reshard_after_forward``, as the torchtune reader sets it) and, for the
    ``-offload-`` runs, FSDP2's CPU offload."""
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.finetune import LoRAConfig
    from mlsysim_core.hf import from_hf_config
    from mlsysim_core.types import HardwareNode
    if not run.get("layout"):       # the op-SAC runs' single-device twins: compare_blocks.solve's
        return compare_blocks.solve(run, torchtune_kv=torchtune_kv)
    lay = run["layout"]
    extra = {}
    if run.get("lora"):      # torchtune's LoRALinear: adapters in the model's dtype, no dropout
        lo = run["lora"]
        extra["lora"] = LoRAConfig(rank=lo["rank"], target_modules=tuple(lo["targets"]), adapter_dtype="base")
    if torchtune_kv:
        extra["kv_expanded"] = True
    titan = lay["kind"] == "fsdp2"      # torchtitan's order (measure_blocks.py's layout: the root not resharded)
    if run["compile"] == "blocks":
        extra.update(compile="blocks", compile_checkpoint="inside" if titan else "outside")
    if not titan:       # torchtune's shard_model: the root resharded after the forward too
        extra["plugin_options"] = {"fsdp": {"root_reshard_after_forward": True}}
    policy = {"op-sac": "op-sac"}.get(run["policy"], "full")
    if run["policy"].startswith("every-"):      # torchtitan's layer SAC: every k-th block checkpointed
        policy = "every-k"
        extra.setdefault("plugin_options", {})["every-k"] = {"k": int(run["policy"].split("-")[1])}
    if lay.get("cpu_offload"):      # fsdp_cpu_offload: CPUOffloadPolicy (the torchtune reader's reading)
        extra["offload"] = "optimizer+gradients+parameters"
    return TrainingMemoryModel().solve(
        from_hf_config(run["hf_config"], name=run["id"]), HardwareNode(name="unbounded", memory_capacity=2**60),
        run["batch_size"] * lay["world_size"], run["seq_len"], run["regime"], "adamw",
        policy, profile="measured",
        regime=run["regime"], attention="sdpa", device="cpu", runtime_overheads=False, dp_size=lay["world_size"],
        data_parallel="fsdp", **extra)


def rows(path: str = PATH):
    """(id, predicted phases or the refusal, measured phases, baseline bytes) per run: compare_blocks.rows' phases
    (with the root resharded after the forward the rule's gather terms are the backward's: none is alive at the end
    of the forward, as measured); on the CPU an -offload- run's host terms count (the host is the device)."""
    import json

    from mlsysim_core.errors import MlsysimError
    from mlsysim_core.terms import ACCELERATOR, BACKWARD, BACKWARD_END, FORWARD, GRADIENTS, OPTIMIZER_STEP
    with open(path) as f:
        runs = [r for r in json.load(f)["runs"] if r.get("measured")]
    for run in runs:
        m = run["measured"]
        base = m["baseline_bytes"]
        meas = compare_blocks.measured_phases(m)
        try:
            r = _solve(run)
        except MlsysimError as err:
            yield run["id"], err, meas, base
            continue
        # on the CPU the host is the device: an -offload- run's host terms are in the same timeline (every tier)
        terms = [x for x in r.terms if x.tier == ACCELERATOR or (run.get("layout") or {}).get("cpu_offload")]
        t = {p: sum(x.nbytes for x in terms if p in x.phases) for p in (FORWARD, BACKWARD, BACKWARD_END,
                                                                         OPTIMIZER_STEP)}
        pred = {"forward": t[FORWARD], "backward": max(t[BACKWARD], t[BACKWARD_END]), "optimizer": t[OPTIMIZER_STEP],
                "end_of_forward": sum(x.nbytes for x in terms if FORWARD in x.phases and BACKWARD in x.phases),
                "end_of_backward": sum(x.nbytes for x in terms if OPTIMIZER_STEP in x.phases and (
                    tuple(x.phases) != (OPTIMIZER_STEP,) or x.component == GRADIENTS))}
        yield run["id"], pred, meas, base


def table() -> str:
    phases, titles = compare_blocks.PHASES, compare_blocks.TITLES
    out = ["| run | " + " | ".join(f"{t}: predicted / measured (error)" for t in titles) + " |",
           "|---|" + "---:|" * len(phases)]
    errs = {p: [] for p in phases}
    eager = {p: [] for p in phases}     # the eager twins without LoRA (buffers.fsdp2_eager_checkpointed)
    sac = {p: [] for p in phases}       # torchtitan's op-SAC runs under FSDP2 (eager)
    for rid, pred, meas, _base in [*rows(), *rows(SAC_PATH)]:
        if "-offload-" in rid:       # (offload_table: on the CPU the policy moves nothing)
            continue
        if not isinstance(pred, dict):
            out.append(f"| {rid} | refused: {pred} |" + " |" * (len(phases) - 1))
            continue
        cells = []
        for p in phases:
            e = (pred[p] - meas[p]) / meas[p]
            if "-blocks-" in rid:
                errs[p].append(abs(e))
            elif "-op-sac-fsdp2-" in rid:
                sac[p].append(abs(e))
            elif "-op-sac-" in rid or "-every-" in rid:     # (the single-device twins; layer SAC: not priced)
                pass
            elif "-lora-" not in rid:
                eager[p].append(abs(e))
            cells.append(f"{pred[p] / 1e6:,.3f} / {meas[p] / 1e6:,.3f} MB ({100 * e:+.2f} %)")
        out.append(f"| {rid} | " + " | ".join(cells) + " |")
    if errs[phases[0]]:
        out.append("| **median / max \\|error\\|, compiled runs** | " + " | ".join(
            f"{100 * statistics.median(errs[p]):.2f} % / {100 * max(errs[p]):.2f} %" for p in phases) + " |")
    if eager[phases[0]]:
        out.append("| **median / max \\|error\\|, eager runs without LoRA** | " + " | ".join(
            f"{100 * statistics.median(eager[p]):.2f} % / {100 * max(eager[p]):.2f} %" for p in phases) + " |")
    if sac[phases[0]]:
        out.append("| **median / max \\|error\\|, eager op-SAC runs under FSDP2 (torchtitan's order)** | " + " | ".join(
            f"{100 * statistics.median(sac[p]):.2f} % / {100 * max(sac[p]):.2f} %" for p in phases) + " |")
    return "\n".join(out)


def offload_table() -> str:
    """fsdp_cpu_offload (``CPUOffloadPolicy``) against its twin without it: on the CPU the policy moves nothing (the
    "device" is the host), so the measured timelines are the same; what the rows show is compile's difference from
    eager, every phase, with and without the policy, measured and predicted."""
    by_id = {rid: (pred, meas) for rid, pred, meas, _ in rows()}
    out = ["| cell | phase | measured compiled - eager: with / without offload | predicted: with / without offload |",
           "|---|---|---:|---:|"]
    for rid in by_id:
        if "-offload-" not in rid or "-blocks-" not in rid:
            continue
        eager_off = rid.replace("-blocks-", "-eager-")
        plain, eager_plain = rid.replace("-offload", ""), eager_off.replace("-offload", "")
        for phase, title in zip(compare_blocks.PHASES, compare_blocks.TITLES):
            m = [by_id[a][1][phase] - by_id[b][1][phase] for a, b in ((rid, eager_off), (plain, eager_plain))]
            p = [round(by_id[a][0][phase] - by_id[b][0][phase]) for a, b in ((rid, eager_off), (plain, eager_plain))]
            out.append(f"| {rid.replace('-blocks-', '-')} | {title} | {m[0]:+,} / {m[1]:+,} B | {p[0]:+,} / "
                       f"{p[1]:+,} B |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(print(table() + "\n\n" + offload_table()) or 0)
