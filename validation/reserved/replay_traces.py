"""Replay the recorded allocation traces through the caching allocator and compare with the reserve mechanism.

    python validation/reserved/replay_traces.py            # writes replay_results.json; no torch needed
    python validation/reserved/replay_traces.py --doc      # the table of docs/validation.md

Each trace (``record_traces.py``: a training step's every allocation and free on the CPU, torch 2.13.0, from
before the model is built to the end of the third iteration) is replayed through
``mlsysim_plugins.measured.allocator.CachingAllocator`` (a re-implementation of PyTorch's
``DeviceCachingAllocator``: rounding, pools, best fit, splitting and merging; one stream), with expandable
segments off and on. For each phase of the measured (third) iteration it records the replayed
``max_memory_reserved`` (the running maximum over the whole run, as ``torch.cuda.max_memory_reserved`` after
``reset_peak_memory_stats`` is never called), the phase's peak of the bytes requested and of the blocks handed
out, and two predictions of max_memory_reserved from the peak requested so far (what the measured profile
predicts as allocated; the segments are never released, so in a steady-state step every phase holds the
step's peak): the mechanism's (+ its rounding of the model states, the measured profile's term ``allocator:
block and segment rounding (model states)`` for the run's shapes; one stream: no side-stream pools) and the
default 5 % (+ peak // 20). What the mechanism leaves out (replayed - predicted) is the rounding of the
activations' blocks and the default stream's fragmentation.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "replay_results.json"
PHASES = ("forward", "backward", "optimizer")
MEASURED = 2          # the third iteration (two warm-ups)
GIB = 2**30


def load_trace(run: dict) -> list:
    with gzip.open(HERE / run["trace"], "rt") as f:
        return json.load(f)


def mechanism_terms(run: dict, expandable: bool) -> dict:
    """The measured profile's allocator terms for the run (label -> bytes), from its solve's runtime overheads
    (an FSDP run: rank 0 of ``world_size``, regime fsdp-bf16, the ``fsdp`` rule)."""
    from mlsysim_core import HardwareNode, TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    model = from_hf_config(run["hf_config"], name=run["id"])
    regime = run["regime"]
    world = run.get("world_size", 1)
    precision = "fp32" if regime == "fp32" else "bf16"
    if "fsdp" in run:
        layout = dict(dp_size=world, data_parallel="fsdp", regime="fsdp-bf16", precision="bf16")
    elif "tp" in run:
        layout = dict(tp_size=run["tp"], regime=regime, precision=precision)
    elif "zero_stage" in run:
        layout = dict(dp_size=world, data_parallel=f"zero{run['zero_stage']}", regime=regime, precision=precision)
    else:
        layout = dict(regime=regime, precision=precision)
    if "lora" in run:
        layout["lora"] = run["lora"]
    result = TrainingMemoryModel("measured").solve(
        model, HardwareNode(name="cpu", memory_capacity=2**40), run["batch_size"] * world, run["seq_len"],
        optimizer=run["optimizer"], optimizer_impl=run["optimizer_impl"], device="cpu", attention=run["attention"],
        activation_checkpointing=run.get("checkpointing", "none"),
        runtime_overheads={"cuda_context": 0, "cublas_workspace": 0, "nccl_buffers": 0, "allocator": "segments",
                           "expandable_segments": expandable}, **layout)
    return {t.label: int(t.nbytes) for t in result.terms_of("runtime_overheads")}


def mechanism(run: dict, expandable: bool) -> int:
    """The mechanism's rounding of the model states for the run (bytes)."""
    return mechanism_terms(run, expandable)["allocator: block and segment rounding (model states)"]


def _build_transients(events) -> set:
    """Keys allocated and freed inside the ``build`` phase."""
    phase, allocated, freed = None, set(), set()
    for e in events:
        if e[0] == "phase":
            phase = e[1]
        elif phase == "build":
            (allocated if e[0] == "alloc" else freed).add(e[1])
    return allocated & freed


POOLS = {"reduce-scatter": "allocator: reduce-scatter stream pool",
         "all-gather-copy-in": "allocator: all-gather copy-in stream pool"}


def stream_pools(run: dict, events: list, expandable: bool) -> dict:
    """An FSDP run's side streams: the replayed reserved bytes of each against the mechanism's pool term, and
    the default stream's replayed reserved against its own peak of bytes requested."""
    from mlsysim_plugins.measured.allocator import DEFAULT_STREAM, replay
    r = replay(events, expandable_segments=expandable)
    terms = mechanism_terms(run, expandable)
    out = {}
    for stream, reserved in sorted(r["reserved_by_stream"].items()):
        if stream == DEFAULT_STREAM:
            # The trace builds the whole model on the device and then shards it: those blocks, freed before the
            # first step, stay reserved. torchtitan builds on the meta device and materializes the shards: the
            # default stream replayed without the blocks the build allocates and frees.
            own = [e for e in events if e[0] != "alloc" or len(e) < 4]
            built = _build_transients(own)
            alone = replay([e for e in own if e[0] == "phase" or e[1] not in built], expandable_segments=expandable)
            out[stream] = {"replayed_reserved": reserved, "peak_requested": alone["peak_requested"],
                           "replayed_reserved_without_build_transients": alone["peak_reserved"]}
        else:
            predicted = terms[POOLS[stream]]
            out[stream] = {"replayed_reserved": reserved, "mechanism": predicted,
                           "error": round(predicted / reserved - 1, 6)}
    return out


def replay_run(run: dict) -> dict:
    from mlsysim_plugins.measured.allocator import replay
    events = [tuple(e) for e in load_trace(run)]
    out = {"id": run["id"], "allocations": run["allocations"]}
    if "fsdp" in run:
        out["streams"] = {("expandable" if x else "segments"): stream_pools(run, events, x) for x in (False, True)}
        return out
    if "tp" in run:
        # The trace builds the whole model and then distributes it (the rank's shards are new tensors): the blocks
        # the build allocates and frees are left out, as torchtitan builds on the meta device (stream_pools).
        built = _build_transients(events)
        events = [e for e in events if e[0] == "phase" or e[1] not in built]
        out["without_build_transients"] = len(built)
    for expandable in (False, True):
        r = replay(events, expandable_segments=expandable)
        rounding = mechanism(run, expandable)
        running = peak = 0
        phases = {}
        for name, p in r["by_phase"].items():
            running, peak = max(running, p["reserved"]), max(peak, p["requested"])
            it, _, phase = name.partition(":")
            if it == str(MEASURED) and phase in PHASES:
                predicted = peak + rounding
                phases[phase] = {"requested": p["requested"], "blocks": p["allocated"], "peak_so_far": peak,
                                 "max_reserved": running, "predicted": predicted,
                                 "fraction_0.05": peak + peak // 20,
                                 "error": round(predicted / running - 1, 6),
                                 "error_fraction_0.05": round((peak + peak // 20) / running - 1, 6)}
        out["expandable" if expandable else "segments"] = {
            "max_reserved": r["peak_reserved"], "peak_requested": r["peak_requested"], "segments": r["segments"],
            "mechanism_rounding": rounding, "phases": phases}
    return out


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--doc" in argv:
        print(table(json.loads(RESULTS.read_text())))
        return
    runs = json.loads((HERE / "traces.json").read_text())["runs"]
    doc = {"generator": "python validation/reserved/replay_traces.py",
           "traces": "validation/reserved/traces.json (python validation/reserved/record_traces.py)",
           "runs": [replay_run(run) for run in runs]}
    RESULTS.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(table(doc))


def table(doc: dict) -> str:
    lines = ["| run | allocator | phase | peak requested so far MiB | replayed max reserved MiB | mechanism MiB | "
             "error | 5 % MiB | error |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for run in doc["runs"]:
        if "streams" in run:
            continue
        for kind, label in (("segments", "default"), ("expandable", "expandable segments")):
            for phase, p in run[kind]["phases"].items():
                lines.append(f"| {run['id']} | {label} | {phase} | {p['peak_so_far'] / 2**20:,.1f} | "
                             f"{p['max_reserved'] / 2**20:,.1f} | {p['predicted'] / 2**20:,.1f} | "
                             f"{p['error']:+.1%} | {p['fraction_0.05'] / 2**20:,.1f} | "
                             f"{p['error_fraction_0.05']:+.1%} |")
    streams = [run for run in doc["runs"] if "streams" in run]
    if streams:
        lines += ["", "| FSDP2 run (rank 0) | allocator | stream | replayed reserved MiB | mechanism MiB | error |",
                  "|---|---|---|---:|---:|---:|"]
        for run in streams:
            for kind, label in (("segments", "default"), ("expandable", "expandable segments")):
                for stream, p in run["streams"][kind].items():
                    if "mechanism" in p:
                        lines.append(f"| {run['id']} | {label} | {stream} | {p['replayed_reserved'] / 2**20:,.1f} | "
                                     f"{p['mechanism'] / 2**20:,.1f} | {p['error']:+.1%} |")
                    else:
                        lines.append(f"| {run['id']} | {label} | {stream}: not priced (its own peak requested "
                                     f"{p['peak_requested'] / 2**20:,.1f} MiB; reserved "
                                     f"{p['replayed_reserved_without_build_transients'] / 2**20:,.1f} MiB without "
                                     "the unsharded model the build frees) | "
                                     f"{p['replayed_reserved'] / 2**20:,.1f} | - | - |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
