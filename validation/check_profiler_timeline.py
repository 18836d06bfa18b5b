#!/usr/bin/env python
"""Check that the profiler's memory timeline (``harness.profiled_iteration`` / ``memory_timeline``) measures
what MemTracker measures, on eager runs, to the byte.

    /tmp/valvenv/bin/python validation/check_profiler_timeline.py [--quick]

``MemTracker`` is a ``TorchDispatchMode``: Dynamo does not compile frames under it, so a compiled run must be
measured without it. The timeline needs no dispatch mode: ``torch.profiler.profile(activities=[CPU],
profile_memory=True, record_shapes=True)`` records every allocation and free of the CPU allocator (those
inside Inductor's kernels too) as ``[memory]`` events; their running sum, from the measured iteration's
``zero_grad`` on, is the bytes allocated above what was alive then (parameters, buffers, optimizer state,
inputs). On an eager run that must equal MemTracker's figure minus MemTracker's ``alive.after_zero_grad``:

* the forward's and the backward's peaks, to the byte (the iteration's peak is the largest phase peak in
  both, so it agrees to the byte too unless it falls in the step, see next);
* the bytes alive at the end of the forward, the backward and the step, to the byte;
* the optimizer phase's peak within 64 bytes (the profiler also sees allocations that no op returns, e.g.
  10-12 bytes inside foreach AdamW's step on the CPU, which a tracker of op outputs cannot);
* with full activation checkpointing, one more such allocation per checkpointed layer: non-reentrant
  ``torch.utils.checkpoint`` (``preserve_rng_state=True``) keeps ``torch.get_rng_state()``, the CPU generator's
  5,056-byte state, from the layer's forward to its recomputation; it is made by no op, so MemTracker misses
  it. The forward's peak, the backward's peak (before the first recomputation) and the bytes alive at the end
  of the forward are then exactly 5,056 B x layers above MemTracker's; the end of the backward and of the
  step equal it again.

Configurations: configs.py's llama-tiny with 2 decoder layers (hidden 256, FFN 688, 8 heads, vocabulary
32,000), AdamW foreach, SDPA: bf16 b=2 s=512 (issue 25's case), fp32 b=1 s=512 and fp32 with full
checkpointing b=1 s=256 (its peak is in the step), and gqa-tiny under amp-bf16 b=1 s=256 (``--quick``: the
first only). It then measures the first configuration compiled (``torch.compile(model)``) and prints both
peaks. bf16 matmuls are slow on CPUs without native bf16: the bf16 cases take minutes each.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import configs as _configs  # noqa: E402
import harness  # noqa: E402
from compile.measure_compile import LLAMA_TINY_2L, memtracker_record  # noqa: E402


def _cfg(id, base, regime, b, s, checkpointing="none"):
    return {"id": id, "family": "llama", "hf_config": _configs._hf(base, 0.0), "batch_size": b, "seq_len": s,
            "regime": regime, "optimizer": "adamw", "optimizer_impl": "foreach", "checkpointing": checkpointing,
            "attention": "sdpa", "method": "real"}


GQA_TINY_2L = dict(_configs.GQA_TINY, num_hidden_layers=2)
CASES = [
    _cfg("llama-tiny-2l-bf16-b2-s512", LLAMA_TINY_2L, "bf16", 2, 512),
    _cfg("llama-tiny-2l-fp32-b1-s512", LLAMA_TINY_2L, "fp32", 1, 512),
    _cfg("llama-tiny-2l-fp32-ckpt-b1-s256", LLAMA_TINY_2L, "fp32", 1, 256, "full"),
    _cfg("gqa-tiny-2l-amp-b1-s256", GQA_TINY_2L, "amp-bf16", 1, 256),
]
OPTIMIZER_SLACK = 64
RNG_STATE_BYTES = 5056          # torch.get_rng_state() of the CPU generator (mt19937)


def untracked_bytes(cfg) -> int:
    """What the timeline sees and MemTracker cannot, from the forward to the first recomputation: the RNG
    state each checkpointed layer keeps."""
    return RNG_STATE_BYTES * cfg["hf_config"]["num_hidden_layers"] if cfg["checkpointing"] == "full" else 0


def check(cfg) -> dict:
    mt = memtracker_record(cfg)
    tl = harness.timeline_measure(cfg)
    extra = untracked_bytes(cfg)
    # the peak is the largest phase peak in both; its difference is its phase's (below)
    assert tl["peak_bytes"] == max(tl["peak_by_phase"].values()), (cfg["id"], "peak", tl)
    assert mt["peak_bytes"] == max(mt["peak_by_phase"].values()), (cfg["id"], "peak", mt)
    for ph in ("forward", "backward"):
        assert tl["peak_by_phase"][ph] == mt["peak_by_phase"][ph] + extra, \
            (cfg["id"], ph, tl["peak_by_phase"], mt["peak_by_phase"])
    assert 0 <= tl["peak_by_phase"]["optimizer"] - mt["peak_by_phase"]["optimizer"] <= OPTIMIZER_SLACK, \
        (cfg["id"], "optimizer", tl["peak_by_phase"], mt["peak_by_phase"])
    assert tl["alive"]["end_of_forward"] == mt["alive"]["end_of_forward"] + extra, (cfg["id"], tl["alive"], mt["alive"])
    for point in ("end_of_backward", "end_of_step"):
        assert tl["alive"][point] == mt["alive"][point], (cfg["id"], point, tl["alive"], mt["alive"])
    print(f"ok {cfg['id']:<34} peak above zero_grad {tl['peak_bytes']:>12,} B = MemTracker "
          f"{mt['peak_bytes_absolute']:>12,} - {mt['after_zero_grad_bytes']:>11,} B + {tl['peak_bytes'] - mt['peak_bytes']:,} B "
          f"({tl['peak_phase']}); forward/backward +{extra:,} B, optimizer phase "
          f"+{tl['peak_by_phase']['optimizer'] - mt['peak_by_phase']['optimizer']} B", flush=True)
    return tl


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the first configuration only")
    args = ap.parse_args(argv)
    harness.torch.set_num_threads(max(1, os.cpu_count() or 1))
    eager = [check(cfg) for cfg in (CASES[:1] if args.quick else CASES)]
    compiled = harness.timeline_measure(CASES[0], compile=True)
    print(f"{CASES[0]['id']}: eager peak {eager[0]['peak_bytes']:,} B, compiled peak {compiled['peak_bytes']:,} B "
          f"(forward {compiled['peak_by_phase']['forward']:,}, backward {compiled['peak_by_phase']['backward']:,}, "
          f"optimizer {compiled['peak_by_phase']['optimizer']:,})")
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
