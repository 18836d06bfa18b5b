#!/usr/bin/env python
"""torchtune's order of full activation checkpointing and per-block compile for full fine-tuning, measured with
measure_blocks.py's harness (the profiler's memory timeline, no dispatch mode; torchtune 0.6.1's own builders).

    nice -n 10 /tmp/lossvenv/bin/python validation/compile/measure_blocks_order.py [--only ID ...]
    # writes validation/compile/blocks_order_measurements.json; /tmp/lossvenv: torch==2.13.0 (CPU),
    # torchtune==0.6.1, torchao==0.13.0 (measure_blocks.py's environment)
    nice -n 10 /tmp/lossvenv/bin/python validation/compile/measure_blocks_order.py --events ID
    # prints the measured iteration's memory events (size, running total, phase) of one configuration

``policy="full"`` with ``compile="blocks"`` (measure_blocks.py): recipes/full_finetune_single_device.py
``_setup_model`` of torchtune 0.6.1 calls ``training.compile_model(model)`` (each ``TransformerSelfAttentionLayer``
compiled in place), then ``training.set_activation_checkpointing(model, auto_wrap_policy=
{TransformerSelfAttentionLayer})`` (each compiled layer wrapped in a non-reentrant ``checkpoint_wrapper``): the
checkpoint outside the compiled graph. blocks_measurements.json holds two such runs (the 2-layer 32,000-token and
the 3-layer 1,024-token fp32 cells); these add grouped-query attention, bf16 and torchtune's chunked loss (the
ladder's "+ Activation Checkpointing" row: ``CEWithChunkedOutputLoss`` with ``compile_loss``), each with its
eager twin where the cell is new.
"""

from __future__ import annotations

import contextlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402  (validation/harness.py)
import measure_blocks  # noqa: E402
from measure_blocks import _cfg  # noqa: E402

CONFIGS = [
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, kv=2, policy="full"),
    _cfg("bf16", "blocks", vocab=1024, b=1, seq=256, layers=3, policy="full"),
    _cfg("fp32", "blocks", vocab=1024, b=2, layers=3, policy="full", loss="chunked"),
    _cfg("fp32", "eager", vocab=1024, b=2, layers=3, policy="full", loss="chunked"),
    _cfg("bf16", "blocks", policy="full", loss="chunked"),
    _cfg("bf16", "eager", policy="full", loss="chunked"),
    _cfg("bf16", "blocks", vocab=1024, b=2, seq=512, layers=4, kv=2, policy="full"),
    _cfg("bf16", "blocks", vocab=1024, b=2, seq=512, layers=4, kv=2, policy="full", loss="chunked"),
]
# torchtune's optimizer_in_bwd (one AdamW per parameter, stepped by its post-accumulate-grad hook) with compiled
# blocks in torchtune's order (the ladder's "+ Fuse optimizer step into backward"), and eager twins
for _regime, _kw, _compiles in (("fp32", dict(vocab=1024, b=2, layers=3), ("eager", "blocks")),
                                ("bf16", dict(policy="full", loss="chunked"), ("eager", "blocks")),
                                ("fp32", dict(vocab=1024, b=2, layers=3, kv=2), ("blocks",)),
                                ("bf16", dict(vocab=1024, b=2, layers=4, kv=2, loss="chunked"), ("blocks",))):
    for _compile in _compiles:
        _c = _cfg(_regime, _compile, **{"policy": "full", **_kw})
        _c.update(id=_c["id"].replace("-full", "-full-oib"), optimizer_in_backward=True)
        CONFIGS.append(_c)


def events(run_id: str) -> None:
    """The measured iteration's memory events of one configuration, with the running total and the phase."""
    import harness as h
    cfg = next(c for c in CONFIGS + measure_blocks.CONFIGS if c["id"] == run_id)
    captured = {}
    original = h.memory_timeline

    def keep(prof, device_type="cpu"):
        ev = prof.profiler.kineto_results.events()
        phases = sorted(((e.name()[len(h.PHASE_PREFIX):], e.start_ns(), e.start_ns() + e.duration_ns())
                         for e in ev if e.name().startswith(h.PHASE_PREFIX)), key=lambda r: r[1])
        captured["mem"] = sorted(((e.start_ns(), e.nbytes()) for e in ev if e.name() == "[memory]"
                                  and e.device_type().name.lower() == device_type), key=lambda r: r[0])
        captured["phases"] = phases
        return original(prof, device_type)

    h.memory_timeline = keep
    measure_blocks.harness.memory_timeline = keep
    rec = measure_blocks.measure(cfg)
    total = 0
    for t, n in captured["mem"]:
        total += n
        phase = next((p for p, s, e in captured["phases"] if s <= t <= e), "-")
        print(f"{phase:9s} {n:+14,d} {total:14,d}")
    print(rec)


def document(args, runs, ctx) -> dict:
    doc = measure_blocks.document(args, runs, ctx)
    return {**doc, "generator": "/tmp/lossvenv/bin/python validation/compile/measure_blocks_order.py"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--events"]:
        events(argv[1])
        return 0
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS,
                        measure_run=measure_blocks.measure, document=document,
                        out=os.path.join(HERE, "blocks_order_measurements.json"), incremental=True,
                        keep_previous="always", summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<60} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
