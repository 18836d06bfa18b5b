#!/usr/bin/env python
"""float8 under FSDP2 on a fake process group: with and without torchao's fp8 all-gather.

    /tmp/fp8venv/bin/python validation/techniques/float8/fsdp_probe.py

Reuses validation/parallel/measure_parallel.py (its fake process group, FSDP2 wrapping and FSDPMemTracker
protocol) on its gqa-tiny Llama, FSDP2 over 4 ranks (rank 0, layers resharded after forward), with the model
converted by ``convert_to_float8_training`` (LM head filtered out) before ``fully_shard``, with
``enable_fsdp_float8_all_gather`` False and True, pure bf16 and mixed precision (fp32 shards, bf16
param_dtype). Prints every phase's peak. Not modelled by the profile (refused): this records what it changes.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "parallel"))
sys.path.insert(0, os.path.join(HERE, "..", ".."))

import measure_parallel as MP  # noqa: E402
from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: E402

_apply = MP.apply_fsdp
SETTING = {}


def apply_fsdp(model, mesh, raf, root_raf, mp_policy):
    if SETTING.get("float8"):
        convert_to_float8_training(model, config=Float8LinearConfig(
            enable_fsdp_float8_all_gather=SETTING["all_gather"]), module_filter_fn=lambda m, f: f != "lm_head")
    return _apply(model, mesh, raf, root_raf, mp_policy)


MP.apply_fsdp = apply_fsdp

out = {}
for regime in ("bf16", "mp-bf16"):
    cfg = MP._cfg("fsdp2", "gqa-tiny", 4, 0, raf=True, regime=regime)
    for name, setting in (("no float8", {}), ("float8", {"float8": True, "all_gather": False}),
                          ("float8 + fp8 all-gather", {"float8": True, "all_gather": True})):
        SETTING.clear()
        SETTING.update(setting)
        try:
            m = MP.measure_parallel(cfg)
            out[f"{regime} {name}"] = {p: v["bytes"] for p, v in m["peak_by_phase"].items()}
        except Exception as e:  # record
            out[f"{regime} {name}"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"{regime:8} {name:26} {out[f'{regime} {name}']}", flush=True)
with open(os.path.join(HERE, "fsdp_probe.json"), "w") as f:
    json.dump({"config": "gqa-tiny, FSDP2 w4 rank 0, reshard_after_forward=True, b2 s256", "runs": out}, f, indent=1)
