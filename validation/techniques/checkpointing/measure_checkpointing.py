"""Measure activation-checkpointing policies on Hugging Face decoder layers with PyTorch's MemTracker.

The policies, as the measured profile names them (``plugins/mlsysim_plugins/checkpointing_policies.py``):

* ``op-sac``: torchtitan's per-op selective activation checkpointing, applied to every HF decoder layer
  through ``torch.utils.checkpoint.checkpoint(use_reentrant=False, context_fn=...)`` (HF's
  ``activation_checkpointing_enable`` passes these to checkpoint). The policy function and the save list
  are torchtitan v0.2.2's (commit 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce):
  torchtitan/distributed/activation_checkpoint.py lines 98-128 (``_get_custom_policy``: save the outputs
  of the listed ops, except every second ``aten.mm``, counted per layer) and
  torchtitan/models/llama3/infra/parallelize.py lines 36-51 (``_op_sac_save_list``). On the CPU, SDPA
  dispatches ``aten._scaled_dot_product_flash_attention_for_cpu``, which is not in that list: it is
  added as the stand-in for the GPU's ``_scaled_dot_product_flash_attention`` (same outputs that
  matter: the attention output and its fp32 logsumexp).
* ``every-k``: torchtitan's layer selective AC (``selective_ac_option = "k"``): full checkpointing of
  the layers whose 1-based index is a multiple of k (activation_checkpoint.py lines 24-49).
* ``mlp-only`` / ``attention-only``: non-reentrant checkpoint around each layer's ``mlp`` /
  ``self_attn`` module.
* ``save-list``: a per-op policy that saves the outputs of the ops named (``mm``, ``sdpa``,
  ``grouped_mm``, ``topk``, ``softmax``) and recomputes everything else.

    /tmp/valvenv/bin/python validation/techniques/checkpointing/measure_checkpointing.py [--only ID ...]

(environment: ``python3 -m venv /tmp/valvenv && /tmp/valvenv/bin/pip install -r validation/requirements.txt``:
torch==2.13.0 CPU build, transformers==5.23.0; torchtitan itself is not installed: its policy needs only torch.)
"""

from __future__ import annotations

import functools
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import harness  # noqa: E402  (validation/harness.py)
import torch  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts  # noqa: E402

aten = torch.ops.aten

# CPU SDPA's kernel: the stand-in for the GPU's flash attention op in torchtitan's list.
CPU_SDPA = aten._scaled_dot_product_flash_attention_for_cpu.default


def _optional(root, path):
    try:
        for part in path.split("."):
            root = getattr(root, part)
        return root
    except (AttributeError, RuntimeError):
        return None


def torchtitan_save_list() -> set:
    """torchtitan v0.2.2 models/llama3/infra/parallelize.py lines 36-51, plus the CPU stand-in."""
    ops = {
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_attention_math.default,
        aten._scaled_dot_product_fused_attention_overrideable.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        aten.max.default,
        torch._higher_order_ops.flex_attention,
        _optional(torch.ops, "torch_attn._varlen_attn.default"),      # absent from torch 2.13's CPU build
        _optional(torch._higher_order_ops, "inductor_compiled_code"),
    }
    ops.discard(None)
    return ops | {CPU_SDPA}


def torchtitan_policy(op_sac_save_list: set, mm_recompute_shapes=frozenset()):
    """torchtitan v0.2.2 distributed/activation_checkpoint.py lines 98-128, verbatim in logic: save the
    outputs of the listed ops, except every second mm (counted separately in forward and recompute)."""
    meta = defaultdict(int)

    def _custom_policy(ctx, func, *args, **kwargs):
        if (func == torch.ops.aten._to_copy.default and "cuda" in str(args[0].device)
                and "device" in kwargs and str(kwargs["device"]) == "cpu"):
            return CheckpointPolicy.MUST_SAVE
        mode = "recompute" if ctx.is_recompute else "forward"
        mm_count_key = f"{mode}_mm_count"
        if func == torch.ops.aten.mm.default:
            if args[1].shape in mm_recompute_shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            meta[mm_count_key] += 1
        to_save = func in op_sac_save_list and not (func == torch.ops.aten.mm.default and meta[mm_count_key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return _custom_policy


SAVE_LIST_OPS = {
    "mm": {aten.mm.default},
    "sdpa": {aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,
             aten._scaled_dot_product_cudnn_attention.default, CPU_SDPA},
    "bmm": {aten.bmm.default},
    "grouped_mm": {aten._grouped_mm.default},
    "topk": {aten.topk.default},
    "softmax": {aten._softmax.default},
}


def save_list_policy(names):
    ops = set().union(*(SAVE_LIST_OPS[n] for n in names)) if names else set()

    def policy(ctx, func, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if func in ops else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def _wrap(module):
    """Non-reentrant checkpoint around a submodule's forward (its hooks stay outside)."""
    forward = module.forward

    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    module.forward = checkpointed


def apply_policy(model, policy: str, options: dict) -> None:
    layers, _ = harness._submodules(model)
    if policy in ("op-sac", "save-list"):
        make = (lambda: torchtitan_policy(torchtitan_save_list())) if policy == "op-sac" else \
            (lambda: save_list_policy(options["ops"]))
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={
            "use_reentrant": False, "context_fn": lambda: create_selective_checkpoint_contexts(make())})
    elif policy == "every-k":
        model.activation_checkpointing_enable()
        for i, layer in enumerate(layers):      # torchtitan: the (i+1)-th block if (i+1) % k == 0
            layer.gradient_checkpointing = (i + 1) % options["k"] == 0
    elif policy in ("mlp-only", "attention-only"):
        for layer in layers:
            _wrap(layer.mlp if policy == "mlp-only" else layer.self_attn)
    else:
        raise ValueError(policy)


def measure(cfg: dict) -> dict:
    with harness.training_run(cfg, apply_policy=apply_policy) as run:
        model, mt = run.model, run.mt
        alive, t_measured = harness.run_protocol(mt, model, run.optimizer, run.input_ids,
                                                 autocast=harness.autocast_for(cfg))
        t_end = time.perf_counter()
        return {
            **harness.peak_record(mt),
            "alive": alive,
            "layer_forward_retained_bytes": harness.layer_forward_deltas(mt, run.layers),
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "attn_implementation": model.config._attn_implementation,
            "wall_s": round(t_end - run.t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }


def configs() -> list[dict]:
    return list(harness.load("checkpointing_configs", HERE / "configs.py").CONFIGS)


def document(args, runs, ctx) -> dict:
    return {"generator": "/tmp/valvenv/bin/python validation/techniques/checkpointing/measure_checkpointing.py",
            "environment": "python3 -m venv /tmp/valvenv && /tmp/valvenv/bin/pip install -r validation/requirements.txt"
                           " (torch==2.13.0 CPU, transformers==5.23.0)",
            "torchtitan_reference": "pytorch/torchtitan v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce): "
                                    "torchtitan/distributed/activation_checkpoint.py, "
                                    "torchtitan/models/llama3/infra/parallelize.py",
            "python": platform.python_version(), **harness._versions(), "runs": runs}


def main(argv=None) -> int:
    # the file is written after every run: a long sweep keeps what it measured
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=configs(), measure_run=measure,
                        document=document, out=str(HERE / "measurements.json"), incremental=True, atomic=False,
                        summary=harness.mib_summary(9, 1, op=False, wall=5),
                        line=lambda n, t, c, msg: f"[{n:3d}/{t}] {c['id']:<60} {msg}")


if __name__ == "__main__":
    sys.exit(main())
