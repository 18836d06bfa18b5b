#!/usr/bin/env python
"""gpt-oss under ``flex_attention`` with sinks applied through the log-sum-exp (the ``flex_sinks`` kernel of
``plugins/mlsysim_plugins/measured/kernels.py``), measured on the CPU by the profiler's memory timeline.

    /tmp/valvenv/bin/python validation/families/gpt_oss/measure_flex_sinks.py [--only ID ...]

What runs is transformers 5.23's own ``flex_attention_forward`` (``integrations/flex_attention.py``), the
path a GPU takes: ``flex_attention(q, k, v, score_mod, block_mask, enable_gqa=True,
return_aux=AuxRequest(lse=True))``, then the sinks through the LSE (``lse.to(v.dtype)``, ``logsumexp(cat([lse,
sinks]))``, ``exp(lse - combined)``, ``output * renorm``). Three things differ from a GPU run, each for a
reason of torch 2.13's CPU support, none changing what is saved for backward:

* transformers' CPU guard ``return_lse = query.device.type != "cpu"`` (it then refuses sinks on the CPU) is
  set to ``True``: its source is exec'd with that one line replaced (asserted to occur once);
* ``compile_friendly_flex_attention`` runs ``flex_attention`` uncompiled: Inductor's CPU flex attention is
  inference-only ("torch.compile on CPU only supports inference and `return_lse` is not supported yet");
* ``torch.nn.attention.flex_attention._validate_device`` is a no-op: the public API refuses backward on the
  CPU, the higher-order op's eager implementation (``math_attention``) runs it.

The autograd function (``FlexAttentionAutogradOp``, ``torch/_higher_order_ops/flex_attention.py``) saves q,
k, v, the output and the fp32 log-sum-exp whatever implementation runs, so the bytes alive between the
forward and the backward are the GPU's, but for the row maxima the uncompiled autograd function also keeps
(fp32, per head and token; the model counts them with ``device="cpu"``). The eager implementation
materialises the fp32 scores of one layer (forward and backward) as temporaries, which the GPU's fused
kernels do not: the configurations (``configs.FLEX_SINKS_CONFIGS``: a 32,768-token vocabulary) keep them
below the phases' peaks, which the loss's b x s x V logits set. That path also leaves reference cycles that
hold about 1.3 MB (1.7 MB with full checkpointing) until Python's collector runs: the measured bytes include
them, the model does not. ``MemTracker`` cannot be used (no rule for the flex_attention higher-order operator
under a dispatch mode), hence the timeline (``harness.timeline_measure``, absolute bytes = its
``baseline_bytes`` + the timeline's). About 8 minutes on 2 cores (the bf16 runs are slow on the CPU).
"""

from __future__ import annotations

import inspect
import os
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

import harness  # noqa: E402  (validation/harness.py)

OUT = HERE / "flex_sinks_measurements.json"
GUARD = 'return_lse = query.device.type != "cpu"'


def install() -> None:
    """transformers' flex_attention_forward with the CPU guard lifted, uncompiled, CPU backward allowed."""
    import torch.nn.attention.flex_attention as fa
    import transformers.integrations.flex_attention as tfa
    from transformers import AttentionInterface

    src = inspect.getsource(tfa.flex_attention_forward)
    if src.count(GUARD) != 1:
        raise RuntimeError(f"transformers' flex_attention_forward has changed: {GUARD!r} not found once")
    namespace = dict(vars(tfa))

    def uncompiled(query, key, value, training=False, **kw):
        return fa.flex_attention(query, key, value, **kw)

    namespace["compile_friendly_flex_attention"] = uncompiled
    exec(compile(src.replace(GUARD, "return_lse = True"), tfa.__file__, "exec"), namespace)
    AttentionInterface.register("flex_attention", namespace["flex_attention_forward"])
    fa._validate_device = lambda query, key, value: None


def configs() -> list[dict]:
    return list(harness.load("gpt_oss_configs", HERE / "configs.py").FLEX_SINKS_CONFIGS)


def measure(cfg: dict) -> dict:
    tl = harness.timeline_measure(cfg)
    base = tl["baseline_bytes"]
    return {"method": "torch.profiler memory timeline (harness.timeline_measure)", "baseline_bytes": base,
            "timeline": tl, "peak_bytes": base + tl["peak_bytes"], "peak_phase": tl["peak_phase"], "peak_op": None,
            "peak_by_phase": {p: {"bytes": base + v} for p, v in tl["peak_by_phase"].items()},
            "alive": {k: {"bytes": base + v} for k, v in tl["alive"].items()},
            "attn_implementation": "flex_attention (transformers' flex_attention_forward, return_lse on the CPU)",
            "wall_s": tl["wall_s"]}


def main(argv=None) -> int:
    install()

    def document(args, runs, ctx):
        return {"generator": "/tmp/valvenv/bin/python validation/families/gpt_oss/measure_flex_sinks.py",
                "environment": harness.ENVIRONMENT, "python": platform.python_version(), **harness._versions(),
                "device": "cpu", "runs": runs}

    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=configs(), measure_run=measure,
                        document=document, out=str(OUT), atomic=False, threads=os.cpu_count(),
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<44} {msg}",
                        summary=lambda m: f"peak {m['peak_bytes']:>12,} B in {m['peak_phase']:<9} {m['wall_s']:5.1f}s")


if __name__ == "__main__":
    sys.exit(main())
