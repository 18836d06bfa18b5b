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

import argparse
import contextlib
import functools
import gc
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
import warnings
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import measure as harness  # noqa: E402  (validation/measure.py)
import torch  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

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
    t0 = time.perf_counter()
    torch.manual_seed(0)
    kw = dict(cfg["hf_config"])
    hf_config = AutoConfig.for_model(kw.pop("model_type"), **kw)
    amp = cfg["regime"] == "amp-bf16"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg["attention"], dtype=dtype)
        model.train()
        apply_policy(model, cfg["checkpointing"], cfg["policy_options"])
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = harness.build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])
        input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
        layers, named = harness._submodules(model)
        mt = harness.PhaseMemTracker()
        mt.track_external(model, optimizer, input_ids)
        autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
        alive, t_measured = harness.run_protocol(mt, model, optimizer, input_ids, autocast=autocast)
        t_end = time.perf_counter()
        measured = {
            **harness.peak_record(mt),
            "alive": alive,
            "layer_forward_retained_bytes": harness.layer_forward_deltas(mt, layers),
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "attn_implementation": model.config._attn_implementation,
            "wall_s": round(t_end - t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }
    del model, optimizer, input_ids, mt, params, layers, named
    gc.collect()
    return measured


def configs() -> list[dict]:
    spec = importlib.util.spec_from_file_location("checkpointing_configs", HERE / "configs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.CONFIGS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="ID")
    ap.add_argument("--out", default=str(HERE / "measurements.json"), help="where to write (runs merged by id)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    all_configs = configs()
    by_id = {c["id"]: c for c in all_configs}
    unknown = [i for i in args.only or () if i not in by_id]
    if unknown:
        ap.error(f"unknown ids {unknown}")
    todo = [by_id[i] for i in args.only] if args.only else all_configs
    out = Path(args.out)
    previous = harness.previous_runs(str(out), harness._versions())[0] if args.only else {}
    results = {}
    for n, cfg in enumerate(todo, 1):
        run = dict(cfg)
        try:
            run["measured"] = m = measure(cfg)
            msg = f"peak {m['peak_bytes'] / 2**20:9.1f} MiB in {m['peak_phase']:<9} {m['wall_s']:5.1f}s"
        except Exception as e:
            run["error"] = f"{type(e).__name__}: {e}"[:2000]
            run["error_traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
            msg = "ERROR " + run["error"][:300]
        results[cfg["id"]] = run
        print(f"[{n:3d}/{len(todo)}] {cfg['id']:<60} {msg}", flush=True)
        _write(out, all_configs, results, previous)      # after every run: a long sweep keeps what it measured
    return 0 if all("error" not in r for r in results.values()) else 1


def _write(out, all_configs, results, previous):
    runs = [results.get(c["id"]) or previous.get(c["id"]) for c in all_configs]
    doc = {"generator": "/tmp/valvenv/bin/python validation/techniques/checkpointing/measure_checkpointing.py",
           "environment": "python3 -m venv /tmp/valvenv && /tmp/valvenv/bin/pip install -r validation/requirements.txt"
                          " (torch==2.13.0 CPU, transformers==5.23.0)",
           "torchtitan_reference": "pytorch/torchtitan v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce): "
                                   "torchtitan/distributed/activation_checkpoint.py, "
                                   "torchtitan/models/llama3/infra/parallelize.py",
           "python": platform.python_version(), **harness._versions(), "runs": [r for r in runs if r is not None]}
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
