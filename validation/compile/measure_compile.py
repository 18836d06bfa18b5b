#!/usr/bin/env python
"""Measure compiled training iterations (``torch.compile``) with the profiler's memory timeline.

    /tmp/valvenv/bin/python validation/compile/measure_compile.py [--only ID ...]
    python3 validation/compile/measure_compile.py --table      # README.md's results table (needs torch to import)
    # writes validation/compile/measurements.json; torch==2.13.0 (CPU), transformers==5.23.0

``MemTracker`` is a ``TorchDispatchMode`` and Dynamo does not compile frames under an active dispatch mode:
a "compiled" run measured with it runs eagerly. Here every configuration is measured three ways, all with
``validation/harness.py``'s protocol (two warm-up iterations, the third measured):

* ``memtracker``: the eager run inside ``PhaseMemTracker`` (``harness.run_protocol``), the reference;
* ``eager``: the same eager run measured by the profiler's memory timeline (``harness.profiled_iteration``:
  ``torch.profiler.profile(activities=[CPU], profile_memory=True, record_shapes=True)`` around the measured
  iteration's forward, backward and step, each in a ``record_function("phase::NAME")`` range, no dispatch
  mode anywhere), bytes above what is alive after ``zero_grad`` (parameters, buffers, optimizer state,
  inputs): its peak equals MemTracker's peak minus MemTracker's ``alive.after_zero_grad`` (plus, with full
  checkpointing, the 5,056-byte CPU RNG state each checkpointed layer keeps, which no op returns);
* ``compiled``: ``torch.compile(model)`` (Inductor, default options: the forward with the loss and, through
  AOTAutograd, the backward compiled to C++ kernels on the CPU; the optimizer step eager), measured by the
  same timeline. The compiled code compiles in the warm-ups.

Each record gives ``peak_bytes``, ``peak_by_phase`` (forward, backward, optimizer) and ``alive`` (end of
forward, backward, step), all above the timeline's zero, and ``baseline_bytes`` (the zero: the storages of
parameters, buffers, optimizer state and inputs).
"""

from __future__ import annotations

import copy
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import configs as _configs  # noqa: E402  (validation/configs.py)
import harness  # noqa: E402  (validation/harness.py)

# configs.py's llama-tiny (hidden 256, FFN 688, 8 heads, vocabulary 32,000, untied) with 2 decoder layers
LLAMA_TINY_2L = dict(copy.deepcopy(_configs.LLAMA_TINY), num_hidden_layers=2)
SEQ = 512


def _cfg(regime: str, checkpointing: str, b: int) -> dict:
    return {"id": f"llama-tiny-2l-{regime}-{'ckpt' if checkpointing == 'full' else 'nockpt'}-b{b}-s{SEQ}",
            "family": "llama", "model": "llama-tiny-2l", "hf_config": _configs._hf(LLAMA_TINY_2L, 0.0),
            "batch_size": b, "seq_len": SEQ, "regime": regime, "optimizer": "adamw", "optimizer_impl": "foreach",
            "checkpointing": checkpointing, "attention": "sdpa", "loss": "default (HF ForCausalLMLoss)",
            "dropout": 0.0, "method": "real", "compile": {"backend": "inductor", "mode": None, "fullgraph": False,
                                                          "dynamic": None, "what": "torch.compile(model)"}}


CONFIGS = [_cfg(r, c, b) for c in ("none", "full") for r in ("bf16", "fp32") for b in (1, 2)]


def _small_vocab(regime: str, checkpointing: str, b: int, seq: int, layers: int, vocab: int = 1024,
                 kv_heads: int = 8, base: dict | None = None, name: str = "llama-tiny", tied: bool = False) -> dict:
    """A llama-tiny whose decoder layers dominate (a small vocabulary: the logits are b x s x 1,024): more
    layers or a longer sequence than the grid above (issue 25 item 1: the cells where the layers set the
    peak); ``kv_heads`` < 8: grouped-query attention (k and v narrower than q)."""
    cfg = dict(copy.deepcopy(base or _configs.LLAMA_TINY), num_hidden_layers=layers, vocab_size=vocab,
               num_key_value_heads=kv_heads, tie_word_embeddings=tied)
    gqa = (f"-kv{kv_heads}" if kv_heads != 8 else "") + ("-tied" if tied else "")
    run = _cfg(regime, checkpointing, b)
    run.update(id=f"{name}-{layers}l-v{vocab}{gqa}-{regime}-{'ckpt' if checkpointing == 'full' else 'nockpt'}"
                  f"-b{b}-s{seq}", model=f"{name}-{layers}l-v{vocab}{gqa}", hf_config=_configs._hf(cfg, 0.0),
               seq_len=seq)
    return run


# Layer-dominated cells: fp32 (fast on the CPU) at 4 layers and at a 2,048-token sequence; bf16 small (bf16
# matmuls are slow on this CPU).
CONFIGS += [_small_vocab("fp32", c, 2, 512, 4) for c in ("none", "full")]
CONFIGS += [_small_vocab("fp32", "none", 1, 2048, 2)]
CONFIGS += [_small_vocab("bf16", c, 1, 256, 2) for c in ("none", "full")]
# Grouped-query attention (2 key/value heads for 8 query heads), 3 layers, the layers dominating.
CONFIGS += [_small_vocab("fp32", c, 2, 512, 3, kv_heads=2) for c in ("none", "full")]
# bf16 with grouped-query attention; a wider model (configs.py's llama-small: hidden 512, FFN 1,376).
CONFIGS += [_small_vocab("bf16", "none", 1, 256, 3, kv_heads=2)]
CONFIGS += [_small_vocab("fp32", c, 1, 512, 3, base=_configs.LLAMA_SMALL, name="llama-small") for c in ("none", "full")]
# Tied embeddings with a short sequence: the backward's end (the embedding's gradient) sets the peak.
CONFIGS += [_small_vocab(r, "none", 1, 64, 2, vocab=32000, tied=True) for r in ("fp32", "bf16")]


def memtracker_record(cfg: dict) -> dict:
    """The eager run in ``PhaseMemTracker``: its peak, phase peaks and alive points, absolute and above
    ``alive.after_zero_grad`` (the profiler timeline's zero)."""
    with harness.training_run(cfg) as run:
        alive, _ = harness.run_protocol(run.mt, run.model, run.optimizer, run.input_ids,
                                        autocast=harness.autocast_for(cfg))
        rec = harness.peak_record(run.mt)
        zero = alive["after_zero_grad"]["bytes"]
        phases = {ph: v["bytes"] for ph, v in rec["peak_by_phase"].items() if ph in ("forward", "backward", "optimizer")}
        return {"peak_bytes_absolute": rec["peak_bytes"], "after_zero_grad_bytes": zero,
                "peak_bytes": rec["peak_bytes"] - zero, "peak_phase": rec["peak_phase"], "peak_op": rec["peak_op"],
                "peak_by_phase": {ph: b - zero for ph, b in phases.items()},
                "alive": {k: alive[k]["bytes"] - zero for k in ("end_of_forward", "end_of_backward", "end_of_step")}}


def measure(cfg: dict) -> dict:
    t0 = time.perf_counter()
    out = {"memtracker": memtracker_record(cfg), "eager": harness.timeline_measure(cfg),
           "compiled": harness.timeline_measure(cfg, compile=True)}
    harness.torch._dynamo.reset()
    out["eager_profiler_equals_memtracker"] = out["eager"]["peak_bytes"] == out["memtracker"]["peak_bytes"]
    out["compiled_over_eager_peak"] = round(out["compiled"]["peak_bytes"] / out["eager"]["peak_bytes"], 4)
    out["peak_bytes"] = out["compiled"]["peak_bytes"]
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def document(args, runs, ctx) -> dict:
    return {"generator": "/tmp/valvenv/bin/python validation/compile/measure_compile.py",
            "environment": harness.ENVIRONMENT, "python": platform.python_version(), **harness._versions(),
            "device": "cpu", "threads": harness.torch.get_num_threads(),
            "timeline": "torch.profiler.profile(activities=[CPU], profile_memory=True, record_shapes=True): "
                        "[memory] events after zero_grad, phases in record_function('phase::NAME') ranges; bytes "
                        "above what is alive after zero_grad", "runs": runs}


def _summary(m) -> str:
    e, c, t = m["eager"], m["compiled"], m["memtracker"]
    return (f"eager {e['peak_bytes']:>12,} B (MemTracker {t['peak_bytes']:>12,} B) compiled {c['peak_bytes']:>12,} B "
            f"({m['compiled_over_eager_peak']:.3f}) {m['wall_s']:6.1f}s")


def table(path: str) -> str:
    """The results table of README.md, from the measurements file (no torch needed)."""
    with open(path) as f:
        doc = json.load(f)
    rows = ["| run | eager peak (MemTracker) | compiled peak | compiled / eager | compiled forward / backward / optimizer "
            "| compiled alive at end of forward (eager) |", "|---|---:|---:|---:|---|---:|"]
    for r in doc["runs"]:
        m = r.get("measured")
        if m is None:
            rows.append(f"| {r['id']} | error: {r.get('error', '')[:80]} | | | | |")
            continue
        e, c = m["eager"], m["compiled"]
        diff = e["peak_bytes"] - m["memtracker"]["peak_bytes"]
        same = "" if diff == 0 else f" (MemTracker + {diff:,}: RNG states)"
        ph = c["peak_by_phase"]
        rows.append(f"| {r['id']} | {e['peak_bytes']:,}{same} | {c['peak_bytes']:,} | {m['compiled_over_eager_peak']:.3f} "
                    f"| {ph['forward']:,} / {ph['backward']:,} / {ph['optimizer']:,} "
                    f"| {c['alive']['end_of_forward']:,} ({e['alive']['end_of_forward']:,}) |")
    return "\n".join(rows)


def main(argv=None) -> int:
    def arguments(ap):
        ap.add_argument("--table", action="store_true", help="print the results table of README.md and exit")

    def before(args):
        if args.table:
            print(table(args.out))
            return 0
        return None

    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, out=os.path.join(HERE, "measurements.json"), incremental=True,
                        keep_previous="always", summary=_summary, arguments=arguments, before=before,
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<34} {msg}")


if __name__ == "__main__":
    sys.exit(main())
