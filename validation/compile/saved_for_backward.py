#!/usr/bin/env python
"""What AOTAutograd's partitioner saves for the backward in a compiled training step: the forward graph's
outputs beyond the model's own (the saved tensors), each with its shape, dtype, bytes and the op that makes it.

    /tmp/valvenv/bin/python validation/compile/saved_for_backward.py ID [--json FILE]   # a measure_compile.py id
    /tmp/valvenv/bin/python validation/compile/saved_for_backward.py ID --events backward   # its allocations

It wraps ``torch._inductor.compile_fx``'s partition function (``min_cut_rematerialization_partition``,
called with Inductor's default options) and records what it returns; the model is compiled and run once
(no dispatch mode, nothing measured). This is the evidence for the saved set the measured profile's
``compile`` technique models (plugins/mlsysim_plugins/measured/compile.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def _describe(node) -> dict:
    val = node.meta.get("val")
    shape = tuple(int(s) for s in val.shape) if hasattr(val, "shape") else ()
    dtype = str(val.dtype).replace("torch.", "") if hasattr(val, "dtype") else type(val).__name__
    nbytes = val.untyped_storage().nbytes() if hasattr(val, "untyped_storage") else 0
    numel_bytes = (val.numel() * val.element_size()) if hasattr(val, "numel") else 0
    target = getattr(node.target, "__name__", str(node.target)) if node.op == "call_function" else node.op
    return {"name": node.name, "op": target, "shape": shape, "dtype": dtype, "bytes": int(numel_bytes),
            "storage_bytes": int(nbytes)}


def saved_tensors(cfg: dict) -> list[dict]:
    import harness
    import torch
    import torch._inductor.compile_fx as cfx

    graphs = []
    original = cfx.min_cut_rematerialization_partition

    def partition(joint, inputs, **kwargs):
        fw, bw = original(joint, inputs, **kwargs)
        n_out = kwargs.get("num_fwd_outputs")
        outs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
        graphs.append({"num_fwd_outputs": n_out,
                       "user_outputs": [_describe(n) for n in outs[:n_out] if hasattr(n, "meta")],
                       "saved": [_describe(n) for n in outs[n_out:] if hasattr(n, "meta")]})
        return fw, bw

    cfx.min_cut_rematerialization_partition = partition
    try:
        with harness.training_run(cfg, tracker=False) as run:
            model = torch.compile(run.model)
            with harness.autocast_for(cfg)():
                loss = model(input_ids=run.input_ids, labels=run.input_ids, use_cache=False).loss
            loss.backward()
    finally:
        cfx.min_cut_rematerialization_partition = original
    return graphs


def main(argv=None) -> int:
    import measure_compile
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("id", help="a measure_compile.py id, or small[:REGIME:CHECKPOINTING:B:S:LAYERS] (vocabulary 1,024)")
    ap.add_argument("--json")
    ap.add_argument("--events", choices=("forward", "backward", "optimizer"),
                    help="instead: the compiled run's allocations and frees in this phase (bytes, running total above "
                         "the timeline's zero; the profiler's memory timeline)")
    args = ap.parse_args(argv)
    if args.id.startswith("small"):      # a quick look: default 2 layers, vocabulary 1,024, s = 128, fp32
        regime, ckpt, b, s, layers = (args.id.split(":")[1:] + ["fp32", "none", "1", "128", "2"][len(args.id.split(":")) - 1:])
        cfg = measure_compile._small_vocab(regime, ckpt, int(b), int(s), int(layers))
    else:
        cfg = next(c for c in measure_compile.CONFIGS if c["id"] == args.id)
    if args.events:
        for n, total in allocations(cfg, args.events):
            print(f"{n:>14,} {total:>14,}")
        return 0
    graphs = saved_tensors(cfg)
    for i, g in enumerate(graphs):
        total = sum(s["bytes"] for s in g["saved"])
        print(f"graph {i}: {len(g['saved'])} saved tensors, {total:,} B; user outputs "
              f"{[(o['op'], o['shape'], o['dtype']) for o in g['user_outputs']]}")
        for s in g["saved"]:
            print(f"  {s['name']:<28} {s['op']:<44} {str(s['shape']):<22} {s['dtype']:<9} {s['bytes']:>12,}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"id": cfg["id"], "graphs": graphs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def allocations(cfg: dict, phase: str = "forward") -> list[tuple[int, int]]:
    """The compiled run's allocations and frees (bytes, running total above the timeline's zero) inside one
    phase of the measured iteration (the profiler's memory timeline, ``harness.profiled_iteration``)."""
    import harness
    import torch
    with harness.training_run(cfg, tracker=False) as run:
        prof = harness.profiled_iteration(torch.compile(run.model), run.optimizer, run.input_ids,
                                          autocast=harness.autocast_for(cfg))
    events = prof.profiler.kineto_results.events()
    ranges = {e.name()[len(harness.PHASE_PREFIX):]: (e.start_ns(), e.start_ns() + e.duration_ns())
              for e in events if e.name().startswith(harness.PHASE_PREFIX)}
    mem = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"
                 and e.device_type().name.lower() == "cpu")
    total, out = 0, []
    start, end = ranges[phase]
    for t, n in mem:
        total += n
        if start <= t <= end:
            out.append((int(n), int(total)))
    return out
